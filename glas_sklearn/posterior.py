"""The low-rank generalized Laplace posterior in the active subspace (paper eqs. 4–5 and 43).

θ = θ0 + P z, z ~ N(0, diag(σ_j²)), σ_j² = 1 / (β λ_j + σ0⁻²) (paper eq. 22, 43), with (λ_j, p_j) the leading
eigenpairs of the generalized Gauss–Newton matrix and σ0 fitted by empirical Bayes in the subspace (eq. 39–41).
The posterior turns into predictions in two ways: samples pushed through the real, non-linear network
(eq. 43–44) and the linearised network's output variances (eq. 45–46). The user's model is never written
into: perturbed weights only ever enter ``torch.func.functional_call``.
"""

from __future__ import annotations

import logging
import math
import numbers

import numpy as np
import torch
from scipy.optimize import brentq
from torch import nn
from torch.func import jvp, vmap

from ._checks import (
    check_choice,
    check_finite_tensor,
    check_positive_float,
    check_positive_int,
    make_generator,
    numpy_rng,
)
from ._functional import BoundModel, FunctionalModel

__all__ = ["ActiveSubspacePosterior", "beta_for", "estimate_noise_variance"]

logger = logging.getLogger(__name__)

_TASKS = ("regression", "classification")
_SCALINGS = ("mean", "standard")
_POSTERIORS = ("subspace", "low_rank", "low_rank_diag")
_LOW_RANK = ("low_rank", "low_rank_diag")
_SIGMA0_FITS = ("auto", "eb_subspace", "eb_full")
# Memory bounds for batched evaluation: weight rows (chunk × D) per chunk, and (chunk × input rows)
# network evaluations per vectorised call.
_WEIGHT_CHUNK_BYTES = 128 * 2**20
_MAX_BATCHED_ROWS = 2**16
# One step of the empirical Bayes bracket search, in log α.
_DECADE = math.log(10.0)
# Weights per block when θ0 + P z is formed single-threaded (see ActiveSubspacePosterior._form_weights).
_FORM_BLOCK = 2**14


# ----------------------------------------------------------------------------- scaling


def beta_for(scaling, n_records: int, noise_var: float | None = None, task: str = "regression") -> float:
    """The posterior scaling β of the generalized posterior (paper eq. 1, §4.1.1).

    Parameters
    ----------
    scaling : {"mean", "standard"} or float
        "mean" (the paper's proposal): β = 1/σ² for regression, 1 for classification.
        "standard" (Bayes, summed loss): β = N/σ², respectively N. A positive float is returned as it is.
    n_records : int
        N, the number of training records the mean loss averages over.
    noise_var : float, optional
        σ², the observation-noise variance; required for regression with a named scaling,
        ignored for classification.
    task : {"regression", "classification"}, default="regression"

    Returns
    -------
    float
        β > 0.

    Examples
    --------
    >>> beta_for("mean", 100, noise_var=0.01)
    100.0
    >>> beta_for("standard", 100, task="classification")
    100.0
    """
    check_choice("task", task, _TASKS)
    n_records = check_positive_int("n_records", n_records)
    if isinstance(scaling, numbers.Real) and not isinstance(scaling, bool):
        return check_positive_float("scaling (a float is used as β directly)", scaling)
    if not isinstance(scaling, str) or scaling not in _SCALINGS:
        raise ValueError(
            f"scaling must be 'mean', 'standard' or a positive float (β itself), got {scaling!r}."
        )
    factor = float(n_records) if scaling == "standard" else 1.0
    if task == "classification":
        return factor
    if noise_var is None:
        raise ValueError(
            "noise_var (σ², the observation-noise variance) is required for regression with "
            f"scaling={scaling!r}; estimate it from training residuals with estimate_noise_variance()."
        )
    noise_var = check_positive_float("noise_var", noise_var)
    return factor / noise_var


def estimate_noise_variance(residuals) -> float:
    """σ² = mean of the squared residuals over all N·M entries (paper §2.3).

    Parameters
    ----------
    residuals : torch.Tensor or array-like
        y − f(x; θ0) on the training data, any shape (n,), (n, M), ...

    Returns
    -------
    float
        The estimated observation-noise variance σ² (computed in float64).

    Examples
    --------
    >>> estimate_noise_variance([[0.5, -0.5], [1.5, -1.5]])
    1.25
    """
    if isinstance(residuals, torch.Tensor):
        res = residuals.detach().to("cpu", torch.float64).numpy()
    else:
        res = np.asarray(residuals, dtype=np.float64)
    if res.size == 0:
        raise ValueError("residuals is empty; at least one residual is needed to estimate the noise variance.")
    if not np.all(np.isfinite(res)):
        raise ValueError("residuals contains NaN or infinite values; clean the predictions or targets first.")
    return float(np.mean(res**2))


# ------------------------------------------------------------------------- posterior


class ActiveSubspacePosterior(BoundModel):
    """Low-rank generalized Laplace posterior θ = θ0 + P z in the span of the leading G eigenvectors.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network f(x; θ0). Its trainable weights are copied (θ0); it is evaluated in eval
        mode through ``torch.func.functional_call`` and never modified.
    eigenvalues : torch.Tensor of shape (K,)
        λ_1 ≥ … ≥ λ_K ≥ 0 of the GGN (they are sorted into descending order, together with the
        eigenvectors, if they are not). Negative values within round-off of 0 are set to 0.
    eigenvectors : torch.Tensor of shape (D, K)
        Orthonormal eigenvectors p_j as columns. Both tensors are moved to the model's device and dtype.
    beta : float
        The posterior scaling β (see :func:`beta_for`).
    sigma0 : {"auto", "eb_subspace", "eb_full"} or float, default="auto"
        The prior standard deviation σ0, fitted separately for every subspace dimension d
        (:meth:`fit_sigma0`): "eb_subspace" by the paper's empirical Bayes in the subspace (eq. 39–41),
        "eb_full" by the full-space condition over all D weights (beyond the paper, see the user guide); "auto" is
        "eb_subspace" for ``posterior="subspace"`` and "eb_full" for the two low-rank posteriors.
        A float (≥ 0; 0: no weight variance, the trained network's predictive) is used for every d;
        :meth:`set_sigma0` changes the setting after construction.
    posterior : {"subspace", "low_rank", "low_rank_diag"}, default="subspace"
        "subspace" (the paper): θ = θ0 + P z, no variance off span(P). "low_rank": the Laplace
        posterior of the precision β P Λ Pᵀ + σ0⁻² I, Σ = P diag(σ_j²) Pᵀ + σ0² (I − P Pᵀ): the prior keeps
        its variance σ0² in the D − d directions the leading curvature does not constrain. "low_rank_diag":
        the Laplace posterior of the precision β (P Λ Pᵀ + diag(r)) + σ0⁻² I, with r = max(diag(G) − Σ_{j≤d}
        λ_j p_j ∘ p_j, 0) the part of G's diagonal the leading eigenpairs leave out (needs ``ggn_diagonal``):
        the curvature beyond the top d constrains every weight by its own diagonal.
    ggn_diagonal : torch.Tensor of shape (D,), optional
        diag(G), in G's units (e.g. :meth:`~glas_sklearn.ggn.GGNOperator.diagonal`); required for, and only
        used by, ``posterior="low_rank_diag"``. Negative values within round-off of 0 are set to 0.

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

    Notes
    -----
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
    >>> post.variances(2).shape
    torch.Size([2])
    >>> post.predict_samples(torch.zeros(5, 2, dtype=torch.float64), 2, n_samples=7, random_state=0).shape
    torch.Size([7, 5, 1])
    """

    def __init__(self, model: nn.Module, eigenvalues: torch.Tensor, eigenvectors: torch.Tensor, *,
                 beta: float, sigma0: str | float = "auto", posterior: str = "subspace",
                 ggn_diagonal: torch.Tensor | None = None) -> None:
        self.functional_model = FunctionalModel(model)

        lam, P = self._check_eigenpairs(eigenvalues, eigenvectors)
        self.eigenvalues = lam
        self.eigenvectors = P
        self.beta = check_positive_float("beta", beta)
        self.posterior = check_choice("posterior", posterior, _POSTERIORS)
        self.sigma0 = self._check_sigma0(sigma0)

        # float64 copies of the K scalars for the empirical Bayes solve.
        self._lam64 = lam.detach().to("cpu", torch.float64).numpy()
        # w0 = Pᵀθ0 in float64 (column by column, to bound memory): its round-off floor decides "‖w0‖ = 0".
        theta64 = self.theta0.to(torch.float64)
        w0 = np.array([float(P[:, j].to(torch.float64) @ theta64) for j in range(P.shape[1])])
        self._w0_sq_cumsum = np.cumsum(w0**2)
        self._w0_floor = (10 * math.sqrt(self.layout.size) * np.finfo(np.float64).eps * float(theta64.norm())) ** 2
        self._theta_sq = float(theta64 @ theta64)
        self._sigma0_cache: dict[int, float] = {}
        self._vmap_forward_ok: bool | None = None
        self._vmap_jvp_ok: bool | None = None
        self._vmap_jac_ok: bool | None = None
        self._jp_cache: dict | None = None
        self._ggn_diag = self._check_ggn_diagonal(ggn_diagonal)
        self._diag_factors_cache: dict | None = None

    # ------------------------------------------------------------------ checks
    def _check_eigenpairs(self, eigenvalues, eigenvectors) -> tuple[torch.Tensor, torch.Tensor]:
        for name, t in (("eigenvalues", eigenvalues), ("eigenvectors", eigenvectors)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; convert with torch.as_tensor.")
            check_finite_tensor(name, t)
            if not t.is_floating_point():
                raise TypeError(f"{name} must be floating point, got {t.dtype}.")
        D = self.layout.size
        if eigenvalues.ndim != 1:
            raise ValueError(f"eigenvalues must have shape (K,), got {tuple(eigenvalues.shape)}.")
        K = eigenvalues.shape[0]
        if eigenvectors.ndim != 2 or eigenvectors.shape != (D, K):
            raise ValueError(
                f"eigenvectors must have shape (D, K) = ({D}, {K}) (one column per eigenvalue, D = number "
                f"of trainable weights), got {tuple(eigenvectors.shape)}."
            )
        tol = 10 * math.sqrt(torch.finfo(eigenvectors.dtype).eps)
        lam = eigenvalues.detach().to(self.device, torch.float64)
        P = eigenvectors.detach().to(self.device, self.dtype)
        gram_err = float((P.T @ P - torch.eye(K, dtype=P.dtype, device=P.device)).abs().max())
        if gram_err > tol:
            raise ValueError(
                f"eigenvectors are not orthonormal: max |PᵀP − I| = {gram_err:.2e} (tolerance {tol:.1e}); "
                "pass the orthonormal eigenvectors of the GGN (e.g. from glas_sklearn.eigen)."
            )
        scale = float(lam.abs().max())
        tiny = math.sqrt(torch.finfo(eigenvalues.dtype).eps) * scale
        if bool((lam < -tiny).any()):
            raise ValueError(
                f"eigenvalues must be >= 0 (the GGN is positive semi-definite), got a minimum of "
                f"{float(lam.min()):.3e} against a largest magnitude of {scale:.3e}; the eigensolver did not converge."
            )
        lam = lam.clamp_min(0.0)
        if bool((lam[1:] > lam[:-1]).any()):
            order = torch.argsort(lam, descending=True, stable=True)
            lam, P = lam[order], P[:, order]
            logger.debug("eigenpairs sorted into descending order")
        return lam.to(self.dtype), P

    def _check_ggn_diagonal(self, ggn_diagonal) -> torch.Tensor | None:
        if self.posterior != "low_rank_diag":
            if ggn_diagonal is not None:
                raise ValueError(f"ggn_diagonal is used only by posterior='low_rank_diag', got posterior="
                                 f"{self.posterior!r}; leave it out or choose posterior='low_rank_diag'.")
            return None
        if ggn_diagonal is None:
            raise ValueError("posterior='low_rank_diag' needs ggn_diagonal, the diagonal of the GGN (D values, e.g. "
                             "GGNOperator.diagonal(), or fit_laplace_subspace(..., posterior='low_rank_diag')).")
        if not isinstance(ggn_diagonal, torch.Tensor):
            raise TypeError(f"ggn_diagonal must be a torch.Tensor, got {type(ggn_diagonal).__name__}.")
        check_finite_tensor("ggn_diagonal", ggn_diagonal)
        D = self.layout.size
        if tuple(ggn_diagonal.shape) != (D,):
            raise ValueError(f"ggn_diagonal must have shape (D,) = ({D},), one value per trainable weight, got "
                             f"{tuple(ggn_diagonal.shape)}.")
        diag = ggn_diagonal.detach().to(self.device, torch.float64)
        tiny = math.sqrt(torch.finfo(ggn_diagonal.dtype).eps) * max(float(diag.abs().max()), float(self.eigenvalues[0]))
        if bool((diag < -tiny).any()):
            raise ValueError(f"ggn_diagonal must be >= 0 (the diagonal of a positive semi-definite G), got a minimum "
                             f"of {float(diag.min()):.3e}.")
        return diag.clamp_min(0.0)

    @staticmethod
    def _check_sigma0(sigma0) -> str | float:
        if isinstance(sigma0, str):
            if sigma0 not in _SIGMA0_FITS:
                raise ValueError(f"sigma0 must be one of {list(_SIGMA0_FITS)} or a float >= 0, got {sigma0!r}.")
            return sigma0
        return check_positive_float("sigma0", sigma0, allow_zero=True)

    def set_sigma0(self, sigma0: str | float) -> ActiveSubspacePosterior:
        """Set the prior standard deviation after construction: a fit method or a fixed value for every d.

        The empirical Bayes values cached per d and the σ0-dependent factors of ``posterior="low_rank_diag"``
        are dropped; the Jacobian quantities cached for the last inputs (J P, J Jᵀ) do not depend on σ0 and
        are kept, so that evaluating the linearised predictive of the same rows at many σ0 costs no new JVPs.

        Parameters
        ----------
        sigma0 : {"auto", "eb_subspace", "eb_full"} or float
            As in the constructor; a fixed value may also be 0: zero weight variance, every predictive is then
            the trained network's own (f(x; θ0), the MAP probabilities).

        Returns
        -------
        self
        """
        self.sigma0 = self._check_sigma0(sigma0)
        self._sigma0_cache = {}
        if self._diag_factors_cache is not None:
            for key in ("Q", "T", "a_isqrt"):
                self._diag_factors_cache.pop(key, None)
            self._diag_factors_cache["alpha"] = None
        return self

    def _alpha(self, d: int) -> float:
        """α = σ0⁻² at d (+inf for σ0 = 0: no weight variance)."""
        sigma0 = self.fit_sigma0(d)
        return math.inf if sigma0 == 0 else sigma0**-2

    def _check_d(self, d) -> int:
        K = self.max_components
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise ValueError(f"d must be an integer between 1 and K = {K}, got {d!r}.")
        if not 1 <= d <= K:
            raise ValueError(
                f"d must be between 1 and K = {K} (the number of eigenpairs given), got {d}; "
                "compute more eigenpairs to use a larger subspace."
            )
        return int(d)

    def _check_X(self, X) -> torch.Tensor:
        return self.functional_model.check_inputs(X, "X")

    # -------------------------------------------------------------- properties
    @property
    def n_weights(self) -> int:
        return self.layout.size

    @property
    def max_components(self) -> int:
        return int(self.eigenvalues.shape[0])

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_jp_cache"] = None  # holds the last inputs and their J P: not worth pickling
        state["_diag_factors_cache"] = None  # rebuilt from the eigenpairs and the GGN diagonal
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("posterior", "subspace")  # pickled before the low-rank option existed
        state.setdefault("_vmap_jac_ok", None)
        state.setdefault("_ggn_diag", None)
        state.setdefault("_diag_factors_cache", None)
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (f"ActiveSubspacePosterior(D={self.n_weights}, K={self.max_components}, beta={self.beta:.4g}, "
                f"sigma0={self.sigma0!r}, posterior={self.posterior!r}, dtype={self.dtype}, device={self.device})")

    # ------------------------------------------------------------ EB and variances
    def fit_sigma0(self, d: int) -> float:
        """Prior standard deviation σ0 for the leading d directions by empirical Bayes (eq. 39–41).

        With ``sigma0="eb_full"`` (the default of the low-rank posteriors) the condition is over all D
        weights instead, tr Σ(α) = ‖θ0‖² with the posterior's own Σ; for ``posterior="low_rank_diag"`` see
        :meth:`_fit_sigma0_diag`. For ``posterior="low_rank"`` (λ_j = 0 for j > d) that is
        Σ_{j≤d} 1/(βλ_j + α) + (D − d)/α = ‖θ0‖². Its left side falls strictly from +∞ to 0, and lies between
        (D − d)/α and D/α, so the root is bracketed by (D − d)/‖θ0‖² ≤ α ≤ D/‖θ0‖² and found with Brent's
        method in log α. Otherwise (the paper) it solves
        ‖w0‖² = Σ_{i≤d} (1/α − 1/(βλ_i + α)) for α = σ0⁻², w0 = P_dᵀ θ0; the right side falls
        strictly from +∞ to 0, so the root is unique. Bracketed in log α and refined with Brent's method
        to a relative tolerance of 1e-10 in α. Returns the fixed σ0 when one was given.
        """
        d = self._check_d(d)
        if not isinstance(self.sigma0, str):
            return self.sigma0
        if d in self._sigma0_cache:
            return self._sigma0_cache[d]
        if self.sigma0_method == "eb_full":
            return self._fit_sigma0_diag(d) if self.posterior == "low_rank_diag" else self._fit_sigma0_full(d)
        w_sq = float(self._w0_sq_cumsum[d - 1])
        blam = self.beta * self._lam64[:d]
        n_pos = int(np.count_nonzero(blam > 0))
        if n_pos == 0:
            raise ValueError(
                f"All of the leading {d} eigenvalues are 0: the data inform no direction, so empirical Bayes "
                "has no solution; pass a fixed sigma0 or use more eigenpairs."
            )
        if not w_sq > self._w0_floor:
            raise ValueError(
                f"The trained weights have no component in the leading {d} eigenvectors (‖Pᵀθ0‖² = 0), so "
                "empirical Bayes has no solution; pass a fixed sigma0."
            )

        def excess(log_alpha: float) -> float:  # Σ (1/α − 1/(βλ+α)) − ‖w0‖², written without cancellation
            alpha = math.exp(log_alpha)
            return float(np.sum(blam / (alpha * (blam + alpha)))) - w_sq

        # Each term is < 1/α, so the sum is < n_pos/α and the root lies below α = n_pos / ‖w0‖²;
        # start a factor 2 above that (clear of round-off) and step down by decades to bracket it.
        hi = math.log(2.0 * n_pos / w_sq)
        while excess(hi) > 0:  # not expected; kept so a bracket is always found
            hi += _DECADE
        return self._solve_log_alpha(d, excess, None, hi, "empirical Bayes",
                                     RuntimeError(f"Could not bracket the empirical Bayes root for d={d}."))

    def _solve_log_alpha(self, d: int, excess, lo: float | None, hi: float, what: str, no_root: Exception) -> float:
        """σ0 = α^-½ at the root of ``excess`` (strictly decreasing in log α, ≤ 0 at ``hi``), cached for d.

        Without ``lo`` the bracket is found by stepping down from ``hi`` by decades (700 at most, then
        ``no_root`` is raised) to the first log α where ``excess`` is positive; Brent's method then refines
        the root in that decade.
        """
        if lo is None:
            lo = hi
            for _ in range(700):
                lo -= _DECADE
                if excess(lo) > 0:
                    break
            else:
                raise no_root
            hi = lo + _DECADE
        log_alpha = brentq(excess, lo, hi, xtol=1e-12, rtol=1e-12, maxiter=500)
        sigma0 = float(math.exp(-0.5 * log_alpha))
        self._sigma0_cache[d] = sigma0
        logger.debug("%s: d=%d, sigma0=%.6g", what, d, sigma0)
        return sigma0

    @property
    def sigma0_method(self) -> str | None:
        """How σ0 is set: "eb_subspace", "eb_full", or None when it was given as a number."""
        if not isinstance(self.sigma0, str):
            return None
        if self.sigma0 == "auto":
            return "eb_full" if self.posterior in _LOW_RANK else "eb_subspace"
        return self.sigma0

    def _fit_sigma0_full(self, d: int) -> float:
        """Full-space condition Σ_{j≤d} 1/(βλ_j + α) + (D − d)/α = ‖θ0‖² for α = σ0⁻² (see fit_sigma0)."""
        D, t = self.n_weights, self._theta_sq
        if not t > 0:
            raise ValueError("The trained weights are all 0 (‖θ0‖ = 0), so the full-space empirical Bayes "
                             "condition has no solution; pass a fixed sigma0.")
        blam = self.beta * self._lam64[:d]

        def excess(log_alpha: float) -> float:  # tr Σ(α) − ‖θ0‖², strictly decreasing in α
            alpha = math.exp(log_alpha)
            return float(np.sum(1.0 / (blam + alpha))) + (D - d) / alpha - t

        hi = math.log(2.0 * D / t)  # excess ≤ D/α − t = −t/2 there
        # with a complement, excess ≥ (D − d)/α − t = t at lo; without one, Σ 1/(βλ_j + α) = ‖θ0‖² needs
        # Σ 1/(βλ_j) > ‖θ0‖², and the bracket is searched for
        lo = math.log(0.5 * (D - d) / t) if D > d else None
        return self._solve_log_alpha(d, excess, lo, hi, "full-space empirical Bayes", ValueError(
            f"d = D = {D}: Σ 1/(βλ_j + α) stays below ‖θ0‖² for every α, so the full-space empirical Bayes "
            "condition has no solution; pass a fixed sigma0."))

    def _fit_sigma0_diag(self, d: int) -> float:
        """Full-space condition tr Σ(α) = ‖θ0‖² for the low-rank-plus-diagonal posterior, α = σ0⁻².

        Σ(α) = (β (P Λ Pᵀ + diag(r)) + α I)⁻¹, so tr Σ(α) = Σ_k 1/A_k − tr(K⁻¹ WᵀW) (Woodbury, see
        :meth:`_diag_factors`) falls strictly from +∞ (or tr of the pseudo-inverse part) to 0 and is at most D/α:
        the root lies below α = D/‖θ0‖²; it is bracketed by stepping down in decades from 2D/‖θ0‖² and found by
        Brent's method in log α.
        """
        D, t = self.n_weights, self._theta_sq
        if not t > 0:
            raise ValueError("The trained weights are all 0 (‖θ0‖ = 0), so the full-space empirical Bayes "
                             "condition has no solution; pass a fixed sigma0.")

        def excess(log_alpha: float) -> float:
            return self._diag_trace(d, math.exp(log_alpha)) - t

        hi = math.log(2.0 * D / t)  # tr Σ ≤ D/α: excess ≤ −t/2 there
        return self._solve_log_alpha(d, excess, None, hi, "full-space empirical Bayes (low rank + diagonal)",
                                     ValueError(f"tr Σ(α) stays below ‖θ0‖² for every α at d = {d} (the curvature "
                                                "is positive in every direction), so the full-space empirical "
                                                "Bayes condition has no solution; pass a fixed sigma0."))

    def residual_diagonal(self, d: int) -> torch.Tensor:
        """r = max(diag(G) − Σ_{j≤d} λ_j p_j ∘ p_j, 0): G's diagonal beyond the leading d eigenpairs, float64, (D,).

        Only for ``posterior="low_rank_diag"`` (which holds diag(G)).
        """
        d = self._check_d(d)
        if self._ggn_diag is None:
            raise ValueError(f"residual_diagonal needs the GGN diagonal, held by posterior='low_rank_diag' only "
                             f"(this posterior is {self.posterior!r}).")
        P = self.eigenvectors[:, :d].to(torch.float64)
        lam = torch.as_tensor(self._lam64[:d], device=P.device)
        return (self._ggn_diag - (P**2) @ lam).clamp_min(0.0)

    def _diag_parts(self, d: int, alpha: float) -> tuple:
        """(1/A, P, √B) for the precision A + P B Pᵀ, A = diag(β r + α), B = β Λ_d, all float64 (P_d and β r kept
        for the last d, so that the σ0 solve does not rebuild them at every α)."""
        base = self._diag_factors_cache
        if base is None or base["d"] != d:
            base = self._diag_factors_cache = {"d": d, "P": self.eigenvectors[:, :d].to(torch.float64),
                                               "beta_r": self.beta * self.residual_diagonal(d), "alpha": None}
        bh = torch.as_tensor(np.sqrt(self.beta * self._lam64[:d]), device=base["P"].device)
        return 1.0 / (base["beta_r"] + alpha), base["P"], bh

    @staticmethod
    def _woodbury(a_inv: torch.Tensor, P: torch.Tensor, bh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """W = A⁻¹ P B^½ (D × d) and the Cholesky factor L of K = I + B^½ Pᵀ A⁻¹ P B^½, so that
        (A + P B Pᵀ)⁻¹ = A⁻¹ − W K⁻¹ Wᵀ (well defined also where some λ_j = 0)."""
        W = (a_inv[:, None] * P) * bh
        K = torch.eye(P.shape[1], dtype=P.dtype, device=P.device) + bh[:, None] * (P.T @ W)
        return W, torch.linalg.cholesky(0.5 * (K + K.T))

    def _diag_trace(self, d: int, alpha: float) -> float:
        """tr Σ(α) = Σ_k 1/A_k − tr(K⁻¹ WᵀW) of the low-rank-plus-diagonal posterior."""
        a_inv, P, bh = self._diag_parts(d, alpha)
        W, L = self._woodbury(a_inv, P, bh)
        return float(a_inv.sum()) - float(torch.cholesky_solve(W.T @ W, L).diagonal().sum())

    def _diag_factors(self, d: int) -> dict:
        """The factors of Σ = A⁻¹ − W K⁻¹ Wᵀ at d and σ0 = ``fit_sigma0(d)`` (cached for the last d): ``a_inv``,
        ``W``, ``L`` (for output covariances) and, built on first use, ``Q``, ``T`` (for sampling)."""
        alpha = self._alpha(d)
        cache = self._diag_factors_cache
        if cache is None or cache["d"] != d or cache["alpha"] != alpha:
            a_inv, P, bh = self._diag_parts(d, alpha)
            W, L = self._woodbury(a_inv, P, bh)
            cache = self._diag_factors_cache
            for key in ("Q", "T", "a_isqrt"):  # the sampler's factors belong to the previous α
                cache.pop(key, None)
            cache.update(alpha=alpha, a_inv=a_inv, bh=bh, W=W, L=L)
        return cache

    def _diag_sampler(self, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A^{-½}, Q, T with Σ^½ ε = A^{-½} (ε + Q T Qᵀ ε) an exact square root of the low-rank-plus-diagonal Σ.

        With U = A^{-½} P = Q R (thin QR), Σ = A^{-½} (I + U B Uᵀ)⁻¹ A^{-½} and (I + U B Uᵀ)^{-½} =
        I + Q ((I + R B Rᵀ)^{-½} − I) Qᵀ, the d × d root from a symmetric eigendecomposition: T = that − I.
        """
        f = self._diag_factors(d)
        if "Q" not in f:
            a_isqrt = f["a_inv"].sqrt()
            Q, R = torch.linalg.qr(a_isqrt[:, None] * f["P"])
            RB = R * f["bh"] ** 2
            m, E = torch.linalg.eigh(torch.eye(d, dtype=R.dtype, device=R.device) + 0.5 * (RB @ R.T + R @ RB.T))
            f["a_isqrt"], f["Q"], f["T"] = a_isqrt, Q, (E * m.clamp_min(1.0).rsqrt()) @ E.T - torch.eye(
                d, dtype=R.dtype, device=R.device)
        return f["a_isqrt"], f["Q"], f["T"]

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

    # ---------------------------------------------------------------- sampling
    def sample(self, n_samples: int, d: int, random_state=None) -> torch.Tensor:
        """Draw z ~ N(0, diag(σ_j²)) in the leading d directions; shape (n_samples, d).

        Standard normals ε of shape (n_samples, K) are drawn in one go and z = ε[:, :d] σ, so for a fixed
        integer ``random_state`` every d uses the same ε (common random numbers across d). They are drawn
        from a CPU generator (unless a torch.Generator on another device is passed) and then moved to the
        model's device, so a seed gives the same draws on every device.

        Parameters
        ----------
        n_samples : int
        d : int
        random_state : int, numpy Generator, torch.Generator or None
            Pass an int for reproducible draws shared across d.
        """
        n_samples = check_positive_int("n_samples", n_samples)
        d = self._check_d(d)
        gen = make_generator(random_state, "cpu")
        eps = torch.randn(n_samples, self.max_components, generator=gen, dtype=self.dtype, device=gen.device)
        return eps.to(self.device)[:, :d] * self.variances(d).sqrt()

    def _check_z(self, z) -> torch.Tensor:
        if not isinstance(z, torch.Tensor):
            raise TypeError(f"z must be a torch.Tensor, got {type(z).__name__}.")
        if z.ndim not in (1, 2):
            raise ValueError(f"z must have shape (d,) or (n, d), got {tuple(z.shape)}.")
        self._check_d(z.shape[-1])
        return z.to(self.dtype) if z.dtype != self.dtype else z

    def perturbations(self, z: torch.Tensor) -> torch.Tensor:
        """Weight perturbations P_d z for rows z of shape (n, d) (or (d,)): shape (n, D) (or (D,)).

        For many samples of a large network, call it on row chunks of ``z``.
        """
        z = self._check_z(z)
        return z @ self.eigenvectors[:, : z.shape[-1]].T

    def parameters(self, z_row: torch.Tensor) -> dict:
        """θ0 + P z for one z of shape (d,), as a name → tensor dict for ``torch.func.functional_call``."""
        z_row = self._check_z(z_row)
        if z_row.ndim != 1:
            raise ValueError(f"z_row must have shape (d,), got {tuple(z_row.shape)}; "
                             "use perturbations() for many rows.")
        return self.layout.unflatten(self.theta0 + self.perturbations(z_row))

    def _draws(self, n_samples: int, d: int, random_state) -> tuple[torch.Tensor, np.ndarray | None]:
        """z of shape (n_samples, d), and for the low-rank posterior one seed per sample for its complement
        normals ε_s ∈ R^D (None for the subspace posterior, whose draws stay those of :meth:`sample`)."""
        if self.posterior == "subspace":
            return self.sample(n_samples, d, random_state), None
        if isinstance(random_state, torch.Generator):
            z = self.sample(n_samples, d, random_state)
            base = int(torch.randint(0, 2**62, (1,), generator=random_state))
        else:
            rng = numpy_rng(random_state)
            z_seed, base = (int(v) for v in rng.integers(0, 2**62, size=2))
            z = self.sample(n_samples, d, z_seed)
        # a seed per sample: sample s gets the same ε_s whatever the number of samples or the chunking
        return z, np.random.default_rng(base).integers(0, 2**62, size=n_samples)

    def _perturbation_block(self, z: torch.Tensor, seeds: np.ndarray | None, start: int, stop: int) -> torch.Tensor:
        """Weight perturbations of samples start … stop − 1: P z_s, plus σ0 (ε_s − P Pᵀ ε_s) when low-rank;
        Σ^½ ε_s = A^{-½} (ε_s + Q T Qᵀ ε_s) for the low-rank-plus-diagonal posterior (:meth:`_diag_sampler`)."""
        d = z.shape[1]
        if seeds is None:
            return self.perturbations(z[start:stop])
        eps = torch.stack([
            torch.randn(self.n_weights, generator=torch.Generator().manual_seed(int(seeds[s])), dtype=self.dtype)
            for s in range(start, stop)
        ]).to(self.device)
        if self.posterior == "low_rank_diag":
            a_isqrt, Q, T = self._diag_sampler(d)
            eps = eps.to(torch.float64)
            return (a_isqrt * (eps + ((eps @ Q) @ T) @ Q.T)).to(self.dtype)
        P = self.eigenvectors[:, :d]
        return self.perturbations(z[start:stop]) + self.fit_sigma0(d) * (eps - (eps @ P) @ P.T)

    def sample_perturbations(self, n_samples: int, d: int, random_state=None) -> torch.Tensor:
        """Weight perturbations θ − θ0 drawn from the posterior at dimension d; shape (n_samples, D).

        "subspace": P z with z from :meth:`sample`. "low_rank": P z + σ0 (ε − P Pᵀ ε), ε ~ N(0, I_D), whose
        covariance is Σ = P diag(σ_j²) Pᵀ + σ0² (I − P Pᵀ). "low_rank_diag": Σ^½ ε with the exact square root
        of :meth:`_diag_sampler` (the same ε as "low_rank" for the same seed). An int ``random_state`` gives the
        same z-normals for every d (common random numbers, as :meth:`sample`) and the same ε for every d; each
        sample's ε is drawn on the CPU from its own seed, so it does not depend on the device, on ``n_samples``
        or on how the samples are chunked. For large D and many samples the (n_samples, D) result is large:
        :meth:`predict_samples` never forms it whole.
        """
        n_samples = check_positive_int("n_samples", n_samples)
        d = self._check_d(d)
        z, seeds = self._draws(n_samples, d, random_state)
        return self._perturbation_block(z, seeds, 0, n_samples)

    # ------------------------------------------------------------- evaluation
    def _row_batches(self, n: int, batch_size: int | None) -> list[slice]:
        size = batch_size or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _chunk(self, rows: int, total: int) -> int:
        """How many weight vectors to evaluate together on ``rows`` inputs (memory-bounded)."""
        by_weights = _WEIGHT_CHUNK_BYTES // (self.n_weights * self.theta0.element_size())
        by_rows = _MAX_BATCHED_ROWS // max(rows, 1)
        return int(max(1, min(total, by_weights, by_rows)))

    def predict_mean(self, X: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """f(x; θ0), the trained network's output; shape ``(n, *out)``."""
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        f = self.functional_model
        with torch.no_grad():
            outs = [f(X[sl]) for sl in self._row_batches(X.shape[0], batch_size)]
        return torch.cat(outs, 0)

    def _forward_many(self, delta: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
        """f(Xb; θ0 + δ_s) for every row δ_s of ``delta`` (c, D): shape ``(c, nb, *out)``."""
        return self._forward_weights(self.theta0 + delta, Xb)

    def _forward_weights(self, weights: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
        """f(Xb; w_s) for every row w_s of ``weights`` (c, D) of whole weight vectors: shape ``(c, nb, *out)``."""
        f = self.functional_model
        batched = self.layout.unflatten_rows(weights)
        if self._vmap_forward_ok is not False:
            try:
                out = vmap(lambda p: f(Xb, p))(batched)
                self._vmap_forward_ok = True
                return out
            except Exception as err:  # noqa: BLE001 - any failure of the vectorised path falls back to a loop
                if self._vmap_forward_ok:
                    raise
                logger.debug("vmap over weight samples failed (%s); evaluating them one by one", err)
                self._vmap_forward_ok = False
        return torch.stack([f(Xb, {n: t[s] for n, t in batched.items()}) for s in range(weights.shape[0])])

    def _form_weights(self, z: torch.Tensor, basis: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """θ0 + z basis for a chunk of z (c, d), written into ``out`` (c, D).

        Single-threaded on the CPU, the product is taken in blocks of ``_FORM_BLOCK`` weights, whose slices
        of θ0, the basis and the output stay in cache (a third faster than one call for the 10⁶-weight
        concrete network); with several threads one call, as a small block per call costs a thread
        synchronisation each (measured up to 3× slower on a loaded 2-core machine).
        """
        if self.device.type != "cpu" or torch.get_num_threads() > 1 or self.n_weights <= _FORM_BLOCK:
            return torch.addmm(self.theta0, z, basis, out=out)
        for i in range(0, self.n_weights, _FORM_BLOCK):
            j = min(i + _FORM_BLOCK, self.n_weights)
            torch.addmm(self.theta0[i:j], z, basis[:, i:j], out=out[:, i:j])
        return out

    def predict_samples(self, X: torch.Tensor, d: int, n_samples: int = 1000, random_state=None,
                        batch_size: int | None = None) -> torch.Tensor:
        """Sampled Laplace: f(x; θ0 + P z_s) through the real, non-linear network (eq. 43–44).

        Parameters
        ----------
        X : torch.Tensor of shape (n, ...)
            Inputs on the model's device.
        d : int
            Subspace dimension.
        n_samples : int, default=1000
            S, the number of posterior samples.
        random_state : int, numpy Generator, torch.Generator or None
            Seeds :meth:`sample`; an int gives the same standard normals for every d. With
            ``posterior="low_rank"`` the weights are those of :meth:`sample_perturbations`.
        batch_size : int, optional
            Input rows per forward pass (all at once when None). Samples are evaluated in memory-bounded
            chunks, vectorised with ``torch.func.vmap`` where the model allows it.

        Returns
        -------
        torch.Tensor of shape ``(S, n, *out)``
        """
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        z, seeds = self._draws(n_samples, d, random_state)
        rows = self._row_batches(X.shape[0], batch_size)
        chunk = self._chunk(rows[0].stop - rows[0].start, n_samples)
        basis = self.eigenvectors[:, :d].T  # (d, D), a view
        # θ0 + P z for a chunk of samples in one fused product, written into one buffer reused by every chunk
        # (a fresh (chunk, D) tensor per chunk costs page faults comparable to the product itself)
        weights = torch.empty(chunk, self.n_weights, dtype=self.dtype, device=self.device)
        out = []
        with torch.no_grad():
            for s in range(0, n_samples, chunk):
                stop = min(s + chunk, n_samples)
                w = weights[:stop - s]
                if seeds is None:
                    self._form_weights(z[s:stop], basis, w)
                else:  # low-rank: P z plus the complement's draws
                    torch.add(self.theta0, self._perturbation_block(z, seeds, s, stop), out=w)
                out.append(torch.cat([self._forward_weights(w, X[sl]) for sl in rows], 1))
        return torch.cat(out, 0)

    def linearized_samples(self, X: torch.Tensor, d: int, n_samples: int = 1000, random_state=None,
                           batch_size: int | None = None) -> torch.Tensor:
        """Draws of the linearised network f(x; θ0) + J(x)(θ − θ0) at the weight draws of
        :meth:`sample_perturbations` (same seed, same draws); shape ``(S, n, *out)``.

        Their distribution is the linearised predictive N(f(x; θ0), J Σ Jᵀ) of :meth:`linearized_variance`,
        which for ``posterior="low_rank"`` is the one to draw from: the complement's perturbations of every
        weight are meaningful for the linearised network, not for the non-linear one.
        """
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        n_samples = check_positive_int("n_samples", n_samples)
        d = self._check_d(d)
        z, seeds = self._draws(n_samples, d, random_state)
        mean = self.predict_mean(X, batch_size=batch_size)
        rows = self._row_batches(X.shape[0], batch_size)
        chunk = self._chunk(rows[0].stop - rows[0].start, n_samples)
        out = []
        for s in range(0, n_samples, chunk):
            delta = self._perturbation_block(z, seeds, s, min(s + chunk, n_samples))
            out.append(torch.cat([self._jvp_many(delta, X[sl]) for sl in rows], 1))
        return mean + torch.cat(out, 0)

    # --------------------------------------------------------------- linearised
    def _jvp_many(self, tangents: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
        """J(Xb) t_k for every row t_k of ``tangents`` (c, D): shape ``(c, nb, *out)``."""
        fm = self.functional_model
        batched = self.layout.unflatten_rows(tangents)

        def f(params):
            return fm(Xb, params)

        with fm.autodiff():
            if self._vmap_jvp_ok is not False:
                try:
                    out = vmap(lambda t: jvp(f, (fm.params0,), (t,))[1])(batched)
                    self._vmap_jvp_ok = True
                    return out.detach()
                except Exception as err:  # noqa: BLE001 - any failure of the vectorised path falls back to a loop
                    if self._vmap_jvp_ok:
                        raise
                    logger.debug("vmap over JVP tangents failed (%s); computing them one by one", err)
                    self._vmap_jvp_ok = False
            cols = []
            for k in range(tangents.shape[0]):
                with torch.autograd.forward_ad.dual_level():
                    duals = {n: torch.autograd.forward_ad.make_dual(p, batched[n][k])
                             for n, p in fm.params0.items()}
                    primal, tangent = torch.autograd.forward_ad.unpack_dual(fm(Xb, duals))
                cols.append(torch.zeros_like(primal) if tangent is None else tangent.detach())
            return torch.stack(cols)

    def _cache_for(self, X: torch.Tensor) -> dict:
        """The cache of Jacobian quantities for ``X`` (the same tensor object, unmodified), reset otherwise."""
        cache = self._jp_cache
        if cache is None or cache["X"] is not X or cache["version"] != X._version:
            cache = self._jp_cache = {"X": X, "version": X._version, "JP": None}
        return cache

    def jacobian_projections(self, X: torch.Tensor, d: int, batch_size: int | None = None) -> torch.Tensor:
        """J(x) p_j for j ≤ d by forward-mode JVPs; shape ``(n, *out, d)``.

        The result for the last ``X`` (the same tensor object, unmodified) is cached and extended column by
        column, so calling it for d = 1, …, K costs K JVPs in total.
        """
        X = self._check_X(X)
        d = self._check_d(d)
        return self._jacobian_projections(X, d, batch_size).clone()

    def _jacobian_projections(self, X: torch.Tensor, d: int, batch_size: int | None) -> torch.Tensor:
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        cache = self._cache_for(X)
        have = 0 if cache["JP"] is None else cache["JP"].shape[-1]
        if have < d:
            rows = self._row_batches(X.shape[0], batch_size)
            chunk = self._chunk(rows[0].stop - rows[0].start, d - have)
            new = []
            for k in range(have, d, chunk):
                tangents = self.eigenvectors[:, k:min(k + chunk, d)].T
                new.append(torch.cat([self._jvp_many(tangents, X[sl]) for sl in rows], 1))
            new = torch.movedim(torch.cat(new, 0), 0, -1)
            cache["JP"] = new if cache["JP"] is None else torch.cat([cache["JP"], new], -1)
        return cache["JP"][..., :d]

    def linearized_variance(self, X: torch.Tensor, d: int, full_cov: bool = False,
                            batch_size: int | None = None) -> torch.Tensor:
        """Output variance of the linearised network, J Σ Jᵀ with Σ = P diag(σ_j²) Pᵀ (eq. 45–46), plus
        σ0² (J Jᵀ − (J P)(J P)ᵀ) for ``posterior="low_rank"`` (needs the per-record J Jᵀ: :meth:`jacobian_gram`);
        for ``posterior="low_rank_diag"`` J A⁻¹ Jᵀ − (J W) K⁻¹ (J W)ᵀ (see :meth:`_diag_factors`), from the
        per-record Jacobians, in float64.

        Parameters
        ----------
        X : torch.Tensor of shape (n, ...)
        d : int
        full_cov : bool, default=False
            False: the variances σ_f² = Σ_j σ_j² (J p_j)², shape ``(n, *out)`` (e.g. (n, M)).
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
        if self.posterior == "low_rank_diag":
            return self._diag_output_covariance(X, d, full_cov, batch_size)
        if self.posterior == "low_rank":
            return self._low_rank_output_covariance(X, jp, d, full_cov, batch_size)
        var = self.variances(d)
        if not full_cov:
            return (jp**2 * var).sum(-1)
        return (jp * var) @ jp.transpose(-1, -2)

    def _low_rank_output_covariance(self, X, jp, d, full_cov, batch_size) -> torch.Tensor:
        """J Σ Jᵀ for Σ = P diag(σ_j²) Pᵀ + σ0² (I − P Pᵀ): Σ_j σ_j² (Jp_j)(Jp_j)ᵀ + σ0² (J Jᵀ − (JP)(JP)ᵀ),
        in float64 (the complement is a difference of two close terms when J lies mostly in span(P))."""
        jp = jp.to(torch.float64)
        var = torch.as_tensor(self._variances64(d), device=jp.device)
        s0sq = self.fit_sigma0(d) ** 2
        gram = self.jacobian_gram(X, full_cov=full_cov, batch_size=batch_size)
        if not full_cov:
            comp = (gram - (jp**2).sum(-1)).clamp_min(0.0)
            return ((jp**2 * var).sum(-1) + s0sq * comp).to(self.dtype)
        comp = gram - jp @ jp.transpose(-1, -2)
        cov = (jp * var) @ jp.transpose(-1, -2) + s0sq * comp
        return (0.5 * (cov + cov.transpose(-1, -2))).to(self.dtype)

    def _diag_output_covariance(self, X, d, full_cov, batch_size) -> torch.Tensor:
        """J Σ Jᵀ for the low-rank-plus-diagonal Σ = A⁻¹ − W K⁻¹ Wᵀ: J A⁻¹ Jᵀ − V Vᵀ with V = (J W) L⁻ᵀ, per record,
        in float64 (clamped at 0 on the diagonal, where the two terms may round apart)."""
        f = self._diag_factors(d)
        a_inv, W, L = f["a_inv"], f["W"], f["L"]
        parts = []
        for _, jac in self._jacobian_blocks(X, batch_size):  # (c, *out, D)
            v = torch.linalg.solve_triangular(L, (jac @ W).transpose(-1, -2), upper=False)  # (c, *out[:-1], d, M)
            if full_cov:
                cov = (jac * a_inv) @ jac.transpose(-1, -2) - v.transpose(-1, -2) @ v
                parts.append(0.5 * (cov + cov.transpose(-1, -2)))
            else:
                parts.append(((jac**2) @ a_inv - (v**2).sum(-2)).clamp_min(0.0))
        return torch.cat(parts, 0).to(self.dtype)

    def _jacobian_blocks(self, X: torch.Tensor, batch_size: int | None):
        """(rows, per-record Jacobians in float64) over memory-bounded chunks of the records of X; kept in the cache
        of ``X`` for ``posterior="low_rank_diag"`` when they fit in one chunk (so that several d reuse them)."""
        cache = self._cache_for(X)
        if cache.get("jac") is not None:
            return cache["jac"]
        blocks = self.record_jacobian_chunks(X, _WEIGHT_CHUNK_BYTES, batch_size)
        n_out = int(np.prod(self.functional_model.output_shape(X)))
        fits = X.shape[0] * n_out * self.n_weights * 8 <= _WEIGHT_CHUNK_BYTES
        if self.posterior == "low_rank_diag" and fits and (batch_size or X.shape[0]) >= X.shape[0]:
            cache["jac"] = blocks = list(blocks)
        return blocks

    def jacobian_gram(self, X: torch.Tensor, full_cov: bool = False, batch_size: int | None = None) -> torch.Tensor:
        """J(x) J(x)ᵀ over the last output axis, per record: ‖J_m(x)‖² of shape ``(n, *out)`` (``full_cov=False``)
        or the (M × M) blocks, shape ``(n, *out[:-1], M, M)``; in float64.

        Per-record Jacobians by reverse mode, vectorised over records with ``torch.func.vmap`` where the
        model allows it (a loop over records otherwise), in chunks of records holding at most about
        128 MiB of Jacobian entries (at least one record at a time). Cached for the last ``X`` like
        :meth:`jacobian_projections`.
        """
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        cache = self._cache_for(X)
        key = "gram_full" if full_cov else "gram_diag"
        if cache.get(key) is None:
            cache[key] = self._compute_gram(X, full_cov, batch_size)
        return cache[key]

    def _compute_gram(self, X: torch.Tensor, full_cov: bool, batch_size: int | None) -> torch.Tensor:
        parts = []
        for _, jac in self._jacobian_blocks(X, batch_size):  # (c, *out, D)
            parts.append(jac @ jac.transpose(-1, -2) if full_cov else (jac**2).sum(-1))
        return torch.cat(parts, 0)
