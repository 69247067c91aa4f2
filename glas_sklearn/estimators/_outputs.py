"""What the estimators check about the network's outputs, and how predictions are cut into chunks: the module has
trainable weights, its outputs are finite on the fit rows, non-finite predictions are traced to the network (with
the row indices) or to the posterior's weight samples, and prediction runs in chunks of rows within
``working_memory``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from .._functional import model_outputs
from ..adapters import unwrap_model
from ..posterior import memory_budget

__all__ = ["OutputsMixin"]

# Rows per forward pass when the fit rows' outputs are checked.
_CHECK_ROWS = 1024
# Bytes per network output that a prediction holds at once per sample (the outputs, their sorted copy or squares,
# the quantiles and bounds, the float64 user-unit copies).
_BYTES_PER_OUTPUT = 32


def _rows_text(rows: np.ndarray) -> str:
    shown = ", ".join(str(int(r)) for r in rows[:10])
    return f"rows [{shown}{', …' if len(rows) > 10 else ''}]"


def _write_rows(whole, part, start: int, n: int):
    """Write a chunk's result (a tensor, or a tuple of tensors and None) at rows ``start:`` of the result over all
    ``n`` rows, allocated on the first chunk. Results of the chunks kept as separate small tensors between the
    chunks' large temporaries would fragment the C heap, which then grows with the number of chunks."""
    if isinstance(part, tuple):
        whole = (None,) * len(part) if whole is None else whole
        return tuple(_write_rows(w, p, start, n) for w, p in zip(whole, part, strict=True))
    if part is None:
        return None
    if whole is None:
        whole = torch.empty((n, *part.shape[1:]), dtype=part.dtype, device=part.device)
    whole[start:start + part.shape[0]] = part
    return whole


class OutputsMixin:
    """Checks of the network's outputs and the chunking of predictions (reads ``prefit``, ``module_``,
    ``posterior_``, ``n_samples``, ``predictive_`` and ``working_memory``)."""

    def _check_trainable(self, module: nn.Module) -> None:
        """A module without trainable weights is refused before any training (there is no weight posterior)."""
        if not any(p.requires_grad for p in unwrap_model(module).parameters()):
            what = "" if self.prefit else "there is nothing to train, and "
            raise ValueError(f"{type(self).__name__}: the module {type(unwrap_model(module)).__name__} has no "
                             f"trainable parameters (none with requires_grad=True): {what}the posterior is over the "
                             "trainable weights. Unfreeze the layers whose uncertainty you want "
                             "(p.requires_grad_(True)).")

    def _check_network_outputs(self, Xt: torch.Tensor, Xc: torch.Tensor) -> None:
        """The network's outputs at θ0 on the training and calibration rows are finite; else an error naming the
        rows (positions in the ``X`` or ``X_cal`` passed to fit) and the cause, before the curvature is built."""
        split = getattr(self, "train_indices_", None) is not None
        for X, where, positions in ((Xt, "X", self.train_indices_ if split else None),
                                    (Xc, "X" if split else "X_cal", self.calibration_indices_ if split else None)):
            out = model_outputs(self.module_, X, batch_size=_CHECK_ROWS)
            bad = np.flatnonzero((~torch.isfinite(out)).reshape(len(out), -1).any(1).cpu().numpy())
            if bad.size == 0:
                continue
            rows = bad if positions is None else np.sort(positions[bad])
            kind = "calibration" if X is Xc else "training"
            if self.prefit:
                cause = ("the prefit module returns NaN or inf there, so neither its predictions nor their "
                         "uncertainty are defined. Check those rows (values far outside the network's training range, "
                         "missing values encoded as numbers) and the module's forward (a log, sqrt or division of its "
                         "input)")
            else:
                losses = getattr(self, "training_loss_", None)
                last = f" (the training loss ends at {losses[-1]:.4g})" if losses else ""
                cause = (f"after training{last}: the training diverged or overflowed; lower lr, standardise X, or "
                         "use dtype='float64'")
            raise ValueError(f"{type(self).__name__}: the network's outputs are non-finite (NaN or inf) on "
                             f"{len(rows)} of the {len(X)} {kind} rows, {_rows_text(rows)} of {where}: {cause}.")

    # ------------------------------------------------------------------------------------------- prediction
    def _predict_bytes_per_row(self, n_outputs: int, activations: int = 0) -> int:
        """Bytes a prediction holds per row at once: the outputs per sample (sampled) or the Jacobian projections
        and their float64 products (linearised), plus ``activations`` (of one row's forward pass) twice."""
        M = max(1, n_outputs)
        values = self.predictive_.values_per_output(self.n_samples, self.posterior_.max_components)
        return _BYTES_PER_OUTPUT * values * M + 2 * activations

    def _activation_bytes_per_row(self, Xt: torch.Tensor) -> int:
        """The bytes one more row adds to the tensors a forward pass keeps for its backward pass (two forwards on 2
        and 4 rows, under ``saved_tensors_hooks``): a measure of the network's activations per row."""
        if Xt.shape[0] < 4:
            return 0
        fm = self.posterior_.functional_model
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

    def _predict_in_chunks(self, Xt, n_outputs: int, predict: Callable, *, finite: Callable):
        """``predict(rows)`` over chunks of the rows of ``Xt``, each within ``working_memory`` (the posterior's own
        chunks too), returning their results over all rows (a tensor, or a tuple of tensors and None, as one chunk's
        result; the rows are the first axis), written chunk by chunk into arrays allocated once. ``Xt`` is the
        network's input tensor, or the validated rows as an array (turned into input tensors one chunk at a time).
        ``finite(result)`` is the tensor that must be finite: where it is not, the error names the rows and whether
        the network itself or the posterior's samples are at fault. An error inside ``predict`` caused by
        non-finite network outputs is reported the same way."""
        # half the budget for the rows' results and half for the posterior's evaluations inside a chunk (its own
        # chunks take half of what they are given: see posterior.memory_budget)
        budget = int(self._working_memory_bytes()) // 2
        as_input = (lambda rows: rows) if isinstance(Xt, torch.Tensor) else self._rows_tensor
        activations = self._activation_bytes_per_row(as_input(Xt[:4])) if Xt.shape[0] > _CHECK_ROWS else 0
        size = max(1, budget // self._predict_bytes_per_row(n_outputs, activations))
        whole = None
        with memory_budget(budget, max(activations, 256)), self._released_cache():
            for start in range(0, Xt.shape[0], size):
                rows = as_input(Xt[start:start + size])
                try:
                    result = predict(rows)
                except (ValueError, RuntimeError) as err:
                    self._raise_if_network_nonfinite(rows, start, Xt.shape[0], cause=err)
                    raise
                check = finite(result)
                if not bool(torch.isfinite(check).all()):
                    self._raise_if_network_nonfinite(rows, start, Xt.shape[0])
                    bad = np.flatnonzero((~torch.isfinite(check)).reshape(len(check), -1).any(1).cpu().numpy())
                    raise ValueError(
                        f"{type(self).__name__}: the predictive is non-finite (NaN or inf) on "
                        f"{_rows_text(bad + start)} "
                        "of X, although the network's outputs at its trained weights are finite there: the "
                        "posterior's weight samples make the network overflow on them. Use predictive='linearized', "
                        "a smaller sigma0, or dtype='float64'.")
                whole = _write_rows(whole, result, start, Xt.shape[0])
        return whole

    def _check_finite_rows(self, values: torch.Tensor, Xt: torch.Tensor) -> None:
        """Refuse non-finite ``values`` (rows first, (n, ...)) predicted for the rows ``Xt``, naming the rows and the
        cause (the network at its trained weights, or the posterior's weight samples)."""
        ok = torch.isfinite(values).reshape(len(values), -1).all(1)
        if not bool(ok.all()):
            self._raise_if_network_nonfinite(Xt, 0, Xt.shape[0])
            bad = np.flatnonzero((~ok).cpu().numpy())
            raise ValueError(f"{type(self).__name__}: the posterior's draws are non-finite (NaN or inf) on "
                             f"{_rows_text(bad)} of X, although the network's outputs at its trained weights are "
                             "finite there: the weight samples make the network overflow on them. Use a smaller "
                             "sigma0, or dtype='float64'.")

    @contextlib.contextmanager
    def _released_cache(self):
        """The posterior's cache of the last rows' Jacobian quantities is dropped when the prediction is done (each
        chunk of rows is a new tensor: nothing in it would be reused, and it would hold memory between calls)."""
        try:
            yield
        finally:
            self.posterior_.release_cache()

    def _raise_if_network_nonfinite(self, rows: torch.Tensor, start: int, n: int, cause=None) -> None:
        """Raise the error naming the rows (positions in X) where the network's output at θ0 is not finite."""
        try:
            with memory_budget(int(self._working_memory_bytes())):
                out = self.posterior_.predict_mean(rows, batch_size=_CHECK_ROWS)
        except Exception:  # noqa: BLE001 - the network cannot be evaluated at all: the original error stands
            if cause is None:
                raise
            return
        bad = np.flatnonzero((~torch.isfinite(out)).reshape(len(out), -1).any(1).cpu().numpy())
        if bad.size:
            raise ValueError(
                f"{type(self).__name__}: the network's outputs are non-finite (NaN or inf) on "
                f"{_rows_text(bad + start)} "
                f"of X ({n} rows): the network returns NaN or inf there at its trained weights, so neither the "
                "prediction nor its uncertainty is defined. Check those rows (values far outside the training range, "
                "missing values encoded as numbers) and the module's forward (a log, sqrt or division of its input).") \
                from cause

    def _working_memory_bytes(self) -> float:
        """``working_memory`` in bytes (it may be set after fit with ``set_params``, so it is checked here too)."""
        wm = getattr(self, "working_memory", 64)
        if isinstance(wm, bool) or not isinstance(wm, (int, float, np.integer, np.floating)) or not wm > 0:
            raise ValueError(f"{type(self).__name__}: working_memory must be a number of MiB > 0 (e.g. 64), got "
                             f"{wm!r}.")
        return float(wm) * 2**20
