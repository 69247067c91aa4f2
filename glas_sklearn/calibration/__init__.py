"""Calibrating the posterior's intervals and sets on held-out data.

A calibration method is a :class:`Calibrator` object; the estimators' ``calibration=`` takes one, or the name
of a built-in one (:func:`resolve_calibration`, the one place where the names become objects):

- ``"coverage"``, :class:`CoverageCalibrator` (the paper, eq. 42, §4.1.7; :func:`choose_dimension`): the
  smallest subspace dimension d whose (1 − γ) intervals or sets cover the calibration rows.
- ``"conformal"``, :class:`ConformalCalibrator` (beyond the paper, see the user guide; :func:`conformal_calibrate`):
  split-conformal quantiles of conformity scores at a d fixed beforehand, with coverage ≥ 1 − γ for
  exchangeable data at any number of rows. The scores are objects too: :class:`StdNormalizedResidual`
  ``|y − ŷ|`` / σ̂ (regression), :class:`LAC` 1 − p_y (classification), or a subclass of :class:`RegressionScore`
  / :class:`ClassificationScore`. They are defined in :mod:`glas_sklearn.conformity_scores` (below the likelihoods
  and the calibrators) and re-exported here, so ``from glas_sklearn.calibration import LAC`` keeps working.
- ``"mondrian"``, :class:`MondrianConformalCalibrator` (beyond the paper): split conformal within bins of the
  predictive std σ̂(x) (classes for classification), so that the level holds in each bin, not only on average;
  the number of bins is set by the calibration rows (:func:`std_bin_edges`; on small data five where the scores
  differ across them, :func:`scores_alike_pvalue`).

The prior scale by held-out likelihood: :func:`tune_sigma0`, :func:`predictive_nll`. The predictive moments
that calibration and prediction share live in :mod:`glas_sklearn.predictive` (``regression_moments`` and
``class_probabilities`` are importable from here too).
"""

from sklearn.base import clone

from ..predictive import class_probabilities, regression_moments
from ._base import Calibrator
from .conformal import (
    LAC,
    ClassificationScore,
    ConformalCalibrator,
    ConformalResult,
    ConformalWarning,
    ConformityScore,
    RegressionScore,
    StdNormalizedResidual,
    conformal_calibrate,
    conformal_quantile,
    epistemic_cap,
    fit_epistemic_weight,
    resolve_conformity_score,
    weighted_moments,
)
from .coverage import CalibrationResult, CalibrationWarning, CoverageCalibrator, choose_dimension
from .mondrian import MondrianConformalCalibrator, scores_alike_pvalue, std_bin_edges
from .sigma0 import Sigma0Result, predictive_nll, tune_sigma0

__all__ = [
    "CALIBRATIONS",
    "LAC",
    "CalibrationResult",
    "CalibrationWarning",
    "Calibrator",
    "ClassificationScore",
    "ConformalCalibrator",
    "ConformalResult",
    "ConformalWarning",
    "ConformityScore",
    "CoverageCalibrator",
    "MondrianConformalCalibrator",
    "RegressionScore",
    "Sigma0Result",
    "StdNormalizedResidual",
    "choose_dimension",
    "class_probabilities",
    "conformal_calibrate",
    "conformal_quantile",
    "epistemic_cap",
    "fit_epistemic_weight",
    "predictive_nll",
    "regression_moments",
    "resolve_calibration",
    "resolve_conformity_score",
    "scores_alike_pvalue",
    "std_bin_edges",
    "tune_sigma0",
    "weighted_moments",
]

# The built-in calibration methods by name.
_BY_NAME = {"conformal": ConformalCalibrator, "coverage": CoverageCalibrator, "mondrian": MondrianConformalCalibrator}
#: The names ``calibration=`` accepts.
CALIBRATIONS = tuple(_BY_NAME)


def resolve_calibration(calibration) -> Calibrator:
    """An unfitted calibrator for ``calibration``: a name in :data:`CALIBRATIONS` ("conformal", "coverage", "mondrian")
    or a :class:`Calibrator` instance, cloned (its hyperparameters, not its fitted state: the caller's
    object is never fitted).

    Examples
    --------
    >>> resolve_calibration("conformal")
    ConformalCalibrator()
    >>> resolve_calibration(ConformalCalibrator(LAC()))
    ConformalCalibrator(conformity_score=LAC())
    """
    if isinstance(calibration, Calibrator):
        return clone(calibration)
    if isinstance(calibration, str) and calibration in _BY_NAME:
        return _BY_NAME[calibration]()
    raise ValueError(f"calibration must be one of {', '.join(map(repr, CALIBRATIONS))} or a Calibrator instance "
                     f"(e.g. ConformalCalibrator(conformity_score=...)), got {calibration!r}.")
