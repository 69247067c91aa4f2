"""glas_sklearn.metrics against values computed by hand, and the scorers inside Pipelines and searches."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from glas_sklearn import coverage_score, interval_score, make_interval_scorer, mean_width_score

from .stubs import FixedLevelStub, IntervalStub

# four targets; intervals [0, 2] at level 0.5 and [−1, 3] at level 0.9, the last row's shifted up by 3
Y = np.array([1.0, 2.0, -0.5, 4.0])
LOWER = np.array([[0.0, -1.0], [0.0, -1.0], [0.0, -1.0], [0.0, -1.0]]) + np.array([0, 0, 0, 3.0])[:, None]
UPPER = LOWER + np.array([2.0, 4.0])
PIS = np.stack([LOWER, UPPER], axis=1)  # (4, 2, 2)


def test_coverage_by_hand():
    # level 0.5: [0,2] ∋ 1 yes, [0,2] ∋ 2 yes (bounds count), [0,2] ∌ −0.5, [3,5] ∋ 4 yes → 3/4
    # level 0.9: [−1,3] ∋ 1, 2, −0.5 yes; [2,6] ∋ 4 yes → 4/4
    np.testing.assert_allclose(coverage_score(Y, PIS), [0.75, 1.0])
    assert coverage_score(Y, PIS[:, :, 0]) == 0.75  # (n, 2): a float
    assert isinstance(coverage_score(Y, PIS[:, :, 0]), float)
    np.testing.assert_allclose(coverage_score(Y[:, None], PIS), [0.75, 1.0])  # (n, 1) targets are accepted


def test_mean_width_by_hand():
    np.testing.assert_allclose(mean_width_score(PIS), [2.0, 4.0])
    assert mean_width_score(np.array([[0.0, 1.0], [2.0, 5.0]])) == 2.0


def test_winkler_interval_score_by_hand():
    # level 0.5 (2/γ = 4): widths 2; the third target misses by 0.5 → 2 + 4·0.5 = 4; mean (2+2+4+2)/4 = 2.5
    # level 0.9 (2/γ = 20): widths 4, no misses → 4
    np.testing.assert_allclose(interval_score(Y, PIS, [0.5, 0.9]), [2.5, 4.0])
    assert interval_score(Y, PIS[:, :, 0], 0.5) == 2.5
    # one level for all k: applied to each
    np.testing.assert_allclose(interval_score(Y, PIS, 0.5), [2.5, 4.0])
    # a miss above: y = 7 against [3, 5] at 0.8 → 2 + (2/0.2)·2 = 22
    assert interval_score([7.0], np.array([[3.0, 5.0]]), 0.8) == pytest.approx(22.0)


def test_multi_output_intervals_average_over_all_entries():
    y = np.column_stack([Y, Y + 10])
    pis = np.stack([PIS, PIS + 10], axis=1)  # (n, M=2, 2, k=2): the same problem shifted
    np.testing.assert_allclose(coverage_score(y, pis), [0.75, 1.0])
    np.testing.assert_allclose(mean_width_score(pis), [2.0, 4.0])
    np.testing.assert_allclose(interval_score(y, pis, [0.5, 0.9]), [2.5, 4.0])
    y_mixed = y.copy()
    y_mixed[0, 1] = 100.0  # one more miss at level 0.5, in the second output only: 5 hits of 8
    assert coverage_score(y_mixed, pis)[0] == 5 / 8


@pytest.mark.parametrize("call, match", [
    (lambda: coverage_score(Y, np.zeros((4, 3))), "shape"),
    (lambda: coverage_score(Y[:3], PIS), "y_true has shape"),
    (lambda: coverage_score(Y, PIS[:, ::-1]), "lower bound lies above"),
    (lambda: coverage_score([np.nan, 0, 0, 0], PIS), "NaN"),
    (lambda: mean_width_score(np.full((2, 2), np.inf)), "NaN or infinite"),
    (lambda: interval_score(Y, PIS, [0.5, 0.8, 0.9]), "3 levels"),
    (lambda: interval_score(Y, PIS, 1.0), "confidence_level"),
    (lambda: make_interval_scorer("rmse"), "metric"),
    (lambda: make_interval_scorer(confidence_level=[0.5, 0.9]), "confidence_level"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_scorers_on_a_stub_by_hand():
    X = np.array([[0.0], [1.0], [2.0], [3.0]])
    y = np.array([0.5, 1.0, 4.0, 3.0])  # the third misses [1, 3] by 1
    est = IntervalStub(half=1.0).fit(X, y)
    assert make_interval_scorer("coverage")(est, X, y) == 0.75
    assert make_interval_scorer("width")(est, X, y) == -2.0
    assert make_interval_scorer("interval_score", 0.9)(est, X, y) == pytest.approx(-(2 + 20 * 1 / 4))
    # the scorer's level reaches the estimator: at 0.45 the half-width is 0.5
    assert make_interval_scorer("width", 0.45)(est, X, y) == pytest.approx(-1.0)
    assert make_interval_scorer("coverage")(FixedLevelStub(half=1.0).fit(X, y), X, y) == 0.75


def test_scorer_reaches_the_last_step_of_nested_pipelines():
    X = np.array([[0.0], [1.0], [2.0], [3.0]])
    y = np.array([0.5, 1.0, 4.0, 3.0])
    plus_one = FunctionTransformer(lambda A: A + 1.0)
    inner = Pipeline([("shift", plus_one), ("est", IntervalStub())])
    pipe = Pipeline([("noop", "passthrough"), ("inner", inner)]).fit(X, y)
    # X is shifted before the last step: centres 1, 2, 3, 4 ± 1 hold 0.5, 1, 4, 3 (untransformed: 3 of 4)
    assert make_interval_scorer("coverage")(pipe, X, y) == 1.0
    assert make_interval_scorer("coverage")(make_pipeline(IntervalStub()).fit(X, y), X, y) == 0.75
    with pytest.raises(TypeError, match="predict_interval"):
        make_interval_scorer()(make_pipeline(StandardScaler()).fit(X), X, y)


def test_scorer_in_grid_search_and_cross_validation():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 1))
    y = X[:, 0] + 0.5 * rng.standard_normal(40)
    pipe = Pipeline([("scale", FunctionTransformer()), ("est", IntervalStub())])
    search = GridSearchCV(pipe, {"est__half": [0.1, 1.0, 10.0]}, cv=KFold(4),
                          scoring=make_interval_scorer("interval_score", 0.9)).fit(X, y)
    assert search.best_params_ == {"est__half": 1.0}  # too narrow misses a lot, too wide is wide
    scores = cross_val_score(pipe, X, y, cv=KFold(4), scoring=make_interval_scorer("coverage"))
    assert scores.shape == (4,) and np.all((0 <= scores) & (scores <= 1))
