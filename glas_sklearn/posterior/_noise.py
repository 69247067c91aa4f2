"""The posterior scaling β and the observation-noise variance σ² it is built from (paper eq. 1, §2.3, §4.1.1)."""

from __future__ import annotations

import numpy as np
import torch

from .._checks import check_choice
from ..likelihoods import Categorical, Gaussian

__all__ = ["beta_for", "estimate_noise_variance"]

_TASKS = ("regression", "classification")


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
    likelihood = Categorical() if task == "classification" else Gaussian()
    return likelihood.beta(scaling, n_records, noise_var)


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
