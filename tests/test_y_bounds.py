"""Bounded targets (``y_bounds``): the support parsed and enforced at fit, predictions and intervals clipped to it.

Clipping an interval [l, u] to the support [a, b] gives [max(l, a), min(u, b)]: a target y in [a, b] inside [l, u] is
inside the clipped interval too, so coverage cannot drop, and the width cannot grow. Checked here on simulated
targets that cannot be negative, against the same fit without bounds.
"""

from __future__ import annotations

import numpy as np
import pytest

from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank, Training, coverage_score, mean_width_score
from glas_sklearn._checks import check_target_bounds, clip_to_bounds

INF = np.inf


def test_bounds_forms():
    y = np.array([0.5, 1.0, 2.0])
    np.testing.assert_array_equal(check_target_bounds(None, y), [[-INF, INF]])
    np.testing.assert_array_equal(check_target_bounds((0, None), y), [[0.0, INF]])
    np.testing.assert_array_equal(check_target_bounds([None, 3], y), [[-INF, 3.0]])
    Y = np.array([[0.5, 1.0], [1.0, 5.0]])
    np.testing.assert_array_equal(check_target_bounds((0, 10), Y), [[0.0, 10.0], [0.0, 10.0]])  # one pair for all
    np.testing.assert_array_equal(check_target_bounds([(0, None), (None, 6)], Y),
                                  [[0.0, INF], [-INF, 6.0]])


@pytest.mark.parametrize("bad, message", [((1, 0), "low < high"), ((2, 2), "low < high"), ((0,), "a \\(low, high\\)"),
                                          ("positive", "a \\(low, high\\)"), ((True, None), "a \\(low, high\\)"),
                                          ([(0, None)] * 3, "one such pair per output"),
                                          ((float("nan"), None), "low < high")])
def test_bad_bounds_are_refused_with_what_to_pass(bad, message):
    with pytest.raises(ValueError, match=message):
        check_target_bounds(bad, np.array([[0.5, 1.0], [1.0, 2.0]]) if isinstance(bad, list) else np.ones(3))


def test_targets_outside_the_bounds_are_refused():
    with pytest.raises(ValueError, match=r"1 value\(s\) of y lie outside y_bounds \[0, inf\], e.g. -0.5"):
        check_target_bounds((0, None), np.array([1.0, -0.5, 2.0]))
    with pytest.raises(ValueError, match=r"of y_cal .*\(output 1\)"):
        check_target_bounds([(None, None), (0, 1)], np.array([[5.0, 0.5], [-5.0, 1.5]]), "y_cal")


def test_clipping_keeps_covered_targets_covered_and_never_widens():
    rng = np.random.default_rng(0)
    y = rng.exponential(1.0, size=2000)  # targets on [0, ∞)
    centre = y + rng.normal(0, 1.0, size=y.size)  # a noisy prediction, often below 0
    half = rng.uniform(0.2, 2.0, size=y.size)
    pis = np.stack([centre - half, centre + half], axis=1)[:, None, :, None]  # (n, 1 output, 2, 1 level)
    clipped = clip_to_bounds(pis, np.array([[0.0, INF]]))
    inside = (pis[:, 0, 0, 0] <= y) & (y <= pis[:, 0, 1, 0])
    inside_clipped = (clipped[:, 0, 0, 0] <= y) & (y <= clipped[:, 0, 1, 0])
    assert (inside_clipped >= inside).all()  # every covered target stays covered (here also no new ones)
    assert (clipped[:, 0, 1] - clipped[:, 0, 0] <= pis[:, 0, 1] - pis[:, 0, 0]).all()
    assert (clipped[:, 0, 0, 0] > pis[:, 0, 0, 0]).mean() > 0.1  # the clipping acted on many rows
    assert clipped.min() >= 0.0


def _bounded_data(n, rng):
    X = rng.uniform(-1, 1, size=(n, 2))
    y = np.exp(1.5 * X[:, 0]) * rng.exponential(0.5, size=n)  # positive, skewed: low bounds fall below 0
    return X, y


def test_the_regressor_clips_to_the_bounds_and_loses_no_coverage():
    rng = np.random.default_rng(1)
    X, y = _bounded_data(500, rng)
    X_test, y_test = _bounded_data(1000, rng)
    kwargs = dict(training=Training(max_epochs=40), posterior=LowRank(max_components=5), likelihood="gaussian",
                  random_state=0)
    free = LaplaceActiveSubspaceRegressor(**kwargs).fit(X, y)
    bounded = LaplaceActiveSubspaceRegressor(y_bounds=(0, None), **kwargs).fit(X, y)
    assert bounded.sample_y(X_test[:50], n_samples=20).min() >= 0.0
    assert free.sample_y(X_test[:50], n_samples=20).min() < 0.0
    np.testing.assert_array_equal(bounded.y_bounds_, [[0.0, INF]])
    levels = [0.5, 0.9]
    pred_free, pis_free = free.predict_interval(X_test, confidence_level=levels)
    pred, pis = bounded.predict_interval(X_test, confidence_level=levels)
    assert (pis_free[:, 0] < 0).mean() > 0.05  # without bounds, intervals reach below 0
    assert pis.min() >= 0.0 and bounded.predict(X_test).min() >= 0.0
    # the same fit otherwise (y_bounds does not touch training): the bounded intervals are the free ones clipped
    np.testing.assert_allclose(pis, np.maximum(pis_free, 0.0), rtol=1e-12, atol=0)
    np.testing.assert_allclose(pred, np.maximum(pred_free, 0.0), rtol=1e-12, atol=0)
    assert (coverage_score(y_test, pis) >= coverage_score(y_test, pis_free)).all()
    assert (mean_width_score(pis) <= mean_width_score(pis_free)).all()
    assert (mean_width_score(pis) < mean_width_score(pis_free)).any()


def test_fit_refuses_targets_outside_the_bounds_before_training():
    rng = np.random.default_rng(2)
    X, y = _bounded_data(60, rng)
    with pytest.raises(ValueError, match="outside y_bounds"):
        LaplaceActiveSubspaceRegressor(y_bounds=(0.5, None), training=Training(max_epochs=1)).fit(X, y)
    with pytest.raises(ValueError, match="y_bounds must be None, a \\(low, high\\) pair"):
        LaplaceActiveSubspaceRegressor(y_bounds=(0, None, 1), training=Training(max_epochs=1)).fit(X, y)
    with pytest.raises(ValueError, match="y_bounds"):
        LaplaceActiveSubspaceRegressor(y_bounds="positive", training=Training(max_epochs=1)).fit(X, y)
