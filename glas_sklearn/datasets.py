"""Data sets: the UCI concrete set shipped with the package, and UCI folders with their standard splits."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["load_concrete", "load_uci", "CONCRETE_FEATURES"]

CONCRETE_FEATURES = [
    "cement", "blast_furnace_slag", "fly_ash", "water", "superplasticizer",
    "coarse_aggregate", "fine_aggregate", "age",
]
_CONCRETE_TARGET = "compressive_strength"


def load_concrete(*, as_frame: bool = False, return_X_y: bool = True):
    """The UCI concrete compressive-strength data (Yeh 1998, CC BY 4.0), shipped inside the package.

    1030 rows, 8 inputs (mixture components in kg/m³ and the age in days), target in MPa.

    Parameters
    ----------
    as_frame : bool, default=False
        Return a pandas DataFrame of the inputs and a Series of the target instead of numpy arrays.
    return_X_y : bool, default=True
        With False, return a single DataFrame/array holding inputs and target together.

    Returns
    -------
    X : ndarray of shape (1030, 8) or DataFrame
    y : ndarray of shape (1030,) or Series

    Examples
    --------
    >>> X, y = load_concrete()
    >>> X.shape, y.shape
    ((1030, 8), (1030,))
    >>> list(load_concrete(as_frame=True)[0].columns)[:2]
    ['cement', 'blast_furnace_slag']
    """
    with resources.files("glas_sklearn").joinpath("data/concrete.txt").open("r") as fh:
        data = np.loadtxt(fh)
    if as_frame:
        frame = pd.DataFrame(data, columns=CONCRETE_FEATURES + [_CONCRETE_TARGET])
        if not return_X_y:
            return frame
        return frame[CONCRETE_FEATURES], frame[_CONCRETE_TARGET]
    if not return_X_y:
        return data
    return data[:, :-1].copy(), data[:, -1].copy()


def load_uci(path: str | Path, split: int | None = None):
    """A UCI regression set in the standard split format (``data.txt``, ``index_*.txt``).

    Parameters
    ----------
    path : str or Path
        The data set's folder (e.g. ``shared/data/uci/concrete``).
    split : int, optional
        When given, also return the train and test row indices of that standard split.

    Returns
    -------
    X : ndarray of shape (n, p)
    y : ndarray of shape (n,)
    train, test : ndarray of int
        Only with ``split``.
    """
    path = Path(path)
    if not (path / "data.txt").is_file():
        raise FileNotFoundError(f"No data.txt in {path}; expected a UCI folder with data.txt and index_*.txt.")
    data = np.loadtxt(path / "data.txt")
    features = np.atleast_1d(np.loadtxt(path / "index_features.txt", dtype=int))
    target = int(np.loadtxt(path / "index_target.txt", dtype=int))
    X, y = data[:, features], data[:, target]
    if split is None:
        return X, y
    train_file, test_file = path / f"index_train_{split}.txt", path / f"index_test_{split}.txt"
    if not train_file.is_file():
        n = len(list(path.glob("index_train_*.txt")))
        raise ValueError(f"split={split} does not exist in {path}: it has {n} splits (0..{n - 1}).")
    train = np.atleast_1d(np.loadtxt(train_file, dtype=int))
    test = np.atleast_1d(np.loadtxt(test_file, dtype=int))
    return X, y, train, test
