"""The observation-noise variance σ² that the Gaussian likelihood's posterior scaling β is built from (paper §2.3).

β itself is the likelihood's: :meth:`glas_sklearn.likelihoods.Likelihood.beta` (paper eq. 1, §4.1.1).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["estimate_noise_variance"]


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
