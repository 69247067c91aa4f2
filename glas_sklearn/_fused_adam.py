"""Adam and AdamW in torch's fused kernel, called without ``torch.optim``'s per-step machinery.

``torch.optim.Adam(fused=True).step`` spends most of a small network's optimizer step outside the kernel (hooks,
profiler records, regrouping the tensors by device and dtype, checking the state). :class:`FusedAdam` keeps the
state tensors torch's optimizer keeps and makes the same two calls a step (the step counts + 1, then
``torch._fused_adam_`` or ``torch._fused_adamw_`` with the same arguments), so the weights are the same to the
last bit; :func:`lean_fused_adam` returns None where that kernel is missing, and the training then builds torch's
own.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["FusedAdam", "lean_fused_adam"]


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
