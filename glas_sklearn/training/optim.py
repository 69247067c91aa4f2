"""The optimizer step and the learning-rate schedule of the training loop: :func:`build_optimizer` (a name of
``OPTIMIZERS`` or an optimizer class), :func:`lr_factor` (the schedules of ``SCHEDULES``), and Adam and AdamW in
torch's fused kernel, called without ``torch.optim``'s per-step machinery (:class:`FusedAdam`).

``torch.optim.Adam(fused=True).step`` spends most of a small network's optimizer step outside the kernel (hooks,
profiler records, regrouping the tensors by device and dtype, checking the state). :class:`FusedAdam` keeps the
state tensors torch's optimizer keeps and makes the same two calls a step (the step counts + 1, then
``torch._fused_adam_`` or ``torch._fused_adamw_`` with the same arguments), so the weights are the same to the
last bit; :func:`lean_fused_adam` returns None where that kernel is missing, and the training then builds torch's
own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["OPTIMIZERS", "SCHEDULES", "WARMUP_SHARE", "FusedAdam", "build_optimizer", "lean_fused_adam", "lr_factor"]

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
#: Optimizers with a fused implementation in torch (one kernel for the update of all parameters).
_FUSABLE = ("adam", "adamw")
#: The learning-rate schedules by name (:func:`lr_factor`).
SCHEDULES = ("constant", "warmup_cosine")
#: ``schedule="warmup_cosine"``: the share of the optimizer steps spent warming up linearly from 0.
WARMUP_SHARE = 0.05


class FusedAdam:
    """Adam (``decoupled=False``) or AdamW on parameter groups, with torch's defaults (betas (0.9, 0.999), eps 1e-8,
    no amsgrad); ``param_groups`` as torch's (``group["lr"]`` may be changed between steps)."""

    def __init__(self, params, *, lr: float, weight_decay: float, decoupled: bool) -> None:
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups = [{"lr": lr, "weight_decay": weight_decay, **g, "params": list(g["params"])}
                             for g in groups]
        self.betas, self.eps = (0.9, 0.999), 1e-8
        self._kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
        self._state = []
        for g in self.param_groups:
            # one step count per parameter, as torch keeps, held as the entries of one tensor of the group's device:
            # where every parameter has a gradient (the usual step) one addition advances them all
            counts = torch.zeros(len(g["params"]), dtype=torch.float32,
                                 device=g["params"][0].device if g["params"] else None)
            self._state.append({"exp_avg": [torch.zeros_like(p, memory_format=torch.preserve_format)
                                            for p in g["params"]],
                                "exp_avg_sq": [torch.zeros_like(p, memory_format=torch.preserve_format)
                                               for p in g["params"]],
                                "counts": counts, "step": [counts[i] for i in range(len(g["params"]))]})

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        for group, state in zip(self.param_groups, self._state, strict=True):
            live = [i for i, p in enumerate(group["params"]) if p.grad is not None]
            if not live:
                continue
            params = [group["params"][i] for i in live]
            steps = [state["step"][i] for i in live]
            if len(live) == len(group["params"]):
                state["counts"].add_(1)
            else:
                torch._foreach_add_(steps, 1)
            self._kernel(params, [p.grad for p in params], [state["exp_avg"][i] for i in live],
                         [state["exp_avg_sq"][i] for i in live], [], steps, amsgrad=False, lr=group["lr"],
                         beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=self.eps, maximize=False,
                         grad_scale=None, found_inf=None)


def lean_fused_adam(params: Iterable, *, lr: float, weight_decay: float, decoupled: bool) -> FusedAdam | None:
    """A :class:`FusedAdam` over ``params`` (tensors or parameter groups), or None where a group mixes devices or
    dtypes, or torch has no fused kernel for them (tried on a copy of the first tensor)."""
    optimizer = FusedAdam(params, lr=lr, weight_decay=weight_decay, decoupled=decoupled)
    groups = optimizer.param_groups
    if any(len({(p.device, p.dtype) for p in g["params"]}) > 1 for g in groups):
        return None
    first = next((p for g in groups for p in g["params"]), None)
    if first is None:
        return None
    probe = first.detach().clone()
    try:
        optimizer._kernel([probe], [torch.zeros_like(probe)], [torch.zeros_like(probe)], [torch.zeros_like(probe)], [],
                          [torch.ones((), dtype=torch.float32, device=probe.device)], amsgrad=False, lr=lr,
                          beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, maximize=False, grad_scale=None,
                          found_inf=None)
    except (RuntimeError, TypeError, AttributeError, NotImplementedError):
        return None
    return optimizer


def build_optimizer(optimizer, params, *, lr: float, weight_decay: float, fused: bool = False):
    """``optimizer(params, lr=lr, weight_decay=weight_decay)`` for a name of ``OPTIMIZERS`` or an optimizer class;
    with ``fused`` and "adam" / "adamw", torch's fused kernel called directly (:class:`FusedAdam`: the same update to
    the last bit as ``torch.optim.Adam(fused=True)``, without its per-step overhead; torch's own fused optimizer for
    groups mixing devices or dtypes; torch's for-loop update where torch has no fused kernel for the parameters'
    device and dtype). ``params``: tensors or parameter groups."""
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
