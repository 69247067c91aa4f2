"""The predictive of likelihoods whose noise σ²(x) varies per row: N(f̂, σ_ale² + σ_epi²), with σ_ale² = σ²(x)
from the likelihood's own ``predictive_parts``, so no constant ``noise_var`` is added on top."""

from __future__ import annotations

import numpy as np
import torch

from ..predictive import RegressionMoments, linearized_interval

__all__ = ["RowNoisePredictive"]


class RowNoisePredictive:
    """``predictive_moments`` and ``predictive_interval`` from the class's ``predictive_parts`` (f̂, σ_ale²,
    σ_epi²); ``noise_kind`` names the likelihood in the error for a non-zero ``noise_var``."""

    noise_kind = "heteroscedastic"

    def _check_no_noise_var(self, noise_var) -> None:
        if np.any(np.asarray(noise_var) != 0):
            raise ValueError(f"The {self.noise_kind} likelihood's predictive carries its own noise σ²(x); noise_var "
                             "must be 0 (include_noise=False).")

    def _total_variance(self, posterior, X, d, predictive, n_samples, noise_var, random_state, batch_size):
        self._check_no_noise_var(noise_var)
        mean, ale, epi = self.predictive_parts(posterior, X, d, predictive=predictive, n_samples=n_samples,
                                               random_state=random_state, batch_size=batch_size)
        return mean, ale + epi

    def predictive_moments(self, posterior, X: torch.Tensor, d: int, *, predictive="linearized",
                           n_samples: int = 1000, noise_var=0.0, random_state=None,
                           batch_size: int | None = None) -> RegressionMoments:
        """ŷ = f̂ and σ̂ = sqrt(σ_ale² + σ_epi²) (``predictive_parts``); ``noise_var`` must be 0: σ²(x) is the
        noise."""
        mean, var = self._total_variance(posterior, X, d, predictive, n_samples, noise_var, random_state,
                                         batch_size)
        return RegressionMoments(mean, var.sqrt())

    def predictive_interval(self, posterior, X: torch.Tensor, d: int, confidence_levels=None, *,
                            predictive="linearized", n_samples: int = 1000, noise_var=0.0, random_state=None,
                            batch_size: int | None = None):
        """The Gaussian intervals f̂ ± z σ̂ of N(f̂, σ_ale² + σ_epi²) (sampled or linearised moments): mean, σ̂
        and the bounds (None without ``confidence_levels``)."""
        mean, var = self._total_variance(posterior, X, d, predictive, n_samples, noise_var, random_state,
                                         batch_size)
        bounds = None if confidence_levels is None else linearized_interval(mean, var, confidence_levels)
        return mean, var.sqrt(), bounds
