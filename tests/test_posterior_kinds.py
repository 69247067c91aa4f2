"""Posterior kinds as classes: a user-defined kind end to end (against dense matrices), the string and class
spellings of the built-in kinds, resolve_posterior, and pickling of every kind."""

import math
import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone

from glas_sklearn import Compute, LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor, Training
from glas_sklearn.laplace import fit_laplace_subspace
from glas_sklearn.posterior import (
    POSTERIOR_KINDS,
    ActiveSubspacePosterior,
    LowRankDiagPosterior,
    LowRankPosterior,
    SubspacePosterior,
    resolve_posterior,
    trace_condition,
)
from tests.reference import grouped

from .reference import dense_ggn, dense_jacobian, flat_params, mlp

BETA = 40.0
K = 6


class ShrunkComplementPosterior(ActiveSubspacePosterior):
    """A user's kind: Σ = P diag(σ_j²) Pᵀ + τ σ0² (I − P Pᵀ), the prior's variance off span(P) shrunk by τ."""

    tau = 0.25
    default_sigma0 = "eb_full"
    default_predictive = "linearized"
    off_subspace = True

    def _perturbations_from_draws(self, z, eps):
        P = self.eigenvectors[:, :z.shape[1]]
        return self.perturbations(z) + math.sqrt(self.tau) * self.fit_sigma0(z.shape[1]) * (eps - (eps @ P) @ P.T)

    def _trace_condition(self, d):
        blam = self.beta * self.eigenvalues[:d].double().cpu().numpy()

        def trace(alpha):
            return float(np.sum(1.0 / (blam + alpha))) + self.tau * (self.n_weights - d) / alpha

        return trace_condition(trace, self.n_weights, float(self.theta0.double() @ self.theta0.double()), d)

    def _output_covariance(self, X, jp, d, full_cov, batch_size):
        jp = jp.to(torch.float64)
        var = self.variances(d).to(torch.float64)
        comp_var = self.tau * self.fit_sigma0(d) ** 2
        gram = self.jacobian_gram(X, full_cov=full_cov, batch_size=batch_size)
        if not full_cov:
            return ((jp**2 * var).sum(-1) + comp_var * (gram - (jp**2).sum(-1))).to(self.dtype)
        return ((jp * var) @ jp.transpose(-1, -2) + comp_var * (gram - jp @ jp.transpose(-1, -2))).to(self.dtype)


class FullComplementPosterior(ShrunkComplementPosterior):
    """τ = 1: the same Σ and draws as the built-in "low_rank" kind, reached through the user's hooks."""

    tau = 1.0


def _dense_sigma(post, d, tau):
    P = post.eigenvectors[:, :d].to(torch.float64)
    D = P.shape[0]
    return (P * post.variances(d).double()) @ P.T + tau * post.fit_sigma0(d) ** 2 * (torch.eye(D, dtype=torch.float64)
                                                                                      - P @ P.T)


@pytest.fixture(scope="module")
def setup():
    net = mlp(n_out=2, seed=3)
    X = torch.randn(25, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    lam, V = torch.linalg.eigh(dense_ggn(net, X))
    return net, X, lam.flip(0)[:K].clamp_min(0), V.flip(1)[:, :K]


def test_user_kind_against_dense_covariance(setup):
    """σ0 solves the kind's own trace condition, J Σ Jᵀ and the sample covariance are those of the dense Σ."""
    net, X, lam, P = setup
    post = ShrunkComplementPosterior(net, lam, P, beta=BETA)
    assert post.posterior == "ShrunkComplementPosterior" and post.sigma0_method == "eb_full"
    theta_sq = float(flat_params(net) @ flat_params(net))
    J = dense_jacobian(net, X)  # (n, M, D)
    for d in (2, 5):
        Sigma = _dense_sigma(post, d, ShrunkComplementPosterior.tau)
        assert float(torch.trace(Sigma)) == pytest.approx(theta_sq, rel=1e-9)
        full = J @ Sigma @ J.transpose(1, 2)
        torch.testing.assert_close(post.linearized_variance(X, d, full_cov=True), full, rtol=1e-9, atol=1e-13)
        torch.testing.assert_close(post.linearized_variance(X, d), torch.diagonal(full, dim1=1, dim2=2),
                                   rtol=1e-9, atol=1e-13)
    # draws: E‖Σ̂ − Σ‖_F² = (tr(Σ)² + tr(Σ²)) / S for Gaussian draws (mean known, 0)
    d, S = 3, 4000
    Sigma = _dense_sigma(post, d, ShrunkComplementPosterior.tau)
    delta = post.sample_perturbations(S, d, random_state=0)
    err = float(torch.linalg.matrix_norm(delta.T @ delta / S - Sigma))
    rms = math.sqrt((float(torch.trace(Sigma)) ** 2 + float(torch.trace(Sigma @ Sigma))) / S)
    assert err < 4 * rms
    wrong = _dense_sigma(post, d, 1.0)  # the low-rank kind's Σ at the same σ0: clearly rejected
    assert float(torch.linalg.matrix_norm(delta.T @ delta / S - wrong)) > 4 * rms
    # the linearised draws are f(x; θ0) + J δ at the same δ
    lin = post.linearized_samples(X, d, n_samples=5, random_state=1)
    delta5 = post.sample_perturbations(5, d, random_state=1)
    torch.testing.assert_close(lin, net(X).detach() + torch.einsum("nmd,sd->snm", J, delta5), rtol=1e-10, atol=1e-12)
    # predict_samples goes through the kind's perturbations (θ0 + δ)
    out = post.predict_samples(X[:4], d, n_samples=5, random_state=1)
    ref = torch.stack([torch.func.functional_call(net, post.layout.unflatten(post.theta0 + dl), (X[:4],))
                       for dl in delta5])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_user_kind_through_fit_laplace_subspace_and_an_estimator(setup):
    net, X, _, _ = setup
    y = torch.sin(X[:, :2]) + 0.1
    kw = dict(n_components=4, eigen_method="eigsh", tol=1e-10, random_state=0)
    fitted = fit_laplace_subspace(net, X, y, posterior=ShrunkComplementPosterior, **kw)
    post = fitted.posterior
    assert type(post) is ShrunkComplementPosterior and "ggn_diagonal" not in fitted.timings
    J = dense_jacobian(net, X)
    Sigma = _dense_sigma(post, 4, ShrunkComplementPosterior.tau)
    torch.testing.assert_close(post.linearized_variance(X, 4, full_cov=True), J @ Sigma @ J.transpose(1, 2),
                               rtol=1e-9, atol=1e-13)

    rng = np.random.default_rng(0)
    Xr = rng.uniform(-1, 1, size=(80, 2))
    yr = np.sin(3 * Xr[:, 0]) + 0.1 * rng.standard_normal(80)
    est = LaplaceActiveSubspaceRegressor(posterior=ShrunkComplementPosterior, calibration="coverage", n_components=3,
                                         random_state=0,
                                         training=Training(standardize=False,
                                                           module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30,
                                                           lr=0.05, batch_size=None), compute=Compute(dtype="float64"))
    assert clone(est).get_params()["posterior"] is ShrunkComplementPosterior
    est.fit(Xr, yr)
    post = est.posterior_
    assert type(post) is ShrunkComplementPosterior and est.predictive_.name == "linearized"
    assert post.sigma0 == "eb_subspace"  # "auto" on a kind off the subspace: the regressor's own choice
    Xt = torch.as_tensor(Xr[:9])
    Jr = dense_jacobian(est.module_, Xt)  # (9, 1, D)
    Sigma = _dense_sigma(post, 3, ShrunkComplementPosterior.tau)
    _, std = est.predict(Xr[:9], return_std=True)
    np.testing.assert_allclose(std**2, (Jr @ Sigma @ Jr.transpose(1, 2))[:, 0, 0].numpy(), rtol=1e-8, atol=1e-14)
    draws = est.sample_y(Xr[:4], n_samples=3)  # linearised draws for a kind off the subspace
    assert draws.shape == (4, 3) and np.all(np.isfinite(draws))


def test_user_kind_with_the_low_rank_sigma_reproduces_the_built_in_kind(setup):
    """τ = 1 through the user's hooks (its own trace condition and bracket) equals "low_rank" to round-off."""
    net, X, lam, P = setup
    mine = FullComplementPosterior(net, lam, P, beta=BETA)
    ref = LowRankPosterior(net, lam, P, beta=BETA)
    for d in (1, 4, K):
        assert mine.fit_sigma0(d) == pytest.approx(ref.fit_sigma0(d), rel=1e-10)
        torch.testing.assert_close(mine.linearized_variance(X, d), ref.linearized_variance(X, d), rtol=1e-9, atol=0)
    torch.testing.assert_close(mine.sample_perturbations(6, 3, random_state=2),
                               ref.sample_perturbations(6, 3, random_state=2), rtol=1e-9, atol=1e-14)


def _posterior_inputs(setup, kind):
    net, X, lam, P = setup
    extra = {"ggn_diagonal": torch.diagonal(dense_ggn(net, X)).clone()} if kind.needs_ggn_diagonal else {}
    return (net, lam, P), dict(beta=BETA, **extra)


def _outputs(post, X):
    return (post.fit_sigma0(3), post.linearized_variance(X, 3), post.predict_samples(X, 3, n_samples=4, random_state=0),
            post.sample_perturbations(4, 2, random_state=1))


def _assert_same(a, b):
    assert a[0] == b[0]
    for x, y in zip(a[1:], b[1:], strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name", sorted(POSTERIOR_KINDS))
def test_string_and_class_spellings_give_the_same_posterior(setup, name):
    X = setup[1]
    kind = POSTERIOR_KINDS[name]
    args, kw = _posterior_inputs(setup, kind)
    by_name = ActiveSubspacePosterior(*args, posterior=name, **kw)
    assert type(by_name) is kind and by_name.posterior == name and isinstance(by_name, ActiveSubspacePosterior)
    reference = _outputs(by_name, X)
    for other in (kind(*args, **kw), kind(*args, posterior=name, **kw),
                  ActiveSubspacePosterior(*args, posterior=kind, **kw)):
        assert type(other) is kind
        _assert_same(_outputs(other, X), reference)
    # through fit_laplace_subspace
    kw_fit = dict(n_components=4, eigen_method="eigsh", tol=1e-10, random_state=0, posterior=name)
    y = torch.sin(X[:, :2])
    a = fit_laplace_subspace(setup[0], X, y, **kw_fit).posterior
    b = fit_laplace_subspace(setup[0], X, y, **{**kw_fit, "posterior": kind}).posterior
    assert type(a) is type(b) is kind
    _assert_same(_outputs(a, X), _outputs(b, X))


@pytest.mark.parametrize("name", sorted(POSTERIOR_KINDS))
def test_estimators_take_the_name_or_the_class(name):
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(70, 2))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(70)
    kw = dict(module_kwargs=dict(hidden_layer_sizes=(6,)), max_epochs=20, lr=0.05, batch_size=None, n_samples=30,
              max_components=3, dtype="float64", random_state=0)
    a = LaplaceActiveSubspaceRegressor(**grouped(posterior=name, **kw)).fit(X, y)
    b = LaplaceActiveSubspaceRegressor(**grouped(posterior=POSTERIOR_KINDS[name], **kw)).fit(X, y)
    assert type(a.posterior_) is type(b.posterior_) is POSTERIOR_KINDS[name] and a.predictive_ == b.predictive_
    assert a.posterior_.sigma0 == b.posterior_.sigma0
    for u, v in zip(a.predict_interval(X[:8], confidence_level=[0.5, 0.9]),
                    b.predict_interval(X[:8], confidence_level=[0.5, 0.9]), strict=True):
        np.testing.assert_array_equal(u, v)
    if name == "low_rank":  # the classifier's "auto" σ0 ("nll" for kinds off the subspace) either way
        Xc = np.vstack([rng.normal(-1.5, 0.5, (30, 2)), rng.normal(1.5, 0.5, (30, 2))])
        yc = np.repeat([0, 1], 30)
        c1 = LaplaceActiveSubspaceClassifier(**grouped(posterior=name, **kw)).fit(Xc, yc)
        c2 = LaplaceActiveSubspaceClassifier(**grouped(posterior=LowRankPosterior, **kw)).fit(Xc, yc)
        assert c1.sigma0_search_ is not None and c1.sigma0_ == c2.sigma0_
        np.testing.assert_array_equal(c1.predict_proba(Xc[:6]), c2.predict_proba(Xc[:6]))


@pytest.mark.parametrize("kind", [SubspacePosterior, LowRankPosterior, LowRankDiagPosterior,
                                  ShrunkComplementPosterior])
def test_every_kind_pickles(setup, kind):
    X = setup[1]
    args, kw = _posterior_inputs(setup, kind)
    post = kind(*args, **kw)
    reference = _outputs(post, X)
    back = pickle.loads(pickle.dumps(post))
    assert type(back) is kind and repr(back) == repr(post) and back._jp_cache is None
    _assert_same(_outputs(back, X), reference)


def test_a_pickle_of_the_single_class_loads_as_its_kind(setup):
    """Pickled when every kind was one ActiveSubspacePosterior with a ``posterior`` string: pickle rebuilds it with
    ActiveSubspacePosterior.__new__ and that state, and gets the kind back."""
    X = setup[1]
    args, kw = _posterior_inputs(setup, LowRankPosterior)
    post = LowRankPosterior(*args, **kw)
    state = {**post.__getstate__(), "posterior": "low_rank"}
    old = ActiveSubspacePosterior.__new__(ActiveSubspacePosterior)
    old.__setstate__(state)
    assert type(old) is LowRankPosterior
    _assert_same(_outputs(old, X), _outputs(post, X))


class _Incomplete(ActiveSubspacePosterior):
    default_sigma0 = "eb_full"

    def _trace_condition(self, d):
        raise NotImplementedError


def test_resolve_posterior_and_its_errors(setup):
    assert {n: resolve_posterior(n) for n in POSTERIOR_KINDS} == POSTERIOR_KINDS
    assert resolve_posterior(ShrunkComplementPosterior) is ShrunkComplementPosterior
    with pytest.raises(ValueError, match=r"one of \['low_rank', 'low_rank_diag', 'subspace'\] or a subclass"):
        resolve_posterior("full")
    with pytest.raises(ValueError, match="posterior must be"):
        resolve_posterior(torch.nn.Linear)
    args, kw = _posterior_inputs(setup, SubspacePosterior)
    fitted = SubspacePosterior(*args, **kw)
    with pytest.raises(ValueError, match="a fitted posterior is not a kind: pass its class, SubspacePosterior"):
        resolve_posterior(fitted)
    with pytest.raises(TypeError, match="_Incomplete does not implement .*_output_covariance.*default_predictive"):
        resolve_posterior(_Incomplete)
    with pytest.raises(TypeError, match="abstract"):
        _Incomplete(*args, **kw)
    with pytest.raises(ValueError, match="names another kind than LowRankPosterior"):
        LowRankPosterior(*args, posterior="subspace", **kw)
    with pytest.raises(TypeError, match="_Incomplete does not implement"):
        fit_laplace_subspace(setup[0], setup[1], torch.zeros(25, 2, dtype=torch.float64), n_components=2,
                             posterior=_Incomplete)
    est = LaplaceActiveSubspaceRegressor(posterior=SubspacePosterior(*args, **kw), training=Training(max_epochs=1))
    with pytest.raises(ValueError, match="posterior must be 'low_rank', 'low_rank_diag', 'subspace', a Posterior"):
        est.fit(np.zeros((20, 3)), np.zeros(20))
