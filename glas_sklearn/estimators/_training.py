"""The estimators' default network and their training loop (mini-batches, early stopping on held-out rows with
the best weights restored).

Both are private to the estimators: users choose the default network's size through ``module_kwargs``
(``hidden_layer_sizes``, ``activation``), or pass their own module.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import vmap

from .._progress import progress

__all__ = ["ACTIVATIONS", "AUTO_EARLY_STOPPING_ROWS", "AUTO_SUBSAMPLE_ROWS", "OPTIMIZERS", "TrainingResult",
           "auto_batch_size", "auto_lr", "auto_subsample", "batch_slices", "build_optimizer", "default_mlp",
           "held_out_loss", "seeded_torch", "train_module"]

logger = logging.getLogger(__name__)

#: Early stopping's patience is ``n_iter_no_change`` epochs of at least this many optimizer steps each.
PATIENCE_STEPS = 50
#: ``batch_size="auto"``: ⌊n / AUTO_STEPS⌋ rows per batch (about ``AUTO_STEPS`` steps per epoch),
#: within [AUTO_MIN_BATCH, AUTO_MAX_BATCH] and at most n.
AUTO_STEPS, AUTO_MIN_BATCH, AUTO_MAX_BATCH = 20, 64, 200
#: ``batch_size="auto"`` on large data: from AUTO_LARGE_BATCH_ROWS rows trained on, ⌊n / AUTO_LARGE_STEPS⌋ rows per
#: step within [AUTO_MAX_BATCH, AUTO_LARGE_BATCH] (at least AUTO_LARGE_STEPS steps per epoch below 32,768 rows:
#: with 8 steps, batches of 1,024 from 8,192 rows, the network ran out of max_epochs with its held-out loss still
#: falling; docs/user_guide/heteroscedastic.md), with ``lr="auto"`` at AUTO_LARGE_LR for steps of AUTO_LARGE_BATCH.
AUTO_LARGE_BATCH, AUTO_LARGE_BATCH_ROWS, AUTO_LARGE_STEPS = 1024, 8 * 1024, 32
#: ``lr="auto"``: AUTO_LR, or AUTO_LARGE_LR for steps of ≥ AUTO_LARGE_BATCH rows on ≥ AUTO_LARGE_BATCH_ROWS rows.
AUTO_LR, AUTO_LARGE_LR = 1e-3, 3e-3
#: ``early_stopping="auto"`` holds validation rows out from this many training rows on (below, the rows are worth
#: more to the network than a stopping rule: benchmarks/results/default_fit.md).
AUTO_EARLY_STOPPING_ROWS = 2000
#: ``subsample="auto"``: the curvature is built on this many of the training rows when there are more
#: (benchmarks/results/default_fit.md: the interval score unchanged, the curvature 5× cheaper on 40k rows).
AUTO_SUBSAMPLE_ROWS = 10_000
#: Optimizers with a fused implementation in torch (one kernel for the update of all parameters).
_FUSABLE = ("adam", "adamw")


def auto_batch_size(n: int) -> int:
    """The rows per step of ``batch_size="auto"`` for n rows trained on: from ``AUTO_LARGE_BATCH_ROWS`` rows on
    ⌊n / AUTO_LARGE_STEPS⌋ within [AUTO_MAX_BATCH, AUTO_LARGE_BATCH], else ⌊n / AUTO_STEPS⌋ within
    [AUTO_MIN_BATCH, AUTO_MAX_BATCH] (and ≤ n)."""
    if n >= AUTO_LARGE_BATCH_ROWS:
        return int(min(AUTO_LARGE_BATCH, max(AUTO_MAX_BATCH, n // AUTO_LARGE_STEPS)))
    return int(min(n, max(AUTO_MIN_BATCH, min(AUTO_MAX_BATCH, n // AUTO_STEPS))))


def auto_lr(n: int, batch_size: int | None) -> float:
    """The learning rate of ``lr="auto"`` for n rows trained on in steps of ``batch_size`` rows (None: all):
    ``AUTO_LARGE_LR`` for steps of at least ``AUTO_LARGE_BATCH`` rows on at least ``AUTO_LARGE_BATCH_ROWS`` rows
    (larger steps, larger rate), else ``AUTO_LR`` (1e-3, exactly, on every smaller data set)."""
    step = n if batch_size is None else min(batch_size, n)
    return AUTO_LARGE_LR if n >= AUTO_LARGE_BATCH_ROWS and step >= AUTO_LARGE_BATCH else AUTO_LR


def auto_subsample(n: int) -> int | None:
    """The rows the curvature of ``subsample="auto"`` is built on, of n training rows: ``AUTO_SUBSAMPLE_ROWS``
    when there are more, else None (all of them)."""
    return AUTO_SUBSAMPLE_ROWS if n > AUTO_SUBSAMPLE_ROWS else None


ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def default_mlp(n_features: int, n_outputs: int, hidden_layer_sizes: Sequence[int] = (50, 50),
                activation: str = "tanh") -> nn.Module:
    """The default network: a fully connected MLP (two tanh layers of 50, as in the paper).

    Parameters
    ----------
    n_features, n_outputs : int
        Input and output widths.
    hidden_layer_sizes : sequence of int, default=(50, 50)
    activation : {"tanh", "relu", "gelu", "silu"}, default="tanh"

    Returns
    -------
    torch.nn.Sequential
        Linear and activation layers, ending in a linear layer (no output activation).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}.")
    layers, width = [], n_features
    for h in hidden_layer_sizes:
        layers += [nn.Linear(width, int(h)), ACTIVATIONS[activation]()]
        width = int(h)
    layers.append(nn.Linear(width, n_outputs))
    return nn.Sequential(*layers)


@contextlib.contextmanager
def seeded_torch(seed: int, device: torch.device):
    """The global torch RNG seeded from ``seed`` inside the block (for weight initialisation and layers such
    as dropout that draw from it), and restored on exit: results depend on ``random_state`` only, and the
    caller's global RNG state is left as it was."""
    devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def build_optimizer(optimizer, params, *, lr: float, weight_decay: float, fused: bool = False):
    """``optimizer(params, lr=lr, weight_decay=weight_decay)`` for a name of ``OPTIMIZERS`` or an optimizer class;
    with ``fused`` and "adam" / "adamw", torch's fused implementation (the same update, one kernel for all the
    parameters; the for-loop one where torch has no fused kernel for the parameters' device and dtype)."""
    if isinstance(optimizer, str):
        opt_cls = OPTIMIZERS[optimizer]
        if fused and optimizer in _FUSABLE:
            params = list(params)
            try:
                return opt_cls(params, lr=lr, weight_decay=weight_decay, fused=True)
            except (RuntimeError, ValueError, TypeError):  # no fused kernel here: the plain update
                pass
        return opt_cls(params, lr=lr, weight_decay=weight_decay)
    return optimizer(params, lr=lr, weight_decay=weight_decay)


def _per_row_losses(loss: Callable, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """ℓ_i of every row, (n,): the mean loss evaluated on each row as a batch of one (vectorised with vmap)."""
    return vmap(lambda out, target: loss(out.unsqueeze(0), target.unsqueeze(0)))(outputs, targets)


def batch_slices(n: int, size: int) -> list[slice]:
    """Slices of ``size`` consecutive rows covering n rows; a last batch of one row is merged into the one before
    it (layers such as BatchNorm cannot train on a batch of one row), so no batch has one row unless n = 1 or
    ``size`` = 1."""
    size = max(1, min(size, n))
    starts = list(range(0, n, size))
    if size > 1 and len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, [*starts[1:], n], strict=True)]


@dataclass
class TrainingResult:
    """What :func:`train_module` did.

    Attributes
    ----------
    loss_curve : list of float
        The (weighted) mean training loss of each epoch run (over its mini-batches, as the weights moved).
    validation_scores : list of float
        With validation rows: the (weighted) mean held-out loss after each epoch (lower is better); else empty.
    n_iter : int
        Epochs run.
    best_epoch : int or None
        With validation rows: the epoch (1-based) whose weights were kept, the one of the lowest held-out loss.
    stop_reason : str
        Why training stopped, one sentence (also logged).
    """

    loss_curve: list[float] = field(default_factory=list)
    validation_scores: list[float] = field(default_factory=list)
    n_iter: int = 0
    best_epoch: int | None = None
    stop_reason: str = ""

    @property
    def best_validation_score(self) -> float | None:
        """The held-out loss of the weights kept (None without validation rows)."""
        return None if self.best_epoch is None else self.validation_scores[self.best_epoch - 1]


def held_out_loss(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable,
                  sample_weight: torch.Tensor | None = None, chunk: int = 4096) -> float:
    """The (weighted) mean of ``loss`` over the rows of (X, y), evaluated in eval mode without gradients, in
    chunks of rows; with ``sample_weight`` Σ_i w_i ℓ_i / Σ_i w_i (ℓ_i by vmap on each row)."""
    was_training = module.training
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
                total += float((w * _per_row_losses(loss, out, target).to(w.dtype)).sum())
                weight += float(w.sum())
    module.train(was_training)
    return total / weight


def train_module(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable, *, optimizer, lr: float,
                 weight_decay: float, batch_size: int | None, max_epochs: int, seed: int, verbose: int = 0,
                 owner: str = "train_module", sample_weight: torch.Tensor | None = None,
                 validation: tuple | None = None, validation_loss: Callable | None = None,
                 n_iter_no_change: int = 10, tol: float = 1e-4, fused: bool = False) -> TrainingResult:
    """Mini-batch training of ``module`` in place on the mean loss, for at most ``max_epochs`` epochs; with
    ``validation`` rows, stopped early on their loss and left at the weights of its lowest value.

    With ``sample_weight`` the objective is the weighted mean Σ_i w_i ℓ_i / Σ_i w_i: a step minimises the mean
    of (w_i / w̄) ℓ_i over its rows (w̄ the mean weight of all rows), an unbiased estimate of it whose scale
    does not depend on the weights' scale; with all rows in one batch it is the objective itself, so integer
    weights equal repeated rows.

    Early stopping (as scikit-learn's ``MLPRegressor(early_stopping=True)``): after every epoch the held-out
    loss of the validation rows is computed (eval mode, weighted by their weights); an epoch improves when it is
    below the best so far by more than ``tol``; training stops after ``n_iter_no_change`` epochs in a row
    without an improvement, and the weights of the epoch with the lowest held-out loss are restored (its
    parameters and buffers). Without ``validation`` every one of the ``max_epochs`` epochs is run.

    Parameters
    ----------
    module : torch.nn.Module
        The network to train (the estimator's own copy); left in eval mode, without gradients.
    X, y : torch.Tensor
        Inputs and targets on the module's device (the rows trained on).
    loss : callable
        ``loss(outputs, targets)``, the mean over the rows of a batch.
    optimizer : str or torch.optim.Optimizer subclass
        A name from ``OPTIMIZERS`` or an optimizer class, built with ``lr`` and ``weight_decay``
        (:func:`build_optimizer`).
    lr, weight_decay : float
    batch_size : int or None
        Rows per step (None: all rows). A last batch of one row is merged into the batch before it
        (:func:`batch_slices`).
    max_epochs : int
        The most epochs run.
    seed : int
        Seeds the row order of every epoch (``seed``) and the global RNG that layers such as dropout draw
        from (``seed + 1``); the caller's global RNG state is restored.
    verbose : int, default=0
        ≥ 1 shows a progress bar over epochs.
    owner : str
        Named in the error raised when the loss diverges.
    sample_weight : torch.Tensor of shape (n,), optional
        Non-negative row weights on X's device (checked by the caller); each row's loss ℓ_i is computed
        by evaluating ``loss`` on that row alone.
    validation : tuple (X_val, y_val, w_val), optional
        Held-out rows (never trained on) and their weights (None: unweighted) for early stopping.
    validation_loss : callable, optional
        ``validation_loss(outputs, targets)``, the mean held-out loss (default: ``loss``).
    n_iter_no_change : int, default=10
        Epochs without improvement before stopping.
    tol : float, default=1e-4
        The least decrease of the held-out loss that counts as an improvement.
    fused : bool, default=False
        "adam" / "adamw" in torch's fused implementation (:func:`build_optimizer`).

    Returns
    -------
    TrainingResult
        Loss curves, epochs run, the epoch kept and why training stopped.
    """
    result = TrainingResult()
    best_state = None
    no_change = 0
    with seeded_torch(seed + 1, X.device):  # dropout & co. draw from the seeded global RNG
        module.train()
        opt = build_optimizer(optimizer, module.parameters(), lr=lr, weight_decay=weight_decay, fused=fused)
        gen = torch.Generator().manual_seed(seed)
        n = X.shape[0]
        slices = batch_slices(n, batch_size or n)
        # per-row factors w_i / w̄ (mean 1 over the rows): a batch's loss is the mean of (w_i / w̄) ℓ_i
        factors = None if sample_weight is None else sample_weight / sample_weight.mean()
        # patience: n_iter_no_change epochs of at least PATIENCE_STEPS optimizer steps each (short epochs count
        # for less: on small data the loss can rest on a plateau for hundreds of steps before it falls again)
        patience = max(n_iter_no_change, -(-n_iter_no_change * PATIENCE_STEPS // len(slices)))
        result.stop_reason = f"max_epochs={max_epochs} reached"
        bar = progress(range(max_epochs), desc="training", verbose=verbose, leave=False)
        for epoch in bar:
            perm = torch.randperm(n, generator=gen).to(X.device)
            total = 0.0
            for sl in slices:
                idx = perm[sl]
                opt.zero_grad(set_to_none=True)
                if factors is None:
                    batch_loss = loss(module(X[idx]), y[idx])
                else:
                    per_row = _per_row_losses(loss, module(X[idx]), y[idx])
                    batch_loss = (factors[idx].to(per_row.dtype) * per_row).mean()
                batch_loss.backward()
                opt.step()
                total += float(batch_loss.detach()) * len(idx)
            result.loss_curve.append(total / n)
            result.n_iter = epoch + 1
            if not np.isfinite(result.loss_curve[-1]):
                raise FloatingPointError(f"{owner}: the training loss diverged to {result.loss_curve[-1]}; "
                                         "lower lr or standardize the data.")
            if validation is None:
                bar.set_postfix(loss=f"{result.loss_curve[-1]:.4g}")
                continue
            score = held_out_loss(module, *validation[:2], validation_loss or loss, validation[2])
            result.validation_scores.append(score)
            bar.set_postfix(loss=f"{result.loss_curve[-1]:.4g}", validation=f"{score:.4g}")
            best = result.best_validation_score
            if not np.isfinite(score):
                raise FloatingPointError(f"{owner}: the held-out loss diverged to {score}; lower lr or standardize "
                                         "the data.")
            no_change = 0 if best is None or score < best - tol * abs(best) else no_change + 1
            if best is None or score < best:
                result.best_epoch = epoch + 1
                best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            if no_change >= patience:
                result.stop_reason = (f"the held-out loss did not improve by more than tol={tol:g} (relative) for "
                                      f"{patience} epochs")
                break
    if best_state is not None:
        module.load_state_dict(best_state)
        result.stop_reason += (f"; kept the weights of epoch {result.best_epoch} (held-out loss "
                               f"{result.best_validation_score:.4g})")
    module.eval()
    for p in module.parameters():
        p.grad = None
    logger.info("%s: training stopped after %d epochs: %s", owner, result.n_iter, result.stop_reason)
    return result
