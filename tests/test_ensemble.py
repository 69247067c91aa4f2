"""Ensembles (``Training(n_networks=K)``, :class:`~glas_sklearn.ensemble.NetworkEnsemble`): the combined output
against its closed form, the curvature of the combined network against a dense GGN, the first network equal to
the one ``n_networks=1`` trains, members trained from their own seeds, the user's module untouched, the
estimators' predictions against the members' own outputs, and the errors."""

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import glas_sklearn
from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, Training
from glas_sklearn.ensemble import NetworkEnsemble
from glas_sklearn.estimators import _training
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.likelihoods import HeteroscedasticGaussian
from glas_sklearn.training import CV_PRIOR_PRECISIONS, optim
from tests.reference import decays_recorded, dense_ggn, grouped, mlp

FAST = dict(max_epochs=30, max_components=6, random_state=0, dtype="float64")


def _blobs(n, seed):
    rng = np.random.default_rng(seed)
    lab = rng.integers(0, 3, n)
    X = np.array([[0.0, 0.0], [1.5, 0.0], [0.0, 1.5]])[lab] + 0.7 * rng.standard_normal((n, 2))
    return X, lab


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_combined_output_against_its_closed_form():
    torch.manual_seed(0)
    nets = [mlp(3, 4, 5, seed=s) for s in range(3)]
    x = torch.randn(7, 3, dtype=torch.float64)
    outs = torch.stack([n(x) for n in nets]).detach().numpy()
    probs = NetworkEnsemble(nets, combine="log_mean_softmax")(x).detach().softmax(-1).numpy()
    np.testing.assert_allclose(probs, _softmax(outs).mean(0), rtol=1e-12)
    mean = NetworkEnsemble(nets)(x).detach().numpy()
    np.testing.assert_allclose(mean, outs.mean(0), rtol=1e-12)
    assert [name for name, _ in NetworkEnsemble(nets).named_parameters()][:2] == ["members.0.0.weight",
                                                                                "members.0.0.bias"]
    with pytest.raises(ValueError, match="combine must be one of"):
        NetworkEnsemble(nets, combine="median")
    with pytest.raises(TypeError, match="non-empty sequence"):
        NetworkEnsemble([])
    with pytest.raises(ValueError, match="differ in shape"):
        NetworkEnsemble([mlp(3, 4, 5), mlp(3, 4, 2)])(x)


@pytest.mark.parametrize("loss,combine", [("mse", "mean"), ("cross_entropy", "log_mean_softmax")])
def test_curvature_of_the_combined_network_against_a_dense_ggn(loss, combine):
    """The matrix-free GGN of the ensemble, over all its members' weights, equals the dense J_nᵀ H_n J_n of the
    combined output (members coupled through H_n for the softmax of the mean probabilities)."""
    nets = [mlp(2, 3, 3, seed=s) for s in range(2)]
    ens = NetworkEnsemble(nets, combine=combine)
    x = torch.randn(9, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    G = dense_ggn(ens, x, loss="mse" if loss == "mse" else "ce")
    op = GGNOperator(ens, x, loss=loss).to_scipy()
    D = G.shape[0]
    assert op.shape == (D, D) and D == sum(p.numel() for n in nets for p in n.parameters())
    dense_from_products = op.matmat(np.eye(D))
    np.testing.assert_allclose(dense_from_products, G.numpy(), rtol=1e-10, atol=1e-12)
    if combine == "log_mean_softmax":  # the members' blocks couple: not block-diagonal
        d0 = sum(p.numel() for p in nets[0].parameters())
        assert np.abs(G.numpy()[:d0, d0:]).max() > 1e-6


def test_classifier_ensemble_first_network_is_the_single_one_and_probabilities_average():
    X, y = _blobs(150, 0)
    one = LaplaceActiveSubspaceClassifier(**grouped(**FAST, n_networks=1), sigma0=0.0).fit(X, y)
    three = LaplaceActiveSubspaceClassifier(**grouped(**FAST, n_networks=3), sigma0=0.0).fit(X, y)
    assert isinstance(three.module_, NetworkEnsemble) and len(three.module_.members) == 3
    assert not isinstance(one.module_, NetworkEnsemble)
    first = three.module_.members[0]
    # the same seeds and steps as the network n_networks=1 trains, its products batched with the others': equal
    # up to float64 rounding amplified over the steps
    eps = np.finfo(np.float64).eps
    for (name, a), (_, b) in zip(one.module_.named_parameters(), first.named_parameters(), strict=True):
        scale = max(1.0, float(a.detach().abs().max()))
        np.testing.assert_allclose(b.detach(), a.detach(), rtol=0, atol=1e4 * eps * scale, err_msg=name)
    weights = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in three.module_.members]
    assert all(not torch.allclose(weights[i], weights[j]) for i in range(3) for j in range(i + 1, 3))
    # σ0 = 0: the mean of the members' own softmax probabilities
    Z = torch.as_tensor((X - three.x_mean_) / three.x_scale_)
    with torch.no_grad():
        members = np.stack([_softmax(m(Z).numpy()) for m in three.module_.members])
    np.testing.assert_allclose(three.predict_proba(X), members.mean(0), rtol=1e-9, atol=1e-12)
    # the posterior covers all the weights; the record is the first network's, its time all of them
    assert three.n_weights_ == 3 * one.n_weights_
    assert three.n_iter_ == one.n_iter_ and three.timings_["training"] > 0


@pytest.mark.parametrize("early_stopping", [False, True, "shadow"])
@pytest.mark.parametrize("weighted", [False, True])
def test_networks_trained_together_are_the_networks_trained_one_by_one(early_stopping, weighted, caplog):
    """Training.fit_together (the members in the same optimizer steps, their products batched) against
    Training.fit of each member alone from the same initial weights and seed: the same validation rows, epochs,
    epoch kept, stop reason and log line, and weights equal up to float64 rounding amplified over the steps;
    the lowest held-out loss to a few ulps. With a shadow copy each network trains for its own copy's epochs, its
    learning-rate schedule spanning the copy's."""
    X, y = _blobs(90, 2)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    w = torch.as_tensor(np.random.default_rng(0).uniform(0.3, 2.0, len(y))) if weighted else None
    likelihood = glas_sklearn.likelihoods.Categorical()
    schedule = "warmup_cosine" if early_stopping == "shadow" else "constant"  # the copies' schedule spans 150
    training = Training(max_epochs=150, lr=0.03, early_stopping=early_stopping, n_iter_no_change=1, weight_decay=0.0,
                        schedule=schedule)
    seeds = [_training.member_seed(5, k) for k in range(3)]
    nets = [mlp(2, 16, 3, seed=s) for s in seeds]
    alone = [copy.deepcopy(n) for n in nets]
    owners = [f"net {k}" for k in range(3)]
    with caplog.at_level("INFO", logger="glas_sklearn"):
        together = training.fit_together(nets, Xt, yt, likelihood, seeds=seeds, owners=owners, sample_weight=w)
    lines_together = [r.getMessage() for r in caplog.records if "training stopped" in r.getMessage()]
    caplog.clear()
    with caplog.at_level("INFO", logger="glas_sklearn"):
        one_by_one = [training.fit(n, Xt, yt, likelihood, seed=s, owner=o, sample_weight=w)
                      for n, s, o in zip(alone, seeds, owners, strict=True)]
    lines_alone = [r.getMessage() for r in caplog.records if "training stopped" in r.getMessage()]
    assert sorted(lines_together) == sorted(lines_alone)
    assert len(lines_alone) == (6 if early_stopping == "shadow" else 3)
    eps = np.finfo(np.float64).eps
    for a, b, ra, rb in zip(nets, alone, together, one_by_one, strict=True):
        assert (ra.n_iter, ra.best_epoch, ra.shadow_epochs, ra.stop_reason) == (rb.n_iter, rb.best_epoch,
                                                                                rb.shadow_epochs, rb.stop_reason)
        if rb.validation_indices is None:
            assert ra.validation_indices is None
        else:
            np.testing.assert_array_equal(ra.validation_indices, rb.validation_indices)
            np.testing.assert_allclose(ra.validation_scores, rb.validation_scores, rtol=1e3 * eps)
        np.testing.assert_allclose(ra.loss_curve, rb.loss_curve, rtol=1e3 * eps)
        assert ra.weight_decay == rb.weight_decay and not a.training
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            scale = max(1.0, float(q.detach().abs().max()))
            np.testing.assert_allclose(p.detach(), q.detach(), rtol=0, atol=1e4 * eps * scale)
    if early_stopping == "shadow":  # each network its own copy's epochs
        assert len({r.n_iter for r in one_by_one}) > 1
    weights = [torch.cat([p.detach().reshape(-1) for p in n.parameters()]) for n in nets]
    assert not torch.allclose(weights[0], weights[1])


def test_networks_that_do_not_stack_train_one_by_one():
    """A module that is not a stack of linear layers is left to Training.fit (None, nothing trained); the
    estimator then trains its members one after another."""
    X, y = _blobs(60, 3)
    nets = [_WithBareWeight().double() for _ in range(2)]
    before = [copy.deepcopy(n) for n in nets]
    got = Training(max_epochs=5).fit_together(nets, torch.as_tensor(X), torch.as_tensor(y),
                                              glas_sklearn.likelihoods.Categorical(), seeds=[0, 1], owners=["a", "b"])
    assert got is None
    assert all(torch.equal(p, q) for n, m in zip(nets, before, strict=True)
               for p, q in zip(n.parameters(), m.parameters(), strict=True))
    clf = LaplaceActiveSubspaceClassifier(**grouped(**(FAST | {"max_epochs": 400}), module=_WithBareWeight,
                                                   n_networks=2)).fit(X, y)
    assert len(clf.module_.members) == 2 and clf.score(X, y) > 0.6


def test_n_networks_auto_and_the_training_line(caplog):
    t = Training()
    assert t.networks(1999, classification=True) == 3 and t.networks(2000, classification=True) == 1
    assert t.networks(100, classification=False) == 1 and Training(n_networks=4).networks(10, False) == 4
    X, y = _blobs(120, 1)
    with caplog.at_level("INFO", logger="glas_sklearn"):
        clf = LaplaceActiveSubspaceClassifier(**grouped(**FAST)).fit(X, y)
    assert len(clf.module_.members) == 3
    assert any("training: 3 networks of" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="n_networks must be"):
        LaplaceActiveSubspaceClassifier(**grouped(**FAST, n_networks=0)).fit(X, y)


class _WithBareWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 5), nn.Tanh(), nn.Linear(5, 3))
        self.offset = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return self.body(x) + self.offset


def test_an_instance_trains_one_network_unless_asked_and_frozen_layers_keep_their_weights():
    """n_networks="auto" trains one network from a module instance (its weights may be pretrained); asked for
    more, the copies after the first are re-initialised except their frozen layers."""
    X, y = _blobs(120, 4)
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    net[0].requires_grad_(False)  # a frozen "backbone"
    one = LaplaceActiveSubspaceClassifier(**grouped(**FAST, module=net)).fit(X, y)
    assert not isinstance(one.module_, NetworkEnsemble)
    two = LaplaceActiveSubspaceClassifier(**grouped(**FAST, module=net, n_networks=2)).fit(X, y)
    a, b = two.module_.members
    for member in (a, b):
        assert torch.equal(member[0].weight, net[0].weight) and torch.equal(member[0].bias, net[0].bias)
    assert not torch.allclose(a[2].weight, b[2].weight)


def test_a_prefit_ensemble_warns_when_its_outputs_are_combined_unlike_the_likelihood():
    X, y = _blobs(120, 5)
    X_cal, y_cal = _blobs(40, 6)
    nets = [mlp(2, 5, 3, seed=s) for s in range(2)]
    settings = {k: v for k, v in FAST.items() if k != "max_epochs"}
    with pytest.warns(UserWarning, match="combines its members' outputs by 'mean'.*'log_mean_softmax'"):
        LaplaceActiveSubspaceClassifier(**grouped(**settings, module=NetworkEnsemble(nets), prefit=True)).fit(
            X, y, X_cal=X_cal, y_cal=y_cal)
    with warnings.catch_warnings():  # combined as the likelihood combines: no warning
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", glas_sklearn.PrefitUnderfitWarning)  # untrained members serve here
        LaplaceActiveSubspaceClassifier(**grouped(**settings, module=NetworkEnsemble(nets, "log_mean_softmax"),
                                                  prefit=True)).fit(X, y, X_cal=X_cal, y_cal=y_cal)


def test_a_user_instance_is_copied_and_each_further_copy_reinitialised():
    X, y = _blobs(120, 2)
    torch.manual_seed(5)
    net = _WithBareWeight().double()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.warns(UserWarning, match="no layer resets offset"):
        clf = LaplaceActiveSubspaceClassifier(**grouped(**FAST, module=net, n_networks=2)).fit(X, y)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # the user's module untouched
    a, b = clf.module_.members
    assert a is not net and b is not net
    assert not torch.allclose(a.body[0].weight, b.body[0].weight)


def test_regressor_ensemble_mean_and_the_variance_head_refused():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (160, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(160)
    reg = LaplaceActiveSubspaceRegressor(**grouped(**FAST, likelihood="gaussian", n_networks=2)).fit(X, y)
    assert isinstance(reg.module_, NetworkEnsemble) and reg.module_.combine == "mean"
    Z = torch.as_tensor((X - reg.x_mean_) / reg.x_scale_)
    with torch.no_grad():
        outs = np.stack([m(Z).numpy()[:, 0] for m in reg.module_.members])
    pred = reg.predict(X)

    def affine_residual(f):  # the targets are standardised for training: predictions are a·f + b
        A = np.c_[f, np.ones_like(f)]
        return np.abs(A @ np.linalg.lstsq(A, pred, rcond=None)[0] - pred).max()

    assert affine_residual(outs.mean(0)) < 1e-9 * np.abs(pred).max()
    assert affine_residual(outs[0]) > 1e-4  # one member is not the prediction
    y_pis = reg.predict_interval(X)[1]
    assert y_pis.shape == (160, 2, 1) and np.all(y_pis[:, 1, 0] > y_pis[:, 0, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="n_networks=2 trains an ensemble.*cannot be averaged"):
            LaplaceActiveSubspaceRegressor(**grouped(**FAST, likelihood=HeteroscedasticGaussian(),
                                                     n_networks=2)).fit(X, y)


def test_weight_decay_cv_is_chosen_once_for_the_whole_ensemble(monkeypatch):
    """weight_decay="cv": the first network's cross-validation chooses the prior; the others train under it
    (the same decay c / n on the same rows), without searching again."""
    calls, decays = [], []
    real_search, real_build = Training.cross_validate_decay, optim.build_optimizer
    monkeypatch.setattr(Training, "cross_validate_decay",
                        lambda self, *a, **kw: calls.append(1) or real_search(self, *a, **kw))
    X, y = _blobs(120, 3)
    clf = LaplaceActiveSubspaceClassifier(**grouped(**FAST, n_networks=2, weight_decay="cv"))
    monkeypatch.setattr(optim, "build_optimizer", decays_recorded(decays, real_build))
    clf.fit(X, y)
    assert len(calls) == 1
    n = len(clf.train_indices_)
    c = clf.weight_decay_ * n  # the chosen prior precision
    assert min(abs(c - p) for p in CV_PRIOR_PRECISIONS) < 1e-9
    # the last two optimizers: the networks' shadow copies (a fifth held out) and the networks, trained together,
    # c / rows each
    n_copy = n - int(np.ceil(0.2 * n))
    assert decays[-2:] == [pytest.approx(c / n_copy, rel=1e-12), pytest.approx(c / n, rel=1e-12)]


class _Recorder(nn.Module):
    """A small MLP that keeps every input it is called with in training mode."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 3))
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        if self.training:
            self.seen.append(x.detach().clone())
        return self.body(x)


def test_every_network_trains_on_the_training_rows_only():
    """The networks of an ensemble built from a module class see, in training mode, only rows of
    X[train_indices_] (their shadow copies some of them), never a calibration row."""
    X, y = _blobs(150, 7)
    clf = LaplaceActiveSubspaceClassifier(**grouped(**FAST, module=_Recorder, standardize=False)).fit(X, y)
    assert len(clf.module_.members) == 3  # n_networks="auto" builds three from a class on a small table
    train = {tuple(r) for r in X[clf.train_indices_].tolist()}
    cal = {tuple(r) for r in X[clf.calibration_indices_].tolist()}
    for member in clf.module_.members:
        rows = {tuple(r) for r in torch.cat(member.seen).numpy().tolist()}
        assert rows == train and not rows & cal
