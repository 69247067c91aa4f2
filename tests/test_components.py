"""The estimators as a facade over components: the settings objects (Training, the posterior kinds, Compute) as
scikit-learn parameters, the data flow (the calibration rows shape nothing fitted before calibration), and the
learning-rate schedule of Training."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold
from torch import nn

from glas_sklearn import (
    Compute,
    LaplaceActiveSubspaceClassifier,
    LaplaceActiveSubspaceRegressor,
    LowRank,
    Posterior,
    Subspace,
    Training,
)
from glas_sklearn.calibration import CalibrationWarning
from glas_sklearn.posterior import SubspacePosterior
from glas_sklearn.training import WARMUP_SHARE, lr_factor, train_module

SMALL = dict(training=Training(max_epochs=5, module_kwargs=dict(hidden_layer_sizes=(8,))),
             posterior=LowRank(max_components=3, n_samples=20), compute=Compute(dtype="float64"), random_state=0)


def _data(n=160, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    return X, np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + (0.1 + 0.3 * (X[:, 2] > 0)) * rng.standard_normal(n)


# ------------------------------------------------------------------------------------- settings objects
def test_nested_settings_are_scikit_learn_parameters():
    reg = clone(LaplaceActiveSubspaceRegressor(**SMALL))  # its own settings objects (set_params sets them in place)
    params = reg.get_params(deep=True)
    assert params["training__max_epochs"] == 5 and params["posterior__max_components"] == 3
    assert params["compute__dtype"] == "float64"
    reg.set_params(training__lr=0.01, posterior__max_components=2)
    assert reg.training.lr == 0.01 and reg.posterior.max_components == 2
    twin = clone(reg)  # a deep copy of the settings, equal parameters
    assert twin.training is not reg.training and twin.get_params()["training__lr"] == 0.01
    assert SMALL["training"].lr == "auto" and SMALL["posterior"].max_components == 3


def test_string_shortcuts_and_kind_classes_resolve_to_settings_objects():
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        by_name = LaplaceActiveSubspaceRegressor(**{**SMALL, "posterior": "subspace"}, likelihood="gaussian",
                                                 calibration="coverage").fit(X, y)
        by_class = LaplaceActiveSubspaceRegressor(**{**SMALL, "posterior": SubspacePosterior}, likelihood="gaussian",
                                                  calibration="coverage").fit(X, y)
        by_object = LaplaceActiveSubspaceRegressor(**{**SMALL, "posterior": Subspace()}, likelihood="gaussian",
                                                   calibration="coverage").fit(X, y)
    for est in (by_name, by_class, by_object):
        assert type(est.posterior_) is SubspacePosterior and est.predictive_.name == "sampled"
    # the same kind with the same (default) hyperparameters: the same posterior, bit for bit
    np.testing.assert_array_equal(by_name.eigenvalues_, by_class.eigenvalues_)
    np.testing.assert_array_equal(by_name.predict_interval(X[:5])[1], by_object.predict_interval(X[:5])[1])
    assert Posterior(kind=SubspacePosterior).name == Subspace().name == "subspace"


def test_grid_search_over_nested_and_top_level_parameters():
    X, y = _data(120)
    grid = {"training__lr": [1e-3, 1e-2], "posterior__max_components": [2, 3], "scaling": ["mean", "standard"]}
    search = GridSearchCV(LaplaceActiveSubspaceRegressor(**SMALL, likelihood="gaussian"), grid, cv=KFold(2))
    search.fit(X, y)
    assert len(search.cv_results_["params"]) == 8
    best = search.best_estimator_
    assert best.training.lr == search.best_params_["training__lr"]
    assert best.posterior_.max_components == search.best_params_["posterior__max_components"]


def test_settings_are_checked_at_fit_naming_the_nested_parameter():
    X, y = _data(40)
    with pytest.raises(ValueError, match=r"training__schedule must be 'constant' or 'warmup_cosine', got 'cyclic'"):
        LaplaceActiveSubspaceRegressor(training=Training(schedule="cyclic")).fit(X, y)
    with pytest.raises(ValueError, match=r"compute__working_memory must be a finite float > 0, got 0"):
        LaplaceActiveSubspaceRegressor(compute=Compute(working_memory=0)).fit(X, y)
    with pytest.raises(ValueError, match=r"posterior__include_noise applies to regression"):
        LaplaceActiveSubspaceClassifier(posterior=LowRank(include_noise=True)).fit(X, (y > 0).astype(int))


# ------------------------------------------------------------------------------------------- data flow
def _fitted_before_calibration(est) -> dict:
    """What is fitted before the calibration: scalers, network weights, likelihood and noise model."""
    out = {"x_mean": est.x_mean_, "x_scale": est.x_scale_,
           "weights": {k: v.clone() for k, v in est.module_.state_dict().items()},
           "likelihood": repr(est.likelihood_)}
    if hasattr(est, "y_mean_"):
        out.update(y_mean=est.y_mean_, y_scale=est.y_scale_, noise=np.atleast_1d(est.noise_std_),
                   support=None if est.likelihood_support_ is None else est.likelihood_support_["nll_gain"])
    return out


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key == "weights":
            for name in a[key]:
                assert torch.equal(a[key][name], b[key][name]), name
        elif isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("given", [True, False], ids=["X_cal", "calibration_size"])
def test_calibration_rows_shape_nothing_fitted_before_calibration(given):
    """Perturbing the calibration rows (X and y) leaves the scalers, the network, the likelihood choice and the
    noise model bit-identical: they are computed from the training rows only, along the same path (so equality is
    exact), while the calibration itself changes."""
    X, y = _data(240)
    rng = np.random.default_rng(5)
    reg = LaplaceActiveSubspaceRegressor(**SMALL)  # likelihood="auto": the choice is part of the noise model
    if given:
        X_cal, y_cal = X[200:], y[200:]
        first = clone(reg).fit(X[:200], y[:200], X_cal=X_cal, y_cal=y_cal)
        second = clone(reg).fit(X[:200], y[:200], X_cal=10 * rng.standard_normal(X_cal.shape) + 3,
                                y_cal=100 * rng.standard_normal(40) - 7)
    else:
        first = clone(reg).fit(X, y)
        cal = first.calibration_indices_
        X2, y2 = X.copy(), y.copy()
        X2[cal] = 10 * rng.standard_normal((len(cal), 3)) + 3
        y2[cal] = 100 * rng.standard_normal(len(cal)) - 7
        second = clone(reg).fit(X2, y2)
        np.testing.assert_array_equal(second.calibration_indices_, cal)
    assert first.likelihood_support_ is not None  # the choice was made here, on training rows
    _assert_identical(_fitted_before_calibration(first), _fitted_before_calibration(second))
    assert not np.array_equal(first.conformity_scores_, second.conformity_scores_)  # calibration did see them


def test_classifier_calibration_rows_shape_nothing_fitted_before_calibration():
    X, y = _data(200)
    labels = (y > np.median(y)).astype(int)
    clf = LaplaceActiveSubspaceClassifier(**SMALL, sigma0="eb_full")
    first = clone(clf).fit(X[:160], labels[:160], X_cal=X[160:], y_cal=labels[160:])
    second = clone(clf).fit(X[:160], labels[:160], X_cal=-X[160:] * 5, y_cal=1 - labels[160:])
    _assert_identical(_fitted_before_calibration(first), _fitted_before_calibration(second))


# ------------------------------------------------------------------------------------ learning-rate schedule
def test_warmup_cosine_factor_in_closed_form():
    total = 400
    warmup = int(WARMUP_SHARE * total)
    factors = [lr_factor("warmup_cosine", s, total) for s in range(total)]
    np.testing.assert_allclose(factors[:warmup], (np.arange(warmup) + 1) / warmup)
    for s in (warmup, warmup + 57, total - 1):
        expected = 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))
        assert factors[s] == pytest.approx(expected, rel=1e-12)
    assert max(factors) == 1.0 and factors[-1] < 1e-3
    assert all(lr_factor("constant", s, total) == 1.0 for s in range(total))


class _Recording(torch.optim.SGD):
    """SGD that records the learning rate of every step it takes."""

    seen: list = []

    def step(self, closure=None):
        _Recording.seen.append(self.param_groups[0]["lr"])
        return super().step(closure)


@pytest.mark.parametrize("schedule", ["constant", "warmup_cosine"])
def test_the_optimizer_steps_at_the_scheduled_learning_rates(schedule):
    torch.manual_seed(0)
    X, y = torch.randn(40, 2, dtype=torch.float64), torch.randn(40, 1, dtype=torch.float64)
    module = nn.Linear(2, 1).double()
    _Recording.seen = []
    train_module(module, X, y, lambda out, t: ((out - t) ** 2).mean(), optimizer=_Recording, lr=0.1,
                 weight_decay=0.0, batch_size=10, max_epochs=6, seed=0, schedule=schedule)
    total = 6 * 4
    expected = [0.1 * lr_factor(schedule, s, total) for s in range(total)]
    np.testing.assert_allclose(_Recording.seen, expected, rtol=1e-12)


def test_the_estimator_trains_with_the_schedule_of_its_training_settings(monkeypatch):
    """``Training(schedule=...)`` reaches the training loop; the constant schedule is the loop without one."""
    from glas_sklearn.training import loop

    seen = []
    real = loop.run
    monkeypatch.setattr(loop, "run", lambda nets, **kw: seen.append(kw["lr_at"] is not None) or real(nets, **kw))
    X, y = _data(60)
    LaplaceActiveSubspaceRegressor(**{**SMALL, "training": Training(max_epochs=3, schedule="warmup_cosine")},
                                   likelihood="gaussian").fit(X, y)
    assert seen == [True] * 2  # the shadow copy that chose the epochs (60 rows: "auto"), then the network
