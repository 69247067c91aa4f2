"""Predictive distributions from posterior samples or linearised moments (paper eqs. 43–46).

Tensor functions with no knowledge of the model: regression intervals (sampled quantiles or Gaussian
linearised intervals), class probabilities (averaged softmax, Monte Carlo or probit over a logit Gaussian),
prediction sets, and their empirical coverage and size. On top of them, the predictive of a posterior at a
subspace dimension d that calibration and the estimators' predictions share (:func:`regression_moments`,
:func:`predictive_interval`, :func:`class_probabilities`).

Users score intervals with :mod:`glas_sklearn.metrics` (``coverage_score``, ``mean_width_score``,
``interval_score``: scikit-learn's ``(y_true, y_pis)`` convention, checked inputs, float results).
``interval_coverage`` and ``mean_interval_width`` here are the library's internal tensor versions (tensors
stay on their device, bounds (n, M, 2, k), no checks beyond shapes) on which calibration and those metrics
are built; they are not part of ``__all__``.

Shapes (MAPIE-style, the level axis is always kept, k = number of confidence levels):
regression outputs (n, M) give intervals (n, M, 2, k) with [..., 0, :] the lower and [..., 1, :] the upper
bound; logits (n, C) give probabilities (n, C) and prediction sets (n, C, k). Any number of leading batch
axes is allowed in place of n (e.g. (n, T, M) for sequences). Functions accept torch tensors or numpy arrays
and return the same kind (torch results stay on the input's device); coverage and size summaries are
float64 numpy arrays of shape (k,).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, NamedTuple, Union

import numpy as np
import torch
from scipy.stats import norm

from ._checks import (
    check_choice,
    check_confidence_levels,
    check_positive_int,
    make_generator,
    numpy_rng,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .posterior import ActiveSubspacePosterior

__all__ = [
    "RegressionMoments",
    "class_probabilities",
    "conformal_interval",
    "conformal_sets",
    "linearized_interval",
    "linearized_probabilities",
    "mean_set_size",
    "prediction_sets",
    "predictive_interval",
    "regression_moments",
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


def _noise_variance(noise_var, like: torch.Tensor) -> torch.Tensor | None:
    """σ² as a tensor broadcasting over the last (output) axis of ``like``; None when it is zero.

    ``noise_var`` is a number, or one number per output (shape (M,), matching ``like.shape[-1]``).
    """
    arr = np.asarray(noise_var, dtype=object)
    ok = arr.ndim in (0, 1) and arr.size > 0 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in arr.ravel())
    if ok:
        arr = arr.astype(np.float64)
        ok = bool(np.all(np.isfinite(arr)) and np.all(arr >= 0))
    if not ok:
        raise ValueError(f"noise_var must be a finite number >= 0 or one such number per output, got {noise_var!r}.")
    if arr.ndim == 1 and arr.shape[0] != like.shape[-1]:
        raise ValueError(f"noise_var has {arr.shape[0]} entries, but the outputs have M={like.shape[-1]} "
                         "(last axis); give one variance per output or a single number.")
    if not np.any(arr > 0):
        return None
    return torch.as_tensor(arr, dtype=like.dtype, device=like.device)


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
    x, was_numpy = _as_tensor("samples", samples)
    if x.ndim < 2:
        raise ValueError(f"samples must have shape (S, n, ...) with S samples first, got {tuple(x.shape)}.")
    _, levels = _levels_tensor(confidence_levels, x)
    noise = _noise_variance(noise_var, x)
    mean = x.mean(0)
    gamma = 1.0 - levels
    q = torch.cat([gamma / 2, 1.0 - gamma / 2])
    if noise is None:
        qs = _quantiles(torch.sort(x, dim=0).values, q)  # (2k, *b)
    else:
        qs = _mixture_quantiles(x, noise, q)
    k = levels.shape[0]
    bounds = torch.stack([qs[:k], qs[k:]], 0)  # (2, k, *b)
    bounds = torch.movedim(torch.movedim(bounds, 0, -1), 0, -1)  # (*b, 2, k)
    return _out(mean, was_numpy), _out(bounds, was_numpy)


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
    mu, was_numpy = _as_tensor("mean", mean)
    var, _ = _as_tensor("variance", variance)
    var = var.to(mu.dtype)
    if var.shape != mu.shape:
        raise ValueError(f"mean has shape {tuple(mu.shape)} but variance has shape {tuple(var.shape)}; "
                         "they must match.")
    if bool((var < 0).any()):
        raise ValueError(f"variance must be >= 0, got a minimum of {float(var.min()):.3e}.")
    noise = _noise_variance(noise_var, mu)
    if noise is not None:
        var = var + noise
    levels, _ = _levels_tensor(confidence_levels, mu)
    z = torch.as_tensor(norm.ppf(0.5 + levels / 2), dtype=mu.dtype, device=mu.device)
    half = var.sqrt().unsqueeze(-1) * z  # (*b, k)
    bounds = torch.stack([mu.unsqueeze(-1) - half, mu.unsqueeze(-1) + half], -2)
    return _out(bounds, was_numpy)


def _quantiles_tensor(quantiles, like: torch.Tensor, name: str) -> torch.Tensor:
    """Conformal quantiles of shape (k,) or (k, M) as a tensor like ``like``; +inf is allowed, NaN and < 0 are not."""
    q = torch.as_tensor(np.asarray(quantiles, dtype=np.float64), dtype=like.dtype, device=like.device)
    if q.ndim == 0:
        q = q.reshape(1)
    if q.ndim not in (1, 2) or q.numel() == 0:
        raise ValueError(f"{name} must have shape (k,) or (k, M), got {tuple(q.shape)}.")
    if bool(torch.isnan(q).any()) or bool((q < 0).any()):
        raise ValueError(f"{name} must be >= 0 (+inf allowed), got {q.cpu().numpy()!r}.")
    return q


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
    mu, was_numpy = _as_tensor("mean", mean)
    sd, _ = _as_tensor("std", std)
    sd = sd.to(mu.dtype)
    if sd.shape != mu.shape:
        raise ValueError(f"mean has shape {tuple(mu.shape)} but std has shape {tuple(sd.shape)}; they must match.")
    if bool((sd < 0).any()):
        raise ValueError(f"std must be >= 0, got a minimum of {float(sd.min()):.3e}.")
    q = _quantiles_tensor(quantiles, mu, "quantiles")
    if q.ndim == 2 and q.shape[1] not in (1, mu.shape[-1]):
        raise ValueError(f"quantiles has {q.shape[1]} columns, but the outputs have M={mu.shape[-1]}.")
    q = q.T if q.ndim == 2 else q  # (M, k) or (k,)
    half = sd.unsqueeze(-1) * q  # (*b, k); 0 · inf is not an issue: std > 0 wherever it matters
    half = torch.where(torch.isinf(q) & (sd.unsqueeze(-1) == 0), torch.full_like(half, float("inf")), half)
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
    p, was_numpy = _as_tensor("probs", probs)
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
    _, levels = _levels_tensor(confidence_levels, p)
    sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_p, -1) - sorted_p  # mass of the classes ranked above each one
    tol = p.shape[-1] * torch.finfo(p.dtype).eps
    keep_sorted = before.unsqueeze(-1) < levels - tol  # (*b, C, k): rank r joins while the mass so far is short
    sets = torch.zeros_like(keep_sorted)
    sets.scatter_(-2, order.unsqueeze(-1).expand_as(keep_sorted), keep_sorted)
    return _out(sets, was_numpy)


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
    q = _quantiles_tensor(thresholds, p, "thresholds")
    if q.ndim != 1:
        raise ValueError(f"thresholds must have shape (k,), got {tuple(q.shape)}.")
    sets = (1.0 - p).unsqueeze(-1) <= q
    return _out(sets, was_numpy)


# ----------------------------------------------------------------------------- summaries


def _mean_per_level(values: torch.Tensor) -> np.ndarray:
    """Mean over every axis but the last (the levels), in float64.

    Parameters
    ----------
    values : torch.Tensor of shape (..., k)
        Per-record values (hits, widths, set sizes) at k levels.

    Returns
    -------
    ndarray of shape (k,)
    """
    return values.reshape(-1, values.shape[-1]).to(torch.float64).mean(0).cpu().numpy()


def _bounds_check(bounds) -> torch.Tensor:
    b, _ = _as_tensor("bounds", bounds)
    if b.ndim < 2 or b.shape[-2] != 2:
        raise ValueError(f"bounds must have shape (n, M, 2, k) (lower/upper on axis -2), got {tuple(b.shape)}.")
    return b


def interval_coverage(y: Array, bounds: Array) -> np.ndarray:
    """Fraction of the targets inside their intervals, per level: mean of 1[lower ≤ y ≤ upper].

    Internal tensor version, used by calibration; users call :func:`glas_sklearn.metrics.coverage_score`,
    which validates its inputs and calls this.

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
    return _mean_per_level(inside)


def mean_interval_width(bounds: Array) -> np.ndarray:
    """Mean interval width (upper − lower) per level; shape (k,).

    Internal tensor version, used by calibration; users call :func:`glas_sklearn.metrics.mean_width_score`.
    """
    b = _bounds_check(bounds)
    return _mean_per_level(b[..., 1, :] - b[..., 0, :])


def _sets_check(sets) -> torch.Tensor:
    s, _ = _as_tensor("sets", sets, floating=False)
    if s.dtype != torch.bool or s.ndim < 2:
        raise ValueError(f"sets must be a boolean array of shape (n, C, k), got dtype {s.dtype} and shape "
                         f"{tuple(s.shape)}.")
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
    return _mean_per_level(hit)


def mean_set_size(sets: Array) -> np.ndarray:
    """Mean number of classes per prediction set, per level; shape (k,)."""
    s = _sets_check(sets)
    return _mean_per_level(s.sum(-2))


# ------------------------------------------------------------------ a posterior's predictive at d


class RegressionMoments(NamedTuple):
    """Predictive mean ŷ and standard deviation σ̂ of a regression posterior, each of shape ``(n, *out)``."""

    mean: torch.Tensor
    std: torch.Tensor


def _regression_predictive(posterior, X, d, predictive, n_samples, noise_var, random_state, batch_size):
    """(mean, variance with ``noise_var`` added, samples or None) of the posterior at d."""
    predictive = check_choice("predictive", predictive, ("sampled", "linearized"))
    samples = None
    if predictive == "sampled":
        samples = posterior.predict_samples(X, d, n_samples=n_samples, random_state=random_state,
                                            batch_size=batch_size)
        mean, var = samples.mean(0), samples.var(0, unbiased=False)
    else:
        mean = posterior.predict_mean(X, batch_size=batch_size)
        var = posterior.linearized_variance(X, d, batch_size=batch_size).clamp_min(0)
    noise = np.asarray(noise_var, dtype=np.float64)
    if np.any(noise != 0):
        var = var + torch.as_tensor(noise, dtype=var.dtype, device=var.device)
    return mean, var, samples


def regression_moments(posterior: ActiveSubspacePosterior, X: torch.Tensor, d: int, *,
                       predictive: str = "linearized", n_samples: int = 1000, noise_var=0.0, random_state=None,
                       batch_size: int | None = None) -> RegressionMoments:
    """Predictive mean ŷ and standard deviation σ̂ = sqrt(σ_f² + σ²) of a regression posterior at dimension d.

    Sampled: the mean and (population) variance of the S network outputs at the posterior samples (common
    to all rows: seeded by ``random_state``). Linearised: f(x; θ0) and J Σ Jᵀ's diagonal. ``noise_var`` σ²
    (one value or one per output) is added to the variance: the σ̂ of intervals for y.

    Returns
    -------
    RegressionMoments
        ``(mean, std)``, torch tensors of shape ``(n, *out)``.
    """
    mean, var, _ = _regression_predictive(posterior, X, d, predictive, n_samples, noise_var, random_state,
                                          batch_size)
    return RegressionMoments(mean, var.sqrt())


def predictive_interval(posterior: ActiveSubspacePosterior, X: torch.Tensor, d: int, confidence_levels=None, *,
                        predictive: str = "linearized", n_samples: int = 1000, noise_var=0.0, random_state=None,
                        batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The posterior's own predictive at d: :func:`regression_moments` and, for ``confidence_levels``, its
    central intervals (:func:`sampled_interval` of the samples, or :func:`linearized_interval`).

    Returns
    -------
    mean, std : torch.Tensor of shape ``(n, *out)``
    bounds : torch.Tensor of shape ``(n, *out, 2, k)``, or None without ``confidence_levels``
    """
    mean, var, samples = _regression_predictive(posterior, X, d, predictive, n_samples, noise_var, random_state,
                                                batch_size)
    bounds = None
    if confidence_levels is not None:
        if samples is not None:
            _, bounds = sampled_interval(samples, confidence_levels, noise_var=noise_var)
        else:  # var already holds the noise
            bounds = linearized_interval(mean, var, confidence_levels)
    return mean, var.sqrt(), bounds


def class_probabilities(posterior: ActiveSubspacePosterior, X: torch.Tensor, d: int, *,
                        predictive: str = "sampled", n_samples: int = 1000, random_state=None,
                        linearized_method: str = "probit", batch_size: int | None = None) -> torch.Tensor:
    """Class probabilities (n, C) of a classification posterior at dimension d: the softmax averaged over
    posterior samples (seeded by ``random_state``), or the linearised logit Gaussian pushed through the
    softmax (probit, or Monte Carlo with the full C × C logit covariance)."""
    predictive = check_choice("predictive", predictive, ("sampled", "linearized"))
    linearized_method = check_choice("linearized_method", linearized_method, ("probit", "mc"))
    if predictive == "sampled":
        return sampled_probabilities(posterior.predict_samples(X, d, n_samples=n_samples, random_state=random_state,
                                                               batch_size=batch_size))
    mean = posterior.predict_mean(X, batch_size=batch_size)
    cov = posterior.linearized_variance(X, d, full_cov=linearized_method == "mc", batch_size=batch_size)
    gen = None if random_state is None else int(numpy_rng(random_state).integers(0, 2**62)) + 1
    return linearized_probabilities(mean, cov, method=linearized_method, n_samples=n_samples, generator=gen)
