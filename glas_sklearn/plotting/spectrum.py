"""SpectrumDisplay, plot_spectrum: eigenvalues, posterior variances and contraction ratios (paper Fig. 13)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..laplace import LaplaceSubspace
from ..posterior import ActiveSubspacePosterior
from ._axes import bare_posterior, check_matplotlib, estimator_posterior, grid_and_legend, integer_locator, plot_axes

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes

__all__ = ["SpectrumDisplay", "plot_spectrum"]


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
        check_matplotlib(f"{type(self).__name__}.plot")
        axes = plot_axes(self, ax, 3)
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
            a.xaxis.set_major_locator(integer_locator())
            grid_and_legend(a)
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
        check_matplotlib(caller)
        return cls._from(*estimator_posterior(estimator, d, caller, cls.__name__), ax)

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
        check_matplotlib(caller)
        return cls._from(*bare_posterior(posterior, d, caller), ax)


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
