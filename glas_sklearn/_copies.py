"""Training several copies of one network at once: their weights stacked along a leading axis and their forward
passes vectorised with ``torch.func.vmap``, so that the small networks of a cross-validation (one per fold and
setting) cost a few batched operations a step instead of one optimizer step each.

Used by ``Training(weight_decay="cv")``; each copy trains as ``estimators/_training.train_module`` would train it
alone (the same optimizer, learning rate, batches, epochs and weight decay), up to float rounding.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from ._loop import batch_slices, per_row_losses, seeded_torch
from ._progress import progress

__all__ = ["can_train_copies", "train_copies"]

logger = logging.getLogger(__name__)


def can_train_copies(module: nn.Module, x1: torch.Tensor, y1: torch.Tensor, loss: Callable) -> bool:
    """Whether ``module`` and ``loss`` run under ``vmap`` over stacked weights: a module without buffers (running
    statistics such as BatchNorm's are updated in place), all of whose weights train, whose forward pass and loss
    ``vmap`` can batch (tried on two copies of the rows ``x1, y1``)."""
    if any(True for _ in module.buffers()) or not all(p.requires_grad for p in module.parameters()):
        return False
    params = {k: torch.stack([v.detach()] * 2) for k, v in module.named_parameters()}
    try:
        with torch.no_grad():
            out = vmap(lambda p, x, t: loss(functional_call(module, p, (x,)), t), randomness="different")(
                params, torch.stack([x1] * 2), torch.stack([y1] * 2))
        return out.shape == (2,)
    except Exception as err:  # noqa: BLE001 - any failure means: train the copies one by one
        logger.debug("training copies with vmap is not possible for this module (%s: %s); one by one",
                     type(err).__name__, err)
        return False


def train_copies(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable, *,
                 row_sets: Sequence[np.ndarray], weight_decays: Sequence[float], build: Callable,
                 batch_size: int | None, max_epochs: int, seed: int, sample_weight: torch.Tensor | None = None,
                 lr_at: Callable[[int, int], float] | None = None, verbose: int = 0,
                 owner: str = "train_copies") -> list[nn.Module]:
    """Train one copy of ``module`` per row set, copy m on the rows ``row_sets[m]`` of (X, y) with weight decay
    ``weight_decays[m]``, all in the same optimizer steps; ``module`` is untouched.

    Every copy starts from ``module``'s weights and runs ``max_epochs`` epochs of the same number of steps: each
    epoch, copy m takes its rows in the order of ``torch.randperm`` drawn from its own generator seeded with
    ``seed`` (the order ``train_module`` takes them in), the first n_min of them, n_min the size of the smallest
    row set (all of them where the sets have one size, as the folds of a cross-validation nearly do), in batches
    of ``batch_size`` rows. The weight decays go to the optimizer as parameter groups, so each optimizer
    applies its own kind of decay.

    Parameters
    ----------
    module : torch.nn.Module
        The network to copy (see :func:`can_train_copies`).
    X, y : torch.Tensor
        All the rows; ``row_sets`` index them.
    loss : callable
        ``loss(outputs, targets)``, the mean over the rows of a batch.
    row_sets : sequence of ndarray of int
        The rows each copy trains on.
    weight_decays : sequence of float
        The weight decay of each copy.
    build : callable
        ``build(param_groups)``: the optimizer over a list of ``{"params": ..., "weight_decay": ...}`` groups.
    batch_size : int or None
        Rows per step (None: all n_min rows).
    max_epochs, seed : int
    sample_weight : torch.Tensor of shape (n,), optional
        Row weights: copy m's step minimises the mean of (w_i / w̄_m) ℓ_i over its batch, w̄_m the mean weight of
        its rows.
    lr_at : callable, optional
        ``lr_at(step, total_steps)``: the learning rate of each step (None: the optimizer's own).
    verbose : int, default=0
        ≥ 1 shows a progress bar over epochs.
    owner : str
        Named in the error raised when a loss diverges.

    Returns
    -------
    list of torch.nn.Module
        The trained copies, in eval mode, in the order of ``row_sets``.
    """
    n_copies = len(row_sets)
    n_min = min(len(r) for r in row_sets)
    rows = [torch.as_tensor(np.asarray(r), device=X.device) for r in row_sets]
    base = copy.deepcopy(module).train()
    decays = list(dict.fromkeys(float(w) for w in weight_decays))  # the distinct decays, one group each
    members = [[m for m in range(n_copies) if float(weight_decays[m]) == w] for w in decays]
    order = [m for group in members for m in group]  # copies grouped by decay: the stacked axis
    position = torch.as_tensor(np.argsort(order), device=X.device)
    groups = [{name: torch.stack([p.detach().clone()] * len(group)).requires_grad_()
               for name, p in base.named_parameters()} for group in members]
    opt = build([{"params": list(g.values()), "weight_decay": w} for g, w in zip(groups, decays, strict=True)])
    factors = None
    if sample_weight is not None:
        factors = torch.zeros(len(order), len(X), dtype=sample_weight.dtype, device=X.device)
        for i, m in enumerate(order):
            factors[i, rows[m]] = sample_weight[rows[m]] / sample_weight[rows[m]].mean()

    def step_losses(params, xb, yb, fb):
        out = functional_call(base, params, (xb,))
        if fb is None:
            return loss(out, yb)
        return (fb.to(out.dtype) * per_row_losses(loss, out, yb)).mean()

    batched = vmap(step_losses, in_dims=(0, 0, 0, None if factors is None else 0), randomness="different")
    gens = [torch.Generator().manual_seed(seed) for _ in order]
    slices = batch_slices(n_min, batch_size or n_min)
    total_steps, step = max_epochs * len(slices), 0
    with seeded_torch(seed + 1, X.device):
        bar = progress(range(max_epochs), desc="cross-validation", verbose=verbose, leave=False)
        for _ in bar:
            perms = torch.stack([rows[m][torch.randperm(len(rows[m]), generator=g).to(X.device)[:n_min]]
                                 for m, g in zip(order, gens, strict=True)])
            total = torch.zeros((), dtype=torch.float64, device=X.device)  # on the device: no sync a step
            for sl in slices:
                idx = perms[:, sl]
                if lr_at is not None:
                    for group in opt.param_groups:
                        group["lr"] = lr_at(step, total_steps)
                    step += 1
                opt.zero_grad(set_to_none=True)
                params = {name: torch.cat([g[name] for g in groups]) for name in groups[0]}
                fb = None if factors is None else torch.gather(factors, 1, idx)
                per_copy = batched(params, X[idx], y[idx], fb)
                per_copy.sum().backward()
                opt.step()
                total += per_copy.detach().double().sum() * (sl.stop - sl.start)
            mean_loss = float(total) / (n_min * len(order))
            if not np.isfinite(mean_loss):
                raise FloatingPointError(f"{owner}: the training loss of the cross-validation diverged to "
                                         f"{mean_loss}; lower lr or standardize the data.")
            bar.set_postfix(loss=f"{mean_loss:.4g}")
    copies = []
    with torch.no_grad():
        stacked = {name: torch.cat([g[name] for g in groups]) for name in groups[0]}
        for m in range(n_copies):
            net = copy.deepcopy(module)
            for name, p in net.named_parameters():
                p.copy_(stacked[name][position[m]])
            copies.append(net.eval())
    return copies
