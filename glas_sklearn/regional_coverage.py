"""Coverage per region: where in the input space do prediction intervals keep their level?

An average coverage of 90 % can hide regions that are badly served (noisy corners covered at 75 %, quiet ones at
100 %). These diagnostics split the rows into regions and report coverage, mean width and interval score in each:

- :func:`regional_coverage` (a fitted estimator or Pipeline, new rows) and :func:`regional_coverage_from_predictions`
  (plain arrays, e.g. the intervals of another library): a pandas DataFrame with one row per quantile bin of the
  predictive standard deviation σ̂(x) (or, without σ̂, of the interval's half-width) and of any user column, one row
  for all rows, and one for the worst slab.
- :func:`worst_slab_coverage`: the lowest coverage over the slabs {x : a ≤ vᵀx ≤ b} holding at least a share δ of the
  rows, over random unit directions v (Cauchois, Gupta & Duchi 2021; Romano, Sesia & Candès 2020; MAPIE 1.5's
  ``worst_slab_coverage``).
- :func:`coverage_gap`: the mean absolute deviation of the groups' coverages from the level (Ding et al. 2023;
  MAPIE 1.5's ``coverage_gap``).

Definitions (those of MAPIE 1.5 / covmetrics, so the numbers compare):

- *Quantile bins* of a variable v: B equal-count bins with inner edges at the empirical quantiles j/B of v
  (``numpy.quantile``, linear interpolation), right-closed: bin b holds the rows with e_b < v ≤ e_{b+1} (the first
  also its minimum); tied values share a bin, so a bin may be empty (it is left out of the table).
- *Worst slab*: for n rows and δ ∈ (0, 1), the slabs along a direction v are the windows of at least ⌈δn⌉
  consecutive rows in the order of vᵀx; the worst-slab coverage is the minimum of the windows' coverages over
  ``n_directions`` directions drawn uniformly on the unit sphere (the features as given: standardise them first
  if their scales differ). It is measured on the same rows it searches, so it is biased low (more so with few rows
  per slab): compare methods on the same rows and directions. The minimum over windows of length ≥ k is reached
  at a length < 2k (a longer window splits into two of length ≥ k, one no better covered), which the search uses.
- *Coverage gap*: ``(1/G) Σ_g |coverage_g − (1 − γ)|`` over the G non-empty groups, or weighted,
  ``Σ_g (n_g/n) |coverage_g − (1 − γ)|``.

Intervals are MAPIE-shaped as in :mod:`glas_sklearn.metrics`; one level at a time.
"""

from __future__ import annotations

import inspect
import numbers

import numpy as np
import pandas as pd

from ._checks import check_confidence_levels, check_positive_int, numpy_rng
from .compose import final_step, predict_interval

__all__ = ["coverage_gap", "quantile_bins", "regional_coverage", "regional_coverage_from_predictions",
           "worst_slab_coverage"]

#: The columns of the table :func:`regional_coverage` returns.
COLUMNS = ["by", "output", "bin", "low", "high", "n", "coverage", "mean_width", "interval_score", "gap"]


def _intervals(y_true, y_pis) -> tuple[np.ndarray, np.ndarray]:
    """Targets (n, M) and single-level bounds (n, M, 2), float64, checked."""
    pis = np.asarray(y_pis, dtype=np.float64)
    if pis.ndim == 2:
        pis = pis[:, None, :]
    elif pis.ndim == 3:  # (n, 2, k) with k = 1
        if pis.shape[2] != 1:
            raise ValueError(f"y_pis has {pis.shape[2]} levels (shape {pis.shape}); pass one level, e.g. "
                             "y_pis[:, :, [0]].")
        pis = pis[:, None, :, 0]
    elif pis.ndim == 4:
        if pis.shape[3] != 1:
            raise ValueError(f"y_pis has {pis.shape[3]} levels (shape {pis.shape}); pass one level, e.g. "
                             "y_pis[..., [0]].")
        pis = pis[..., 0]
    else:
        raise ValueError(f"y_pis must have shape (n, 2), (n, 2, 1) or (n, M, 2, 1), got {pis.shape}.")
    if pis.shape[-1] != 2 or pis.shape[0] == 0:
        raise ValueError(f"y_pis must hold [lower, upper] bounds of n >= 1 rows, got shape {np.shape(y_pis)}.")
    if np.isnan(pis).any():
        raise ValueError("y_pis contains NaN bounds.")
    y = np.asarray(y_true, dtype=np.float64)
    n, M = pis.shape[:2]
    if y.ndim == 1 and M == 1:
        y = y[:, None]
    if y.shape != (n, M):
        raise ValueError(f"y_true has shape {np.shape(y_true)}, but y_pis of shape {np.shape(y_pis)} needs "
                         f"{(n,) if M == 1 else (n, M)}.")
    if not np.isfinite(y).all():
        raise ValueError("y_true contains NaN or infinite values.")
    return y, pis


def _covered(y: np.ndarray, pis: np.ndarray) -> np.ndarray:
    return (pis[..., 0] <= y) & (y <= pis[..., 1])


def _winkler(y: np.ndarray, pis: np.ndarray, gamma: float) -> np.ndarray:
    lo, hi = pis[..., 0], pis[..., 1]
    return (hi - lo) + (2.0 / gamma) * (np.maximum(lo - y, 0.0) + np.maximum(y - hi, 0.0))


def _level(confidence_level) -> float:
    levels = check_confidence_levels(confidence_level)
    if levels.size != 1:
        raise ValueError(f"confidence_level must be a single number in (0, 1), got {confidence_level!r}.")
    return float(levels[0])


def quantile_bins(values, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Equal-count bins of ``values`` (n,): the bin index of each row (0 … B − 1) and the B + 1 edges.

    The inner edges are the empirical quantiles j/B; bins are right-closed, so tied values share a bin.

    Examples
    --------
    >>> quantile_bins(np.arange(10.0), 5)[0].tolist()
    [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    n_bins = check_positive_int("n_bins", n_bins)
    if v.size == 0 or not np.isfinite(v).all():
        raise ValueError("The values to bin must be finite and at least one.")
    edges = np.quantile(v, np.linspace(0.0, 1.0, n_bins + 1))
    return np.searchsorted(edges[1:-1], v, side="left"), edges


def worst_slab_coverage(X, y_true, y_pis, *, delta: float = 0.1, n_directions: int = 1000,
                        random_state=0, return_slab: bool = False):
    """Worst-slab coverage: the lowest coverage over slabs {x : a ≤ vᵀx ≤ b} holding at least ⌈δn⌉ rows.

    Parameters
    ----------
    X : array-like of shape (n, p)
        The features that define the slabs (numeric; standardise them first if their scales differ).
    y_true : array-like of shape (n,) or (n, M)
    y_pis : array-like of shape (n, 2), (n, 2, 1) or (n, M, 2, 1)
        One level. For M outputs a row counts as covered when every output is.
    delta : float, default=0.1
        The smallest share of the rows a slab holds.
    n_directions : int, default=1000
        Directions v drawn uniformly on the unit sphere.
    random_state : int, numpy Generator or None, default=0
    return_slab : bool, default=False
        Also return ``(v, a, b, n_in)``: the worst slab's direction, bounds on vᵀx and row count.

    Returns
    -------
    float, or (float, tuple) with ``return_slab``

    Examples
    --------
    >>> X = np.arange(4.0)[:, None]; y = np.arange(4.0)
    >>> pis = np.array([[0.0, 1.0], [0.0, 2.0], [1.0, 2.0], [4.0, 5.0]])
    >>> worst_slab_coverage(X, y, pis, delta=0.5, n_directions=5)
    0.5
    """
    y, pis = _intervals(y_true, y_pis)
    cover = _covered(y, pis).all(axis=1).astype(np.float64)
    x = np.asarray(X, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] != cover.shape[0]:
        raise ValueError(f"X must have shape (n, p) with n = {cover.shape[0]} rows, got {np.shape(X)}.")
    if not np.isfinite(x).all():
        raise ValueError("X contains NaN or infinite values.")
    if not (isinstance(delta, numbers.Real) and 0 < delta < 1):
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}.")
    n_directions = check_positive_int("n_directions", n_directions)
    n = x.shape[0]
    k = max(1, int(np.ceil(delta * n - 1e-9)))
    V = numpy_rng(random_state).standard_normal((n_directions, x.shape[1]))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    proj = x @ V.T  # (n, n_directions)
    order = np.argsort(proj, axis=0, kind="stable")
    c = cover[order]  # (n, n_directions), rows in the order of vᵀx
    P = np.vstack([np.zeros((1, n_directions)), np.cumsum(c, axis=0)])
    best, best_at = np.full(n_directions, np.inf), np.zeros((n_directions, 2), dtype=np.int64)
    for L in range(k, min(2 * k - 1, n) + 1):
        means = (P[L:] - P[:-L]) / L  # (n − L + 1, n_directions): windows [s, s + L)
        s = np.argmin(means, axis=0)
        m = means[s, np.arange(n_directions)]
        better = m < best - 1e-12
        best[better] = m[better]
        best_at[better] = np.stack([s[better], s[better] + L], axis=1)
    j = int(np.argmin(best))
    value = float(best[j])
    if not return_slab:
        return value
    sorted_proj = np.take_along_axis(proj, order, axis=0)[:, j]
    s, e = best_at[j]
    return value, (V[j], float(sorted_proj[s]), float(sorted_proj[e - 1]), int(e - s))


def coverage_gap(y_true, y_pis, groups, confidence_level: float = 0.9, *, weighted: bool = False) -> float:
    """Coverage gap across groups: the mean over the non-empty groups of ``|coverage_g − level|``.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, M)
    y_pis : array-like of shape (n, 2), (n, 2, 1) or (n, M, 2, 1)
        One level; for M outputs every (row, output) entry counts, in its row's group.
    groups : array-like of shape (n,)
        Group labels (any hashable values).
    confidence_level : float, default=0.9
        The level 1 − γ of ``y_pis``.
    weighted : bool, default=False
        Weight each group's gap by its share of the rows (MAPIE's WCovGap).

    Returns
    -------
    float

    Examples
    --------
    >>> y = np.array([0.0, 1.0, 2.0, 3.0])
    >>> pis = np.array([[0.0, 1.0], [0.0, 2.0], [1.0, 2.0], [4.0, 5.0]])
    >>> coverage_gap(y, pis, [0, 0, 1, 1], 0.75)
    0.25
    """
    y, pis = _intervals(y_true, y_pis)
    level = _level(confidence_level)
    g = np.asarray(groups).reshape(-1)
    if g.shape[0] != y.shape[0]:
        raise ValueError(f"groups has {g.shape[0]} entries but there are {y.shape[0]} rows.")
    cover = _covered(y, pis)
    labels, inverse = np.unique(g, return_inverse=True)
    gaps, shares = [], []
    for i in range(len(labels)):
        rows = inverse == i
        gaps.append(abs(float(cover[rows].mean()) - level))
        shares.append(rows.mean())
    return float(np.dot(shares, gaps)) if weighted else float(np.mean(gaps))


def _named_columns(columns, X, n: int) -> dict[str, np.ndarray]:
    """User columns to bin by, as {name: values (n,)}: names or indices of X's columns, or a dict of arrays."""
    if columns is None:
        return {}
    if isinstance(columns, dict):
        out = {str(k): np.asarray(v, dtype=np.float64).reshape(-1) for k, v in columns.items()}
    else:
        if isinstance(columns, (str, numbers.Integral)):
            columns = [columns]
        if X is None:
            raise ValueError("columns names or indices need X; pass columns={name: values} otherwise.")
        out = {}
        n_columns = np.shape(X)[1] if np.ndim(X) == 2 else 0
        for c in columns:
            if isinstance(X, pd.DataFrame) and c in X.columns:
                col = X[c]
                out[str(col.name)] = col.to_numpy(dtype=np.float64)
                continue
            if not isinstance(c, numbers.Integral) or not -n_columns <= c < n_columns:
                names = f"names {list(X.columns)} or " if isinstance(X, pd.DataFrame) else \
                    "no names (pass a DataFrame to select columns by name) but "
                raise ValueError(f"column {c!r} is not a column of X: X has {names}{n_columns} columns, "
                                 f"indices 0 … {n_columns - 1}; or pass columns={{name: values}}.")
            if isinstance(X, pd.DataFrame):
                col = X.iloc[:, int(c)]
                out[str(col.name)] = col.to_numpy(dtype=np.float64)
            else:
                out[f"x{int(c)}"] = np.asarray(X, dtype=np.float64)[:, c]
    for name, v in out.items():
        if v.shape != (n,):
            raise ValueError(f"column {name!r} has {v.size} values but there are {n} rows.")
    return out


def regional_coverage_from_predictions(y_true, y_pis, *, std=None, columns=None, X=None, n_bins: int = 5,
                                       confidence_level: float = 0.9, delta: float = 0.1,
                                       n_directions: int = 1000, random_state=0) -> pd.DataFrame:
    """Coverage, mean width and interval score per region, from targets and intervals.

    Parameters
    ----------
    y_true : array-like of shape (n,) or (n, M)
    y_pis : array-like of shape (n, 2), (n, 2, 1) or (n, M, 2, 1)
        The intervals at one level.
    std : array-like of shape (n,) or (n, M), optional
        The predictive standard deviation σ̂(x): rows are binned by its quantiles (``by="std"``); without it, by the
        quantiles of the intervals' half-width (``by="width"``, which is σ̂ up to a factor for intervals ŷ ± q σ̂).
    columns : list of str or int, or dict of str to array-like (n,), optional
        More variables to bin by: columns of ``X`` (names of a DataFrame, or indices) or named arrays.
    X : array-like of shape (n, p), optional
        The features: the worst slab is searched over them (numeric 2-D ``X`` only), and ``columns`` come from them.
    n_bins : int, default=5
        Quantile bins per variable (5: quintiles).
    confidence_level : float, default=0.9
        The level of ``y_pis`` (for the gap and the interval score).
    delta, n_directions, random_state
        Of the worst slab (:func:`worst_slab_coverage`).

    Returns
    -------
    pandas.DataFrame
        One row per (variable, output, bin), columns ``by`` (the variable: "std", "width", a column name; "all" for
        every row; "worst slab"), ``output``, ``bin``, ``low`` and ``high`` (the variable's range in the bin; for the
        worst slab the bounds on vᵀx), ``n`` (rows), ``coverage``, ``mean_width``, ``interval_score`` (Winkler),
        ``gap`` (coverage − level). ``table.attrs`` holds ``confidence_level``, ``coverage_gap`` ({variable: the
        unweighted coverage gap across its bins, output 0}) and ``worst_slab_coverage`` (None without X).
        ``table.groupby("by")["gap"].apply(lambda g: g.abs().mean())`` gives the coverage gaps of every output.

    Examples
    --------
    >>> y = np.array([0.0, 1.0, 2.0, 3.0]); std = np.array([1.0, 1.0, 2.0, 2.0])
    >>> pis = np.array([[-1.0, 1.0], [-1.0, 0.5], [0.0, 4.0], [0.0, 4.0]])
    >>> t = regional_coverage_from_predictions(y, pis, std=std, n_bins=2)
    >>> t[t["by"] == "std"][["bin", "n", "coverage", "mean_width"]].to_numpy().tolist()
    [[0.0, 2.0, 0.5, 1.75], [1.0, 2.0, 1.0, 4.0]]
    """
    y, pis = _intervals(y_true, y_pis)
    n, M = y.shape
    level = _level(confidence_level)
    n_bins = check_positive_int("n_bins", n_bins)
    cover, width, score = _covered(y, pis), pis[..., 1] - pis[..., 0], _winkler(y, pis, 1.0 - level)
    if std is not None:
        sd = np.asarray(std, dtype=np.float64)
        sd = sd[:, None] if sd.ndim == 1 else sd
        if sd.shape != (n, M):
            raise ValueError(f"std has shape {np.shape(std)}, but the intervals need {(n,) if M == 1 else (n, M)}.")
        variables = {"std": sd}
    else:
        half = np.where(np.isfinite(width), width / 2, np.inf)
        top = np.max(np.abs(half[np.isfinite(half)]), initial=0.0)
        if top > 0:  # equal widths up to round-off (ŷ ± q) are one width: 12 significant digits
            half = np.round(half, int(11 - np.floor(np.log10(top))))
        variables = {"width": half}
    for name, v in _named_columns(columns, X, n).items():
        variables[name] = np.repeat(v[:, None], M, axis=1)

    def row(by, j, b, low, high, rows):
        w = width[rows, j]
        return {"by": by, "output": j, "bin": b, "low": low, "high": high, "n": int(rows.sum()),
                "coverage": float(cover[rows, j].mean()), "mean_width": float(w.mean()),
                "interval_score": float(score[rows, j].mean()), "gap": float(cover[rows, j].mean()) - level}

    records = []
    for j in range(M):
        records.append(row("all", j, 0, np.nan, np.nan, np.ones(n, dtype=bool)))
        for name, v in variables.items():
            finite = np.isfinite(v[:, j])
            vals = np.where(finite, v[:, j], np.max(v[finite, j], initial=0.0))
            index, _ = quantile_bins(vals, n_bins)
            for b in range(n_bins):
                rows = index == b
                if rows.any():
                    records.append(row(name, j, b, float(v[rows, j].min()), float(v[rows, j].max()), rows))
    worst = None
    if X is not None:
        x = np.asarray(X) if not isinstance(X, pd.DataFrame) else X.to_numpy()
        if x.ndim == 2 and np.issubdtype(x.dtype, np.number) and x.shape[0] == n:
            for j in range(M):
                value, (_, a, b, n_in) = worst_slab_coverage(x, y[:, j], pis[:, j], delta=delta,
                                                             n_directions=n_directions, random_state=random_state,
                                                             return_slab=True)
                records.append({"by": "worst slab", "output": j, "bin": 0, "low": a, "high": b, "n": n_in,
                                "coverage": value, "mean_width": np.nan, "interval_score": np.nan,
                                "gap": value - level})
                worst = value if worst is None else min(worst, value)
    table = pd.DataFrame.from_records(records, columns=COLUMNS)
    binned = table[(table["output"] == 0) & ~table["by"].isin(["all", "worst slab"])]
    table.attrs = {"confidence_level": level, "worst_slab_coverage": worst,
                   "coverage_gap": {k: float(g["gap"].abs().mean()) for k, g in binned.groupby("by", sort=False)}}
    return table


def _estimator_std(estimator, X) -> np.ndarray | None:
    """``predict(X, return_std=True)``'s std of the final step, when it has one."""
    final, Xt = final_step(estimator, X)
    try:
        takes = "return_std" in inspect.signature(final.predict).parameters
    except (TypeError, ValueError, AttributeError):
        takes = False
    if not takes:
        return None
    out = final.predict(Xt, return_std=True)
    return np.asarray(out[1], dtype=np.float64) if isinstance(out, tuple) and len(out) == 2 else None


def regional_coverage(estimator, X, y, *, columns=None, n_bins: int = 5, confidence_level: float | None = None,
                      delta: float = 0.1, n_directions: int = 1000, random_state=0) -> pd.DataFrame:
    """Coverage, mean width and interval score per region of a fitted estimator's intervals on rows (X, y).

    The rows are binned by the quantiles of the estimator's predictive std (``predict(X, return_std=True)``, as
    :class:`~glas_sklearn.LaplaceActiveSubspaceRegressor` has; otherwise of the intervals' half-width) and of any
    ``columns``; the worst slab is searched over X when it is numeric 2-D (as given, or after a Pipeline's
    transforms it is not: the slab directions act on the raw features).

    Parameters
    ----------
    estimator : estimator or Pipeline
        Fitted, with ``predict_interval`` (through :func:`~glas_sklearn.compose.predict_interval`: Pipelines and
        MAPIE-style regressors too).
    X : array-like or DataFrame of shape (n, ...)
    y : array-like of shape (n,) or (n, M)
        Rows the estimator was not fitted or calibrated on.
    columns, n_bins, delta, n_directions, random_state
        As in :func:`regional_coverage_from_predictions`.
    confidence_level : float, optional
        One level; defaults to the estimator's (first) ``confidence_level``.

    Returns
    -------
    pandas.DataFrame
        As :func:`regional_coverage_from_predictions`.

    Examples
    --------
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank, Training
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-1, 1, size=(300, 2)); y = X[:, 0] + (0.05 + 0.3 * (X[:, 1] > 0)) * rng.standard_normal(300)
    >>> reg = LaplaceActiveSubspaceRegressor(training=Training(max_epochs=50),
    ...                                      posterior=LowRank(n_samples=100, max_components=5), random_state=0)
    >>> table = regional_coverage(reg.fit(X[:200], y[:200]), X[200:], y[200:], columns=[1], n_directions=50)
    >>> sorted(table["by"].unique())
    ['all', 'std', 'worst slab', 'x1']
    """
    if confidence_level is None:
        final, _ = final_step(estimator, X)
        default = getattr(final, "confidence_level", None)
        if default is None:
            raise ValueError(f"{type(final).__name__} has no confidence_level attribute; pass confidence_level=, the "
                             "level its intervals are built for (e.g. confidence_level=0.9 for MAPIE's regressors).")
        confidence_level = float(np.ravel(check_confidence_levels(default))[0])
    level = _level(confidence_level)
    _, y_pis = predict_interval(estimator, X, confidence_level=level)
    return regional_coverage_from_predictions(y, y_pis, std=_estimator_std(estimator, X), columns=columns, X=X,
                                              n_bins=n_bins, confidence_level=level, delta=delta,
                                              n_directions=n_directions, random_state=random_state)
