"""Several networks as one: :class:`NetworkEnsemble`.

The estimators' ``Training(n_networks=K)`` trains K networks from different initial weights and puts the Laplace
posterior on all their weights together; a prefit ensemble is passed the same way, ``module=NetworkEnsemble([...]),
prefit=True``. Its output is one network's kind of output: the members' mean (regression) or the logarithm of
their mean softmax (classification, the logits of the averaged probabilities), so that likelihoods, the
curvature, the posterior and model files treat it as any other network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["COMBINE", "NetworkEnsemble"]

#: How the members' outputs are combined: their mean, or the logarithm of their mean softmax (over the last axis).
COMBINE = ("mean", "log_mean_softmax")


class NetworkEnsemble(nn.Module):
    """K networks that take the same inputs, their outputs combined into one.

    Parameters
    ----------
    members : sequence of torch.nn.Module
        The networks, each ``(n, ...)`` → ``(n, m)`` with the same m; held as an ``nn.ModuleList`` (their weights
        are this module's, ``members.0.weight`` ...).
    combine : {"mean", "log_mean_softmax"}, default="mean"
        "mean": the members' mean output (a regression mean). "log_mean_softmax":
        log((1/K) Σ_k softmax(f_k(x))), whose softmax is the members' mean class probabilities (logits for a
        classifier).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from glas_sklearn.ensemble import NetworkEnsemble
    >>> nets = [nn.Linear(4, 3) for _ in range(2)]
    >>> ens = NetworkEnsemble(nets, combine="log_mean_softmax")
    >>> x = torch.randn(5, 4)
    >>> mean_p = (nets[0](x).softmax(-1) + nets[1](x).softmax(-1)) / 2
    >>> bool(torch.allclose(ens(x).softmax(-1), mean_p, atol=1e-6))
    True
    """

    def __init__(self, members: Sequence[nn.Module], combine: str = "mean") -> None:
        super().__init__()
        members = list(members)
        if not members or not all(isinstance(m, nn.Module) for m in members):
            raise TypeError("NetworkEnsemble needs a non-empty sequence of torch.nn.Module members, got "
                            f"{[type(m).__name__ for m in members]}.")
        if combine not in COMBINE:
            raise ValueError(f"combine must be one of {COMBINE}, got {combine!r}.")
        self.members = nn.ModuleList(members)
        self.combine = combine

    def forward(self, *args, **kwargs) -> torch.Tensor:
        outputs = [member(*args, **kwargs) for member in self.members]
        shapes = {tuple(o.shape) for o in outputs}
        if len(shapes) != 1:
            raise ValueError(f"NetworkEnsemble: the members' outputs differ in shape: {sorted(shapes)}; every member "
                             "must give the same output for the same inputs.")
        stacked = torch.stack(outputs)
        if self.combine == "mean":
            return stacked.mean(0)
        return torch.logsumexp(torch.log_softmax(stacked, dim=-1), dim=0) - math.log(len(outputs))

    def extra_repr(self) -> str:
        return f"combine={self.combine!r}"
