"""The paper's posterior: θ = θ0 + P z, z ~ N(0, diag(σ_j²)), no weight variance off span(P) (eq. 22, 43)."""

from __future__ import annotations

import numpy as np
import torch

from ._base import ActiveSubspacePosterior
from ._prior import LogAlphaCondition, low_rank_condition

__all__ = ["SubspacePosterior"]


class SubspacePosterior(ActiveSubspacePosterior):
    """θ = θ0 + P z in the span of the leading d eigenvectors: Σ = P diag(σ_j²) Pᵀ (the paper).

    Built like :class:`~glas_sklearn.posterior.ActiveSubspacePosterior` (the name ``posterior="subspace"``).
    σ0 by the paper's empirical Bayes in the subspace; predictions by samples through the non-linear network.
    With ``sigma0="eb_full"`` the full-space condition is that of the low-rank posterior on the same eigenpairs
    (Σ_{j≤d} 1/(βλ_j + α) + (D − d)/α = ‖θ0‖²: the prior's variance off the subspace counts).

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.posterior import SubspacePosterior
    >>> net = torch.nn.Linear(2, 1).double()
    >>> post = SubspacePosterior(net, torch.tensor([2.0, 1.0], dtype=torch.float64),
    ...                          torch.eye(3, 2, dtype=torch.float64), beta=1.0, sigma0=1.0)
    >>> post.sample_perturbations(4, 2, random_state=0)[:, 2].abs().max().item()  # no variance off span(P)
    0.0
    """

    name = "subspace"
    default_sigma0 = "eb_subspace"
    default_predictive = "sampled"
    off_subspace = False

    def _perturbations_from_draws(self, z: torch.Tensor, eps: torch.Tensor | None) -> torch.Tensor:
        return self.perturbations(z)

    def _weights_into(self, z: torch.Tensor, seeds: np.ndarray | None, start: int, stop: int,
                      out: torch.Tensor) -> torch.Tensor:
        # θ0 + P z in one fused product (a subclass that changes _perturbations_from_draws overrides this too)
        return self._form_weights(z[start:stop], self.eigenvectors[:, :z.shape[1]].T, out)

    def _trace_condition(self, d: int) -> LogAlphaCondition:
        return low_rank_condition(self.beta * self._lam64[:d], self.n_weights, self._theta_sq, d)

    def _output_covariance(self, X: torch.Tensor, jp: torch.Tensor, d: int, full_cov: bool,
                           batch_size: int | None) -> torch.Tensor:
        # Σ_j σ_j² (J p_j)(J p_j)ᵀ
        var = self.variances(d)
        if not full_cov:
            return (jp**2 * var).sum(-1)
        return (jp * var) @ jp.transpose(-1, -2)
