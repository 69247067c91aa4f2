"""Calibration methods and conformity scores as objects (glas_sklearn.calibration): user-defined scores end to
end through the estimators against split conformal by hand, string and object spellings, clone / get_params."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.utils.validation import check_is_fitted

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import (
    CALIBRATIONS,
    LAC,
    CalibrationWarning,
    ClassificationScore,
    ConformalCalibrator,
    CoverageCalibrator,
    StdNormalizedResidual,
    resolve_calibration,
)
from tests.reference import grouped

from .stubs import AbsoluteResidual

SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30, lr=0.05, batch_size=None,
             n_samples=50, max_components=3, dtype="float64", random_state=0)
PAPER = dict(posterior="subspace", calibration="coverage", predictive="sampled")


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    return X, 3.0 * np.sin(2 * X[:, 0]) + 1.5 * X[:, 1] + 10 + 0.3 * rng.standard_normal(n)


def _labels(n, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, n)
    X = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.2]])[codes] + 0.6 * rng.standard_normal((n, 2))
    return X, codes


def _rank(n, level):
    """⌈(n + 1) · level⌉: the rank of the split-conformal quantile among n sorted scores."""
    return int(math.ceil((n + 1) * level - 1e-9))


class TopMass(ClassificationScore):
    """The probability mass of the classes at least as probable as y (APS without randomisation)."""

    def score(self, y, prediction):
        p_y = prediction.gather(1, y[:, None])
        return (prediction * (prediction >= p_y)).sum(1).to(torch.float64)

    def region(self, prediction, quantiles):
        p = prediction.unsqueeze(1)  # (n, 1, C)
        mass = (p * (p >= prediction.unsqueeze(2))).sum(-1)  # (n, C): the score each class would have
        return mass.unsqueeze(-1) <= torch.as_tensor(np.asarray(quantiles), dtype=prediction.dtype)


def test_user_defined_regression_score_matches_split_conformal_by_hand():
    X, y = _data(90)
    X_cal, y_cal = _data(30, seed=1)
    X_test, _ = _data(8, seed=2)
    est = LaplaceActiveSubspaceRegressor(**grouped(**SMALL, standardize=False, confidence_level=[0.9, 0.5],
                                                   calibration=ConformalCalibrator(AbsoluteResidual())))
    est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert est.predictive_.name == "linearized"  # the low-rank default: ŷ = f(x; θ0), the trained network itself
    with torch.no_grad():
        f_cal = est.module_(torch.as_tensor(X_cal))[:, 0].numpy()
        f_test = est.module_(torch.as_tensor(X_test))[:, 0].numpy()
    scores = np.sort(np.abs(y_cal - f_cal))
    tol = dict(rtol=1e-12, atol=1e-12 * np.abs(y).max())  # float64 all along: one network pass apart
    np.testing.assert_allclose(est.conformity_scores_[:, 0], scores, **tol)
    y_pred, pis = est.predict_interval(X_test, confidence_level=[0.9, 0.5, 0.8])  # 0.8 was not fitted
    np.testing.assert_allclose(y_pred, f_test, **tol)
    for k, level in enumerate((0.9, 0.5, 0.8)):
        q = scores[_rank(30, level) - 1]
        np.testing.assert_allclose(pis[:, 0, k], f_test - q, **tol)
        np.testing.assert_allclose(pis[:, 1, k], f_test + q, **tol)
    # the table: coverage ⌈(n+1)(1−γ)⌉ / n of the calibration rows, width 2q from the score's own region
    np.testing.assert_allclose(est.calibration_["coverage"], [_rank(30, 0.9) / 30, _rank(30, 0.5) / 30])
    np.testing.assert_allclose(est.calibration_["mean_width"],
                               [2 * scores[_rank(30, lev) - 1] for lev in (0.9, 0.5)], **tol)
    assert isinstance(est.calibrator_.conformity_score_, AbsoluteResidual)


def test_user_defined_classification_score_matches_split_conformal_by_hand():
    X, codes = _labels(120)
    X_cal, c_cal = _labels(40, seed=1)
    X_test, _ = _labels(30, seed=2)
    clf = LaplaceActiveSubspaceClassifier(**grouped(**SMALL, sigma0="eb_full",
                                                    calibration=ConformalCalibrator(TopMass())))
    clf.fit(X, codes, X_cal=X_cal, y_cal=c_cal)
    assert clf.n_calibration_rows_ == 40  # σ0 fixed beforehand: every calibration row scores

    def top_mass(proba, label):  # the mass of the classes at least as probable as ``label``, row by row
        return np.array([p[p >= p[c]].sum() for p, c in zip(proba, label, strict=True)])

    proba_cal = clf.predict_proba(X_cal)
    scores = np.sort(top_mass(proba_cal, c_cal))
    np.testing.assert_allclose(clf.conformity_scores_, scores, rtol=1e-12, atol=1e-12)
    q = scores[_rank(40, 0.9) - 1]
    proba = clf.predict_proba(X_test)
    by_hand = np.stack([top_mass(proba, np.full(len(proba), c)) <= q for c in range(3)], axis=1)
    labels, sets = clf.predict_set(X_test)
    assert sets.shape == (30, 3, 1)
    np.testing.assert_array_equal(sets[:, :, 0], by_hand)
    np.testing.assert_array_equal(labels, np.argmax(proba, axis=1))
    assert (by_hand.sum(1) > 1).any()  # a non-trivial check: some sets hold several classes
    assert clf.calibration_["coverage"].iloc[0] == pytest.approx(_rank(40, 0.9) / 40)


def _regression_outputs(est, X):
    y_pred, pis = est.predict_interval(X, confidence_level=[0.5, 0.9])
    return [y_pred, pis, est.predict(X, return_std=True)[1], est.calibration_.to_numpy()]


def _classification_outputs(est, X):
    labels, sets = est.predict_set(X, confidence_level=[0.5, 0.9])
    return [est.predict_proba(X), labels, sets, est.calibration_.to_numpy()]


@pytest.mark.parametrize("paper", [False, True])
def test_string_and_object_spellings_give_identical_regressors(paper):
    X, y = _data(70)
    X_test, _ = _data(6, seed=3)
    settings = {**SMALL, **(PAPER if paper else {})}
    spellings = (["coverage", CoverageCalibrator()] if paper
                 else ["conformal", ConformalCalibrator(), ConformalCalibrator(StdNormalizedResidual())])
    outputs = []
    for calibration in spellings:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            est = LaplaceActiveSubspaceRegressor(**grouped(**{**settings, "calibration": calibration})).fit(X, y)
        outputs.append(_regression_outputs(est, X_test))
        assert type(est.calibrator_) is type(resolve_calibration(spellings[0]))
    for other in outputs[1:]:
        for a, b in zip(outputs[0], other, strict=True):
            np.testing.assert_array_equal(a, b)  # the same computation: bit for bit


@pytest.mark.parametrize("paper", [False, True])
def test_string_and_object_spellings_give_identical_classifiers(paper):
    X, codes = _labels(90)
    settings = {**SMALL, **(PAPER if paper else {})}
    default = ConformalCalibrator(LAC(never_empty=True))  # the classifier's default score
    spellings = ["coverage", CoverageCalibrator()] if paper else ["conformal", default]
    outputs = []
    for calibration in spellings:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            est = LaplaceActiveSubspaceClassifier(**grouped(**{**settings, "calibration": calibration})).fit(X, codes)
        outputs.append(_classification_outputs(est, X[:10]))
    for a, b in zip(*outputs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_calibrator_instances_clone_get_params_and_stay_unfitted():
    score = AbsoluteResidual()
    calibrator = ConformalCalibrator(conformity_score=score)
    est = LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=calibrator))
    params = est.get_params()
    assert params["calibration"] is calibrator and params["calibration__conformity_score"] is score
    twin = clone(est)
    assert twin.calibration is not calibrator and isinstance(twin.calibration.conformity_score, AbsoluteResidual)
    assert twin.calibration.conformity_score is not score
    X, y = _data(60)
    est.fit(X, y)
    check_is_fitted(est.calibrator_)
    assert est.calibrator_ is not calibrator and est.calibrator_.conformity_score_ is not score
    assert not any(k.endswith("_") for k in vars(calibrator))  # the parameter itself is never fitted
    # a clone refitted on the same data reproduces the predictions; set_params reaches the nested score
    np.testing.assert_array_equal(twin.fit(X, y).predict_interval(X[:5])[1], est.predict_interval(X[:5])[1])
    twin.set_params(calibration__conformity_score=StdNormalizedResidual())
    default = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X, y)
    np.testing.assert_array_equal(twin.fit(X, y).predict_interval(X[:5])[1], default.predict_interval(X[:5])[1])
    assert repr(ConformalCalibrator(LAC())) == "ConformalCalibrator(conformity_score=LAC())"


def test_calibrator_properties_drive_the_estimator():
    """What the estimators ask instead of the mode name: d searched or fixed, σ from the calibration rows or not,
    the rows a conformal quantile needs."""
    coverage, conformal = CoverageCalibrator(), ConformalCalibrator()
    assert coverage.chooses_dimension and not coverage.requires_fixed_predictor
    assert conformal.requires_fixed_predictor and not conformal.chooses_dimension
    assert conformal.rows_needed([0.9, 0.5]) == 9 and conformal.rows_needed(0.95) == 19
    assert coverage.rows_needed(0.95) == 1
    X, y = _data(80)
    conf = LaplaceActiveSubspaceRegressor(**grouped(**SMALL,
                                                    calibration=ConformalCalibrator(AbsoluteResidual()))).fit(X, y)
    assert conf.n_components_ == 3 and conf.noise_source_ == "training" and conf.n_calibration_rows_ == 9
    with pytest.warns(UserWarning, match="only approximate"):
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL, noise_std="calibration",
                                                 calibration=ConformalCalibrator(AbsoluteResidual()))).fit(X, y)
    with pytest.raises(ValueError, match="sigma0='nll'"):
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL, sigma0="nll", calibration=CoverageCalibrator())).fit(X, y)


class InflatedCoverage(CoverageCalibrator):
    """A user's calibrator, in one file: the paper's intervals, with its own scale for the std and its own report."""

    def std_scale(self, n_outputs):
        return np.full(n_outputs, 2.0)

    def report(self, n_rows, confidence_levels):
        return f": inflated at {confidence_levels[0]:g} on {n_rows} rows"


def test_a_calibrator_owns_its_report_and_its_scale(capsys):
    """The estimator's log line and ``predict(return_std=True)`` ask the calibrator: a subclass that changes them
    changes nothing else (the same seed gives the same fit, the std twice the paper's)."""
    X, y = _data(80)
    paper = LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=CoverageCalibrator())).fit(X, y)
    inflated = LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=InflatedCoverage()),
                                              verbose=1).fit(X, y)
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("calibration: "))
    assert line.startswith(f"calibration: InflatedCoverage at d = {inflated.n_components_} on "
                           f"{inflated.n_calibration_rows_} rows")
    assert line.endswith(f": inflated at 0.9 on {inflated.n_calibration_rows_} rows"), line
    np.testing.assert_array_equal(inflated.std_scale_, [2.0])
    np.testing.assert_array_equal(paper.std_scale_, [1.0])
    mean_p, std_p = paper.predict(X[:7], return_std=True)
    mean_i, std_i = inflated.predict(X[:7], return_std=True)
    np.testing.assert_array_equal(mean_i, mean_p)
    np.testing.assert_allclose(std_i, 2.0 * std_p, rtol=1e-12)


def test_bad_calibrations_and_scores_are_refused_clearly():
    assert CALIBRATIONS == ("conformal", "coverage", "mondrian")
    with pytest.raises(ValueError, match="'conformal', 'coverage', 'mondrian' or a Calibrator"):
        resolve_calibration("split")
    X, y = _data(40)
    with pytest.raises(ValueError, match="calibration must be a Calibrator"):
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=StdNormalizedResidual())).fit(X, y)
    with pytest.raises(ValueError, match=r"LAC\(\) is not a RegressionScore, but the likelihood calibrated"):
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=ConformalCalibrator(LAC()))).fit(X, y)
    with pytest.raises(TypeError, match="conformity_score must be None or a ConformityScore"):
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=ConformalCalibrator("lac"))).fit(X, y)

    class OneScore(AbsoluteResidual):
        def score(self, y, prediction):
            return super().score(y, prediction)[:1]

    with pytest.raises(ValueError, match=r"OneScore\(\).score returned shape \(1, 1\) for 9 calibration rows"):
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=ConformalCalibrator(OneScore()))).fit(X, y)


def test_coverage_display_asks_the_fitted_calibrator():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from glas_sklearn.plotting import CoverageDisplay

    X, y = _data(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        settings = grouped(**{**SMALL, **PAPER, "calibration": CoverageCalibrator()})
        paper = LaplaceActiveSubspaceRegressor(**settings).fit(X, y)
    disp = CoverageDisplay.from_estimator(paper)
    np.testing.assert_array_equal(disp.line_.get_ydata(), paper.calibration_["coverage"].to_numpy())
    assert disp.reached == (paper.calibration_reached_ is not False) and not disp.classification
    conformal = LaplaceActiveSubspaceRegressor(**grouped(**SMALL,
                                                         calibration=ConformalCalibrator(AbsoluteResidual()))).fit(X, y)
    with pytest.raises(ValueError, match=r"calibration=ConformalCalibrator\(conformity_score=AbsoluteResidual\(\)\)"):
        CoverageDisplay.from_estimator(conformal)
    plt.close("all")


def test_pickles_round_trip_and_older_pickles_are_refused_naming_the_version():
    """A pickle of this version loads and predicts the same; a state made before it (no version stamp, as every
    earlier development build wrote) or in another pickle format is refused with a message naming the version."""
    import pickle

    import glas_sklearn

    X, y = _data(40)
    est = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X, y)
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.predict_interval(X[:5])[1], est.predict_interval(X[:5])[1])
    state = est.__getstate__()
    assert state["_glas_pickle"] == (glas_sklearn.__version__, 3)
    for stamp in (None, ("0.0.9", 0)):
        old = dict(state)
        old.pop("_glas_pickle")
        if stamp is not None:
            old["_glas_pickle"] = stamp
        target = LaplaceActiveSubspaceRegressor.__new__(LaplaceActiveSubspaceRegressor)
        made = "an earlier development build" if stamp is None else r"glas-sklearn 0\.0\.9 \(pickle format 0\)"
        with pytest.raises(ValueError, match=rf"pickled by {made}.*glas-sklearn {glas_sklearn.__version__}.*Refit"):
            target.__setstate__(old)


@pytest.mark.parametrize("check", ["check_estimators_overwrite_params", "check_dont_overwrite_parameters",
                                   "check_get_params_invariance", "check_set_params", "check_fit_idempotent"])
def test_sklearn_parameter_checks_with_a_calibrator_instance(check):
    """scikit-learn's checks that fit leaves the parameters (here a calibrator holding a user score) untouched."""
    from sklearn.utils import estimator_checks

    est = LaplaceActiveSubspaceRegressor(**grouped(**SMALL, calibration=ConformalCalibrator(AbsoluteResidual())))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        getattr(estimator_checks, check)(type(est).__name__, est)
