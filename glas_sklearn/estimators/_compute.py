"""Where and how the estimators compute: the :class:`Compute` settings (device, dtype, torch threads, prediction
memory, the padding token), predictions in chunks of rows within ``working_memory`` (:class:`ChunkedPredictions`),
the checks of non-finite network outputs that name the rows, and the fit's closing line with its threads."""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.base import BaseEstimator

from .._constraints import NO_VALIDATION, Interval, Options
from .._functional import model_outputs
from ..ensemble import NetworkEnsemble
from ..posterior import memory_budget
from ._training import trainable_dtype

__all__ = ["DTYPES", "ChunkedPredictions", "Compute", "check_network_outputs", "fit_line", "working_memory_bytes"]

#: The ``dtype`` names → torch dtypes.
DTYPES = {"float32": torch.float32, "float64": torch.float64}
# Rows per forward pass when the fit rows' outputs are checked.
_CHECK_ROWS = 1024
# Bytes per network output that a prediction holds at once per sample.
_BYTES_PER_OUTPUT = 32


def _rows_text(rows: np.ndarray) -> str:
    shown = ", ".join(str(int(r)) for r in rows[:10])
    return f"rows [{shown}{', …' if len(rows) > 10 else ''}]"


def _write_rows(whole, part, start: int, n: int):
    """Write a chunk's result (a tensor, or a tuple of tensors and None) at rows ``start:`` of the result over all
    ``n`` rows, allocated on the first chunk (small results kept apart between the chunks' large temporaries
    would fragment the C heap)."""
    if isinstance(part, tuple):
        whole = (None,) * len(part) if whole is None else whole
        return tuple(_write_rows(w, p, start, n) for w, p in zip(whole, part, strict=True))
    if part is None:
        return None
    if whole is None:
        whole = torch.empty((n, *part.shape[1:]), dtype=part.dtype, device=part.device)
    whole[start:start + part.shape[0]] = part
    return whole


class Compute(BaseEstimator):
    """Where and how the estimators compute: device, dtype, torch threads, prediction memory, and the padding token
    of integer sequences. Pass it as ``compute=Compute(...)``; its parameters are reached as ``compute__dtype``.

    Parameters
    ----------
    device : "auto" or str, default="auto"
        "auto": where a prefit module lives, else CUDA when available, else CPU.
    dtype : {"auto", "float32", "float64"}, default="auto"
        The floating dtype of the network, the curvature and the posterior. "auto": the dtype of a prefit module's
        trainable parameters (never cast; with mixed precisions the widest), float32 for a network built here.
    n_threads : "auto", int or None, default="auto"
        torch's intra-op thread count while the estimator's methods run, restored afterwards. "auto": one thread
        per whole 2²⁶ of trainable weights × rows of a training batch, never more than torch's own count; None
        leaves torch's setting alone. The setting is process-wide while a call runs.
    working_memory : float, default=64
        MiB that prediction may hold at once for its temporaries: rows are predicted in chunks sized to it. The
        results do not depend on it.
    padding_idx : int, optional
        The token id that pads integer sequences ``X`` (n, T) on the right: the mask of a module taking an
        ``attention_mask``, and at predict time sequences of another length are padded or cut to the fitted one.
    """

    _parameter_constraints: dict = {
        "device": NO_VALIDATION,  # checked when resolved (torch parses it)
        "dtype": [Options("auto", *DTYPES)],
        "n_threads": [Options("auto"), None, Interval(numbers.Integral, 1, None)],
        "working_memory": [Interval(numbers.Real, 0, None, closed="neither")],
        "padding_idx": [None, Interval(numbers.Integral, 0, None)],
    }

    def __init__(self, device="auto", dtype="auto", n_threads="auto", working_memory=64, padding_idx=None):
        self.device = device
        self.dtype = dtype
        self.n_threads = n_threads
        self.working_memory = working_memory
        self.padding_idx = padding_idx

    def thread_count(self, fitted: int | None) -> int | None:
        """torch's intra-op threads for a call: the given count, None (torch's setting left alone), or for "auto"
        the count the last fit chose (``fitted``; one before fit)."""
        n = self.n_threads
        if n is None or (isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1):
            return n
        return fitted or 1

    def threads_text(self, n: int | None) -> str:
        """The fit lines' account of the ``n`` threads, e.g. "1 torch thread (auto)"."""
        if n is None:
            return "torch's own thread count"
        how = "auto" if isinstance(self.n_threads, str) else "n_threads"
        return f"{n} torch thread{'s' if n != 1 else ''} ({how})"

    def resolve_device(self, prefit_module, owner: str) -> torch.device:
        """``device`` as a torch device; "auto" is where a prefit module lives, else CUDA when available, else CPU."""
        if self.device == "auto":
            params = [] if prefit_module is None else list(prefit_module.parameters())
            if params:  # a prefit module stays where it is
                return params[0].device
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"{owner}: device {self.device!r} is not a torch device.") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{owner}: device={self.device!r} but CUDA is not available; use device='cpu' or 'auto'.")
        return device

    def resolve_dtype(self, prefit_module, owner: str) -> torch.dtype:
        """``dtype`` as a torch dtype; "auto" follows a prefit module's trainable parameters, else float32."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        weights_dtype = None if prefit_module is None else trainable_dtype(prefit_module)
        if weights_dtype is None:
            return torch.float32
        if weights_dtype not in DTYPES.values():
            raise ValueError(f"{owner}: the prefit module's parameters are {weights_dtype}; the posterior needs "
                             "float32 or float64 weights (cast a copy of the module, e.g. net.float()).")
        return weights_dtype


def working_memory_bytes(compute: Compute | None, owner: str) -> float:
    """``compute__working_memory`` in bytes (it may be set after fit with ``set_params``, so it is checked when
    used)."""
    wm = (compute or Compute()).working_memory
    if isinstance(wm, bool) or not isinstance(wm, (int, float, np.integer, np.floating)) or not wm > 0:
        raise ValueError(f"{owner}: compute__working_memory must be a number of MiB > 0 (e.g. 64), got {wm!r}.")
    return float(wm) * 2**20


def check_network_outputs(module, data, *, prefit: bool, loss_curve, owner: str) -> None:
    """The network's outputs at θ0 on the training and calibration rows of ``data`` are finite; else an error naming
    the rows (positions in the ``X`` or ``X_cal`` passed to fit) and the cause, before the curvature is built."""
    split = data.train_indices is not None
    for X, where, positions, kind in ((data.Xt, "X", data.train_indices, "training"),
                                      (data.Xc, "X" if split else "X_cal", data.calibration_indices, "calibration")):
        out = model_outputs(module, X, batch_size=_CHECK_ROWS)
        bad = np.flatnonzero((~torch.isfinite(out)).reshape(len(out), -1).any(1).cpu().numpy())
        if bad.size == 0:
            continue
        rows = bad if positions is None else np.sort(positions[bad])
        if prefit:
            cause = ("the prefit module returns NaN or inf there, so neither its predictions nor their "
                     "uncertainty are defined. Check those rows (values far outside the network's training range, "
                     "missing values encoded as numbers) and the module's forward (a log, sqrt or division of its "
                     "input)")
        else:
            last = f" (the training loss ends at {loss_curve[-1]:.4g})" if loss_curve else ""
            cause = (f"after training{last}: the training diverged or overflowed; lower lr, standardise X, or "
                     "use dtype='float64'")
        raise ValueError(f"{owner}: the network's outputs are non-finite (NaN or inf) on {len(rows)} of the "
                         f"{len(X)} {kind} rows, {_rows_text(rows)} of {where}: {cause}.")


@dataclass
class ChunkedPredictions:
    """Predictions of a fitted posterior over chunks of rows, each within a memory budget.

    Parameters
    ----------
    posterior : ActiveSubspacePosterior
        The fitted posterior (its network at θ0 names the rows where the outputs are not finite).
    predictive : PredictiveMode
        How the predictive is formed (it says how many values a row holds per output).
    n_samples : int
        Posterior samples of the sampled predictive.
    working_memory : float
        Bytes the prediction may hold at once: half for the results, half for the posterior's chunks.
    owner : str
        The estimator's name in messages.
    """

    posterior: object
    predictive: object
    n_samples: int
    working_memory: float
    owner: str

    def bytes_per_row(self, n_outputs: int, activations: int = 0) -> int:
        """Bytes a prediction holds per row at once: the outputs per sample (sampled) or the Jacobian projections
        and their float64 products (linearised), plus ``activations`` (of one row's forward pass) twice."""
        values = self.predictive.values_per_output(self.n_samples, self.posterior.max_components)
        return _BYTES_PER_OUTPUT * values * max(1, n_outputs) + 2 * activations

    def activation_bytes_per_row(self, Xt: torch.Tensor) -> int:
        """The bytes one more row adds to the tensors a forward pass keeps for its backward pass (two forwards on 2
        and 4 rows, under ``saved_tensors_hooks``)."""
        if Xt.shape[0] < 4:
            return 0
        fm = self.posterior.functional_model
        leaves = {n: p.detach().requires_grad_() for n, p in fm.params0.items()}
        sizes = []
        for rows in (2, 4):
            total = 0

            def pack(t):
                nonlocal total
                total += t.numel() * t.element_size()
                return t

            with fm.autodiff(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fm(Xt[:rows], leaves)
            sizes.append(total)
        return max(0, (sizes[1] - sizes[0]) // 2)

    def run(self, Xt, n_outputs: int, predict: Callable, *, finite: Callable, as_input: Callable):
        """``predict(rows)`` over chunks of the rows of ``Xt`` (a tensor, or validated rows that ``as_input`` turns
        into input tensors chunk by chunk), each within the budget, their results written into arrays allocated
        once. Where ``finite(result)`` is not finite, the error names the rows and whether the network itself or
        the posterior's samples are at fault."""
        budget = int(self.working_memory) // 2  # half for the results, half for the posterior's chunks
        as_input = (lambda rows: rows) if isinstance(Xt, torch.Tensor) else as_input
        activations = self.activation_bytes_per_row(as_input(Xt[:4])) if Xt.shape[0] > _CHECK_ROWS else 0
        size = max(1, budget // self.bytes_per_row(n_outputs, activations))
        whole = None
        with memory_budget(budget, max(activations, 256)), self._released_cache():
            for start in range(0, Xt.shape[0], size):
                rows = as_input(Xt[start:start + size])
                try:
                    result = predict(rows)
                except (ValueError, RuntimeError) as err:
                    self.raise_if_network_nonfinite(rows, start, Xt.shape[0], cause=err)
                    raise
                check = finite(result)
                if not bool(torch.isfinite(check).all()):
                    self.raise_if_network_nonfinite(rows, start, Xt.shape[0])
                    bad = np.flatnonzero((~torch.isfinite(check)).reshape(len(check), -1).any(1).cpu().numpy())
                    raise ValueError(
                        f"{self.owner}: the predictive is non-finite (NaN or inf) on {_rows_text(bad + start)} of X, "
                        "although the network's outputs at its trained weights are finite there: the posterior's "
                        "weight samples make the network overflow on them. Use posterior__predictive='linearized', "
                        "a smaller sigma0, or compute__dtype='float64'.")
                whole = _write_rows(whole, result, start, Xt.shape[0])
        return whole

    def check_finite_rows(self, values: torch.Tensor, Xt: torch.Tensor) -> None:
        """Refuse non-finite ``values`` (rows first) predicted for the rows ``Xt``, naming the rows and the cause."""
        ok = torch.isfinite(values).reshape(len(values), -1).all(1)
        if not bool(ok.all()):
            self.raise_if_network_nonfinite(Xt, 0, Xt.shape[0])
            bad = np.flatnonzero((~ok).cpu().numpy())
            raise ValueError(f"{self.owner}: the posterior's draws are non-finite (NaN or inf) on {_rows_text(bad)} of "
                             "X, although the network's outputs at its trained weights are finite there: the weight "
                             "samples make the network overflow on them. Use a smaller sigma0, or "
                             "compute__dtype='float64'.")

    @contextlib.contextmanager
    def _released_cache(self):
        """The posterior's cache of the last rows' Jacobian quantities is dropped when the prediction is done."""
        try:
            yield
        finally:
            self.posterior.release_cache()

    def raise_if_network_nonfinite(self, rows: torch.Tensor, start: int, n: int, cause=None) -> None:
        """Raise the error naming the rows (positions in X) where the network's output at θ0 is not finite."""
        try:
            with memory_budget(int(self.working_memory)):
                out = self.posterior.predict_mean(rows, batch_size=_CHECK_ROWS)
        except Exception:  # noqa: BLE001 - the network cannot be evaluated at all: the original error stands
            if cause is None:
                raise
            return
        bad = np.flatnonzero((~torch.isfinite(out)).reshape(len(out), -1).any(1).cpu().numpy())
        if bad.size:
            raise ValueError(
                f"{self.owner}: the network's outputs are non-finite (NaN or inf) on {_rows_text(bad + start)} of X "
                f"({n} rows): the network returns NaN or inf there at its trained weights, so neither the prediction "
                "nor its uncertainty is defined. Check those rows (values far outside the training range, missing "
                "values encoded as numbers) and the module's forward (a log, sqrt or division of its input).") \
                from cause


def fit_line(owner: str, seconds: float, module, *, prefit: bool, n_weights: int, epochs: int, rows, posterior: str,
             d: int, calibration: str, classification: bool, levels, n_calibration_rows: int, threads: str) -> str:
    """The closing line of ``fit``, e.g. "LaplaceActiveSubspaceRegressor: fitted in 15.2 s: trained the network
    (2,951 weights) for 500 epochs on 696 rows; posterior low_rank, d = 50; mondrian intervals at 90 % from 78
    calibration rows; 1 torch thread (auto)"."""
    what = "prediction sets" if classification else "intervals"
    if prefit:
        network = f"used the prefit network ({n_weights:,} trainable weights) as it is"
    elif isinstance(module, NetworkEnsemble):
        network = (f"trained {len(module.members)} networks ({n_weights:,} weights), the first for {epochs} epochs, "
                   f"on {rows:,} rows")
    else:
        network = f"trained the network ({n_weights:,} weights) for {epochs} epochs on {rows:,} rows"
    shown = ", ".join(f"{100 * float(v):g} %" for v in levels)
    return (f"{owner}: fitted in {seconds:.1f} s: {network}; posterior {posterior}, d = {d}; {calibration} {what} at "
            f"{shown} from {n_calibration_rows} calibration rows; {threads}")
