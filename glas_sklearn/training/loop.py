"""The training loop: :func:`run`, the one function that trains, for one network in place or several networks of one
architecture in the same optimizer steps (:mod:`~glas_sklearn.training.networks`): mini-batches, the learning rate
of each step, the optimizer step (gradients clipped on request), early stopping on held-out rows with the weights of
the best epoch kept. :func:`train_module` and :func:`train_stacked` are its two entry points by argument.

A new training option is a field of :class:`~glas_sklearn.training.settings.Training`, passed to :func:`run` by
:func:`~glas_sklearn.training.fitting.fit_networks`, and a line here (``clip_grad_norm`` is one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .._progress import progress
from .networks import InPlace, Stacked
from .optim import build_optimizer, lr_factor
from .pieces import HeldOutStopping, batch_slices, patience_epochs, seeded_torch

__all__ = ["TrainingResult", "run", "train_module", "train_stacked"]


@dataclass
class TrainingResult:
    """What a training did to one network.

    Attributes
    ----------
    loss_curve : list of float
        The (weighted) mean training loss of each epoch run (over its mini-batches, as the weights moved).
    validation_scores : list of float
        With validation rows: the (weighted) mean held-out loss after each epoch (lower is better; the shadow
        copy's with ``early_stopping="shadow"``); else empty.
    n_iter : int
        Epochs run.
    best_epoch : int or None
        With validation rows: the epoch (1-based) whose weights were kept, the one of the lowest held-out loss.
    stop_reason : str
        Why training stopped, one sentence (also logged).
    n_steps : int
        Optimizer steps taken.
    validation_indices : ndarray of int or None
        Positions among the training rows of the rows held out for early stopping (:meth:`Training.fit`).
    n_rows_trained, batch_rows, max_epochs : int
        The rows trained on, per step, and the most epochs allowed (:meth:`Training.fit`).
    seconds : float
        Wall time of the training (:meth:`Training.fit`), the cross-validation of ``weight_decay="cv"`` included.
    weight_decay : float
        The optimizer's weight decay of the network kept (:meth:`Training.fit`).
    weight_decay_search : dict or None
        ``weight_decay="cv"``: the prior ``precisions`` tried, their cross-validated held-out ``losses``, the
        ``chosen`` precision, ``folds`` and ``seconds``; None otherwise.
    shadow_epochs : int or None
        ``early_stopping="shadow"``: the epochs the shadow copy ran (its held-out losses are ``validation_scores``,
        the epoch it chose ``best_epoch``, its held-out rows ``validation_indices``); None otherwise.
    n_networks : int
        The networks trained (``n_networks``); the record above is the first one's (``seconds``: all of them).
    """

    loss_curve: list[float] = field(default_factory=list)
    validation_scores: list[float] = field(default_factory=list)
    n_iter: int = 0
    best_epoch: int | None = None
    stop_reason: str = ""
    n_steps: int = 0
    validation_indices: np.ndarray | None = None
    n_rows_trained: int = 0
    batch_rows: int = 0
    max_epochs: int = 0
    seconds: float = 0.0
    weight_decay: float = 0.0
    weight_decay_search: dict | None = None
    shadow_epochs: int | None = None
    n_networks: int = 1

    @property
    def best_validation_score(self) -> float | None:
        """The held-out loss of the weights kept (None without validation rows)."""
        return None if self.best_epoch is None else self.validation_scores[self.best_epoch - 1]


def _each(value, count: int, what: str) -> list:
    """``value`` for each of the networks: a sequence of one per network, or one value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{what}: {len(value)} values for {count} networks.")
        return list(value)
    return [value] * count


def run(nets: InPlace | Stacked, *, build: Callable, weight_decays: Sequence[float], batch_size: int | None,
        max_epochs: int | Sequence[int], seed: int | Sequence[int], lr_at: Callable[[int, int], float] | None = None,
        schedule_epochs: int | None = None, tol: float = 1e-4, n_iter_no_change: int = 10,
        patience_ratio: float = 0.0, clip_grad_norm: float | None = None,
        planned: Sequence[str | None] | str | None = None, verbose: int = 0, owner: str = "training",
        names: Sequence[str] | None = None, desc: str = "training") -> tuple[list[nn.Module], list[TrainingResult]]:
    """Train the networks of ``nets`` in the same optimizer steps, network m with weight decay ``weight_decays[m]``.

    Every epoch, network m takes its rows in the order of ``torch.randperm`` drawn from its own generator seeded with
    its ``seed``, in batches of ``batch_size`` rows (a last batch of one row merged into the one before it,
    :func:`~glas_sklearn.training.pieces.batch_slices`); each step minimises the sum of the networks' mean losses on
    their batches (each network's gradient is its own), by the optimizer ``build(param_groups)`` returns, its
    learning rate ``lr_at(step, total_steps)`` where given, each network's gradient clipped to the norm
    ``clip_grad_norm`` where given. Network m stops after its ``max_epochs``, or, with held-out rows in ``nets``,
    when its held-out loss has not improved by more than ``tol`` (relative) for ``n_iter_no_change`` epochs of at
    least 50 steps (:func:`~glas_sklearn.training.pieces.patience_epochs`) and its epoch is at least
    ``patience_ratio`` times its best, keeping the weights of its best epoch; the others go on.

    Parameters
    ----------
    nets : InPlace or Stacked
        What is trained (:mod:`~glas_sklearn.training.networks`).
    build : callable
        ``build(param_groups)``: the optimizer over ``{"params": ..., "weight_decay": ...}`` groups.
    weight_decays : sequence of float
        One per network.
    batch_size : int or None
        Rows per step (None: all rows).
    max_epochs, seed : int or sequence of int
        For all the networks, or one per network; the global RNG (dropout) is seeded from the first seed + 1 and
        restored after.
    lr_at : callable, optional
        The learning rate of each step (None: the optimizer's own).
    schedule_epochs : int, optional
        The epochs ``lr_at``'s steps span (default: the largest ``max_epochs``).
    tol, n_iter_no_change, patience_ratio : float, int, float
        Early stopping.
    clip_grad_norm : float, optional
        The largest norm of each network's gradient at a step (``torch.nn.utils.clip_grad_norm_``).
    planned : str or sequence of str or None, optional
        Why a network's ``max_epochs`` is its length, its stop reason when it runs all of them.
    verbose : int, default=0
        ≥ 1 shows a progress bar over epochs.
    owner, names : str, sequence of str
        Named in the error raised when a loss diverges (``names[m]`` where several networks train).
    desc : str
        The progress bar's label.

    Returns
    -------
    networks : list of torch.nn.Module
        The trained networks, in eval mode (for :class:`~glas_sklearn.training.networks.InPlace`, its module).
    records : list of TrainingResult
        Their loss curves, held-out losses, epochs and steps, the epoch kept and why each stopped.
    """
    count = nets.count
    epochs, seeds = _each(max_epochs, count, "max_epochs"), _each(seed, count, "seed")
    planned = _each(planned, count, "planned") if planned is not None else [None] * count
    names = list(names) if names is not None else [f"network {m + 1}" for m in range(count)]
    device = nets.X.device
    records = [TrainingResult(stop_reason=planned[m] or f"max_epochs={epochs[m]} reached") for m in range(count)]
    kept: list[dict | None] = [None] * count
    with seeded_torch(int(seeds[0]) + 1, device):  # dropout & co. draw from the seeded global RNG
        nets.train()
        opt = build(nets.groups(weight_decays))
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        slices = batch_slices(nets.n_rows, batch_size or nets.n_rows)
        total_steps, step = (schedule_epochs or max(epochs)) * len(slices), 0
        rules = [HeldOutStopping(tol, patience_epochs(n_iter_no_change, len(slices)), patience_ratio)
                 for _ in range(count)]
        active = [e > 0 for e in epochs]
        bar = progress(range(max(epochs)), desc=desc, verbose=verbose, leave=False)
        for epoch in bar:
            running = [m for m in range(count) if active[m]]  # only the networks still training are computed
            if not running:
                break
            orders = nets.orders(gens, running)
            total = torch.zeros(len(running), dtype=torch.float64, device=device)  # on the device: no sync a step
            for sl in slices:
                if lr_at is not None:
                    for group in opt.param_groups:
                        group["lr"] = lr_at(step, total_steps)
                step += 1
                opt.zero_grad(set_to_none=True)
                objective, per_network = nets.losses(running, orders[:, sl])
                objective.backward()
                if clip_grad_norm is not None:
                    for m in running:
                        torch.nn.utils.clip_grad_norm_(nets.parameters(m), clip_grad_norm)
                opt.step()
                total += per_network.double() * (sl.stop - sl.start)
            epoch_losses = dict(zip(running, (total / nets.n_rows).tolist(), strict=True))
            scores = None if nets.validation_rows is None else nets.scores(running)
            for m in running:
                record = records[m]
                record.loss_curve.append(epoch_losses[m])
                record.n_iter, record.n_steps = epoch + 1, (epoch + 1) * len(slices)
                of = "" if count == 1 else f" of {names[m]}"
                if not math.isfinite(record.loss_curve[-1]):
                    raise FloatingPointError(f"{owner}: the training loss{of} diverged to {record.loss_curve[-1]}; "
                                             "lower lr or standardize the data.")
                if scores is not None:
                    score = scores[m]
                    if not math.isfinite(score):
                        raise FloatingPointError(f"{owner}: the held-out loss{of} diverged to {score}; lower lr or "
                                                 "standardize the data.")
                    record.validation_scores.append(score)
                    if rules[m].observe(score, epoch + 1):
                        record.best_epoch, kept[m] = rules[m].best_epoch, nets.weights(m)
                    if rules[m].stop:
                        record.stop_reason = rules[m].reason()
                        active[m] = False
                if active[m] and epoch + 1 >= epochs[m]:
                    active[m] = False
            if verbose:
                postfix = {"loss": f"{float(np.mean(list(epoch_losses.values()))):.4g}"}
                if count > 1:
                    postfix["running"] = sum(active)
                elif scores is not None:
                    postfix["validation"] = f"{scores[0]:.4g}"
                bar.set_postfix(**postfix)
    networks = nets.finish(kept)
    for m, record in enumerate(records):
        if record.best_epoch is not None:
            record.stop_reason += rules[m].kept()
    return networks, records


def train_module(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable, *, optimizer, lr: float,
                 weight_decay: float, batch_size: int | None, max_epochs: int, seed: int, verbose: int = 0,
                 owner: str = "train_module", sample_weight: torch.Tensor | None = None,
                 validation: tuple | None = None, validation_loss: Callable | None = None,
                 n_iter_no_change: int = 10, tol: float = 1e-4, fused: bool = False,
                 schedule: str = "constant", schedule_epochs: int | None = None, patience_ratio: float = 0.0,
                 clip_grad_norm: float | None = None, desc: str = "training",
                 planned: str | None = None) -> TrainingResult:
    """:func:`run` for one network, ``module``, trained in place on the (weighted) mean loss of the rows (X, y):
    the optimizer ``optimizer`` (a name of ``OPTIMIZERS`` or a class, :func:`~glas_sklearn.training.optim.
    build_optimizer`, ``fused`` for torch's fused Adam kernel) at learning rate ``lr`` × :func:`~glas_sklearn.
    training.optim.lr_factor` of ``schedule``; with ``validation`` rows (X_val, y_val, w_val), stopped early on
    their loss (``validation_loss``, default ``loss``) and left at the weights and buffers of its lowest value.

    With ``sample_weight`` the objective is the weighted mean Σ_i w_i ℓ_i / Σ_i w_i: a step minimises the mean of
    (w_i / w̄) ℓ_i over its rows (w̄ the mean weight of all rows), an unbiased estimate of it whose scale does not
    depend on the weights' scale; with all rows in one batch it is the objective itself, so integer weights equal
    repeated rows. The module is left in eval mode, without gradients. Returns its :class:`TrainingResult`.
    """
    nets = InPlace(module, X, y, loss, sample_weight, validation, validation_loss or loss)
    build = lambda groups: build_optimizer(optimizer, groups, lr=lr, weight_decay=weight_decay, fused=fused)  # noqa: E731
    lr_at = None if schedule == "constant" else lambda step, total: lr * lr_factor(schedule, step, total)
    _, (record,) = run(nets, build=build, weight_decays=[weight_decay], batch_size=batch_size, max_epochs=max_epochs,
                       seed=seed, lr_at=lr_at, schedule_epochs=schedule_epochs, tol=tol,
                       n_iter_no_change=n_iter_no_change, patience_ratio=patience_ratio,
                       clip_grad_norm=clip_grad_norm, planned=planned, verbose=verbose, owner=owner, desc=desc)
    return record


def train_stacked(modules: nn.Module | Sequence[nn.Module], X: torch.Tensor, y: torch.Tensor, loss: Callable, *,
                  row_sets: Sequence[np.ndarray], sample_weight: torch.Tensor | None = None,
                  validation: Sequence[tuple] | None = None, validation_loss: Callable | None = None,
                  **settings) -> tuple[list[nn.Module], list[TrainingResult]]:
    """:func:`run` for c networks of one architecture trained together (:class:`~glas_sklearn.training.networks.
    Stacked`), network m on the rows ``row_sets[m]`` of (X, y) from the weights of ``modules[m]`` (or of one module
    for all), each as :func:`train_module` trains it alone up to float rounding; ``validation``: each network's
    held-out rows (X_val, y_val, w_val); ``settings``: :func:`run`'s. The modules given are untouched; returns the
    trained networks, in eval mode, and their records."""
    count = len(row_sets)
    starts = list(modules) if isinstance(modules, (list, tuple)) else [modules] * count
    if len(starts) != count:
        raise ValueError(f"modules: {len(starts)} values for {count} networks.")
    nets = Stacked(starts, X, y, loss, row_sets, sample_weight, validation, validation_loss or loss)
    return run(nets, **settings)
