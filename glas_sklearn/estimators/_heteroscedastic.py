"""The regressor's predictive under a heteroscedastic likelihood: the moments of y and σ0 by held-out NLL.

Under the weight posterior the network gives, per row and target, a mean μ(x; θ) and a noise variance σ²(x; θ).
The predictive for y is N(μ̂, σ_ale² + σ_epi²) with

- linearised: μ̂ = μ(x; θ0), σ_epi² = Var[μ] = J_μ Σ J_μᵀ (for natural parameters by the delta method on the
  linearised (η1, η2) covariance), σ_ale² = σ²(x; θ0) (the variance head's own posterior uncertainty is not
  propagated: under β = N it is negligible in distribution);
- sampled: the law of total variance over posterior samples: μ̂ = E[μ], σ_epi² = Var[μ], σ_ale² = E[σ²].
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy.optimize import minimize_scalar

__all__ = ["heteroscedastic_moments", "tune_sigma0_heteroscedastic"]

# The σ0 search range below the empirical Bayes value (as calibration.tune_sigma0) and its tolerance in log σ0.
_SIGMA0_LOWEST = 1e-4
_SIGMA0_XTOL = 1e-3


def heteroscedastic_moments(posterior, likelihood, X: torch.Tensor, d: int, *, predictive: str = "linearized",
                            n_samples: int = 1000,
                            random_state=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """μ̂, σ_ale² and σ_epi² of each row and target, (n, k) each, in the network's units."""
    if predictive == "sampled":
        s = posterior.predict_samples(X, d, n_samples=n_samples, random_state=random_state)  # (S, n, 2k)
        mu, var = likelihood.mean_and_variance(s)
        return mu.mean(0), var.mean(0), mu.var(0, unbiased=False)
    out = posterior.predict_mean(X)
    mu, ale = likelihood.mean_and_variance(out)
    k = mu.shape[-1]
    if likelihood.output == "mean_logvar":
        epi = posterior.linearized_variance(X, d).clamp_min(0)[..., :k]
    else:  # natural parameters: Var[μ] ≈ gᵀ C g with g = ∂μ/∂(η1, η2) and C the 2×2 block of each target
        cov = posterior.linearized_variance(X, d, full_cov=True)  # (n, 2k, 2k)
        g = likelihood.mean_gradient(out)  # (n, k, 2)
        idx = torch.arange(k, device=cov.device)
        c11, c12, c22 = cov[:, idx, idx], cov[:, idx, idx + k], cov[:, idx + k, idx + k]
        epi = (g[..., 0] ** 2 * c11 + 2 * g[..., 0] * g[..., 1] * c12 + g[..., 1] ** 2 * c22).clamp_min(0)
    return mu, ale, epi


def _gaussian_nll(y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> float:
    var = var.to(torch.float64)
    if bool((var <= 0).any()):
        return math.inf
    r = y.reshape(mean.shape).to(torch.float64) - mean.to(torch.float64)
    return float((0.5 * torch.log(2 * math.pi * var) + 0.5 * r**2 / var).mean())


def tune_sigma0_heteroscedastic(posterior, likelihood, X: torch.Tensor, y: torch.Tensor, *, d: int,
                                predictive: str = "linearized", n_samples: int = 1000,
                                random_state=None) -> tuple[float, pd.DataFrame]:
    """σ0 ∈ [0, σ0_EB] minimising the mean Gaussian NLL of N(μ̂, σ_ale² + σ_epi²) on the rows (X, y): bounded Brent
    in log σ0 over [σ0_EB · 10⁻⁴, σ0_EB], both ends (σ0_EB and 0, the network's own σ²(x)) evaluated too.
    Returns the σ0 of the lowest NLL and every evaluation; the posterior's σ0 setting is restored."""
    original = posterior.sigma0
    upper = float(posterior.fit_sigma0(d))
    seed = int(np.random.default_rng(random_state).integers(0, 2**62))
    evals: list[tuple[float, float]] = []

    def nll_at(sigma0: float) -> float:
        posterior.set_sigma0(sigma0)
        mu, ale, epi = heteroscedastic_moments(posterior, likelihood, X, d, predictive=predictive,
                                               n_samples=n_samples, random_state=seed)
        value = _gaussian_nll(y, mu, ale + epi)
        value = math.inf if math.isnan(value) else value
        evals.append((float(sigma0), value))
        return value

    try:
        nll_at(upper)
        nll_at(0.0)
        if upper > 0:
            minimize_scalar(lambda u: min(nll_at(math.exp(u)), 1e300),
                            bounds=(math.log(upper * _SIGMA0_LOWEST), math.log(upper)), method="bounded",
                            options={"xatol": _SIGMA0_XTOL})
    finally:
        posterior.set_sigma0(original)
    best = min(range(len(evals)), key=lambda i: (evals[i][1], i))
    return evals[best][0], pd.DataFrame(evals, columns=["sigma0", "nll"])
