"""The homoscedastic Gaussian likelihood y ~ N(f, σ² I): regression with the ½-squared loss."""

from __future__ import annotations

import torch

from .._checks import check_positive_float
from ..conformity_scores import StdNormalizedResidual
from ._base import Likelihood

__all__ = ["Gaussian"]


class Gaussian(Likelihood):
    """y ~ N(f(x; θ), σ² I) with one shared noise variance σ² (the regressor's, and the paper's, likelihood).

    The network is trained on the ½-squared error ½‖f − y‖² (mean over rows), whose Hessian in the output is the
    identity; σ² enters through the posterior scaling: β = 1/σ² ("mean") or N/σ² ("standard").

    Examples
    --------
    >>> import torch
    >>> lik = Gaussian()
    >>> float(lik.loss(torch.tensor([[1.0], [3.0]]), torch.tensor([[0.0], [1.0]])))
    1.25
    >>> lik.beta("mean", 100, noise_var=0.01), lik.beta("standard", 100, noise_var=0.01)
    (100.0, 10000.0)
    """

    name = "gaussian"
    is_classification = False
    needs_noise_variance = True

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """½‖f − y‖² summed over the outputs, averaged over the rows (and positions)."""
        return 0.5 * ((output - target) ** 2).sum(-1).mean()

    def output_hessian_product(self, output: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """H = I: u itself."""
        return u

    def output_hessian_diagonal_terms(self, output: torch.Tensor, jacobian: torch.Tensor) -> torch.Tensor:
        """diag(J_nᵀ J_n) = Σ_m J_mk² per record."""
        return (jacobian**2).sum(-2)

    def default_conformity_score(self):
        """The std-normalised residual ``|y − ŷ| / σ̂``
        (:class:`~glas_sklearn.conformity_scores.StdNormalizedResidual`)."""
        return StdNormalizedResidual()

    def _named_scaling_beta(self, factor: float, scaling: str, noise_var: float | None) -> float:
        if noise_var is None:
            raise ValueError(
                "noise_var (σ², the observation-noise variance) is required for regression with "
                f"scaling={scaling!r}; estimate it from training residuals with estimate_noise_variance()."
            )
        noise_var = check_positive_float("noise_var", noise_var)
        return factor / noise_var
