"""CoverageDisplay, plot_calibration: coverage of the calibration data against the subspace dimension d
(paper Fig. 6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from sklearn.base import is_classifier

from ..calibration import CalibrationResult
from ._axes import (
    TARGET_GID,
    check_fitted_estimator,
    check_matplotlib,
    grid_and_legend,
    integer_locator,
    pct,
    plot_axes,
    single_level,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes

__all__ = ["CoverageDisplay", "plot_calibration"]


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
        check_matplotlib(f"{type(self).__name__}.plot")
        d = np.asarray(self.d)
        cov = np.asarray(self.coverage, dtype=float)
        if d.size == 0:
            raise ValueError("The calibration table is empty (no calibration rows), so there is nothing to plot.")
        level, chosen = float(self.confidence_level), int(self.chosen_d)
        ax = plot_axes(self, ax)
        (line,) = ax.plot(d, cov, marker="o", ms=3.5, lw=1.4, label=label or "coverage")
        targets = [ln for ln in ax.lines if ln.get_gid() == TARGET_GID]
        if not targets:
            target = ax.axhline(level, color="0.35", ls="--", lw=1.0, label=f"target {pct(level)}")
            target.set_gid(TARGET_GID)
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
        ax.xaxis.set_major_locator(integer_locator())
        grid_and_legend(ax)
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
        check_matplotlib(f"{cls.__name__}.from_estimator")
        check_fitted_estimator(estimator, "calibration_", f"{cls.__name__}.from_estimator",
                                f"for a CalibrationResult use {cls.__name__}.from_result or plot_calibration")
        table, calibrator = estimator.calibration_, estimator.calibrator_
        if not calibrator.chooses_dimension:
            raise ValueError(
                f"{cls.__name__}.from_estimator: the estimator was calibrated with calibration="
                f"{estimator.calibration!r} ({type(calibrator).__name__}) at a fixed d = {estimator.n_components_}, "
                "so it has no coverage curve over d; plot the posterior's own curve with "
                "CoverageDisplay(d=..., coverage=...) from estimator.coverage_curve(X, y), or fit with "
                "calibration='coverage'.")
        disp = cls(d=table["d"].to_numpy(), coverage=table["coverage"].to_numpy(dtype=float),
                   confidence_level=single_level(None, estimator.confidence_level),
                   chosen_d=int(estimator.n_components_),
                   reached=calibrator.reached_ is not False,  # None: d was given, not chosen
                   classification=is_classifier(estimator))
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
        check_matplotlib(f"{cls.__name__}.from_result")
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
