"""What the Displays share: matplotlib on demand, where to draw, the finish of a panel, and the checks of
what a Display is built from (fitted estimators, posteriors, d, a single level)."""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .._checks import check_confidence_levels
from ..laplace import LaplaceSubspace
from ..posterior import ActiveSubspacePosterior

__all__ = [
    "INSTALL_HINT",
    "TARGET_GID",
    "bare_posterior",
    "check_d",
    "check_fitted_estimator",
    "check_matplotlib",
    "estimator_posterior",
    "grid_and_legend",
    "integer_locator",
    "pct",
    "plot_axes",
    "single_level",
]

INSTALL_HINT = "pip install glas-sklearn[plot]"
# The gid of CoverageDisplay's target line: later curves on the same Axes share it.
TARGET_GID = "glas-calibration-target"


def check_matplotlib(caller: str) -> None:
    """Raise an ImportError that says how to install matplotlib when it is missing.

    The contract of scikit-learn's ``check_matplotlib_support`` (call it before any computation), which
    scikit-learn 1.9 keeps in a private module; the message names this package's extra.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(f"{caller} needs matplotlib, which is not installed; install it with `{INSTALL_HINT}` "
                          "(or `pip install matplotlib`).") from err


def plot_axes(display, ax, n_panels: int = 1):
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


def grid_and_legend(ax, *, legend_loc: str = "best", grid_which: str = "major") -> None:
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


def integer_locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def pct(level: float) -> str:
    """0.9 → '90 %', 0.9545 → '95.45 %', 0.000989 → '0.0989 %'."""
    return f"{100 * level:.3g} %" if level < 0.01 else f"{100 * level:.4g} %"


def check_fitted_estimator(est, attribute: str, caller: str, also: str) -> None:
    if not isinstance(est, BaseEstimator):
        raise TypeError(f"{caller} expects a fitted LaplaceActiveSubspaceRegressor or LaplaceActiveSubspaceClassifier"
                        f" ({also}), got {type(est).__name__}.")
    check_is_fitted(est, attribute)


def estimator_posterior(est, d, caller: str, display: str) -> tuple[ActiveSubspacePosterior, int, bool]:
    """(posterior, d, d_is_chosen) of a fitted estimator: d defaults to its n_components_."""
    check_fitted_estimator(est, "posterior_", caller, f"for an ActiveSubspacePosterior use {display}.from_posterior")
    default = int(est.n_components_)
    d = check_d(est.posterior_, default if d is None else d, caller)
    return est.posterior_, d, d == default


def bare_posterior(posterior, d, caller: str) -> tuple[ActiveSubspacePosterior, int, bool]:
    """(posterior, d, False) of an ActiveSubspacePosterior or LaplaceSubspace: d defaults to K."""
    if isinstance(posterior, LaplaceSubspace):
        posterior = posterior.posterior
    if not isinstance(posterior, ActiveSubspacePosterior):
        raise TypeError(f"{caller} expects an ActiveSubspacePosterior or a LaplaceSubspace (for a fitted estimator "
                        f"use from_estimator), got {type(posterior).__name__}.")
    return posterior, check_d(posterior, posterior.max_components if d is None else d, caller), False


def check_d(post: ActiveSubspacePosterior, d, caller: str) -> int:
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not 1 <= d <= post.max_components:
        raise ValueError(f"{caller}: d must be an integer between 1 and K = {post.max_components} (the number of "
                         f"eigenpairs computed), got {d!r}.")
    return int(d)


def single_level(confidence_level, default) -> float:
    """The level to draw: a given one (a single number), else the estimator's first (its calibration target)."""
    if confidence_level is None:
        return float(check_confidence_levels(default)[0])
    levels = check_confidence_levels(confidence_level)
    if levels.size != 1:
        raise ValueError(f"confidence_level must be a single number in (0, 1) for a plot, got {confidence_level!r}.")
    return float(levels[0])
