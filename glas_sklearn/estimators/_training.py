"""The network recipe of the estimators: the user's module, or the default MLP built from ``module_kwargs``, its
checks before training, the thread count it trains with, and the training line of the fit's report. How it trains
is :mod:`glas_sklearn.training` (:class:`~glas_sklearn.training.Training`, re-exported here).
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from .._functional import eval_view
from .._silenced import user_stacklevel
from .._threads import adjust_threads, auto_threads
from ..adapters import as_adapter, unwrap_model
from ..training import Training, TrainingResult, can_stratify
from ..training.pieces import seeded_torch

__all__ = ["ACTIVATIONS", "Training", "TrainingResult", "build_network", "called_as_network", "can_stratify",
           "check_output_shape", "check_trainable", "choose_threads", "default_mlp", "member_seed", "prefit_network",
           "trainable_dtype", "training_line", "user_module"]

# Offset between the seeds of an ensemble's networks (member_seed).
_MEMBER_SEED = 6151

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


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

