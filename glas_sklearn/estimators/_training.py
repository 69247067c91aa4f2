"""The network component of the estimators: the network recipe (the user's module, or the default MLP built from
``module_kwargs``) and :class:`Training`, the settings of the training loop, whose :meth:`Training.fit` trains a
network and returns its :class:`TrainingResult` (mini-batches, a learning-rate schedule, early stopping on held-out
rows with the best weights restored).

Every training option lives here: a new one is a parameter of :class:`Training` and a line of :func:`train_module`.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import numbers
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.model_selection import KFold, StratifiedKFold, train_test_split
from torch import nn

from .._constraints import BOOLEAN, InstanceOf, Interval, Options, Satisfies, check_settings
from .._copies import CopyRecord, can_stack_layers, can_train_copies, train_copies, train_stacked
from .._functional import eval_view
from .._fused_adam import lean_fused_adam
from .._loop import HeldOutStopping, batch_slices, patience_epochs, per_row_losses, seeded_torch
from .._progress import progress
from .._silenced import user_stacklevel
from .._threads import adjust_threads, auto_threads
from ..adapters import as_adapter, unwrap_model

__all__ = ["ACTIVATIONS", "AUTO_EARLY_STOPPING_ROWS", "OPTIMIZERS", "SCHEDULES", "STOPPING_MODES", "Training",
           "TrainingResult",
           "auto_batch_size", "auto_lr", "batch_slices", "build_network", "build_optimizer", "default_mlp",
           "held_out_loss", "lr_factor", "member_seed", "prior_weight_decay", "seeded_torch", "train_module",
           "trainable_dtype"]

logger = logging.getLogger(__name__)

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
#: The shadow copy stops after ``n_iter_no_change`` epochs without improvement, and not before this many times the
#: epoch of its lowest held-out loss: on small data that loss can rest on a plateau for hundreds of epochs before it
#: falls again.
SHADOW_PATIENCE_RATIO = 2.0
#: ``max_epochs="auto"``: AUTO_MAX_EPOCHS_STOPPED where training stops on held-out rows (either kind of early
#: stopping), else AUTO_MAX_EPOCHS.
AUTO_MAX_EPOCHS, AUTO_MAX_EPOCHS_STOPPED = 500, 2000
#: The ways training can stop: on all the epochs, on the network's own held-out rows, on a shadow copy's.
STOPPING_MODES = ("off", "held_out", "shadow")
#: Optimizers with a fused implementation in torch (one kernel for the update of all parameters).
_FUSABLE = ("adam", "adamw")
#: The learning-rate schedules by name (:func:`lr_factor`).
SCHEDULES = ("constant", "warmup_cosine")
#: ``n_networks="auto"``: this many networks for the classifier below ``AUTO_EARLY_STOPPING_ROWS`` training rows
#: when it builds them (not from a module instance), else one (:meth:`Training.networks`).
AUTO_NETWORKS = 3
#: ``schedule="warmup_cosine"``: the share of the optimizer steps spent warming up linearly from 0.
WARMUP_SHARE = 0.05


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


#: The prior precisions c that ``weight_decay="cv"`` chooses among: weight decay c / n, the MAP under N(0, 1 / c).
CV_PRIOR_PRECISIONS = (1.0, 3.0, 10.0)
#: Folds of ``weight_decay="cv"``.
CV_FOLDS = 3


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


def build_optimizer(optimizer, params, *, lr: float, weight_decay: float, fused: bool = False):
    """``optimizer(params, lr=lr, weight_decay=weight_decay)`` for a name of ``OPTIMIZERS`` or an optimizer class;
    with ``fused`` and "adam" / "adamw", torch's fused kernel called directly (:class:`~glas_sklearn._fused_adam.
    FusedAdam`: the same update to the last bit as ``torch.optim.Adam(fused=True)``, without its per-step
    overhead; torch's own fused optimizer for groups mixing devices or dtypes; torch's for-loop update where torch
    has no fused kernel for the parameters' device and dtype).
    ``params``: tensors or parameter groups."""
    if isinstance(optimizer, str):
        opt_cls = OPTIMIZERS[optimizer]
        if fused and optimizer in _FUSABLE:
            params = list(params)
            lean = lean_fused_adam(params, lr=lr, weight_decay=weight_decay, decoupled=optimizer == "adamw")
            if lean is not None:
                return lean
            try:  # groups mixing devices or dtypes: torch's fused optimizer groups them itself
                return opt_cls(params, lr=lr, weight_decay=weight_decay, fused=True)
            except (RuntimeError, ValueError, TypeError):  # no fused kernel here: the plain update
                pass
        return opt_cls(params, lr=lr, weight_decay=weight_decay)
    return optimizer(params, lr=lr, weight_decay=weight_decay)


@dataclass
class TrainingResult(CopyRecord):
    """What :func:`train_module` did.

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

    validation_indices: np.ndarray | None = None
    n_rows_trained: int = 0
    batch_rows: int = 0
    max_epochs: int = 0
    seconds: float = 0.0
    weight_decay: float = 0.0
    weight_decay_search: dict | None = None
    shadow_epochs: int | None = None
    n_networks: int = 1


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
                total += float((w * per_row_losses(loss, out, target).to(w.dtype)).sum())
                weight += float(w.sum())
    module.train(was_training)
    return total / weight


def train_module(module: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: Callable, *, optimizer, lr: float,
                 weight_decay: float, batch_size: int | None, max_epochs: int, seed: int, verbose: int = 0,
                 owner: str = "train_module", sample_weight: torch.Tensor | None = None,
                 validation: tuple | None = None, validation_loss: Callable | None = None,
                 n_iter_no_change: int = 10, tol: float = 1e-4, fused: bool = False,
                 schedule: str = "constant", schedule_epochs: int | None = None, patience_ratio: float = 0.0,
                 desc: str = "training", planned: str | None = None) -> TrainingResult:
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
    schedule : {"constant", "warmup_cosine"}, default="constant"
        The learning rate of each optimizer step, ``lr`` × :func:`lr_factor` over the ``max_epochs`` epochs' steps.
    schedule_epochs : int, optional
        The epochs the schedule spans, when training stops before them (default: ``max_epochs``).
    patience_ratio : float, default=0.0
        Early stopping waits, besides the patience, until the epoch is at least this many times the best epoch.
    desc : str, default="training"
        The progress bar's label.
    planned : str, optional
        Why ``max_epochs`` is the length of this run, where it is a planned length rather than a cap: the stop
        reason recorded and logged when all the epochs run (default ``"max_epochs=N reached"``).

    Returns
    -------
    TrainingResult
        Loss curves, epochs run, the epoch kept and why training stopped.
    """
    result = TrainingResult()
    best_state = None
    with seeded_torch(seed + 1, X.device):  # dropout & co. draw from the seeded global RNG
        module.train()
        opt = build_optimizer(optimizer, module.parameters(), lr=lr, weight_decay=weight_decay, fused=fused)
        gen = torch.Generator().manual_seed(seed)
        n = X.shape[0]
        slices = batch_slices(n, batch_size or n)
        # per-row factors w_i / w̄ (mean 1 over the rows): a batch's loss is the mean of (w_i / w̄) ℓ_i
        factors = None if sample_weight is None else sample_weight / sample_weight.mean()
        rule = HeldOutStopping(tol, patience_epochs(n_iter_no_change, len(slices)), patience_ratio)
        total_steps, step = (schedule_epochs or max_epochs) * len(slices), 0
        result.stop_reason = planned or f"max_epochs={max_epochs} reached"
        bar = progress(range(max_epochs), desc=desc, verbose=verbose, leave=False)
        for epoch in bar:
            perm = torch.randperm(n, generator=gen).to(X.device)
            total = torch.zeros((), dtype=torch.float64, device=X.device)  # on the device: no sync a step
            for sl in slices:
                idx = perm[sl]
                if schedule != "constant":
                    for group in opt.param_groups:
                        group["lr"] = lr * lr_factor(schedule, step, total_steps)
                    step += 1
                opt.zero_grad(set_to_none=True)
                if factors is None:
                    batch_loss = loss(module(X[idx]), y[idx])
                else:
                    per_row = per_row_losses(loss, module(X[idx]), y[idx])
                    batch_loss = (factors[idx].to(per_row.dtype) * per_row).mean()
                batch_loss.backward()
                opt.step()
                total += batch_loss.detach().to(torch.float64) * len(idx)
            result.loss_curve.append(float(total) / n)
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
            if not np.isfinite(score):
                raise FloatingPointError(f"{owner}: the held-out loss diverged to {score}; lower lr or standardize "
                                         "the data.")
            if rule.observe(score, epoch + 1):
                result.best_epoch = rule.best_epoch
                best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            if rule.stop:
                result.stop_reason = rule.reason()
                break
    if best_state is not None:
        module.load_state_dict(best_state)
        result.stop_reason += rule.kept()
    module.eval()
    for p in module.parameters():
        p.grad = None
    logger.info("%s: training stopped after %d epochs: %s", owner, result.n_iter, result.stop_reason)
    return result


def shadow_plan(shadow: TrainingResult, n_held_out: int) -> str:
    """Why a network trains for the epochs its shadow copy chose: its stop reason."""
    return (f"the {shadow.best_epoch} epochs at which a trial run of the network, with {n_held_out} of the rows "
            f"held out, did best on those rows (held-out loss {shadow.best_validation_score:.4g}; the trial run "
            f"stopped after {shadow.n_iter} epochs: {shadow.stop_reason.split(';')[0]})")


def lr_factor(schedule: str, step: int, total_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total_steps``, as a multiple of ``lr``:
    "constant" 1; "warmup_cosine" a linear warm-up from 0 over the first ``WARMUP_SHARE`` of the steps (at least
    one), then a half cosine down to 0 at the last step."""
    if schedule == "constant" or total_steps <= 1:
        return 1.0
    warmup = max(1, int(WARMUP_SHARE * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress_share = (step - warmup) / max(1, total_steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress_share)))


def can_stratify(y, n_held: int) -> bool:
    """A stratified split needs two rows of every class and room for every class on both sides."""
    _, counts = np.unique(y, return_counts=True)
    return counts.min() >= 2 and len(counts) <= min(n_held, len(y) - n_held)


# ------------------------------------------------------------------------------------------ the network recipe
def trainable_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype of a module's trainable weights: with mixed precisions (peft's float32 LoRA matrices beside a
    bfloat16 head) the widest, as the posterior holds them; None without trainable parameters."""
    dtypes = sorted({p.dtype for p in module.parameters() if p.requires_grad}, key=str)
    return functools.reduce(torch.promote_types, dtypes) if dtypes else None


def user_module(module) -> nn.Module | None:
    """The nn.Module inside ``module`` when it is an instance (or a fitted skorch net)."""
    if isinstance(module, nn.Module):
        return module
    inner = getattr(module, "module_", None)  # skorch's NeuralNet after fit
    return inner if isinstance(inner, nn.Module) else None


def member_seed(seed: int, k: int) -> int:
    """The seed of the k-th network of an ensemble (k = 0: ``seed`` itself, the one network of ``n_networks=1``)."""
    return (seed + k * _MEMBER_SEED) % 2**31


def build_network(module, module_kwargs: dict | None, n_features: int, n_outputs: int, seed: int,
                  likelihood, *, fresh: bool = False, owner: str = "Training") -> nn.Module:
    """A new network to train: a copy of the user's instance, ``module(**module_kwargs)`` for a callable, or the
    default MLP (wrapped by the likelihood, e.g. its variance head); initial weights from ``seed``, the global RNG
    untouched. Never the user's own instance. ``fresh``: a copy of an instance gets new initial weights too, from
    its layers' ``reset_parameters`` (another member of an ensemble; a warning names the weights no layer resets,
    which start as the instance's)."""
    user = user_module(module)
    kwargs = dict(module_kwargs or {})
    with seeded_torch(seed, torch.device("cpu")):
        if user is not None:
            net = copy.deepcopy(user)
            return _reinitialised(net, seed, owner) if fresh else net
        if module is None:
            return likelihood.wrap_module(default_mlp(n_features, n_outputs, **kwargs))
        if callable(module):
            built = module(**kwargs)
            if not isinstance(built, nn.Module):
                raise TypeError(f"module(**module_kwargs) must return a torch.nn.Module, got {type(built).__name__}.")
            return built
    raise TypeError(f"module must be None, a torch.nn.Module, a fitted skorch net or a callable returning one; "
                    f"got {type(module).__name__}.")


def _reinitialised(net: nn.Module, seed: int, owner: str) -> nn.Module:
    """``net`` with new initial weights drawn from ``seed`` by the ``reset_parameters`` of every submodule whose
    own weights all train (frozen ones are left as they are)."""
    param = next(net.parameters(), None)
    covered: set[int] = set()
    with seeded_torch(seed, torch.device("cpu") if param is None else param.device):
        for sub in net.modules():
            reset, own = getattr(sub, "reset_parameters", None), list(sub.parameters(recurse=False))
            if callable(reset) and all(p.requires_grad for p in own):  # a frozen layer keeps its weights
                reset()
                covered.update(id(p) for p in own)
    left = [name for name, p in net.named_parameters() if p.requires_grad and id(p) not in covered]
    if left:
        warnings.warn(f"{owner}: training__n_networks > 1 re-initialises each copy of the module by its layers' "
                      f"reset_parameters, but no layer resets {', '.join(left[:5])}"
                      f"{' ...' if len(left) > 5 else ''}: those weights start equal in every network.",
                      UserWarning, stacklevel=user_stacklevel())
    return net


def prefit_network(module, device: torch.device, dtype: torch.dtype, owner: str, dtype_setting) -> nn.Module:
    """The user's trained module, used as it is: it must live on the estimator's device and dtype."""
    user = user_module(module)
    if user is None:
        raise ValueError(f"{owner}: prefit=True needs module to be a trained torch.nn.Module (or a fitted skorch "
                         f"net), got {type(module).__name__}.")
    p = next((p for p in user.parameters() if p.requires_grad), None)
    if p is not None and (p.device != device or trainable_dtype(user) != dtype):
        raise ValueError(f"{owner}: the prefit module lives on {p.device} with dtype {trainable_dtype(user)}, but the "
                         f"estimator was asked for device={str(device)!r}, dtype={dtype_setting!r}; set "
                         "compute=Compute(device=..., dtype=...) to match the module (it is never moved or copied).")
    return user


def called_as_network(module: nn.Module, x1: torch.Tensor, padding_idx) -> nn.Module:
    """The module as it is when ``module(X)`` returns the predictions tensor; else (keyword inputs such as
    ``input_ids`` / ``attention_mask``, a ``ModelOutput``, dict or tuple) a
    :class:`~glas_sklearn.adapters.ModelAdapter` around it (the mask from ``padding_idx``), never a copy."""
    adapter = as_adapter(module, padding_idx=padding_idx)
    if adapter is module or not adapter.is_trivial:
        return adapter
    try:
        with torch.no_grad():
            raw = eval_view(module)(x1)
    except Exception:  # noqa: BLE001 - check_network reports a module that cannot be evaluated
        return module
    return module if isinstance(raw, torch.Tensor) else adapter


def check_trainable(module: nn.Module, owner: str, prefit: bool) -> None:
    """A module without trainable weights is refused before any training (there is no weight posterior)."""
    if not any(p.requires_grad for p in unwrap_model(module).parameters()):
        what = "" if prefit else "there is nothing to train, and "
        raise ValueError(f"{owner}: the module {type(unwrap_model(module)).__name__} has no trainable parameters "
                         f"(none with requires_grad=True): {what}the posterior is over the trainable weights. "
                         "Unfreeze the layers whose uncertainty you want (p.requires_grad_(True)).")


def _one_dimensional_output(name: str, out: torch.Tensor, n_rows: int, n_outputs: int, task: str) -> str:
    """The refusal of a module whose output has no output axis: what it returns, what is needed, how to fix it."""
    got = f"shape {tuple(out.shape)} for {n_rows} row{'s' if n_rows != 1 else ''}"
    if n_outputs == 1 and out.ndim == 1:
        return (f"{name}: the module returns one value per row as a 1-D tensor ({got}), but the estimator needs a "
                f"2-D output of shape (n, 1), one column per output. Keep the output axis: end forward with "
                f"out.unsqueeze(-1) or out.reshape(-1, 1), or drop a final squeeze() / [:, 0] (nn.Linear(..., 1) "
                f"already returns (n, 1)).")
    return (f"{name}: the module returns a {out.ndim}-D tensor ({got}), but this {task} problem needs {n_outputs} "
            f"outputs per row, a 2-D tensor of shape (n, {n_outputs}); return out.reshape(len(x), {n_outputs}) with "
            "one row per input row.")


def check_output_shape(module, x1: torch.Tensor, n_outputs: int, likelihood, owner: str) -> None:
    """The module evaluates on a row and returns (1, n_outputs) in the layout the likelihood reads."""
    try:
        with torch.no_grad():
            out = eval_view(module)(x1)  # a prefit module in train mode is probed through an eval-mode view
    except (RuntimeError, TypeError, IndexError, ValueError) as err:
        hint = ""
        if not x1.is_floating_point():
            hint = (" Integer inputs reach the module as torch.long token ids; for a table of integer-valued "
                    "features pass X.astype(float).")
        raise ValueError(f"{owner}: the module cannot be evaluated on rows of shape {tuple(x1.shape[1:])} and "
                         f"dtype {x1.dtype}: {err}.{hint}") from err
    if isinstance(out, torch.Tensor) and out.ndim == 2:
        try:
            likelihood.check_module_output(out, n_outputs)
        except ValueError as err:
            raise ValueError(f"{owner}: {err}") from err
    if isinstance(out, torch.Tensor) and out.ndim <= 1:
        raise ValueError(_one_dimensional_output(owner, out, x1.shape[0], n_outputs, likelihood.problem))
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[1] != n_outputs:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        hint = ""
        if isinstance(out, torch.Tensor) and out.ndim > 2:
            hint = (" Per-position outputs (n, T, M), e.g. next-token logits, are not predictions per row: "
                    "use glas_sklearn.laplace.fit_laplace_subspace(model, X, mask=X != padding_idx).")
        raise ValueError(f"{owner}: the module returns outputs of shape {shape}, but {n_outputs} output(s) per "
                         f"row are needed for this {likelihood.problem} problem: (n, {n_outputs}).{hint}")


def choose_threads(n_threads, module: nn.Module, batch_rows: int):
    """The torch intra-op thread count for a network about to be trained (or used, prefit), set for the running
    call: ``n_threads`` as given, or for "auto" :func:`~glas_sklearn._threads.auto_threads` of the trainable
    weights × rows per batch; None leaves torch's setting alone."""
    if isinstance(n_threads, str):  # "auto", the only string allowed
        n_weights = sum(p.numel() for p in module.parameters() if p.requires_grad)
        n_threads = auto_threads(n_weights, batch_rows)
    if n_threads is not None:
        adjust_threads(n_threads)
    return n_threads


# ------------------------------------------------------------------------------------------ the settings
def _is_optimizer_class(value) -> bool:
    return isinstance(value, type) and issubclass(value, torch.optim.Optimizer)


# Offset of the seed of the early-stopping validation split (within the training rows).
_VALIDATION_SPLIT = 104729
# Offset between the seeds of an ensemble's networks (member_seed).
_MEMBER_SEED = 6151
# Offset of the seed of the folds of weight_decay="cv".
_CV_SPLIT = 7727


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
        "optimizer": [Options(*OPTIMIZERS), Satisfies(_is_optimizer_class, "a torch.optim.Optimizer subclass")],
        "schedule": [Options(*SCHEDULES)],
        "early_stopping": [Options("auto", "shadow"), BOOLEAN],
        "validation_fraction": [Options("auto"), Interval(numbers.Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Interval(numbers.Integral, 1, None)],
        "tol": [Interval(numbers.Real, 0, None)],
        "n_networks": [Options("auto"), Interval(numbers.Integral, 1, None)],
        "module_kwargs": [None, InstanceOf(dict, "a dict")],
        "standardize": [Options("auto"), BOOLEAN],
    }

    def __init__(self, max_epochs="auto", lr="auto", batch_size="auto", weight_decay="auto", optimizer="adam",
                 schedule="constant", early_stopping="auto", validation_fraction="auto", n_iter_no_change=10, tol=1e-4,
                 n_networks="auto", module_kwargs=None, standardize="auto"):
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

    def fit(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, likelihood, *, seed: int,
            sample_weight: torch.Tensor | None = None, weight_prior_std: float | None = None, verbose: int = 0,
            owner: str = "Training", cv_precision: float | None = None) -> TrainingResult:
        """Train ``module`` (the estimator's own network) in place on the training rows (less the validation rows
        held out of them for early stopping; all of them after a shadow copy), on ``likelihood.loss``; its history
        returned. ``weight_prior_std`` is
        the prior that ``weight_decay="auto"`` trains the MAP under (None: no weight decay, :meth:`decay`);
        ``weight_decay="cv"`` first chooses the prior by :meth:`cross_validate_decay`, unless ``cv_precision``
        gives the one an earlier search chose (another network of an ensemble)."""
        t0 = time.perf_counter()
        search = None
        if self.weight_decay == "cv" and cv_precision is None:
            search = self.cross_validate_decay(module, Xt, yt, likelihood, seed=seed, sample_weight=sample_weight,
                                               verbose=verbose, owner=owner)
            cv_precision = search["chosen"]
        result = self._train(module, Xt, yt, likelihood, weight_prior_std, cv_precision, seed=seed,
                             sample_weight=sample_weight, verbose=verbose, owner=owner)
        result.weight_decay_search = search
        result.seconds = time.perf_counter() - t0
        return result

    def fit_together(self, modules: Sequence[nn.Module], Xt: torch.Tensor, yt: torch.Tensor, likelihood, *,
                     seeds: Sequence[int], sample_weight: torch.Tensor | None = None,
                     weight_prior_std: float | None = None, verbose: int = 0, owners: Sequence[str],
                     cv_precision: float | None = None) -> list[TrainingResult] | None:
        """Train the networks of an ensemble (``modules``, one architecture, from their own initial weights and
        ``seeds``) in place, each as :meth:`fit` trains one (its own validation rows, shadow copy and epochs), all
        in the same optimizer steps (:func:`~glas_sklearn._copies.train_stacked`, their products batched) where
        the network is a stack of linear layers (:func:`~glas_sklearn._copies.can_stack_layers`). None, with
        nothing trained, for other networks (train them one by one with :meth:`fit`). ``seconds`` of the
        first record is the whole training's, the others' 0."""
        if len(modules) < 2 or not can_stack_layers(modules[0], Xt[:1]):
            return None
        t0 = time.perf_counter()
        search = None
        if self.weight_decay == "cv" and cv_precision is None:
            search = self.cross_validate_decay(modules[0], Xt, yt, likelihood, seed=seeds[0],
                                               sample_weight=sample_weight, verbose=verbose, owner=owners[0])
            cv_precision = search["chosen"]
        n = len(yt)
        mode = self.stopping(n)
        splits = [self.validation_rows(yt, s, likelihood.is_classification, o, mode)
                  for s, o in zip(seeds, owners, strict=True)]
        stacked = functools.partial(self._stacked, Xt=Xt, yt=yt, likelihood=likelihood, prior_std=weight_prior_std,
                                    cv_precision=cv_precision, seeds=seeds, sample_weight=sample_weight,
                                    verbose=verbose, owner=owners[0])
        if mode != "shadow":  # "off" trains all the epochs; "held_out" stops on each network's held-out rows
            records = stacked(modules, [fit for fit, _ in splits], max_epochs=self.epochs(mode),
                              held_out=None if mode == "off" else [val for _, val in splits])
        else:
            shadows = stacked([copy.deepcopy(m) for m in modules], [fit for fit, _ in splits],
                              max_epochs=self.epochs(mode), held_out=[val for _, val in splits],
                              patience_ratio=SHADOW_PATIENCE_RATIO, desc=f"training {len(modules)} networks "
                                                                          "(shadow copies)")
            for shadow, owner in zip(shadows, owners, strict=True):
                logger.info("%s (shadow copy): training stopped after %d epochs: %s", owner, shadow.n_iter,
                            shadow.stop_reason)
            planned = [shadow_plan(s, len(val)) for s, (_, val) in zip(shadows, splits, strict=True)]
            records = stacked(modules, [np.arange(n)] * len(modules), max_epochs=[s.best_epoch for s in shadows],
                              schedule_epochs=self.epochs(mode), planned=planned)
            for record, shadow in zip(records, shadows, strict=True):
                record.validation_scores, record.best_epoch = shadow.validation_scores, shadow.best_epoch
                record.shadow_epochs = shadow.n_iter
        for record, (_, val), owner in zip(records, splits, owners, strict=True):
            record.validation_indices, record.max_epochs = val, self.epochs(mode)
            logger.info("%s: training stopped after %d epochs: %s", owner, record.n_iter, record.stop_reason)
        records[0].weight_decay_search = search
        records[0].seconds = time.perf_counter() - t0
        return records

    def _steps(self, n_fit: int) -> dict:
        """The optimizer (``build``) and learning rate of each step (``lr_at``) of networks trained together on
        ``n_fit`` rows each, as :func:`train_module` has them for one: "adam" / "adamw" fused, one kernel a step
        for all the stacked weights, each network's weight decay in its parameter group."""
        lr = self.learning_rate(n_fit)
        return {"build": lambda groups: build_optimizer(self.optimizer, groups, lr=lr, weight_decay=0.0, fused=True),
                "lr_at": None if self.schedule == "constant"
                else lambda step, total: lr * lr_factor(self.schedule, step, total)}

    def _stacked(self, modules: Sequence[nn.Module], row_sets: list, *, Xt: torch.Tensor, yt: torch.Tensor,
                 likelihood, prior_std: float | None, cv_precision: float | None, seeds: Sequence[int],
                 sample_weight: torch.Tensor | None, verbose: int, owner: str, max_epochs, held_out: list | None = None,
                 patience_ratio: float = 0.0, schedule_epochs: int | None = None, planned: list | None = None,
                 desc: str | None = None) -> list[TrainingResult]:
        """:func:`~glas_sklearn._copies.train_stacked` of ``modules`` on their row sets with these settings (as
        :meth:`_run` trains one), the trained weights copied into ``modules``; their records."""
        n_fit = len(row_sets[0])
        w_fit = [None if sample_weight is None else sample_weight[torch.as_tensor(r, device=Xt.device)]
                 for r in row_sets]
        decays = [self.decay(n_fit if w is None else float(w.sum()), prior_std, cv_precision) for w in w_fit]
        validation = None
        if held_out is not None:
            index = [torch.as_tensor(v, device=Xt.device) for v in held_out]
            validation = [(Xt[i], yt[i], None if sample_weight is None else sample_weight[i]) for i in index]
        networks, copies = train_stacked(
            list(modules), Xt, yt, likelihood.loss, row_sets=row_sets, weight_decays=decays,
            batch_size=self.batch_rows(n_fit), max_epochs=max_epochs, seed=list(seeds), sample_weight=sample_weight,
            **self._steps(n_fit), schedule_epochs=schedule_epochs, validation=validation,
            validation_loss=likelihood.held_out_loss,
            tol=self.tol, n_iter_no_change=self.n_iter_no_change, patience_ratio=patience_ratio, planned=planned,
            verbose=verbose, owner=owner, names=[f"network {m + 1} of {len(modules)}" for m in range(len(modules))],
            desc=desc or f"training {len(modules)} networks")
        results = []
        with torch.no_grad():
            for module, trained, record, decay in zip(modules, networks, copies, decays, strict=True):
                for p, q in zip(module.parameters(), trained.parameters(), strict=True):
                    p.copy_(q)
                module.eval()
                results.append(TrainingResult(**vars(record), n_rows_trained=n_fit,
                                              batch_rows=min(self.batch_rows(n_fit) or n_fit, n_fit),
                                              weight_decay=decay))
        return results

    def cross_validate_decay(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, likelihood, *, seed: int,
                             sample_weight: torch.Tensor | None = None, verbose: int = 0,
                             owner: str = "Training") -> dict:
        """The prior precision c of ``CV_PRIOR_PRECISIONS`` (weight decay c / n) whose networks, each trained from
        ``module``'s initial weights (copies; ``module`` is untouched) on ``CV_FOLDS`` − 1 folds of the rows, have
        the lowest mean held-out loss (``likelihood.held_out_loss``, weighted by ``sample_weight``) on the fold
        left out; folds stratified by class where every class has ``CV_FOLDS`` rows, seeded from ``seed``.

        Returns
        -------
        dict
            ``precisions``, ``losses`` (one per precision), ``chosen``, ``folds`` and ``seconds``.
        """
        t0 = time.perf_counter()
        n = len(yt)
        if n < 2 * CV_FOLDS:
            raise ValueError(f"{owner}: weight_decay='cv' needs at least {2 * CV_FOLDS} training rows for "
                             f"{CV_FOLDS} folds, got {n}; pass a fixed weight_decay (e.g. 'auto').")
        labels = yt.detach().cpu().numpy().reshape(n, -1)[:, 0] if likelihood.is_classification else None
        stratify = labels is not None and np.unique(labels, return_counts=True)[1].min() >= CV_FOLDS
        splitter = (StratifiedKFold if stratify else KFold)(CV_FOLDS, shuffle=True,
                                                            random_state=(seed + _CV_SPLIT) % 2**31)
        weights = np.ones(n) if sample_weight is None else sample_weight.detach().cpu().double().numpy()
        folds = list(splitter.split(np.zeros((n, 1)), labels if stratify else None))
        nets = self._cv_networks(module, Xt, yt, likelihood, folds, seed=seed, sample_weight=sample_weight,
                                 verbose=verbose, owner=owner)
        losses = np.zeros(len(CV_PRIOR_PRECISIONS))
        for k, (_, fold_out) in enumerate(folds):
            out_index = torch.as_tensor(fold_out, device=Xt.device)
            w_out = None if sample_weight is None else sample_weight[out_index]
            for i in range(len(CV_PRIOR_PRECISIONS)):
                loss = held_out_loss(nets[k][i], Xt[out_index], yt[out_index], likelihood.held_out_loss, w_out)
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

    def _cv_networks(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, likelihood, folds: list, *,
                     seed: int, sample_weight: torch.Tensor | None, verbose: int, owner: str) -> list[list[nn.Module]]:
        """The networks of the search, ``[fold][precision]``, each trained from ``module``'s weights on its fold's
        rows with weight decay c / n: all at once (:func:`~glas_sklearn._copies.train_copies`) where the folds
        train without early stopping and ``module`` runs under ``vmap``, else one by one. A fold stops on rows held
        out of it where the kept network would (``early_stopping=True``, or "auto" from 2,000 rows); otherwise it
        trains ``max_epochs`` (500 for "auto"), without a shadow copy of its own."""
        fit_sets = [fit for fit, _ in folds]
        n_fit = min(len(fit) for fit in fit_sets)
        modes = ["held_out" if self.stopping(len(fit)) == "held_out" else "off" for fit in fit_sets]  # no copies
        early = "held_out" in modes
        if not early and can_train_copies(module, Xt[:2], yt[:2], likelihood.loss):
            sets, decays = [], []
            for fit in fit_sets:
                index = torch.as_tensor(fit, device=Xt.device)
                n_weight = len(fit) if sample_weight is None else float(sample_weight[index].sum())
                for c in CV_PRIOR_PRECISIONS:
                    sets.append(fit)
                    decays.append(self.decay(n_weight, None, c))
            nets = train_copies(module, Xt, yt, likelihood.loss, row_sets=sets, weight_decays=decays,
                                batch_size=self.batch_rows(n_fit), max_epochs=self.epochs("off"), seed=seed,
                                sample_weight=sample_weight, verbose=verbose, owner=owner, **self._steps(n_fit))
            k = len(CV_PRIOR_PRECISIONS)
            return [nets[i * k:(i + 1) * k] for i in range(len(fit_sets))]
        nets = []
        for fit, mode in zip(fit_sets, modes, strict=True):
            fit_index = torch.as_tensor(fit, device=Xt.device)
            w_fit = None if sample_weight is None else sample_weight[fit_index]
            nets.append([])
            for precision in CV_PRIOR_PRECISIONS:
                net = copy.deepcopy(module)
                self._train(net, Xt[fit_index], yt[fit_index], likelihood, None, precision, seed=seed,
                            sample_weight=w_fit, verbose=0, owner=owner, mode=mode)
                nets[-1].append(net)
        return nets

    def _train(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, likelihood, prior_std: float | None,
               cv_precision: float | None, *, seed: int, sample_weight: torch.Tensor | None, verbose: int,
               owner: str, mode: str | None = None) -> TrainingResult:
        """One training of ``module`` on the rows (Xt, yt) with the weight decay of :meth:`decay` (``prior_std``,
        ``cv_precision``), stopped as ``mode`` (default :meth:`stopping`): on all its epochs, on validation rows held
        out of it, or after the epochs a shadow copy chose."""
        t0 = time.perf_counter()
        mode = self.stopping(len(yt)) if mode is None else mode
        fit_rows, val_rows = self.validation_rows(yt, seed, likelihood.is_classification, owner, mode)
        if mode == "off":
            result = self._run(module, Xt, yt, sample_weight, likelihood, prior_std, cv_precision, seed=seed,
                               verbose=verbose, owner=owner, max_epochs=self.epochs(mode))
        else:
            fit_index, val_index = (torch.as_tensor(r, device=Xt.device) for r in (fit_rows, val_rows))
            validation = (Xt[val_index], yt[val_index], None if sample_weight is None else sample_weight[val_index])
            w_fit = None if sample_weight is None else sample_weight[fit_index]
            if mode == "held_out":
                result = self._run(module, Xt[fit_index], yt[fit_index], w_fit, likelihood, prior_std, cv_precision,
                                   seed=seed, verbose=verbose, owner=owner, max_epochs=self.epochs(mode),
                                   validation=validation)
            else:
                shadow = self._run(copy.deepcopy(module), Xt[fit_index], yt[fit_index], w_fit, likelihood,
                                   prior_std, cv_precision, seed=seed, verbose=verbose, owner=f"{owner} (shadow copy)",
                                   max_epochs=self.epochs(mode), validation=validation,
                                   patience_ratio=SHADOW_PATIENCE_RATIO, desc="training (shadow copy)")
                planned = shadow_plan(shadow, len(val_rows))
                # the learning rate of each step as the copy had it (a schedule spans the copy's max_epochs)
                result = self._run(module, Xt, yt, sample_weight, likelihood, prior_std, cv_precision, seed=seed,
                                   verbose=verbose, owner=owner, max_epochs=shadow.best_epoch,
                                   schedule_epochs=self.epochs(mode), planned=planned)
                result.validation_scores, result.best_epoch = shadow.validation_scores, shadow.best_epoch
                result.shadow_epochs = shadow.n_iter
        result.validation_indices = val_rows
        result.max_epochs = self.epochs(mode)
        result.seconds = time.perf_counter() - t0
        return result

    def _run(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, sample_weight: torch.Tensor | None,
             likelihood, prior_std: float | None, cv_precision: float | None, *, seed: int, verbose: int, owner: str,
             max_epochs: int, validation: tuple | None = None, patience_ratio: float = 0.0,
             desc: str = "training", schedule_epochs: int | None = None,
             planned: str | None = None) -> TrainingResult:
        """:func:`train_module` on the rows (Xt, yt) with these settings, its record completed."""
        batch_size = self.batch_rows(len(Xt))
        weight_decay = self.decay(len(Xt) if sample_weight is None else float(sample_weight.sum()), prior_std,
                                  cv_precision)
        result = train_module(
            module, Xt, yt, likelihood.loss, optimizer=self.optimizer, lr=self.learning_rate(len(Xt)),
            weight_decay=weight_decay, batch_size=batch_size, max_epochs=max_epochs, seed=seed, verbose=verbose,
            owner=owner, sample_weight=sample_weight, validation=validation,
            validation_loss=likelihood.held_out_loss, tol=self.tol, n_iter_no_change=self.n_iter_no_change,
            fused=True, schedule=self.schedule, schedule_epochs=schedule_epochs, patience_ratio=patience_ratio,
            desc=desc, planned=planned)
        result.n_rows_trained = len(Xt)
        result.batch_rows = min(batch_size or len(Xt), len(Xt))
        result.weight_decay = weight_decay
        return result


def training_line(result: TrainingResult, threads: str) -> str:
    """E.g. "training: 500 epochs on 696 rows (batches of 64), 12.3 s, loss 0.0123 (first epoch 0.912);
    1 torch thread (auto)", or with early stopping "training: 37 epochs on 36,000 rows (batches of 200; 4,000
    held out, stopped early, best held-out loss 0.123), ...", or after a shadow copy "training: 1,876 epochs on 250
    rows (batches of 64; as many epochs as a trial run with 50 of the rows held out did best at: held-out loss
    0.0123 at epoch 1,876 of the 2,000 it ran), ..."."""
    losses, held_out = result.loss_curve, result.validation_indices
    detail = f"batches of {result.batch_rows}"
    if result.shadow_epochs is not None:
        detail += (f"; as many epochs as a trial run with {len(held_out):,} of the rows held out did best at: "
                   f"held-out loss {result.best_validation_score:.4g} at epoch {result.best_epoch:,} of the "
                   f"{result.shadow_epochs:,} it ran")
    elif held_out is not None:
        stopped = "stopped early" if len(losses) < result.max_epochs else "ran max_epochs"
        detail += f"; {len(held_out):,} held out, {stopped}, best held-out loss {result.best_validation_score:.4g}"
    networks = "" if result.n_networks == 1 else f"{result.n_networks} networks of "
    text = (f"training: {networks}{len(losses)} epochs on {result.n_rows_trained:,} rows ({detail}), "
            f"{result.seconds:.1f} s")
    if losses:
        text += f", loss {losses[-1]:.4g} (first epoch {losses[0]:.4g})"
    search = result.weight_decay_search
    if search is not None:
        text += (f"; weight decay {search['chosen']:g} / n by {search['folds']}-fold cross-validation "
                 f"({search['seconds']:.1f} s)")
    return f"{text}; {threads}"
