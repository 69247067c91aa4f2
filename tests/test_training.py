"""The training loop (glas_sklearn/training/) and its settings: early stopping on held-out rows drawn
from the training rows only, the weights of the best epoch restored, a one-row last batch merged, the fitted
training attributes and the stop reason in the log."""

from __future__ import annotations

import copy
import logging
import re

import numpy as np
import pytest
import torch
from torch import nn

import glas_sklearn
from glas_sklearn import Compute, LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, LowRank, Training
from glas_sklearn import training as _training
from glas_sklearn.estimators._posterior import auto_subsample
from glas_sklearn.likelihoods import HeteroscedasticGaussian
from glas_sklearn.training import (
    auto_batch_size,
    auto_lr,
    batch_slices,
    build_optimizer,
    fitting,
    held_out_loss,
    loop,
    optim,
    train_module,
)
from glas_sklearn.training.optim import FusedAdam
from tests.reference import decays_recorded, grouped

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

# likelihood="gaussian": one network per fit (likelihood="auto" trains two or three to choose between them)
FAST = dict(module_kwargs=dict(hidden_layer_sizes=(16,)), n_samples=50, max_components=3, dtype="float64",
            random_state=0, early_stopping=True, likelihood="gaussian")


def _data(n=300, seed=0, noise=0.3):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 3))
    return X, np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + noise * rng.standard_normal(n)


def _internal(est, X, y):
    """Rows and targets in the estimator's internal (standardised) units, as training saw them."""
    Xt = torch.as_tensor(est._inputs.transform(X), dtype=torch.float64)
    yt = torch.as_tensor(((y - est.y_mean_[0]) / est.y_scale_[0])[:, None], dtype=torch.float64)
    return Xt, yt


# ------------------------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("n, size", [(135, 67), (129, 64), (10, 3), (7, 7), (5, 1), (1, 5), (200, 200), (201, 200)])
def test_batches_cover_every_row_once_and_never_leave_one_row_alone(n, size):
    slices = batch_slices(n, size)
    rows = np.concatenate([np.arange(n)[s] for s in slices])
    np.testing.assert_array_equal(rows, np.arange(n))
    lengths = [s.stop - s.start for s in slices]
    if size > 1 and n > 1:
        assert min(lengths) >= 2
    assert lengths[:-1] == [min(size, n)] * (len(lengths) - 1)  # only the last batch differs
    assert max(lengths) <= min(size, n) + 1


@pytest.mark.parametrize("n, expected", [(10, 10), (100, 64), (1280, 64), (1299, 64), (1300, 65), (2000, 100),
                                         (4000, 200), (8191, 200), (8192, 256), (9667, 302), (16_384, 512),
                                         (32_767, 1023), (32_768, 1024), (36_000, 1024)])
def test_auto_batch_size_gives_about_twenty_steps_per_epoch_within_64_and_200_then_32_up_to_1024(n, expected):
    """⌊n/20⌋ within [64, 200] below 8,192 rows trained on; from there ⌊n/32⌋ (32 steps an epoch) up to 1,024."""
    assert auto_batch_size(n) == expected


@pytest.mark.parametrize("n, batch, expected", [
    (100, None, 1e-3), (1999, None, 1e-3), (1999, 1024, 1e-3), (1999, 4096, 1e-3),  # small data: always 1e-3
    (5000, None, 1e-3), (8191, 1024, 1e-3), (8191, None, 1e-3),                      # below 8,192 rows trained on
    (8192, 200, 1e-3), (36_000, 200, 1e-3), (36_000, 1023, 1e-3),                    # small steps on large data
    (8192, 1024, 3e-3), (36_000, 1024, 3e-3), (36_000, 4096, 3e-3), (36_000, None, 3e-3)])
def test_auto_lr_is_1e3_except_for_steps_of_1024_rows_or_more_on_large_data(n, batch, expected):
    assert auto_lr(n, batch) == expected


def test_lr_auto_resolves_with_the_batch_size_and_an_explicit_lr_is_kept():
    assert Training().lr == "auto" and LaplaceActiveSubspaceRegressor().training is None  # None: Training()
    est = Training()
    assert (est.batch_rows(1999), est.learning_rate(1999)) == (99, 1e-3)
    assert (est.batch_rows(36_000), est.learning_rate(36_000)) == (1024, 3e-3)
    assert Training(batch_size=200).learning_rate(36_000) == 1e-3  # the user's batch size: 1e-3
    assert Training(lr=5e-4).learning_rate(36_000) == 5e-4  # the user's lr: as given


def test_lr_auto_trains_small_data_as_lr_1e3():
    """Below 2,000 rows ``lr="auto"`` is 1e-3: the same fit as ``lr=1e-3`` (same seed, same steps)."""
    X, y = _data(n=200)
    settings = dict(FAST, early_stopping="auto", max_epochs=20)
    a = LaplaceActiveSubspaceRegressor(**grouped(**settings)).fit(X, y)
    b = LaplaceActiveSubspaceRegressor(**grouped(lr=1e-3, **settings)).fit(X, y)
    c = LaplaceActiveSubspaceRegressor(**grouped(lr=3e-3, **settings)).fit(X, y)
    tol = 1e-10 * len(X)  # float64, the same arithmetic on both paths
    np.testing.assert_allclose(a.loss_curve_, b.loss_curve_, rtol=tol)
    assert not np.allclose(a.loss_curve_, c.loss_curve_, rtol=1e-3)  # the comparison can tell rates apart


def test_batchnorm_network_trains_with_a_one_row_last_batch():
    """135 training rows in batches of 67 leave one row: torch's BatchNorm refuses a training batch of one row
    ("Expected more than 1 value per channel when training"); the row joins the batch before it."""
    X, y = _data(n=155)

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1)).double()

    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):  # what a one-row batch does
        net().train()(torch.zeros(1, 3, dtype=torch.float64))
    est = LaplaceActiveSubspaceRegressor(module=net(), random_state=0,
                                         training=Training(batch_size=67, max_epochs=3, early_stopping=False),
                                         posterior=LowRank(n_samples=50, max_components=3),
                                         compute=Compute(dtype="float64"))
    est.fit(X[:135], y[:135], X_cal=X[135:], y_cal=y[135:])
    assert est.n_iter_ == 3 and np.all(np.isfinite(est.loss_curve_))
    assert np.all(np.isfinite(est.predict_interval(X[:5])[1]))


# -------------------------------------------------------------------------------------------- early stopping
def test_early_stopping_keeps_the_weights_of_the_lowest_held_out_loss():
    X, y = _data()
    est = LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=400, lr=0.05, n_iter_no_change=5)).fit(X, y)
    scores = np.asarray(est.validation_scores_)
    assert est.n_iter_ == len(est.loss_curve_) == len(scores) < 400  # stopped early
    best = int(np.argmin(scores))
    assert est.best_validation_score_ == scores[best]
    # stopped after n_iter_no_change epochs without an improvement of more than tol over the best
    assert np.all(scores[best + 1:] > scores[best] - est.training.tol) and len(scores) - 1 - best >= 5
    # the network kept is that epoch's: its loss on the validation rows, recomputed independently
    rows = est.train_indices_[est.validation_indices_]
    Xv, yv = _internal(est, X[rows], y[rows])
    with torch.no_grad():
        recomputed = float(0.5 * ((est.module_(Xv) - yv) ** 2).sum(-1).mean())
    assert recomputed == pytest.approx(scores[best], rel=1e-10)
    assert recomputed < scores[-1]  # and not the last epoch's (it went on past the best)


def test_validation_rows_come_from_the_training_rows_and_the_calibration_rows_never_shape_the_network():
    X, y = _data()
    est = LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=60, lr=0.05)).fit(X, y)
    n_train = len(est.train_indices_)
    assert len(est.validation_indices_) == int(np.ceil(0.1 * n_train))
    validation = est.train_indices_[est.validation_indices_]
    assert not set(validation) & set(est.calibration_indices_)
    # conformal validity: the network (and when it stopped) may not depend on the calibration targets
    y_changed = y.copy()
    y_changed[est.calibration_indices_] += 100.0
    other = LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=60, lr=0.05)).fit(X, y_changed)
    same = LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=60, lr=0.05)).fit(X, y)
    assert other.n_iter_ == same.n_iter_
    for p, q in zip(other.module_.parameters(), same.module_.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_early_stopping_auto_holds_rows_out_from_2000_training_rows_on_and_a_shadow_copy_chooses_below():
    X, y = _data(n=2300)
    kw = {**FAST, "early_stopping": "auto", "max_epochs": 2, "max_components": 2}
    large = LaplaceActiveSubspaceRegressor(**grouped(**kw, calibration_size=300)).fit(X, y)  # 2000 training rows
    assert len(large.validation_indices_) == 200 and len(large.validation_scores_) == large.n_iter_ == 2
    assert large._n_rows_trained == 1800
    small = LaplaceActiveSubspaceRegressor(**grouped(**kw, calibration_size=301)).fit(X, y)  # 1999
    # the shadow copy holds a fifth out; the network itself trains on all 1999 rows for the epochs the copy chose
    assert len(small.validation_indices_) == 400 and len(small.validation_scores_) == 2
    assert small._n_rows_trained == 1999
    assert small.n_iter_ == len(small.loss_curve_) == 1 + int(np.argmin(small.validation_scores_))


def _shadow_data(n, smooth, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    if smooth:  # noise-free: the longer the network trains, the better it fits
        return X, np.sin(2 * X[:, 0]) * np.cos(X[:, 1])
    return X, rng.standard_normal(n)  # no signal: every epoch past the first few fits noise


def test_shadow_trains_long_on_a_smooth_target_and_briefly_on_pure_noise():
    """early_stopping="shadow": the copy's held-out loss decides how long the network trains: most of the budget on
    a noise-free smooth target, a small share of it where the targets are noise."""
    kw = dict(module_kwargs=dict(hidden_layer_sizes=(32, 32)), max_epochs=400, lr=3e-3, early_stopping="shadow",
              likelihood="gaussian", n_samples=20, max_components=2, random_state=0, calibration_size=40)
    smooth = LaplaceActiveSubspaceRegressor(**grouped(**kw)).fit(*_shadow_data(240, True))
    noise = LaplaceActiveSubspaceRegressor(**grouped(**kw)).fit(*_shadow_data(240, False))
    assert smooth.n_iter_ >= 300, smooth.n_iter_  # seeds 0-3: 384-399 of 400
    assert noise.n_iter_ <= 100, noise.n_iter_  # seeds 0-3: 1-87


def test_shadow_network_is_the_plain_training_for_the_epochs_its_copy_chose():
    """The kept network trains on every training row, exactly as early_stopping=False does for the chosen epochs;
    the copy's curve is that of early_stopping=True on the same held-out fifth run to the end (same rows, same
    start); it stops only past twice its best epoch."""
    X, y = _data(n=260)
    kw = {**FAST, "max_components": 2, "lr": 0.01}
    est = LaplaceActiveSubspaceRegressor(**grouped(**{**kw, "early_stopping": "shadow"}, max_epochs=120)).fit(X, y)
    best, curve = est.n_iter_, np.asarray(est.validation_scores_)
    assert best == 1 + int(np.argmin(curve)) and len(est.loss_curve_) == best
    assert len(curve) >= min(120, 2 * best)
    assert len(est.validation_indices_) == int(np.ceil(0.2 * len(est.train_indices_)))
    plain = LaplaceActiveSubspaceRegressor(**grouped(**{**kw, "early_stopping": False}, max_epochs=best)).fit(X, y)
    for p, q in zip(est.module_.parameters(), plain.module_.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # the same computation, not two paths
    held = LaplaceActiveSubspaceRegressor(**grouped(**{**kw, "early_stopping": True}, max_epochs=len(curve),
                                                    validation_fraction=0.2, n_iter_no_change=10**6)).fit(X, y)
    np.testing.assert_array_equal(held.validation_indices_, est.validation_indices_)
    np.testing.assert_allclose(held.validation_scores_, curve, rtol=0, atol=0)


def test_early_stopping_off_runs_every_epoch():
    X, y = _data(n=120)
    est = LaplaceActiveSubspaceRegressor(**grouped(**{**FAST, "early_stopping": False}, max_epochs=7)).fit(X, y)
    assert est.n_iter_ == len(est.loss_curve_) == 7
    assert est.validation_scores_ is None and est.best_validation_score_ is None and est.validation_indices_ is None


def test_weighted_held_out_loss_is_the_weighted_mean_of_the_row_losses():
    torch.manual_seed(0)
    net = nn.Linear(2, 1).double()
    X, y = torch.randn(9, 2, dtype=torch.float64), torch.randn(9, 1, dtype=torch.float64)
    w = torch.arange(1.0, 10.0, dtype=torch.float64)
    per_row = 0.5 * (net(X) - y).detach().pow(2).sum(-1)
    expected = float((w * per_row).sum() / w.sum())

    def loss(out, target):
        return 0.5 * ((out - target) ** 2).sum(-1).mean()

    assert held_out_loss(net, X, y, loss, w, chunk=4) == pytest.approx(expected, rel=1e-12)
    assert held_out_loss(net, X, y, loss, chunk=4) == pytest.approx(float(per_row.mean()), rel=1e-12)
    assert abs(expected - float(per_row.mean())) > 1e-3  # the weights matter here


def test_estimator_weights_the_validation_loss():
    X, y = _data(n=200)
    w = np.random.default_rng(3).integers(1, 5, len(y)).astype(float)
    est = LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=30, lr=0.05)).fit(X, y, sample_weight=w)
    rows = est.train_indices_[est.validation_indices_]
    Xv, yv = _internal(est, X[rows], y[rows])
    with torch.no_grad():
        per_row = 0.5 * ((est.module_(Xv) - yv) ** 2).sum(-1).numpy()
    assert est.best_validation_score_ == pytest.approx(np.average(per_row, weights=w[rows]), rel=1e-10)
    assert abs(est.best_validation_score_ - per_row.mean()) > 1e-6


def test_heteroscedastic_head_stops_on_its_own_nll():
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 1, size=(300, 1))
    y = np.sin(6 * X[:, 0]) + (0.05 + 0.5 * X[:, 0]) * rng.standard_normal(300)
    est = LaplaceActiveSubspaceRegressor(**grouped(**{**FAST, "likelihood": HeteroscedasticGaussian()}, max_epochs=80,
                                                   lr=0.02)).fit(X, y)
    rows = est.train_indices_[est.validation_indices_]
    Xv, yv = _internal(est, X[rows], y[rows])
    with torch.no_grad():
        out = est.module_(Xv)
    mu, logvar = out[:, :1], out[:, 1:]
    nll = float((0.5 * (yv - mu) ** 2 * torch.exp(-logvar) + 0.5 * logvar).mean())
    beta_nll = float(HeteroscedasticGaussian().loss(out, yv))
    assert est.best_validation_score_ == pytest.approx(nll, rel=1e-8)
    assert abs(nll - beta_nll) > 1e-3  # the β-NLL (the training loss) is another number


def test_classifier_holds_out_stratified_validation_rows():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 2))
    y = np.where(X[:, 0] + 0.3 * rng.standard_normal(200) > 0.8, "b", "a")
    fast = {k: v for k, v in FAST.items() if k != "likelihood"}
    clf = LaplaceActiveSubspaceClassifier(**grouped(**fast, max_epochs=40, lr=0.05)).fit(X, y)
    labels = y[clf.train_indices_]
    val = labels[clf.validation_indices_]
    share = np.mean(labels == "b")
    assert abs(np.mean(val == "b") - share) <= 1 / len(val) + 1e-12
    assert len(clf.validation_scores_) == clf.n_iter_


def test_stop_reason_is_logged_in_one_line(caplog):
    X, y = _data(n=120)
    with caplog.at_level(logging.INFO, logger="glas_sklearn.training"):
        LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=5)).fit(X, y)
    lines = [r.getMessage() for r in caplog.records if r.name == "glas_sklearn.training"]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "stopped after 5 epochs" in lines[0] and "max_epochs=5 reached" in lines[0]


def test_network_after_a_shadow_copy_logs_why_it_ran_those_epochs(caplog):
    """The network that trains for its shadow copy's epochs says so in its one line, not "max_epochs=N reached"."""
    X, y = _data(n=120)
    with caplog.at_level(logging.INFO, logger="glas_sklearn.training"):
        est = LaplaceActiveSubspaceRegressor(**grouped(**{**FAST, "early_stopping": "shadow"}, max_epochs=30)).fit(X, y)
    lines = [r.getMessage() for r in caplog.records if r.name == "glas_sklearn.training"]
    assert len(lines) == 2 and "(shadow copy)" in lines[0]  # the copy's line, then the network's
    reason = lines[1].split(f"stopped after {est.n_iter_} epochs: ", 1)[1]
    assert reason.startswith(f"the {est.n_iter_} epochs at which a trial run of the network")


def test_too_few_rows_for_validation_train_every_epoch():
    X, y = _data(n=12)
    est = LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=4, validation_fraction=0.1)).fit(X, y)
    assert est.n_iter_ == 4 and est.validation_scores_ is None  # one validation row would be too few


def test_prefit_modules_are_never_trained():
    X, y = _data(n=100)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    est = LaplaceActiveSubspaceRegressor(module=net, prefit=True, random_state=0,
                                         posterior=LowRank(n_samples=50, max_components=3))
    est.fit(X[:80], y[:80], X_cal=X[80:], y_cal=y[80:])
    assert est.n_iter_ == 0 and est.loss_curve_ == [] and est.validation_scores_ is None
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])


@pytest.mark.parametrize("param, value, match", [
    ("early_stopping", "yes", "early_stopping"), ("early_stopping", None, "early_stopping"),
    ("validation_fraction", 1.0, "validation_fraction"),
    ("validation_fraction", 0.0, "validation_fraction"), ("n_iter_no_change", 0, "n_iter_no_change"),
    ("tol", -1.0, "tol"), ("batch_size", "big", "batch_size")])
def test_bad_training_settings_are_refused(param, value, match):
    X, y = _data(n=60)
    with pytest.raises(ValueError, match=match):
        LaplaceActiveSubspaceRegressor(**grouped(**{param: value})).fit(X, y)


def test_train_module_stops_and_restores_on_a_validation_loss_that_rises():
    """A validation target that the training pulls away from: the held-out loss is lowest at the first epoch, so
    training stops after the patience (n_iter_no_change epochs of at least 50 steps: 3 × 50 epochs of one
    full-batch step) and the first epoch's weights come back."""
    torch.manual_seed(0)
    net = nn.Linear(1, 1).double()
    X = torch.linspace(-1, 1, 20, dtype=torch.float64)[:, None]
    y, y_val = 2 * X, -2 * X
    result = train_module(net, X, y, lambda o, t: 0.5 * ((o - t) ** 2).mean(), optimizer="sgd", lr=0.1,
                          weight_decay=0.0, batch_size=None, max_epochs=400, seed=0, validation=(X, y_val, None),
                          n_iter_no_change=3, tol=0.0)
    assert result.best_epoch == 1 and result.n_iter == 1 + 3 * 50
    torch.manual_seed(0)
    fresh = nn.Linear(1, 1).double()
    train_module(fresh, X, y, lambda o, t: 0.5 * ((o - t) ** 2).mean(), optimizer="sgd", lr=0.1,
                 weight_decay=0.0, batch_size=None, max_epochs=1, seed=0)
    for p, q in zip(net.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_an_estimator_pickles_with_its_training_record_and_older_states_are_refused():
    """The training record (n_iter_, loss_curve_, the early-stopping settings) survives a pickle; a state pickled
    before this version (no version stamp: before early stopping, among others) is refused, not migrated."""
    import pickle

    X, y = _data(n=60)
    est = LaplaceActiveSubspaceRegressor(**grouped(**{**FAST, "early_stopping": False}, max_epochs=3)).fit(X, y)
    loaded = pickle.loads(pickle.dumps(est))
    assert repr(loaded.get_params()) == repr(est.get_params()) and loaded.n_iter_ == est.n_iter_ == 3
    assert loaded.loss_curve_ == est.loss_curve_ and loaded.validation_scores_ is None
    np.testing.assert_array_equal(loaded.predict(X[:5]), est.predict(X[:5]))
    state = est.__getstate__()
    state.pop("_glas_pickle")
    with pytest.raises(ValueError, match="earlier development build of glas-sklearn.*Refit"):
        LaplaceActiveSubspaceRegressor.__new__(LaplaceActiveSubspaceRegressor).__setstate__(state)
    # the format of the estimators before their settings objects (format 1, the flat constructor) is refused too,
    # naming the version that made it
    state["_glas_pickle"] = (glas_sklearn.__version__, 1)
    with pytest.raises(ValueError, match=rf"glas-sklearn {re.escape(glas_sklearn.__version__)} \(pickle format 1\)"
                                         r".*not migrated.*Refit"):
        LaplaceActiveSubspaceRegressor.__new__(LaplaceActiveSubspaceRegressor).__setstate__(state)


# ------------------------------------------------------------------------------- large-data rules (issue 28)
@pytest.mark.parametrize("n, expected", [(50, None), (10_000, None), (10_001, 10_000), (40_000, 10_000)])
def test_auto_subsample_builds_the_curvature_on_at_most_10000_rows(n, expected):
    assert auto_subsample(n) == expected


def _adam_by_hand(theta, grads, lr, betas=(0.9, 0.999), eps=1e-8):
    """Adam (Kingma & Ba, Algorithm 1) written out: θ after one update per gradient in ``grads``."""
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g ** 2
        theta = theta - lr * (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps)
    return theta


@pytest.mark.parametrize("fused", [False, True])
def test_the_fused_adam_makes_the_adam_update(fused):
    rng = np.random.default_rng(0)
    theta0, grads = rng.standard_normal(7), rng.standard_normal((5, 7))
    p = torch.nn.Parameter(torch.tensor(theta0))  # a copy: the update is in place
    opt = build_optimizer("adam", [p], lr=0.01, weight_decay=0.0, fused=fused)
    assert isinstance(opt, FusedAdam if fused else torch.optim.Adam)
    for g in grads:
        p.grad = torch.as_tensor(g)
        opt.step()
    eps = torch.finfo(torch.float64).eps
    np.testing.assert_allclose(p.detach().numpy(), _adam_by_hand(theta0, grads, 0.01), rtol=0, atol=100 * eps)


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_the_lean_fused_adam_steps_as_torchs_fused_adam_to_the_last_bit(name):
    """FusedAdam makes torch's own fused update (same kernel, same state): the same weights, bit for bit, over steps
    with weight decay, two parameter groups, a parameter without a gradient and a learning rate changed midway."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    frozen = nn.Parameter(torch.randn(4))  # never gets a gradient: left alone by both
    copies = [copy.deepcopy(net) for _ in range(2)]
    extra = [frozen.detach().clone().requires_grad_() for _ in range(2)]

    def groups(m, e):
        return [{"params": list(m[0].parameters()) + [e], "weight_decay": 0.1}, {"params": list(m[2].parameters())}]

    ours = build_optimizer(name, groups(copies[0], extra[0]), lr=1e-2, weight_decay=0.0, fused=True)
    theirs = _training.OPTIMIZERS[name](groups(copies[1], extra[1]), lr=1e-2, weight_decay=0.0, fused=True)
    assert isinstance(ours, FusedAdam)
    X, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    for step in range(30):
        for m, opt in zip(copies, (ours, theirs), strict=True):
            if step == 15:
                for group in opt.param_groups:
                    group["lr"] = 3e-3
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(m(X[step % 4::4]), y[step % 4::4]).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(copies[0].parameters(), copies[1].parameters(), strict=True))
    assert torch.equal(extra[0], frozen) and torch.equal(extra[1], frozen)
    moved = copies[0][0].weight - net[0].weight
    assert float(moved.detach().abs().max()) > 1e-3


def test_sgd_and_optimizer_classes_are_built_as_given():
    p = torch.nn.Parameter(torch.zeros(3))
    assert type(build_optimizer("sgd", [p], lr=0.1, weight_decay=0.0, fused=True)) is torch.optim.SGD
    opt = build_optimizer(torch.optim.RMSprop, [p], lr=0.1, weight_decay=0.0, fused=True)
    assert type(opt) is torch.optim.RMSprop and opt.defaults["lr"] == 0.1


@pytest.mark.parametrize("n, optimizer, kind", [(120, "adam", FusedAdam), (2300, "adam", FusedAdam),
                                                 (120, torch.optim.Adam, torch.optim.Adam)])
def test_adam_trains_fused_at_every_size_and_a_class_gives_torchs_own(monkeypatch, n, optimizer, kind):
    """"adam" trains with the fused kernel on small and large tables alike; passing the class keeps torch's
    default (for-loop) Adam, one argument away."""
    built = []
    real = optim.build_optimizer
    monkeypatch.setattr(optim, "build_optimizer", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    X, y = _data(n=n)
    LaplaceActiveSubspaceRegressor(**grouped(**{**FAST, "early_stopping": "auto", "max_components": 2}, max_epochs=1,
                                             optimizer=optimizer, calibration_size=0.1)).fit(X, y)
    assert len(built) == (2 if n < 2000 else 1)  # below 2,000 rows a shadow copy trains first
    assert all(type(opt) is kind for opt in built)
    if kind is torch.optim.Adam:
        assert not built[0].defaults["fused"]


def test_subsample_auto_builds_the_curvature_on_10000_of_more_rows(monkeypatch):
    from glas_sklearn import laplace

    seen = []
    real = laplace.GGNOperator
    monkeypatch.setattr(laplace, "GGNOperator", lambda *a, **kw: seen.append(kw["subsample"]) or real(*a, **kw))
    X, y = _data(n=10_101)
    kw = {**FAST, "module_kwargs": dict(hidden_layer_sizes=(4,)), "max_epochs": 1, "max_components": 2}
    est = LaplaceActiveSubspaceRegressor(**grouped(**kw, calibration_size=100)).fit(X, y)  # 10,001 training rows
    assert seen == [10_000] and est.get_params()["posterior__subsample"] == "auto"
    LaplaceActiveSubspaceRegressor(**grouped(**kw, calibration_size=101)).fit(X, y)  # 10,000
    assert seen == [10_000, None]


@pytest.mark.parametrize("weighted", [False, True])
def test_classifier_auto_weight_decay_is_logistic_regressions_prior(weighted):
    """weight_decay="auto": a linear network trained to convergence is scikit-learn's LogisticRegression(C=1) on the
    standardised inputs (the same N(0, 1) prior; with sample_weight, C Σ w ℓ + ‖W‖² / 2 with w normalised to mean
    1), an independent solver."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    n, p, C = 60, 3, 3
    X = rng.normal(size=(n, p)) * [1.0, 3.0, 0.5] + [0.0, 2.0, -1.0]
    y = np.argmax(X @ rng.normal(size=(p, C)) + rng.gumbel(size=(n, C)), axis=1)
    w = rng.uniform(0.5, 2.0, size=n) if weighted else None
    clf = LaplaceActiveSubspaceClassifier(
        nn.Linear(p, C, bias=False),
        training=Training(batch_size=None, lr=0.1, max_epochs=400, early_stopping=False),
        posterior=LowRank(max_components=2), compute=Compute(dtype="float64"), random_state=0,
    ).fit(X, y, sample_weight=w, X_cal=X[:12], y_cal=y[:12])
    Z = (X - clf.x_mean_) / clf.x_scale_
    w = None if w is None else w / w.mean()  # the weights' scale never matters: fit normalises them to mean 1
    ref = LogisticRegression(C=1.0, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(Z, y, sample_weight=w)
    np.testing.assert_allclose(clf.module_.weight.detach().numpy(), ref.coef_, atol=1e-4)  # Adam converged
    # and not the unpenalised fit: the prior moves the weights by far more than that
    free = LogisticRegression(C=1e6, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(Z, y, sample_weight=w)
    assert np.abs(free.coef_ - ref.coef_).max() > 0.05


def _cv_tables(n=90, seed=0):
    """Two label sets on the same rows: one of the sign of x0 x1 (learnable, no noise) and one drawn independently
    of X (nothing to learn: every fit beyond the class shares is overfitting)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    return X, (X[:, 0] * X[:, 1] > 0).astype(int), rng.integers(0, 2, size=n)


def test_weight_decay_cv_follows_the_held_out_loss():
    """weight_decay="cv" picks the weakest prior where the labels are a clean function of X and a stronger one where
    they are noise; the search records one held-out loss per precision, keeps the user's network untouched and
    trains the kept network with c / n (``weight_decay_``)."""
    X, clean, noise = _cv_tables()
    module = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 50), nn.Tanh(), nn.Linear(50, 2))
    before = [p.detach().clone() for p in module.parameters()]
    kw = dict(posterior=LowRank(max_components=2, n_samples=50), calibration_size=10, random_state=0)
    chosen = {}
    for name, labels in (("clean", clean), ("noise", noise)):
        clf = LaplaceActiveSubspaceClassifier(module, training=Training(max_epochs=300, weight_decay="cv"),
                                              **kw).fit(X, labels)
        chosen[name] = clf.weight_decay_ * len(clf.train_indices_)
    assert chosen["clean"] == pytest.approx(_training.CV_PRIOR_PRECISIONS[0])
    assert chosen["noise"] > chosen["clean"] + 1  # a stronger prior where there is nothing to learn
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), before, strict=True))


@pytest.mark.parametrize("batchnorm", [False, True])
def test_cross_validate_decay_against_a_direct_computation(monkeypatch, batchnorm):
    """The search's losses are the folds' held-out cross-entropies, recomputed here from train_module on the same
    folds and initial weights: to a few ulps of the loss, whether the fold networks train together (stacked under
    vmap) or, for a module with BatchNorm's running statistics, one by one."""
    from sklearn.model_selection import StratifiedKFold

    X, clean, _ = _cv_tables(n=60, seed=1)
    Xt, yt = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(clean)
    torch.manual_seed(0)
    middle = [nn.BatchNorm1d(16)] if batchnorm else []
    module = nn.Sequential(nn.Linear(2, 16), *middle, nn.Tanh(), nn.Linear(16, 2))
    likelihood = glas_sklearn.likelihoods.Categorical()
    training = Training(max_epochs=40, weight_decay="cv")
    together = []
    real = loop.run
    monkeypatch.setattr(loop, "run", lambda nets, **kw: together.append(nets.count) or real(nets, **kw))
    search = training.cross_validate_decay(module, Xt, yt, likelihood, seed=3)
    # all nine networks in one run of the loop, or (a module with buffers) one run each
    assert together == ([1] * 9 if batchnorm else [9])
    folds = StratifiedKFold(_training.CV_FOLDS, shuffle=True, random_state=3 + fitting._CV_SPLIT)
    expected = np.zeros(len(_training.CV_PRIOR_PRECISIONS))
    for fit, out in folds.split(X, clean):
        for i, c in enumerate(_training.CV_PRIOR_PRECISIONS):
            net = copy.deepcopy(module)
            _training.train_module(net, Xt[fit], yt[fit], likelihood.loss, optimizer="adam", lr=1e-3,
                                   weight_decay=c / len(fit), batch_size=training.batch_rows(len(fit)),
                                   max_epochs=40, seed=3)
            with torch.no_grad():
                expected[i] += float(nn.functional.cross_entropy(net(Xt[out]), yt[out], reduction="sum"))
    expected /= len(X)
    tol = 50 * np.finfo(np.float32).eps * max(1.0, float(np.max(expected)))
    np.testing.assert_allclose(search["losses"], expected, rtol=0, atol=tol)
    assert search["chosen"] == _training.CV_PRIOR_PRECISIONS[int(np.argmin(expected))]
    with pytest.raises(ValueError, match=r"weight_decay='cv' needs at least 6 training rows"):
        training.cross_validate_decay(module, Xt[:5], yt[:5], likelihood, seed=0)


def test_weight_decay_cv_in_the_regressor(caplog):
    """The regressor's "cv" chooses by the held-out Gaussian loss and reports the choice on the training line."""
    X, y = _data(n=120)
    reg = LaplaceActiveSubspaceRegressor(**grouped(max_epochs=30, weight_decay="cv", likelihood="gaussian",
                                                   max_components=2, random_state=0))
    with caplog.at_level(logging.INFO, logger="glas_sklearn"):
        reg.fit(X, y)
    assert re.search(r"weight decay (1|3|10) / n by 3-fold cross-validation", caplog.text)
    c = reg.weight_decay_ * len(reg.train_indices_)
    assert any(c == pytest.approx(p) for p in _training.CV_PRIOR_PRECISIONS)


def test_auto_weight_decay_by_estimator(monkeypatch):
    """weight_decay="auto" resolves to 1 / n (the rows trained on, or the sum of their weights normalised to mean 1)
    for the classifier, to 0 for the regressor; a number is used as given; the optimizer is built with the resolved
    value."""
    assert _training.prior_weight_decay(400) == pytest.approx(1 / 400)
    assert _training.prior_weight_decay(100, prior_std=0.5) == pytest.approx(4 / 100)
    assert Training().weight_decay == "auto"
    assert Training().decay(250, 1.0) == pytest.approx(1 / 250)
    assert Training().decay(250, None) == 0.0
    assert Training(weight_decay=0.0).decay(250, 1.0) == 0.0
    assert Training(weight_decay=1e-3).decay(250, None) == 1e-3
    seen = []
    real = optim.build_optimizer
    monkeypatch.setattr(optim, "build_optimizer", decays_recorded(seen, real))
    X, y = _data(n=60)
    labels = (y > np.median(y)).astype(int)
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=len(y))
    kw = dict(training=Training(max_epochs=1, early_stopping=False), posterior=LowRank(max_components=2),
              calibration_size=20, random_state=0)
    clf = LaplaceActiveSubspaceClassifier(**kw).fit(X, labels)
    # n_networks="auto": three networks, trained together (one optimizer, one group of their stacked weights)
    assert seen == [pytest.approx(1 / len(clf.train_indices_))]
    clf = LaplaceActiveSubspaceClassifier(**kw).fit(X, labels, sample_weight=w)
    assert seen[-1] == pytest.approx(1 / (w / w.mean())[clf.train_indices_].sum())  # weights normalised to mean 1
    LaplaceActiveSubspaceClassifier(**{**kw, "training": Training(max_epochs=1, weight_decay=0.0,
                                                                  early_stopping=False)}).fit(X, labels)
    reg = LaplaceActiveSubspaceRegressor(**{**kw, "likelihood": "gaussian"}).fit(X, y)
    assert seen[-2:] == [0.0, 0.0] and reg.get_params()["training__weight_decay"] == "auto"
    with pytest.raises(ValueError, match=r"weight_decay must be 'auto', 'cv' or a finite float >= 0, got 'map'"):
        LaplaceActiveSubspaceClassifier(training=Training(weight_decay="map")).fit(X, labels)


def test_a_group_mixing_dtypes_gets_torchs_own_fused_adam():
    """FusedAdam calls one kernel per group, so a group mixing float32 and float64 weights goes to torch's fused
    optimizer, which splits it by dtype itself; the update is Adam's on both."""
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = build_optimizer("adam", [a, b], lr=0.1, weight_decay=0.0, fused=True)
    assert type(opt) is torch.optim.Adam and opt.defaults["fused"]
    a.grad, b.grad = torch.ones(3), -torch.ones(2, dtype=torch.float64)
    opt.step()
    # Adam's first step: lr · g / (|g| + eps), eps = 1e-8
    np.testing.assert_allclose(a.detach(), -0.1 / (1 + 1e-8), rtol=10 * np.finfo(np.float32).eps)
    np.testing.assert_allclose(b.detach(), 0.1 / (1 + 1e-8), rtol=10 * np.finfo(np.float64).eps)


def test_shadow_network_follows_the_learning_rate_schedule_its_copy_had(monkeypatch):
    """With a schedule, the network stopped at the copy's best epoch took each step at the rate the copy took it:
    both schedules span the copy's max_epochs, not the network's shorter run."""
    seen = []
    real = optim.lr_factor
    monkeypatch.setattr(optim, "lr_factor",
                        lambda sched, step, total: seen.append(total) or real(sched, step, total))
    X, y = _data(n=200)
    est = LaplaceActiveSubspaceRegressor(**grouped(**{**FAST, "early_stopping": "shadow", "max_components": 2},
                                                   max_epochs=40, schedule="warmup_cosine", lr=0.01)).fit(X, y)
    n_train = len(est.train_indices_)
    n_copy = n_train - len(est.validation_indices_)
    assert est.n_iter_ < 40  # the network stopped before the schedule's end, so the check below can fail
    assert set(seen) == {40 * len(_training.batch_slices(n, _training.auto_batch_size(n))) for n in (n_copy, n_train)}


@pytest.mark.parametrize("n", [150, 2999])
def test_weight_decay_cv_folds_train_without_shadow_copies_of_their_own(monkeypatch, n):
    """With weight_decay="cv", each fold network trains as its size says without a shadow copy of its own (one by one
    for a module with buffers): 150 rows, every fold plainly and the kept network after its copy; 2,999 rows, folds
    of 1,999 / 1,999 / 2,000 rows, plainly or on held-out rows, and the kept network on held-out rows."""
    descs = []
    real = loop.run
    monkeypatch.setattr(loop, "run", lambda nets, **kw: descs.append(kw.get("desc")) or real(nets, **kw))
    X, y = _data(n=n + 20)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    kw = {**FAST, "early_stopping": "auto", "max_components": 2, "n_samples": 10}
    est = LaplaceActiveSubspaceRegressor(module=net, **grouped(**kw, max_epochs=2, weight_decay="cv"))
    est.fit(X[:n], y[:n], X_cal=X[n:], y_cal=y[n:])
    n_cv = 3 * len(_training.CV_PRIOR_PRECISIONS)
    kept = ["training (shadow copy)", "training"] if n < 2000 else ["training"]
    assert descs == ["training"] * n_cv + kept
    assert (len(est.validation_indices_) == int(np.ceil((0.2 if n < 2000 else 0.1) * n)))


def test_clip_grad_norm_scales_each_networks_gradient_to_the_norm():
    """``clip_grad_norm``: one full-batch SGD step moves the weights by -lr · g · min(1, c / (‖g‖ + 1e-6)) (torch's
    clip_grad_norm_ adds 1e-6), g the gradient
    computed here by autograd on a copy; networks trained together are clipped each by its own norm (one network's
    step is the step it takes alone, though the stacked gradient's norm is larger)."""
    torch.manual_seed(0)
    X, y = torch.randn(30, 3, dtype=torch.float64), torch.randint(0, 2, (30,))
    nets = [nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double() for _ in range(2)]
    lr, clip = 0.5, 0.01
    expected = []
    for net in nets:
        ref = copy.deepcopy(net)
        nn.functional.cross_entropy(ref(X), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
        assert float(g.norm()) > 2 * clip  # the clip binds, so the check below can fail
        start = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        expected.append(start - lr * g * clip / (g.norm() + 1e-6))
    alone = copy.deepcopy(nets[0])
    train_module(alone, X, y, nn.functional.cross_entropy, optimizer="sgd", lr=lr, weight_decay=0.0,
                 batch_size=None, max_epochs=1, seed=0, clip_grad_norm=clip)
    got = torch.cat([p.detach().reshape(-1) for p in alone.parameters()])
    np.testing.assert_allclose(got, expected[0], rtol=0, atol=1e-12)
    trained, _ = _training.train_stacked(nets, X, y, nn.functional.cross_entropy, row_sets=[np.arange(30)] * 2,
                                         build=lambda g: build_optimizer("sgd", g, lr=lr, weight_decay=0.0),
                                         weight_decays=[0.0, 0.0], batch_size=None, max_epochs=1, seed=0,
                                         clip_grad_norm=clip)
    for net, want in zip(trained, expected, strict=True):
        np.testing.assert_allclose(torch.cat([p.detach().reshape(-1) for p in net.parameters()]), want, rtol=0,
                                   atol=1e-12)


def test_clip_grad_norm_reaches_the_loop_from_the_estimator(monkeypatch):
    """``training__clip_grad_norm`` is a parameter of the estimator (get_params / set_params), checked, and given to
    every run of the training loop; None by default."""
    seen = []
    real = loop.run
    monkeypatch.setattr(loop, "run", lambda nets, **kw: seen.append(kw["clip_grad_norm"]) or real(nets, **kw))
    X, y = _data(n=60)
    reg = LaplaceActiveSubspaceRegressor(**grouped(**FAST, max_epochs=2))
    assert reg.get_params()["training__clip_grad_norm"] is None
    reg.set_params(training__clip_grad_norm=1.5).fit(X, y)
    assert seen == [1.5]
    with pytest.raises(ValueError, match="clip_grad_norm"):
        LaplaceActiveSubspaceRegressor(**grouped(**FAST, clip_grad_norm=-1.0)).fit(X, y)
