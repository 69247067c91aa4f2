"""Regression intervals from posterior samples or linearised moments (paper eqs. 43–46), and split-conformal ones.

:func:`sampled_interval` (sample quantiles, or the exact quantiles of the Gaussian mixture of samples plus noise),
:func:`linearized_interval` (mean ± z σ) and :func:`conformal_interval` (ŷ ± q σ̂). Bounds have shape (n, M, 2, k).
"""

from __future__ import annotations

import math

import torch
from scipy.stats import norm

from ._tensors import Array, as_tensor, levels_tensor, noise_variance, quantiles_tensor, sorted_quantiles, to_output

__all__ = ["conformal_interval", "linearized_interval", "sampled_interval"]


def _mixture_quantiles(samples: torch.Tensor, noise_var: torch.Tensor, q: torch.Tensor,
                       max_elements: int = 2**23) -> torch.Tensor:
    """Quantiles of the Gaussian mixture (1/S) Σ_s N(f_s, σ²): the predictive of y = f(x; θ) + ε.

    ``samples`` ``(S, *b)``; ``noise_var`` broadcasts over b (zero entries give the plain sample quantile's
    step-function limit, handled by a tiny floor); ``q`` (r,). Returns ``(r, *b)``. The CDF is monotone and
    bracketed by min_s f_s + σ z_q ≤ t ≤ max_s f_s + σ z_q, so a safeguarded Newton iteration converges
    in a few steps; rows are processed in chunks of at most ``max_elements`` mixture terms. The CDF is
    evaluated in the samples' precision (float32 samples: ``|F(t) − q|`` ≤ 1e-6; float64: ≤ 1e-12).
    """
    x = samples if samples.dtype in (torch.float32, torch.float64) else samples.to(torch.float64)
    tol = 1e-12 if x.dtype == torch.float64 else 1e-6
    S = x.shape[0]
    batch = x.shape[1:]
    flat = x.reshape(S, -1)  # (S, B)
    sd = torch.broadcast_to(noise_var.to(x.dtype), batch).reshape(-1).sqrt()  # (B,)
    sd = sd.clamp_min(torch.finfo(x.dtype).eps * float(flat.abs().max().clamp_min(1.0)))
    qd = q.to(x.dtype)
    z = torch.special.ndtri(qd.double()).to(x.dtype)  # (r,)
    r = qd.shape[0]
    out = torch.empty(r, flat.shape[1], dtype=x.dtype, device=x.device)
    chunk = max(1, max_elements // max(1, S * r))
    inv_sqrt_2pi = 1.0 / math.sqrt(2.0 * math.pi)
    eps, tiny = torch.finfo(x.dtype).eps, torch.finfo(x.dtype).tiny
    for start in range(0, flat.shape[1], chunk):
        f = flat[:, start:start + chunk]  # (S, c)
        c = f.shape[1]
        # one root-finding problem per (quantile, column), flattened to P = r·c; solved ones drop out
        col = torch.arange(c, device=x.device).repeat(r)  # (P,)
        target = qd.repeat_interleave(c)
        s = sd[start:start + chunk][col]
        zq = z.repeat_interleave(c)
        lo = f.min(0).values[col] + s * zq
        hi = f.max(0).values[col] + s * zq
        # start from the moment-matched Gaussian, clipped into the bracket
        t = f.mean(0)[col] + torch.sqrt(f.var(0, unbiased=False)[col] + s**2) * zq
        t = torch.minimum(torch.maximum(t, lo), hi)
        active = torch.arange(col.shape[0], device=x.device)
        for _ in range(200):
            ta, sa = t[active], s[active]
            u = (ta[None] - f[:, col[active]]) / sa[None]  # (S, |A|)
            err = torch.special.ndtr(u).mean(0) - target[active]
            pdf = torch.exp(-0.5 * u**2).mean(0) * inv_sqrt_2pi / sa
            la = torch.where(err < 0, ta, lo[active])
            ha = torch.where(err > 0, ta, hi[active])
            lo[active], hi[active] = la, ha
            # Newton while it stays inside the bracket (inclusive: near the root the step rounds onto t),
            # bisection otherwise; the bracket shrinks from both sides, so this always converges.
            step = ta - err / pdf.clamp_min(tiny)
            inside = (step >= la) & (step <= ha) & torch.isfinite(step)
            t_new = torch.where(inside, step, 0.5 * (la + ha))
            solved = (err.abs() <= tol) | ((t_new - ta).abs() <= 8 * eps * (1.0 + ta.abs()))
            t[active] = torch.where(err.abs() <= tol, ta, t_new)
            active = active[~solved]
            if active.numel() == 0:
                break
        out[:, start:start + chunk] = t.reshape(r, c)
    return out.reshape(r, *batch).to(samples.dtype)


def sampled_interval(samples: Array, confidence_levels, noise_var=0.0) -> tuple[Array, Array]:
    """Central intervals from the sample quantiles γ/2 and 1 − γ/2 (sampled Laplace, eq. 43–44).

    Parameters
    ----------
    samples : tensor or array of shape (S, n, M)
        Network outputs at S posterior weight samples (any trailing shape ``(S, *b)`` works).
    confidence_levels : float or sequence of float
        Levels 1 − γ in (0, 1).
    noise_var : float or array of shape (M,), default=0.0
        σ² > 0 gives an interval for y = f + ε, ε ~ N(0, σ²), rather than for f: the quantiles of the
        Gaussian mixture (1/S) Σ_s N(f_s, σ²), computed exactly (no noise is drawn, so the result is
        deterministic and each row's interval depends on that row only). One value per output
        (the last axis) is allowed.

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
    >>> _, b = sampled_interval(np.zeros((10, 1, 1)), 0.95, noise_var=1.0)  # all samples equal: N(0, 1)
    >>> b.round(3)[0, 0, :, 0]
    array([-1.96,  1.96])
    """
    x, was_numpy = as_tensor("samples", samples)
    if x.ndim < 2:
        raise ValueError(f"samples must have shape (S, n, ...) with S samples first, got {tuple(x.shape)}.")
    _, levels = levels_tensor(confidence_levels, x)
    noise = noise_variance(noise_var, x)
    mean = x.mean(0)
    gamma = 1.0 - levels
    q = torch.cat([gamma / 2, 1.0 - gamma / 2])
    if noise is None:
        qs = sorted_quantiles(torch.sort(x, dim=0).values, q)  # (2k, *b)
    else:
        qs = _mixture_quantiles(x, noise, q)
    k = levels.shape[0]
    bounds = torch.stack([qs[:k], qs[k:]], 0)  # (2, k, *b)
    bounds = torch.movedim(torch.movedim(bounds, 0, -1), 0, -1)  # (*b, 2, k)
    return to_output(mean, was_numpy), to_output(bounds, was_numpy)


def linearized_interval(mean: Array, variance: Array, confidence_levels, noise_var=0.0) -> Array:
    """Gaussian intervals mean ± z_{1−γ/2} sqrt(variance + noise_var) (linearised Laplace, eq. 45–46).

    z is the exact normal quantile (1.96 for 95 %); the paper's ±2σ_f is a rounding of it.

    Parameters
    ----------
    mean : shape (n, M)
        f(x; θ0).
    variance : shape (n, M)
        σ_f²(x) ≥ 0 (e.g. ``ActiveSubspacePosterior.linearized_variance``).
    confidence_levels : float or sequence of float
    noise_var : float or array of shape (M,), default=0.0
        σ² added to the variance for an interval for y rather than for f (one value per output allowed).

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
    mu, was_numpy = as_tensor("mean", mean)
    var, _ = as_tensor("variance", variance)
    var = var.to(mu.dtype)
    if var.shape != mu.shape:
        raise ValueError(f"mean has shape {tuple(mu.shape)} but variance has shape {tuple(var.shape)}; "
                         "they must match.")
    if bool((var < 0).any()):
        raise ValueError(f"variance must be >= 0, got a minimum of {float(var.min()):.3e}.")
    noise = noise_variance(noise_var, mu)
    if noise is not None:
        var = var + noise
    levels, _ = levels_tensor(confidence_levels, mu)
    z = torch.as_tensor(norm.ppf(0.5 + levels / 2), dtype=mu.dtype, device=mu.device)
    half = var.sqrt().unsqueeze(-1) * z  # (*b, k)
    bounds = torch.stack([mu.unsqueeze(-1) - half, mu.unsqueeze(-1) + half], -2)
    return to_output(bounds, was_numpy)

def conformal_interval(mean: Array, std: Array, quantiles) -> Array:
    """Split-conformal intervals ŷ ± q_k σ̂ from std-normalised scores (beyond the paper, see the user guide).

    Parameters
    ----------
    mean : shape (n, M)
        ŷ(x).
    std : shape (n, M)
        σ̂(x) > 0, the scale the calibration scores ``|y − ŷ|`` / σ̂ were divided by.
    quantiles : shape (k,) or (k, M)
        One conformal quantile per level (and per output), e.g. from
        :func:`glas_sklearn.calibration.conformal_quantile`; +inf gives an infinite interval.

    Returns
    -------
    bounds : shape (n, M, 2, k)

    Examples
    --------
    >>> import numpy as np
    >>> conformal_interval(np.zeros((1, 1)), np.full((1, 1), 2.0), [1.5])[0, 0, :, 0]
    array([-3.,  3.])
    """
    mu, was_numpy = as_tensor("mean", mean)
    sd, _ = as_tensor("std", std)
    sd = sd.to(mu.dtype)
    if sd.shape != mu.shape:
        raise ValueError(f"mean has shape {tuple(mu.shape)} but std has shape {tuple(sd.shape)}; they must match.")
    if bool((sd < 0).any()):
        raise ValueError(f"std must be >= 0, got a minimum of {float(sd.min()):.3e}.")
    q = quantiles_tensor(quantiles, mu, "quantiles")
    if q.ndim == 2 and q.shape[1] not in (1, mu.shape[-1]):
        raise ValueError(f"quantiles has {q.shape[1]} columns, but the outputs have M={mu.shape[-1]}.")
    q = q.T if q.ndim == 2 else q  # (M, k) or (k,)
    half = sd.unsqueeze(-1) * q  # (*b, k); 0 · inf is not an issue: std > 0 wherever it matters
    half = torch.where(torch.isinf(q) & (sd.unsqueeze(-1) == 0), torch.full_like(half, float("inf")), half)
    bounds = torch.stack([mu.unsqueeze(-1) - half, mu.unsqueeze(-1) + half], -2)
    return to_output(bounds, was_numpy)
