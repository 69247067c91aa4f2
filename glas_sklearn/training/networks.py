"""What the training loop (:func:`~glas_sklearn.training.loop.run`) trains: one network in place
(:class:`InPlace`, any module: buffers, adapters, frozen layers), or several networks of one architecture at once
(:class:`Stacked`), their weights stacked along a leading axis, so that the small networks of a cross-validation
(one per fold and setting) or of a deep ensemble (one per seed) cost a few batched operations a step instead of one
optimizer step each.

A stack of linear layers and elementwise activations (the default MLP) runs as batched matrix products
(``torch.baddbmm``); any other module that ``torch.func.vmap`` can batch runs under ``vmap`` of
``torch.func.functional_call``. Each stacked network trains as it would alone in place, up to float rounding.

Both give the loop the same handful of operations: the optimizer's parameter groups, the mean losses of the running
networks on their batches, their held-out losses, the weights of one network (to keep its best epoch), and the
trained networks at the end.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from .pieces import held_out_loss, per_row_losses

__all__ = ["ELEMENTWISE", "MODE_FREE", "InPlace", "Stacked", "can_stack_layers", "can_train_copies", "mode_free",
           "stacked_forward"]

logger = logging.getLogger(__name__)

#: Layers that act on each value alone (or not at all): a stack of these and ``nn.Linear`` runs as batched
#: matrix products over stacked weights.
ELEMENTWISE = (nn.Tanh, nn.ReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Identity,
               nn.Dropout)


def can_stack_layers(module: nn.Module, x1: torch.Tensor) -> bool:
    """Whether ``module`` is an ``nn.Sequential`` of ``nn.Linear`` and elementwise layers (``ELEMENTWISE``, no
    buffers), all of whose weights train, called on rows that are vectors (``x1`` of shape (1, p), floating):
    the networks that :func:`stacked_forward` runs as batched matrix products."""
    return (isinstance(module, nn.Sequential) and len(module) > 0 and x1.ndim == 2 and x1.is_floating_point()
            and all(isinstance(layer, (nn.Linear, *ELEMENTWISE)) for layer in module)
            and not any(True for _ in module.buffers()) and all(p.requires_grad for p in module.parameters()))


def stacked_forward(module: nn.Module, x1: torch.Tensor | None = None) -> Callable[[dict, torch.Tensor], torch.Tensor]:
    """``forward(params, x)``: the outputs (c, b, m) of c networks of ``module``'s architecture, with weights
    ``params`` (name → (c, *shape)), on their own rows x (c, b, ...): batched matrix products where
    :func:`can_stack_layers` (``x1``: a row of the inputs), else ``vmap`` of ``functional_call``. The layers run
    in ``module``'s train / eval mode (dropout)."""
    if x1 is None or not can_stack_layers(module, x1):
        return vmap(lambda p, x: functional_call(module, p, (x,)), randomness="different")
    layers = [(str(name), layer) for name, layer in module.named_children()]

    def forward(params: dict, x: torch.Tensor) -> torch.Tensor:
        h = x
        for name, layer in layers:
            if isinstance(layer, nn.Linear):
                w, b = params[f"{name}.weight"].transpose(1, 2), params.get(f"{name}.bias")
                h = torch.bmm(h, w) if b is None else torch.baddbmm(b.unsqueeze(1), h, w)
            else:
                h = layer(h)
        return h

    return forward


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


def _copy_losses(module: nn.Module, loss: Callable, forward: Callable | None) -> Callable:
    """``losses(params, x, y, f)``: the objective to differentiate, the sum of the networks' mean losses on their
    own batches (their rows' losses weighted by the factors f (c, b) where given; None: unweighted), and those
    losses (c,), detached; ``forward`` the batched products of :func:`stacked_forward` (None: ``module`` under
    vmap)."""
    if forward is not None:

        def losses(params, x, y, f):
            out = forward(params, x)
            c = out.shape[0]
            if f is None and c == 1:
                objective = loss(out[0], y[0])
                return objective, objective.detach().reshape(1)
            if f is None:  # batches of one size: the sum of the c means is c times the mean over all their rows
                objective = c * loss(out.reshape(-1, *out.shape[2:]), y.reshape(-1, *y.shape[2:]))
                with torch.no_grad():
                    return objective, torch.stack([loss(out[m], y[m]) for m in range(c)])
            per_copy = torch.stack([(f[m].to(out.dtype) * per_row_losses(loss, out[m], y[m])).mean()
                                    for m in range(c)])
            return per_copy.sum(), per_copy.detach()

        return losses

    def one(params, x, y, f):
        out = functional_call(module, params, (x,))
        return loss(out, y) if f is None else (f.to(out.dtype) * per_row_losses(loss, out, y)).mean()

    def batched(params, x, y, f):
        per_copy = vmap(one, in_dims=(0, 0, 0, None if f is None else 0), randomness="different")(params, x, y, f)
        return per_copy.sum(), per_copy.detach()

    return batched


#: Layers whose output does not depend on train / eval mode: a module made of these alone (and ``nn.Sequential``)
#: is scored on held-out rows without switching its mode (the switch costs more than a small network's forward pass).
MODE_FREE = (nn.Sequential, nn.Linear, *(layer for layer in ELEMENTWISE if layer is not nn.Dropout))


def mode_free(module: nn.Module) -> bool:
    """Whether ``module`` computes the same in train and eval mode: every submodule one of ``MODE_FREE`` exactly, none
    overriding ``train``."""
    return all(type(m) in MODE_FREE and type(m).train is nn.Module.train for m in module.modules())


class InPlace:
    """One module trained in place on the rows (X, y) (any module: buffers and frozen layers included); the weights
    of its best epoch kept as its ``state_dict``."""

    def __init__(self, module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable,
                 sample_weight: torch.Tensor | None, validation: tuple | None, validation_loss: Callable) -> None:
        self.module, self.X, self.y, self.loss = module, X, y, loss
        self.count, self.n_rows = 1, len(X)
        # per-row factors w_i / w̄ (mean 1 over the rows): a batch's loss is the mean of (w_i / w̄) ℓ_i
        self.factors = None if sample_weight is None else sample_weight / sample_weight.mean()
        self.validation_rows, self.validation_loss = validation, validation_loss
        self.mode_free = mode_free(module)

    def groups(self, weight_decays: Sequence[float]) -> list[dict]:
        return [{"params": list(self.module.parameters()), "weight_decay": float(weight_decays[0])}]

    def parameters(self, m: int) -> list[torch.Tensor]:
        return [p for p in self.module.parameters() if p.grad is not None]

    def orders(self, gens: list, running: list[int]) -> torch.Tensor:
        return torch.randperm(self.n_rows, generator=gens[0]).to(self.X.device).unsqueeze(0)

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)

    def losses(self, running: list[int], idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx[0]
        if self.factors is None:
            objective = self.loss(self.module(self.X[idx]), self.y[idx])
        else:
            per_row = per_row_losses(self.loss, self.module(self.X[idx]), self.y[idx])
            objective = (self.factors[idx].to(per_row.dtype) * per_row).mean()
        return objective, objective.detach().reshape(1)

    def scores(self, running: list[int]) -> dict[int, float]:
        X_val, y_val, w_val = self.validation_rows
        return {0: held_out_loss(self.module, X_val, y_val, self.validation_loss, w_val, switch=not self.mode_free)}

    def weights(self, m: int) -> dict:
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def finish(self, kept: list[dict | None]) -> list[nn.Module]:
        if kept[0] is not None:
            self.module.load_state_dict(kept[0])
        self.module.eval()
        for p in self.module.parameters():
            p.grad = None
        return [self.module]


class Stacked:
    """c networks of one architecture, network m on the rows ``row_sets[m]`` of (X, y) from the weights of
    ``starts[m]`` (untouched): each epoch it takes its rows in the order of its own generator, the first n_min of
    them (n_min the size of the smallest row set), so that every network runs epochs of the same steps; a network
    that has stopped gets no gradient, so the optimizer leaves it (and its state) alone."""

    def __init__(self, starts: Sequence[nn.Module], X: torch.Tensor, y: torch.Tensor, loss: Callable,
                 row_sets: Sequence, sample_weight: torch.Tensor | None, validation: Sequence[tuple] | None,
                 validation_loss: Callable) -> None:
        self.starts, self.X, self.y = list(starts), X, y
        self.count = len(row_sets)
        self.rows = [torch.as_tensor(np.asarray(r), device=X.device) for r in row_sets]
        self.n_rows = min(len(r) for r in self.rows)
        self.base = copy.deepcopy(self.starts[0]).train()
        self.names = [name for name, _ in self.base.named_parameters()]
        self.leaves = [{name: p.detach().clone().requires_grad_() for name, p in start.named_parameters()}
                       for start in self.starts]
        self.factors = None
        if sample_weight is not None:
            self.factors = torch.zeros(self.count, len(X), dtype=sample_weight.dtype, device=X.device)
            for m, r in enumerate(self.rows):
                self.factors[m, r] = sample_weight[r] / sample_weight[r].mean()
        self.forward = stacked_forward(self.base, X[:1])
        self._losses = _copy_losses(self.base, loss, self.forward if can_stack_layers(self.base, X[:1]) else None)
        self.validation_rows = validation
        self.held_out = None if validation is None else _HeldOut(self.forward, self.base, validation, validation_loss)

    def groups(self, weight_decays: Sequence[float]) -> list[dict]:
        decays = list(dict.fromkeys(float(w) for w in weight_decays))  # the distinct decays, one group each
        members = [[m for m in range(self.count) if float(weight_decays[m]) == w] for w in decays]
        return [{"params": [self.leaves[m][name] for m in group for name in self.names], "weight_decay": w}
                for group, w in zip(members, decays, strict=True)]

    def parameters(self, m: int) -> list[torch.Tensor]:
        return [p for p in self.leaves[m].values() if p.grad is not None]

    def orders(self, gens: list, running: list[int]) -> torch.Tensor:
        return torch.stack([self.rows[m][torch.randperm(len(self.rows[m]), generator=gens[m]).to(self.X.device)
                                         [:self.n_rows]] for m in running])

    def train(self, mode: bool = True) -> None:
        self.base.train(mode)

    def stacked(self, running: list[int]) -> dict:  # name -> (len(running), *shape)
        if len(running) == 1:
            return {name: self.leaves[running[0]][name].unsqueeze(0) for name in self.names}
        return {name: torch.stack([self.leaves[m][name] for m in running]) for name in self.names}

    def losses(self, running: list[int], idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fb = None
        if self.factors is not None:
            live = self.factors if len(running) == self.count else self.factors[torch.as_tensor(
                running, device=self.X.device)]
            fb = torch.gather(live, 1, idx)
        return self._losses(self.stacked(running), self.X[idx], self.y[idx], fb)

    def scores(self, running: list[int]) -> dict[int, float]:
        return self.held_out.scores(self.stacked, running)

    def weights(self, m: int) -> dict:
        return {name: self.leaves[m][name].detach().clone() for name in self.names}

    def finish(self, kept: list[dict | None]) -> list[nn.Module]:
        networks = []
        with torch.no_grad():
            for m, start in enumerate(self.starts):
                net = copy.deepcopy(start)
                state = kept[m] if kept[m] is not None else self.weights(m)
                for name, p in net.named_parameters():
                    p.copy_(state[name])
                networks.append(net.eval())
        return networks


class _HeldOut:
    """The networks' (weighted) mean held-out losses on their validation rows, in eval mode: one batched forward
    pass where every network holds out as many rows, else one network at a time."""

    def __init__(self, forward: Callable, base: nn.Module, validation: Sequence[tuple], loss: Callable) -> None:
        self.forward, self.base, self.validation, self.loss = forward, base, validation, loss
        sizes = {len(v[0]) for v in validation}
        self.stacked = torch.stack([v[0] for v in validation]) if len(sizes) == 1 else None

    def _loss(self, out: torch.Tensor, m: int) -> float:
        _, yv, wv = self.validation[m]
        if wv is None:
            return float(self.loss(out, yv))
        return float((wv * per_row_losses(self.loss, out, yv).to(wv.dtype)).sum() / wv.sum())

    def scores(self, stacked_weights: Callable[[list[int]], dict], running: list[int]) -> dict[int, float]:
        """The held-out loss of each network of ``running``, ``stacked_weights(networks)`` their weights."""
        self.base.eval()
        scores = {}
        with torch.no_grad():
            if self.stacked is not None:
                ids = torch.as_tensor(running, device=self.stacked.device)
                out = self.forward(stacked_weights(running), self.stacked.index_select(0, ids))
                scores = {m: self._loss(out[i], m) for i, m in enumerate(running)}
            else:
                for m in running:
                    out = self.forward(stacked_weights([m]), self.validation[m][0].unsqueeze(0))[0]
                    scores[m] = self._loss(out, m)
        self.base.train()
        return scores
