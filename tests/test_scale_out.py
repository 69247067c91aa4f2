"""Predictions over Dask collections on a real ``distributed.LocalCluster`` (2 worker processes, 127.0.0.1): the
four methods and the top-level functions return Dask Arrays whose values are the in-process call's, computed on the
workers, with the model loaded once per worker; errors raised on a worker surface with their message."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

import glas_sklearn
from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, LowRank, Training
from glas_sklearn.scale_out import is_dask_collection, model_payload, worker_cache_info

dask = pytest.importorskip("dask", reason="needs dask (pip install 'glas-sklearn[dask]')")
da = pytest.importorskip("dask.array", reason="needs dask[array]")
dd = pytest.importorskip("dask.dataframe", reason="needs dask[dataframe]")
distributed = pytest.importorskip("distributed", reason="needs distributed (pip install 'glas-sklearn[dask]')")

ROOT = Path(__file__).resolve().parents[1]
# float32 networks: a partition's chunks are the rows of the in-process call's chunks, the same float32 products
ATOL = 1e-6


@pytest.fixture(scope="module")
def client():
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), saved or ""])  # the workers import this glas_sklearn
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                                       dashboard_address=None)
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=240)
    labels = np.array(["a", "b", "c"])[(X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)]
    return X, y, labels


@pytest.fixture(scope="module")
def reg(rows):
    X, y, _ = rows
    return LaplaceActiveSubspaceRegressor(training=Training(max_epochs=5), posterior=LowRank(max_components=3),
                                          random_state=0).fit(X, y)


@pytest.fixture(scope="module")
def clf(rows):
    X, _, labels = rows
    return LaplaceActiveSubspaceClassifier(training=Training(max_epochs=5), posterior=LowRank(max_components=3),
                                           random_state=0).fit(X, labels)


def _frame(X, npartitions=4):
    return dd.from_pandas(pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])]), npartitions=npartitions)


def _info(client) -> dict:
    return client.run(worker_cache_info)


def _partitions_done(before: dict, after: dict) -> dict:
    """Worker address -> partitions it predicted between two snapshots."""
    return {w: sum(after[w]["partitions"].values()) - sum(before.get(w, {"partitions": {}})["partitions"].values())
            for w in after}


def _pandas(X):
    return pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])])


def _quiet(f, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "X has feature names, but ... fitted without" as the pandas path gives
        return f(*args, **kwargs)


def test_the_type_check_imports_nothing():
    code = ("import sys, numpy as np, pandas as pd; from glas_sklearn.scale_out import is_dask_collection; "
            "assert not is_dask_collection(np.ones(3)) and not is_dask_collection(pd.DataFrame({'a': [1]})); "
            "assert 'dask' not in sys.modules, 'dask imported'; import glas_sklearn; "
            "assert 'dask' not in sys.modules, 'dask imported by glas_sklearn'")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert is_dask_collection(da.ones((3, 2))) and is_dask_collection(_frame(np.ones((4, 2)), 2))


def test_predict_interval_runs_on_the_workers_and_equals_the_local_call(client, reg, rows):
    X = rows[0]
    before = _info(client)
    y_pred, y_pis = reg.predict_interval(_frame(X, 6), confidence_level=[0.5, 0.9])
    assert isinstance(y_pred, da.Array) and isinstance(y_pis, da.Array)
    assert y_pis.ndim == 3 and y_pis.shape[1:] == (2, 2) and y_pis.dtype == np.float64
    got_pred, got_pis = dask.compute(y_pred, y_pis)
    ref_pred, ref_pis = _quiet(reg.predict_interval, _pandas(X), confidence_level=[0.5, 0.9])
    assert got_pred.shape == ref_pred.shape and got_pis.shape == ref_pis.shape == (240, 2, 2)
    np.testing.assert_allclose(got_pred, ref_pred, atol=ATOL, rtol=0)
    np.testing.assert_allclose(got_pis, ref_pis, atol=ATOL, rtol=0)
    after = _info(client)
    done = _partitions_done(before, after)
    assert sum(done.values()) == 6, done  # every partition predicted on a worker
    pids = {after[w]["pid"] for w, n in done.items() if n}
    assert os.getpid() not in pids and pids <= {info["pid"] for info in after.values()}
    assert worker_cache_info()["partitions"] == {}, "a partition was predicted in the calling process"


def test_the_model_is_loaded_once_per_worker_and_scattered_once(client, reg, rows):
    X = rows[0]
    key = model_payload(reg).key
    for _ in range(2):  # two calls of 8 partitions each
        y_pred, y_pis = reg.predict_interval(_frame(X, 8))
        dask.compute(y_pred, y_pis)
        # this model's one key is held (scattered to both workers; the scheduler's active memory manager may drop a
        # replica once no task waits on it, so a worker may fetch it again, never load it again: below)
        held = {str(k): w for k, w in client.who_has().items() if str(k).startswith("glas-model-")}
        assert len(held.get(f"glas-model-{key[:16]}", ())) >= 1, held
    info = _info(client)
    loads = [i["loads"].get(key, 0) for i in info.values()]
    assert max(loads) == 1 and sum(i["partitions"].get(key, 0) for i in info.values()) >= 16, info


def test_predict_with_std_over_an_array_chunked_along_columns(client, reg, rows):
    X = rows[0]
    mean, std = reg.predict(da.from_array(X, chunks=(50, 2)), return_std=True)  # column chunks joined per block
    assert mean.chunks[0] == (50, 50, 50, 50, 40) and mean.shape == (240,)
    ref_mean, ref_std = reg.predict(X, return_std=True)
    got_mean, got_std = dask.compute(mean, std)
    np.testing.assert_allclose(got_mean, ref_mean, atol=ATOL, rtol=0)
    np.testing.assert_allclose(got_std, ref_std, atol=ATOL, rtol=0)


def test_the_classifier_methods(client, clf, rows):
    X = rows[0]
    ddf = _frame(X, 3)
    proba, labels = clf.predict_proba(ddf), clf.predict(ddf)
    set_labels, sets = clf.predict_set(ddf, confidence_level=[0.8, 0.95])
    assert proba.dtype == np.float64 and sets.dtype == bool and sets.shape[1:] == (3, 2)
    got = dask.compute(proba, labels, set_labels, sets)
    ref = (_quiet(clf.predict_proba, _pandas(X)), _quiet(clf.predict, _pandas(X)),
           *_quiet(clf.predict_set, _pandas(X), confidence_level=[0.8, 0.95]))
    np.testing.assert_allclose(got[0], ref[0], atol=ATOL, rtol=0)
    for g, r in zip(got[1:], ref[1:], strict=True):
        assert g.dtype == r.dtype and np.array_equal(g, r)


def test_pipelines_through_the_top_level_functions(client, reg, clf, rows):
    X, y, labels = rows
    pipe = make_pipeline(StandardScaler(), LaplaceActiveSubspaceRegressor(
        training=Training(max_epochs=5), posterior=LowRank(max_components=3), random_state=0)).fit(X, y)
    y_pred, y_pis = glas_sklearn.predict_interval(pipe, _frame(X), confidence_level=0.9)
    ref_pred, ref_pis = _quiet(glas_sklearn.predict_interval, pipe, _pandas(X), confidence_level=0.9)
    got_pred, got_pis = dask.compute(y_pred, y_pis)
    np.testing.assert_allclose(got_pis, ref_pis, atol=ATOL, rtol=0)
    np.testing.assert_allclose(glas_sklearn.scale_out.predict(pipe, _frame(X)).compute(), ref_pred, atol=ATOL, rtol=0)
    cpipe = make_pipeline(StandardScaler(), LaplaceActiveSubspaceClassifier(
        training=Training(max_epochs=5), posterior=LowRank(max_components=3), random_state=0)).fit(X, labels)
    got_labels, got_sets = dask.compute(*glas_sklearn.predict_set(cpipe, _frame(X)))
    ref_labels, ref_sets = _quiet(glas_sklearn.predict_set, cpipe, _pandas(X))
    assert np.array_equal(got_labels, ref_labels) and np.array_equal(got_sets, ref_sets)
    np.testing.assert_allclose(glas_sklearn.scale_out.predict_proba(cpipe, _frame(X)).compute(),
                               _quiet(cpipe.predict_proba, _pandas(X)), atol=ATOL, rtol=0)


def test_a_model_the_safe_format_refuses_is_pickled(client, reg, rows):
    X, y, _ = rows
    pipe = make_pipeline(FunctionTransformer(lambda Z: 2 * Z), LaplaceActiveSubspaceRegressor(
        training=Training(max_epochs=3), posterior=LowRank(max_components=2), random_state=0)).fit(X, y)
    assert model_payload(pipe).kind == "pickle" and model_payload(reg).kind == "glas"
    np.testing.assert_allclose(glas_sklearn.scale_out.predict(pipe, da.from_array(X, chunks=60)).compute(),
                               pipe.predict(X), atol=ATOL, rtol=0)


def test_empty_partitions(client, reg, rows):
    X = rows[0]
    frame = _frame(X, 4)
    kept = frame[frame["x0"] > 10]  # every partition empty
    y_pred, y_pis = reg.predict_interval(kept)
    got_pred, got_pis = dask.compute(y_pred, y_pis)
    assert got_pred.shape == (0,) and got_pis.shape == (0, 2, 1)
    half = frame.map_partitions(lambda part: part if part.index[0] < 120 else part.iloc[:0])  # two of 4 empty
    np.testing.assert_allclose(reg.predict(half).compute(), reg.predict(X[:120]), atol=ATOL, rtol=0)


def test_a_wrong_number_of_columns_is_refused_before_any_work(client, reg, rows):
    before = _info(client)
    with pytest.raises(ValueError, match="3 features"):
        reg.predict_interval(da.from_array(rows[0][:, :3], chunks=60))
    assert sum(_partitions_done(before, _info(client)).values()) == 0
    with pytest.raises(ValueError, match="2-D"):
        reg.predict(da.ones(10, chunks=5))
    with pytest.raises(TypeError, match="Dask DataFrame or a Dask Array"):
        reg.predict(_frame(rows[0])["x0"])


def test_an_error_on_a_worker_surfaces_with_its_message(client, reg, rows):  # last: other partitions may still run
    X = rows[0].copy()
    X[200, 2] = np.nan  # in the last of 4 partitions only
    y_pred = reg.predict(_frame(X, 4))
    with pytest.raises(ValueError, match="NaN") as err:
        y_pred.compute()
    with pytest.raises(ValueError, match="NaN") as local:
        reg.predict(X)
    assert str(err.value) == str(local.value)
