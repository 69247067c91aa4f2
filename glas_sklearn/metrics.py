"""Scores of prediction intervals, and scikit-learn scorers built on them.

Intervals are MAPIE-shaped: ``y_pis`` of shape (n, 2) for one level, (n, 2, k) for k levels (lower bounds in
``y_pis[:, 0]``, upper bounds in ``y_pis[:, 1]``), or (n, M, 2, k) for M outputs with ``y_true`` of shape (n, M).
Every score averages over all n·M entries; with a level axis it returns one value per level.

- :func:`coverage_score`: the fraction of targets inside their intervals.
- :func:`mean_width_score`: the mean interval width.
- :func:`interval_score`: the Winkler (interval) score, a proper scoring rule for central intervals:
  the width plus 2/γ times the distance by which the target falls outside (γ = 1 − confidence level).
- :func:`make_interval_scorer`: one of the three as a ``scorer(estimator, X, y)`` for ``GridSearchCV`` and
  ``cross_val_score``, also for an estimator at the end of a ``Pipeline`` (through
  :func:`glas_sklearn.compose.predict_interval`).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._checks import check_confidence_levels
from .compose import predict_interval
from .predictive import interval_coverage, mean_interval_width

__all__ = ["coverage_score", "interval_score", "make_interval_scorer", "mean_width_score"]


def _check_intervals(y_pis, y_true=None) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """Intervals as float64 (n, M, 2, k), targets as (n, M), and whether a level axis was given."""
    pis = np.asarray(y_pis, dtype=np.float64)
    if pis.ndim == 2:
        pis4, has_levels = pis[:, None, :, None], False
    elif pis.ndim == 3:
        pis4, has_levels = pis[:, None, :, :], True
    elif pis.ndim == 4:
        pis4, has_levels = pis, True
    else:
        raise ValueError(f"y_pis must have shape (n, 2), (n, 2, k) or (n, M, 2, k), got {pis.shape}.")
    if pis4.shape[2] != 2 or pis4.shape[0] == 0 or pis4.shape[-1] == 0:
        raise ValueError(f"y_pis must have shape (n, 2), (n, 2, k) or (n, M, 2, k) with lower and upper bounds on "
                         f"the axis of length 2 and n, k >= 1, got {pis.shape}.")
    if not np.isfinite(pis4).all():
        raise ValueError("y_pis contains NaN or infinite bounds.")
    crossed = pis4[:, :, 0, :] > pis4[:, :, 1, :]
    if crossed.any():
        raise ValueError(f"y_pis has {int(crossed.sum())} interval(s) whose lower bound lies above the upper bound; "
                         "pass [lower, upper] on the second axis.")
    if y_true is None:
        return pis4, None, has_levels
    y = np.asarray(y_true, dtype=np.float64)
    n, M = pis4.shape[:2]
    if pis.ndim == 4:
        if y.shape != (n, M):
            raise ValueError(f"y_true has shape {y.shape}, but y_pis of shape {pis.shape} needs y_true of shape "
                             f"{(n, M)}.")
    else:
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.shape != (n,):
            raise ValueError(f"y_true has shape {y.shape}, but y_pis of shape {pis.shape} needs y_true of shape "
                             f"{(n,)}.")
        y = y[:, None]
    if not np.isfinite(y).all():
        raise ValueError("y_true contains NaN or infinite values.")
    return pis4, y, has_levels


def _result(values: np.ndarray, has_levels: bool):
    return values if has_levels else float(values[0])


def coverage_score(y_true, y_pis) -> float | np.ndarray:
    """Fraction of the targets that lie inside their prediction intervals (bounds included).

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, M)
    y_pis : array-like of shape (n, 2), (n, 2, k) or (n, M, 2, k)
        Lower (``[:, 0]``) and upper (``[:, 1]``) bounds, for k levels.

    Returns
    -------
    float, or ndarray of shape (k,) when ``y_pis`` has a level axis
        The coverage in [0, 1] (over all n·M entries for multi-output intervals).

    Examples
    --------
    >>> import numpy as np
    >>> coverage_score([0.5, 2.0, 1.0], np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]))
    0.6666666666666666
    """
    pis, y, has_levels = _check_intervals(y_pis, y_true)
    return _result(interval_coverage(y, pis), has_levels)


def mean_width_score(y_pis) -> float | np.ndarray:
    """Mean width (upper − lower bound) of prediction intervals.

    Parameters
    ----------
    y_pis : array-like of shape (n, 2), (n, 2, k) or (n, M, 2, k)

    Returns
    -------
    float, or ndarray of shape (k,) when ``y_pis`` has a level axis

    Examples
    --------
    >>> import numpy as np
    >>> mean_width_score(np.array([[0.0, 1.0], [1.0, 4.0]]))
    2.0
    """
    pis, _, has_levels = _check_intervals(y_pis)
    return _result(mean_interval_width(pis), has_levels)


def interval_score(y_true, y_pis, confidence_level=0.9) -> float | np.ndarray:
    """Mean Winkler interval score of central (1 − γ) prediction intervals; lower is better.

    For an interval [l, u] at level 1 − γ and a target y, the score is
    (u − l) + (2/γ)(l − y)·1[y < l] + (2/γ)(y − u)·1[y > u]: the width, plus a penalty for each miss
    that grows with its distance. It is a proper scoring rule for the γ/2 and 1 − γ/2 quantiles.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, M)
    y_pis : array-like of shape (n, 2), (n, 2, k) or (n, M, 2, k)
    confidence_level : float or sequence of float, default=0.9
        The level 1 − γ of the intervals: one number, or one per level (length k).

    Returns
    -------
    float, or ndarray of shape (k,) when ``y_pis`` has a level axis

    Examples
    --------
    >>> import numpy as np
    >>> # both widths are 1; the first target is inside (score 1), the second misses by 0.5: 1 + (2/0.5)·0.5 = 3
    >>> interval_score([0.5, 1.5], np.array([[0.0, 1.0], [0.0, 1.0]]), confidence_level=0.5)
    2.0
    """
    pis, y, has_levels = _check_intervals(y_pis, y_true)
    k = pis.shape[-1]
    try:
        levels = check_confidence_levels(confidence_level)
    except ValueError:
        raise ValueError(f"confidence_level must be a number or a list of numbers strictly between 0 and 1, "
                         f"got {confidence_level!r}.") from None
    if levels.size == 1:
        levels = np.repeat(levels, k)
    elif levels.size != k:
        raise ValueError(f"confidence_level has {levels.size} levels, but y_pis has {k} (its last axis); "
                         "pass one level, or one per interval level.")
    gamma = 1.0 - levels  # (k,)
    lower, upper = pis[:, :, 0, :], pis[:, :, 1, :]  # (n, M, k)
    t = y[:, :, None]
    score = (upper - lower) + (2.0 / gamma) * (np.maximum(lower - t, 0.0) + np.maximum(t - upper, 0.0))
    return _result(score.reshape(-1, k).mean(axis=0), has_levels)


def _neg_width(y, y_pis, confidence_level) -> float:
    return -float(mean_width_score(y_pis)[0])


def _coverage(y, y_pis, confidence_level) -> float:
    return float(coverage_score(y, y_pis)[0])


def _neg_interval_score(y, y_pis, confidence_level) -> float:
    return -float(interval_score(y, y_pis, confidence_level)[0])


# The scorer's metric names → the score of one level's intervals, negated where smaller is better.
_SCORES = {"interval_score": _neg_interval_score, "coverage": _coverage, "width": _neg_width}


class _IntervalScorer:
    """``scorer(estimator, X, y)`` for one interval metric at one level; greater is better."""

    def __init__(self, metric: str, confidence_level: float):
        self.metric = metric
        self.confidence_level = confidence_level
        self._score = _SCORES[metric]

    def __call__(self, estimator, X, y) -> float:
        y_pis = np.asarray(predict_interval(estimator, X, self.confidence_level)[1], dtype=np.float64)
        if y_pis.ndim == 2:  # a single level without its level axis
            y_pis = y_pis[..., None]
        if y_pis.shape[-1] != 1:
            raise ValueError(f"The estimator returned intervals for {y_pis.shape[-1]} levels; an interval scorer "
                             f"scores one level ({self.confidence_level}).")
        return self._score(y, y_pis, self.confidence_level)

    def __repr__(self) -> str:
        return f"make_interval_scorer(metric={self.metric!r}, confidence_level={self.confidence_level!r})"


def make_interval_scorer(metric: str = "interval_score", confidence_level: float = 0.9):
    """A scikit-learn scorer of prediction intervals, for ``GridSearchCV(scoring=...)`` and friends.

    The scorer gets the intervals from :func:`glas_sklearn.compose.predict_interval`: the estimator's
    ``predict_interval(X, confidence_level=confidence_level)`` (without the level when the method does not
    take one, as MAPIE's regressors, whose level is fixed at construction), the last step's on X transformed
    by the steps before it for a ``Pipeline``, or the inner regressor's mapped through an affine target
    transform for a ``TransformedTargetRegressor``; it scores them against y.

    Parameters
    ----------
    metric : {"interval_score", "coverage", "width"}, default="interval_score"
        "interval_score": the negated mean Winkler score (:func:`interval_score`), which rewards narrow
        intervals and penalises misses; the one to select models with. "width": the negated mean width.
        "coverage": the coverage (on its own it favours ever wider intervals; use it to report).
        Losses are negated so that greater is better, as for scikit-learn's ``neg_*`` scorers.
    confidence_level : float, default=0.9
        The level 1 − γ of the intervals scored.

    Returns
    -------
    callable
        ``scorer(estimator, X, y) -> float``.

    Examples
    --------
    >>> from glas_sklearn.metrics import make_interval_scorer
    >>> make_interval_scorer("width", confidence_level=0.8)
    make_interval_scorer(metric='width', confidence_level=0.8)
    """
    if not isinstance(metric, str) or metric not in _SCORES:
        raise ValueError(f"metric must be one of {list(_SCORES)}, got {metric!r}.")
    if not (isinstance(confidence_level, numbers.Real) and not isinstance(confidence_level, bool)
            and 0 < confidence_level < 1):
        raise ValueError(f"confidence_level must be a single number strictly between 0 and 1, "
                         f"got {confidence_level!r}.")
    return _IntervalScorer(metric, float(confidence_level))
