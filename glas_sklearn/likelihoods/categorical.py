"""The categorical likelihood y ~ Categorical(softmax(f)): classification with softmax cross-entropy."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from ..conformity_scores import LAC
from ..predictive import class_probabilities, mean_set_size, prediction_sets, resolve_predictive, set_coverage
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
    ensemble_combine = "log_mean_softmax"
    region_size_name = "mean_set_size"
    problem = "classification"

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

    # ------------------------------------------------------- what calibration asks
    def check_noise_var(self, noise_var) -> None:
        """No noise is added to class probabilities: ``noise_var`` must be 0."""
        if np.any(np.asarray(noise_var) != 0):
            raise ValueError("noise_var applies to regression intervals only; leave it at 0 for classification.")

    def check_targets(self, y: torch.Tensor) -> torch.Tensor:
        """Class labels: checked against the probabilities where they are used."""
        return y

    def calibration_prediction(self, posterior, X, d, *, predictive="linearized", n_samples=1000, noise_var=0.0,
                               random_state=None, linearized_method="probit", batch_size=None):
        """The class probabilities (n, C) at d in float64
        (:func:`~glas_sklearn.predictive.class_probabilities`)."""
        self.check_noise_var(noise_var)
        return class_probabilities(posterior, X, d, predictive=predictive, n_samples=n_samples,
                                   random_state=random_state, linearized_method=linearized_method,
                                   batch_size=batch_size).to(torch.float64)

    def calibration_targets(self, y, prediction):
        """The labels as class indices (n,), checked against the probabilities (n, C)."""
        target = y.reshape(-1).long()
        if prediction.ndim != 2 or target.shape[0] != prediction.shape[0]:
            raise ValueError(f"Calibrating a classifier needs logits of shape (n, C) and labels of shape (n,); "
                             f"got probabilities {tuple(prediction.shape)} and labels {tuple(y.shape)}.")
        if bool(((target < 0) | (target >= prediction.shape[1])).any()):
            raise ValueError(f"y_cal must hold class indices between 0 and {prediction.shape[1] - 1}.")
        return target

    def predictive_region(self, posterior, X, d, confidence_levels, *, predictive="linearized", n_samples=1000,
                          noise_var=0.0, random_state=None, linearized_method="probit", batch_size=None, mean=None):
        """The smallest sets of classes reaching each level (:func:`~glas_sklearn.predictive.prediction_sets`) of
        the probabilities at d (a linearised Monte Carlo predictive draws from the integer ``random_state`` + 1)."""
        self.check_noise_var(noise_var)
        gen = None if random_state is None else int(random_state) + 1
        probs = resolve_predictive(predictive).probabilities(
            posterior, X, d, n_samples=n_samples, random_state=random_state, linearized_method=linearized_method,
            generator=gen, batch_size=batch_size, mean=mean)
        return prediction_sets(probs, confidence_levels)

    def region_coverage(self, y, region):
        """The fraction of labels inside their sets, per level (k,)."""
        return set_coverage(y, region)

    def region_size(self, region):
        """The mean set size per level (k,)."""
        return mean_set_size(region)

    def predictive_nll_rows(self, prediction, target):
        """−log p̂_y per row (n,) (p̂ clamped at the smallest positive float64); their mean is
        :meth:`~glas_sklearn.likelihoods.Likelihood.predictive_nll`."""
        p_true = prediction.gather(1, target[:, None])[:, 0]
        return -torch.log(p_true.clamp_min(torch.finfo(torch.float64).tiny))
