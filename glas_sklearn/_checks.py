"""Argument checks shared by the library's modules (one place, reused everywhere)."""

from __future__ import annotations

import numbers

import numpy as np
import torch

__all__ = [
    "can_stratify",
    "check_choice",
    "check_class_labels",
    "check_target_bounds",
    "check_confidence_levels",
    "check_finite_tensor",
    "check_positive_float",
    "check_positive_int",
    "check_sample_weight",
    "normalized_sample_weight",
    "check_vector",
    "clip_to_bounds",
    "make_generator",
    "numpy_rng",
]


def check_choice(name: str, value, choices) -> str:
    """Raise a ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}.")
    return value


def check_class_labels(y, owner: str) -> None:
    """Raise a ValueError, naming the kinds found and the fix, when class labels mix text and numbers (``["a", 1]``):
    such labels have no order, so neither ``classes_`` nor the label encoding is defined."""
    values = np.asarray(y, dtype=object).reshape(-1)
    kinds = {}
    for value in values.tolist():
        kind = ("text" if isinstance(value, (str, bytes)) else "number" if isinstance(value, numbers.Number)
                else type(value).__name__)
        kinds.setdefault(kind, value)
    if len(kinds) > 1:
        found = ", ".join(f"{kind} (e.g. {example!r})" for kind, example in sorted(kinds.items()))
        raise ValueError(f"{owner}: y mixes class labels of different kinds: {found}. Labels of one kind are needed "
                         "to order the classes: convert them all to strings (np.asarray(y).astype(str)) or all to "
                         "numbers.")


def check_positive_int(name: str, value, *, allow_none: bool = False, minimum: int = 1):
    """Check that ``value`` is an integer ≥ ``minimum`` (or None when allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def check_finite_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Raise a ValueError when a floating tensor holds NaN or infinity."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(tensor.shape)}); at least one record is needed.")
    if (tensor.is_floating_point() or tensor.is_complex()) and not _all_finite(tensor):
        bad = int(sum(int((~torch.isfinite(part)).sum()) for part in _row_blocks(tensor)))
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s); clean or impute them first.")
    return tensor


# Entries checked at once by check_finite_tensor (its temporaries are a few times this many bytes, whatever the size
# or memory layout of the tensor: a large weight matrix is not duplicated to be checked).
_FINITE_BLOCK = 1 << 22


def _row_blocks(tensor: torch.Tensor):
    if tensor.ndim == 0:
        return [tensor]
    rows = max(1, _FINITE_BLOCK // max(1, tensor[0].numel()))
    return [tensor[i:i + rows] for i in range(0, tensor.shape[0], rows)]


def _all_finite(tensor: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(part).all()) for part in _row_blocks(tensor))


def check_vector(name: str, v: torch.Tensor, size: int, dtype: torch.dtype, device: torch.device,
                 *, allow_matrix: bool = True) -> torch.Tensor:
    """Check a vector of length ``size`` (or a ``size × k`` block) against an operator's dtype/device."""
    if not isinstance(v, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor on {device} with dtype {dtype}, got {type(v).__name__}; "
            "use .to_scipy() for numpy arrays."
        )
    if v.dtype != dtype:
        raise TypeError(f"{name} has dtype {v.dtype}, but the operator works in {dtype}; convert it with .to({dtype}).")
    if v.device != device:
        raise ValueError(f"{name} is on {v.device}, but the operator lives on {device}; move it with .to('{device}').")
    ok_ndim = (1, 2) if allow_matrix else (1,)
    if v.ndim not in ok_ndim or v.shape[0] != size:
        expected = f"({size},)" + (f" or ({size}, k)" if allow_matrix else "")
        raise ValueError(f"{name} has shape {tuple(v.shape)}, expected {expected}.")
    return v


def numpy_rng(random_state) -> np.random.Generator:
    """A numpy Generator from None, an int, a Generator or a RandomState."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    if random_state is None or isinstance(random_state, numbers.Integral):
        return np.random.default_rng(random_state)
    raise ValueError(f"random_state must be None, an int or a numpy Generator, got {random_state!r}.")


def make_generator(random_state, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch Generator on ``device`` seeded from ``random_state`` (None → fresh entropy)."""
    if isinstance(random_state, torch.Generator):
        return random_state
    seed = int(numpy_rng(random_state).integers(0, 2**63 - 1))
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def check_positive_float(name: str, value, *, allow_zero: bool = False) -> float:
    """Check that ``value`` is a finite real number > 0 (≥ 0 with ``allow_zero``); return it as a float."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = np.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}.")
    return value


def check_confidence_levels(confidence_levels) -> np.ndarray:
    """Confidence level(s) 1 − γ as a float64 array of shape (k,), each strictly between 0 and 1.

    A single number gives k = 1: the level axis is always kept.
    """
    levels = np.atleast_1d(np.asarray(confidence_levels, dtype=object))
    try:
        if levels.ndim != 1 or levels.size == 0 or any(v is None or isinstance(v, (bool, str)) for v in levels):
            raise TypeError
        levels = levels.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            "confidence_levels must be a number or a non-empty 1-D sequence of numbers in (0, 1), "
            f"got {confidence_levels!r}."
        ) from None
    bad = ~((levels > 0) & (levels < 1))
    if bad.any():
        raise ValueError(
            f"confidence_levels must lie strictly between 0 and 1 (e.g. 0.9 for 90 % intervals), "
            f"got {levels[bad].tolist()}."
        )
    return levels


def check_sample_weight(sample_weight, n_rows: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """Record weights for ``n_rows`` rows as a float64 tensor on ``device`` (None stays None).

    Accepts a torch tensor or array-like of shape (n_rows,) of finite, non-negative numbers, at least one of them
    positive; anything else raises a ValueError (a TypeError for non-numeric input) that says what to pass.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, torch.Tensor):
        w = sample_weight.detach()
        if w.is_complex() or w.dtype == torch.bool:
            raise TypeError(f"sample_weight must hold real numbers, got a tensor of dtype {w.dtype}.")
        w = w.to(device=device, dtype=torch.float64)
    else:
        try:
            w = torch.as_tensor(np.asarray(sample_weight, dtype=np.float64), device=device)
        except (TypeError, ValueError) as err:
            raise TypeError(f"sample_weight must be an array of numbers, got {type(sample_weight).__name__}.") from err
    if w.ndim != 1 or w.shape[0] != n_rows:
        raise ValueError(f"sample_weight has shape {tuple(w.shape)}, but there are {n_rows} rows: pass one weight per "
                         f"row, shape ({n_rows},).")
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"sample_weight contains {int((~torch.isfinite(w)).sum())} NaN or infinite value(s); "
                         "weights must be finite.")
    if bool((w < 0).any()):
        raise ValueError(f"sample_weight contains {int((w < 0).sum())} negative value(s); weights must be >= 0.")
    if not bool((w > 0).any()):
        raise ValueError("sample_weight is zero for every row; at least one row needs a positive weight.")
    return w


def normalized_sample_weight(sample_weight, n_rows: int, owner: str) -> np.ndarray:
    """``sample_weight`` for ``n_rows`` rows checked (finite, non-negative, not all zero: else a ValueError naming
    the rows and the fix) and divided by the mean of its positive entries, in float64: weights of any scale
    (1e-50, 1e300) give the fit of their normalised version, which no float32 computation over- or underflows."""
    try:
        w = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{owner}: sample_weight must be an array of numbers, got "
                        f"{type(sample_weight).__name__}.") from err
    if w.ndim == 0:  # one weight for every row, as scikit-learn takes it
        w = np.full(n_rows, float(w))
    if w.ndim != 1 or w.shape[0] != n_rows:
        raise ValueError(f"{owner}: sample_weight has shape {w.shape}, but X has {n_rows} rows: pass one weight per "
                         f"row, shape ({n_rows},).")
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.size:
        raise ValueError(f"{owner}: sample_weight holds {bad.size} NaN or infinite value(s) (rows "
                         f"{bad[:5].tolist()}{' ...' if bad.size > 5 else ''}); weights must be finite numbers >= 0.")
    bad = np.flatnonzero(w < 0)
    if bad.size:
        raise ValueError(f"{owner}: sample_weight holds {bad.size} negative value(s) (rows {bad[:5].tolist()}"
                         f"{' ...' if bad.size > 5 else ''}); weights must be >= 0 (0 drops a row).")
    positive = w[w > 0]
    if positive.size == 0:
        raise ValueError(f"{owner}: sample_weight is zero for every row; at least one row needs a positive weight.")
    top = positive.max()
    scaled = w / top  # in [0, 1]: the mean below neither overflows (1e308) nor loses the small ones (1e-300)
    return scaled / scaled[w > 0].mean()


def check_target_bounds(y_bounds, y: np.ndarray, name: str = "y") -> np.ndarray:
    """The support of the targets as an (n_outputs, 2) float array of [low, high] (−inf / +inf for no bound).

    ``y_bounds`` is None (no bounds), one ``(low, high)`` pair for every output, or a sequence of one pair per
    output, ``None`` on a side without a bound. Raises a ValueError that says what to pass when it is none of
    these, when low ≥ high, or when a target of ``y`` (n_samples,) or (n_samples, n_outputs) lies outside.
    """
    n_outputs = 1 if y.ndim == 1 else y.shape[1]
    bounds = np.tile([-np.inf, np.inf], (n_outputs, 1))
    if y_bounds is None:
        return bounds
    pairs = y_bounds
    if isinstance(y_bounds, (tuple, list)) and len(y_bounds) == 2 and all(
            side is None or (isinstance(side, numbers.Real) and not isinstance(side, bool)) for side in y_bounds):
        pairs = [y_bounds] * n_outputs
    usage = ("y_bounds must be None, a (low, high) pair of numbers or None (no bound on that side), or one such pair "
             f"per output ({n_outputs} here), e.g. y_bounds=(0, None) for targets that cannot be negative")
    if not isinstance(pairs, (tuple, list)) or len(pairs) != n_outputs:
        raise ValueError(f"{usage}; got {y_bounds!r}.")
    for k, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(
                side is None or (isinstance(side, numbers.Real) and not isinstance(side, bool)) for side in pair):
            raise ValueError(f"{usage}; got {y_bounds!r}.")
        low = -np.inf if pair[0] is None else float(pair[0])
        high = np.inf if pair[1] is None else float(pair[1])
        if np.isnan(low) or np.isnan(high) or not low < high:
            raise ValueError(f"y_bounds needs low < high, got ({pair[0]!r}, {pair[1]!r})"
                             + (f" for output {k}" if n_outputs > 1 else "") + ".")
        bounds[k] = low, high
    Y = y.reshape(len(y), -1)
    outside = (Y < bounds[:, 0]) | (Y > bounds[:, 1])
    if outside.any():
        k = int(np.nonzero(outside.any(axis=0))[0][0])
        raise ValueError(f"{int(outside.sum())} value(s) of {name} lie outside y_bounds "
                         f"[{bounds[k, 0]:g}, {bounds[k, 1]:g}]" + (f" (output {k})" if n_outputs > 1 else "")
                         + f", e.g. {Y[outside[:, k], k][0]:g}: the bounds must hold for every target; widen them "
                         "or pass y_bounds=None.")
    return bounds


def clip_to_bounds(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``values`` of shape (n_samples, n_outputs, ...) clipped into their output's [low, high] (``bounds``
    (n_outputs, 2), as :func:`check_target_bounds` returns): a prediction, or interval end points, in the
    targets' support. Clipping an interval to the support keeps every target it covered covered and never
    widens it."""
    shape = (1, -1) + (1,) * (values.ndim - 2)
    return np.clip(values, bounds[:, 0].reshape(shape), bounds[:, 1].reshape(shape))


def can_stratify(y, n_held: int) -> bool:
    """Whether a split of the labels ``y`` holding out ``n_held`` rows can be stratified: two rows of every class and
    room for every class on both sides."""
    _, counts = np.unique(y, return_counts=True)
    return counts.min() >= 2 and len(counts) <= min(n_held, len(y) - n_held)
