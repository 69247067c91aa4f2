"""Training several networks of one architecture at once: their weights stacked along a leading axis, so that
the small networks of a cross-validation (one per fold and setting) or of a deep ensemble (one per seed) cost a
few batched operations a step instead of one optimizer step each.

A stack of linear layers and elementwise activations (the default MLP) runs as batched matrix products
(``torch.baddbmm``); any other module that ``torch.func.vmap`` can batch runs under ``vmap`` of
``torch.func.functional_call``. Each network trains as ``estimators/_training.train_module`` would train it
alone (the same optimizer, learning rate, batches, epochs, weight decay and early stopping), up to float rounding.
Used by ``Training(weight_decay="cv")`` and by ``Training(n_networks=K)``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from ._loop import HeldOutStopping, batch_slices, patience_epochs, per_row_losses, seeded_torch
from ._progress import progress

__all__ = ["CopyRecord", "can_stack_layers", "can_train_copies", "stacked_forward", "train_copies", "train_stacked"]

logger = logging.getLogger(__name__)

#: Layers that act on each value alone (or not at all): a stack of these and ``nn.Linear`` runs as batched
#: matrix products over stacked weights.
ELEMENTWISE = (nn.Tanh, nn.ReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Identity,
               nn.Dropout)


@dataclass
class CopyRecord:
    """What a training did to one network: its loss curves, epochs, the epoch kept and why it stopped
    (:func:`train_stacked`'s record; ``estimators/_training.TrainingResult`` extends it)."""

    loss_curve: list[float] = field(default_factory=list)
    validation_scores: list[float] = field(default_factory=list)
    n_iter: int = 0
    best_epoch: int | None = None
    stop_reason: str = ""

    @property
    def best_validation_score(self) -> float | None:
        """The held-out loss of the weights kept (None without validation rows)."""
        return None if self.best_epoch is None else self.validation_scores[self.best_epoch - 1]


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


def _per_copy(value, n_copies: int, what: str) -> list:
    """``value`` for each of the networks: a sequence of one per network, or one value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != n_copies:
            raise ValueError(f"{what}: {len(value)} values for {n_copies} networks.")
        return list(value)
    return [value] * n_copies


def train_stacked(modules: nn.Module | Sequence[nn.Module], X: torch.Tensor, y: torch.Tensor, loss: Callable, *,
                  row_sets: Sequence[np.ndarray], weight_decays: Sequence[float], build: Callable,
                  batch_size: int | None, max_epochs: int | Sequence[int], seed: int | Sequence[int],
                  sample_weight: torch.Tensor | None = None, lr_at: Callable[[int, int], float] | None = None,
                  schedule_epochs: int | None = None, validation: Sequence[tuple] | None = None,
                  validation_loss: Callable | None = None, tol: float = 1e-4, n_iter_no_change: int = 10,
                  patience_ratio: float = 0.0, planned: Sequence[str | None] | None = None, verbose: int = 0,
                  owner: str = "train_stacked", names: Sequence[str] | None = None,
                  desc: str = "cross-validation") -> tuple[list[nn.Module], list[CopyRecord]]:
    """Train c networks in the same optimizer steps, network m on the rows ``row_sets[m]`` of (X, y) with weight
    decay ``weight_decays[m]``, each as ``train_module`` trains one alone; the modules given are untouched.

    Every network runs epochs of the same number of steps: each epoch, network m takes its rows in the order of
    ``torch.randperm`` drawn from its own generator seeded with its ``seed`` (the order ``train_module`` takes
    them in), the first n_min of them, n_min the size of the smallest row set (all of them where the sets have
    one size), in batches of ``batch_size`` rows. The weight decays go to the optimizer as parameter groups, so
    each optimizer applies its own kind of decay. Network m stops after its ``max_epochs``, or with
    ``validation`` rows when its held-out loss has not improved by more than ``tol`` (relative) for the patience
    and its epoch is at least ``patience_ratio`` times its best, keeping the weights of its best epoch; the
    others go on, and a network that has stopped is carried along without being used again.

    Parameters
    ----------
    modules : torch.nn.Module or sequence of torch.nn.Module
        The networks' initial weights: one module for all (a cross-validation), or one per network (an
        ensemble), all of one architecture (see :func:`can_train_copies`).
    X, y : torch.Tensor
        All the rows; ``row_sets`` index them.
    loss : callable
        ``loss(outputs, targets)``, the mean over the rows of a batch.
    row_sets : sequence of ndarray of int
        The rows each network trains on.
    weight_decays : sequence of float
        The weight decay of each network.
    build : callable
        ``build(param_groups)``: the optimizer over a list of ``{"params": ..., "weight_decay": ...}`` groups.
    batch_size : int or None
        Rows per step (None: all n_min rows).
    max_epochs, seed : int or sequence of int
        For all the networks, or one per network.
    sample_weight : torch.Tensor of shape (n,), optional
        Row weights: network m's step minimises the mean of (w_i / w̄_m) ℓ_i over its batch, w̄_m the mean weight
        of its rows.
    lr_at : callable, optional
        ``lr_at(step, total_steps)``: the learning rate of each step (None: the optimizer's own).
    schedule_epochs : int, optional
        The epochs ``lr_at``'s steps span (default: the largest ``max_epochs``).
    validation : sequence of tuple (X_val, y_val, w_val), optional
        Each network's held-out rows (never trained on) and their weights (None: unweighted), for early stopping.
    validation_loss : callable, optional
        ``validation_loss(outputs, targets)``, the mean held-out loss (default: ``loss``).
    tol, n_iter_no_change, patience_ratio
        Early stopping as ``train_module``'s.
    planned : sequence of str or None, optional
        Why each network's ``max_epochs`` is its length, its stop reason when it runs all of them.
    verbose : int, default=0
        ≥ 1 shows a progress bar over epochs.
    owner : str
        Named in the error raised when a loss diverges, with ``names[m]`` (default "network m + 1").
    desc : str
        The progress bar's label.

    Returns
    -------
    networks : list of torch.nn.Module
        The trained networks, in eval mode, in the order of ``row_sets``.
    records : list of CopyRecord
        Their loss curves, held-out losses, epochs, the epoch kept and why each stopped.
    """
    n_copies = len(row_sets)
    starts = _per_copy(modules, n_copies, "modules")
    epochs, seeds = _per_copy(max_epochs, n_copies, "max_epochs"), _per_copy(seed, n_copies, "seed")
    names = list(names) if names is not None else [f"network {m + 1}" for m in range(n_copies)]
    planned = list(planned) if planned is not None else [None] * n_copies
    n_min = min(len(r) for r in row_sets)
    rows = [torch.as_tensor(np.asarray(r), device=X.device) for r in row_sets]
    base = copy.deepcopy(starts[0]).train()
    weight_names = [name for name, _ in base.named_parameters()]
    # each network's own weights (leaves), stacked for a step from the networks still training: one that has
    # stopped gets no gradient, so the optimizer leaves it (and its state) alone
    leaves = [{name: p.detach().clone().requires_grad_() for name, p in start.named_parameters()} for start in starts]
    decays = list(dict.fromkeys(float(w) for w in weight_decays))  # the distinct decays, one group each
    members = [[m for m in range(n_copies) if float(weight_decays[m]) == w] for w in decays]
    opt = build([{"params": [leaves[m][name] for m in group for name in weight_names], "weight_decay": w}
                 for group, w in zip(members, decays, strict=True)])
    factors = None
    if sample_weight is not None:
        factors = torch.zeros(n_copies, len(X), dtype=sample_weight.dtype, device=X.device)
        for m in range(n_copies):
            factors[m, rows[m]] = sample_weight[rows[m]] / sample_weight[rows[m]].mean()
    forward = stacked_forward(base, X[:1])
    losses = _copy_losses(base, loss, forward if can_stack_layers(base, X[:1]) else None)
    gens = [torch.Generator().manual_seed(int(seeds[m])) for m in range(n_copies)]
    slices = batch_slices(n_min, batch_size or n_min)
    horizon = max(epochs)
    total_steps, step = (schedule_epochs or horizon) * len(slices), 0
    records = [CopyRecord(stop_reason=planned[m] or f"max_epochs={epochs[m]} reached") for m in range(n_copies)]
    kept: list[dict | None] = [None] * n_copies  # the weights of each network's best epoch (held-out rows)
    patience = patience_epochs(n_iter_no_change, len(slices))
    rules = [HeldOutStopping(tol, patience, patience_ratio) for _ in range(n_copies)]
    active = [epochs[m] > 0 for m in range(n_copies)]

    def stacked_weights(running: list[int]) -> dict:  # name -> (len(running), *shape)
        if len(running) == 1:
            return {name: leaves[running[0]][name].unsqueeze(0) for name in weight_names}
        return {name: torch.stack([leaves[m][name] for m in running]) for name in weight_names}

    def weights_of(m: int) -> dict:
        return {name: leaves[m][name].detach().clone() for name in weight_names}

    held_out = None if validation is None else _HeldOut(forward, base, validation, validation_loss or loss)

    with seeded_torch(int(seeds[0]) + 1, X.device):  # dropout & co. draw from the seeded global RNG
        bar = progress(range(horizon), desc=desc, verbose=verbose, leave=False)
        for epoch in bar:
            running = [m for m in range(n_copies) if active[m]]  # only the networks still training are computed
            if not running:
                break
            base.train()
            perms = torch.stack([rows[m][torch.randperm(len(rows[m]), generator=gens[m]).to(X.device)[:n_min]]
                                 for m in running])
            live_factors = None
            if factors is not None:
                live_factors = factors if len(running) == n_copies else factors[torch.as_tensor(running,
                                                                                                device=X.device)]
            total = torch.zeros(len(running), dtype=torch.float64, device=X.device)  # on the device: no sync a step
            for sl in slices:
                idx = perms[:, sl]
                if lr_at is not None:
                    for group in opt.param_groups:
                        group["lr"] = lr_at(step, total_steps)
                    step += 1
                opt.zero_grad(set_to_none=True)
                fb = None if live_factors is None else torch.gather(live_factors, 1, idx)
                objective, per_copy = losses(stacked_weights(running), X[idx], y[idx], fb)
                objective.backward()
                opt.step()
                total += per_copy.double() * (sl.stop - sl.start)
            epoch_losses = dict(zip(running, (total / n_min).tolist(), strict=True))
            scores = None if held_out is None else held_out.scores(stacked_weights, running)
            for m in range(n_copies):
                if not active[m]:
                    continue
                record = records[m]
                record.loss_curve.append(epoch_losses[m])
                record.n_iter = epoch + 1
                if not np.isfinite(record.loss_curve[-1]):
                    raise FloatingPointError(f"{owner}: the training loss of {names[m]} diverged to "
                                             f"{record.loss_curve[-1]}; lower lr or standardize the data.")
                if scores is not None:
                    score = scores[m]
                    if not np.isfinite(score):
                        raise FloatingPointError(f"{owner}: the held-out loss of {names[m]} diverged to {score}; "
                                                 "lower lr or standardize the data.")
                    record.validation_scores.append(score)
                    if rules[m].observe(score, epoch + 1):
                        record.best_epoch, kept[m] = rules[m].best_epoch, weights_of(m)
                    if rules[m].stop:
                        record.stop_reason = rules[m].reason()
                        active[m] = False
                if active[m] and epoch + 1 >= epochs[m]:
                    active[m] = False
            bar.set_postfix(loss=f"{float(np.mean(list(epoch_losses.values()))):.4g}", running=sum(active))
    networks = []
    with torch.no_grad():
        for m in range(n_copies):
            net = copy.deepcopy(starts[m])
            state = kept[m] if kept[m] is not None else weights_of(m)
            for name, p in net.named_parameters():
                p.copy_(state[name])
            networks.append(net.eval())
            if records[m].best_epoch is not None:
                records[m].stop_reason += rules[m].kept()
    return networks, records


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


def train_copies(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable, *,
                 row_sets: Sequence[np.ndarray], weight_decays: Sequence[float], build: Callable,
                 batch_size: int | None, max_epochs: int, seed: int, sample_weight: torch.Tensor | None = None,
                 lr_at: Callable[[int, int], float] | None = None, verbose: int = 0,
                 owner: str = "train_copies") -> list[nn.Module]:
    """One copy of ``module`` trained per row set, all from its weights and with the same row order (``seed``),
    each on its rows with its weight decay for ``max_epochs`` epochs (:func:`train_stacked`, whose parameters
    these are); ``module`` is untouched. Returns the trained copies, in eval mode, in the order of
    ``row_sets``."""
    networks, _ = train_stacked(module, X, y, loss, row_sets=row_sets, weight_decays=weight_decays, build=build,
                                batch_size=batch_size, max_epochs=max_epochs, seed=seed, sample_weight=sample_weight,
                                lr_at=lr_at, verbose=verbose, owner=owner,
                                names=[f"copy {m + 1} of the cross-validation" for m in range(len(row_sets))])
    return networks
