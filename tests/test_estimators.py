"""Behaviour of the two estimators against independent references: the user's module, the network's own
outputs, hand-computed noise levels and β, shapes, randomness, and the errors users meet."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from sklearn.exceptions import NotFittedError
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import CalibrationWarning, MondrianConformalCalibrator
from tests.reference import assert_unchanged, full_name, grouped, mlp, snapshot

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

# The tests of the paper's method pass its settings explicitly (the defaults are the low-rank posterior with
# conformal calibration, tested in their own section below).
PAPER = dict(calibration="coverage", posterior="subspace")
SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30, lr=0.05, batch_size=None,
             early_stopping=False, n_samples=50, max_components=3, dtype="float64", random_state=0, **PAPER)


@pytest.fixture(autouse=True)
def _quiet_calibration():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # tiny networks rarely reach the level
        yield


def _data(n=50, n_features=3, n_outputs=None, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, n_features))
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    if n_outputs is None:
        return X, 3.0 * f + 10 + 0.3 * rng.standard_normal(n)  # units far from standardised ones
    cols = [(j + 1) * f + j + 0.2 * rng.standard_normal(n) for j in range(n_outputs)]
    return X, np.column_stack(cols)


def _labels(n=60, seed=0, names=("cat", "dog", "emu")):
    rng = np.random.default_rng(seed)
    centres = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])[: len(names)]
    codes = rng.integers(0, len(names), n)
    X = centres[codes] + 0.4 * rng.standard_normal((n, 2))
    return X, np.array(names, dtype=object)[codes]


def _unseen(n=20, seed=7, **kwargs) -> dict:
    """Calibration rows a prefit network was not trained on, as fit's X_cal / y_cal (prefit needs them)."""
    X_cal, y_cal = _data(n=n, seed=seed, **kwargs)
    return dict(X_cal=X_cal, y_cal=y_cal)


def _reg(**params):
    return LaplaceActiveSubspaceRegressor(**grouped(**{**SMALL, **params}))


def _clf(**params):
    return LaplaceActiveSubspaceClassifier(**grouped(**{**SMALL, **params}))


def _standardised(A, ref):
    return (A - ref.mean(axis=0)) / ref.std(axis=0)


def _sets_decided(proba, levels, tol):
    """Rows whose prediction sets cannot change when every probability moves by at most ``tol``.

    Sorted probabilities move by at most tol each, so the mass before rank r by at most C·tol: a row qualifies
    when every such mass is more than C·tol from each level (the set size is fixed) and the last class in the
    set leads the first one left out by more than 2·tol (its members are fixed).
    """
    p = -np.sort(-proba, axis=1)
    n, C = p.shape
    before = np.cumsum(p, axis=1) - p
    ok = np.ones(n, dtype=bool)
    for level in np.atleast_1d(levels):
        ok &= np.abs(before - level).min(axis=1) > C * tol
        size = (before < level).sum(axis=1)
        gap = p[np.arange(n), size - 1] - p[np.arange(n), np.minimum(size, C - 1)]
        ok &= (size == C) | (gap > 2 * tol)
    return ok


def _assert_same_sets_where_decided(sets, ref_sets, ref_proba, levels, tol=1e-12):
    """Prediction sets of two computational paths whose probabilities agree to ``tol`` (asserted by the caller):
    equal on every row whose sets that tolerance cannot flip, and those must be most rows."""
    decided = _sets_decided(ref_proba, levels, tol)
    assert decided.mean() >= 0.9, f"only {decided.sum()} of {len(decided)} rows are away from the thresholds"
    np.testing.assert_array_equal(sets[decided], ref_sets[decided])


# ------------------------------------------------------------------------------------------ prefit


class _NetWithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Dropout(0.3), nn.Linear(6, 1))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        return self.body(x)


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitLeakageWarning")  # its own rows, for the mechanics
@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_prefit_module_is_bit_identical_after_fit_and_predict(predictive):
    net = _NetWithDropout().double().train()  # train mode, a frozen bias and a stale gradient: all kept
    net.body[0].bias.requires_grad_(False)
    net.body[3].weight.grad = torch.full_like(net.body[3].weight, 0.25)
    before = snapshot(net)
    X, y = _data()
    est = _reg(module=net, prefit=True, predictive=predictive).fit(X, y, **_unseen())
    est.predict(X)
    est.predict_interval(X, confidence_level=[0.5, 0.9])
    est.sample_y(X, 4)
    assert_unchanged(net, before)
    assert est.module_ is net
    D = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert est.posterior_.n_weights == D  # the frozen bias is not part of the posterior


def test_prefit_linearized_predict_is_the_modules_own_output():
    net = mlp(n_in=3, hidden=5, n_out=1, seed=1)
    X, y = _data()
    est = _reg(module=net, prefit=True, predictive="linearized").fit(X, y, **_unseen())
    with torch.no_grad():
        expected = net(torch.as_tensor(X)).numpy()[:, 0]  # prefit: the user's units, no standardisation
    np.testing.assert_allclose(est.predict(X), expected, rtol=1e-13, atol=1e-13)


def test_prefit_false_does_not_train_the_users_instance():
    net = mlp(n_in=3, hidden=5, n_out=1, seed=2)
    before = snapshot(net)
    X, y = _data()
    est = _reg(module=net).fit(X, y)
    assert_unchanged(net, before)
    assert est.module_ is not net
    trained = dict(est.module_.named_parameters())
    assert any(not torch.equal(p, trained[n]) for n, p in net.named_parameters())


def test_prefit_needs_a_module_and_matching_dtype():
    X, y = _data()
    with pytest.raises(ValueError, match="prefit=True needs module"):
        _reg(prefit=True).fit(X, y)
    with pytest.raises(ValueError, match="dtype"):
        _reg(module=mlp(n_in=3, seed=0), prefit=True, dtype="float32").fit(X, y)


# ------------------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_regressor_shapes_single_output(predictive):
    X, y = _data()
    est = _reg(predictive=predictive).fit(X, y)
    y_pred, y_pis = est.predict_interval(X[:7])
    assert y_pred.shape == (7,) and y_pis.shape == (7, 2, 1)  # a float level keeps its level axis
    y_pred, y_pis = est.predict_interval(X[:7], confidence_level=0.8)
    assert y_pis.shape == (7, 2, 1)
    y_pred, y_pis = est.predict_interval(X[:7], confidence_level=[0.5, 0.8, 0.95])
    assert y_pis.shape == (7, 2, 3)
    mean, std = est.predict(X[:7], return_std=True)
    assert mean.shape == std.shape == (7,) and np.all(std >= 0)
    assert est.sample_y(X[:7], n_samples=4).shape == (7, 4)
    assert est.sample_y(X[:7]).shape == (7, 1)


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_regressor_shapes_multi_output(predictive):
    X, Y = _data(n_outputs=2)
    est = _reg(predictive=predictive).fit(X, Y)
    assert est.predict(X[:7]).shape == (7, 2)
    mean, std = est.predict(X[:7], return_std=True)
    assert mean.shape == std.shape == (7, 2)
    y_pred, y_pis = est.predict_interval(X[:7], confidence_level=[0.5, 0.9])
    assert y_pred.shape == (7, 2) and y_pis.shape == (7, 2, 2, 2)  # (n, M, 2, k)
    assert est.sample_y(X[:7], n_samples=3).shape == (7, 2, 3)
    assert np.shape(est.noise_std_) == (2,)
    # a (n, 1) target stays two-dimensional
    est1 = _reg(predictive=predictive).fit(X, Y[:, :1])
    assert est1.predict(X[:7]).shape == (7, 1)
    assert est1.predict_interval(X[:7])[1].shape == (7, 1, 2, 1)


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_intervals_are_nested_across_levels(predictive):
    X, y = _data()
    est = _reg(predictive=predictive).fit(X, y)
    y_pred, y_pis = est.predict_interval(X, confidence_level=[0.5, 0.8, 0.95])
    lower, upper = y_pis[:, 0, :], y_pis[:, 1, :]
    assert np.all(np.diff(lower, axis=1) <= 0) and np.all(np.diff(upper, axis=1) >= 0)
    assert np.all(lower[:, 0] < upper[:, 0])
    if predictive == "linearized":  # symmetric about f(x; θ0): mean ± z σ_f
        np.testing.assert_allclose((lower + upper) / 2, np.repeat(y_pred[:, None], 3, 1), atol=1e-10)
        _, std = est.predict(X, return_std=True)
        z = np.array([0.6744897501960817, 1.2815515655446004, 1.959963984540054])
        np.testing.assert_allclose((upper - lower) / 2, std[:, None] * z, rtol=1e-10)


def test_linearized_predict_is_the_trained_networks_output():
    X, y = _data(n=40)
    X_cal, y_cal = _data(n=20, seed=1)
    est = _reg(predictive="linearized").fit(X, y, X_cal=X_cal, y_cal=y_cal)  # training rows: all of X
    Xs = torch.as_tensor(_standardised(X_cal, X))
    with torch.no_grad():
        out = est.module_(Xs).numpy()[:, 0]
    expected = out * y.std() + y.mean()
    np.testing.assert_allclose(est.predict(X_cal), expected, rtol=1e-12)


def test_sampled_predictive_collapses_to_the_network_as_the_prior_vanishes():
    X, y = _data(n=40)
    X_cal, y_cal = _data(n=20, seed=1)
    est = _reg(sigma0=1e-9, n_components=2).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    with torch.no_grad():
        out = est.module_(torch.as_tensor(_standardised(X_cal, X))).numpy()[:, 0]
    np.testing.assert_allclose(est.predict(X_cal), out * y.std() + y.mean(), atol=1e-6)
    _, y_pis = est.predict_interval(X_cal)
    assert np.all(y_pis[:, 1, 0] - y_pis[:, 0, 0] < 1e-6)


# ------------------------------------------------------------------------------------- classifier


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_classifier_string_labels_proba_and_sets(predictive):
    X, y = _labels()
    est = _clf(predictive=predictive, max_epochs=60).fit(X, y)
    assert est.classes_.tolist() == ["cat", "dog", "emu"]
    proba = est.predict_proba(X)
    assert proba.shape == (60, 3) and np.all(proba >= 0)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    labels = est.predict(X)
    assert labels.dtype == object and set(labels) <= set(est.classes_)
    np.testing.assert_array_equal(labels, est.classes_[proba.argmax(axis=1)])
    # columns in classes_ order: the network has learnt the (well separated) labels
    assert np.mean(labels == y) >= 0.9
    set_labels, sets = est.predict_set(X, confidence_level=[0.5, 0.9, 0.999])
    assert sets.shape == (60, 3, 3) and sets.dtype == bool
    # predict_set's labels are the argmax of the probabilities before predict_proba's float64 renormalisation:
    # equal wherever the top two probabilities are not within round-off of each other (nearly every row)
    top2 = -np.sort(-proba, axis=1)[:, :2]
    clear = top2[:, 0] - top2[:, 1] > 1e-12
    assert clear.mean() >= 0.9
    np.testing.assert_array_equal(set_labels[clear], labels[clear])
    top = proba.argmax(axis=1)
    assert np.all(sets[np.arange(60), top, :])  # a set always holds the most probable class
    assert np.all(sets[:, :, :-1] <= sets[:, :, 1:])  # nested across levels
    # each set is the smallest one reaching the level: its mass without its least probable member is short
    for i in range(60):
        for j, level in enumerate([0.5, 0.9, 0.999]):
            members = proba[i, sets[i, :, j]]
            assert members.sum() >= level - 1e-12 or sets[i, :, j].all()
            assert members.sum() - members.min() < level
    assert est.predict_set(X[:4])[1].shape == (4, 3, 1)


def test_classifier_beta_for_both_scalings():
    X, y = _labels()
    X_cal, y_cal = _labels(n=15, seed=1)
    assert _clf().fit(X, y, X_cal=X_cal, y_cal=y_cal).beta_ == 1.0
    assert _clf(scaling="standard").fit(X, y, X_cal=X_cal, y_cal=y_cal).beta_ == 60.0  # N training rows


def test_classifier_unseen_calibration_labels_are_named():
    X, y = _labels(names=("cat", "dog"))
    X_cal, y_cal = _labels(n=10, seed=1, names=("cat", "emu"))
    with pytest.raises(ValueError, match=r"y_cal contains labels not seen during fit: 'emu'"):
        _clf().fit(X, y, X_cal=X_cal, y_cal=y_cal)
    with pytest.raises(ValueError, match="not seen during fit: 1, 2"):  # numbers against string classes
        _clf().fit(X, y, X_cal=X_cal, y_cal=np.array([1, 2] * 5))


def test_classifier_many_classes_few_rows_splits_without_stratification_error():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 2))
    y = np.repeat(np.array(["a", "b", "c", "d"]), 3)
    est = _clf().fit(X, y)  # 10 % held out is 2 rows: fewer than the 4 classes, so no stratification
    assert est.predict_proba(X).shape == (12, 4)
    assert est.n_calibration_rows_ == 2


# -------------------------------------------------------------------------------------- randomness


def _all_outputs(est, X):
    if isinstance(est, LaplaceActiveSubspaceRegressor):
        return [est.predict(X, return_std=True)[1], est.predict_interval(X, [0.5, 0.9])[1], est.eigenvalues_]
    return [est.predict_proba(X), est.predict_set(X)[1], est.eigenvalues_]


@pytest.mark.parametrize("make", [_reg, _clf])
def test_randomness_comes_from_random_state_only(make):
    X, y = _data() if make is _reg else _labels()
    torch.manual_seed(1)
    np.random.seed(1)
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    first = _all_outputs(make(random_state=5).fit(X, y), X)
    # the global generators are neither used nor moved by fit and predict
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.random.get_state()[1].tolist() == np_state[1].tolist()
    torch.manual_seed(2)
    np.random.seed(2)
    second = _all_outputs(make(random_state=5).fit(X, y), X)
    for a, b in zip(first, second, strict=True):  # the same computation replayed with the same seed: bit for bit
        np.testing.assert_array_equal(a, b)
    other = _all_outputs(make(random_state=6).fit(X, y), X)
    assert not np.array_equal(first[0], other[0])


def test_dropout_during_training_is_seeded_by_random_state():
    X, y = _data()

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 1)).double()

    first, second = net(), net()
    torch.manual_seed(10)
    a = _reg(module=first).fit(X, y)
    torch.manual_seed(11)
    b = _reg(module=second).fit(X, y)
    # the same computation replayed (only the global seed differs, which fit must not read): bit for bit
    assert a.training_loss_ == b.training_loss_
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


@pytest.mark.parametrize("make", [_reg, _clf])
def test_predictions_do_not_depend_on_row_order_or_batch(make):
    X, y = _data() if make is _reg else _labels()
    est = make().fit(X, y)
    perm = np.random.default_rng(0).permutation(len(X))
    full = _all_outputs(est, X)
    # Other rows in the same matrix products: float64 round-off only (hence 1e-12). Prediction sets are
    # compared on the rows that round-off cannot flip (the probabilities agree to 1e-12 first).
    for rows in (perm, np.arange(5, 9)):
        for whole, part in zip(full, _all_outputs(est, X[rows]), strict=True):
            if whole.shape[:1] != (len(X),):
                continue
            if whole.dtype == bool:
                _assert_same_sets_where_decided(part, whole[rows], est.predict_proba(X)[rows], est.confidence_level)
            else:
                np.testing.assert_allclose(part, whole[rows], rtol=1e-12, atol=1e-12)


def test_prefit_fit_does_not_depend_on_training_row_order():
    net = mlp(n_in=3, hidden=5, n_out=1, seed=4)
    X, y = _data()
    X_cal, y_cal = _data(n=20, seed=1)
    perm = np.random.default_rng(1).permutation(len(X))
    a = _reg(module=net, prefit=True, predictive="linearized").fit(X, y, X_cal=X_cal, y_cal=y_cal)
    b = _reg(module=net, prefit=True, predictive="linearized").fit(X[perm], y[perm], X_cal=X_cal, y_cal=y_cal)
    np.testing.assert_allclose(b.eigenvalues_, a.eigenvalues_, rtol=1e-9)
    np.testing.assert_allclose(b.predict_interval(X_cal)[1], a.predict_interval(X_cal)[1], rtol=1e-7)


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_calibration_table_matches_predictions_on_the_calibration_rows(predictive):
    X, y = _data()
    X_cal, y_cal = _data(n=30, seed=1)
    est = _reg(predictive=predictive).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    _, y_pis = est.predict_interval(X_cal, confidence_level=0.9)
    coverage = np.mean((y_pis[:, 0, 0] <= y_cal) & (y_cal <= y_pis[:, 1, 0]))
    row = est.calibration_.set_index("d").loc[est.n_components_]
    assert coverage == pytest.approx(row["coverage"], abs=1e-12)
    width = np.mean(y_pis[:, 1, 0] - y_pis[:, 0, 0])  # calibration_ widths: in the units of y
    assert width == pytest.approx(row["mean_width"], rel=1e-9)
    assert est.n_calibration_rows_ == 30


# ---------------------------------------------------------------------------- hyperparameters, noise


def test_n_components_int_is_respected():
    X, y = _data()
    est = _reg(n_components=2, max_components=10).fit(X, y)
    assert est.n_components_ == 2 and len(est.eigenvalues_) == 2
    assert est.calibration_["d"].tolist() == [2] and est.calibration_reached_ is None
    assert est.sigma0_ == pytest.approx(est.calibration_["sigma0"].iloc[0])


def test_too_many_components_are_refused_or_capped():
    net = mlp(n_in=3, hidden=2, n_out=1, seed=0)  # D = 8 + 6 + 3 = 17
    X, y = _data()
    D = 17
    # K < D is checked once, by the eigen layer (or fit_laplace_subspace); its message names K and D
    for K in (D, D + 5):
        with pytest.raises(ValueError, match=rf"={K} eigenpairs requested.*D={D}"):
            _reg(module=net, prefit=True, n_components=K).fit(X, y, **_unseen())
    est = _reg(module=net, prefit=True, max_components=40).fit(X, y, **_unseen())  # "auto": capped at D − 1
    assert len(est.eigenvalues_) <= D - 1
    capped = _reg(module=net, prefit=True, max_components=16, n_components="auto").fit(X, y, **_unseen())
    assert len(capped.eigenvalues_) == 16


def test_subsample_larger_than_the_training_rows_is_refused_at_fit():
    X, y = _data(n=40)  # 36 training rows after the 10 % calibration split
    with pytest.raises(ValueError, match=r"subsample=37 is larger than the 36 rows"):
        _reg(subsample=37).fit(X, y)
    assert _reg(subsample=36).fit(X, y).n_records_ == 36


def test_prefit_module_without_trainable_weights_is_refused_at_fit():
    net = mlp(n_in=3, hidden=2, n_out=1, seed=0).requires_grad_(False)
    X, y = _data()
    with pytest.raises(ValueError, match="no trainable parameters"):
        _reg(module=net, prefit=True).fit(X, y, **_unseen())


@pytest.mark.parametrize("param,value", [
    ("scaling", "foo"), ("scaling", -1.0), ("n_components", 0), ("n_components", 2.5), ("max_components", 0),
    ("confidence_level", 1.5), ("confidence_level", [0.5, 0.0]), ("predictive", "x"), ("sigma0", "big"),
    ("n_samples", 1), ("calibration_size", 1.5), ("noise_std", -0.1), ("noise_std", "residuals"),
    ("dtype", "float16"), ("eigen_method", "qr"), ("optimizer", "lbfgs"), ("prefit", "yes"),
    ("random_state", "seed"), ("batch_size", 0), ("max_epochs", -1), ("lr", 0.0), ("module_kwargs", [1]),
])
def test_bad_hyperparameters_raise_at_fit_naming_the_parameter(param, value):
    X, y = _data()
    est = _reg(**{param: value})  # __init__ stores, never checks
    assert est.get_params()[full_name(param)] is value
    with pytest.raises(ValueError, match=re.escape(param)):
        est.fit(X, y)


# Every constraint of the table, each with a value it refuses: (parameter, value, words of what is allowed).
BAD_VALUES = [
    ("module_kwargs", (1,), "None or a dict"), ("prefit", 1, "True or False"), ("scaling", 0.0, "'mean', 'standard'"),
    ("scaling", float("nan"), "> 0"), ("n_components", True, "'auto' or an int >= 1"),
    ("max_components", 2.0, "an int >= 1"),
    ("sigma0", -1.0, "'auto', 'eb_subspace', 'eb_full', 'nll' or a finite float > 0"),
    ("sigma0", float("inf"), "> 0"), ("predictive", "Sampled", "'sampled' or 'linearized'"),
    ("n_samples", np.int64(1), "an int >= 2"), ("confidence_level", [], "strictly between 0 and 1"),
    ("confidence_level", "0.9", "strictly between 0 and 1"), ("calibration_size", 0, "(0, 1) or an int >= 1"),
    ("calibration_size", 1.0, "(0, 1) or an int >= 1"), ("max_epochs", 1.5, "an int >= 0"),
    ("lr", float("inf"), "a finite float > 0"), ("batch_size", 16.0, "None, 'auto' or an int >= 1"),
    ("weight_decay", -1e-4, "'auto', 'cv' or a finite float >= 0"),
    ("optimizer", dict, "a torch.optim.Optimizer subclass"),
    ("optimizer", torch.optim.Adam([torch.zeros(1, requires_grad=True)]), "'adam', 'adamw', 'sgd'"),
    ("standardize", None, "True or False"), ("subsample", 0, "None, 'auto' or an int >= 1"),
    ("eigen_method", None, "'lanczos' or 'eigsh'"), ("dtype", torch.float64, "'float32' or 'float64'"),
    ("random_state", -1, "an int in [0, 4294967296)"), ("random_state", 2**32, "numpy.random.RandomState"),
    ("random_state", np.random.default_rng(0), "numpy.random.RandomState"), ("verbose", -1, "an int >= 0"),
    ("noise_std", 0.0, "'auto', 'calibration', 'training' or a finite float > 0"),
    ("include_noise", np.float64(1.0), "True or False"),
    ("posterior", "full", "'low_rank', 'low_rank_diag', 'subspace'"),
    ("calibration", "Conformal", "'conformal', 'coverage' or 'mondrian'"),
    ("early_stopping", "on", "'auto', 'shadow' or True or False"), ("validation_fraction", 1.0, "(0, 1)"),
    ("n_iter_no_change", 0, "an int >= 1"), ("tol", -1e-4, "a finite float >= 0"),
]


@pytest.mark.parametrize("param,value,allowed", BAD_VALUES, ids=lambda v: repr(v)[:30])
def test_constraint_table_refuses_each_bad_value_naming_parameter_value_and_allowed(param, value, allowed):
    X, y = _data(n=10)
    est = _reg(**{param: value})
    with pytest.raises(ValueError) as info:
        est.fit(X, y)
    msg = str(info.value)
    assert msg.startswith(f"LaplaceActiveSubspaceRegressor: {full_name(param)} must be ")
    assert allowed in msg and msg.endswith(f", got {value!r}.")


def test_classifier_checks_the_shared_constraints_and_has_no_regression_ones():
    X, y = _labels(n=10)
    with pytest.raises(ValueError,
                       match=r"^LaplaceActiveSubspaceClassifier: posterior__n_samples must be an int >= 2, got 1\.$"):
        _clf(n_samples=1).fit(X, y)
    assert "noise_std" not in LaplaceActiveSubspaceClassifier._parameter_constraints


@pytest.mark.parametrize("cls", [LaplaceActiveSubspaceRegressor, LaplaceActiveSubspaceClassifier])
def test_constraint_table_covers_every_constructor_parameter(cls):
    assert set(cls._parameter_constraints) == set(cls().get_params(deep=False))


def test_regressor_signature_repeats_the_shared_defaults():
    """The regressor declares every parameter explicitly (scikit-learn's rule); the shared ones keep the
    base's defaults and keyword-only kinds."""
    import inspect

    from glas_sklearn.estimators._base import LaplaceActiveSubspaceBase

    base = inspect.signature(LaplaceActiveSubspaceBase.__init__).parameters
    reg = inspect.signature(LaplaceActiveSubspaceRegressor.__init__).parameters
    assert set(reg) - set(base) == {"likelihood", "noise_std", "y_bounds"}
    for name, p in base.items():
        if name == "calibration":  # the regressor's own default: conformal within bands of σ̂ (the classifier's
            assert (reg[name].default, p.default) == ("mondrian", "conformal")  # "mondrian" is per class)
            continue
        assert (reg[name].default, reg[name].kind) == (p.default, p.kind), name


@pytest.mark.parametrize("param,value", [
    ("verbose", True), ("verbose", np.int64(0)), ("n_components", np.int32(2)), ("random_state", 2**32 - 1),
    ("random_state", np.random.RandomState(0)), ("optimizer", torch.optim.SGD), ("calibration_size", np.float32(0.2)),
    ("calibration_size", 4), ("lr", 1), ("standardize", np.bool_(False)), ("confidence_level", (0.5, 0.9)),
    ("scaling", 2), ("noise_std", 0.5), ("batch_size", None), ("max_epochs", 0), ("y_bounds", (0, None)),
    ("y_bounds", [None, None]),
])
def test_constraint_table_accepts_each_allowed_form(param, value):
    X, y = _data(n=20)
    est = _reg(**{param: value, "max_epochs": 3 if param != "max_epochs" else value}).fit(X, y)
    assert est.get_params()[full_name(param)] is value  # stored and used as given


def test_set_params_then_fit_validates_again():
    X, y = _data(n=20)
    est = _reg(max_epochs=3).fit(X, y)
    assert est.set_params(posterior__n_samples=1) is est  # set_params stores, never checks (as __init__)
    with pytest.raises(ValueError, match=r"posterior__n_samples must be an int >= 2, got 1\."):
        est.fit(X, y)
    est.set_params(posterior__n_samples=5, posterior__max_components="many")
    with pytest.raises(ValueError, match=r"posterior__max_components must be an int >= 1, got 'many'\."):
        est.fit(X, y)
    assert est.set_params(posterior__max_components=2).fit(X, y).get_params()["posterior__n_samples"] == 5


def test_default_network_follows_module_kwargs():
    X, y = _data()
    est = _reg(module_kwargs=dict(hidden_layer_sizes=(4, 3), activation="relu"), max_epochs=2).fit(X, y)
    layers = list(est.module_)
    assert [type(m) for m in layers] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert [(m.in_features, m.out_features) for m in layers[::2]] == [(3, 4), (4, 3), (3, 1)]
    clf = _clf(module_kwargs=None, max_epochs=2).fit(*_labels())  # None: two tanh layers of 50, 3 logits
    for member in clf.module_.members:  # n_networks="auto": three such networks on a small table
        assert [(m.in_features, m.out_features) for m in member[::2]] == [(2, 50), (50, 50), (50, 3)]
        assert isinstance(member[1], nn.Tanh)
    with pytest.raises(ValueError, match=r"activation must be one of \['gelu', 'relu', 'silu', 'tanh'\], got 'elu'"):
        _reg(module_kwargs=dict(activation="elu")).fit(X, y)


def test_diverging_training_is_reported():
    X, y = _data()
    with pytest.raises(FloatingPointError, match="LaplaceActiveSubspaceRegressor: the training loss diverged"):
        # a linear network: each epoch multiplies the loss by about 1e60, past float64's range within 20 epochs
        _reg(module_kwargs=dict(hidden_layer_sizes=()), optimizer="sgd", lr=1e30, max_epochs=20).fit(X, y)


def test_bad_classifier_hyperparameter_and_levels_at_predict():
    X, y = _labels()
    with pytest.raises(ValueError, match="predictive"):
        _clf(predictive="mc").fit(X, y)
    est = _clf().fit(X, y)
    with pytest.raises(ValueError, match="confidence_level"):
        est.predict_set(X, confidence_level=1.0)
    with pytest.raises(ValueError, match="confidence_level"):
        _reg().fit(*_data()).predict_interval(X[:, :1].repeat(3, 1), confidence_level=[0.9, 2])


def test_calibration_size_and_calibration_arguments():
    X, y = _data(n=20)
    with pytest.raises(ValueError, match="calibration_size=19"):
        _reg(calibration_size=19).fit(X, y)
    assert _reg(calibration_size=5).fit(X, y).n_calibration_rows_ == 5
    assert _reg(calibration_size=0.25).fit(X, y).n_calibration_rows_ == 5
    with pytest.raises(ValueError, match="X_cal and y_cal"):
        _reg().fit(X, y, X_cal=X)
    with pytest.raises(ValueError, match="y_cal"):
        _reg().fit(X, y, X_cal=X, y_cal=np.column_stack([y, y]))
    with pytest.raises(ValueError, match="at least 3 samples"):
        _reg().fit(X[:2], y[:2])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_in_X_raise(bad):
    X, y = _data()
    X_bad = X.copy()
    X_bad[3, 1] = bad
    for est in (_reg(), _clf()):
        target = y if isinstance(est, LaplaceActiveSubspaceRegressor) else np.where(y > 10, "hi", "lo")
        with pytest.raises(ValueError, match="NaN|infinity"):
            est.fit(X_bad, target)
        est.fit(X, target)
        with pytest.raises(ValueError, match="NaN|infinity"):
            est.predict(X_bad)
    with pytest.raises(ValueError, match="NaN|infinity"):
        _reg().fit(X, np.where(np.arange(len(y)) == 3, np.nan, y))


def test_wrong_feature_count_at_predict_uses_sklearns_message():
    X, y = _data()
    reg = _reg().fit(X, y)
    msg = "X has 2 features, but LaplaceActiveSubspaceRegressor is expecting 3 features as input."
    for method in (reg.predict, reg.predict_interval, reg.sample_y):
        with pytest.raises(ValueError, match=re.escape(msg)):
            method(X[:, :2])
    clf = _clf().fit(X, np.where(y > 10, "hi", "lo"))
    msg = "X has 4 features, but LaplaceActiveSubspaceClassifier is expecting 3 features as input."
    for method in (clf.predict, clf.predict_proba, clf.predict_set):
        with pytest.raises(ValueError, match=re.escape(msg)):
            method(np.column_stack([X, X[:, 0]]))


def test_unfitted_estimators_raise_not_fitted_error():
    X, _ = _data()
    for method in ("predict", "predict_interval", "sample_y"):
        with pytest.raises(NotFittedError):
            getattr(_reg(), method)(X)
    for method in ("predict", "predict_proba", "predict_set"):
        with pytest.raises(NotFittedError):
            getattr(_clf(), method)(X)


def _residual_rms(est, X_rows, y_rows, X_train):
    with torch.no_grad():
        out = est.module_(torch.as_tensor(_standardised(X_rows, X_train))).numpy()[:, 0]
    return math.sqrt(np.mean((y_rows - (out * est.y_scale_[0] + est.y_mean_[0])) ** 2))


def test_noise_std_options():
    X, y = _data(n=40)
    X_cal, y_cal = _data(n=20, seed=1)
    train = _reg(noise_std="training").fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert train.noise_std_ == pytest.approx(_residual_rms(train, X, y, X), rel=1e-10)  # training residuals
    assert train.noise_source_ == "training"
    assert train.beta_ == pytest.approx((y.std() / train.noise_std_) ** 2, rel=1e-10)  # mean: β = 1/σ² (standardised)
    cal = _reg(noise_std="calibration").fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert cal.noise_std_ == pytest.approx(_residual_rms(cal, X_cal, y_cal, X), rel=1e-10)
    assert cal.noise_source_ == "calibration"
    # "auto": training residuals with fewer than 30 calibration rows, held-out residuals from 30 on.
    auto_few = _reg(noise_std="auto").fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert auto_few.noise_source_ == "training" and auto_few.noise_std_ == train.noise_std_
    X_cal30, y_cal30 = _data(n=30, seed=2)
    auto_many = _reg(noise_std="auto").fit(X, y, X_cal=X_cal30, y_cal=y_cal30)
    assert auto_many.noise_source_ == "calibration"
    assert auto_many.noise_std_ == pytest.approx(_residual_rms(auto_many, X_cal30, y_cal30, X), rel=1e-10)
    given = _reg(noise_std=0.37).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert given.noise_std_ == 0.37 and given.noise_source_ == "given"  # returned as given
    assert given.beta_ == pytest.approx((y.std() / 0.37) ** 2, rel=1e-12)
    standard = _reg(noise_std=0.37, scaling="standard").fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert standard.beta_ == pytest.approx(40 * (y.std() / 0.37) ** 2, rel=1e-12)  # β = N/σ²
    assert _reg(scaling=123.0).fit(X, y, X_cal=X_cal, y_cal=y_cal).beta_ == 123.0


def test_sparse_input_gives_the_dense_results():
    X, y = _data()
    X[X < -0.5] = 0.0
    dense = _reg().fit(X, y)
    sparse = _reg().fit(sp.csr_matrix(X), y)
    # Bit for bit on purpose: sparse input is densified first (toarray() restores the same float64 values,
    # zeros included), and from there on both fits run the same computation with the same seed.
    np.testing.assert_array_equal(sparse.predict(sp.csr_matrix(X)), dense.predict(X))
    np.testing.assert_array_equal(dense.predict(sp.csc_matrix(X)), dense.predict(X))


def test_fitted_attributes():
    X, y = _data()
    est = _reg().fit(X, y)
    for name in ("module_", "n_components_", "sigma0_", "beta_", "noise_std_", "eigenvalues_", "calibration_",
                 "eigen_info_", "posterior_", "timings_", "n_features_in_", "training_loss_"):
        assert hasattr(est, name), name
    assert list(est.calibration_.columns) == ["d", "coverage", "mean_width", "sigma0"]
    assert np.all(np.diff(est.eigenvalues_) <= 0)
    assert len(est.training_loss_) == SMALL["max_epochs"]
    assert not hasattr(est, "feature_names_in_")


def test_float32_classifier_probabilities_sum_to_one():
    X, y = _labels()
    est = _clf(dtype="float32", max_epochs=20).fit(X, y)
    proba = est.predict_proba(X)
    assert proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_coverage_curve_extends_the_calibration_table(predictive):
    X, y = _data(n=60)
    X_cal, y_cal = _data(n=25, seed=1)
    est = _reg(predictive=predictive, max_components=3).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    curve = est.coverage_curve(X_cal, y_cal)
    assert curve["d"].tolist() == [1, 2, 3]
    chosen = est.calibration_
    pd.testing.assert_frame_equal(curve.iloc[: len(chosen)].reset_index(drop=True), chosen, check_exact=False,
                                  rtol=1e-12)
    # widths are in the units of y: equal to the mean width of predict_interval on the same rows at d = d_
    _, pis = est.predict_interval(X_cal)
    row = curve.loc[curve["d"] == est.n_components_].iloc[0]
    assert row["mean_width"] == pytest.approx(np.mean(pis[:, 1, 0] - pis[:, 0, 0]), rel=1e-9)
    assert row["coverage"] == pytest.approx(np.mean((y_cal >= pis[:, 0, 0]) & (y_cal <= pis[:, 1, 0])))


# ----------------------------------------------------------------------------- intervals for y


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_include_noise_intervals_are_for_y(predictive):
    """With include_noise the interval is that of f + N(0, σ²): Gaussian for the linearised predictive,
    the exact quantile of the mixture over posterior samples for the sampled one (checked by brentq)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    X, y = _data(n=60)
    f_only = _reg(predictive=predictive, n_components=2).fit(X, y)
    with_noise = _reg(predictive=predictive, n_components=2, include_noise=True).fit(X, y)
    assert with_noise.noise_std_ == f_only.noise_std_ and with_noise.n_components_ == 2
    sigma = with_noise.noise_std_
    mean_f, std_f = f_only.predict(X[:6], return_std=True)
    mean_y, std_y = with_noise.predict(X[:6], return_std=True)
    np.testing.assert_allclose(mean_y, mean_f, rtol=1e-12)
    np.testing.assert_allclose(std_y, np.sqrt(std_f**2 + sigma**2), rtol=1e-10)
    _, pis = with_noise.predict_interval(X[:6], confidence_level=[0.5, 0.9])
    if predictive == "linearized":
        for k, level in enumerate([0.5, 0.9]):
            lo, hi = norm.interval(level, loc=mean_f, scale=np.sqrt(std_f**2 + sigma**2))
            np.testing.assert_allclose(pis[:, 0, k], lo, rtol=1e-10)
            np.testing.assert_allclose(pis[:, 1, k], hi, rtol=1e-10)
    else:  # the network outputs at the estimator's own posterior samples, in the units of y
        est = with_noise
        Xt = torch.as_tensor((X[:6] - est.x_mean_) / est.x_scale_)
        f = est.posterior_.predict_samples(Xt, 2, est.posterior.n_samples, random_state=est._sample_seed_)
        f = f[..., 0].numpy() * est.y_scale_[0] + est.y_mean_[0]  # (S, 6)
        for i in range(6):
            for k, level in enumerate([0.5, 0.9]):
                for j, q in enumerate([(1 - level) / 2, (1 + level) / 2]):
                    ref = brentq(lambda t, i=i, q=q: norm.cdf((t - f[:, i]) / sigma).mean() - q, -100, 100,
                                 xtol=1e-13)
                    assert pis[i, j, k] == pytest.approx(ref, abs=1e-8)
    # the y-interval contains the f-interval, and the calibration table saw the noise too
    _, pis_f = f_only.predict_interval(X[:6], confidence_level=[0.5, 0.9])
    assert np.all(pis[:, 0] <= pis_f[:, 0] + 1e-12) and np.all(pis[:, 1] >= pis_f[:, 1] - 1e-12)
    assert with_noise.calibration_["mean_width"].iloc[0] > f_only.calibration_["mean_width"].iloc[0]


def test_include_noise_calibrates_and_covers_new_data():
    rng = np.random.default_rng(5)
    X = rng.uniform(-2, 2, size=(900, 1))
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.standard_normal(900)
    est = _reg(module_kwargs=dict(hidden_layer_sizes=(20,)), max_epochs=300, lr=0.01, batch_size=128,
               include_noise=True, n_samples=200, max_components=10, calibration_size=200)
    est.fit(X[:600], y[:600])
    assert est.noise_source_ == "calibration" and est.noise_std_ == pytest.approx(0.3, rel=0.2)
    assert est.calibration_reached_ and est.calibration_["coverage"].iloc[-1] >= 0.9 - 1e-9
    _, pis = est.predict_interval(X[600:])
    coverage = np.mean((y[600:] >= pis[:, 0, 0]) & (y[600:] <= pis[:, 1, 0]))
    assert 0.85 <= coverage <= 0.96  # 300 rows: the standard error of a 90 % coverage is 1.7 points
    # draws of y spread like f plus the noise
    draws = est.sample_y(X[600:603], n_samples=4000, random_state=1)
    _, std_y = est.predict(X[600:603], return_std=True)
    np.testing.assert_allclose(draws.std(axis=1), std_y, rtol=0.08)


def test_include_noise_multi_output_uses_each_outputs_noise():
    X, _ = _data(n=60)
    rng = np.random.default_rng(3)
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    Y = np.column_stack([f + 0.05 * rng.standard_normal(60), 2 * f + 1.0 * rng.standard_normal(60)])
    est = _reg(include_noise=True, noise_std="training", n_components=1, predictive="linearized",
               calibration_size=10).fit(X, Y)
    # per-output σ = RMS of each column's training residuals (the rows left after the calibration split)
    from sklearn.model_selection import train_test_split

    X_train, _, Y_train, _ = train_test_split(X, Y, test_size=10, random_state=est.calibration_seed_)
    with torch.no_grad():
        out = est.module_(torch.as_tensor((X_train - est.x_mean_) / est.x_scale_)).numpy()
    rms = np.sqrt(((Y_train - (out * est.y_scale_ + est.y_mean_)) ** 2).mean(0))
    np.testing.assert_allclose(est.noise_std_, rms, rtol=1e-10)
    assert est.noise_std_[1] > 3 * est.noise_std_[0]  # the columns' noise differs; one pooled σ would not
    mean, std = est.predict(X[:4], return_std=True)
    f_only = _reg(include_noise=False, noise_std="training", n_components=1, predictive="linearized",
                  calibration_size=10).fit(X, Y)
    _, std_f = f_only.predict(X[:4], return_std=True)
    np.testing.assert_allclose(std, np.sqrt(std_f**2 + est.noise_std_**2), rtol=1e-10)


def test_include_noise_must_be_bool():
    X, y = _data()
    with pytest.raises(ValueError, match="include_noise must be True or False"):
        _reg(include_noise="yes").fit(X, y)


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_predictions_in_row_chunks_equal_whole(predictive, monkeypatch):
    """Large X is predicted chunk by chunk (bounded memory); the weight samples are shared by all rows,
    so the chunks reproduce the one-pass results."""
    import glas_sklearn.estimators._base as base

    X, y = _data(n=60)
    Xl, yl = _labels(n=60)
    reg = _reg(predictive=predictive, include_noise=True).fit(X, y)
    clf = _clf(predictive=predictive).fit(Xl, yl)
    whole = (reg.predict(X, return_std=True), reg.predict_interval(X, [0.5, 0.9]), clf.predict_proba(Xl),
             clf.predict_set(Xl)[1])
    per_row = reg._predict_bytes_per_row(1)  # (60 rows: no activations counted)
    for est in (reg, clf):  # 7 rows per chunk (of one output)
        est.set_params(compute__working_memory=2 * 7 * per_row / 2**20)  # half the budget goes to the results
    calls = []
    original = base.LaplaceActiveSubspaceBase._predict_in_chunks
    monkeypatch.setattr(base.LaplaceActiveSubspaceBase, "_predict_in_chunks",
                        lambda self, Xt, *a, **k: calls.append(Xt.shape[0]) or original(self, Xt, *a, **k))
    chunked = (reg.predict(X, return_std=True), reg.predict_interval(X, [0.5, 0.9]), clf.predict_proba(Xl),
               clf.predict_set(Xl)[1])
    chunks = []
    reg._predict_in_chunks(torch.zeros(60, 3, dtype=reg.posterior_.dtype), 1, lambda rows: chunks.append(rows) or rows,
                           finite=lambda r: r)
    assert calls and len(chunks) == 9
    # Chunks are other matrix shapes: float64 round-off only, hence 1e-12 (not bit for bit).
    for a, b in zip(whole[:2], chunked[:2], strict=True):
        for u, v in zip(a, b, strict=True):
            np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(whole[2], chunked[2], rtol=1e-12, atol=1e-12)
    # the sets follow the probabilities exactly wherever 1e-12 cannot move a row across a threshold
    _assert_same_sets_where_decided(chunked[3], whole[3], whole[2], clf.confidence_level, tol=1e-12)


# ------------------------------------------------------------------- the defaults: low-rank + conformal

NEW = {k: v for k, v in SMALL.items() if k not in PAPER}


def _rank(n, level):
    return int(math.ceil((n + 1) * level - 1e-9))


def test_default_regressor_is_low_rank_conformal_with_hand_checked_intervals():
    X, y = _data(n=90)
    X_cal, y_cal = _data(n=30, seed=1)
    # the default is conformal within bands of σ̂ (30 calibration rows, the Gaussian: one band, its quantile
    # interpolated; bands by hand in tests/test_mondrian.py); with the rank rounded up: pooled split conformal
    default = LaplaceActiveSubspaceRegressor(**grouped(**NEW)).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert len(default.calibrator_.edges_[0]) == 0 and default.calibrator_.quantile_method == "interpolated"
    one_band = MondrianConformalCalibrator(min_bins=1, quantile_method="higher")
    est = LaplaceActiveSubspaceRegressor(**grouped(**NEW, confidence_level=[0.9, 0.5], calibration=one_band)).fit(
        X, y, X_cal=X_cal, y_cal=y_cal)
    assert est.posterior_.posterior == "low_rank" and est.posterior_.sigma0_method == "eb_subspace"
    assert est.predictive_.name == "linearized" and est.n_components_ == 3 and est.calibration_reached_ is None
    assert est.noise_source_ == "training"  # "auto" under conformal: the scores must not depend on the cal rows
    assert isinstance(est.calibrator_, MondrianConformalCalibrator) and len(est.calibrator_.edges_[0]) == 0
    assert list(est.calibration_.columns) == ["level", "d", "quantile", "coverage", "mean_width", "sigma0",
                                              "n_bins"]
    mean_c, std_c = est.predict(X_cal, return_std=True)
    std_c = std_c / est.std_scale_[0]  # return_std is calibrated: σ̂ times the RMS calibration score
    scores = np.abs(y_cal - mean_c) / std_c  # the normalised scores, by hand, in the units of y
    np.testing.assert_allclose(est.std_scale_, np.sqrt(np.mean(scores**2)), rtol=1e-10)
    np.testing.assert_allclose(est.conformity_scores_[:, 0], np.sort(scores), rtol=1e-10)
    q = {lev: np.sort(scores)[_rank(30, lev) - 1] for lev in (0.9, 0.5, 0.8)}
    y_pred, pis = est.predict_interval(X[:7], confidence_level=[0.9, 0.5, 0.8])  # 0.8 was not fitted
    mean, std = est.predict(X[:7], return_std=True)
    std = std / est.std_scale_[0]
    np.testing.assert_allclose(y_pred, mean, rtol=1e-12)
    for k, lev in enumerate((0.9, 0.5, 0.8)):
        np.testing.assert_allclose(pis[:, 0, k], mean - q[lev] * std, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(pis[:, 1, k], mean + q[lev] * std, rtol=1e-9, atol=1e-9)
    # on the calibration rows themselves the coverage is ⌈(n+1)(1−γ)⌉ / n ≥ 1 − γ (distinct scores)
    _, pis_c = est.predict_interval(X_cal)
    inside = (y_cal >= pis_c[:, 0, :].T) & (y_cal <= pis_c[:, 1, :].T)
    np.testing.assert_allclose(inside.mean(1), [_rank(30, 0.9) / 30, _rank(30, 0.5) / 30])
    np.testing.assert_allclose(est.calibration_["coverage"], inside.mean(1))
    # σ̂ is the linearised posterior's, σ_f (include_noise=False), in the units of y
    Xt = torch.as_tensor((X[:7] - est.x_mean_) / est.x_scale_)
    var = est.posterior_.linearized_variance(Xt, 3)[:, 0].numpy()
    np.testing.assert_allclose(std, np.sqrt(var) * est.y_scale_[0], rtol=1e-10)


def test_conformal_include_noise_multi_output_and_small_calibration_sets():
    from glas_sklearn.calibration import ConformalWarning

    X, Y = _data(n=80, n_outputs=2)
    est = LaplaceActiveSubspaceRegressor(**grouped(**NEW, include_noise=True)).fit(X, Y)
    assert est.n_calibration_rows_ == 9 and est.conformity_scores_.shape == (9, 2)  # raised from 8 = ⌈0.1 · 80⌉
    f_only = LaplaceActiveSubspaceRegressor(**grouped(**NEW)).fit(X, Y)
    _, std_f = f_only.predict(X[:5], return_std=True)
    mean, std = est.predict(X[:5], return_std=True)
    std, std_f = std / est.std_scale_, std_f / f_only.std_scale_  # the conformal normalisations σ̂
    # σ̂² = σ² + λ min(σ_f², m) + max(λ, 1) (σ_f² − m)₊: the epistemic weight λ fitted per output on the calibration
    # rows, m their median σ_f² (internal units: scaled by y_scale_² here)
    lam, cap = est.calibrator_.epistemic_weight_, est.calibrator_.epistemic_cap_ * est.y_scale_**2
    v = std_f**2
    expected = est.noise_std_**2 + lam * np.minimum(v, cap) + np.maximum(lam, 1) * np.maximum(v - cap, 0)
    np.testing.assert_allclose(std, np.sqrt(expected), rtol=1e-10)
    q = est.conformity_scores_[_rank(9, 0.9) - 1]  # one quantile per output
    _, pis = est.predict_interval(X[:5])
    np.testing.assert_allclose(pis[:, :, 1, 0] - pis[:, :, 0, 0], 2 * q * std, rtol=1e-9)
    # too few calibration rows for the level: infinite intervals, with a warning
    with pytest.warns(ConformalWarning, match="too few"):
        tiny = LaplaceActiveSubspaceRegressor(**grouped(**NEW)).fit(X[:60], Y[:60], X_cal=X[60:65], y_cal=Y[60:65])
    with pytest.warns(ConformalWarning):
        _, pis = tiny.predict_interval(X[:3], confidence_level=[0.5, 0.9])
    assert np.isfinite(pis[..., 0]).all() and np.isinf(pis[..., 1]).all()
    with pytest.warns(UserWarning, match="only approximate"):
        LaplaceActiveSubspaceRegressor(**grouped(**NEW, noise_std="calibration")).fit(X, Y)


def test_too_few_calibration_rows_are_warned_about_once_and_before_training():
    from glas_sklearn.calibration import ConformalWarning

    class Untrainable(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 1)

        def forward(self, x):  # probed in eval mode for its output shape; training raises
            if self.training:
                raise RuntimeError("the network was trained")
            return self.lin(x)

    X, y = _data(n=80)
    # 5 rows: the 90 % quantile needs ⌈1/0.1⌉ − 1 = 9; the user hears it before any training
    with warnings.catch_warnings(record=True) as caught, pytest.raises(RuntimeError, match="network was trained"):
        warnings.simplefilter("always")
        LaplaceActiveSubspaceRegressor(Untrainable(),
                                       **grouped(**NEW)).fit(X[:60], y[:60], X_cal=X[60:65], y_cal=y[60:65])
    early = [w for w in caught if issubclass(w.category, ConformalWarning)]
    assert len(early) == 1 and early[0].filename == __file__  # pointing at the user's fit call
    assert re.search(r"5 calibration rows are too few .* level 0\.9 \(it needs 9\).*intervals are infinite"
                     r".*Pass at least 9 calibration rows", str(early[0].message))
    # after training the calibration's own warning is not repeated; the intervals are infinite as announced
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny = LaplaceActiveSubspaceRegressor(**grouped(**NEW)).fit(X[:60], y[:60], X_cal=X[60:65], y_cal=y[60:65])
    assert len([w for w in caught if issubclass(w.category, ConformalWarning)]) == 1
    with pytest.warns(ConformalWarning, match="too few"):  # and again where they are asked for
        assert np.isinf(tiny.predict_interval(X[:2])[1]).all()
    # the classifier says its sets; 9 rows are enough and nothing is said
    Xc, yc = X, (y > np.median(y)).astype(int)
    with pytest.warns(ConformalWarning, match="prediction sets hold every class"):
        LaplaceActiveSubspaceClassifier(**grouped(**NEW)).fit(Xc[:60], yc[:60], X_cal=Xc[60:65], y_cal=yc[60:65])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConformalWarning)
        LaplaceActiveSubspaceRegressor(**grouped(**NEW)).fit(X[:60], y[:60], X_cal=X[60:69], y_cal=y[60:69])


def test_low_rank_sample_y_draws_the_linearised_predictive():
    X, y = _data(n=60)
    est = LaplaceActiveSubspaceRegressor(**grouped(**NEW)).fit(X, y)
    draws = est.sample_y(X[:4], n_samples=4000, random_state=3)
    mean, std = est.predict(X[:4], return_std=True)
    std = std / est.std_scale_[0]  # the posterior's own σ_f (return_std is conformally calibrated)
    se = std / np.sqrt(4000)
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * se)
    assert np.all(np.abs(draws.std(1) / std - 1) < 5 * np.sqrt(0.5 / 4000))
    np.testing.assert_array_equal(draws[:, :10], est.sample_y(X[:4], n_samples=4000, random_state=3)[:, :10])


def test_paper_method_is_one_argument_away():
    """calibration="coverage", posterior="subspace": the paper's sampled subspace posterior, d by coverage."""
    X, y = _data(n=60)
    paper = LaplaceActiveSubspaceRegressor(**grouped(**NEW, calibration="coverage", posterior="subspace")).fit(X, y)
    assert paper.predictive_.name == "sampled" and paper.posterior_.posterior == "subspace"
    assert paper.posterior_.sigma0_method == "eb_subspace" and paper.conformity_scores_ is None
    assert list(paper.calibration_.columns) == ["d", "coverage", "mean_width", "sigma0"]
    # its intervals are the sample quantiles of the subspace posterior at the chosen d
    Xt = torch.as_tensor((X[:5] - paper.x_mean_) / paper.x_scale_)
    f = paper.posterior_.predict_samples(Xt, paper.n_components_, paper.posterior.n_samples,
                                         random_state=paper._sample_seed_)
    f = f[..., 0].numpy() * paper.y_scale_[0] + paper.y_mean_[0]
    _, pis = paper.predict_interval(X[:5])
    np.testing.assert_allclose(pis[:, 0, 0], np.quantile(f, 0.05, axis=0), rtol=1e-10)
    np.testing.assert_allclose(pis[:, 1, 0], np.quantile(f, 0.95, axis=0), rtol=1e-10)


@pytest.mark.parametrize("sigma0", ["eb_full", "auto"])
def test_default_classifier_conformal_lac_sets(sigma0):
    X, labels = _labels(n=90)
    X_cal, l_cal = _labels(n=40, seed=1)
    clf = LaplaceActiveSubspaceClassifier(**grouped(**NEW, sigma0=sigma0)).fit(X, labels, X_cal=X_cal, y_cal=l_cal)
    assert clf.posterior_.posterior == "low_rank" and clf.predictive_.name == "linearized"
    if sigma0 == "eb_full":
        assert clf.posterior_.sigma0_method == "eb_full"
        rows = np.arange(40)
    else:  # the default: σ0 by the NLL of 20 of the rows, fixed in the posterior; the scores on the other 20
        assert clf.posterior_.sigma0_method is None and clf.posterior_.sigma0 == clf.sigma0_search_.sigma0
        rows = np.setdiff1d(np.arange(40), clf.sigma0_rows_)
        assert len(rows) == clf.n_calibration_rows_ == 20
    X_cal, l_cal = X_cal[rows], l_cal[rows]
    n = len(rows)
    proba_c = clf.predict_proba(X_cal)
    codes = np.searchsorted(clf.classes_, l_cal)
    scores = np.sort(1 - proba_c[np.arange(n), codes])
    np.testing.assert_allclose(clf.conformity_scores_, scores, rtol=1e-9, atol=1e-12)
    q = scores[_rank(n, 0.9) - 1]
    labels_pred, sets = clf.predict_set(X[:20])
    proba = clf.predict_proba(X[:20])
    decided = np.abs((1 - proba) - q) > 1e-9  # membership that round-off cannot flip
    by_hand = (1 - proba) <= q
    by_hand[np.arange(20), proba.argmax(1)] |= ~by_hand.any(1)  # the default LAC(never_empty=True): top class added
    decided &= decided.all(1, keepdims=True)  # rows whose emptiness round-off cannot flip either
    np.testing.assert_array_equal(sets[:, :, 0][decided], by_hand[decided])
    assert sets[:, :, 0].sum(1).min() >= 1
    np.testing.assert_array_equal(labels_pred, clf.classes_[proba.argmax(1)])
    _, sets_c = clf.predict_set(X_cal)
    assert sets_c[np.arange(n), codes, 0].mean() >= 0.9


def _noisy_labels(n, seed):
    """The three blobs with a fifth of the labels redrawn at random: prediction sets need more than one class."""
    X, y = _labels(n=n, seed=seed)
    rng = np.random.default_rng(seed + 5)
    flip = rng.random(n) < 0.2
    y = y.copy()
    y[flip] = rng.choice(np.array(["cat", "dog", "emu"], dtype=object), int(flip.sum()))
    return X, y


@pytest.mark.parametrize("task,params", [
    ("regression", dict(noise_std=0.2)),  # the curve crosses 90 % near d = 6
    ("regression", dict(noise_std=0.15)),  # … near d = 11, not monotone above it
    ("regression", dict(scaling="standard")),  # never reaches 90 %
    # every label in its set: near d = 5 (mean), 7 (standard), for the network trained without the prior
    ("classification", dict(confidence_level=0.99, weight_decay=0.0)),
])
def test_calibration_search_matches_the_full_scan_on_small_fits(task, params):
    """Trained networks, both scalings, both predictives: the d chosen in fit (the sampled predictive searches,
    the linearised one scans) is the first d at which the whole coverage curve (``coverage_curve``, every d,
    the same samples) reaches the level whenever "reached" is monotone along that curve, and otherwise a d
    where the curve crosses the level; the table's rows are rows of the curve."""
    if task == "regression":
        (X, y), (X_cal, y_cal), make = _data(n=120), _data(n=60, seed=1), _reg
    else:
        (X, y), (X_cal, y_cal), make = _noisy_labels(120, 0), _noisy_labels(60, 1), _clf
    level = params.get("confidence_level", 0.9)
    scalings = [params.pop("scaling")] if "scaling" in params else ["mean", "standard"]
    searched = 0
    for scaling in scalings:
        for predictive in ("sampled", "linearized"):
            est = make(scaling=scaling, predictive=predictive, max_components=20, n_samples=200,
                       max_epochs=100 if task == "classification" else 60, **params)
            est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
            curve = est.coverage_curve(X_cal, y_cal)
            assert curve["d"].tolist() == list(range(1, 21))
            reached = (curve["coverage"] >= level - 1e-12).to_numpy()
            table = est.calibration_
            pd.testing.assert_frame_equal(table, curve.set_index("d").loc[table["d"]].reset_index(),
                                          check_exact=False, rtol=1e-12)
            d = est.n_components_
            if predictive == "linearized" or np.all(np.diff(reached.astype(int)) >= 0):  # the scan's answer
                expected = int(np.argmax(reached)) + 1 if reached.any() else 20
                assert d == expected and est.calibration_reached_ == bool(reached.any())
            elif not reached[-1]:  # d_max below the level: the search stops there
                assert d == 20 and not est.calibration_reached_
            else:
                assert reached[d - 1] and (d == 1 or not reached[d - 2])
            if predictive == "sampled":
                assert len(table) <= 3 + 1 + 5  # a scan of at most 3, d_max, bisection of 20 candidates
                searched += d > 3 and len(table) < d  # fewer evaluations than a scan up to d
    assert searched >= 1 or scalings == ["standard"]


def test_every_hook_the_base_calls_is_declared_on_the_base():
    """The methods the shared estimator code calls on ``self`` all exist on the base class (the subclass hooks
    as abstract methods), and a subclass that leaves one out cannot be instantiated."""
    import ast
    import inspect

    from glas_sklearn.estimators import _base
    from glas_sklearn.estimators._base import LaplaceActiveSubspaceBase

    called = set()
    for module in (_base,):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
                called.add(node.func.attr)
    assert called, "no self.method() calls found"
    params = set(LaplaceActiveSubspaceBase._get_param_names())  # e.g. self.module(**module_kwargs)
    assert not sorted(name for name in called - params if not hasattr(LaplaceActiveSubspaceBase, name))
    hooks = LaplaceActiveSubspaceBase.__abstractmethods__
    assert {"_components", "_validate_train", "_validate_calibration", "_auto_low_rank_sigma0"} <= hooks

    class Incomplete(LaplaceActiveSubspaceBase):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()
