"""What a training runs, around the loop (:func:`~glas_sklearn.training.loop.run`): the prior of
``weight_decay="cv"`` chosen first (:func:`cross_validate_decay`), then each network trained as its settings stop it
(:func:`fit_networks`): on all its epochs, on rows held out of it, or for the epochs a shadow copy of it chose; one
network or several of one architecture in the same steps, each of these written once.

It needs of the task only the loss (:class:`Objective`): the mean loss of a batch, the held-out loss, and whether
the targets are classes (folds and held-out rows stratified by class).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from sklearn.model_selection import KFold, StratifiedKFold
from torch import nn

from . import loop
from .loop import TrainingResult
from .networks import InPlace, Stacked, can_stack_layers, can_train_copies
from .pieces import held_out_loss

if TYPE_CHECKING:
    from .settings import Training

__all__ = ["CV_FOLDS", "CV_PRIOR_PRECISIONS", "SHADOW_PATIENCE_RATIO", "Objective", "cross_validate_decay",
           "fit_networks", "objective_of", "shadow_plan", "stacks"]

logger = logging.getLogger("glas_sklearn.training")

#: The shadow copy stops after ``n_iter_no_change`` epochs without improvement, and not before this many times the
#: epoch of its lowest held-out loss: on small data that loss can rest on a plateau for hundreds of epochs before it
#: falls again.
SHADOW_PATIENCE_RATIO = 2.0
#: The prior precisions c that ``weight_decay="cv"`` chooses among: weight decay c / n, the MAP under N(0, 1 / c).
CV_PRIOR_PRECISIONS = (1.0, 3.0, 10.0)
#: Folds of ``weight_decay="cv"``.
CV_FOLDS = 3
# Offset of the seed of the folds of weight_decay="cv".
_CV_SPLIT = 7727


@dataclass(frozen=True)
class Objective:
    """What training minimises: ``loss(outputs, targets)``, the mean over a batch's rows; ``held_out_loss``, the
    mean loss that early stopping and ``weight_decay="cv"`` compare (default ``loss``); ``is_classification``,
    whether held-out rows and folds are stratified by the targets' class."""

    loss: Callable
    held_out_loss: Callable | None = None
    is_classification: bool = False

    @property
    def stopping_loss(self) -> Callable:
        return self.held_out_loss or self.loss


def objective_of(objective) -> Objective:
    """An :class:`Objective` from itself, a loss callable, or an object with ``loss`` (and optionally
    ``held_out_loss`` and ``is_classification``), such as a likelihood."""
    if isinstance(objective, Objective):
        return objective
    loss = getattr(objective, "loss", None)
    if loss is None:
        if not callable(objective):
            raise TypeError(f"training needs a loss: a callable loss(outputs, targets) or an object with a 'loss' "
                            f"attribute, got {type(objective).__name__}.")
        return Objective(objective)
    return Objective(loss, getattr(objective, "held_out_loss", None),
                     bool(getattr(objective, "is_classification", False)))


def stacks(module: nn.Module, x1: torch.Tensor) -> bool:
    """Whether networks of ``module``'s architecture train in the same optimizer steps (a stack of linear and
    elementwise layers)."""
    return can_stack_layers(module, x1)


def shadow_plan(shadow: TrainingResult, n_held_out: int) -> str:
    """Why a network trains for the epochs its shadow copy chose: its stop reason."""
    return (f"the {shadow.best_epoch} epochs at which a trial run of the network, with {n_held_out} of the rows "
            f"held out, did best on those rows (held-out loss {shadow.best_validation_score:.4g}; the trial run "
            f"stopped after {shadow.n_iter} epochs: {shadow.stop_reason.split(';')[0]})")


def fit_networks(settings: Training, modules: Sequence[nn.Module], Xt: torch.Tensor, yt: torch.Tensor, objective, *,
                 seeds: Sequence[int], owners: Sequence[str], sample_weight: torch.Tensor | None = None,
                 weight_prior_std: float | None = None, verbose: int = 0,
                 cv_precision: float | None = None) -> list[TrainingResult]:
    """Train ``modules`` in place with ``settings`` (:meth:`Training.fit_networks`): ``weight_decay="cv"`` first
    chooses the prior on the first network (unless ``cv_precision`` gives it), then each network trains as
    :meth:`Training.stopping` says. Returns their records, ``seconds`` the whole training's in the first."""
    t0 = time.perf_counter()
    objective = objective_of(objective)
    search = None
    if settings.weight_decay == "cv" and cv_precision is None:
        search = settings.cross_validate_decay(modules[0], Xt, yt, objective, seed=seeds[0],
                                               sample_weight=sample_weight, verbose=verbose, owner=owners[0])
        cv_precision = search["chosen"]
    records = _fit(settings, list(modules), Xt, yt, objective, seeds=list(seeds), owners=list(owners),
                   sample_weight=sample_weight, prior_std=weight_prior_std, cv_precision=cv_precision,
                   verbose=verbose)
    records[0].weight_decay_search = search
    records[0].seconds = time.perf_counter() - t0
    return records


def _fit(settings: Training, modules: list[nn.Module], Xt: torch.Tensor, yt: torch.Tensor, objective: Objective, *,
         seeds: list[int], owners: list[str], sample_weight: torch.Tensor | None, prior_std: float | None,
         cv_precision: float | None, verbose: int, mode: str | None = None) -> list[TrainingResult]:
    """Each network of ``modules`` trained on (Xt, yt) and stopped as ``mode`` (default :meth:`Training.stopping`):
    on all its epochs, on its own held-out rows, or for the epochs its shadow copy chose (the copy trained first
    on the rows less its held-out ones, from the same initial weights; the schedule spans the copy's epochs)."""
    n = len(yt)
    mode = settings.stopping(n) if mode is None else mode
    splits = [settings.validation_rows(yt, s, objective.is_classification, o, mode)
              for s, o in zip(seeds, owners, strict=True)]
    fits, vals = [fit for fit, _ in splits], [val for _, val in splits]

    def train(nets: list[nn.Module], row_sets: list, suffix: str = "", **kw) -> list[TrainingResult]:
        decays = [settings.decay(len(r) if sample_weight is None else float(sample_weight[_index(r, Xt)].sum()),
                                 prior_std, cv_precision) for r in row_sets]
        return _train(settings, nets, row_sets, decays, Xt, yt, objective, seeds=seeds, sample_weight=sample_weight,
                      verbose=verbose, owners=[o + suffix for o in owners], together=stacks(nets[0], Xt[:1]), **kw)

    if mode != "shadow":  # "off" trains all the epochs; "held_out" stops on each network's held-out rows
        records = train(modules, fits, max_epochs=settings.epochs(mode), held_out=None if mode == "off" else vals)
    else:
        several = f" {len(modules)} networks" if len(modules) > 1 else ""
        shadows = train([copy.deepcopy(m) for m in modules], fits, " (shadow copy)", max_epochs=settings.epochs(mode),
                        held_out=vals, patience_ratio=SHADOW_PATIENCE_RATIO,
                        desc=f"training{several} (shadow cop{'ies' if several else 'y'})")
        for shadow, owner in zip(shadows, owners, strict=True):
            logger.info("%s (shadow copy): training stopped after %d epochs: %s", owner, shadow.n_iter,
                        shadow.stop_reason)
        planned = [shadow_plan(s, len(val)) for s, val in zip(shadows, vals, strict=True)]
        records = train(modules, [np.arange(n)] * len(modules), max_epochs=[s.best_epoch for s in shadows],
                        schedule_epochs=settings.epochs(mode), planned=planned)
        for record, shadow in zip(records, shadows, strict=True):
            record.validation_scores, record.best_epoch = shadow.validation_scores, shadow.best_epoch
            record.shadow_epochs = shadow.n_iter
    for record, val, owner in zip(records, vals, owners, strict=True):
        record.validation_indices, record.max_epochs = val, settings.epochs(mode)
        logger.info("%s: training stopped after %d epochs: %s", owner, record.n_iter, record.stop_reason)
    return records


def _index(rows, Xt: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(np.asarray(rows), device=Xt.device)


def _rows(T: torch.Tensor | None, rows) -> torch.Tensor | None:
    """The rows ``rows`` of T; T itself where they are all its rows in order (no copy)."""
    if T is None:
        return None
    rows = np.asarray(rows)
    if len(rows) == len(T) and np.array_equal(rows, np.arange(len(T))):
        return T
    return T[torch.as_tensor(rows, device=T.device)]


def _train(settings: Training, modules: list[nn.Module], row_sets: list, decays: list[float], Xt: torch.Tensor,
           yt: torch.Tensor, objective: Objective, *, seeds, sample_weight: torch.Tensor | None, verbose: int,
           owners: list[str], together: bool, max_epochs, held_out: list | None = None, patience_ratio: float = 0.0,
           schedule_epochs: int | None = None, planned: list | None = None, desc: str | None = None,
           in_place: bool = True) -> list[TrainingResult]:
    """The loop on each network of ``modules`` (its rows ``row_sets[m]``, weight decay ``decays[m]``): all in one
    :func:`~glas_sklearn.training.loop.run` of their stacked weights where ``together``, else one run each in
    place; the trained weights in ``modules`` (``in_place``) or in the networks returned with the records."""
    n_fit = min(len(r) for r in row_sets)
    steps = settings.step_settings(n_fit)
    validation = None if held_out is None else [
        (_rows(Xt, v), _rows(yt, v), _rows(sample_weight, v)) for v in held_out]
    count = len(row_sets)
    each = dict(max_epochs=max_epochs, seed=list(seeds) if isinstance(seeds, (list, tuple)) else seeds,
                planned=planned, schedule_epochs=schedule_epochs, patience_ratio=patience_ratio, verbose=verbose,
                **steps)
    if together and count > 1:
        nets = Stacked(modules if len(modules) == count else modules * count, Xt, yt, objective.loss, row_sets,
                       sample_weight, validation, objective.stopping_loss)
        trained, records = loop.run(nets, weight_decays=decays, owner=owners[0], names=owners,
                                    desc=desc or f"training {count} networks", **each)
        if in_place:
            with torch.no_grad():
                for module, net in zip(modules, trained, strict=True):
                    for p, q in zip(module.parameters(), net.parameters(), strict=True):
                        p.copy_(q)
                    module.eval()
            trained = modules
    else:
        trained, records = [], []
        for m in range(count):
            one = {k: (v[m] if isinstance(v, list) else v) for k, v in each.items()}
            module = modules[m] if in_place else copy.deepcopy(modules[m])
            nets = InPlace(module, _rows(Xt, row_sets[m]), _rows(yt, row_sets[m]), objective.loss,
                           _rows(sample_weight, row_sets[m]), None if validation is None else validation[m],
                           objective.stopping_loss)
            _, (record,) = loop.run(nets, weight_decays=[decays[m]], owner=owners[m], desc=desc or "training", **one)
            trained.append(module)
            records.append(record)
    for record, rows, decay in zip(records, row_sets, decays, strict=True):
        record.n_rows_trained, record.weight_decay = len(rows), decay
        record.batch_rows = min(steps["batch_size"] or len(rows), len(rows))
    return records if in_place else (trained, records)


def cross_validate_decay(settings: Training, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, objective, *,
                         seed: int, sample_weight: torch.Tensor | None = None, verbose: int = 0,
                         owner: str = "Training") -> dict:
    """The prior precision c of ``CV_PRIOR_PRECISIONS`` (weight decay c / n) whose networks, each trained from
    ``module``'s initial weights (copies; ``module`` is untouched) on ``CV_FOLDS`` − 1 folds of the rows, have the
    lowest mean held-out loss (weighted by ``sample_weight``) on the fold left out; folds stratified by class where
    every class has ``CV_FOLDS`` rows, seeded from ``seed``. The folds' networks train all at once where the folds
    train without early stopping and ``module`` runs under ``vmap``, else one by one; a fold stops on rows held out
    of it where the kept network would (``early_stopping=True``, or "auto" from 2,000 rows), otherwise it trains
    ``max_epochs`` (500 for "auto"), without a shadow copy of its own.

    Returns
    -------
    dict
        ``precisions``, ``losses`` (one per precision), ``chosen``, ``folds`` and ``seconds``.
    """
    t0 = time.perf_counter()
    objective = objective_of(objective)
    n = len(yt)
    if n < 2 * CV_FOLDS:
        raise ValueError(f"{owner}: weight_decay='cv' needs at least {2 * CV_FOLDS} training rows for "
                         f"{CV_FOLDS} folds, got {n}; pass a fixed weight_decay (e.g. 'auto').")
    labels = yt.detach().cpu().numpy().reshape(n, -1)[:, 0] if objective.is_classification else None
    stratify = labels is not None and np.unique(labels, return_counts=True)[1].min() >= CV_FOLDS
    splitter = (StratifiedKFold if stratify else KFold)(CV_FOLDS, shuffle=True,
                                                        random_state=(seed + _CV_SPLIT) % 2**31)
    weights = np.ones(n) if sample_weight is None else sample_weight.detach().cpu().double().numpy()
    folds = list(splitter.split(np.zeros((n, 1)), labels if stratify else None))
    k = len(CV_PRIOR_PRECISIONS)
    modes = ["held_out" if settings.stopping(len(fit)) == "held_out" else "off" for fit, _ in folds]  # no copies
    if "held_out" not in modes and can_train_copies(module, Xt[:2], yt[:2], objective.loss):
        sets = [fit for fit, _ in folds for _ in CV_PRIOR_PRECISIONS]
        decays = [settings.decay(len(fit) if sample_weight is None else float(sample_weight[_index(fit, Xt)].sum()),
                                 None, c) for fit, _ in folds for c in CV_PRIOR_PRECISIONS]
        nets, _ = _train(settings, [module], sets, decays, Xt, yt, objective, seeds=seed,
                         sample_weight=sample_weight, verbose=verbose, together=True, max_epochs=settings.epochs("off"),
                         owners=[f"copy {m + 1} of the cross-validation" for m in range(len(sets))],
                         desc="cross-validation", in_place=False)
        nets = [nets[i * k:(i + 1) * k] for i in range(len(folds))]
    else:
        nets = []
        for (fit, _), mode in zip(folds, modes, strict=True):
            copies = [copy.deepcopy(module) for _ in CV_PRIOR_PRECISIONS]
            for net, c in zip(copies, CV_PRIOR_PRECISIONS, strict=True):
                _fit(settings, [net], _rows(Xt, fit), _rows(yt, fit), objective, seeds=[seed], owners=[owner],
                     sample_weight=_rows(sample_weight, fit), prior_std=None, cv_precision=c, verbose=0, mode=mode)
            nets.append(copies)
    losses = np.zeros(k)
    for f, (_, fold_out) in enumerate(folds):
        w_out = _rows(sample_weight, fold_out)
        for i in range(k):
            loss = held_out_loss(nets[f][i], _rows(Xt, fold_out), _rows(yt, fold_out), objective.stopping_loss, w_out)
            losses[i] += loss * weights[fold_out].sum()
    losses /= weights.sum()
    chosen = float(CV_PRIOR_PRECISIONS[int(np.argmin(losses))])
    search = {"precisions": list(CV_PRIOR_PRECISIONS), "losses": losses.tolist(), "chosen": chosen,
              "folds": CV_FOLDS, "seconds": time.perf_counter() - t0}
    logger.info("%s: weight_decay='cv' chose the prior N(0, 1/%g) (weight decay %g / n): %d-fold held-out loss "
                "%s for precisions %s, %.1f s", owner, chosen, chosen, CV_FOLDS,
                " / ".join(f"{v:.4g}" for v in losses), " / ".join(f"{c:g}" for c in CV_PRIOR_PRECISIONS),
                search["seconds"])
    return search
