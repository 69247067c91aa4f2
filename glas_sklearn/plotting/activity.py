"""ActivityDisplay, plot_activity: the sorted cumulative activity share of the weights, log-log (paper Fig. 8)."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..laplace import LaplaceSubspace
from ..posterior import ActiveSubspacePosterior
from ._axes import bare_posterior, check_matplotlib, estimator_posterior, grid_and_legend, pct, plot_axes

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes

__all__ = ["ActivityDisplay", "plot_activity"]


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
        check_matplotlib(f"{type(self).__name__}.plot")
        ax = plot_axes(self, ax)
        D = int(self.n_weights)
        (line,) = ax.plot(self.ranks, self.kappa, lw=1.6, label=f"d = {self.d}")
        self.top_marker_ = None
        if self.top_rank is not None:
            k, share = int(self.top_rank), float(self.top_share)
            what = f"top {pct(self.top_fraction)}" if self.top_fraction is not None else "top"
            (self.top_marker_,) = ax.plot([k], [share], marker="o", ls="none", color=line.get_color(),
                                          label=f"{what} ({k:,} weights): {share:.1%}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"number of most active weights i (of D = {D:,})")
        ax.set_ylabel("cumulative activity share κ_i")
        grid_and_legend(ax, legend_loc="lower right", grid_which="both")
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
        check_matplotlib(caller)
        post, d, _ = estimator_posterior(estimator, d, caller, cls.__name__)
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
        check_matplotlib(caller)
        post, d, _ = bare_posterior(posterior, d, caller)
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
