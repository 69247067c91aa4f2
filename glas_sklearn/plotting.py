"""Diagnostic plots of a fitted GLAS model: calibration curve, intervals, spectrum, activity.

The plots follow scikit-learn's Display pattern: a ``*Display`` object holds the numbers of one plot, is
built with ``from_estimator`` (a fitted regressor or classifier) or ``from_result`` / ``from_posterior``,
and draws them with ``plot(ax=None)``, keeping the matplotlib artists it made as attributes ending in
``_`` (``ax_``, ``figure_``, ``line_``, ...) for restyling. The ``plot_*`` functions are shortcuts that build
the display and return its Axes, so plots can be combined with ordinary matplotlib calls.

- :class:`CoverageDisplay`, :func:`plot_calibration`: coverage of the calibration data against the
  subspace dimension d (paper Fig. 6).
- :class:`IntervalDisplay`, :func:`plot_intervals`: intervals over sorted x for 1-D inputs, else a parity
  plot (paper Fig. 3, 7).
- :class:`SpectrumDisplay`, :func:`plot_spectrum`: eigenvalues λ_j, posterior variances σ_j² and
  contraction ratios c_j (paper Fig. 13).
- :class:`ActivityDisplay`, :func:`plot_activity`: sorted cumulative activity share κ_i of the weights,
  log-log (paper Fig. 8).

matplotlib is optional: it is imported only when something is drawn (``pip install glas-sklearn[plot]``).
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

__all__ = [
    "ActivityDisplay",
    "CoverageDisplay",
    "IntervalDisplay",
    "SpectrumDisplay",
    "plot_activity",
    "plot_calibration",
    "plot_intervals",
    "plot_spectrum",
]

_INSTALL_HINT = "pip install glas-sklearn[plot]"
_TARGET_GID = "glas-calibration-target"


# ----------------------------------------------------------------------------- helpers


def _check_matplotlib(caller: str) -> None:
    """Raise an ImportError that says how to install matplotlib when it is missing.

    The contract of scikit-learn's ``check_matplotlib_support`` (call it before any computation), which
    scikit-learn 1.9 keeps in a private module; the message names this package's extra.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(f"{caller} needs matplotlib, which is not installed; install it with `{_INSTALL_HINT}` "
                          "(or `pip install matplotlib`).") from err


def _plot_axes(display, ax, n_panels: int = 1):
    """Where a Display's ``plot`` draws: the caller's Axes, or a new figure.

    Parameters
    ----------
    display : object
        The Display that draws (its class name goes into the error message).
    ax : matplotlib Axes, sequence of Axes or None
        The caller's Axes (``n_panels`` of them when ``n_panels > 1``); None makes a new constrained-layout
        figure with ``n_panels`` panels side by side.
    n_panels : int, default=1
        How many panels the display draws.

    Returns
    -------
    matplotlib Axes, or ndarray of ``n_panels`` Axes when ``n_panels > 1``
    """
    import matplotlib.pyplot as plt

    if ax is not None:
        if n_panels == 1:
            return ax
        axes = np.asarray(ax, dtype=object).reshape(-1)
        if axes.size != n_panels:
            raise ValueError(f"{type(display).__name__} draws {n_panels} panels, so ax must hold {n_panels} Axes, "
                             f"got {axes.size}.")
        return axes
    if n_panels == 1:
        _, ax = plt.subplots(figsize=(5.0, 3.8), layout="constrained")
        return ax
    _, axes = plt.subplots(1, n_panels, figsize=(4.2 * n_panels, 3.6), layout="constrained")
    return np.asarray(axes)


def _grid_and_legend(ax, *, legend_loc: str = "best", grid_which: str = "major") -> None:
    """The finish every panel gets: a light grid and a small legend.

    Parameters
    ----------
    ax : matplotlib Axes
    legend_loc : str, default="best"
        Passed to ``Axes.legend`` as ``loc``.
    grid_which : str, default="major"
        Passed to ``Axes.grid`` as ``which``.
    """
    ax.grid(True, which=grid_which, alpha=0.3)
    ax.legend(loc=legend_loc, fontsize="small")


def _integer_locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _pct(level: float) -> str:
    """0.9 → '90 %', 0.9545 → '95.45 %', 0.000989 → '0.0989 %'."""
    return f"{100 * level:.3g} %" if level < 0.01 else f"{100 * level:.4g} %"


def _check_fitted_estimator(est, attribute: str, caller: str, also: str) -> None:
    if not isinstance(est, BaseEstimator):
        raise TypeError(f"{caller} expects a fitted LaplaceActiveSubspaceRegressor or LaplaceActiveSubspaceClassifier"
                        f" ({also}), got {type(est).__name__}.")
    check_is_fitted(est, attribute)


def _estimator_posterior(est, d, caller: str, display: str) -> tuple[ActiveSubspacePosterior, int, bool]:
    """(posterior, d, d_is_chosen) of a fitted estimator: d defaults to its n_components_."""
    _check_fitted_estimator(est, "posterior_", caller, f"for an ActiveSubspacePosterior use {display}.from_posterior")
    default = int(est.n_components_)
    d = _check_d(est.posterior_, default if d is None else d, caller)
    return est.posterior_, d, d == default


def _bare_posterior(posterior, d, caller: str) -> tuple[ActiveSubspacePosterior, int, bool]:
    """(posterior, d, False) of an ActiveSubspacePosterior or LaplaceSubspace: d defaults to K."""
    if isinstance(posterior, LaplaceSubspace):
        posterior = posterior.posterior
    if not isinstance(posterior, ActiveSubspacePosterior):
        raise TypeError(f"{caller} expects an ActiveSubspacePosterior or a LaplaceSubspace (for a fitted estimator "
                        f"use from_estimator), got {type(posterior).__name__}.")
    return posterior, _check_d(posterior, posterior.max_components if d is None else d, caller), False


def _check_d(post: ActiveSubspacePosterior, d, caller: str) -> int:
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not 1 <= d <= post.max_components:
        raise ValueError(f"{caller}: d must be an integer between 1 and K = {post.max_components} (the number of "
                         f"eigenpairs computed), got {d!r}.")
    return int(d)


def _single_level(confidence_level, default) -> float:
    """The level to draw: a given one (a single number), else the estimator's first (its calibration target)."""
    if confidence_level is None:
        return float(check_confidence_levels(default)[0])
    levels = check_confidence_levels(confidence_level)
    if levels.size != 1:
        raise ValueError(f"confidence_level must be a single number in (0, 1) for a plot, got {confidence_level!r}.")
    return float(levels[0])


# ------------------------------------------------------------------------ calibration


class CoverageDisplay:
    """Coverage of the calibration data against the subspace dimension d (paper Fig. 6).

    The target level is drawn as a horizontal line and the chosen d is marked with a star (labelled
    "not reached" when no d reached the level and d_max was used). Build it with :meth:`from_estimator`
    or :meth:`from_result`; plot it again on the same ``ax`` (with a ``label``) to overlay several curves,
    e.g. both posterior scalings, which share one target line.

    Parameters
    ----------
    d : array-like of int
        The subspace dimensions tried.
    coverage : array-like of float
        The coverage of the calibration data at each d.
    confidence_level : float
        The target level 1 − γ.
    chosen_d : int
        The d the calibration settled on.
    reached : bool, default=True
        Whether the coverage reached the level at ``chosen_d``.
    classification : bool, default=False
        Coverage of prediction sets (classifier) rather than of intervals; only changes the y label.

    Attributes
    ----------
    line_ : matplotlib Line2D
        The coverage curve: xdata = d, ydata = coverage.
    target_line_ : matplotlib Line2D
        The target level (shared with earlier curves on the same Axes).
    chosen_marker_ : matplotlib Line2D or None
        The star at the chosen d (None when ``chosen_d`` is not among ``d``).
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> disp = CoverageDisplay(d=[1, 2, 3], coverage=[0.6, 0.85, 0.92], confidence_level=0.9, chosen_d=3).plot()
    >>> disp.line_.get_ydata().tolist(), disp.chosen_marker_.get_xdata().tolist()
    ([0.6, 0.85, 0.92], [3])
    """

    def __init__(self, *, d, coverage, confidence_level: float, chosen_d: int, reached: bool = True,
                 classification: bool = False) -> None:
        self.d = d
        self.coverage = coverage
        self.confidence_level = confidence_level
        self.chosen_d = chosen_d
        self.reached = reached
        self.classification = classification

    def plot(self, ax: Axes | None = None, *, label: str | None = None) -> CoverageDisplay:
        """Draw the curve.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw; a new figure when None.
        label : str, optional
            Legend label of the coverage curve (default "coverage").

        Returns
        -------
        CoverageDisplay
            ``self``, with the artists stored.
        """
        _check_matplotlib(f"{type(self).__name__}.plot")
        d = np.asarray(self.d)
        cov = np.asarray(self.coverage, dtype=float)
        if d.size == 0:
            raise ValueError("The calibration table is empty (no calibration rows), so there is nothing to plot.")
        level, chosen = float(self.confidence_level), int(self.chosen_d)
        ax = _plot_axes(self, ax)
        (line,) = ax.plot(d, cov, marker="o", ms=3.5, lw=1.4, label=label or "coverage")
        targets = [ln for ln in ax.lines if ln.get_gid() == _TARGET_GID]
        if not targets:
            target = ax.axhline(level, color="0.35", ls="--", lw=1.0, label=f"target {_pct(level)}")
            target.set_gid(_TARGET_GID)
            targets = [target]
        self.chosen_marker_ = None
        at = np.flatnonzero(d == chosen)
        if at.size:
            what = f"chosen d = {chosen}" if self.reached else f"not reached, d_max = {chosen}"
            (self.chosen_marker_,) = ax.plot([chosen], [cov[at[0]]], marker="*", ms=13, ls="none",
                                             color=line.get_color(), markeredgecolor="k",
                                             label=f"{what} ({cov[at[0]]:.1%})")
        ax.set_xlabel("subspace dimension d")
        ax.set_ylabel("coverage of prediction sets" if self.classification else "coverage of calibration data")
        ax.set_ylim(min(ax.get_ylim()[0], float(np.min(cov)) - 0.05, level - 0.1), 1.02)
        ax.xaxis.set_major_locator(_integer_locator())
        _grid_and_legend(ax)
        self.line_, self.target_line_ = line, targets[0]
        self.ax_, self.figure_ = ax, ax.figure
        return self

    @classmethod
    def from_estimator(cls, estimator, *, ax: Axes | None = None, label: str | None = None) -> CoverageDisplay:
        """The calibration curve of a fitted estimator (its ``calibration_`` table).

        With ``n_components="auto"`` the table stops at the chosen d.

        Parameters
        ----------
        estimator : LaplaceActiveSubspaceRegressor or LaplaceActiveSubspaceClassifier
            Fitted.
        ax : matplotlib Axes, optional
        label : str, optional
            Legend label of the coverage curve.

        Returns
        -------
        CoverageDisplay
        """
        _check_matplotlib(f"{cls.__name__}.from_estimator")
        _check_fitted_estimator(estimator, "calibration_", f"{cls.__name__}.from_estimator",
                                f"for a CalibrationResult use {cls.__name__}.from_result or plot_calibration")
        table = estimator.calibration_
        if "level" in table.columns:
            raise ValueError(
                f"{cls.__name__}.from_estimator: the estimator was calibrated with calibration='conformal' at a fixed "
                f"d = {estimator.n_components_}, so it has no coverage curve over d; plot the posterior's own curve "
                "with CoverageDisplay(d=..., coverage=...) from estimator.coverage_curve(X, y), or fit with "
                "calibration='coverage'.")
        disp = cls(d=table["d"].to_numpy(), coverage=table["coverage"].to_numpy(dtype=float),
                   confidence_level=_single_level(None, estimator.confidence_level),
                   chosen_d=int(estimator.n_components_),
                   # None: d was given, not chosen
                   reached=getattr(estimator, "calibration_reached_", None) is not False,
                   classification="mean_set_size" in table.columns)
        return disp.plot(ax, label=label)

    @classmethod
    def from_result(cls, result: CalibrationResult, *, ax: Axes | None = None,
                    label: str | None = None) -> CoverageDisplay:
        """The curve of :func:`glas_sklearn.calibration.choose_dimension`'s result.

        Parameters
        ----------
        result : CalibrationResult
            With ``full_curve=True`` its table holds every d up to d_max.
        ax : matplotlib Axes, optional
        label : str, optional
            Legend label of the coverage curve.

        Returns
        -------
        CoverageDisplay
        """
        _check_matplotlib(f"{cls.__name__}.from_result")
        if not isinstance(result, CalibrationResult):
            raise TypeError(f"{cls.__name__}.from_result expects a CalibrationResult (from choose_dimension), got "
                            f"{type(result).__name__}; for a fitted estimator use from_estimator.")
        table = result.table
        disp = cls(d=table["d"].to_numpy(), coverage=table["coverage"].to_numpy(dtype=float),
                   confidence_level=float(result.confidence_level), chosen_d=int(result.n_components),
                   reached=bool(result.reached), classification="mean_set_size" in table.columns)
        return disp.plot(ax, label=label)


def plot_calibration(est, ax: Axes | None = None, *, label: str | None = None) -> Axes:
    """Coverage of the calibration data against the subspace dimension d (paper Fig. 6).

    A shortcut for :class:`CoverageDisplay` that returns the Axes. The target level is drawn as a
    horizontal line and the chosen d is marked with a star (labelled "not reached" when no d reached the
    level and d_max was used). Call it again with the same ``ax`` (and a ``label``) to overlay several
    curves, e.g. both posterior scalings.

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
        return CoverageDisplay.from_result(est, ax=ax, label=label).ax_
    return CoverageDisplay.from_estimator(est, ax=ax, label=label).ax_


# -------------------------------------------------------------------------- intervals


class IntervalDisplay:
    """Predictive intervals of a regressor against data (paper Fig. 3, 7).

    With the values ``x`` of a single input feature: the interval band and the predictive mean over
    sorted x, with the data as points. Without: a parity plot, each record's interval a vertical segment
    at its predicted mean, the observed y as points and the diagonal y = prediction. The title gives the
    empirical coverage of ``y_true``. Build it with :meth:`from_estimator`.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        The observed targets.
    y_pred : array-like of shape (n,)
        The predictive means.
    y_lower, y_upper : array-like of shape (n,)
        The interval bounds.
    confidence_level : float
        The level of the intervals.
    x : array-like of shape (n,), optional
        The single input feature; None draws a parity plot.
    x_label : str, default="x"
        Label of the x axis of the band plot.
    n_components : int, optional
        The subspace dimension d, named in the title.
    interval_of : {"f", "y"}, default="f"
        What the interval describes: the network output f, or y = f + noise.

    Attributes
    ----------
    coverage : float
        The fraction of ``y_true`` inside [``y_lower``, ``y_upper``].
    band_ : matplotlib PolyCollection or LineCollection
        The interval band (``fill_between``) or, in a parity plot, the segments (``vlines``).
    mean_line_ : matplotlib Line2D or None
        The predictive mean over sorted x (None in a parity plot).
    points_ : matplotlib PathCollection
        The data: offsets (x, y) or (prediction, y).
    diagonal_ : matplotlib Line2D or None
        The line y = prediction of a parity plot (None in a band plot).
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> disp = IntervalDisplay(y_true=[0.5, 3.0], y_pred=[0.0, 1.0], y_lower=[-1.0, 0.0], y_upper=[1.0, 2.0],
    ...                        confidence_level=0.9).plot()
    >>> disp.coverage, disp.points_.get_offsets().tolist()
    (0.5, [[0.0, 0.5], [1.0, 3.0]])
    """

    def __init__(self, *, y_true, y_pred, y_lower, y_upper, confidence_level: float, x=None, x_label: str = "x",
                 n_components: int | None = None, interval_of: str = "f") -> None:
        self.y_true = np.asarray(y_true, dtype=float)
        self.y_pred = np.asarray(y_pred, dtype=float)
        self.y_lower = np.asarray(y_lower, dtype=float)
        self.y_upper = np.asarray(y_upper, dtype=float)
        self.confidence_level = confidence_level
        self.x = None if x is None else np.asarray(x, dtype=float)
        self.x_label = x_label
        self.n_components = n_components
        self.interval_of = interval_of
        self.coverage = float(np.mean((self.y_true >= self.y_lower) & (self.y_true <= self.y_upper)))

    def plot(self, ax: Axes | None = None) -> IntervalDisplay:
        """Draw the band (with ``x``) or the parity plot.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw; a new figure when None.

        Returns
        -------
        IntervalDisplay
            ``self``, with the artists stored.
        """
        _check_matplotlib(f"{type(self).__name__}.plot")
        level = float(self.confidence_level)
        y, pred, lo, hi = self.y_true, self.y_pred, self.y_lower, self.y_upper
        name = f"{_pct(level)} interval for {self.interval_of}"
        ax = _plot_axes(self, ax)
        self.mean_line_ = self.diagonal_ = None
        if self.x is not None:
            x = self.x
            order = np.argsort(x, kind="stable")
            self.band_ = ax.fill_between(x[order], lo[order], hi[order], alpha=0.3, lw=0, label=name)
            (self.mean_line_,) = ax.plot(x[order], pred[order], lw=1.5, label="predictive mean")
            self.points_ = ax.scatter(x, y, s=10, color="k", zorder=3, label="data")
            ax.set_xlabel(self.x_label)
            ax.set_ylabel("y")
        else:
            self.band_ = ax.vlines(pred, lo, hi, color="tab:blue", alpha=0.45, lw=1.2, label=name)
            self.points_ = ax.scatter(pred, y, s=10, color="k", zorder=3, label="data")
            both = np.concatenate([pred, y, lo, hi])
            lims = (float(both.min()), float(both.max()))
            (self.diagonal_,) = ax.plot(lims, lims, color="0.5", ls="--", lw=1.0, label="y = prediction")
            ax.set_xlabel("predicted mean")
            ax.set_ylabel("observed y")
        d = "" if self.n_components is None else f"d = {self.n_components}: "
        ax.set_title(f"{d}{self.coverage:.1%} of {y.shape[0]} points inside the {_pct(level)} intervals",
                     fontsize="medium")
        _grid_and_legend(ax)
        self.ax_, self.figure_ = ax, ax.figure
        return self

    @classmethod
    def from_estimator(cls, estimator, X, y, *, confidence_level: float | None = None,
                       ax: Axes | None = None) -> IntervalDisplay:
        """Intervals of a fitted single-output regressor on (X, y).

        A band over sorted x when X has one feature, else a parity plot.

        Parameters
        ----------
        estimator : LaplaceActiveSubspaceRegressor
            Fitted, with a single output.
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            The observed targets (user units).
        confidence_level : float, optional
            The interval level; defaults to the estimator's (first) ``confidence_level``.
        ax : matplotlib Axes, optional

        Returns
        -------
        IntervalDisplay
        """
        caller = f"{cls.__name__}.from_estimator"
        _check_matplotlib(caller)
        if not (isinstance(estimator, BaseEstimator) and hasattr(estimator, "predict_interval")):
            raise TypeError(f"{caller} expects a fitted LaplaceActiveSubspaceRegressor, got "
                            f"{type(estimator).__name__} (interval plots are for regression; use plot_calibration "
                            "for a classifier).")
        check_is_fitted(estimator, "posterior_")
        level = _single_level(confidence_level, estimator.confidence_level)
        y = np.asarray(y, dtype=float)
        n_rows = len(X)
        if y.ndim != 1 or y.shape[0] != n_rows:
            raise ValueError(f"y must have shape ({n_rows},) to match the rows of X, got {y.shape}.")
        pred, pis = estimator.predict_interval(X, confidence_level=level)
        if pis.ndim != 3:
            raise ValueError(f"{caller} draws a single output, but the regressor was fitted on a 2-D y; "
                             "plot one output at a time from est.predict_interval(X).")
        Xa = np.asarray(X.to_numpy() if hasattr(X, "to_numpy") else X)
        x, x_label = None, "x"
        if Xa.ndim == 2 and Xa.shape[1] == 1:
            x = Xa[:, 0].astype(float)
            names = getattr(estimator, "feature_names_in_", None)
            x_label = str(names[0]) if names is not None else "x"
        disp = cls(y_true=y, y_pred=pred, y_lower=pis[:, 0, 0], y_upper=pis[:, 1, 0], confidence_level=level, x=x,
                   x_label=x_label, n_components=estimator.n_components_,
                   interval_of="y" if getattr(estimator, "include_noise", False) else "f")
        return disp.plot(ax)


def plot_intervals(est, X, y, ax: Axes | None = None, confidence_level: float | None = None) -> Axes:
    """Predictive intervals of a fitted regressor against data.

    A shortcut for :meth:`IntervalDisplay.from_estimator` that returns the Axes. One input feature: the
    interval band and the predictive mean over sorted x, with the data as points (paper Fig. 3). Several
    features: a parity plot (paper Fig. 7): each record's interval drawn as a vertical segment at its
    predicted mean, the observed y as points and the diagonal y = prediction.

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
    return IntervalDisplay.from_estimator(est, X, y, confidence_level=confidence_level, ax=ax).ax_


# --------------------------------------------------------------------------- spectrum


class SpectrumDisplay:
    """Eigenvalues, posterior variances and contraction ratios of the active subspace (paper Fig. 13).

    Three panels: λ_j for every computed eigenpair (log scale when all are positive, d marked), the
    posterior variances σ_j² = 1/(βλ_j + σ0⁻²) for j ≤ d with the prior variance σ0² (log scale), and the
    contraction ratios c_j = βλ_j/(βλ_j + σ0⁻²) for j ≤ d (≈1 data-informed, ≈0 prior-dominated). Build it
    with :meth:`from_estimator` or :meth:`from_posterior`.

    Parameters
    ----------
    eigenvalues : array-like of shape (K,)
    variances, contraction : array-like of shape (d,)
    sigma0 : float
        The prior standard deviation (empirical Bayes at d).
    beta : float
        The likelihood scaling β.
    d : int
        The subspace dimension.
    d_is_chosen : bool, default=False
        Whether d is the one an estimator chose (the marker then says "chosen d").

    Attributes
    ----------
    eigenvalue_line_, variance_line_, contraction_line_ : matplotlib Line2D
        The data of the three panels (xdata = j).
    d_line_ : matplotlib Line2D
        The vertical mark at d in the eigenvalue panel.
    prior_line_ : matplotlib Line2D
        The prior variance σ0² in the variance panel.
    axes_ : ndarray of 3 matplotlib Axes
        [eigenvalues, variances, contraction].
    figure_ : matplotlib Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> disp = SpectrumDisplay(eigenvalues=[2.0, 0.5], variances=[0.1, 0.3], contraction=[0.9, 0.7], sigma0=1.0,
    ...                        beta=10.0, d=2).plot()
    >>> disp.contraction_line_.get_ydata().tolist()
    [0.9, 0.7]
    """

    def __init__(self, *, eigenvalues, variances, contraction, sigma0: float, beta: float, d: int,
                 d_is_chosen: bool = False) -> None:
        self.eigenvalues = np.asarray(eigenvalues, dtype=float)
        self.variances = np.asarray(variances, dtype=float)
        self.contraction = np.asarray(contraction, dtype=float)
        self.sigma0 = sigma0
        self.beta = beta
        self.d = d
        self.d_is_chosen = d_is_chosen

    def plot(self, ax: Sequence[Axes] | None = None) -> SpectrumDisplay:
        """Draw the three panels.

        Parameters
        ----------
        ax : sequence of 3 matplotlib Axes, optional
            Where to draw; a new 1 × 3 figure when None.

        Returns
        -------
        SpectrumDisplay
            ``self``, with the artists stored.
        """
        _check_matplotlib(f"{type(self).__name__}.plot")
        axes = _plot_axes(self, ax, 3)
        lam, var, con, d, sigma0 = self.eigenvalues, self.variances, self.contraction, int(self.d), self.sigma0
        j_all, j_d = np.arange(1, lam.size + 1), np.arange(1, d + 1)

        a0, a1, a2 = axes
        (self.eigenvalue_line_,) = a0.plot(j_all, lam, marker="o", ms=3, lw=1.2, label="λ_j")
        chosen = "chosen " if self.d_is_chosen else ""
        self.d_line_ = a0.axvline(d, color="0.4", ls=":", lw=1.0, label=f"{chosen}d = {d}")
        if np.all(lam > 0):
            a0.set_yscale("log")
        a0.set_xlabel("j")
        a0.set_ylabel("GGN eigenvalue λ_j")
        a0.set_title(f"spectrum (β = {self.beta:.3g})", fontsize="medium")

        (self.variance_line_,) = a1.plot(j_d, var, marker="o", ms=3, lw=1.2, label="σ_j²")
        self.prior_line_ = a1.axhline(sigma0**2, color="0.4", ls="--", lw=1.0,
                                      label=f"prior σ0² = {sigma0**2:.3g}")
        a1.set_yscale("log")
        a1.set_xlabel("j")
        a1.set_ylabel("posterior variance σ_j²")
        a1.set_title(f"posterior variances (d = {d})", fontsize="medium")

        (self.contraction_line_,) = a2.plot(j_d, con, marker="o", ms=3, lw=1.2, label="c_j")
        a2.set_ylim(-0.03, 1.03)
        a2.set_xlabel("j")
        a2.set_ylabel("contraction ratio c_j")
        a2.set_title("contraction (1 data, 0 prior)", fontsize="medium")
        for a in axes:
            a.xaxis.set_major_locator(_integer_locator())
            _grid_and_legend(a)
        self.axes_, self.figure_ = axes, a0.figure
        return self

    @classmethod
    def _from(cls, post: ActiveSubspacePosterior, d: int, chosen: bool, ax) -> SpectrumDisplay:
        disp = cls(eigenvalues=post.eigenvalues.detach().cpu().double().numpy(),
                   variances=post.variances(d).detach().cpu().double().numpy(),
                   contraction=post.contraction(d).detach().cpu().double().numpy(),
                   sigma0=post.fit_sigma0(d), beta=post.beta, d=d, d_is_chosen=chosen)
        return disp.plot(ax)

    @classmethod
    def from_estimator(cls, estimator, *, d: int | None = None, ax: Sequence[Axes] | None = None) -> SpectrumDisplay:
        """The spectrum of a fitted regressor or classifier.

        Parameters
        ----------
        estimator : LaplaceActiveSubspaceRegressor or LaplaceActiveSubspaceClassifier
            Fitted.
        d : int, optional
            Subspace dimension for σ_j² and c_j; the estimator's ``n_components_`` by default.
        ax : sequence of 3 matplotlib Axes, optional

        Returns
        -------
        SpectrumDisplay
        """
        caller = f"{cls.__name__}.from_estimator"
        _check_matplotlib(caller)
        return cls._from(*_estimator_posterior(estimator, d, caller, cls.__name__), ax)

    @classmethod
    def from_posterior(cls, posterior, *, d: int | None = None, ax: Sequence[Axes] | None = None) -> SpectrumDisplay:
        """The spectrum of a posterior built directly.

        Parameters
        ----------
        posterior : ActiveSubspacePosterior or LaplaceSubspace
        d : int, optional
            Subspace dimension for σ_j² and c_j; K (all eigenpairs) by default.
        ax : sequence of 3 matplotlib Axes, optional

        Returns
        -------
        SpectrumDisplay
        """
        caller = f"{cls.__name__}.from_posterior"
        _check_matplotlib(caller)
        return cls._from(*_bare_posterior(posterior, d, caller), ax)


def plot_spectrum(est, ax: Sequence[Axes] | None = None, d: int | None = None) -> np.ndarray:
    """Eigenvalues, posterior variances and contraction ratios of the active subspace (paper Fig. 13).

    A shortcut for :class:`SpectrumDisplay` that returns its Axes. Three panels: λ_j for every computed
    eigenpair (log scale, the chosen d marked), the posterior variances σ_j² = 1/(βλ_j + σ0⁻²) for j ≤ d with
    the prior variance σ0² (log scale), and the contraction ratios c_j = βλ_j/(βλ_j + σ0⁻²) for j ≤ d
    (≈1 data-informed, ≈0 prior-dominated). σ0 is the empirical-Bayes value at d.

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
    if isinstance(est, (ActiveSubspacePosterior, LaplaceSubspace)):
        return SpectrumDisplay.from_posterior(est, d=d, ax=ax).axes_
    return SpectrumDisplay.from_estimator(est, d=d, ax=ax).axes_


# --------------------------------------------------------------------------- activity


class ActivityDisplay:
    """Sorted cumulative activity share κ_i of the weights against their rank i, log-log (paper Fig. 8).

    The activity score of weight i is ν_i = Σ_{j≤d} λ_j p_{j,i}² (eq. 8); κ_i is the share of the total held
    by the i most active weights (eq. 9). A curve that saturates early means the active subspace lives on
    few weights. Plot again on the same ``ax`` with another d to compare dimensions. Build it with
    :meth:`from_estimator` or :meth:`from_posterior`.

    Parameters
    ----------
    ranks : array-like of int
        The ranks i drawn (1-based, increasing).
    kappa : array-like of float
        κ_i at those ranks.
    d : int
        The subspace dimension (the curve's label).
    n_weights : int
        D, the number of weights.
    top_rank : int, optional
        Mark the share κ held by the ``top_rank`` most active weights; None draws no mark.
    top_share : float, optional
        κ at ``top_rank``.
    top_fraction : float, optional
        The fraction of D that ``top_rank`` stands for (for the mark's label).

    Attributes
    ----------
    line_ : matplotlib Line2D
        The curve: xdata = ranks, ydata = κ.
    top_marker_ : matplotlib Line2D or None
        The mark at ``top_rank``.
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> disp = ActivityDisplay(ranks=[1, 2, 3], kappa=[0.5, 0.9, 1.0], d=2, n_weights=3).plot()
    >>> disp.line_.get_ydata().tolist(), disp.top_marker_ is None
    ([0.5, 0.9, 1.0], True)
    """

    def __init__(self, *, ranks, kappa, d: int, n_weights: int, top_rank: int | None = None,
                 top_share: float | None = None, top_fraction: float | None = None) -> None:
        self.ranks = np.asarray(ranks)
        self.kappa = np.asarray(kappa, dtype=float)
        self.d = d
        self.n_weights = n_weights
        self.top_rank = top_rank
        self.top_share = top_share
        self.top_fraction = top_fraction

    def plot(self, ax: Axes | None = None) -> ActivityDisplay:
        """Draw the curve (and the mark at ``top_rank``).

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw; a new figure when None.

        Returns
        -------
        ActivityDisplay
            ``self``, with the artists stored.
        """
        _check_matplotlib(f"{type(self).__name__}.plot")
        ax = _plot_axes(self, ax)
        D = int(self.n_weights)
        (line,) = ax.plot(self.ranks, self.kappa, lw=1.6, label=f"d = {self.d}")
        self.top_marker_ = None
        if self.top_rank is not None:
            k, share = int(self.top_rank), float(self.top_share)
            what = f"top {_pct(self.top_fraction)}" if self.top_fraction is not None else "top"
            (self.top_marker_,) = ax.plot([k], [share], marker="o", ls="none", color=line.get_color(),
                                          label=f"{what} ({k:,} weights): {share:.1%}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"number of most active weights i (of D = {D:,})")
        ax.set_ylabel("cumulative activity share κ_i")
        _grid_and_legend(ax, legend_loc="lower right", grid_which="both")
        self.line_, self.ax_, self.figure_ = line, ax, ax.figure
        return self

    @classmethod
    def _from(cls, post: ActiveSubspacePosterior, d: int, top_fraction, max_points, ax) -> ActivityDisplay:
        if isinstance(max_points, bool) or not isinstance(max_points, numbers.Integral) or max_points < 2:
            raise ValueError(f"max_points must be an integer >= 2, got {max_points!r}.")
        if top_fraction is not None and not (isinstance(top_fraction, numbers.Real) and 0 < top_fraction < 1):
            raise ValueError(f"top_fraction must be a number in (0, 1) or None, got {top_fraction!r}.")
        kappa = post.cumulative_activity(d).detach().cpu().double().numpy()
        D = kappa.size
        if D <= max_points:
            ranks = np.arange(1, D + 1)
        else:
            ranks = np.union1d(np.round(np.geomspace(1, D, num=max_points)).astype(np.int64), [1, D])
        top = {}
        if top_fraction is not None:
            k = max(1, math.ceil(top_fraction * D))
            top = dict(top_rank=k, top_share=float(kappa[k - 1]), top_fraction=top_fraction)
        return cls(ranks=ranks, kappa=kappa[ranks - 1], d=d, n_weights=D, **top).plot(ax)

    @classmethod
    def from_estimator(cls, estimator, *, d: int | None = None, top_fraction: float | None = 1e-3,
                       max_points: int = 2000, ax: Axes | None = None) -> ActivityDisplay:
        """The activity curve of a fitted regressor or classifier.

        Parameters
        ----------
        estimator : LaplaceActiveSubspaceRegressor or LaplaceActiveSubspaceClassifier
            Fitted.
        d : int, optional
            Subspace dimension; the estimator's ``n_components_`` by default.
        top_fraction : float or None, default=1e-3
            Mark the share held by this fraction of the weights (the top ⌈fraction · D⌉), as the paper
            reads the top 0.1 %; None draws no mark.
        max_points : int, default=2000
            κ is drawn at every rank when D ≤ max_points, else at up to this many log-spaced ranks (always
            including rank 1 and rank D), which keeps networks with millions of weights light.
        ax : matplotlib Axes, optional

        Returns
        -------
        ActivityDisplay
        """
        caller = f"{cls.__name__}.from_estimator"
        _check_matplotlib(caller)
        post, d, _ = _estimator_posterior(estimator, d, caller, cls.__name__)
        return cls._from(post, d, top_fraction, max_points, ax)

    @classmethod
    def from_posterior(cls, posterior, *, d: int | None = None, top_fraction: float | None = 1e-3,
                       max_points: int = 2000, ax: Axes | None = None) -> ActivityDisplay:
        """The activity curve of a posterior built directly.

        Parameters
        ----------
        posterior : ActiveSubspacePosterior or LaplaceSubspace
        d : int, optional
            Subspace dimension; K (all eigenpairs) by default.
        top_fraction, max_points, ax
            As for :meth:`from_estimator`.

        Returns
        -------
        ActivityDisplay
        """
        caller = f"{cls.__name__}.from_posterior"
        _check_matplotlib(caller)
        post, d, _ = _bare_posterior(posterior, d, caller)
        return cls._from(post, d, top_fraction, max_points, ax)


def plot_activity(est, ax: Axes | None = None, d: int | None = None, *, top_fraction: float | None = 1e-3,
                  max_points: int = 2000) -> Axes:
    """Sorted cumulative activity share κ_i of the weights against their rank i, log-log (paper Fig. 8).

    A shortcut for :class:`ActivityDisplay` that returns the Axes. The activity score of weight i is
    ν_i = Σ_{j≤d} λ_j p_{j,i}² (eq. 8); κ_i is the share of the total held by the i most active weights
    (eq. 9). A curve that saturates early means the active subspace lives on few weights. Call again with
    the same ``ax`` and another ``d`` to compare dimensions.

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
    kw = dict(d=d, top_fraction=top_fraction, max_points=max_points, ax=ax)
    if isinstance(est, (ActiveSubspacePosterior, LaplaceSubspace)):
        return ActivityDisplay.from_posterior(est, **kw).ax_
    return ActivityDisplay.from_estimator(est, **kw).ax_
