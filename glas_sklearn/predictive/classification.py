"""Class probabilities (averaged softmax, Monte Carlo or probit over a logit Gaussian) and prediction sets.

Logits (n, C) give probabilities (n, C) and prediction sets (n, C, k).
"""

from __future__ import annotations

import math

import torch

from .._checks import check_choice, check_positive_int, make_generator
from ._tensors import Array, as_tensor, levels_tensor, quantiles_tensor, to_output

__all__ = ["conformal_sets", "linearized_probabilities", "prediction_sets", "sampled_probabilities"]


def sampled_probabilities(logit_samples: Array) -> Array:
    """Posterior predictive class probabilities: the softmax averaged over S weight samples.

    Parameters
    ----------
    logit_samples : shape (S, n, C)

    Returns
    -------
    probs : shape (n, C)
    """
    x, was_numpy = as_tensor("logit_samples", logit_samples)
    if x.ndim < 2:
        raise ValueError(f"logit_samples must have shape (S, n, C), got {tuple(x.shape)}.")
    return to_output(torch.softmax(x, -1).mean(0), was_numpy)


def linearized_probabilities(mean_logits: Array, cov: Array, method: str = "probit", n_samples: int = 1000,
                             generator=None) -> Array:
    """Class probabilities under the linearised logit Gaussian N(μ, Σ) (chapter, "The Predictive").

    Parameters
    ----------
    mean_logits : shape (n, C)
        μ = f(x; θ0).
    cov : shape (n, C, C) or (n, C)
        Σ = J Σ_θ Jᵀ, or only its diagonal (enough for ``method="probit"``; "mc" then samples
        independent logits).
    method : {"probit", "mc"}, default="probit"
        "probit": softmax(μ / sqrt(1 + π/8 · diag Σ)). "mc": the softmax averaged over ``n_samples``
        logit draws from N(μ, Σ) (Σ may be singular: a low-rank posterior gives rank ≤ d).
    n_samples : int, default=1000
        Monte Carlo draws ("mc" only).
    generator : torch.Generator, int, numpy Generator or None
        Seeds the Monte Carlo draws.

    Returns
    -------
    probs : shape (n, C)
    """
    method = check_choice("method", method, ("probit", "mc"))
    mu, was_numpy = as_tensor("mean_logits", mean_logits)
    S, _ = as_tensor("cov", cov)
    S = S.to(mu.dtype)
    if mu.ndim < 1:
        raise ValueError("mean_logits must have shape (n, C).")
    full = S.ndim == mu.ndim + 1
    C = mu.shape[-1]
    if S.shape != (mu.shape + (C,) if full else mu.shape):
        raise ValueError(
            f"cov must have shape {tuple(mu.shape) + (C,)} (full) or {tuple(mu.shape)} (diagonal) for mean_logits "
            f"of shape {tuple(mu.shape)}, got {tuple(S.shape)}."
        )
    diag = torch.diagonal(S, dim1=-2, dim2=-1) if full else S
    if bool((diag < 0).any()):
        raise ValueError(f"the logit variances must be >= 0, got a minimum of {float(diag.min()):.3e}.")
    if method == "probit":
        return to_output(torch.softmax(mu / torch.sqrt(1.0 + math.pi / 8.0 * diag), -1), was_numpy)
    n_samples = check_positive_int("n_samples", n_samples)
    gen = make_generator(generator, mu.device)
    eps = torch.randn((n_samples,) + tuple(mu.shape), generator=gen, dtype=mu.dtype, device=mu.device)
    if full:
        w, V = torch.linalg.eigh(0.5 * (S + S.transpose(-1, -2)))
        root = V * w.clamp_min(0).sqrt().unsqueeze(-2)  # Σ = root rootᵀ
        draws = mu + torch.einsum("...ij,s...j->s...i", root, eps)
    else:
        draws = mu + eps * diag.sqrt()
    return to_output(torch.softmax(draws, -1).mean(0), was_numpy)


def _probs_tensor(probs) -> tuple[torch.Tensor, bool]:
    """``probs`` as a floating tensor with a class axis, and whether it came as numpy.

    Parameters
    ----------
    probs : array-like of shape (n, C)

    Returns
    -------
    p : torch.Tensor
    was_numpy : bool
    """
    p, was_numpy = as_tensor("probs", probs)
    if p.ndim < 1:
        raise ValueError("probs must have shape (n, C).")
    return p, was_numpy


def prediction_sets(probs: Array, confidence_levels) -> Array:
    """Smallest sets of classes (by descending probability) whose total probability reaches each level.

    Every set holds at least one class (the most probable one). Ties are broken by class index.

    Parameters
    ----------
    probs : shape (n, C)
        Class probabilities (rows sum to 1).
    confidence_levels : float or sequence of float

    Returns
    -------
    sets : bool, shape (n, C, k)

    Examples
    --------
    >>> import numpy as np
    >>> prediction_sets(np.array([[0.1, 0.6, 0.3]]), [0.5, 0.85])[0].T
    array([[False,  True, False],
           [False,  True,  True]])
    """
    p, was_numpy = _probs_tensor(probs)
    if bool((p < 0).any()) or not torch.allclose(p.sum(-1), torch.ones((), dtype=p.dtype, device=p.device), atol=1e-3):
        raise ValueError("probs must be probabilities (>= 0, summing to 1 over the last axis); pass softmax outputs, "
                         "not logits.")
    _, levels = levels_tensor(confidence_levels, p)
    sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_p, -1) - sorted_p  # mass of the classes ranked above each one
    tol = p.shape[-1] * torch.finfo(p.dtype).eps
    keep_sorted = before.unsqueeze(-1) < levels - tol  # (*b, C, k): rank r joins while the mass so far is short
    sets = torch.zeros_like(keep_sorted)
    sets.scatter_(-2, order.unsqueeze(-1).expand_as(keep_sorted), keep_sorted)
    return to_output(sets, was_numpy)


def conformal_sets(probs: Array, thresholds) -> Array:
    """Split-conformal prediction sets for the LAC score 1 − p_y: {c : 1 − p_c ≤ q_k} per level.

    Parameters
    ----------
    probs : shape (n, C)
        Class probabilities.
    thresholds : shape (k,)
        Conformal quantiles of the calibration scores 1 − p_y (e.g. from
        :func:`glas_sklearn.calibration.conformal_quantile`); ≥ 1 (or +inf) gives every class.

    Returns
    -------
    sets : bool, shape (n, C, k)
        A set may be empty (when no class is probable enough); coverage holds on average all the same.

    Examples
    --------
    >>> import numpy as np
    >>> conformal_sets(np.array([[0.1, 0.6, 0.3]]), [0.5, 0.75])[0].T
    array([[False,  True, False],
           [False,  True,  True]])
    """
    p, was_numpy = _probs_tensor(probs)
    q = quantiles_tensor(thresholds, p, "thresholds")
    if q.ndim != 1:
        raise ValueError(f"thresholds must have shape (k,), got {tuple(q.shape)}.")
    sets = (1.0 - p).unsqueeze(-1) <= q
    return to_output(sets, was_numpy)
