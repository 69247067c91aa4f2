"""The package's warnings point at the user's line and name what fixes them.

A warning raised in a fit or a predict is about the call the user made: ``warnings`` reports the file and line of
the frame it is attributed to, so that frame must be the caller's (this file here), never a file inside
``glas_sklearn/``. One rule does it (``glas_sklearn/_warnings.py``); the first test checks the source follows it,
the others trigger the package's warnings from here and read where they point.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import CalibrationWarning, ConformalWarning
from glas_sklearn.eigen import top_eigenpairs
from glas_sklearn.estimators import LowRank, PrefitLeakageWarning, PrefitUnderfitWarning, Training

PACKAGE = Path(__file__).resolve().parents[1] / "glas_sklearn"
# Quick fits: a short training of one network, no early stopping.
QUICK = Training(max_epochs=30, n_networks=1, early_stopping=False)


def _warning_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "warn" and getattr(func.value, "id", "") == "warnings":
                yield "warnings.warn", node
            elif isinstance(func, ast.Name) and func.id == "warn":
                yield "warn", node


def test_every_warning_of_the_package_follows_the_one_rule():
    """``warn(message, category)`` from ``_warnings``, or ``warnings.warn(..., stacklevel=user_stacklevel())``:
    never a fixed stacklevel, which points inside the package as soon as the call path changes."""
    offending, seen = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_warnings.py":
            continue
        for kind, node in _warning_calls(ast.parse(path.read_text(encoding="utf-8"))):
            seen += 1
            level = next((k.value for k in node.keywords if k.arg == "stacklevel"), None)
            good = (level is None if kind == "warn" else
                    isinstance(level, ast.Call) and getattr(level.func, "id", "") == "user_stacklevel")
            if not good:
                offending.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert seen >= 12, f"found only {seen} warning calls: the scan misses some"
    assert not offending, "warnings that do not point at the caller's line:\n" + "\n".join(offending)


def _caught(category, action):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = action()
    ours = [w for w in caught if issubclass(w.category, category)]
    assert ours, f"no {category.__name__} raised; got {[str(w.message)[:80] for w in caught]}"
    for w in ours:
        assert Path(w.filename).resolve() == Path(__file__).resolve(), (
            f"{category.__name__} points at {w.filename}:{w.lineno}, not at the caller's line: {w.message}")
    return ours, result


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    return X, X[:, 0] + 0.1 * rng.normal(size=200)


@pytest.fixture(scope="module")
def small_fit(data):
    X, y = data
    return LaplaceActiveSubspaceRegressor(training=QUICK, random_state=0).fit(X, y)


def test_a_level_too_high_for_the_calibration_rows_at_predict(small_fit, data):
    ours, (_, pis) = _caught(ConformalWarning, lambda: small_fit.predict_interval(data[0][:5], confidence_level=0.99))
    assert np.isinf(pis).all()
    message = str(ours[0].message)
    assert "20 calibration rows are too few" in message and "calibration_size" in message


def test_a_level_too_high_for_the_calibration_rows_at_fit(data):
    X, y = data
    ours, _ = _caught(ConformalWarning, lambda: LaplaceActiveSubspaceRegressor(
        training=QUICK, calibration_size=5, random_state=0).fit(X, y))
    assert "calibration_size" in str(ours[0].message)


def test_coverage_never_reaching_its_target(data):
    X, y = data
    noisy = y + 2 * np.random.default_rng(1).normal(size=len(y))  # intervals for f cannot cover y this noisy
    reg = LaplaceActiveSubspaceRegressor(calibration="coverage", posterior=LowRank(max_components=1),
                                         likelihood="gaussian", training=QUICK, random_state=0)
    ours, _ = _caught(CalibrationWarning, lambda: reg.fit(X, noisy))
    assert "max_components" in str(ours[0].message)


def test_lanczos_not_converging():
    A = torch.diag(torch.linspace(1.0, 1.001, 400, dtype=torch.float64))  # a flat spectrum: slow convergence
    ours, result = _caught(ConvergenceWarning, lambda: top_eigenpairs(A, 5, max_matvecs=12, random_state=0))
    assert not result.converged and "max_matvecs" in str(ours[0].message)


def test_a_class_short_of_calibration_rows():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 2))
    y = np.where(X[:, 0] > 0, "pos", "neg")
    X_cal, y_cal = X[:30], np.array(["pos"] * 29 + ["neg"])  # one 'neg' row: too few for its own quantile
    clf = LaplaceActiveSubspaceClassifier(calibration="mondrian", sigma0=0.0, training=QUICK, random_state=0)
    ours, _ = _caught(ConformalWarning, lambda: clf.fit(X[30:], y[30:], X_cal=X_cal, y_cal=y_cal))
    assert "'neg'" in str(ours[0].message) and "calibration_size" in str(ours[0].message)


def test_prefit_warnings():
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()  # never trained: no better than a constant
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 3.0
    reg = LaplaceActiveSubspaceRegressor(module=net, prefit=True, likelihood="gaussian", random_state=0)
    _caught(PrefitUnderfitWarning, lambda: reg.fit(X[:80], y[:80], X_cal=X[60:], y_cal=y[60:]))
    ours, _ = _caught(PrefitLeakageWarning, lambda: reg.fit(X[:80], y[:80], X_cal=X[60:], y_cal=y[60:]))
    assert "X_cal" in str(ours[0].message)
    _caught(PrefitLeakageWarning, lambda: reg.predict_interval(X[:10]))
