"""dtype="auto" (the default): a prefit module's own dtype, float32 for a network the estimator builds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from glas_sklearn import Compute, LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import CalibrationWarning
from tests.reference import assert_unchanged, grouped, mlp, snapshot

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

TINY = dict(max_components=2, n_samples=20, random_state=0)


@pytest.fixture(autouse=True)
def _quiet_calibration():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        yield


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    return X, np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)


@pytest.mark.parametrize("estimator", [LaplaceActiveSubspaceRegressor, LaplaceActiveSubspaceClassifier])
def test_auto_is_the_default(estimator):
    assert estimator().get_params()["compute"] is None and Compute().dtype == "auto"  # None: Compute()


@pytest.mark.parametrize("torch_dtype", [torch.float64, torch.float32])
def test_auto_follows_a_prefit_module(torch_dtype):
    net = mlp(n_in=3, hidden=4, n_out=1, dtype=torch_dtype, seed=0)
    before = snapshot(net)
    X, y = _data()
    X_cal, y_cal = _data(n=20, seed=1)  # rows the network was not trained on
    reg = LaplaceActiveSubspaceRegressor(**grouped(module=net, prefit=True, predictive="linearized", **TINY))
    reg.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert_unchanged(net, before)  # neither cast nor copied
    assert reg.module_ is net and reg.posterior_.dtype == torch_dtype
    with torch.no_grad():
        expected = net(torch.as_tensor(X, dtype=torch_dtype)).double().numpy()[:, 0]
    tol = 10 * torch.finfo(torch_dtype).eps * max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(reg.predict(X), expected, rtol=0, atol=tol)


def test_auto_builds_float32_and_explicit_dtypes_are_kept():
    X, y = _data()
    small = dict(module_kwargs=dict(hidden_layer_sizes=(4,)), max_epochs=2, **TINY)
    for dtype, expected in [("auto", torch.float32), ("float32", torch.float32), ("float64", torch.float64)]:
        reg = LaplaceActiveSubspaceRegressor(**grouped(dtype=dtype, **small)).fit(X, y)
        assert {p.dtype for p in reg.module_.parameters()} == {expected}, dtype
        assert reg.posterior_.dtype == expected


def test_explicit_dtype_that_differs_from_a_prefit_module_is_refused():
    X, y = _data()
    reg = LaplaceActiveSubspaceRegressor(**grouped(module=mlp(n_in=3, dtype=torch.float64), prefit=True,
                                                   dtype="float32", **TINY))
    with pytest.raises(ValueError, match=r"dtype torch\.float64.*dtype='float32'"):
        reg.fit(X, y, X_cal=X, y_cal=y)


def test_auto_refuses_a_half_precision_prefit_module():
    X, y = _data()
    reg = LaplaceActiveSubspaceRegressor(**grouped(module=mlp(n_in=3, dtype=torch.float16), prefit=True, **TINY))
    with pytest.raises(ValueError, match=r"torch\.float16.*float32 or float64"):
        reg.fit(X, y, X_cal=X, y_cal=y)
