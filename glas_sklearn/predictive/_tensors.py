"""Tensor plumbing shared by the predictive modules: inputs as tensors, levels, quantiles, noise variances.

Shapes follow :mod:`glas_sklearn.predictive` (the level axis last; any leading batch axes).
"""

from __future__ import annotations

import numbers
from typing import Union

import numpy as np
import torch

from .._checks import check_confidence_levels

__all__ = ["Array", "as_tensor", "levels_tensor", "noise_variance", "quantiles_tensor", "sorted_quantiles", "to_output"]

Array = Union[torch.Tensor, np.ndarray]


def as_tensor(name: str, x, *, floating: bool = True) -> tuple[torch.Tensor, bool]:
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


def to_output(x: torch.Tensor, to_numpy: bool):
    return x.detach().cpu().numpy() if to_numpy else x


def levels_tensor(confidence_levels, like: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    levels = check_confidence_levels(confidence_levels)
    return levels, torch.as_tensor(levels, dtype=like.dtype, device=like.device)


def sorted_quantiles(sorted_samples: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Quantiles along axis 0 of sorted samples, linear interpolation (numpy's default); shape (len(q), ...)."""
    S = sorted_samples.shape[0]
    pos = q * (S - 1)
    lo = pos.floor().long().clamp(0, S - 1)
    hi = (lo + 1).clamp(max=S - 1)
    frac = (pos - lo.to(pos.dtype)).reshape(-1, *([1] * (sorted_samples.ndim - 1)))
    a, b = sorted_samples[lo], sorted_samples[hi]
    return a + frac * (b - a)


def noise_variance(noise_var, like: torch.Tensor) -> torch.Tensor | None:
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

def quantiles_tensor(quantiles, like: torch.Tensor, name: str) -> torch.Tensor:
    """Conformal quantiles of shape (k,) or (k, M) as a tensor like ``like``; +inf is allowed, NaN and < 0 are not."""
    q = torch.as_tensor(np.asarray(quantiles, dtype=np.float64), dtype=like.dtype, device=like.device)
    if q.ndim == 0:
        q = q.reshape(1)
    if q.ndim not in (1, 2) or q.numel() == 0:
        raise ValueError(f"{name} must have shape (k,) or (k, M), got {tuple(q.shape)}.")
    if bool(torch.isnan(q).any()) or bool((q < 0).any()):
        raise ValueError(f"{name} must be >= 0 (+inf allowed), got {q.cpu().numpy()!r}.")
    return q
