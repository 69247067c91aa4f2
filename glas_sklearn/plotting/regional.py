"""RegionalCoverageDisplay: coverage and mean width of intervals per quantile bin of σ̂(x) or of a column."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..regional_coverage import regional_coverage, regional_coverage_from_predictions
from ._axes import check_matplotlib, grid_and_legend, pct, plot_axes

if TYPE_CHECKING:  # pragma: no cover - typing only
    pass

__all__ = ["RegionalCoverageDisplay"]


class RegionalCoverageDisplay:
    """Coverage (left) and mean width (right) of intervals per quantile bin of one variable.

    The variable is the predictive std σ̂(x) by default (the intervals' half-width when there is no σ̂), or a
    column given by name. The left panel draws the level as a dashed line, the coverage of all rows as a dotted
    one, and the worst-slab coverage as a dash-dotted one when the table has it. Build it with
    :meth:`from_estimator` or :meth:`from_predictions`; plot it again on the same two Axes with a ``label`` to
    overlay several methods.

    Parameters
    ----------
    table : pandas.DataFrame
        A table of :func:`~glas_sklearn.regional_coverage.regional_coverage`.
    by : str, optional
        The variable whose bins are drawn: "std" (or "width") by default, else a column name of the table.
    output : int, default=0
        The output drawn (multi-output intervals).

    Attributes
    ----------
    coverage_line_, width_line_ : matplotlib Line2D
        Coverage and mean width per bin: xdata = bin number (1 … B), ydata = the values.
    target_line_ : matplotlib Line2D
    overall_line_ : matplotlib Line2D
        The coverage of all rows.
    worst_slab_line_ : matplotlib Line2D or None
    ax_ : ndarray of two matplotlib Axes
    figure_ : matplotlib Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> y = np.array([0.0, 1.0, 2.0, 3.0]); std = np.array([1.0, 1.0, 2.0, 2.0])
    >>> pis = np.array([[-1.0, 1.0], [-1.0, 0.5], [0.0, 4.0], [0.0, 4.0]])
    >>> disp = RegionalCoverageDisplay.from_predictions(y, pis, std=std, n_bins=2, confidence_level=0.9)
    >>> disp.coverage_line_.get_ydata().tolist(), disp.width_line_.get_ydata().tolist()
    ([0.5, 1.0], [1.75, 4.0])
    """

    def __init__(self, *, table: pd.DataFrame, by: str | None = None, output: int = 0) -> None:
        self.table = table
        self.by = by
        self.output = output

    def _variable(self) -> str:
        if self.by is not None:
            return self.by
        return "std" if (self.table["by"] == "std").any() else "width"

    def plot(self, ax=None, *, label: str | None = None) -> RegionalCoverageDisplay:
        """Draw the two panels.

        Parameters
        ----------
        ax : sequence of two matplotlib Axes, optional
            Where to draw; a new figure when None.
        label : str, optional
            Legend label of the curves (default "coverage" and "mean width").

        Returns
        -------
        RegionalCoverageDisplay
            ``self``, with the artists stored.
        """
        check_matplotlib(f"{type(self).__name__}.plot")
        t = self.table
        by = self._variable()
        rows = t[(t["by"] == by) & (t["output"] == self.output)]
        if rows.empty:
            raise ValueError(f"The table has no bins of {by!r} for output {self.output}; it has "
                             f"{sorted(set(t['by']) - {'all', 'worst slab'})}.")
        level = float(t.attrs.get("confidence_level", np.nan))
        if not np.isfinite(level):
            level = float((t["coverage"] - t["gap"]).iloc[0])
        x = rows["bin"].to_numpy() + 1
        axes = plot_axes(self, ax, n_panels=2)
        (cov,) = axes[0].plot(x, rows["coverage"].to_numpy(), marker="o", ms=4, lw=1.4, label=label or "coverage")
        same = [ln for ln in axes[0].lines if ln.get_gid() == "glas-regional-target"]
        if same:
            target = same[0]
        else:
            target = axes[0].axhline(level, color="0.35", ls="--", lw=1.0, label=f"target {pct(level)}")
            target.set_gid("glas-regional-target")
        whole = t[(t["by"] == "all") & (t["output"] == self.output)]["coverage"]
        overall = axes[0].axhline(float(whole.iloc[0]) if len(whole) else np.nan, color=cov.get_color(), ls=":",
                                  lw=1.0, label=f"all rows ({float(whole.iloc[0]):.1%})" if len(whole) else None)
        slab = t[(t["by"] == "worst slab") & (t["output"] == self.output)]["coverage"]
        self.worst_slab_line_ = None
        if len(slab):
            self.worst_slab_line_ = axes[0].axhline(float(slab.iloc[0]), color=cov.get_color(), ls="-.", lw=1.0,
                                                    label=f"worst slab ({float(slab.iloc[0]):.1%})")
        name = {"std": "predictive std σ̂", "width": "interval half-width"}.get(by, by)
        axes[0].set_xlabel(f"bin of {name} (low → high)")
        axes[0].set_ylabel("coverage")
        lo = min(float(rows["coverage"].min()), level, float(slab.min()) if len(slab) else 1.0)
        axes[0].set_ylim(min(axes[0].get_ylim()[0], lo - 0.05), 1.02)
        (width,) = axes[1].plot(x, rows["mean_width"].to_numpy(), marker="o", ms=4, lw=1.4,
                                label=label or "mean width")
        axes[1].set_xlabel(f"bin of {name} (low → high)")
        axes[1].set_ylabel("mean interval width")
        for a in axes:
            a.set_xticks(x)
            grid_and_legend(a)
        self.coverage_line_, self.width_line_, self.target_line_, self.overall_line_ = cov, width, target, overall
        self.ax_, self.figure_ = axes, axes[0].figure
        return self

    @classmethod
    def from_estimator(cls, estimator, X, y, *, by: str | None = None, columns=None, n_bins: int = 5,
                       confidence_level: float | None = None, delta: float = 0.1, n_directions: int = 1000,
                       random_state=0, ax=None, label: str | None = None) -> RegionalCoverageDisplay:
        """Coverage per bin of a fitted estimator's intervals on rows (X, y)
        (:func:`~glas_sklearn.regional_coverage.regional_coverage`).

        Parameters
        ----------
        estimator : estimator or Pipeline
            Fitted, with ``predict_interval``.
        X, y : array-like
            Rows it was not fitted or calibrated on.
        by : str, optional
            The variable drawn (default σ̂); a name in ``columns`` draws that column's bins.
        columns, n_bins, confidence_level, delta, n_directions, random_state
            As in :func:`~glas_sklearn.regional_coverage.regional_coverage`.
        ax : sequence of two matplotlib Axes, optional
        label : str, optional

        Returns
        -------
        RegionalCoverageDisplay
        """
        check_matplotlib(f"{cls.__name__}.from_estimator")
        table = regional_coverage(estimator, X, y, columns=columns, n_bins=n_bins, confidence_level=confidence_level,
                                  delta=delta, n_directions=n_directions, random_state=random_state)
        return cls(table=table, by=by).plot(ax, label=label)

    @classmethod
    def from_predictions(cls, y_true, y_pis, *, std=None, X=None, by: str | None = None, columns=None,
                         n_bins: int = 5, confidence_level: float = 0.9, delta: float = 0.1,
                         n_directions: int = 1000, random_state=0, ax=None,
                         label: str | None = None) -> RegionalCoverageDisplay:
        """Coverage per bin from targets and intervals
        (:func:`~glas_sklearn.regional_coverage.regional_coverage_from_predictions`).

        Parameters
        ----------
        y_true, y_pis, std, X, columns, n_bins, confidence_level, delta, n_directions, random_state
            As in :func:`~glas_sklearn.regional_coverage.regional_coverage_from_predictions`.
        by : str, optional
            The variable drawn (default σ̂, or the half-width without ``std``).
        ax : sequence of two matplotlib Axes, optional
        label : str, optional

        Returns
        -------
        RegionalCoverageDisplay
        """
        check_matplotlib(f"{cls.__name__}.from_predictions")
        table = regional_coverage_from_predictions(y_true, y_pis, std=std, columns=columns, X=X, n_bins=n_bins,
                                                   confidence_level=confidence_level, delta=delta,
                                                   n_directions=n_directions, random_state=random_state)
        return cls(table=table, by=by).plot(ax, label=label)
