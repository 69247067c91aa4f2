"""The Laplace posterior of the rank-d curvature: Σ = P diag(σ_j²) Pᵀ + σ0² (I − P Pᵀ) (beyond the paper; the user
guide describes it)."""

from __future__ import annotations

import torch

from ._base import ActiveSubspacePosterior
from ._prior import LogAlphaCondition, low_rank_condition

__all__ = ["LowRankPosterior"]


class LowRankPosterior(ActiveSubspacePosterior):
    """The Laplace posterior of the precision β P Λ Pᵀ + σ0⁻² I: the prior keeps its variance σ0² in the D − d
    directions the leading curvature does not constrain, so intervals widen where the network extrapolates.

    Built like :class:`~glas_sklearn.posterior.ActiveSubspacePosterior` (the name ``posterior="low_rank"``).
    Draws are P z + σ0 (ε − P Pᵀ ε), ε ~ N(0, I_D); σ0 by the full-space condition
    Σ_{j≤d} 1/(βλ_j + α) + (D − d)/α = ‖θ0‖²; predictions by the linearised network (the complement perturbs
    every weight: meaningful for the linearised network, not for the non-linear one).
    """

    name = "low_rank"
    default_sigma0 = "eb_full"
    default_predictive = "linearized"
    off_subspace = True
    _uses_gram = True

    def _perturbations_from_draws(self, z: torch.Tensor, eps: torch.Tensor | None) -> torch.Tensor:
        P = self.eigenvectors[:, :z.shape[1]]
        return self.perturbations(z) + self.fit_sigma0(z.shape[1]) * (eps - (eps @ P) @ P.T)

    def _trace_condition(self, d: int) -> LogAlphaCondition:
        return low_rank_condition(self.beta * self._lam64[:d], self.n_weights, self._theta_sq, d)

    def _output_covariance(self, X: torch.Tensor, jp: torch.Tensor, d: int, full_cov: bool,
                           batch_size: int | None) -> torch.Tensor:
        """Σ_j σ_j² (Jp_j)(Jp_j)ᵀ + σ0² (J Jᵀ − (JP)(JP)ᵀ), in float64 (the complement is a difference of two close
        terms when J lies mostly in span(P)), with J Jᵀ from :meth:`jacobian_gram`."""
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
