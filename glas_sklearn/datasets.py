"""Data sets shipped with the package: the UCI concrete compressive-strength data."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd

__all__ = ["load_concrete", "CONCRETE_FEATURES"]

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

