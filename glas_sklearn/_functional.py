"""Functional access to a torch model's weights, without ever writing into the model.

Every module that evaluates the network at perturbed weights or differentiates it goes through
these helpers: the trainable parameters are addressed as one flat vector (in ``named_parameters()``
order), and the network is called with ``torch.func.functional_call`` on a view of the model in
evaluation mode.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["ParameterLayout", "eval_view", "autodiff_context", "forward", "model_outputs"]


@dataclass(frozen=True)
class ParameterLayout:
    """Names, shapes and offsets of a model's trainable parameters in the flat weight vector.

    Attributes
    ----------
    names : tuple of str
        Parameter names, in ``model.named_parameters()`` order (trainable ones only).
    shapes : tuple of torch.Size
    numels : tuple of int
    dtype, device
        Those of the parameters (all trainable parameters must share them).
    """

    names: tuple
    shapes: tuple
    numels: tuple
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def from_model(cls, model: nn.Module) -> "ParameterLayout":
        if not isinstance(model, nn.Module):
            raise TypeError(f"Expected a torch.nn.Module, got {type(model).__name__}.")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(
                f"The model {type(model).__name__} has no trainable parameters "
                "(none with requires_grad=True); there is no weight posterior to build."
            )
        dtypes = {p.dtype for _, p in named}
        devices = {p.device for _, p in named}
        if len(dtypes) > 1 or len(devices) > 1:
            raise TypeError(
                "All trainable parameters must share one dtype and one device; found dtypes "
                f"{sorted(map(str, dtypes))} and devices {sorted(map(str, devices))}. "
                "Move the model with model.to(device, dtype) first."
            )
        if not named[0][1].dtype.is_floating_point:
            raise TypeError(f"Trainable parameters must be floating point, got {named[0][1].dtype}.")
        return cls(
            names=tuple(n for n, _ in named),
            shapes=tuple(p.shape for _, p in named),
            numels=tuple(p.numel() for _, p in named),
            dtype=named[0][1].dtype,
            device=named[0][1].device,
        )

    @property
    def size(self) -> int:
        """D, the total number of trainable weights."""
        return int(sum(self.numels))

    def flatten(self, tensors) -> torch.Tensor:
        """Concatenate a dict (by name) or sequence (in order) of parameter-shaped tensors."""
        if isinstance(tensors, dict):
            tensors = [tensors[n] for n in self.names]
        return torch.cat([t.reshape(-1) for t in tensors])

    def unflatten(self, vector: torch.Tensor) -> dict:
        """Split a flat vector of length D into a dict of parameter-shaped views."""
        parts = torch.split(vector, self.numels)
        return {n: part.view(shape) for n, part, shape in zip(self.names, parts, self.shapes)}

    def parameters_of(self, model: nn.Module) -> torch.Tensor:
        """θ0: a detached copy of the model's trainable weights as one flat vector."""
        params = dict(model.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.names]).clone()


def eval_view(model: nn.Module) -> nn.Module:
    """The model itself if every submodule is in eval mode, else an eval-mode copy sharing its tensors.

    The copy duplicates only the module structure (parameters and buffers are shared, not copied),
    so the user's model keeps its own train/eval flags and nothing is ever written into it.
    """
    if not any(m.training for m in model.modules()):
        return model
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    view = copy.deepcopy(model, memo)
    return view.eval()


def _has_rnn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.RNNBase) for m in model.modules())


@contextlib.contextmanager
def _onednn_disabled() -> Iterator[None]:
    """oneDNN off inside the block, restored after it (torch warns about Intel-GPU TF32 when
    these flags are toggled; the warning is irrelevant here and silenced on entry and exit)."""
    flags = torch.backends.mkldnn.flags(enabled=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TF32.*", category=UserWarning)
        flags.__enter__()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TF32.*", category=UserWarning)
            flags.__exit__(None, None, None)


@contextlib.contextmanager
def autodiff_context(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Gradients on, and oneDNN off for recurrent layers on CPU (forward-mode AD through
    ``nn.LSTM`` fails with oneDNN); both settings are restored on exit."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        if device.type == "cpu" and _has_rnn(model):
            stack.enter_context(_onednn_disabled())
        yield


def forward(model: nn.Module, params: dict, inputs) -> torch.Tensor:
    """Evaluate ``model`` at the weights ``params`` (a name → tensor dict) on ``inputs``."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return functional_call(model, params, args)


def model_outputs(model: nn.Module, X: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """The model's outputs on every row of ``X`` at its own weights: evaluated through an eval-mode view,
    without building a graph, ``batch_size`` rows at a time (all at once when None)."""
    view = eval_view(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    size = batch_size or X.shape[0]
    with torch.no_grad(), autodiff_context(view, X.device):
        return torch.cat([forward(view, params, X[i:i + size]) for i in range(0, X.shape[0], size)])
