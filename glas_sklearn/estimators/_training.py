"""The estimators' default network and their training loop.

Both are private to the estimators: users choose the default network's size through ``module_kwargs``
(``hidden_layer_sizes``, ``activation``), or pass their own module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import vmap

from .._progress import progress

__all__ = ["ACTIVATIONS", "OPTIMIZERS", "default_mlp", "seeded_torch", "train_module"]

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


def _per_row_losses(loss: Callable, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """ℓ_i of every row, (n,): the mean loss evaluated on each row as a batch of one (vectorised with vmap)."""
    return vmap(lambda out, target: loss(out.unsqueeze(0), target.unsqueeze(0)))(outputs, targets)


def train_module(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable, *, optimizer, lr: float,
                 weight_decay: float, batch_size: int | None, max_epochs: int, seed: int, verbose: int = 0,
                 owner: str = "train_module", sample_weight: torch.Tensor | None = None) -> list[float]:
    """Mini-batch training of ``module`` in place on the mean loss; returns the mean loss of each epoch.

    With ``sample_weight`` the objective is the weighted mean Σ_i w_i ℓ_i / Σ_i w_i: a step minimises the mean
    of (w_i / w̄) ℓ_i over its rows (w̄ the mean weight of all rows), an unbiased estimate of it whose scale
    does not depend on the weights' scale; with all rows in one batch it is the objective itself, so integer
    weights equal repeated rows.

    Parameters
    ----------
    module : torch.nn.Module
        The network to train (the estimator's own copy); left in eval mode, without gradients.
    X, y : torch.Tensor
        Inputs and targets on the module's device.
    loss : callable
        ``loss(outputs, targets)``, the mean over the rows of a batch.
    optimizer : str or torch.optim.Optimizer subclass
        A name from ``OPTIMIZERS`` or an optimizer class, built with ``lr`` and ``weight_decay``.
    lr, weight_decay : float
    batch_size : int or None
        Rows per step (None: all rows).
    max_epochs : int
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

    Returns
    -------
    list of float
        The (weighted) mean loss over all rows, per epoch.
    """
    with seeded_torch(seed + 1, X.device):  # dropout & co. draw from the seeded global RNG
        module.train()
        opt_cls = OPTIMIZERS[optimizer] if isinstance(optimizer, str) else optimizer
        opt = opt_cls(module.parameters(), lr=lr, weight_decay=weight_decay)
        gen = torch.Generator().manual_seed(seed)
        n = X.shape[0]
        size = min(batch_size or n, n)
        # per-row factors w_i / w̄ (mean 1 over the rows): a batch's loss is the mean of (w_i / w̄) ℓ_i
        factors = None if sample_weight is None else sample_weight / sample_weight.mean()
        losses = []
        bar = progress(range(max_epochs), desc="training", verbose=verbose, leave=False)
        for _ in bar:
            perm = torch.randperm(n, generator=gen).to(X.device)
            total = 0.0
            for i in range(0, n, size):
                idx = perm[i:i + size]
                opt.zero_grad(set_to_none=True)
                if factors is None:
                    batch_loss = loss(module(X[idx]), y[idx])
                else:
                    per_row = _per_row_losses(loss, module(X[idx]), y[idx])
                    batch_loss = (factors[idx].to(per_row.dtype) * per_row).mean()
                batch_loss.backward()
                opt.step()
                total += float(batch_loss.detach()) * len(idx)
            losses.append(total / n)
            bar.set_postfix(loss=f"{losses[-1]:.4g}")
            if not np.isfinite(losses[-1]):
                raise FloatingPointError(f"{owner}: the training loss diverged to {losses[-1]}; "
                                         "lower lr or standardize the data.")
    module.eval()
    for p in module.parameters():
        p.grad = None
    return losses
