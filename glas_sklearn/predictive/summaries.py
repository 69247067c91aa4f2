"""Empirical coverage and size of intervals and prediction sets, per level (float64 numpy arrays of shape (k,)).

The library's internal tensor versions (tensors stay on their device, no checks beyond shapes); users score
intervals with :mod:`glas_sklearn.metrics`.
"""

from __future__ import annotations

import numpy as np
import torch

from ._tensors import Array, as_tensor

__all__ = ["interval_coverage", "mean_interval_width", "mean_set_size", "set_coverage"]


def _mean_per_level(values: torch.Tensor) -> np.ndarray:
    """Mean over every axis but the last (the levels), in float64.

    Parameters
    ----------
    values : torch.Tensor of shape (..., k)
        Per-record values (hits, widths, set sizes) at k levels.

    Returns
    -------
    ndarray of shape (k,)
    """
    return values.reshape(-1, values.shape[-1]).to(torch.float64).mean(0).cpu().numpy()


def _bounds_check(bounds) -> torch.Tensor:
    b, _ = as_tensor("bounds", bounds)
    if b.ndim < 2 or b.shape[-2] != 2:
        raise ValueError(f"bounds must have shape (n, M, 2, k) (lower/upper on axis -2), got {tuple(b.shape)}.")
    return b


def interval_coverage(y: Array, bounds: Array) -> np.ndarray:
    """Fraction of the targets inside their intervals, per level: mean of 1[lower ≤ y ≤ upper].

    Internal tensor version, used by calibration; users call :func:`glas_sklearn.metrics.coverage_score`,
    which validates its inputs and calls this.

    Parameters
    ----------
    y : shape (n, M) (or (n,) with bounds (n, 2, k))
    bounds : shape (n, M, 2, k)

    Returns
    -------
    ndarray of shape (k,)
        Coverage over all n·M entries (each output coordinate counts as one record).

    Examples
    --------
    >>> import numpy as np
    >>> b = np.array([[[0.0], [1.0]], [[0.0], [1.0]]])  # two records, [0, 1] intervals, one level
    >>> interval_coverage(np.array([0.5, 2.0]), b)
    array([0.5])
    """
    b = _bounds_check(bounds)
    t, _ = as_tensor("y", y)
    t = t.to(device=b.device, dtype=b.dtype)
    if t.shape != b.shape[:-2]:
        if t.ndim == 1 and b.shape[:-2] == t.shape + (1,):
            t = t.unsqueeze(-1)
        else:
            raise ValueError(f"y has shape {tuple(t.shape)} but bounds has shape {tuple(b.shape)}; "
                             f"expected y of shape {tuple(b.shape[:-2])}.")
    t = t.unsqueeze(-1)
    inside = (b[..., 0, :] <= t) & (t <= b[..., 1, :])
    return _mean_per_level(inside)


def mean_interval_width(bounds: Array) -> np.ndarray:
    """Mean interval width (upper − lower) per level; shape (k,).

    Internal tensor version, used by calibration; users call :func:`glas_sklearn.metrics.mean_width_score`.
    """
    b = _bounds_check(bounds)
    return _mean_per_level(b[..., 1, :] - b[..., 0, :])


def _sets_check(sets) -> torch.Tensor:
    s, _ = as_tensor("sets", sets, floating=False)
    if s.dtype != torch.bool or s.ndim < 2:
        raise ValueError(f"sets must be a boolean array of shape (n, C, k), got dtype {s.dtype} and shape "
                         f"{tuple(s.shape)}.")
    return s


def set_coverage(labels: Array, sets: Array) -> np.ndarray:
    """Fraction of the true labels inside their prediction sets, per level; shape (k,).

    Parameters
    ----------
    labels : int, shape (n,)
        Class indices 0 … C−1.
    sets : bool, shape (n, C, k)
    """
    s = _sets_check(sets)
    lab, _ = as_tensor("labels", labels, floating=False)
    if lab.is_floating_point():
        if not bool((lab == lab.round()).all()):
            raise ValueError("labels must be integer class indices 0 … C−1.")
        lab = lab.long()
    lab = lab.to(device=s.device, dtype=torch.long)
    C = s.shape[-2]
    if lab.shape != s.shape[:-2]:
        raise ValueError(f"labels has shape {tuple(lab.shape)} but sets has shape {tuple(s.shape)}; "
                         f"expected labels of shape {tuple(s.shape[:-2])}.")
    if bool(((lab < 0) | (lab >= C)).any()):
        raise ValueError(f"labels must be class indices between 0 and {C - 1}, got values from "
                         f"{int(lab.min())} to {int(lab.max())}.")
    idx = lab.unsqueeze(-1).unsqueeze(-1).expand(*lab.shape, 1, s.shape[-1])
    hit = torch.gather(s, -2, idx).squeeze(-2)
    return _mean_per_level(hit)


def mean_set_size(sets: Array) -> np.ndarray:
    """Mean number of classes per prediction set, per level; shape (k,)."""
    s = _sets_check(sets)
    return _mean_per_level(s.sum(-2))
