"""Conformity scores: how badly a target fits a prediction, and the regions {y : score ≤ q} they give.

A conformity score (in the spirit of MAPIE's ``conformity_scores``) is a small object with
``score(y, prediction)`` (large: y fits the prediction badly) and ``region(prediction, quantiles)``, its
inverse: the intervals or sets {y : score(y, prediction) ≤ q}. Regression scores (:class:`RegressionScore`)
take the predictive moments (:class:`~glas_sklearn.predictive.RegressionMoments`) and give bounds; classification
scores (:class:`ClassificationScore`) take class probabilities and give sets. Built in:
:class:`StdNormalizedResidual` ``|y − ŷ|`` / σ̂ per output, and :class:`LAC` 1 − p_y. Subclass one of the two
bases for another score.

This module sits below the likelihoods (each names its default score) and the calibrators (which compute the
scores' quantiles): it knows tensors only. :mod:`glas_sklearn.calibration` re-exports every public name here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from .predictive import conformal_interval, conformal_sets, mean_interval_width, mean_set_size

__all__ = [
    "LAC",
    "ClassificationScore",
    "ConformityScore",
    "RegressionScore",
    "StdNormalizedResidual",
]


class ConformityScore(ABC):
    """A conformity score and its inverse; subclass :class:`RegressionScore` or :class:`ClassificationScore`.

    ``score(y, prediction)`` gives one score per calibration row (regression: per row and output), larger
    where y fits the prediction worse; ``region(prediction, quantiles)`` gives, for each quantile q_k,
    {y : score(y, prediction) ≤ q_k}. Scores hold no fitted state (hyperparameters only).
    """

    #: Takes class probabilities and gives prediction sets (True), or takes regression moments and gives
    #: intervals (False).
    classification: bool = False

    @abstractmethod
    def score(self, y: torch.Tensor, prediction):
        """Scores of shape (n,) or (n, M) (tensor or array; computed in float64 by the built-in ones)."""

    @abstractmethod
    def region(self, prediction, quantiles):
        """Bounds (n, M, 2, k) (regression) or bool sets (n, C, k) (classification) for quantiles of shape
        (k,) or (k, M); an infinite quantile gives an infinite interval or every class."""

    def mean_size(self, prediction, quantiles) -> np.ndarray:
        """Mean width (regression) or set size (classification) of the regions, one per quantile: shape (k,)."""
        region = self.region(prediction, quantiles)
        return mean_set_size(region) if self.classification else mean_interval_width(region)

    def __repr__(self) -> str:  # the hyperparameters a subclass stores, if any
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class RegressionScore(ConformityScore):
    """Base of regression scores: ``prediction`` is a :class:`~glas_sklearn.predictive.RegressionMoments`
    (``mean``, ``std``, tensors (n, M)); ``y`` has the mean's shape and dtype; ``region`` returns bounds
    (n, M, 2, k) with [..., 0, :] the lower and [..., 1, :] the upper bound."""

    classification = False


class ClassificationScore(ConformityScore):
    """Base of classification scores: ``prediction`` holds class probabilities (n, C) (float64 at calibration,
    the model's dtype at prediction); ``y`` the class indices (n,) as int64; ``region`` returns bool sets
    (n, C, k)."""

    classification = True


class StdNormalizedResidual(RegressionScore):
    """``|y − ŷ|`` / σ̂ per output: conformal intervals ŷ ± q σ̂ (:func:`~glas_sklearn.predictive.conformal_interval`).

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.predictive import RegressionMoments
    >>> m = RegressionMoments(torch.zeros(2, 1, dtype=torch.float64), torch.full((2, 1), 2.0, dtype=torch.float64))
    >>> StdNormalizedResidual().score(torch.tensor([[1.0], [-3.0]], dtype=torch.float64), m).ravel().tolist()
    [0.5, 1.5]
    """

    def score(self, y, prediction):
        n = y.shape[0]
        sd = prediction.std.to(torch.float64).reshape(n, -1)
        res = (y - prediction.mean).abs().to(torch.float64).reshape(n, -1)
        if bool((sd <= 0).any()):
            raise ValueError("The predictive standard deviation is 0 on some calibration rows, so the normalised "
                             "scores |y − ŷ| / σ̂ are undefined; use include_noise / a positive noise_var.")
        return res / sd

    def region(self, prediction, quantiles):
        return conformal_interval(prediction.mean, prediction.std, quantiles)

    def mean_size(self, prediction, quantiles) -> np.ndarray:
        # width 2 q σ̂ in closed form (infinite q: infinite width)
        sd = prediction.std.to(torch.float64).reshape(prediction.std.shape[0], -1).cpu().numpy()
        return np.array([np.mean(2 * q * sd) for q in np.asarray(quantiles, dtype=np.float64)])


class LAC(ClassificationScore):
    """The least-ambiguous-class score 1 − p_y: sets {c : 1 − p_c ≤ q}
    (:func:`~glas_sklearn.predictive.conformal_sets`; a set may be empty).

    Examples
    --------
    >>> import torch
    >>> LAC().score(torch.tensor([1, 0]), torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)).tolist()
    [0.25, 0.5]
    """

    def score(self, y, prediction):
        return 1.0 - prediction.gather(1, y[:, None])[:, 0].to(torch.float64)

    def region(self, prediction, quantiles):
        return conformal_sets(prediction, quantiles)
