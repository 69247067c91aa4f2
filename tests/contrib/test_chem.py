"""Tests of the optional RDKit chemistry helpers (skipped when RDKit is absent)."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys

import pandas as pd
import pytest

VALID = {
    "ethanol": "CCO",
    "benzene": "c1ccccc1",
    "aspirin": "CC(=O)Oc1ccccc1C(=O)O",
    "pyrrole": "c1cc[nH]c1",
    "nitro": "C[N+](=O)[O-]",
}
INVALID = [
    "C1CC",  # unclosed ring
    "c1cccc1",  # aromatic ring that cannot be kekulised (fails sanitisation)
    "C(C)(C)(C)(C)C",  # pentavalent carbon (fails sanitisation)
    "CC(",  # unbalanced branch
    "xyz",
    "",
]


@pytest.fixture(scope="module")
def rd():
    """RDKit pieces used as the reference (skips the test when RDKit is absent)."""
    pytest.importorskip("rdkit")
    from rdkit import Chem, RDConfig
    from rdkit.Chem import Crippen, Descriptors

    spec = importlib.util.spec_from_file_location(
        "_test_sascorer", os.path.join(RDConfig.RDContribDir, "SA_Score", "sascorer.py")
    )
    sascorer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sascorer)
    return Chem, Descriptors, Crippen, sascorer


@pytest.fixture(scope="module")
def chem(rd):
    from glas_sklearn.contrib import chem

    return chem


@pytest.mark.parametrize("smiles", list(VALID.values()))
def test_valid_molecules_agree_with_rdkit(chem, rd, smiles):
    Chem, Descriptors, Crippen, sascorer = rd
    mol = Chem.MolFromSmiles(smiles)
    assert mol is not None
    assert chem.is_valid(smiles)
    assert chem.molecular_weight(smiles) == pytest.approx(Descriptors.MolWt(mol))
    assert chem.slogp(smiles) == pytest.approx(Crippen.MolLogP(mol))
    assert chem.sa_score(smiles) == pytest.approx(sascorer.calculateScore(mol))
    assert 1.0 <= chem.sa_score(smiles) <= 10.0


def test_known_values(chem):
    assert chem.molecular_weight("CCO") == pytest.approx(46.069, abs=1e-3)
    assert chem.molecular_weight("c1ccccc1") == pytest.approx(78.114, abs=1e-3)
    assert chem.molecular_weight("CC(=O)Oc1ccccc1C(=O)O") == pytest.approx(180.159, abs=1e-3)
    # benzene scores the minimum (easiest); aspirin is easy to make too
    assert chem.sa_score("c1ccccc1") == pytest.approx(1.0)
    assert chem.sa_score("CC(=O)Oc1ccccc1C(=O)O") < 3.0
    assert chem.slogp("c1ccccc1") > chem.slogp("CCO")


@pytest.mark.parametrize("smiles", INVALID)
def test_invalid_strings(chem, rd, smiles):
    Chem = rd[0]
    assert not chem.is_valid(smiles)
    assert chem.to_mol(smiles) is None
    if smiles:
        assert Chem.MolFromSmiles(smiles) is None  # RDKit agrees (the empty string has no atoms)
    for fn in (chem.molecular_weight, chem.slogp, chem.sa_score):
        with pytest.raises(ValueError, match="not a valid SMILES"):
            fn(smiles)


def test_type_error(chem):
    with pytest.raises(TypeError, match="SMILES string"):
        chem.is_valid(None)


def test_describe(chem, rd):
    Chem = rd[0]
    smiles = list(VALID.values()) + INVALID
    df = chem.describe(smiles)
    assert list(df.columns) == ["smiles", "valid", "canonical", "mol_wt", "slogp", "sa_score"]
    assert df["smiles"].tolist() == smiles
    assert df["valid"].tolist() == [True] * len(VALID) + [False] * len(INVALID)
    for _, row in df.iterrows():
        if row["valid"]:
            assert row["mol_wt"] == pytest.approx(chem.molecular_weight(row["smiles"]))
            assert row["slogp"] == pytest.approx(chem.slogp(row["smiles"]))
            assert row["sa_score"] == pytest.approx(chem.sa_score(row["smiles"]))
            assert row["canonical"] == Chem.MolToSmiles(Chem.MolFromSmiles(row["smiles"]))
        else:
            assert pd.isna(row["canonical"])
            assert all(math.isnan(row[c]) for c in ("mol_wt", "slogp", "sa_score"))
    assert "sa_score" not in chem.describe(["CCO"], sa=False).columns


def test_import_without_rdkit_says_how_to_install(monkeypatch):
    # Hide RDKit (whether installed or not) and import the module afresh.
    for name in [m for m in sys.modules if m == "rdkit" or m.startswith("rdkit.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rdkit", None)
    monkeypatch.delitem(sys.modules, "glas_sklearn.contrib.chem", raising=False)
    with pytest.raises(ImportError, match=r"pip install glas-sklearn\[chem\]"):
        importlib.import_module("glas_sklearn.contrib.chem")
