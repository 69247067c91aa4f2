"""Stubs whose results are known by hand: regressors with fixed prediction intervals (the compose and metrics tests)
and a user-defined conformity score (the likelihood and calibrator plug-in tests)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin

from glas_sklearn.conformity_scores import RegressionScore


class IntervalStub(RegressorMixin, BaseEstimator):
    """f(x) = x[:, 0] ± half·level/0.9 (no fitting): intervals known by hand.

    Parameters
    ----------
    half : float, default=1.0
        The half-width at level 0.9.
    """

    def __init__(self, half=1.0):
        self.half = half

    def fit(self, X, y):
        self.n_features_in_ = np.asarray(X).shape[1]
        return self

    def predict(self, X):
        return np.asarray(X, dtype=float)[:, 0]

    def predict_interval(self, X, confidence_level=None):
        levels = np.atleast_1d(0.9 if confidence_level is None else confidence_level)
        c = self.predict(X)
        h = self.half * levels / 0.9
        return c, np.stack([c[:, None] - h, c[:, None] + h], axis=1)


class FixedLevelStub(IntervalStub):
    """MAPIE v1 style: the level is fixed at construction, predict_interval takes none.

    Parameters
    ----------
    half : float, default=1.0
        The half-width at level 0.9.
    confidence_level : float, default=0.9
        The one level of the intervals.
    """

    def __init__(self, half=1.0, confidence_level=0.9):
        self.half = half
        self.confidence_level = confidence_level

    def predict_interval(self, X):
        return super().predict_interval(X, self.confidence_level)


class AbsoluteResidual(RegressionScore):
    """A user's score from outside the package: |y − ŷ|, whose regions are ŷ ± q (plain split conformal)."""

    def score(self, y, prediction):
        return (y - prediction.mean).abs().to(torch.float64)

    def region(self, prediction, quantiles):
        q = torch.as_tensor(np.asarray(quantiles), dtype=prediction.mean.dtype)
        q = q.T if q.ndim == 2 else q
        mu = prediction.mean.unsqueeze(-1)
        return torch.stack([mu - q, mu + q], -2)
