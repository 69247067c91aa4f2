"""glas_sklearn.compose: intervals and prediction sets through Pipelines and TransformedTargetRegressor,
against the final step called by hand and affine maps of the bounds computed by hand."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.compose import TransformedTargetRegressor
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from glas_sklearn import (
    LaplaceActiveSubspaceClassifier,
    LaplaceActiveSubspaceRegressor,
    make_interval_scorer,
    predict_interval,
    predict_set,
)
from glas_sklearn.calibration import CalibrationWarning
from tests.reference import grouped

from .stubs import FixedLevelStub, IntervalStub

SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30, lr=0.05, batch_size=None,
             n_samples=30, max_components=3, dtype="float64", random_state=0)


@pytest.fixture(autouse=True)
def _quiet_calibration():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        yield


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 2))
    return X, 40.0 + 8.0 * np.sin(2 * X[:, 0]) + rng.standard_normal(n)


X_STUB = np.array([[0.0, 5.0], [1.0, 5.0], [2.0, 5.0], [3.0, 5.0]])


def test_nested_pipeline_runs_the_transforms_then_the_final_step():
    inner = make_pipeline(FunctionTransformer(lambda A: 2 * A), IntervalStub(half=0.5))
    pipe = Pipeline([("shift", FunctionTransformer(lambda A: A + 1.0)), ("inner", inner)]).fit(X_STUB, None)
    y_pred, y_pis = predict_interval(pipe, X_STUB, confidence_level=[0.45, 0.9])
    centre = 2 * (X_STUB[:, 0] + 1)  # by hand
    np.testing.assert_array_equal(y_pred, centre)
    np.testing.assert_allclose(y_pis[:, 0], centre[:, None] - [0.25, 0.5], rtol=1e-15)
    np.testing.assert_allclose(y_pis[:, 1], centre[:, None] + [0.25, 0.5], rtol=1e-15)
    with pytest.raises(TypeError, match="has no predict_interval"):
        predict_interval(make_pipeline(StandardScaler()).fit(X_STUB), X_STUB)


def test_fixed_level_final_step_is_called_without_a_level_and_refuses_another():
    est = FixedLevelStub(half=1.0, confidence_level=0.9).fit(X_STUB, None)
    _, y_pis = predict_interval(est, X_STUB)
    np.testing.assert_array_equal(y_pis[:, 1, 0] - y_pis[:, 0, 0], 2.0)
    assert predict_interval(est, X_STUB, confidence_level=0.9)[1].shape == (4, 2, 1)
    with pytest.raises(ValueError, match=r"fixed at construction \(0.9\).*0.8"):
        predict_interval(est, X_STUB, confidence_level=0.8)
    with pytest.raises(ValueError, match="fixed at construction"):
        make_interval_scorer("coverage", 0.8)(est, X_STUB, X_STUB[:, 0])


def test_our_estimators_in_a_pipeline_give_their_own_intervals_and_sets():
    X, y = _data()
    pipe = make_pipeline(StandardScaler(), LaplaceActiveSubspaceRegressor(**grouped(**SMALL))).fit(X, y)
    y_pred, y_pis = predict_interval(pipe, X[:9], confidence_level=[0.5, 0.9])
    ref_pred, ref_pis = pipe[-1].predict_interval(pipe[:-1].transform(X[:9]), confidence_level=[0.5, 0.9])
    # the same computation replayed (same seed, same rows): equal bit for bit
    np.testing.assert_array_equal(y_pred, ref_pred)
    np.testing.assert_array_equal(y_pis, ref_pis)
    labels = np.where(y > 40, "hi", "lo")
    clf = make_pipeline(StandardScaler(), LaplaceActiveSubspaceClassifier(**grouped(**SMALL))).fit(X, labels)
    got_labels, sets = predict_set(clf, X[:9], confidence_level=[0.5, 0.9])
    ref_labels, ref_sets = clf[-1].predict_set(clf[:-1].transform(X[:9]), confidence_level=[0.5, 0.9])
    np.testing.assert_array_equal(got_labels, ref_labels)
    np.testing.assert_array_equal(sets, ref_sets)
    with pytest.raises(TypeError, match="has no predict_set"):
        predict_set(pipe, X[:3])


def test_transformed_target_with_standard_scaler_maps_the_bounds_affinely():
    X, y = _data()
    ttr = TransformedTargetRegressor(LaplaceActiveSubspaceRegressor(**grouped(**SMALL)),
                                     transformer=StandardScaler()).fit(X, y)
    y_pred, y_pis = predict_interval(ttr, X[:10], confidence_level=[0.5, 0.9])
    inner_pred, inner_pis = ttr.regressor_.predict_interval(X[:10], confidence_level=[0.5, 0.9])
    mean, scale = y.mean(), y.std()  # StandardScaler's statistics, by hand
    tol = 1e-12 * abs(mean)
    np.testing.assert_allclose(y_pred, mean + scale * inner_pred, rtol=0, atol=tol)
    np.testing.assert_allclose(y_pis, mean + scale * inner_pis, rtol=0, atol=tol)
    np.testing.assert_allclose(y_pred, ttr.predict(X[:10]), rtol=0, atol=tol)  # TTR's own path for the mean
    lo, hi = y_pis[:, 0, 1], y_pis[:, 1, 1]
    winkler = (hi - lo) + 20 * np.maximum(lo - y[:10], 0) + 20 * np.maximum(y[:10] - hi, 0)
    assert make_interval_scorer("interval_score", 0.9)(ttr, X[:10], y[:10]) == pytest.approx(-winkler.mean(),
                                                                                              rel=1e-12)


def test_transformed_target_with_negative_slope_swaps_the_bounds():
    y = np.arange(4.0)
    ttr = TransformedTargetRegressor(IntervalStub(half=0.5), func=lambda v: 2.0 - 3.0 * v,
                                     inverse_func=lambda t: (2.0 - t) / 3.0, check_inverse=False).fit(X_STUB, y)
    y_pred, y_pis = predict_interval(ttr, X_STUB, confidence_level=0.9)
    c = X_STUB[:, 0]  # the stub's centre in transformed units
    np.testing.assert_allclose(y_pred, (2.0 - c) / 3.0, rtol=1e-14)
    np.testing.assert_allclose(y_pis[:, 0, 0], (2.0 - c - 0.5) / 3.0, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(y_pis[:, 1, 0], (2.0 - c + 0.5) / 3.0, rtol=1e-14, atol=1e-15)
    assert np.all(y_pis[:, 0] < y_pis[:, 1])


def test_transformed_target_that_is_not_affine_is_refused():
    ttr = TransformedTargetRegressor(IntervalStub(), func=np.log, inverse_func=np.exp).fit(X_STUB, np.arange(1.0, 5.0))
    with pytest.raises(ValueError, match="not an affine map"):
        predict_interval(ttr, X_STUB)
    pipe = make_pipeline(StandardScaler(), ttr)  # also when the TTR is the last step of a pipeline
    pipe.fit(X_STUB, np.arange(1.0, 5.0))
    with pytest.raises(ValueError, match="not an affine map"):
        predict_interval(pipe, X_STUB)
