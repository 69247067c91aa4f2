"""The settings of the training (:class:`Training`) and their "auto" rules: the rows per step, the learning rate,
the weight decay (the MAP under a Gaussian prior), how training stops and for how many epochs, how many networks.
:meth:`Training.fit` and :meth:`Training.fit_networks` train by :mod:`~glas_sklearn.training.fitting`.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Sequence

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.model_selection import train_test_split
from torch import nn

from .._checks import can_stratify
from .._constraints import BOOLEAN, InstanceOf, Interval, Options, Satisfies, check_settings
from . import fitting, optim
from .loop import TrainingResult

__all__ = ["AUTO_EARLY_STOPPING_ROWS", "AUTO_NETWORKS", "STOPPING_MODES", "Training", "auto_batch_size", "auto_lr",
           "can_stratify", "prior_weight_decay"]

logger = logging.getLogger("glas_sklearn.training")

#: ``batch_size="auto"``: ⌊n / AUTO_STEPS⌋ rows per batch (about ``AUTO_STEPS`` steps per epoch),
#: within [AUTO_MIN_BATCH, AUTO_MAX_BATCH] and at most n.
AUTO_STEPS, AUTO_MIN_BATCH, AUTO_MAX_BATCH = 20, 64, 200
#: ``batch_size="auto"`` on large data: from AUTO_LARGE_BATCH_ROWS rows trained on, ⌊n / AUTO_LARGE_STEPS⌋ rows per
#: step within [AUTO_MAX_BATCH, AUTO_LARGE_BATCH] (at least AUTO_LARGE_STEPS steps per epoch below 32,768 rows),
#: with ``lr="auto"`` at AUTO_LARGE_LR for steps of AUTO_LARGE_BATCH.
AUTO_LARGE_BATCH, AUTO_LARGE_BATCH_ROWS, AUTO_LARGE_STEPS = 1024, 8 * 1024, 32
#: ``lr="auto"``: AUTO_LR, or AUTO_LARGE_LR for steps of ≥ AUTO_LARGE_BATCH rows on ≥ AUTO_LARGE_BATCH_ROWS rows.
AUTO_LR, AUTO_LARGE_LR = 1e-3, 3e-3
#: ``early_stopping="auto"`` holds validation rows out of the network from this many training rows on; below, the
#: rows are worth more to the network than to a stopping rule, and a shadow copy chooses the epochs instead.
AUTO_EARLY_STOPPING_ROWS = 2000
#: ``validation_fraction="auto"``: the share of the training rows held out of the shadow copy
#: (``early_stopping="shadow"``), and of the network itself (``early_stopping=True``).
SHADOW_FRACTION, HELD_OUT_FRACTION = 0.2, 0.1
#: ``max_epochs="auto"``: AUTO_MAX_EPOCHS_STOPPED where training stops on held-out rows (either kind of early
#: stopping), else AUTO_MAX_EPOCHS.
AUTO_MAX_EPOCHS, AUTO_MAX_EPOCHS_STOPPED = 500, 2000
#: The ways training can stop: on all the epochs, on the network's own held-out rows, on a shadow copy's.
STOPPING_MODES = ("off", "held_out", "shadow")
#: ``n_networks="auto"``: this many networks for the classifier below ``AUTO_EARLY_STOPPING_ROWS`` training rows
#: when it builds them (not from a module instance), else one (:meth:`Training.networks`).
AUTO_NETWORKS = 3


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


def prior_weight_decay(n: float, prior_std: float = 1.0) -> float:
    """The weight decay that makes training on the mean loss of n rows the MAP under a N(0, prior_std²) prior on
    every weight: the mean loss plus ‖θ‖² / (2 n prior_std²), as the summed loss plus ‖θ‖² / (2 prior_std²) is the
    negative log posterior. ``prior_std=1`` is the penalty of scikit-learn's ``LogisticRegression(C=1)``; n is the
    sum of the rows' weights when they are weighted."""
    return 1.0 / (float(n) * prior_std**2)


def _is_optimizer_class(value) -> bool:
    return isinstance(value, type) and issubclass(value, torch.optim.Optimizer)


# Offset of the seed of the early-stopping validation split (within the training rows).
_VALIDATION_SPLIT = 104729


class Training(BaseEstimator):
    """How the estimators train their network: optimizer, learning rate and its schedule, batches, epochs, early
    stopping, and the recipe of the default network.

    Pass it as ``training=Training(...)``; its parameters are reached as ``training__lr`` in ``set_params`` and
    ``GridSearchCV``. Unused with ``prefit=True``.

    Parameters
    ----------
    max_epochs : "auto" or int, default="auto"
        The most training epochs (all of them with ``early_stopping=False``). "auto": 2,000 where training stops on
        held-out rows (``early_stopping`` True or "shadow", hence by default), else 500.
    lr : "auto" or float, default="auto"
        Learning rate. "auto": 1e-3, and 3e-3 for steps of at least 1,024 rows on at least 8,192 rows trained on
        (what ``batch_size="auto"`` gives from 32,768 rows).
    batch_size : "auto", int or None, default="auto"
        Rows per step (None: all rows). "auto": a twentieth of the rows trained on, within [64, 200] (and at most
        all of them); from 8,192 rows trained on, a thirty-second of them within [200, 1,024]. A last batch of one
        row is merged into the batch before it (layers such as ``BatchNorm1d`` cannot train on a single row).
    weight_decay : "auto", "cv" or float, default="auto"
        Weight decay of the optimizer. "auto": for the classifier 1 / n, n the rows trained on (the sum of their
        weights), which makes the network the MAP under a N(0, 1) prior on every weight (the penalty of
        ``LogisticRegression(C=1)``); 0 for the regressor. "cv": c / n, the prior N(0, 1 / c) with c in (1, 3, 10)
        of the lowest 3-fold cross-validated held-out loss (9 more networks on 2/3 of the rows, trained together).
    optimizer : {"adam", "adamw", "sgd"} or torch.optim.Optimizer subclass, default="adam"
        Built as ``optimizer(params, lr=lr, weight_decay=weight_decay)``; "adam" and "adamw" run in torch's fused
        implementation (the same update up to rounding, one kernel for all the parameters); pass the class
        (``torch.optim.Adam``) for torch's default implementation.
    schedule : {"constant", "warmup_cosine"}, default="constant"
        The learning rate over the optimizer steps of ``max_epochs`` epochs: constant, or a linear warm-up over
        the first 5 % of the steps followed by a half cosine down to 0.
    early_stopping : "auto", "shadow" or bool, default="auto"
        True: hold ``validation_fraction`` of the training rows out (never calibration rows) and stop when their
        loss (the likelihood's ``held_out_loss``) has not improved for ``n_iter_no_change`` epochs, keeping the
        weights of the best epoch. "shadow": the network trains on all the rows, for the number of epochs at which
        a copy of it (same initial weights, same settings), trained first on the rows less ``validation_fraction``
        of them, had its lowest held-out loss; the copy stops as True does, and not before twice that epoch. On
        small data this lets the table decide between the long training a smooth target needs and the short one
        that keeps a noisy target from being fitted, without taking rows from the network. It costs the copy's
        training: it runs at least twice the epochs it chooses, so the fit trains about three times as long.
        "auto": True from 2,000 training rows on, "shadow" below. False: all ``max_epochs`` epochs. With fewer than
        2 rows on either side, training runs without stopping; why training stopped is logged at INFO level.
    validation_fraction : "auto" or float, default="auto"
        The share of the training rows held out for early stopping (stratified by class where possible). "auto":
        0.2 of the shadow copy's rows, 0.1 of the network's own with ``early_stopping=True``.
    n_iter_no_change : int, default=10
        Patience of early stopping: epochs in a row without improvement, each counted as at least 50 optimizer
        steps.
    tol : float, default=1e-4
        An epoch improves when its held-out loss is below the best so far by more than ``tol`` times the best's
        absolute value.
    n_networks : "auto" or int, default="auto"
        How many networks to train: a deep ensemble, each network trained as one network is but from its own seed
        (initial weights, batch order, the rows held out for its early stopping or its shadow copy), on the same
        training rows (never the calibration rows). The estimator's network is then a
        :class:`~glas_sklearn.ensemble.NetworkEnsemble`: the members' mean output (regression) or the logarithm
        of their mean softmax (classification, the averaged probabilities), with the Laplace posterior on all
        their weights. A stack of ``nn.Linear`` and elementwise layers (the default MLP) trains its networks
        together, weights stacked and products batched, each as it would alone up to float rounding; other
        networks train one after another. 1: one network. "auto": 3 for the classifier below 2,000
        training rows when it builds its networks (the default MLP, a module class or callable), else 1, and 1 for
        a module instance (its weights may be pretrained). Asked of an instance, each copy after the first is
        re-initialised by the ``reset_parameters`` of its layers whose weights all train (a frozen layer keeps the
        instance's weights).
        With ``weight_decay="cv"`` the first network's search chooses the prior and the others train under it.
    module_kwargs : dict, optional
        Keyword arguments of the default MLP (``hidden_layer_sizes``, default (50, 50); ``activation``, one of
        "tanh", "relu", "gelu", "silu") or of a callable ``module``.
    clip_grad_norm : float, optional
        The largest norm of a network's gradient at an optimizer step (``torch.nn.utils.clip_grad_norm_``, each
        network of an ensemble on its own); None, the default: gradients as they are.
    standardize : "auto" or bool, default="auto"
        Standardise the inputs (2-D float tables only) and regression targets for training; results are in the
        original units. "auto" leaves other inputs (images, token ids) as they are; True refuses them; False
        standardises nothing.

    Examples
    --------
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor, Training
    >>> reg = LaplaceActiveSubspaceRegressor(training=Training(max_epochs=200, lr=3e-3))
    >>> reg.set_params(training__lr=1e-3).get_params()["training__lr"]
    0.001
    """

    _parameter_constraints: dict = {
        "max_epochs": [Options("auto"), Interval(numbers.Integral, 0, None)],
        "lr": [Options("auto"), Interval(numbers.Real, 0, None, closed="neither")],
        "batch_size": [None, Options("auto"), Interval(numbers.Integral, 1, None)],
        "weight_decay": [Options("auto", "cv"), Interval(numbers.Real, 0, None)],
        "optimizer": [Options(*optim.OPTIMIZERS), Satisfies(_is_optimizer_class, "a torch.optim.Optimizer subclass")],
        "schedule": [Options(*optim.SCHEDULES)],
        "early_stopping": [Options("auto", "shadow"), BOOLEAN],
        "validation_fraction": [Options("auto"), Interval(numbers.Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Interval(numbers.Integral, 1, None)],
        "tol": [Interval(numbers.Real, 0, None)],
        "clip_grad_norm": [None, Interval(numbers.Real, 0, None, closed="neither")],
        "n_networks": [Options("auto"), Interval(numbers.Integral, 1, None)],
        "module_kwargs": [None, InstanceOf(dict, "a dict")],
        "standardize": [Options("auto"), BOOLEAN],
    }

    def __init__(self, max_epochs="auto", lr="auto", batch_size="auto", weight_decay="auto", optimizer="adam",
                 schedule="constant", early_stopping="auto", validation_fraction="auto", n_iter_no_change=10, tol=1e-4,
                 n_networks="auto", module_kwargs=None, standardize="auto", clip_grad_norm=None):
        self.max_epochs = max_epochs
        self.lr = lr
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.optimizer = optimizer
        self.schedule = schedule
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.n_networks = n_networks
        self.module_kwargs = module_kwargs
        self.standardize = standardize
        self.clip_grad_norm = clip_grad_norm

    def check(self, owner: str) -> Training:
        """The settings checked (a ValueError naming the parameter as ``training__name``); returns self."""
        check_settings(self, owner, prefix="training__")
        return self

    def batch_rows(self, n_rows: int) -> int | None:
        """Rows per step on ``n_rows`` rows trained on: ``batch_size``, with "auto" resolved (None: all rows)."""
        return auto_batch_size(n_rows) if self.batch_size == "auto" else self.batch_size

    def learning_rate(self, n_rows: int) -> float:
        """The learning rate on ``n_rows`` rows trained on: ``lr``, with "auto" resolved (:func:`auto_lr`)."""
        return auto_lr(n_rows, self.batch_rows(n_rows)) if self.lr == "auto" else self.lr

    def decay(self, n_weight: float, prior_std: float | None, cv_precision: float | None = None) -> float:
        """The weight decay on training rows of total weight ``n_weight`` (their count, or the sum of their
        weights): ``weight_decay``, with "auto" resolved to the MAP under a N(0, prior_std²) prior on every weight
        (:func:`prior_weight_decay`), or to 0 when ``prior_std`` is None, and "cv" to ``cv_precision`` / n, the
        prior precision :meth:`cross_validate_decay` chose (or is trying)."""
        if self.weight_decay == "cv":
            if cv_precision is None:
                raise ValueError("weight_decay='cv' needs the prior precision chosen by cross_validate_decay.")
            return cv_precision * prior_weight_decay(n_weight)
        if self.weight_decay != "auto":
            return float(self.weight_decay)
        return 0.0 if prior_std is None else prior_weight_decay(n_weight, prior_std)

    def networks(self, n: int, classification: bool, instance: bool = False) -> int:
        """How many networks to train on n rows: ``n_networks``, "auto" resolved (``AUTO_NETWORKS`` for a
        classifier below ``AUTO_EARLY_STOPPING_ROWS`` rows that builds its networks, else 1; 1 from a module
        ``instance``, whose weights may be pretrained)."""
        if self.n_networks != "auto":
            return int(self.n_networks)
        return AUTO_NETWORKS if classification and not instance and n < AUTO_EARLY_STOPPING_ROWS else 1

    def stopping(self, n: int) -> str:
        """How a training on n rows stops, one of ``STOPPING_MODES``: "off" (all the epochs), "held_out" (early
        stopping on rows held out of the network) or "shadow" (the epochs chosen by a copy, rows held out of it);
        "auto" resolved (``AUTO_EARLY_STOPPING_ROWS``), "off" where there is no epoch to stop or the held-out share
        would leave fewer than 2 rows on either side."""
        mode = self._requested(n)
        return mode if mode != "off" and self.epochs(mode) > 0 and self._holds_out(mode, n) else "off"

    def _requested(self, n: int) -> str:
        """The mode ``early_stopping`` asks for on n rows, before :meth:`stopping` checks it can be done."""
        if isinstance(self.early_stopping, str):  # "auto" or "shadow"
            return "held_out" if self.early_stopping == "auto" and n >= AUTO_EARLY_STOPPING_ROWS else "shadow"
        return "held_out" if self.early_stopping else "off"

    def _n_held_out(self, mode: str, n: int) -> int:
        """⌈share · n⌉ of n rows held out for a training that stops as ``mode`` (:meth:`held_out_share`)."""
        return int(np.ceil(self.held_out_share(mode) * n))

    def _holds_out(self, mode: str, n: int) -> bool:
        """Whether n rows leave at least 2 on either side of ``mode``'s held-out share."""
        n_val = self._n_held_out(mode, n)
        return n_val >= 2 and n - n_val >= 2

    def held_out_share(self, mode: str) -> float:
        """``validation_fraction`` for a training that stops as ``mode``, "auto" resolved."""
        if self.validation_fraction != "auto":
            return float(self.validation_fraction)
        return SHADOW_FRACTION if mode == "shadow" else HELD_OUT_FRACTION

    def epochs(self, mode: str) -> int:
        """``max_epochs`` for a training that stops as ``mode``, "auto" resolved."""
        if self.max_epochs != "auto":
            return int(self.max_epochs)
        return AUTO_MAX_EPOCHS if mode == "off" else AUTO_MAX_EPOCHS_STOPPED

    def validation_rows(self, yt: torch.Tensor, seed: int, classification: bool, owner: str,
                        mode: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Positions among the n training rows of the rows trained on and of the share held out for stopping
        (:meth:`held_out_share`, ⌈share · n⌉, stratified by class where possible; seeded from ``seed``), sorted;
        ``(all rows, None)`` where training does not stop early (``mode``, by default :meth:`stopping`)."""
        n = len(yt)
        mode = self.stopping(n) if mode is None else mode
        if mode == "off":
            requested = self._requested(n)
            if requested != "off" and not self._holds_out(requested, n):
                logger.info("%s: %d training rows are too few to hold out validation rows for early stopping; "
                            "training for max_epochs=%d epochs", owner, n, self.epochs(mode))
            return np.arange(n), None
        n_val = self._n_held_out(mode, n)
        labels = yt.detach().cpu().numpy() if classification else None
        stratify = labels if labels is not None and can_stratify(labels, n_val) else None
        fit, val = train_test_split(np.arange(n), test_size=n_val, random_state=(seed + _VALIDATION_SPLIT) % 2**31,
                                    stratify=stratify)
        return np.sort(fit), np.sort(val)

    def step_settings(self, n_fit: int) -> dict:
        """The settings of each optimizer step of a training on ``n_fit`` rows, as
        :func:`~glas_sklearn.training.loop.run` takes them: the optimizer (``build``; "adam" / "adamw" fused, each
        network's weight decay in its parameter group), the learning rate of each step (``lr_at``), the rows per
        step, early stopping's ``tol`` and ``n_iter_no_change``, ``clip_grad_norm``."""
        lr, schedule = self.learning_rate(n_fit), self.schedule
        return {"build": lambda groups: optim.build_optimizer(self.optimizer, groups, lr=lr, weight_decay=0.0,
                                                              fused=True),
                "lr_at": None if schedule == "constant" else lambda step, total: lr * optim.lr_factor(schedule, step,
                                                                                                       total),
                "batch_size": self.batch_rows(n_fit), "tol": self.tol, "n_iter_no_change": self.n_iter_no_change,
                "clip_grad_norm": self.clip_grad_norm}

    def fit(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, objective, *, seed: int,
            sample_weight: torch.Tensor | None = None, weight_prior_std: float | None = None, verbose: int = 0,
            owner: str = "Training", cv_precision: float | None = None) -> TrainingResult:
        """Train ``module`` (the estimator's own network) in place on the training rows (less the validation rows
        held out of them for early stopping; all of them after a shadow copy), on ``objective``'s loss (an
        :class:`~glas_sklearn.training.fitting.Objective`, a loss callable, or an object with ``loss``,
        ``held_out_loss`` and ``is_classification``, such as a likelihood); its history returned.
        ``weight_prior_std`` is the prior that ``weight_decay="auto"`` trains the MAP under (None: no weight decay,
        :meth:`decay`); ``weight_decay="cv"`` first chooses the prior by :meth:`cross_validate_decay`, unless
        ``cv_precision`` gives the one an earlier search chose."""
        return fitting.fit_networks(self, [module], Xt, yt, objective, seeds=[seed], owners=[owner],
                                    sample_weight=sample_weight, weight_prior_std=weight_prior_std, verbose=verbose,
                                    cv_precision=cv_precision)[0]

    def fit_networks(self, modules: Sequence[nn.Module], Xt: torch.Tensor, yt: torch.Tensor, objective, *,
                     seeds: Sequence[int], owners: Sequence[str], sample_weight: torch.Tensor | None = None,
                     weight_prior_std: float | None = None, verbose: int = 0,
                     cv_precision: float | None = None) -> list[TrainingResult]:
        """Train the networks ``modules`` (one, or the members of an ensemble from their own initial weights and
        ``seeds``) in place, each as :meth:`fit` trains one; in the same optimizer steps where they stack
        (:func:`~glas_sklearn.training.networks.can_stack_layers`), else one after another; their records
        (``seconds`` of the first is the whole training's)."""
        return fitting.fit_networks(self, modules, Xt, yt, objective, seeds=seeds, owners=owners,
                                    sample_weight=sample_weight, weight_prior_std=weight_prior_std, verbose=verbose,
                                    cv_precision=cv_precision)

    def fit_together(self, modules: Sequence[nn.Module], Xt: torch.Tensor, yt: torch.Tensor, objective, *,
                     seeds: Sequence[int], owners: Sequence[str], **kwargs) -> list[TrainingResult] | None:
        """:meth:`fit_networks` where the networks train in the same optimizer steps (at least two, a stack of
        linear layers); None, with nothing trained, otherwise."""
        if len(modules) < 2 or not fitting.stacks(modules[0], Xt[:1]):
            return None
        return self.fit_networks(modules, Xt, yt, objective, seeds=seeds, owners=owners, **kwargs)

    def cross_validate_decay(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, objective, *, seed: int,
                             sample_weight: torch.Tensor | None = None, verbose: int = 0,
                             owner: str = "Training") -> dict:
        """The prior precision of ``weight_decay="cv"``
        (:func:`~glas_sklearn.training.fitting.cross_validate_decay`)."""
        return fitting.cross_validate_decay(self, module, Xt, yt, objective, seed=seed, sample_weight=sample_weight,
                                            verbose=verbose, owner=owner)
