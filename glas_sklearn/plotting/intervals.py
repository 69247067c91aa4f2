"""IntervalDisplay, plot_intervals: predictive intervals of a regressor against data (paper Fig. 3, 7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from ._axes import check_matplotlib, grid_and_legend, pct, plot_axes, single_level

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes

__all__ = ["IntervalDisplay", "plot_intervals"]


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
    method : str, optional
        How the intervals were calibrated, named in the legend (e.g. "conformal": "90 % conformal interval for
        y"); :meth:`from_estimator` fills both in from the fitted estimator.

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
                 n_components: int | None = None, interval_of: str = "f", method: str | None = None) -> None:
        self.y_true = np.asarray(y_true, dtype=float)
        self.y_pred = np.asarray(y_pred, dtype=float)
        self.y_lower = np.asarray(y_lower, dtype=float)
        self.y_upper = np.asarray(y_upper, dtype=float)
        self.confidence_level = confidence_level
        self.x = None if x is None else np.asarray(x, dtype=float)
        self.x_label = x_label
        self.n_components = n_components
        self.interval_of = interval_of
        self.method = method
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
        check_matplotlib(f"{type(self).__name__}.plot")
        level = float(self.confidence_level)
        y, pred, lo, hi = self.y_true, self.y_pred, self.y_lower, self.y_upper
        method = f"{self.method} " if self.method else ""
        name = f"{pct(level)} {method}interval for {self.interval_of}"
        ax = plot_axes(self, ax)
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
        ax.set_title(f"{d}{self.coverage:.1%} of {y.shape[0]} points inside the {pct(level)} intervals",
                     fontsize="medium")
        grid_and_legend(ax)
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
        check_matplotlib(caller)
        if not (isinstance(estimator, BaseEstimator) and hasattr(estimator, "predict_interval")):
            raise TypeError(f"{caller} expects a fitted LaplaceActiveSubspaceRegressor, got "
                            f"{type(estimator).__name__} (interval plots are for regression; use plot_calibration "
                            "for a classifier).")
        check_is_fitted(estimator, "posterior_")
        level = single_level(confidence_level, estimator.confidence_level)
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
        interval_of, method = _what_the_intervals_are(estimator)
        disp = cls(y_true=y, y_pred=pred, y_lower=pis[:, 0, 0], y_upper=pis[:, 1, 0], confidence_level=level, x=x,
                   x_label=x_label, n_components=estimator.n_components_, interval_of=interval_of, method=method)
        return disp.plot(ax)


def _what_the_intervals_are(estimator) -> tuple[str, str | None]:
    """What a fitted regressor's intervals are for, and how they were calibrated, from its fitted state (not its
    parameters, which may have been changed since): split-conformal intervals are for y (``conformity_scores_``
    held); a likelihood that predicts the noise per row (``noise_per_row``, the heteroscedastic ones) always
    includes σ(x), so they are for y; the posterior's own intervals (``calibration="coverage"``) are for y when the
    calibrator added the noise variance (``include_noise=True`` at fit), else for the network output f."""
    if getattr(estimator, "conformity_scores_", None) is not None:
        return "y", "conformal"
    if getattr(getattr(estimator, "likelihood_", None), "noise_per_row", False):
        return "y", None
    calibrator = getattr(estimator, "calibrator_", None)
    noise = getattr(calibrator, "noise_var_", 0.0)
    return ("y" if np.any(np.asarray(noise, dtype=float) > 0) else "f"), None


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
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank, Training
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-1, 1, (60, 1)); y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(60)
    >>> training = Training(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=20)
    >>> reg = LaplaceActiveSubspaceRegressor(training=training, posterior=LowRank(n_samples=50, max_components=3),
    ...                                      random_state=0).fit(X, y)
    >>> ax = plot_intervals(reg, X, y)
    >>> len(ax.collections[-1].get_offsets())
    60
    """
    return IntervalDisplay.from_estimator(est, X, y, confidence_level=confidence_level, ax=ax).ax_
