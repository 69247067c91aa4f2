"""A prefit network is calibrated only on rows it has not seen (issue 22).

- a simulation: an overfitting prefit network calibrated on unseen rows covers 1 − γ on average over many
  splits (the tolerance is the spread of split-conformal coverage, a Beta distribution, plus the binomial spread
  of the test rows), while rows taken from its training data under-cover far below that;
- fit with prefit=True and no X_cal is refused with a message naming X_cal (regressor, classifier, the paper's
  coverage calibration, skorch nets);
- an estimator that trains its own network holds the calibration rows out of training (the rows the network
  saw in training mode are exactly ``X[train_indices_]``);
- cross-validating a prefit network (GridSearchCV, cross_validate) raises a PrefitLeakageWarning.
"""

from __future__ import annotations

import copy
import math
import re
import warnings

import numpy as np
import pytest
import torch
from sklearn.model_selection import GridSearchCV, cross_validate
from torch import nn

from glas_sklearn import (
    Compute,
    LaplaceActiveSubspaceClassifier,
    LaplaceActiveSubspaceRegressor,
    LowRank,
    PrefitLeakageWarning,
    Training,
)
from glas_sklearn.calibration import CalibrationWarning
from glas_sklearn.estimators._prefit import PrefitRowRegistry, module_fingerprint, row_digests
from glas_sklearn.metrics import make_interval_scorer
from tests.reference import assert_unchanged, grouped, snapshot

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

LEVEL = 0.9


@pytest.fixture(autouse=True)
def _quiet_calibration():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # tiny networks rarely reach the level
        yield


def _draw(n: int, rng: np.random.Generator):
    x = rng.uniform(-2, 2, size=(n, 1))
    return x, np.sin(2 * x[:, 0]) + 0.3 * rng.standard_normal(n)


def _overfitting_net(X: np.ndarray, y: np.ndarray, width: int = 100, seed: int = 0) -> nn.Module:
    """1-width-1 tanh network whose output layer is the (nearly unregularised) least-squares fit of y on
    ``width`` random tanh features: with more features than rows it fits the training noise."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, 1)).double()
    with torch.no_grad():
        net[0].weight.normal_(0.0, 3.0)
        net[0].bias.uniform_(-4.0, 4.0)
        F = torch.tanh(net[0](torch.as_tensor(X)))
        A = torch.cat([F, torch.ones(len(X), 1, dtype=F.dtype)], dim=1)
        w = torch.linalg.solve(A.T @ A + 1e-4 * torch.eye(width + 1, dtype=F.dtype),
                               A.T @ torch.as_tensor(y)[:, None])
        net[2].weight.copy_(w[:width].T)
        net[2].bias.copy_(w[width])
    return net.eval()


def _coverage(est, X, y) -> float:
    _, pis = est.predict_interval(X)
    return float(np.mean((y >= pis[:, 0, 0]) & (y <= pis[:, 1, 0])))


def _split_conformal_mean_coverage(n_cal: int, n_test: int, n_splits: int) -> tuple[float, float]:
    """Mean and standard deviation of the average test coverage over ``n_splits`` independent splits.

    For continuous scores, the coverage given the calibration rows is Beta(k, n + 1 − k) with
    k = ⌈(n + 1)(1 − γ)⌉; the test rows add a binomial spread C(1 − C)/m around it."""
    k = math.ceil((n_cal + 1) * LEVEL - 1e-9)
    a, b = k, n_cal + 1 - k
    mean = a / (a + b)
    var_beta = a * b / ((a + b) ** 2 * (a + b + 1))
    var_binomial = (mean - (var_beta + mean**2)) / n_test  # E[C(1 − C)] / m
    return mean, math.sqrt((var_beta + var_binomial) / n_splits)


# ------------------------------------------------------------------------------------------- simulation
def test_overfitting_prefit_network_calibrated_on_unseen_rows_covers_the_level_on_average():
    X, y = _draw(40, np.random.default_rng(0))
    net = _overfitting_net(X, y)
    with torch.no_grad():
        train_rmse = float(np.sqrt(np.mean((net(torch.as_tensor(X))[:, 0].numpy() - y) ** 2)))
    assert train_rmse < 0.25  # below the noise (0.3): the network fits its training noise

    # fresh calibration and test rows for each split; the network and its training rows stay fixed, so the
    # scores are exchangeable and the split-conformal coverage is exactly Beta-distributed (one random_state:
    # the same posterior, the same score function, in every split)
    n_cal, n_test, n_splits = 39, 300, 40
    unseen = []
    for r in range(n_splits):
        rng = np.random.default_rng(1000 + r)
        X_cal, y_cal = _draw(n_cal, rng)
        X_test, y_test = _draw(n_test, rng)
        est = LaplaceActiveSubspaceRegressor(net, prefit=True, confidence_level=LEVEL, random_state=0,
                                             posterior=LowRank(max_components=5), compute=Compute(dtype="float64"))
        unseen.append(_coverage(est.fit(X, y, X_cal=X_cal, y_cal=y_cal), X_test, y_test))
    expected, sd = _split_conformal_mean_coverage(n_cal, n_test, n_splits)
    assert expected == pytest.approx(LEVEL)  # k/(n + 1) = 36/40
    assert expected - 4 * sd <= np.mean(unseen) <= expected + 4 * sd

    # the same network calibrated on half of its own training rows (what fit(X, y) used to do): far below,
    # and fit warns that X_cal holds rows declared as the network's training rows
    n_half, n_seen_splits = 20, 10
    seen = []
    for r in range(n_seen_splits):
        rng = np.random.default_rng(2000 + r)
        rows = rng.permutation(len(X))
        fit_rows, cal_rows = rows[:n_half], rows[n_half:]
        X_test, y_test = _draw(n_test, rng)
        est = LaplaceActiveSubspaceRegressor(net, prefit=True, confidence_level=LEVEL, random_state=0,
                                             posterior=LowRank(max_components=5), compute=Compute(dtype="float64"))
        with pytest.warns(PrefitLeakageWarning, match=r"20 of the 20 X_cal rows are rows declared as training rows"):
            est.fit(X[fit_rows], y[fit_rows], X_cal=X[cal_rows], y_cal=y[cal_rows])
        seen.append(_coverage(est, X_test, y_test))
    expected_seen, sd_seen = _split_conformal_mean_coverage(n_half, n_test, n_seen_splits)
    assert np.mean(seen) < expected_seen - 4 * sd_seen


# --------------------------------------------------------------------------------------------- refusal
def _refused(est, X, y):
    with pytest.raises(ValueError) as info:
        est.fit(X, y)
    msg = str(info.value)
    assert "prefit=True needs calibration rows that the network was not trained on" in msg
    assert "fit(X, y, X_cal=..., y_cal=...)" in msg
    assert "the rows of X are taken to be the network's training rows" in msg
    assert "under-cover" in msg and "docs/benchmarks/studies.md#prefit-calibration" in msg
    assert re.search(r"covered \d+ % \(\d+–\d+ %\) of new rows calibrated that way, \d+ % with unseen X_cal", msg)
    assert "Hold rows out before training the network" in msg
    assert not hasattr(est, "posterior_")
    return msg


@pytest.mark.parametrize("settings", [{}, dict(calibration="coverage", posterior="subspace")])
def test_prefit_regressor_without_calibration_rows_is_refused(settings):
    X, y = _draw(40, np.random.default_rng(0))
    net = _overfitting_net(X, y)
    before = snapshot(net)
    msg = _refused(LaplaceActiveSubspaceRegressor(net, **grouped(prefit=True, dtype="float64", **settings)), X, y)
    assert "calibrated intervals would under-cover" in msg
    assert_unchanged(net, before)


@pytest.mark.parametrize("settings", [{}, dict(calibration="coverage", posterior="subspace")])
def test_prefit_classifier_without_calibration_rows_is_refused(settings):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 2))
    label = (X[:, 0] > 0).astype(int)
    net = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    msg = _refused(LaplaceActiveSubspaceClassifier(net, **grouped(prefit=True, dtype="float64", **settings)), X, label)
    assert "calibrated prediction sets would under-cover" in msg


def test_prefit_skorch_nets_without_calibration_rows_are_refused():
    skorch = pytest.importorskip("skorch")
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(40, 2)).astype(np.float32)
    y = np.sin(2 * X[:, 0]).astype(np.float32)
    common = dict(max_epochs=2, lr=0.01, train_split=None, verbose=0, batch_size=-1)
    reg = skorch.NeuralNetRegressor(nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1)), **common)
    _refused(LaplaceActiveSubspaceRegressor(reg.fit(X, y[:, None]), prefit=True), X, y)
    label = (X[:, 0] > 0).astype(np.int64)
    clf = skorch.NeuralNetClassifier(nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2)),
                                     criterion=nn.CrossEntropyLoss, **common)
    _refused(LaplaceActiveSubspaceClassifier(clf.fit(X, label), prefit=True), X, label)


# ------------------------------------------------------------------- the estimator's own network
class _Recorder(nn.Module):
    """A small MLP that keeps every input it is called with in training mode."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(n_in, 6), nn.Tanh(), nn.Linear(6, n_out)).double()
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        if self.training:
            self.seen.append(x.detach().clone())
        return self.body(x)


def _rows(A) -> set:
    return {tuple(row) for row in np.asarray(A).reshape(len(A), -1).tolist()}


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_own_network_is_trained_only_on_rows_held_apart_from_the_calibration_rows(task):
    rng = np.random.default_rng(1)
    n = 70
    X = rng.standard_normal((n, 2))
    if task == "regression":
        y = X[:, 0] - 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
        est = LaplaceActiveSubspaceRegressor(_Recorder(2, 1), training=Training(standardize=False, batch_size=None))
        loss = lambda out, t: 0.5 * ((out[:, 0] - torch.as_tensor(t)) ** 2).mean()  # noqa: E731
    else:
        y = np.where(X[:, 0] > 0, "b", "a")
        est = LaplaceActiveSubspaceClassifier(_Recorder(2, 2), training=Training(standardize=False, batch_size=None))
        loss = lambda out, t: nn.functional.cross_entropy(out, torch.as_tensor(np.unique(t, return_inverse=True)[1]))  # noqa: E731,E501
    initial = copy.deepcopy(est.module)
    est.set_params(training__max_epochs=3, compute=Compute(dtype="float64"),
                   posterior=LowRank(max_components=3, n_samples=20), calibration_size=0.2, random_state=0).fit(X, y)
    train, cal = est.train_indices_, est.calibration_indices_
    # disjoint, together every row of X once
    assert len(set(train) & set(cal)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, cal])), np.arange(n))
    assert len(cal) == math.ceil(0.2 * n) and est.n_calibration_rows_ <= len(cal) and est.n_records_ == len(train)
    # the network saw, in training mode, the rows of X[train_indices_] and no other (one network: from a module
    # instance n_networks="auto" trains one; tests/test_ensemble.py checks the members of an ensemble)
    nets = getattr(est.module_, "members", [est.module_])
    assert len(nets) == 1
    seen = nets[0].seen
    assert len(seen) == 3 and all(s.shape == (len(train), 2) for s in seen)  # full batch, 3 epochs
    for net in nets:
        assert 1 <= len(net.seen) <= 3 and all(s.shape == (len(train), 2) for s in net.seen)
        assert _rows(torch.cat(net.seen).numpy()) == _rows(X[train])
    assert not _rows(X[train]) & _rows(X[cal])
    # the first epoch's loss is the initial network's loss on the training rows (not on all rows)
    with torch.no_grad():
        expected = float(loss(initial.body(torch.as_tensor(X[train])), y[train]))
        on_all = float(loss(initial.body(torch.as_tensor(X)), y))
    assert est.training_loss_[0] == pytest.approx(expected, rel=1e-12)
    assert est.training_loss_[0] != pytest.approx(on_all, rel=1e-6)
    if task == "classification":  # stratified: both classes on both sides
        assert set(y[cal]) == set(y[train]) == {"a", "b"}
    # with X_cal given, every row of X is a training row
    X_cal, y_cal = X[:15] + 5.0, y[:15]
    est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert est.train_indices_ is None and est.calibration_indices_ is None and est.n_records_ == n


# ------------------------------------------------------------------------------- cross-validation
def _prefit_setup(seed: int):
    rng = np.random.default_rng(seed)
    X, y = _draw(60, rng)
    X_cal, y_cal = _draw(25, rng)  # a length other than X's: passed whole to every fold
    X_new, y_new = _draw(30, rng)
    return _overfitting_net(X, y, seed=seed), (X, y), (X_cal, y_cal), (X_new, y_new)


def test_grid_search_over_a_prefit_network_warns_of_leakage():
    net, (X, y), (X_cal, y_cal), (X_new, y_new) = _prefit_setup(3)
    est = LaplaceActiveSubspaceRegressor(net, prefit=True, random_state=0, posterior=LowRank(max_components=3),
                                         compute=Compute(dtype="float64"))
    search = GridSearchCV(est, {"scaling": ["mean", "standard"]}, cv=3, error_score="raise")
    with pytest.warns(PrefitLeakageWarning, match=r"score: 20 of the 20 rows were declared as training rows.*"
                                                  r"cross-validated \(GridSearchCV, cross_validate\)"):
        search.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    # rows the network never saw raise nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrefitLeakageWarning)
        search.best_estimator_.predict_interval(X_new)
        search.best_estimator_.score(X_new, y_new)
        search.best_estimator_.coverage_curve(X_new, y_new, d_max=2)
    with pytest.warns(PrefitLeakageWarning, match=r"coverage_curve: 5 of the 35 rows"):
        search.best_estimator_.coverage_curve(np.vstack([X_new, X[:5]]), np.concatenate([y_new, y[:5]]), d_max=2)


def test_cross_validate_of_a_prefit_network_with_an_interval_scorer_warns_of_leakage():
    net, (X, y), (X_cal, y_cal), _ = _prefit_setup(4)
    est = LaplaceActiveSubspaceRegressor(net, prefit=True, random_state=0, posterior=LowRank(max_components=3),
                                         compute=Compute(dtype="float64"))
    with pytest.warns(PrefitLeakageWarning, match=r"predict_interval: 15 of the 15 rows"):
        cross_validate(est, X, y, cv=4, params=dict(X_cal=X_cal, y_cal=y_cal), error_score="raise",
                       scoring=make_interval_scorer("interval_score", confidence_level=LEVEL))


def test_prefit_classifier_probabilities_and_sets_on_its_training_rows_warn():
    rng = np.random.default_rng(5)
    X, X_cal, X_new = rng.standard_normal((40, 2)), rng.standard_normal((20, 2)), rng.standard_normal((10, 2))
    label, label_cal = (X[:, 0] > 0).astype(int), (X_cal[:, 0] > 0).astype(int)
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    est = LaplaceActiveSubspaceClassifier(net, prefit=True, random_state=0, posterior=LowRank(max_components=3),
                                          compute=Compute(dtype="float64"))
    est.fit(X, label, X_cal=X_cal, y_cal=label_cal)
    for method in (est.predict_proba, est.predict_set, lambda Z: est.score(Z, (Z[:, 0] > 0).astype(int))):
        with pytest.warns(PrefitLeakageWarning, match="3 of the 13 rows"):
            method(np.vstack([X_new, X[:3]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrefitLeakageWarning)
        est.predict(X)  # point predictions on the training rows are not an evaluation of the uncertainty
        est.predict_proba(X_new)


# ------------------------------------------------------------------------------------- the registry
def test_row_digests_and_fingerprints_identify_rows_and_weights():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 3))
    d = row_digests(X)
    assert d.dtype == np.uint64 and len(np.unique(d)) == 50
    np.testing.assert_array_equal(row_digests(X[::-1].copy()), d[::-1])  # a row's digest is its own
    np.testing.assert_array_equal(row_digests(np.asfortranarray(X)), d)
    Y = X.copy()
    Y[7, 2] = np.nextafter(Y[7, 2], np.inf)  # one bit of one value
    assert (row_digests(Y) != d).tolist() == [i == 7 for i in range(50)]
    images = rng.integers(0, 9, size=(6, 1, 3, 3))
    assert len(np.unique(row_digests(images))) == len(_rows(images))

    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    before = snapshot(net)
    fp = module_fingerprint(net)
    assert_unchanged(net, before)
    assert module_fingerprint(copy.deepcopy(net)) == fp  # the weights, not the object
    nudged, moved = copy.deepcopy(net), copy.deepcopy(net)
    with torch.no_grad():
        nudged[2].bias.add_(1e-6)
        moved[1].running_mean.add_(1.0)  # a buffer is part of the network's state
    assert module_fingerprint(nudged) != fp and module_fingerprint(moved) != fp


def test_registry_is_bounded_and_keeps_a_uniform_sample():
    reg = PrefitRowRegistry(max_networks=2, max_rows=5)
    digests = np.arange(100, 110, dtype=np.uint64)
    reg.declare(b"a", digests)
    np.testing.assert_array_equal(reg.declared(b"a", digests), np.arange(10) < 5)  # the 5 smallest are kept
    reg.declare(b"b", digests[:2])
    reg.declared(b"a", digests[:1])  # a used more recently than b
    reg.declare(b"c", digests[:2])
    assert len(reg) == 2 and not reg.declared(b"b", digests[:2]).any() and reg.declared(b"c", digests[:2]).all()
    assert not reg.declared(b"unknown", digests).any()
    reg.clear()
    assert len(reg) == 0


def test_repeated_rows_in_the_data_are_not_taken_for_reuse():
    # A data set in which 10 % of the rows occur twice (as UCI concrete holds repeated rows): unseen rows drawn
    # from it equal training rows about that often, which is no leakage; the network's own rows still are.
    rng = np.random.default_rng(0)
    base = rng.normal(size=(400, 3))
    data = np.concatenate([base, base[:40]])[rng.permutation(440)]
    digests = row_digests(data)
    train, unseen = digests[:340], digests[340:]
    reg = PrefitRowRegistry()
    reg.declare(b"net", train)
    shared = int(reg.declared(b"net", unseen).sum())
    assert shared > 0  # some genuinely unseen rows equal training rows
    assert reg.reused(b"net", unseen) == 0
    assert reg.reused(b"net", train[:100]) == 100  # the network's own rows
    leak = np.concatenate([unseen[:70], train[:30]])  # 30 % of the rows were training rows
    assert reg.reused(b"net", leak) >= 30
    # without repeats in the data, two reused rows are enough
    clean = PrefitRowRegistry()
    clean.declare(b"net", row_digests(base[:300]))
    fresh = row_digests(base[300:])
    assert clean.reused(b"net", fresh) == 0
    assert clean.reused(b"net", np.concatenate([fresh[:98], row_digests(base[:2])])) == 2
    assert clean.reused(b"net", np.concatenate([fresh[:99], row_digests(base[:1])])) == 0
