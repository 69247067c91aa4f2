"""The pieces of the training loop (:func:`~glas_sklearn.training.loop.run`): the batches of an epoch, the seeded
global RNG, per-row losses, the held-out loss of a module, early stopping on held-out losses."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.func import vmap

__all__ = ["PATIENCE_STEPS", "HeldOutStopping", "batch_slices", "held_out_loss", "patience_epochs", "per_row_losses",
           "seeded_torch"]

#: Early stopping's patience is ``n_iter_no_change`` epochs of at least this many optimizer steps each.
PATIENCE_STEPS = 50


@contextlib.contextmanager
def seeded_torch(seed: int, device: torch.device):
    """The global torch RNG seeded from ``seed`` inside the block (for weight initialisation and layers such
    as dropout that draw from it), and restored on exit: results depend on ``random_state`` only, and the
    caller's global RNG state is left as it was."""
    devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def per_row_losses(loss: Callable, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """ℓ_i of every row, (n,): the mean loss evaluated on each row as a batch of one (vectorised with vmap)."""
    return vmap(lambda out, target: loss(out.unsqueeze(0), target.unsqueeze(0)))(outputs, targets)


def held_out_loss(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable,
                  sample_weight: torch.Tensor | None = None, chunk: int = 4096, switch: bool = True) -> float:
    """The (weighted) mean of ``loss`` over the rows of (X, y), evaluated in eval mode without gradients, in
    chunks of rows; with ``sample_weight`` Σ_i w_i ℓ_i / Σ_i w_i (ℓ_i by vmap on each row). ``switch=False``: in the
    module's mode as it is (for a module that computes the same in both)."""
    was_training = module.training
    if switch:
        module.eval()
    total, weight = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, X.shape[0], chunk):
            out, target = module(X[i:i + chunk]), y[i:i + chunk]
            if sample_weight is None:
                total += float(loss(out, target)) * out.shape[0]
                weight += out.shape[0]
            else:
                w = sample_weight[i:i + chunk]
                total += float((w * per_row_losses(loss, out, target).to(w.dtype)).sum())
                weight += float(w.sum())
    if switch:
        module.train(was_training)
    return total / weight


def batch_slices(n: int, size: int) -> list[slice]:
    """Slices of ``size`` consecutive rows covering n rows; a last batch of one row is merged into the one before
    it (layers such as BatchNorm cannot train on a batch of one row), so no batch has one row unless n = 1 or
    ``size`` = 1."""
    size = max(1, min(size, n))
    starts = list(range(0, n, size))
    if size > 1 and len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, [*starts[1:], n], strict=True)]


def patience_epochs(n_iter_no_change: int, steps_per_epoch: int) -> int:
    """Early stopping's patience in epochs: ``n_iter_no_change`` epochs of at least ``PATIENCE_STEPS`` optimizer
    steps each (short epochs count for less: on small data the loss can rest on a plateau for hundreds of steps
    before it falls again)."""
    return max(n_iter_no_change, -(-n_iter_no_change * PATIENCE_STEPS // steps_per_epoch))


class HeldOutStopping:
    """Early stopping on a held-out loss, as scikit-learn's ``MLPRegressor(early_stopping=True)``: an epoch improves
    when its loss is below the best so far by more than ``tol`` (relative); training stops after ``patience``
    epochs in a row without an improvement, and not before the epoch is ``patience_ratio`` times the best one."""

    def __init__(self, tol: float, patience: int, patience_ratio: float = 0.0) -> None:
        self.tol, self.patience, self.patience_ratio = tol, patience, patience_ratio
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.no_change, self.epoch = 0, 0

    def observe(self, score: float, epoch: int) -> bool:
        """Record the held-out loss of ``epoch`` (1-based); True when it is the lowest so far (weights to keep)."""
        best, self.epoch = self.best, epoch
        self.no_change = 0 if best is None or score < best - self.tol * abs(best) else self.no_change + 1
        if best is None or score < best:
            self.best, self.best_epoch = score, epoch
            return True
        return False

    @property
    def stop(self) -> bool:
        """Whether training stops after the epoch observed last."""
        return self.no_change >= self.patience and self.epoch >= self.patience_ratio * self.best_epoch

    def reason(self) -> str:
        """Why it stopped, one clause."""
        return f"the held-out loss did not improve by more than tol={self.tol:g} (relative) for {self.no_change} epochs"

    def kept(self) -> str:
        """The clause appended to a stop reason: the epoch whose weights were kept."""
        return f"; kept the weights of epoch {self.best_epoch} (held-out loss {self.best:.4g})"
