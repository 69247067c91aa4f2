"""The Gaussian with a noise level σ(x) fitted after the mean network: y ~ N(f(x; θ), σ²(x)).

The network is the Gaussian's (k outputs, the ½-squared error), so its training is the Gaussian's; the noise
σ²(x) is a separate model of the trained network's residuals (:mod:`~glas_sklearn.likelihoods.noise_model`),
attached with :meth:`FittedNoiseGaussian.with_noise_model`. The curvature of the posterior is the Gauss-Newton
matrix under that noise, each row weighed by its precision 1/σ²(x). The predictive of y is N(f̂, σ²(x) + σ_epi²),
and the conformal score normalises by σ̂² = σ²(x) + λ σ_epi².
"""

from __future__ import annotations

import copy

import torch

from ._row_noise import RowNoisePredictive
from .gaussian import Gaussian

__all__ = ["FittedNoiseGaussian"]


class FittedNoiseGaussian(RowNoisePredictive, Gaussian):
    """y ~ N(f(x; θ), σ²(x)): the Gaussian's network, a noise model σ²(x) fitted after it, and the posterior under
    that noise.

    ``noise_model_`` (set by :meth:`with_noise_model`) answers ``variance(X)`` with σ²(x) per row and target, in
    the network's units. The curvature is the Gauss-Newton matrix under that noise, Σ_n J_nᵀ J_n / σ²(x_n): the
    Gaussian's with the constant σ² of the residuals in β (the regressor's ``noise_std_``) and each row weighted by
    σ²/σ²(x_n) (:meth:`curvature_row_weights`). The regressors' ``scaling="auto"`` is "standard" (the Bayesian
    posterior: β = N/σ² over those weights, Σ_n 1/σ²(x_n) for one target), so that σ_epi² is on the scale of σ²(x)
    it is added to (under "mean", N times larger, it swamps σ²(x) in σ̂).

    Examples
    --------
    >>> import torch
    >>> class Half:
    ...     def variance(self, X):
    ...         return torch.full((X.shape[0], 1), 0.25)
    >>> lik = FittedNoiseGaussian().with_noise_model(Half())
    >>> lik.row_noise_variance(None, torch.zeros(2, 3))
    tensor([[0.2500],
            [0.2500]])
    """

    name = "heteroscedastic"
    noise_kind = "fitted-noise"
    noise_per_row = True
    default_scaling = "standard"

    def __init__(self) -> None:
        self.noise_model_ = None

    def with_noise_model(self, noise_model) -> FittedNoiseGaussian:
        """A copy of this likelihood holding ``noise_model`` (an object with ``variance(X) -> (n, k)``)."""
        fitted = copy.copy(self)
        fitted.noise_model_ = noise_model
        return fitted

    def row_noise_variance(self, module, X: torch.Tensor) -> torch.Tensor:
        """σ²(x) of the noise model per row and target, (n, k), in the network's units (``module`` is unused)."""
        if self.noise_model_ is None:
            raise RuntimeError("FittedNoiseGaussian has no noise model yet; fit one (glas_sklearn.likelihoods."
                               "fit_noise_model) and attach it with with_noise_model().")
        return self.noise_model_.variance(X)

    def curvature_row_weights(self, X: torch.Tensor, noise_var) -> torch.Tensor:
        """σ²/σ²(x_n) per row (n,), averaged over the targets (σ² the constant ``noise_var`` of β, one per target or
        pooled): with these factors in the record weights the curvature is Σ_n J_nᵀ J_n / σ²(x_n), the Gauss-Newton
        matrix of N(f(x; θ), σ²(x)) at the trained weights, so rows with little noise constrain the weights more
        (exact for one target; for several, the mean of the targets' precision ratios). A noise model constant at
        σ² gives factors of 1 (the Gaussian's curvature)."""
        var = self.row_noise_variance(None, X).to(torch.float64)
        var = var.reshape(var.shape[0], -1)
        ref = torch.as_tensor(noise_var, dtype=torch.float64, device=var.device).reshape(-1)
        if ref.numel() not in (1, var.shape[1]):
            raise ValueError(f"noise_var has {ref.numel()} values for {var.shape[1]} targets; give one, or one a "
                             "target.")
        return (ref / var.clamp_min(torch.finfo(torch.float64).tiny)).mean(1).to(X.dtype if X.is_floating_point()
                                                                                 else torch.float64)

    def predictive_parts(self, posterior, X: torch.Tensor, d: int, *, predictive="linearized",
                         n_samples: int = 1000, random_state=None,
                         batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """f̂, σ_ale² = σ²(x) and σ_epi² (the Gaussian's posterior variance of f), (n, k) each."""
        mean, ale, epi = super().predictive_parts(posterior, X, d, predictive=predictive, n_samples=n_samples,
                                                  random_state=random_state, batch_size=batch_size)
        return mean, ale + self.row_noise_variance(None, X).to(ale.dtype).reshape(ale.shape), epi
