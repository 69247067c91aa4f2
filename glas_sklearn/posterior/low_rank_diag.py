"""The Laplace posterior of the curvature P Λ Pᵀ plus G's residual diagonal, by Woodbury (beyond the paper; the
user guide describes it).

Σ(α) = (A + P B Pᵀ)⁻¹ with A = diag(β r + α), B = β Λ_d and r = max(diag(G) − Σ_{j≤d} λ_j p_j ∘ p_j, 0) the part of
G's diagonal that the leading eigenpairs leave out: the curvature beyond the top d constrains every weight by its
own diagonal. Everything is D-vectors and d × d factors, in float64.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from .._checks import check_finite_tensor
from ._base import ActiveSubspacePosterior
from ._prior import LogAlphaCondition, trace_condition

__all__ = ["LowRankDiagPosterior"]

# The cached factors are built and replaced under this lock, so threads predicting with one posterior never see a
# half-updated cache (they are built once per d and σ0; a lookup holds it for a dictionary access).
_FACTORS_LOCK = threading.RLock()


class LowRankDiagPosterior(ActiveSubspacePosterior):
    """The Laplace posterior of the precision β (P Λ Pᵀ + diag(r)) + σ0⁻² I (needs ``ggn_diagonal``).

    Built like :class:`~glas_sklearn.posterior.ActiveSubspacePosterior` (the name ``posterior="low_rank_diag"``),
    with ``ggn_diagonal`` = diag(G) (e.g. :meth:`~glas_sklearn.ggn.GGNOperator.diagonal`; negative values within
    round-off of 0 are set to 0). Draws are Σ^½ ε with an exact square root (:meth:`_diag_sampler`, the same ε as
    :class:`~glas_sklearn.posterior.LowRankPosterior` for the same seed); σ0 by the full-space condition
    tr Σ(α) = ‖θ0‖²; predictions by the linearised network, J Σ Jᵀ from per-record Jacobians.
    """

    name = "low_rank_diag"
    default_sigma0 = "eb_full"
    default_predictive = "linearized"
    off_subspace = True
    needs_ggn_diagonal = True
    _keep_record_jacobians = True  # J Σ Jᵀ needs them at every d

    def _set_ggn_diagonal(self, ggn_diagonal) -> None:
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
        self._ggn_diag = diag.clamp_min(0.0)
        self._diag_factors_cache: dict | None = None

    def _sigma0_changed(self) -> None:
        with _FACTORS_LOCK:
            self._drop_sampler_factors()

    def _drop_sampler_factors(self) -> None:
        if self._diag_factors_cache is not None:
            for key in ("Q", "T", "a_isqrt"):
                self._diag_factors_cache.pop(key, None)
            self._diag_factors_cache["alpha"] = None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_diag_factors_cache"] = None  # rebuilt from the eigenpairs and the GGN diagonal
        return state

    # ------------------------------------------------------------------ factors
    def residual_diagonal(self, d: int) -> torch.Tensor:
        """r = max(diag(G) − Σ_{j≤d} λ_j p_j ∘ p_j, 0): G's diagonal beyond the leading d eigenpairs, float64, (D,)."""
        d = self._check_d(d)
        P = self.eigenvectors[:, :d].to(torch.float64)
        lam = torch.as_tensor(self._lam64[:d], device=P.device)
        return (self._ggn_diag - (P**2) @ lam).clamp_min(0.0)

    def _diag_parts(self, d: int, alpha: float) -> tuple:
        """(1/A, P, √B) for the precision A + P B Pᵀ, A = diag(β r + α), B = β Λ_d, all float64 (P_d and β r kept
        for the last d, so that the σ0 solve does not rebuild them at every α)."""
        with _FACTORS_LOCK:
            return self._diag_parts_locked(d, alpha)

    def _diag_parts_locked(self, d: int, alpha: float) -> tuple:
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
        """tr Σ(α) = Σ_k 1/A_k − tr(K⁻¹ WᵀW)."""
        a_inv, P, bh = self._diag_parts(d, alpha)
        W, L = self._woodbury(a_inv, P, bh)
        return float(a_inv.sum()) - float(torch.cholesky_solve(W.T @ W, L).diagonal().sum())

    def _diag_factors(self, d: int) -> dict:
        """The factors of Σ = A⁻¹ − W K⁻¹ Wᵀ at d and σ0 = ``fit_sigma0(d)`` (cached for the last d): ``a_inv``,
        ``W``, ``L`` (for output covariances) and, built on first use, ``Q``, ``T`` (for sampling)."""
        alpha = self._alpha(d)
        with _FACTORS_LOCK:
            return dict(self._diag_factors_locked(d, alpha))  # a snapshot: later updates do not reach the caller

    def _diag_factors_locked(self, d: int, alpha: float) -> dict:
        cache = self._diag_factors_cache
        if cache is None or cache["d"] != d or cache["alpha"] != alpha:
            a_inv, P, bh = self._diag_parts_locked(d, alpha)
            W, L = self._woodbury(a_inv, P, bh)
            cache = self._diag_factors_cache
            for key in ("Q", "T", "a_isqrt"):  # the sampler's factors belong to the previous α
                cache.pop(key, None)
            cache.update(alpha=alpha, a_inv=a_inv, bh=bh, W=W, L=L)
        return cache

    def _diag_sampler(self, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A^{-½}, Q, T with Σ^½ ε = A^{-½} (ε + Q T Qᵀ ε) an exact square root of Σ.

        With U = A^{-½} P = Q R (thin QR), Σ = A^{-½} (I + U B Uᵀ)⁻¹ A^{-½} and (I + U B Uᵀ)^{-½} =
        I + Q ((I + R B Rᵀ)^{-½} − I) Qᵀ, the d × d root from a symmetric eigendecomposition: T = that − I.
        """
        with _FACTORS_LOCK:
            return self._diag_sampler_locked(d)

    def _diag_sampler_locked(self, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self._diag_factors_locked(d, self._alpha(d))
        if "Q" not in f:
            a_isqrt = f["a_inv"].sqrt()
            Q, R = torch.linalg.qr(a_isqrt[:, None] * f["P"])
            RB = R * f["bh"] ** 2
            m, E = torch.linalg.eigh(torch.eye(d, dtype=R.dtype, device=R.device) + 0.5 * (RB @ R.T + R @ RB.T))
            f["a_isqrt"], f["Q"], f["T"] = a_isqrt, Q, (E * m.clamp_min(1.0).rsqrt()) @ E.T - torch.eye(
                d, dtype=R.dtype, device=R.device)
        return f["a_isqrt"], f["Q"], f["T"]

    # -------------------------------------------------------------------- hooks
    def _perturbations_from_draws(self, z: torch.Tensor, eps: torch.Tensor | None) -> torch.Tensor:
        # Σ^½ ε (z is not used: the exact root covers span(P) too)
        a_isqrt, Q, T = self._diag_sampler(z.shape[1])
        eps = eps.to(torch.float64)
        return (a_isqrt * (eps + ((eps @ Q) @ T) @ Q.T)).to(self.dtype)

    def _trace_condition(self, d: int) -> LogAlphaCondition:
        """tr Σ(α) = Σ_k 1/A_k − tr(K⁻¹ WᵀW) falls strictly from +∞ (or the trace of the pseudo-inverse part) to 0
        and is at most D/α (:func:`~glas_sklearn.posterior.trace_condition`)."""
        return trace_condition(lambda alpha: self._diag_trace(d, alpha), self.n_weights, self._theta_sq, d,
                               "full-space empirical Bayes (low rank + diagonal)")

    def _output_covariance(self, X: torch.Tensor, jp: torch.Tensor, d: int, full_cov: bool,
                           batch_size: int | None) -> torch.Tensor:
        """J A⁻¹ Jᵀ − V Vᵀ with V = (J W) L⁻ᵀ, per record, in float64 (clamped at 0 on the diagonal, where the two
        terms may round apart)."""
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
