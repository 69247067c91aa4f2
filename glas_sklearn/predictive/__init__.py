"""Predictive distributions from posterior samples or linearised moments (paper eqs. 43–46).

One module per concept: :mod:`~glas_sklearn.predictive.regression` (intervals: sampled quantiles, Gaussian
linearised intervals, split-conformal ones), :mod:`~glas_sklearn.predictive.classification` (class probabilities
and prediction sets), :mod:`~glas_sklearn.predictive.summaries` (empirical coverage and size) and
:mod:`~glas_sklearn.predictive.modes`, the predictive modes as objects (:class:`Linearized`, :class:`Sampled`,
named by :func:`resolve_predictive`), which ask a posterior only what :class:`PosteriorProtocol` names and give
the predictive of a posterior at a subspace dimension d that calibration and the estimators' predictions share
(:func:`regression_moments`, :func:`predictive_interval`, :func:`class_probabilities`).

Users score intervals with :mod:`glas_sklearn.metrics` (``coverage_score``, ``mean_width_score``,
``interval_score``: scikit-learn's ``(y_true, y_pis)`` convention, checked inputs, float results).
``interval_coverage`` and ``mean_interval_width`` here are the library's internal tensor versions (tensors
stay on their device, bounds (n, M, 2, k), no checks beyond shapes) on which calibration and those metrics
are built; they are not part of ``__all__``.

Shapes (MAPIE-style, the level axis is always kept, k = number of confidence levels):
regression outputs (n, M) give intervals (n, M, 2, k) with [..., 0, :] the lower and [..., 1, :] the upper
bound; logits (n, C) give probabilities (n, C) and prediction sets (n, C, k). Any number of leading batch
axes is allowed in place of n (e.g. (n, T, M) for sequences). Functions accept torch tensors or numpy arrays
and return the same kind (torch results stay on the input's device); coverage and size summaries are
float64 numpy arrays of shape (k,).
"""

from .classification import conformal_sets, linearized_probabilities, prediction_sets, sampled_probabilities
from .modes import (
    Linearized,
    OutputMoments,
    PosteriorProtocol,
    PredictiveMode,
    RegressionMoments,
    Sampled,
    class_probabilities,
    predictive_interval,
    regression_moments,
    resolve_predictive,
)
from .regression import conformal_interval, linearized_interval, sampled_interval
from .summaries import interval_coverage, mean_interval_width, mean_set_size, set_coverage  # noqa: F401

__all__ = [
    "Linearized",
    "OutputMoments",
    "PosteriorProtocol",
    "PredictiveMode",
    "RegressionMoments",
    "Sampled",
    "class_probabilities",
    "conformal_interval",
    "conformal_sets",
    "linearized_interval",
    "linearized_probabilities",
    "mean_set_size",
    "prediction_sets",
    "predictive_interval",
    "regression_moments",
    "resolve_predictive",
    "sampled_interval",
    "sampled_probabilities",
    "set_coverage",
]
