"""Predictive distributions from posterior samples or linearised moments (SPEC "Predictions").

Pure tensor functions with no knowledge of the model: regression intervals (sampled quantiles or Gaussian
linearised intervals), class probabilities (averaged softmax, Monte Carlo or probit over a logit Gaussian),
prediction sets, and their empirical coverage and size.

Shapes (MAPIE-style, the level axis is always kept, k = number of confidence levels):
regression outputs (n, M) give intervals (n, M, 2, k) with [..., 0, :] the lower and [..., 1, :] the upper
bound; logits (n, C) give probabilities (n, C) and prediction sets (n, C, k). Any number of leading batch
axes is allowed in place of n (e.g. (n, T, M) for sequences). Functions accept torch tensors or numpy arrays
and return the same kind (torch results stay on the input's device); coverage and size summaries are
float64 numpy arrays of shape (k,).
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np
import torch
from scipy.stats import norm

from ._checks import (
    check_choice,
    check_confidence_levels,
    check_positive_float,
    check_positive_int,
    make_generator,
)

__all__ = [
    "interval_coverage",
    "linearized_interval",
    "linearized_probabilities",
    "mean_interval_width",
    "mean_set_size",
    "prediction_sets",
    "sampled_interval",
    "sampled_probabilities",
    "set_coverage",
]

Array = Union[torch.Tensor, np.ndarray]


# ----------------------------------------------------------------------------- helpers


def _as_tensor(name: str, x, *, floating: bool = True) -> tuple[torch.Tensor, bool]:
    """(tensor, came_from_numpy). Floating inputs keep their dtype; integers become float64 when asked."""
    was_numpy = not isinstance(x, torch.Tensor)
    if was_numpy:
        try:
            arr = np.asarray(x)
            x = torch.as_tensor(arr if arr.flags.writeable else arr.copy())
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a torch.Tensor or a numeric array, got {type(x).__name__}.") from err
    if floating:
        if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)):
            raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}.")
        if not x.is_floating_point():
            x = x.to(torch.float64)
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or infinite values.")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}).")
    return x, was_numpy


def _out(x: torch.Tensor, to_numpy: bool):
    return x.detach().cpu().numpy() if to_numpy else x


def _levels_tensor(confidence_levels, like: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    levels = check_confidence_levels(confidence_levels)
    return levels, torch.as_tensor(levels, dtype=like.dtype, device=like.device)


def _quantiles(sorted_samples: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Quantiles along axis 0 of sorted samples, linear interpolation (numpy's default); shape (len(q), ...)."""
    S = sorted_samples.shape[0]
    pos = q * (S - 1)
    lo = pos.floor().long().clamp(0, S - 1)
    hi = (lo + 1).clamp(max=S - 1)
    frac = (pos - lo.to(pos.dtype)).reshape(-1, *([1] * (sorted_samples.ndim - 1)))
    a, b = sorted_samples[lo], sorted_samples[hi]
    return a + frac * (b - a)


# -------------------------------------------------------------------------- regression


def sampled_interval(samples: Array, confidence_levels, noise_var: float = 0.0,
                     random_state=None) -> tuple[Array, Array]:
    """Central intervals from the sample quantiles γ/2 and 1 − γ/2 (sampled Laplace, eq. 43–44).

    Parameters
    ----------
    samples : tensor or array of shape (S, n, M)
        Network outputs at S posterior weight samples (any trailing shape (S, *b) works).
    confidence_levels : float or sequence of float
        Levels 1 − γ in (0, 1).
    noise_var : float, default=0.0
        σ² > 0 adds independent N(0, σ²) noise to every sample before taking the quantiles, giving an
        interval for y rather than for f. The noise is drawn from a torch Generator seeded by
        ``random_state`` (same seed, same noise).
    random_state : int, numpy Generator, torch.Generator or None

    Returns
    -------
    mean : shape (n, M)
        The sample mean of the network outputs (without noise).
    bounds : shape (n, M, 2, k)
        Lower (``[..., 0, :]``) and upper (``[..., 1, :]``) bounds per level.

    Examples
    --------
    >>> import numpy as np
    >>> mean, bounds = sampled_interval(np.arange(101.0).reshape(101, 1, 1), [0.5, 0.9])
    >>> bounds[0, 0]
    array([[25.,  5.],
           [75., 95.]])
    """
    x, was_numpy = _as_tensor("samples", samples)
    if x.ndim < 2:
        raise ValueError(f"samples must have shape (S, n, ...) with S samples first, got {tuple(x.shape)}.")
    _, levels = _levels_tensor(confidence_levels, x)
    noise_var = check_positive_float("noise_var", noise_var, allow_zero=True)
    mean = x.mean(0)
    if noise_var > 0:
        gen = make_generator(random_state, x.device)
        x = x + math.sqrt(noise_var) * torch.randn(x.shape, generator=gen, dtype=x.dtype, device=x.device)
    gamma = 1.0 - levels
    q = torch.cat([gamma / 2, 1.0 - gamma / 2])
    qs = _quantiles(torch.sort(x, dim=0).values, q)  # (2k, *b)
    k = levels.shape[0]
    bounds = torch.stack([qs[:k], qs[k:]], 0)  # (2, k, *b)
    bounds = torch.movedim(torch.movedim(bounds, 0, -1), 0, -1)  # (*b, 2, k)
    return _out(mean, was_numpy), _out(bounds, was_numpy)


def linearized_interval(mean: Array, variance: Array, confidence_levels, noise_var: float = 0.0) -> Array:
    """Gaussian intervals mean ± z_{1−γ/2} sqrt(variance + noise_var) (linearised Laplace, eq. 45–46).

    z is the exact normal quantile (1.96 for 95 %); the paper's ±2σ_f is a rounding of it.

    Parameters
    ----------
    mean : shape (n, M)
        f(x; θ0).
    variance : shape (n, M)
        σ_f²(x) ≥ 0 (e.g. ``ActiveSubspacePosterior.linearized_variance``).
    confidence_levels : float or sequence of float
    noise_var : float, default=0.0
        σ² added to the variance for an interval for y rather than for f.

    Returns
    -------
    bounds : shape (n, M, 2, k)

    Examples
    --------
    >>> import numpy as np
    >>> linearized_interval(np.zeros((1, 1)), np.ones((1, 1)), 0.95).round(3)
    array([[[[-1.96],
             [ 1.96]]]])
    """
    mu, was_numpy = _as_tensor("mean", mean)
    var, _ = _as_tensor("variance", variance)
    var = var.to(mu.dtype)
    if var.shape != mu.shape:
        raise ValueError(f"mean has shape {tuple(mu.shape)} but variance has shape {tuple(var.shape)}; they must match.")
    if bool((var < 0).any()):
        raise ValueError(f"variance must be >= 0, got a minimum of {float(var.min()):.3e}.")
    noise_var = check_positive_float("noise_var", noise_var, allow_zero=True)
    levels, _ = _levels_tensor(confidence_levels, mu)
    z = torch.as_tensor(norm.ppf(0.5 + levels / 2), dtype=mu.dtype, device=mu.device)
    half = (var + noise_var).sqrt().unsqueeze(-1) * z  # (*b, k)
    bounds = torch.stack([mu.unsqueeze(-1) - half, mu.unsqueeze(-1) + half], -2)
    return _out(bounds, was_numpy)


# ----------------------------------------------------------------------- classification


def sampled_probabilities(logit_samples: Array) -> Array:
    """Posterior predictive class probabilities: the softmax averaged over S weight samples.

    Parameters
    ----------
    logit_samples : shape (S, n, C)

    Returns
    -------
    probs : shape (n, C)
    """
    x, was_numpy = _as_tensor("logit_samples", logit_samples)
    if x.ndim < 2:
        raise ValueError(f"logit_samples must have shape (S, n, C), got {tuple(x.shape)}.")
    return _out(torch.softmax(x, -1).mean(0), was_numpy)


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
    mu, was_numpy = _as_tensor("mean_logits", mean_logits)
    S, _ = _as_tensor("cov", cov)
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
        return _out(torch.softmax(mu / torch.sqrt(1.0 + math.pi / 8.0 * diag), -1), was_numpy)
    n_samples = check_positive_int("n_samples", n_samples)
    gen = make_generator(generator, mu.device)
    eps = torch.randn((n_samples,) + tuple(mu.shape), generator=gen, dtype=mu.dtype, device=mu.device)
    if full:
        w, V = torch.linalg.eigh(0.5 * (S + S.transpose(-1, -2)))
        root = V * w.clamp_min(0).sqrt().unsqueeze(-2)  # Σ = root rootᵀ
        draws = mu + torch.einsum("...ij,s...j->s...i", root, eps)
    else:
        draws = mu + eps * diag.sqrt()
    return _out(torch.softmax(draws, -1).mean(0), was_numpy)


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
    p, was_numpy = _as_tensor("probs", probs)
    if p.ndim < 1:
        raise ValueError("probs must have shape (n, C).")
    if bool((p < 0).any()) or not torch.allclose(p.sum(-1), torch.ones((), dtype=p.dtype, device=p.device), atol=1e-3):
        raise ValueError("probs must be probabilities (>= 0, summing to 1 over the last axis); pass softmax outputs, not logits.")
    _, levels = _levels_tensor(confidence_levels, p)
    sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_p, -1) - sorted_p  # mass of the classes ranked above each one
    tol = p.shape[-1] * torch.finfo(p.dtype).eps
    keep_sorted = before.unsqueeze(-1) < levels - tol  # (*b, C, k): rank r joins while the mass so far is short
    sets = torch.zeros_like(keep_sorted)
    sets.scatter_(-2, order.unsqueeze(-1).expand_as(keep_sorted), keep_sorted)
    return _out(sets, was_numpy)


# ----------------------------------------------------------------------------- summaries


def _bounds_check(bounds) -> torch.Tensor:
    b, _ = _as_tensor("bounds", bounds)
    if b.ndim < 2 or b.shape[-2] != 2:
        raise ValueError(f"bounds must have shape (n, M, 2, k) (lower/upper on axis -2), got {tuple(b.shape)}.")
    return b


def interval_coverage(y: Array, bounds: Array) -> np.ndarray:
    """Fraction of the targets inside their intervals, per level: mean of 1[lower ≤ y ≤ upper].

    Parameters
    ----------
    y : shape (n, M) (or (n,) with bounds (n, 2, k))
    bounds : shape (n, M, 2, k)

    Returns
    -------
    ndarray of shape (k,)
        Coverage over all n·M entries (each output coordinate counts as one record).

    Examples
    --------
    >>> import numpy as np
    >>> b = np.array([[[0.0], [1.0]], [[0.0], [1.0]]])  # two records, [0, 1] intervals, one level
    >>> interval_coverage(np.array([0.5, 2.0]), b)
    array([0.5])
    """
    b = _bounds_check(bounds)
    t, _ = _as_tensor("y", y)
    t = t.to(device=b.device, dtype=b.dtype)
    if t.shape != b.shape[:-2]:
        if t.ndim == 1 and b.shape[:-2] == t.shape + (1,):
            t = t.unsqueeze(-1)
        else:
            raise ValueError(f"y has shape {tuple(t.shape)} but bounds has shape {tuple(b.shape)}; "
                             f"expected y of shape {tuple(b.shape[:-2])}.")
    t = t.unsqueeze(-1)
    inside = (b[..., 0, :] <= t) & (t <= b[..., 1, :])
    return inside.reshape(-1, b.shape[-1]).to(torch.float64).mean(0).cpu().numpy()


def mean_interval_width(bounds: Array) -> np.ndarray:
    """Mean interval width (upper − lower) per level; shape (k,)."""
    b = _bounds_check(bounds)
    return (b[..., 1, :] - b[..., 0, :]).reshape(-1, b.shape[-1]).to(torch.float64).mean(0).cpu().numpy()


def _sets_check(sets) -> torch.Tensor:
    s, _ = _as_tensor("sets", sets, floating=False)
    if s.dtype != torch.bool or s.ndim < 2:
        raise ValueError(f"sets must be a boolean array of shape (n, C, k), got dtype {s.dtype} and shape {tuple(s.shape)}.")
    return s


def set_coverage(labels: Array, sets: Array) -> np.ndarray:
    """Fraction of the true labels inside their prediction sets, per level; shape (k,).

    Parameters
    ----------
    labels : int, shape (n,)
        Class indices 0 … C−1.
    sets : bool, shape (n, C, k)
    """
    s = _sets_check(sets)
    lab, _ = _as_tensor("labels", labels, floating=False)
    if lab.is_floating_point():
        if not bool((lab == lab.round()).all()):
            raise ValueError("labels must be integer class indices 0 … C−1.")
        lab = lab.long()
    lab = lab.to(device=s.device, dtype=torch.long)
    C = s.shape[-2]
    if lab.shape != s.shape[:-2]:
        raise ValueError(f"labels has shape {tuple(lab.shape)} but sets has shape {tuple(s.shape)}; "
                         f"expected labels of shape {tuple(s.shape[:-2])}.")
    if bool(((lab < 0) | (lab >= C)).any()):
        raise ValueError(f"labels must be class indices between 0 and {C - 1}, got values from "
                         f"{int(lab.min())} to {int(lab.max())}.")
    idx = lab.unsqueeze(-1).unsqueeze(-1).expand(*lab.shape, 1, s.shape[-1])
    hit = torch.gather(s, -2, idx).squeeze(-2)
    return hit.reshape(-1, s.shape[-1]).to(torch.float64).mean(0).cpu().numpy()


def mean_set_size(sets: Array) -> np.ndarray:
    """Mean number of classes per prediction set, per level; shape (k,)."""
    s = _sets_check(sets)
    return s.sum(-2).reshape(-1, s.shape[-1]).to(torch.float64).mean(0).cpu().numpy()
