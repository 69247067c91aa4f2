"""Diagnostic plots of a fitted GLAS model: calibration curve, intervals, spectrum, activity.

matplotlib is optional: it is imported only when a plot function is called (``pip install glas-sklearn[plot]``).
Every function draws into the Axes it is given (or a new figure) and returns them, so plots can be combined
and restyled with ordinary matplotlib calls.

- :func:`plot_calibration`: coverage of the calibration data against the subspace dimension d (paper Fig. 6).
- :func:`plot_intervals`: intervals over sorted x for 1-D inputs, else a parity plot (paper Fig. 3, 7).
- :func:`plot_spectrum`: eigenvalues λ_j, posterior variances σ_j² and contraction ratios c_j (paper Fig. 13).
- :func:`plot_activity`: sorted cumulative activity share κ_i of the weights, log-log (paper Fig. 8).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from ._checks import check_confidence_levels
from .calibration import CalibrationResult
from .laplace import LaplaceSubspace
from .posterior import ActiveSubspacePosterior

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes

__all__ = ["plot_calibration", "plot_intervals", "plot_spectrum", "plot_activity"]

_INSTALL_HINT = "pip install glas-sklearn[plot]"
_TARGET_GID = "glas-calibration-target"


# ----------------------------------------------------------------------------- helpers


def _pyplot():
    """matplotlib.pyplot, or an ImportError that says how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(f"Plotting needs matplotlib, which is not installed; install it with `{_INSTALL_HINT}` "
                          "(or `pip install matplotlib`).") from err
    return plt


def _new_axes(ax, n_panels: int = 1, figsize=None):
    plt = _pyplot()
    if ax is not None:
        return ax
    if n_panels == 1:
        _, ax = plt.subplots(figsize=figsize or (5.0, 3.8), layout="constrained")
        return ax
    _, axes = plt.subplots(1, n_panels, figsize=figsize or (4.2 * n_panels, 3.6), layout="constrained")
    return np.asarray(axes)


def _integer_locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _pct(level: float) -> str:
    """0.9 → '90 %', 0.9545 → '95.45 %', 0.000989 → '0.0989 %'."""
    return f"{100 * level:.3g} %" if level < 0.01 else f"{100 * level:.4g} %"


def _check_fitted_estimator(est, attribute: str, caller: str, also: str) -> None:
    if not isinstance(est, BaseEstimator):
        raise TypeError(f"{caller} expects a fitted LaplaceActiveSubspaceRegressor or LaplaceActiveSubspaceClassifier"
                        f" or {also}, got {type(est).__name__}.")
    check_is_fitted(est, attribute)


def _posterior_and_d(est, d, caller: str) -> tuple[ActiveSubspacePosterior, int, bool]:
    """(posterior, d, d_is_chosen): d defaults to the estimator's n_components_, or K for a bare posterior."""
    if isinstance(est, LaplaceSubspace):
        est = est.posterior
    if isinstance(est, ActiveSubspacePosterior):
        post, default = est, est.max_components
        chosen = False
    else:
        _check_fitted_estimator(est, "posterior_", caller, "an ActiveSubspacePosterior")
        post, default = est.posterior_, int(est.n_components_)
        chosen = True
    if d is None:
        return post, default, chosen
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not 1 <= d <= post.max_components:
        raise ValueError(f"{caller}: d must be an integer between 1 and K = {post.max_components} (the number of "
                         f"eigenpairs computed), got {d!r}.")
    return post, int(d), chosen and int(d) == default


def _single_level(confidence_level, default) -> float:
    """The level to draw: a given one (a single number), else the estimator's first (its calibration target)."""
    if confidence_level is None:
        return float(check_confidence_levels(default)[0])
    levels = check_confidence_levels(confidence_level)
    if levels.size != 1:
        raise ValueError(f"confidence_level must be a single number in (0, 1) for a plot, got {confidence_level!r}.")
    return float(levels[0])


# ------------------------------------------------------------------------ calibration


def plot_calibration(est, ax: Axes | None = None, *, label: str | None = None) -> Axes:
    """Coverage of the calibration data against the subspace dimension d (paper Fig. 6).

    The target level is drawn as a horizontal line and the chosen d is marked with a star (labelled
    "not reached" when no d reached the level and d_max was used). Call it again
    with the same ``ax`` (and a ``label``) to overlay several curves, e.g. both posterior scalings.

    Parameters
    ----------
    est : LaplaceActiveSubspaceRegressor, LaplaceActiveSubspaceClassifier or CalibrationResult
        A fitted estimator (its ``calibration_`` table; with ``n_components="auto"`` the table stops at the
        chosen d) or the result of :func:`glas_sklearn.calibration.choose_dimension` (with
        ``full_curve=True`` it holds every d up to d_max).
    ax : matplotlib Axes, optional
        Where to draw; a new figure when None.
    label : str, optional
        Legend label of the coverage curve (default "coverage").

    Returns
    -------
    matplotlib.axes.Axes
        The coverage curve is ``ax.lines[0]`` on a fresh Axes: xdata = d, ydata = coverage.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import pandas as pd
    >>> from glas_sklearn.calibration import CalibrationResult
    >>> table = pd.DataFrame({"d": [1, 2, 3], "coverage": [0.6, 0.85, 0.92], "mean_width": [1.0, 1.5, 2.0],
    ...                       "sigma0": [0.1, 0.1, 0.1]})
    >>> res = CalibrationResult(n_components=3, sigma0=0.1, reached=True, table=table, coverage=0.92,
    ...                         confidence_level=0.9)
    >>> ax = plot_calibration(res)
    >>> ax.lines[0].get_ydata().tolist()
    [0.6, 0.85, 0.92]
    """
    if isinstance(est, CalibrationResult):
        table, level, chosen = est.table, float(est.confidence_level), int(est.n_components)
        reached = bool(est.reached)
    else:
        _check_fitted_estimator(est, "calibration_", "plot_calibration", "a CalibrationResult")
        table, chosen = est.calibration_, int(est.n_components_)
        level = _single_level(None, est.confidence_level)
        reached = getattr(est, "calibration_reached_", None) is not False  # None: d was given, not chosen
    classification = "mean_set_size" in table.columns
    if len(table) == 0:
        raise ValueError("The calibration table is empty (no calibration rows), so there is nothing to plot.")
    ax = _new_axes(ax)
    d = table["d"].to_numpy()
    cov = table["coverage"].to_numpy(dtype=float)
    (line,) = ax.plot(d, cov, marker="o", ms=3.5, lw=1.4, label=label or "coverage")
    if not any(ln.get_gid() == _TARGET_GID for ln in ax.lines):
        target = ax.axhline(level, color="0.35", ls="--", lw=1.0, label=f"target {_pct(level)}")
        target.set_gid(_TARGET_GID)
    at = np.flatnonzero(d == chosen)
    if at.size:
        what = f"chosen d = {chosen}" if reached else f"not reached, d_max = {chosen}"
        ax.plot([chosen], [cov[at[0]]], marker="*", ms=13, ls="none", color=line.get_color(),
                markeredgecolor="k", label=f"{what} ({cov[at[0]]:.1%})")
    ax.set_xlabel("subspace dimension d")
    ax.set_ylabel("coverage of prediction sets" if classification else "coverage of calibration data")
    ax.set_ylim(min(ax.get_ylim()[0], float(np.min(cov)) - 0.05, level - 0.1), 1.02)
    ax.xaxis.set_major_locator(_integer_locator())
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return ax


# -------------------------------------------------------------------------- intervals


def plot_intervals(est, X, y, ax: Axes | None = None, confidence_level: float | None = None) -> Axes:
    """Predictive intervals of a fitted regressor against data.

    One input feature: the interval band and the predictive mean over sorted x, with the data as points
    (paper Fig. 3). Several features: a parity plot (paper Fig. 7): each record's interval drawn as a
    vertical segment at its predicted mean, the observed y as points and the diagonal y = prediction.

    Parameters
    ----------
    est : LaplaceActiveSubspaceRegressor
        Fitted, with a single output.
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
        The observed targets (user units).
    ax : matplotlib Axes, optional
        Where to draw; a new figure when None.
    confidence_level : float, optional
        The interval level; defaults to the estimator's (first) ``confidence_level``.

    Returns
    -------
    matplotlib.axes.Axes
        The data points are ``ax.collections[-1]`` (n_samples offsets). The title gives the empirical
        coverage of ``y``.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import numpy as np
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-1, 1, (60, 1)); y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(60)
    >>> reg = LaplaceActiveSubspaceRegressor(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=20,
    ...                                      n_samples=50, max_components=3, random_state=0).fit(X, y)
    >>> ax = plot_intervals(reg, X, y)
    >>> len(ax.collections[-1].get_offsets())
    60
    """
    if not (isinstance(est, BaseEstimator) and hasattr(est, "predict_interval")):
        raise TypeError(f"plot_intervals expects a fitted LaplaceActiveSubspaceRegressor, got {type(est).__name__} "
                        "(interval plots are for regression; use plot_calibration for a classifier).")
    check_is_fitted(est, "posterior_")
    level = _single_level(confidence_level, est.confidence_level)
    y = np.asarray(y, dtype=float)
    n_rows = len(X)
    if y.ndim != 1 or y.shape[0] != n_rows:
        raise ValueError(f"y must have shape ({n_rows},) to match the rows of X, got {y.shape}.")
    pred, pis = est.predict_interval(X, confidence_level=level)
    if pis.ndim != 3:
        raise ValueError("plot_intervals draws a single output, but the regressor was fitted on a 2-D y; "
                         "plot one output at a time from est.predict_interval(X).")
    lo, hi = pis[:, 0, 0], pis[:, 1, 0]
    covered = float(np.mean((y >= lo) & (y <= hi)))
    of = "y" if getattr(est, "include_noise", False) else "f"  # what the interval describes
    ax = _new_axes(ax)
    Xa = np.asarray(X.to_numpy() if hasattr(X, "to_numpy") else X)
    if Xa.ndim == 2 and Xa.shape[1] == 1:
        x = Xa[:, 0].astype(float)
        order = np.argsort(x, kind="stable")
        ax.fill_between(x[order], lo[order], hi[order], alpha=0.3, lw=0, label=f"{_pct(level)} interval for {of}")
        ax.plot(x[order], pred[order], lw=1.5, label="predictive mean")
        ax.scatter(x, y, s=10, color="k", zorder=3, label="data")
        names = getattr(est, "feature_names_in_", None)
        ax.set_xlabel(str(names[0]) if names is not None else "x")
        ax.set_ylabel("y")
    else:
        ax.vlines(pred, lo, hi, color="tab:blue", alpha=0.45, lw=1.2, label=f"{_pct(level)} interval for {of}")
        ax.scatter(pred, y, s=10, color="k", zorder=3, label="data")
        both = np.concatenate([pred, y, lo, hi])
        lims = (float(both.min()), float(both.max()))
        ax.plot(lims, lims, color="0.5", ls="--", lw=1.0, label="y = prediction")
        ax.set_xlabel("predicted mean")
        ax.set_ylabel("observed y")
    ax.set_title(f"d = {est.n_components_}: {covered:.1%} of {n_rows} points inside the {_pct(level)} intervals",
                 fontsize="medium")
    ax.legend(loc="best", fontsize="small")
    ax.grid(True, alpha=0.3)
    return ax


# --------------------------------------------------------------------------- spectrum


def plot_spectrum(est, ax: Sequence[Axes] | None = None, d: int | None = None) -> np.ndarray:
    """Eigenvalues, posterior variances and contraction ratios of the active subspace (paper Fig. 13).

    Three panels: λ_j for every computed eigenpair (log scale, the chosen d marked), the posterior variances
    σ_j² = 1/(βλ_j + σ0⁻²) for j ≤ d with the prior variance σ0² (log scale), and the contraction ratios
    c_j = βλ_j/(βλ_j + σ0⁻²) for j ≤ d (≈1 data-informed, ≈0 prior-dominated). σ0 is the empirical-Bayes
    value at d.

    Parameters
    ----------
    est : fitted estimator, ActiveSubspacePosterior or LaplaceSubspace
        Regressor or classifier (after ``fit``), or a posterior built directly.
    ax : sequence of 3 matplotlib Axes, optional
        Where to draw; a new 1 × 3 figure when None.
    d : int, optional
        Subspace dimension for σ_j² and c_j: the estimator's ``n_components_`` by default, K (all
        eigenpairs) for a bare posterior.

    Returns
    -------
    ndarray of 3 matplotlib Axes
        [eigenvalues, variances, contraction]; the data are each panel's ``lines[0]``.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import torch
    >>> from glas_sklearn.posterior import ActiveSubspacePosterior
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).double()
    >>> P, _ = torch.linalg.qr(torch.randn(13, 3, dtype=torch.float64))
    >>> post = ActiveSubspacePosterior(net, torch.tensor([2.0, 0.5, 0.1], dtype=torch.float64), P, beta=10.0)
    >>> axes = plot_spectrum(post)
    >>> axes[0].lines[0].get_ydata().tolist()
    [2.0, 0.5, 0.1]
    """
    post, d, chosen = _posterior_and_d(est, d, "plot_spectrum")
    if ax is None:
        axes = _new_axes(None, 3)
    else:
        _pyplot()
        axes = np.asarray(ax, dtype=object).reshape(-1)
        if axes.size != 3:
            raise ValueError(f"plot_spectrum draws 3 panels, so ax must hold 3 Axes, got {axes.size}.")
    lam = post.eigenvalues.detach().cpu().double().numpy()
    var = post.variances(d).detach().cpu().double().numpy()
    con = post.contraction(d).detach().cpu().double().numpy()
    sigma0 = post.fit_sigma0(d)
    j_all, j_d = np.arange(1, lam.size + 1), np.arange(1, d + 1)

    a0, a1, a2 = axes
    a0.plot(j_all, lam, marker="o", ms=3, lw=1.2, label="λ_j")
    a0.axvline(d, color="0.4", ls=":", lw=1.0, label=f"{'chosen ' if chosen else ''}d = {d}")
    if np.all(lam > 0):
        a0.set_yscale("log")
    a0.set_xlabel("j")
    a0.set_ylabel("GGN eigenvalue λ_j")
    a0.set_title(f"spectrum (β = {post.beta:.3g})", fontsize="medium")

    a1.plot(j_d, var, marker="o", ms=3, lw=1.2, label="σ_j²")
    a1.axhline(sigma0**2, color="0.4", ls="--", lw=1.0, label=f"prior σ0² = {sigma0**2:.3g}")
    a1.set_yscale("log")
    a1.set_xlabel("j")
    a1.set_ylabel("posterior variance σ_j²")
    a1.set_title(f"posterior variances (d = {d})", fontsize="medium")

    a2.plot(j_d, con, marker="o", ms=3, lw=1.2, label="c_j")
    a2.set_ylim(-0.03, 1.03)
    a2.set_xlabel("j")
    a2.set_ylabel("contraction ratio c_j")
    a2.set_title("contraction (1 data, 0 prior)", fontsize="medium")
    for a in axes:
        a.xaxis.set_major_locator(_integer_locator())
        a.grid(True, alpha=0.3)
        a.legend(loc="best", fontsize="small")
    return axes


# --------------------------------------------------------------------------- activity


def plot_activity(est, ax: Axes | None = None, d: int | None = None, *, top_fraction: float | None = 1e-3,
                  max_points: int = 2000) -> Axes:
    """Sorted cumulative activity share κ_i of the weights against their rank i, log-log (paper Fig. 8).

    The activity score of weight i is ν_i = Σ_{j≤d} λ_j p_{j,i}² (eq. 8); κ_i is the share of the total held
    by the i most active weights (eq. 9). A curve that saturates early means the active subspace lives on
    few weights. Call again with the same ``ax`` and another ``d`` to compare dimensions.

    Parameters
    ----------
    est : fitted estimator, ActiveSubspacePosterior or LaplaceSubspace
    ax : matplotlib Axes, optional
        Where to draw; a new figure when None.
    d : int, optional
        Subspace dimension: the estimator's ``n_components_`` by default, K for a bare posterior.
    top_fraction : float or None, default=1e-3
        Mark the share held by this fraction of the weights (the top ⌈fraction · D⌉), as the paper reads
        the top 0.1 %; None draws no mark.
    max_points : int, default=2000
        κ is drawn at every rank when D ≤ max_points, else at up to this many log-spaced ranks (always
        including rank 1 and rank D), which keeps networks with millions of weights light.

    Returns
    -------
    matplotlib.axes.Axes
        The curve is the first line this call adds (label ``"d = …"``): xdata = ranks, ydata = κ at those
        ranks; the ``top_fraction`` mark, when drawn, is the line after it.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import torch
    >>> from glas_sklearn.posterior import ActiveSubspacePosterior
    >>> net = torch.nn.Linear(4, 1, bias=False).double()
    >>> post = ActiveSubspacePosterior(net, torch.tensor([3.0, 1.0], dtype=torch.float64),
    ...                                torch.eye(4, 2, dtype=torch.float64), beta=1.0)
    >>> ax = plot_activity(post, top_fraction=None)
    >>> ax.lines[0].get_ydata().tolist()
    [0.75, 1.0, 1.0, 1.0]
    """
    post, d, _ = _posterior_and_d(est, d, "plot_activity")
    if isinstance(max_points, bool) or not isinstance(max_points, numbers.Integral) or max_points < 2:
        raise ValueError(f"max_points must be an integer >= 2, got {max_points!r}.")
    if top_fraction is not None and not (isinstance(top_fraction, numbers.Real) and 0 < top_fraction < 1):
        raise ValueError(f"top_fraction must be a number in (0, 1) or None, got {top_fraction!r}.")
    ax = _new_axes(ax)
    kappa = post.cumulative_activity(d).detach().cpu().double().numpy()
    D = kappa.size
    if D <= max_points:
        ranks = np.arange(1, D + 1)
    else:
        ranks = np.union1d(np.round(np.geomspace(1, D, num=max_points)).astype(np.int64), [1, D])
    (line,) = ax.plot(ranks, kappa[ranks - 1], lw=1.6, label=f"d = {d}")
    if top_fraction is not None:
        k = max(1, math.ceil(top_fraction * D))
        ax.plot([k], [kappa[k - 1]], marker="o", ls="none", color=line.get_color(),
                label=f"top {_pct(top_fraction)} ({k:,} weights): {kappa[k - 1]:.1%}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"number of most active weights i (of D = {D:,})")
    ax.set_ylabel("cumulative activity share κ_i")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    return ax
