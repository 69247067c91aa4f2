"""The categorical likelihood y ~ Categorical(softmax(f)): classification with softmax cross-entropy."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..conformity_scores import LAC
from ._base import Likelihood

__all__ = ["Categorical"]


class Categorical(Likelihood):
    """y ~ Categorical(softmax(f(x; θ))) over the last output axis (the classifier's likelihood).

    The loss is the softmax cross-entropy −log p_y; its Hessian in the logits is H = diag(p) − p pᵀ with
    p = softmax(f), which does not depend on the label. β = 1 ("mean") or N ("standard").

    Examples
    --------
    >>> import torch
    >>> lik = Categorical()
    >>> round(float(lik.loss(torch.zeros(1, 4), torch.tensor([2]))), 6)  # −log(1/4)
    1.386294
    >>> lik.output_hessian_product(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]))
    tensor([[ 0.2500, -0.2500]])
    >>> lik.beta("standard", 100)
    100.0
    """

    name = "categorical"
    is_classification = True

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean softmax cross-entropy of logits (..., C) against class indices (...)."""
        if output.ndim == 2:
            return F.cross_entropy(output, target)
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def output_hessian_product(self, output: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """(diag(p) − p pᵀ) u = p ⊙ u − p (pᵀ u), p = softmax(output)."""
        probs = torch.softmax(output, dim=-1)
        return probs * u - probs * (probs * u).sum(dim=-1, keepdim=True)

    def output_hessian_diagonal_terms(self, output: torch.Tensor, jacobian: torch.Tensor) -> torch.Tensor:
        """Σ_c p_c J_ck² − (Σ_c p_c J_ck)² per record and weight k (p in the Jacobian's dtype)."""
        p = torch.softmax(output.to(jacobian.dtype), dim=-1).unsqueeze(-1)
        return (p * jacobian**2).sum(-2) - (p * jacobian).sum(-2) ** 2

    def default_conformity_score(self):
        """The least-ambiguous-class score 1 − p_y with the most probable class added to a set that would be empty
        (:class:`~glas_sklearn.conformity_scores.LAC` ``(never_empty=True)``)."""
        return LAC(never_empty=True)
