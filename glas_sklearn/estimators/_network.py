"""The network θ0 of an estimator: the user's module (an instance, a fitted skorch net or a callable), the
default MLP, or a prefit module used as it is; and the check that it returns one prediction row per input row."""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from .._functional import eval_view
from ..adapters import as_adapter
from ._training import default_mlp, seeded_torch

__all__ = ["NetworkMixin", "trainable_dtype"]


def trainable_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype of a module's trainable weights: with mixed precisions (peft's float32 LoRA matrices beside a
    bfloat16 head) the widest, as the posterior holds them; None without trainable parameters."""
    dtypes = sorted({p.dtype for p in module.parameters() if p.requires_grad}, key=str)
    return functools.reduce(torch.promote_types, dtypes) if dtypes else None


def _one_dimensional_output(name: str, out: torch.Tensor, n_rows: int, n_outputs: int, task: str) -> str:
    """The refusal of a module whose output has no output axis: what it returns, what is needed, how to fix it."""
    got = f"shape {tuple(out.shape)} for {n_rows} row{'s' if n_rows != 1 else ''}"
    if n_outputs == 1 and out.ndim == 1:
        return (f"{name}: the module returns one value per row as a 1-D tensor ({got}), but the estimator needs a "
                f"2-D output of shape (n, 1), one column per output. Keep the output axis: end forward with "
                f"out.unsqueeze(-1) or out.reshape(-1, 1), or drop a final squeeze() / [:, 0] (nn.Linear(..., 1) "
                f"already returns (n, 1)).")
    return (f"{name}: the module returns a {out.ndim}-D tensor ({got}), but this {task} problem needs {n_outputs} "
            f"outputs per row, a "
            f"2-D tensor of shape (n, {n_outputs}); return out.reshape(len(x), {n_outputs}) with one row per input "
            f"row.")


class NetworkMixin:
    """How an estimator gets its network from ``module``, ``module_kwargs`` and ``prefit``: built (and seeded)
    for training, or the user's prefit module on the estimator's device and dtype; never the user's instance
    trained or moved."""

    def _user_module(self) -> nn.Module | None:
        """The nn.Module inside ``module`` when it is an instance (or a fitted skorch net)."""
        if isinstance(self.module, nn.Module):
            return self.module
        inner = getattr(self.module, "module_", None)  # skorch's NeuralNet after fit
        if isinstance(inner, nn.Module):
            return inner
        return None

    def _build_module(self, n_features: int, n_outputs: int, seed: int) -> nn.Module:
        user = self._user_module()
        kwargs = dict(self.module_kwargs or {})
        with seeded_torch(seed, torch.device("cpu")):  # initial weights from our seed, global RNG untouched
            if user is not None:
                return copy.deepcopy(user)  # never train the user's own instance
            if self.module is None:
                return default_mlp(n_features, n_outputs, **kwargs)
            if callable(self.module):
                module = self.module(**kwargs)
                if not isinstance(module, nn.Module):
                    raise TypeError(f"module(**module_kwargs) must return a torch.nn.Module, "
                                    f"got {type(module).__name__}.")
                return module
        raise TypeError(f"module must be None, a torch.nn.Module, a fitted skorch net or a callable returning one; "
                        f"got {type(self.module).__name__}.")

    def _prefit_module(self, device: torch.device, dtype: torch.dtype) -> nn.Module:
        """The user's trained module, used as it is: it must live on the estimator's device and dtype (one
        without trainable parameters is refused where the posterior binds it)."""
        user = self._user_module()
        if user is None:
            raise ValueError(f"{type(self).__name__}: prefit=True needs module to be a trained torch.nn.Module "
                             f"(or a fitted skorch net), got {type(self.module).__name__}.")
        p = next((p for p in user.parameters() if p.requires_grad), None)
        if p is not None and (p.device != device or trainable_dtype(user) != dtype):
            raise ValueError(f"{type(self).__name__}: the prefit module lives on {p.device} with dtype "
                             f"{trainable_dtype(user)}, "
                             f"but the estimator was asked for device={str(device)!r}, dtype={self.dtype!r}; set "
                             "device/dtype to match the module (it is never moved or copied).")
        return user

    def _called_as_network(self, module: nn.Module, x1: torch.Tensor) -> nn.Module:
        """The module as it is when ``module(X)`` returns the predictions tensor; else (keyword inputs such as
        ``input_ids`` / ``attention_mask``, a ``ModelOutput``, dict or tuple) a
        :class:`~glas_sklearn.adapters.ModelAdapter` around it (the mask from ``padding_idx``), never a copy."""
        adapter = as_adapter(module, padding_idx=self.padding_idx)
        if adapter is module or not adapter.is_trivial:
            return adapter
        try:
            with torch.no_grad():
                raw = eval_view(module)(x1)
        except Exception:  # noqa: BLE001 - _check_output_shape reports a module that cannot be evaluated
            return module
        return module if isinstance(raw, torch.Tensor) else adapter

    def _check_output_shape(self, module, x1, n_outputs) -> None:
        name = type(self).__name__
        try:
            with torch.no_grad():
                out = eval_view(module)(x1)  # a prefit module in train mode is probed through an eval-mode view
        except (RuntimeError, TypeError, IndexError, ValueError) as err:
            hint = ""
            if not x1.is_floating_point():
                hint = (" Integer inputs reach the module as torch.long token ids; for a table of integer-valued "
                        "features pass X.astype(float).")
            raise ValueError(f"{name}: the module cannot be evaluated on rows of shape {tuple(x1.shape[1:])} and "
                             f"dtype {x1.dtype}: {err}.{hint}") from err
        if isinstance(out, torch.Tensor) and out.ndim <= 1:
            raise ValueError(_one_dimensional_output(name, out, x1.shape[0], n_outputs, self.likelihood_.problem))
        if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[1] != n_outputs:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            hint = ""
            if isinstance(out, torch.Tensor) and out.ndim > 2:
                hint = (" Per-position outputs (n, T, M), e.g. next-token logits, are not predictions per row: "
                        "use glas_sklearn.laplace.fit_laplace_subspace(model, X, mask=X != padding_idx).")
            raise ValueError(f"{name}: the module returns outputs of shape {shape}, but {n_outputs} output(s) per "
                             f"row are needed for this {self.likelihood_.problem} problem: (n, {n_outputs}).{hint}")
