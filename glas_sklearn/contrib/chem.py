"""Chemistry helpers for generated SMILES, built on RDKit (optional: ``pip install glas-sklearn[chem]``).

Validity means RDKit parses the string and sanitises the molecule (valences, aromaticity);
the empty string, which RDKit parses to a molecule with no atoms, counts as invalid.
Molecular weight is RDKit's average molecular weight (``Descriptors.MolWt``), SlogP is the
Wildman–Crippen logP (``Crippen.MolLogP``) and the SA score is the synthetic-accessibility score of
Ertl and Schuffenhauer from RDKit's Contrib ``SA_Score/sascorer.py`` (1 = easy, 10 = hard).
RDKit's parse warnings are silenced while these helpers run.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType
from typing import Iterable

try:
    from rdkit import Chem, RDConfig, rdBase
    from rdkit.Chem import Crippen, Descriptors
except ImportError as exc:  # pragma: no cover - exercised only without RDKit
    raise ImportError(
        "glas_sklearn.contrib.chem needs RDKit, which is not installed. "
        "Install it with `pip install glas-sklearn[chem]` (or `pip install rdkit`)."
    ) from exc

import numpy as np
import pandas as pd

__all__ = ["to_mol", "is_valid", "molecular_weight", "slogp", "sa_score", "describe"]

_SASCORER: ModuleType | None = None


def _sascorer() -> ModuleType:
    """RDKit's Contrib SA-score module, loaded once from ``RDConfig.RDContribDir``."""
    global _SASCORER
    if _SASCORER is None:
        path = os.path.join(RDConfig.RDContribDir, "SA_Score", "sascorer.py")
        if not os.path.isfile(path):
            raise ImportError(
                f"RDKit's SA-score contribution was not found at {path}; install an RDKit build that "
                "ships the Contrib directory (the PyPI wheel `rdkit` does)."
            )
        spec = importlib.util.spec_from_file_location("_glas_rdkit_sascorer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SASCORER = module
    return _SASCORER


def to_mol(smiles: str) -> "Chem.Mol | None":
    """Parse and sanitise a SMILES string.

    Parameters
    ----------
    smiles : str

    Returns
    -------
    rdkit.Chem.Mol or None
        The molecule, or None when the string does not parse, fails sanitisation or has no atoms.
    """
    if not isinstance(smiles, str):
        raise TypeError(f"Expected a SMILES string, got {type(smiles).__name__}.")
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles, sanitize=True)
    if mol is None or mol.GetNumAtoms() == 0:
        return None
    return mol


def _valid_mol(smiles: str) -> "Chem.Mol":
    mol = to_mol(smiles)
    if mol is None:
        raise ValueError(
            f"{smiles!r} is not a valid SMILES (RDKit could not parse and sanitise it); "
            "check it with is_valid first, or use describe(), which gives NaN for invalid strings."
        )
    return mol


def is_valid(smiles: str) -> bool:
    """True when RDKit parses and sanitises ``smiles`` into a molecule with at least one atom.

    Examples
    --------
    >>> is_valid("CCO"), is_valid("C1CC"), is_valid("")
    (True, False, False)
    """
    return to_mol(smiles) is not None


def molecular_weight(smiles: str) -> float:
    """Average molecular weight (g/mol, RDKit ``Descriptors.MolWt``) of a valid SMILES.

    Raises
    ------
    ValueError
        If the SMILES is not valid.
    """
    return float(Descriptors.MolWt(_valid_mol(smiles)))


def slogp(smiles: str) -> float:
    """Wildman–Crippen logP (RDKit ``Crippen.MolLogP``, "SlogP") of a valid SMILES.

    Raises
    ------
    ValueError
        If the SMILES is not valid.
    """
    return float(Crippen.MolLogP(_valid_mol(smiles)))


def sa_score(smiles: str) -> float:
    """Synthetic-accessibility score (1 easy … 10 hard; RDKit Contrib ``sascorer``) of a valid SMILES.

    Raises
    ------
    ValueError
        If the SMILES is not valid.
    """
    return float(_sascorer().calculateScore(_valid_mol(smiles)))


def describe(smiles_list: Iterable[str], sa: bool = True) -> pd.DataFrame:
    """Validity and properties of many SMILES, one row each.

    Parameters
    ----------
    smiles_list : iterable of str
    sa : bool, default=True
        Compute the SA score (the slowest of the properties).

    Returns
    -------
    pandas.DataFrame
        Columns ``smiles``, ``valid`` (bool), ``canonical`` (RDKit canonical SMILES, None if invalid),
        ``mol_wt``, ``slogp`` and, when ``sa``, ``sa_score`` (NaN for invalid strings).

    Examples
    --------
    >>> describe(["CCO", "C1CC"], sa=False)[["smiles", "valid"]].values.tolist()
    [['CCO', True], ['C1CC', False]]
    """
    rows = []
    scorer = _sascorer() if sa else None
    for s in smiles_list:
        mol = to_mol(s)
        row = {"smiles": s, "valid": mol is not None}
        if mol is None:
            row.update(canonical=None, mol_wt=np.nan, slogp=np.nan)
            if sa:
                row["sa_score"] = np.nan
        else:
            row.update(
                canonical=Chem.MolToSmiles(mol),
                mol_wt=float(Descriptors.MolWt(mol)),
                slogp=float(Crippen.MolLogP(mol)),
            )
            if sa:
                row["sa_score"] = float(scorer.calculateScore(mol))
        rows.append(row)
    columns = ["smiles", "valid", "canonical", "mol_wt", "slogp"] + (["sa_score"] if sa else [])
    return pd.DataFrame(rows, columns=columns)
