"""scikit-learn's estimator checks for both estimators, and their life with clone, pickle, joblib, Pipeline,
ColumnTransformer, GridSearchCV and MAPIE.

Exemptions from ``parametrize_with_checks``: only the two sample-weight equivalence checks (reason below). Every
other check (validation, NaN/inf, unfitted, pickling, n_features_in_, string classes, parameter overwrite,
idempotence, subset and sample-order invariance, the train-score checks, the other sample_weight checks) passes in
the small configuration below, with the defaults and with the paper's settings (subspace posterior, coverage
calibration, sampled predictive); ``EXPECTED_FAILED_CHECKS`` holds each exemption with its reason, and it is run
in strict mode so that a stale entry fails too.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile

import joblib
import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from glas_sklearn import (
    Compute,
    LaplaceActiveSubspaceClassifier,
    LaplaceActiveSubspaceRegressor,
    LowRank,
    coverage_score,
    make_interval_scorer,
)
from glas_sklearn.calibration import CalibrationWarning
from tests.reference import grouped

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

# Small, fast and exact: float64 so that results do not depend on how many rows share a matrix product
# (subset / sample-order invariance), full-batch training so that 50 epochs reach the train-score thresholds.
SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=50, lr=0.05, batch_size=None,
             n_samples=20, max_components=2, dtype="float64", random_state=0)

# check name -> reason.
_SPLIT = ("fit holds a random share of the rows out for calibration, unweighted: repeated rows and integer weights "
          "give different splits (a repeated row may land on both sides). Given the calibration rows, integer weights "
          "equal repetition (tests/test_sample_weight.py), and zero weights equal dropping the rows exactly.")
EXPECTED_FAILED_CHECKS: dict[str, str] = {
    "check_sample_weight_equivalence_on_dense_data": _SPLIT,
    "check_sample_weight_equivalence_on_sparse_data": _SPLIT,
}


# The paper's configuration, whatever the defaults (low-rank posterior, conformal calibration, linearised predictive).
PAPER = dict(posterior="subspace", calibration="coverage", predictive="sampled")


@parametrize_with_checks(
    [LaplaceActiveSubspaceRegressor(**grouped(**SMALL)), LaplaceActiveSubspaceClassifier(**grouped(**SMALL)),
     LaplaceActiveSubspaceRegressor(**grouped(**PAPER, **SMALL)),
     LaplaceActiveSubspaceClassifier(**grouped(**PAPER, **SMALL))],
    expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS,
    xfail_strict=True,
)
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # tiny networks rarely reach 90 % coverage
        check(estimator)


# ------------------------------------------------------------------------------------------- data


def _regression(n=60, n_features=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, n_features))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    return X, y


def _classification(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, "yes", "no").astype(object)
    return X, y


def _fitted(kind, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        if kind == "regressor":
            X, y = _regression()
            return LaplaceActiveSubspaceRegressor(**grouped(**{**SMALL, **params})).fit(X, y), X
        X, y = _classification()
        return LaplaceActiveSubspaceClassifier(**grouped(**{**SMALL, **params})).fit(X, y), X


def _outputs(est, X):
    if isinstance(est, LaplaceActiveSubspaceRegressor):
        y_pred, y_pis = est.predict_interval(X, confidence_level=[0.5, 0.9])
        return [y_pred, y_pis, est.predict(X, return_std=True)[1], est.sample_y(X, 3, random_state=1)]
    labels, sets = est.predict_set(X, confidence_level=[0.5, 0.9])
    return [est.predict_proba(X), labels, sets]


def _assert_same(a, b):
    """Bit for bit: used only where the same computation is replayed (after pickling, or a clone refitted
    with the same seed on the same data)."""
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)


# ------------------------------------------------------------------------------ clone and pickling


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_clone_pickle_joblib_round_trips(kind, predictive, tmp_path):
    est, X = _fitted(kind, predictive=predictive)
    expected = _outputs(est, X[:7])

    loaded = pickle.loads(pickle.dumps(est))
    assert loaded.posterior_._jp_cache is None  # the J P cache of the last inputs is not pickled
    assert loaded.posterior_.device == torch.device("cpu")
    _assert_same(_outputs(loaded, X[:7]), expected)

    path = tmp_path / "est.joblib"
    joblib.dump(est, path)
    _assert_same(_outputs(joblib.load(path), X[:7]), expected)

    # clone: same parameters, unfitted; refitting it reproduces the predictions
    fresh = clone(est)
    assert not hasattr(fresh, "posterior_")
    assert fresh.get_params(deep=False).keys() == est.get_params(deep=False).keys()
    Xf, yf = (_regression() if kind == "regressor" else _classification())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        fresh.fit(Xf, yf)
    _assert_same(_outputs(fresh, X[:7]), expected)


def test_pickled_prefit_estimator_keeps_module_identity():
    """With prefit, module and module_ are one object; after a round trip they still are (one copy)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).double()
    X, y = _regression()
    est = LaplaceActiveSubspaceRegressor(net, prefit=True, n_components=2, random_state=0,
                                         posterior=LowRank(n_samples=20),
                                         compute=Compute(dtype="float64"))
    est.fit(X[10:], y[10:], X_cal=X[:10], y_cal=y[:10])
    assert est.module_ is net
    loaded = pickle.loads(pickle.dumps(est))
    assert loaded.module_ is loaded.module and loaded.module is not net
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))  # the same tensors, the same computation


def _retag_storages(blob: bytes, old: str, new: str) -> bytes:
    """Rewrite the device tag of every storage in the model-file bytes an estimator pickles its torch state as."""
    src = zipfile.ZipFile(io.BytesIO(blob))
    schema = json.loads(src.read("model.json"))
    assert {s["device"] for s in schema["storages"]} == {old}
    for storage in schema["storages"]:
        storage["device"] = new
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as dst:
        dst.writestr("model.json", json.dumps(schema))
        dst.writestr("data.bin", src.read("data.bin"))
    return out.getvalue()


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a machine without CUDA")
def test_cuda_fitted_estimator_unpickles_on_cpu_only_machine():
    """A pickle whose tensors are tagged 'cuda:0' (as if fitted on a GPU) loads here on the CPU."""
    est, X = _fitted("regressor")
    expected = _outputs(est, X[:5])
    state = est.__getstate__()
    state["_glas_state"] = _retag_storages(state["_glas_state"], "cpu", "cuda:0")
    loaded = LaplaceActiveSubspaceRegressor.__new__(LaplaceActiveSubspaceRegressor)
    loaded.__setstate__(state)
    assert loaded.posterior_.device == torch.device("cpu")
    assert loaded.posterior_.layout.device == torch.device("cpu")
    _assert_same(_outputs(loaded, X[:5]), expected)


# ----------------------------------------------------------------- Pipeline, ColumnTransformer, search


def _frame(n=60, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "x1": rng.uniform(-1, 1, n),
        "x2": rng.uniform(-1, 1, n),
        "colour": rng.choice(["red", "green", "blue"], n),
    })
    shift = df["colour"].map({"red": 1.0, "green": 0.0, "blue": -1.0}).to_numpy()
    y = np.sin(2 * df["x1"].to_numpy()) + 0.5 * shift + 0.1 * rng.standard_normal(n)
    return df, y


def _pipeline(**params):
    pre = ColumnTransformer([("num", StandardScaler(), ["x1", "x2"]),
                             ("cat", OneHotEncoder(handle_unknown="ignore"), ["colour"])])
    return Pipeline([("pre", pre), ("glas", LaplaceActiveSubspaceRegressor(**grouped(**{**SMALL, **params})))])


def test_pipeline_with_column_transformer_on_dataframe():
    df, y = _frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        pipe = _pipeline().fit(df, y)
    assert list(pipe.feature_names_in_) == ["x1", "x2", "colour"]
    assert pipe[-1].n_features_in_ == 5  # 2 scaled numbers + 3 one-hot colours
    y_pred = pipe.predict(df)
    assert y_pred.shape == (60,) and np.isfinite(y_pred).all()
    # the transformed frame through the final step directly: same numbers
    Xt = pipe[:-1].transform(df)
    np.testing.assert_array_equal(pipe[-1].predict(Xt), y_pred)  # the pipeline makes this very call
    _, y_pis = pipe[-1].predict_interval(Xt)
    assert y_pis.shape == (60, 2, 1)
    with pytest.raises(ValueError, match="colour"):  # a missing column is named
        pipe.predict(df.drop(columns="colour"))


def test_pipeline_with_pandas_output_sets_feature_names_of_the_estimator():
    df, y = _frame()
    pre = ColumnTransformer([("num", StandardScaler(), ["x1", "x2"]),
                             ("cat", OneHotEncoder(sparse_output=False), ["colour"])],
                            verbose_feature_names_out=False).set_output(transform="pandas")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        pipe = Pipeline([("pre", pre), ("glas", LaplaceActiveSubspaceRegressor(**grouped(**SMALL)))]).fit(df, y)
    assert list(pipe[-1].feature_names_in_) == ["x1", "x2", "colour_blue", "colour_green", "colour_red"]
    Xt = pipe[:-1].transform(df)
    with pytest.warns(UserWarning, match="feature names"):  # sklearn's own check of the names
        pipe[-1].predict(Xt.to_numpy())


def test_grid_search_over_scaling_with_interval_scorer():
    df, y = _frame()
    scorer = make_interval_scorer("interval_score", confidence_level=0.9)
    search = GridSearchCV(_pipeline(), {"glas__scaling": ["mean", "standard"]}, scoring=scorer,
                          cv=KFold(3, shuffle=True, random_state=0), error_score="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        search.fit(df, y)
    scores = search.cv_results_["mean_test_score"]
    assert scores.shape == (2,) and np.all(np.isfinite(scores)) and np.all(scores < 0)  # negated Winkler
    assert search.best_params_["glas__scaling"] == ["mean", "standard"][int(np.argmax(scores))]
    # the scorer on the refitted pipeline equals the metric computed by hand on its intervals
    best = search.best_estimator_
    _, y_pis = best[-1].predict_interval(best[:-1].transform(df), confidence_level=0.9)
    lo, hi = y_pis[:, 0, 0], y_pis[:, 1, 0]
    winkler = (hi - lo) + 20 * np.maximum(lo - y, 0) + 20 * np.maximum(y - hi, 0)
    assert scorer(best, df, y) == pytest.approx(-winkler.mean(), rel=1e-12)


def test_mapie_split_conformal_regressor_with_std_normalized_score():
    mapie_regression = pytest.importorskip("mapie.regression")
    X, y = _regression(n=120)
    X_train, y_train, X_conf, y_conf, X_test = X[:60], y[:60], X[60:100], y[60:100], X[100:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        ours = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X_train, y_train)
    scr = mapie_regression.SplitConformalRegressor(estimator=ours, confidence_level=0.9,
                                                   conformity_score="std_normalized", prefit=True)
    scr.conformalize(X_conf, y_conf)
    y_pred, y_pis = scr.predict_interval(X_test)
    assert y_pis.shape == (20, 2, 1)
    mean, std = ours.predict(X_test, return_std=True)
    np.testing.assert_allclose(y_pred, mean)
    # std-normalised conformal intervals: mean − q_lo·std and mean + q_up·std, with the same q_lo, q_up for
    # every row, each one of the calibration scores |y − mean|/std (an order statistic)
    q_lo = (mean - y_pis[:, 0, 0]) / std
    q_up = (y_pis[:, 1, 0] - mean) / std
    np.testing.assert_allclose(q_lo, q_lo[0], rtol=1e-8)
    np.testing.assert_allclose(q_up, q_up[0], rtol=1e-8)
    m_conf, s_conf = ours.predict(X_conf, return_std=True)
    scores = np.abs(y_conf - m_conf) / s_conf
    assert np.min(np.abs(scores - q_lo[0])) < 1e-8 * q_lo[0]
    assert np.min(np.abs(scores - q_up[0])) < 1e-8 * q_up[0]
    # split conformal: on the conformalisation rows themselves the coverage is at least the level
    _, pis_conf = scr.predict_interval(X_conf)
    assert coverage_score(y_conf, pis_conf)[0] >= 0.9
