"""The σ̂ bands of the Mondrian conformal calibrator as functions of arrays: the band edges (quantiles of σ̂ merged
to a row count), the Kruskal–Wallis test of whether scores differ across bands, and the conformal quantiles per band
and per class (:mod:`glas_sklearn.calibration.mondrian` says the rule and what was measured)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
from scipy import stats

from .._checks import check_confidence_levels
from .._silenced import is_silenced, silenced, user_stacklevel
from .conformal import ConformalWarning, _rows_for_finite_quantile, conformal_quantile

__all__ = ["BAND_TEST_LEVEL", "band_quantiles", "scores_alike_pvalue", "std_bin_edges"]

#: The level at which ``min_bins="auto"`` takes those bands for a predictive without a noise head: where
#: :func:`scores_alike_pvalue` is below it.
BAND_TEST_LEVEL = 0.1


def _merged_bins(counts, min_rows: int) -> list[list[int]]:
    """Consecutive bins merged, left to right, into groups of at least ``min_rows`` rows (a short last group joins
    the one before it; with fewer rows in all, one group)."""
    groups, current, size = [], [], 0
    for b, c in enumerate(counts):
        current.append(b)
        size += int(c)
        if size >= min_rows:
            groups.append(current)
            current, size = [], 0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def std_bin_edges(std, n_bins: int, min_rows: int = 1) -> np.ndarray:
    """Inner edges of equal-count bins of ``std`` (n,), merged until every bin holds ≥ ``min_rows`` rows.

    Bins are right-closed (a row with e_b < σ̂ ≤ e_{b+1} is in bin b; :func:`numpy.searchsorted` with
    ``side="left"`` assigns them), so tied values share a bin.

    Parameters
    ----------
    std : array-like of shape (n,)
    n_bins : int
        The bins asked for (at most; fewer after merging).
    min_rows : int, default=1

    Returns
    -------
    ndarray of shape (B − 1,)

    Examples
    --------
    >>> std_bin_edges(np.arange(1.0, 11.0), 5).tolist()
    [2.8, 4.6, 6.4, 8.2]
    >>> std_bin_edges(np.r_[np.ones(8), 2.0, 3.0], 5, min_rows=2).tolist()  # ties: the 8 ones share a bin
    [1.0]
    """
    s = np.asarray(std, dtype=np.float64).reshape(-1)
    edges = list(np.unique(np.quantile(s, np.linspace(0.0, 1.0, n_bins + 1)[1:-1])))
    while edges:
        counts = np.bincount(np.searchsorted(np.asarray(edges), s, side="left"), minlength=len(edges) + 1)
        b = int(np.argmin(counts))
        if counts[b] >= min_rows:
            break
        # merge bin b with its smaller neighbour: drop the edge between them
        if b == 0 or (b < len(edges) and counts[b + 1] <= counts[b - 1]):
            edges.pop(b)
        else:
            edges.pop(b - 1)
    return np.asarray(edges, dtype=np.float64)


def scores_alike_pvalue(scores, std, n_bins: int, min_rows: int = 1) -> float:
    """The Kruskal–Wallis p-value of "the ``scores`` (n,) are alike in every band" over the equal-count bands of
    ``std`` (n,) that :func:`std_bin_edges` cuts; NaN with one band (nothing to compare), 1.0 with all scores equal.

    Small where the scores' distribution changes across the bands (their ranks differ by band), as when σ̂ is
    too small in one part of its range and too large in another; a score's scale is what calibration per band
    corrects, and a larger scale shifts the ranks of the (non-negative) scores.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> std = np.arange(1.0, 201.0)
    >>> alike = np.abs(rng.standard_normal(200))
    >>> scores_alike_pvalue(alike, std, 5) > 0.1, scores_alike_pvalue(alike * std / 100, std, 5) < 1e-6
    (True, True)
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    sd = np.asarray(std, dtype=np.float64).reshape(-1)
    if s.shape != sd.shape:
        raise ValueError(f"scores and std must have the same length, got {s.size} and {sd.size}.")
    if np.isnan(s).any() or np.isnan(sd).any():
        raise ValueError("scores and std must not contain NaN (a NaN σ̂ has no band).")
    edges = std_bin_edges(sd, n_bins, min_rows)
    if edges.size == 0:
        return float("nan")
    if np.all(s == s[0]):
        return 1.0
    band = np.searchsorted(edges, sd, side="left")
    return float(stats.kruskal(*[s[band == b] for b in range(edges.size + 1)]).pvalue)


def _std_bands(scores, std, n_bins: int, wider: int, min_rows: int) -> tuple[np.ndarray, float]:
    """The edges of ``n_bins`` bands of ``std``, or of ``wider`` ones where the ``scores`` differ across those
    (:func:`scores_alike_pvalue` below :data:`BAND_TEST_LEVEL`), and that p-value (NaN when ``wider`` ≤ ``n_bins``:
    no test)."""
    p = scores_alike_pvalue(scores, std, wider, min_rows) if wider > n_bins else np.nan
    return std_bin_edges(std, wider if p < BAND_TEST_LEVEL else n_bins, min_rows), p


def band_quantiles(scores, confidence_levels, quantile=conformal_quantile) -> np.ndarray:
    """The conformal quantile of each bin per level, (B, k), from the bins' sorted ``scores`` (a list of B arrays,
    in σ̂ order) and ``quantile`` (:func:`~glas_sklearn.calibration.conformal_quantile` or a method of it).

    A level higher than the bins were made for (a bin with fewer than ⌈1/γ⌉ − 1 rows, e.g. 99.9 % asked of
    bins of 200 rows) takes the quantile of the group of neighbouring bins merged until each group has that
    many rows: the level then holds within the coarser groups, and the interval stays finite wherever the
    pooled quantile would be.

    Nested across levels: a bin's quantile is also at least the one it has at any lower level, where its
    bins may be merged otherwise (a bin holding the largest scores has its own quantile at 90 % above the
    merged group's at 95 %); that only widens the intervals, so the level still holds within the groups.
    Per merging, the quantile is largest at the highest level that merging serves, s/(s + 1) for groups of
    at least s rows, and mergings change only at the row counts s of runs of consecutive bins."""
    levels = check_confidence_levels(confidence_levels)
    counts = [s.size for s in scores]

    def merged(min_rows: int, level: float) -> np.ndarray:
        q = np.empty(len(scores))
        for group in _merged_bins(counts, min_rows):
            pooled = scores[group[0]] if len(group) == 1 else np.concatenate([scores[b] for b in group])
            q[group] = quantile(pooled, level)[0]
        return q

    ends = np.cumsum([0, *counts])
    runs = np.unique((ends[None, :] - ends[:, None])[np.triu_indices(len(ends), 1)]).tolist()
    out = np.empty((len(scores), len(levels)))
    for k, level in enumerate(levels):
        min_rows = max(1, _rows_for_finite_quantile(level))
        out[:, k] = merged(min_rows, level)
        lower = [s for s in runs if 0 < s < min_rows]  # the mergings of the lower levels
        for s, higher in itertools.pairwise([*lower, min_rows]):
            if _merged_bins(counts, s) != _merged_bins(counts, higher):  # else it serves a higher level too
                out[:, k] = np.maximum(out[:, k], merged(s, s / (s + 1.0)))
    return out


def _class_quantiles(scores, levels, quantile, labels=None) -> np.ndarray:
    """:meth:`MondrianConformalCalibrator.class_quantiles` of the classes' sorted ``scores`` (a list of C arrays) at
    ``levels`` by ``quantile``: one warning for all the classes short of rows, named by ``labels`` (else index)."""
    with silenced("few_calibration_rows"):  # one warning for all the classes, below
        out = np.stack([quantile(s, levels) if s.size else np.full(len(levels), np.inf) for s in scores])
    short = np.flatnonzero(~np.isfinite(out).all(axis=1))
    if short.size and not is_silenced("few_calibration_rows"):
        rows = ", ".join(f"{labels[c]!r}: {scores[c].size}" if labels is not None else f"{c}: {scores[c].size}"
                         for c in short)
        warnings.warn(
            f"Class-conditional conformal: {short.size} class(es) have too few calibration rows for a quantile at "
            f"level {float(levels.max())} (each needs {_rows_for_finite_quantile(levels)}; rows by class "
            f"{'' if labels is not None else 'index '}{rows}); those classes are in every prediction set at that "
            "level. Use more calibration rows (a larger calibration_size, or X_cal with more rows of those classes) "
            "or a lower confidence_level.",
            ConformalWarning, stacklevel=user_stacklevel())
    return out
