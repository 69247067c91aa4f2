"""What every posterior kind shares: the eigenpairs, β, σ0 and its empirical Bayes, the spectra, z draws, sampling.

θ = θ0 + δ with δ drawn from a Gaussian whose covariance is built from the leading eigenpairs (λ_j, p_j) of the
generalized Gauss–Newton matrix: σ_j² = 1 / (β λ_j + σ0⁻²) in span(P_d) (paper eq. 22, 43), and, depending on
the kind, variance off span(P_d). The posterior turns into predictions in two ways: samples pushed through the
real, non-linear network (eq. 43–44) and the linearised network's output variances (eq. 45–46). The user's model
is never written into: perturbed weights only ever enter ``torch.func.functional_call``.
"""

from __future__ import annotations

import abc
import logging
import math
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from .._checks import check_finite_tensor, check_positive_float
from .._functional import FunctionalModel
from ..eigen import roundoff_tolerance
from ._prior import LogAlphaCondition, solve_log_alpha, subspace_condition, weight_norms
from ._sampling import PosteriorSampling

__all__ = ["ActiveSubspacePosterior", "check_eigenpairs", "check_sigma0"]

logger = logging.getLogger(__name__)

_SIGMA0_FITS = ("auto", "eb_subspace", "eb_full")


def check_eigenpairs(eigenvalues, eigenvectors, n_weights: int, dtype: torch.dtype,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(λ, P) checked (finite, orthonormal P of shape (D, K), λ ≥ 0 up to round-off), sorted into descending
    order if they are not, in ``dtype`` on ``device``.

    Round-off is :func:`~glas_sklearn.eigen.roundoff_tolerance` of the largest |λ| on D weights in the least
    precise of the eigenpairs' dtypes and ``dtype`` (the products'); eigenvalues within it below 0 are set to 0, any
    lower is refused."""
    for name, t in (("eigenvalues", eigenvalues), ("eigenvectors", eigenvectors)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; convert with torch.as_tensor.")
        check_finite_tensor(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}.")
    D = n_weights
    if eigenvalues.ndim != 1:
        raise ValueError(f"eigenvalues must have shape (K,), got {tuple(eigenvalues.shape)}.")
    K = eigenvalues.shape[0]
    if eigenvectors.ndim != 2 or eigenvectors.shape != (D, K):
        raise ValueError(
            f"eigenvectors must have shape (D, K) = ({D}, {K}) (one column per eigenvalue, D = number "
            f"of trainable weights), got {tuple(eigenvectors.shape)}."
        )
    tol = 10 * math.sqrt(torch.finfo(eigenvectors.dtype).eps)
    lam = eigenvalues.detach().to(device, torch.float64)
    P = eigenvectors.detach().to(device, dtype)
    gram_err = float((P.T @ P - torch.eye(K, dtype=P.dtype, device=P.device)).abs().max())
    if gram_err > tol:
        raise ValueError(
            f"eigenvectors are not orthonormal: max |PᵀP − I| = {gram_err:.2e} (tolerance {tol:.1e}); "
            "pass the orthonormal eigenvectors of the GGN (e.g. from glas_sklearn.eigen)."
        )
    scale = float(lam.abs().max()) if K else 0.0
    products = max((eigenvalues.dtype, eigenvectors.dtype, dtype), key=lambda dt: torch.finfo(dt).eps)
    tolerance = roundoff_tolerance(scale, D, products)
    if K and float(lam.min()) < -tolerance:
        raise ValueError(
            f"eigenvalues must be >= 0 up to round-off (the GGN is positive semi-definite), got a minimum of "
            f"{float(lam.min()):.3e} against a largest magnitude of {scale:.3e}, beyond the round-off tolerance "
            f"{tolerance:.1e} of products in {products} on "
            f"D={D} weights. The operator is not positive semi-definite: pass eigenpairs of a GGN or Fisher (not of "
            "a Hessian), from glas_sklearn.eigen on a glas_sklearn.ggn operator; with float16/bfloat16 weights, "
            "compute the curvature on a float32 copy of the model."
        )
    lam = lam.clamp_min(0.0)
    if bool((lam[1:] > lam[:-1]).any()):
        order = torch.argsort(lam, descending=True, stable=True)
        lam, P = lam[order], P[:, order]
        logger.debug("eigenpairs sorted into descending order")
    return lam.to(dtype), P


def check_sigma0(sigma0) -> str | float:
    """A σ0 setting: one of "auto", "eb_subspace", "eb_full", or a float ≥ 0."""
    if isinstance(sigma0, str):
        if sigma0 not in _SIGMA0_FITS:
            raise ValueError(f"sigma0 must be one of {list(_SIGMA0_FITS)} or a float >= 0, got {sigma0!r}.")
        return sigma0
    return check_positive_float("sigma0", sigma0, allow_zero=True)


class ActiveSubspacePosterior(PosteriorSampling, abc.ABC):
    """Generalized Laplace posterior on the leading G eigenvectors: the base of every posterior kind.

    ``ActiveSubspacePosterior(...)`` itself builds the kind named by ``posterior`` (see
    :func:`~glas_sklearn.posterior.resolve_posterior`); each kind is a subclass, and may be built directly.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network f(x; θ0). Its trainable weights are copied (θ0); it is evaluated in eval
        mode through ``torch.func.functional_call`` and never modified.
    eigenvalues : torch.Tensor of shape (K,)
        λ_1 ≥ … ≥ λ_K ≥ 0 of the GGN (sorted into descending order, with the eigenvectors, if they are not).
        Negative values within round-off of 0 are set to 0.
    eigenvectors : torch.Tensor of shape (D, K)
        Orthonormal eigenvectors p_j as columns. Both tensors are moved to the model's device and dtype.
    beta : float
        The posterior scaling β (see :meth:`~glas_sklearn.likelihoods.Likelihood.beta`).
    sigma0 : {"auto", "eb_subspace", "eb_full"} or float, default="auto"
        The prior standard deviation σ0, fitted separately for every subspace dimension d (:meth:`fit_sigma0`):
        "eb_subspace" by the paper's empirical Bayes in the subspace (eq. 39–41), "eb_full" by the full-space
        condition tr Σ = ‖θ0‖² over all D weights (beyond the paper, see the user guide); "auto" is the kind's
        ``default_sigma0``. A float (≥ 0; 0: no weight variance, the trained network's predictive) is used for
        every d; :meth:`set_sigma0` changes the setting after construction.
    posterior : {"subspace", "low_rank", "low_rank_diag"} or ActiveSubspacePosterior subclass, optional
        The kind (default "subspace", the paper's θ0 + P z; see :class:`~glas_sklearn.posterior.LowRankPosterior`
        and :class:`~glas_sklearn.posterior.LowRankDiagPosterior`); a kind's own constructor accepts only its own.
    ggn_diagonal : torch.Tensor of shape (D,), optional
        diag(G), in G's units (e.g. :meth:`~glas_sklearn.ggn.GGNOperator.diagonal`); required by, and only
        accepted by, the kinds with ``needs_ggn_diagonal`` ("low_rank_diag").

    Attributes
    ----------
    functional_model : FunctionalModel
        The model bound as a function of its weights (eval view, θ0, input checks).
    theta0 : torch.Tensor of shape (D,)
        The trained weights (a detached copy).
    layout : ParameterLayout
        Names and shapes of the weights in the flat vector.
    dtype, device
        Those of the weights; tensors are returned in them.
    n_weights : int
        D.
    max_components : int
        K, the largest subspace dimension d available.
    posterior : str
        The kind's ``name``.

    Notes
    -----
    A kind sets ``name``, ``default_sigma0``, ``default_predictive``, ``off_subspace`` and ``needs_ggn_diagonal``
    and implements the hooks ``_perturbations_from_draws``, ``_trace_condition`` and ``_output_covariance``
    (documented where they are declared). Everything else is shared.

    Methods taking ``d`` use the leading d eigenpairs, 1 ≤ d ≤ K. Computations that only involve the
    K scalars (σ0, σ_j², c_j) are done in float64; tensors are returned in the model's dtype and device.

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.posterior import ActiveSubspacePosterior
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).double()
    >>> P, _ = torch.linalg.qr(torch.randn(13, 2, dtype=torch.float64))
    >>> post = ActiveSubspacePosterior(net, torch.tensor([2.0, 0.5], dtype=torch.float64), P, beta=10.0)
    >>> type(post).__name__, post.posterior, post.variances(2).shape
    ('SubspacePosterior', 'subspace', torch.Size([2]))
    >>> post.predict_samples(torch.zeros(5, 2, dtype=torch.float64), 2, n_samples=7, random_state=0).shape
    torch.Size([7, 5, 1])
    """

    name: ClassVar[str]
    off_subspace: ClassVar[bool] = False
    needs_ggn_diagonal: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__  # a user's kind is named by its class unless it sets a name

    def __new__(cls, *args, posterior=None, **kwargs):
        if cls is ActiveSubspacePosterior:
            from . import resolve_posterior  # the package's one place where a kind's name becomes its class

            cls = resolve_posterior("subspace" if posterior is None else posterior)
        return super().__new__(cls)

    def __init__(self, model: nn.Module, eigenvalues: torch.Tensor, eigenvectors: torch.Tensor, *,
                 beta: float, sigma0: str | float = "auto", posterior: str | type | None = None,
                 ggn_diagonal: torch.Tensor | None = None) -> None:
        if posterior is not None:
            from . import resolve_posterior

            if resolve_posterior(posterior) is not type(self):
                raise ValueError(f"posterior={posterior!r} names another kind than {type(self).__name__}; leave it "
                                 "out, or build ActiveSubspacePosterior(..., posterior=...) to choose the kind.")
        fm = FunctionalModel(model)
        lam, P = check_eigenpairs(eigenvalues, eigenvectors, fm.layout.size, fm.dtype, fm.device)
        self._init_evaluation(fm, P)
        self.eigenvalues = lam
        self.beta = check_positive_float("beta", beta)
        self.sigma0 = check_sigma0(sigma0)

        self._lam64 = lam.detach().to("cpu", torch.float64).numpy()  # float64 copies for the empirical Bayes solve
        self._w0_sq_cumsum, self._w0_floor, self._theta_sq = weight_norms(self.theta0, P)
        self._sigma0_cache: dict[int, float] = {}
        self._set_ggn_diagonal(ggn_diagonal)

    # ---------------------------------------------------------- the kind's hooks
    @property
    @abc.abstractmethod
    def default_sigma0(self) -> str:
        """What ``sigma0="auto"`` means for this kind: "eb_subspace" or "eb_full"."""

    @property
    @abc.abstractmethod
    def default_predictive(self) -> str:
        """The predictive the estimators use for ``predictive="auto"``: "sampled" or "linearized"."""

    @abc.abstractmethod
    def _perturbations_from_draws(self, z: torch.Tensor, eps: torch.Tensor | None) -> torch.Tensor:
        """θ − θ0 of shape (c, D) for z ~ N(0, diag σ_j²) of shape (c, d) and, when ``off_subspace``, standard
        normals ``eps`` of shape (c, D) (None otherwise)."""

    @abc.abstractmethod
    def _trace_condition(self, d: int) -> LogAlphaCondition:
        """The full-space empirical Bayes condition tr Σ(α) = ‖θ0‖² of this kind at d (``sigma0="eb_full"``)."""

    @abc.abstractmethod
    def _output_covariance(self, X: torch.Tensor, jp: torch.Tensor, d: int, full_cov: bool,
                           batch_size: int | None) -> torch.Tensor:
        """J Σ Jᵀ of the linearised network (see :meth:`linearized_variance`), from jp = J P_d ``(n, *out, d)``."""

    def _set_ggn_diagonal(self, ggn_diagonal) -> None:
        """Take diag(G) (kinds with ``needs_ggn_diagonal``); the others refuse it."""
        if ggn_diagonal is not None:
            raise ValueError(f"ggn_diagonal is used only by posterior='low_rank_diag', got posterior="
                             f"{self.posterior!r}; leave it out or choose posterior='low_rank_diag'.")

    def _sigma0_changed(self) -> None:
        """Drop what the kind caches for the previous σ0 (called by :meth:`set_sigma0`)."""

    # ------------------------------------------------------------- properties
    @property
    def posterior(self) -> str:
        """The kind's name ("subspace", "low_rank", "low_rank_diag", or a user kind's)."""
        return self.name

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_local", None)  # per-thread caches of the last inputs and their J P: not pickled
        state.pop("_jp_cache", None)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        kind = state.pop("posterior", None)  # pickled when the kinds were one class with a `posterior` string
        if kind is not None:
            from . import resolve_posterior

            self.__class__ = resolve_posterior(kind)
        state.setdefault("_vmap_jac_ok", None)
        state.pop("_jp_cache", None)  # pickled by earlier versions
        self.__dict__.update(state)
        self._init_thread_caches()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(D={self.n_weights}, K={self.max_components}, beta={self.beta:.4g}, "
                f"sigma0={self.sigma0!r}, posterior={self.posterior!r}, dtype={self.dtype}, device={self.device})")

    # ------------------------------------------------------ σ0 and the spectra
    def set_sigma0(self, sigma0: str | float) -> ActiveSubspacePosterior:
        """Set the prior standard deviation after construction: a fit method or a fixed value for every d.

        The empirical Bayes values cached per d and the kind's σ0-dependent factors are dropped; the Jacobian
        quantities cached for the last inputs (J P, J Jᵀ) do not depend on σ0 and are kept, so that evaluating
        the linearised predictive of the same rows at many σ0 costs no new JVPs.

        Parameters
        ----------
        sigma0 : {"auto", "eb_subspace", "eb_full"} or float
            As in the constructor; a fixed value may also be 0: zero weight variance, every predictive is then
            the trained network's own (f(x; θ0), the MAP probabilities).

        Returns
        -------
        self
        """
        self.sigma0 = check_sigma0(sigma0)
        self._sigma0_cache = {}
        self._sigma0_changed()
        return self

    @property
    def sigma0_method(self) -> str | None:
        """How σ0 is set: "eb_subspace", "eb_full", or None when it was given as a number."""
        if not isinstance(self.sigma0, str):
            return None
        return self.default_sigma0 if self.sigma0 == "auto" else self.sigma0

    def fit_sigma0(self, d: int) -> float:
        """Prior standard deviation σ0 for the leading d directions by empirical Bayes (cached per d).

        "eb_subspace" (the paper, eq. 39–41) solves ‖w0‖² = Σ_{i≤d} (1/α − 1/(βλ_i + α)) for α = σ0⁻²,
        w0 = P_dᵀ θ0 (:func:`~glas_sklearn.posterior.subspace_condition`); "eb_full" the kind's full-space
        condition tr Σ(α) = ‖θ0‖² (its ``_trace_condition``). Both are solved by Brent's method in log α to a
        relative tolerance of 1e-12. Returns the fixed σ0 when one was given.
        """
        d = self._check_d(d)
        if not isinstance(self.sigma0, str):
            return self.sigma0
        if d in self._sigma0_cache:
            return self._sigma0_cache[d]
        if self.sigma0_method == "eb_full":
            condition = self._trace_condition(d)
        else:
            condition = subspace_condition(self.beta * self._lam64[:d], float(self._w0_sq_cumsum[d - 1]),
                                           self._w0_floor, d)
        sigma0 = self._sigma0_cache[d] = solve_log_alpha(condition, d)
        return sigma0

    def _alpha(self, d: int) -> float:
        """α = σ0⁻² at d (+inf for σ0 = 0: no weight variance)."""
        sigma0 = self.fit_sigma0(d)
        return math.inf if sigma0 == 0 else sigma0**-2

    def _variances64(self, d: int) -> np.ndarray:
        alpha = self._alpha(d)
        return 1.0 / (self.beta * self._lam64[:d] + alpha)

    def variances(self, d: int) -> torch.Tensor:
        """Posterior variances σ_j² = 1 / (βλ_j + σ0⁻²), j ≤ d, with σ0 = ``fit_sigma0(d)`` (eq. 22); shape (d,)."""
        return torch.as_tensor(self._variances64(self._check_d(d)), dtype=self.dtype, device=self.device)

    def contraction(self, d: int) -> torch.Tensor:
        """Contraction ratios c_j = βλ_j / (βλ_j + σ0⁻²) (eq. 10): ≈1 data-informed, ≈0 prior-dominated; shape (d,)."""
        d = self._check_d(d)
        blam = self.beta * self._lam64[:d]
        c = blam / (blam + self._alpha(d))
        return torch.as_tensor(c, dtype=self.dtype, device=self.device)

    def activity_scores(self, d: int) -> torch.Tensor:
        """Activity scores ν_i = Σ_{j≤d} λ_j p_{j,i}² of every weight (eq. 8); shape (D,)."""
        d = self._check_d(d)
        return (self.eigenvectors[:, :d] ** 2) @ self.eigenvalues[:d]

    def cumulative_activity(self, d: int) -> torch.Tensor:
        """Sorted cumulative activity share κ_i (eq. 9): scores sorted descending, cumulated, divided by
        their total; shape (D,), rising to 1."""
        nu = self.activity_scores(d).to(torch.float64)
        total = nu.sum()
        if not total > 0:
            raise ValueError(f"All of the leading {d} eigenvalues are 0, so the activity shares are undefined.")
        kappa = torch.cumsum(torch.sort(nu, descending=True).values, 0) / total
        return kappa.clamp_max(1.0).to(self.dtype)

    def residual_diagonal(self, d: int) -> torch.Tensor:
        """G's diagonal beyond the leading d eigenpairs (the kinds that hold diag(G) only)."""
        self._check_d(d)
        raise ValueError(f"residual_diagonal needs the GGN diagonal, held by posterior='low_rank_diag' only "
                         f"(this posterior is {self.posterior!r}).")

    # ------------------------------------------------------------- linearised
    def linearized_variance(self, X: torch.Tensor, d: int, full_cov: bool = False,
                            batch_size: int | None = None) -> torch.Tensor:
        """Output variance of the linearised network, J Σ Jᵀ with the kind's Σ (eq. 45–46 for the subspace
        kind, Σ = P diag(σ_j²) Pᵀ), from the cached Jacobian projections J P (:meth:`jacobian_projections`) and,
        for the kinds with variance off span(P), J Jᵀ (:meth:`jacobian_gram`).

        Parameters
        ----------
        X : torch.Tensor of shape (n, ...)
        d : int
        full_cov : bool, default=False
            False: the variances σ_f², shape ``(n, *out)`` (e.g. (n, M)).
            True: the covariance over the last output axis, shape ``(n, *out[:-1], M, M)`` (e.g. (n, M, M)).
        batch_size : int, optional
            Input rows per JVP.

        Returns
        -------
        torch.Tensor
        """
        X = self._check_X(X)
        d = self._check_d(d)
        jp = self._jacobian_projections(X, d, batch_size)
        if full_cov and jp.ndim < 3:
            raise ValueError("full_cov=True needs an output axis: the model returns one scalar per record.")
        return self._output_covariance(X, jp, d, full_cov, batch_size)
