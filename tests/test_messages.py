"""Messages a newcomer meets first (issue 29): a string column named, a module returning (n,) told how to keep its
output axis, a prefit network that learned nothing warned about."""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, PrefitUnderfitWarning
from tests.reference import grouped

FAST = dict(max_epochs=2, max_components=2, n_samples=20, random_state=0)


def _table(n=60):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    y = 2.0 * X[:, 0] - X[:, 1] + 0.1 * rng.standard_normal(n)
    return X, y


def test_string_column_of_a_frame_is_named():
    X, y = _table()
    frame = pd.DataFrame(X, columns=["cement", "water"]).assign(grade=np.where(np.arange(len(y)) % 3, "low", "high"))
    with pytest.raises(ValueError, match=r"non-numeric values in column 'grade' \(e\.g\. 'high'\).*OneHotEncoder"):
        LaplaceActiveSubspaceRegressor(**grouped(**FAST)).fit(frame, y)


def test_string_column_of_an_array_is_numbered_also_at_predict_time():
    X, y = _table()
    reg = LaplaceActiveSubspaceRegressor(**grouped(**FAST)).fit(X, y)
    bad = X.astype(object)
    bad[4, 1] = "high"
    with pytest.raises(ValueError, match=r"column 1 \(0-based; e\.g\. 'high'\)"):
        reg.predict(bad)


class _Squeezed(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x):
        return self.linear(x).squeeze(-1)  # (n,): one value per row without the output axis


def test_module_returning_one_value_per_row_as_1d():
    X, y = _table()
    with pytest.raises(ValueError) as err:
        LaplaceActiveSubspaceRegressor(_Squeezed(), **grouped(**FAST)).fit(X, y)
    text = str(err.value)
    assert "one value per row as a 1-D tensor" in text and "(n, 1)" in text
    assert "unsqueeze(-1)" in text and "reshape(-1, 1)" in text
    assert "output(s) per row" not in text  # the old, confusing wording


def _linear(weight, bias):
    net = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        net.weight.copy_(torch.as_tensor(np.asarray(weight), dtype=torch.float32))
        net.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return net


def _prefit_warnings(est, X, y):
    n = len(X) * 3 // 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X[:n], y[:n], X_cal=X[n:], y_cal=y[n:])
    return [w for w in caught if issubclass(w.category, PrefitUnderfitWarning)]


def test_prefit_regression_network_no_better_than_the_mean_warns():
    X, y = _table()
    X32 = X.astype(np.float32)
    n = len(X) * 3 // 4
    constant = _linear([[0.0, 0.0]], [float(y[:n].mean())])  # MSE = var(y) exactly on the training rows
    found = _prefit_warnings(LaplaceActiveSubspaceRegressor(constant, **grouped(prefit=True, **FAST)), X32, y)
    assert len(found) == 1
    assert "no better than a constant" in str(found[0].message) and "R² = 0.000" in str(found[0].message)
    assert found[0].filename == __file__  # points at the user's call
    # the least-squares fit of the same rows explains nearly all of the variance: no warning
    A = np.column_stack([X[:n], np.ones(n)])
    coef = np.linalg.lstsq(A, y[:n], rcond=None)[0]
    fitted = _linear([coef[:2]], [coef[2]])
    assert _prefit_warnings(LaplaceActiveSubspaceRegressor(fitted, **grouped(prefit=True, **FAST)), X32, y) == []


def test_prefit_classifier_no_better_than_the_majority_class_warns():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(80, 2)).astype(np.float32)
    y = np.where(X[:, 0] > -0.5, 1, 0)  # class 1 the majority
    majority = _linear([[0.0, 0.0], [0.0, 0.0]], [0.0, 1.0])  # always class 1
    found = _prefit_warnings(LaplaceActiveSubspaceClassifier(majority, **grouped(prefit=True, **FAST)), X, y)
    assert len(found) == 1 and "most frequent class" in str(found[0].message)
    separating = _linear([[-5.0, 0.0], [5.0, 0.0]], [-2.5, 2.5])  # logit gap 10 (x0 + 0.5): the rule itself
    assert _prefit_warnings(LaplaceActiveSubspaceClassifier(separating, **grouped(prefit=True, **FAST)), X, y) == []
