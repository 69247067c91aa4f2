"""The low-rank-plus-diagonal posterior (posterior="low_rank_diag") against explicitly formed dense matrices:
the GGN diagonal, the residual diagonal, Σ and its output covariances, the full-space σ0 and the sampler."""

import math
import pickle

import numpy as np
import pytest
import torch
from torch.func import functional_call

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.laplace import fit_laplace_subspace
from glas_sklearn.posterior import ActiveSubspacePosterior
from tests.reference import grouped

from .reference import TinyLSTM, dense_ggn, dense_jacobian, flat_params, mlp

BETA = 40.0
K = 6


def _eig(G, k=K):
    lam, V = torch.linalg.eigh(G)
    return lam.flip(0)[:k].clamp_min(0), V.flip(1)[:, :k]


@pytest.fixture(scope="module")
def cls_setup():
    net = mlp(n_out=3, seed=5)
    X = torch.randn(20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    G = dense_ggn(net, X, "cross_entropy")
    lam, P = _eig(G)
    return net, X, G, lam, P


def _dense_sigma(post, G, P, d):
    """Σ = (β (P_d Λ_d P_dᵀ + diag(r)) + σ0⁻² I)⁻¹ with r = max(diag G − Σ λ_j p_j², 0), inverted explicitly."""
    lam = post.eigenvalues[:d].to(torch.float64)
    low = (P[:, :d] * lam) @ P[:, :d].T
    r = (torch.diagonal(G) - torch.diagonal(low)).clamp_min(0)
    prec = post.beta * (low + torch.diag(r)) + post.fit_sigma0(d) ** -2 * torch.eye(G.shape[0], dtype=torch.float64)
    return torch.linalg.inv(prec), r


def _tol(D):
    """Round-off tolerance of float64 products and solves over D terms."""
    return 10 * D * torch.finfo(torch.float64).eps


@pytest.mark.parametrize("loss,n_out", [("mse", 2), ("cross_entropy", 3)])
def test_ggn_diagonal_matches_dense_ggn(loss, n_out):
    net = mlp(n_out=n_out, seed=2)
    X = torch.randn(23, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    G = dense_ggn(net, X, loss)
    op = GGNOperator(net, X, loss=loss, batch_size=7)
    diag = op.diagonal()
    assert diag.shape == (G.shape[0],) and diag.dtype == torch.float64
    torch.testing.assert_close(diag, torch.diagonal(G), rtol=1e-10, atol=_tol(G.shape[0]) * float(G.abs().max()))
    # a subsample: exactly the diagonal of the GGN of those rows
    sub = GGNOperator(net, X, loss=loss, subsample=9, random_state=1)
    G_sub = dense_ggn(net, X[torch.as_tensor(sub.indices_)], loss)
    torch.testing.assert_close(sub.diagonal(), torch.diagonal(G_sub), rtol=1e-10, atol=1e-14)


def test_ggn_diagonal_with_padding_mask_and_loop_fallback():
    torch.manual_seed(0)
    net = TinyLSTM().double()
    tokens = torch.randint(0, 6, (5, 4), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[1, 2:] = False
    mask[3, 1:] = False
    G = dense_ggn(net, tokens, "cross_entropy", mask=mask)
    op = GGNOperator(net, tokens, loss="cross_entropy", mask=mask, batch_size=2)
    torch.testing.assert_close(op.diagonal(), torch.diagonal(G), rtol=1e-9, atol=1e-14)
    loop = GGNOperator(net, tokens, loss="cross_entropy", mask=mask)
    loop._vmap_jac_ok = False  # the per-record loop must agree with the vectorised Jacobians
    torch.testing.assert_close(loop.diagonal(), torch.diagonal(G), rtol=1e-9, atol=1e-14)


def test_residual_diagonal_and_output_covariances_match_dense_sigma(cls_setup):
    net, X, G, lam, P = cls_setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", ggn_diagonal=torch.diagonal(G))
    assert post.sigma0_method == "eb_full"
    J = dense_jacobian(net, X)  # (n, C, D)
    D = P.shape[0]
    for d in (1, 4, K):
        Sigma, r = _dense_sigma(post, G, P, d)
        torch.testing.assert_close(post.residual_diagonal(d), r, rtol=1e-10, atol=_tol(D) * float(G.abs().max()))
        assert bool((r > 0).any())  # the test exercises the diagonal, not only the low rank
        full = J @ Sigma @ J.transpose(1, 2)
        scale = float(full.abs().max())
        torch.testing.assert_close(post.linearized_variance(X, d, full_cov=True), full, rtol=1e-8,
                                   atol=_tol(D) * scale * 100)
        torch.testing.assert_close(post.linearized_variance(X, d), torch.diagonal(full, dim1=1, dim2=2), rtol=1e-8,
                                   atol=_tol(D) * scale * 100)
    # the residual curvature shrinks the variance below the plain low-rank posterior's at the same σ0
    low = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank", sigma0=post.fit_sigma0(3))
    assert bool((post.linearized_variance(X, 3) < low.linearized_variance(X, 3)).all())
    # with a zero residual (the diagonal of the rank-d part itself) it is the low-rank posterior
    d = 4
    exact = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", sigma0=0.3,
                                    ggn_diagonal=(P[:, :d] ** 2) @ lam[:d])
    ref = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank", sigma0=0.3)
    torch.testing.assert_close(exact.linearized_variance(X, d), ref.linearized_variance(X, d), rtol=1e-8, atol=1e-12)


def test_full_space_sigma0_is_the_root_of_the_trace_condition(cls_setup):
    net, _, G, lam, P = cls_setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", ggn_diagonal=torch.diagonal(G))
    theta_sq = float(flat_params(net).pow(2).sum())
    for d in (1, 3, K):
        s0 = post.fit_sigma0(d)
        Sigma, r = _dense_sigma(post, G, P, d)
        assert float(torch.trace(Sigma)) == pytest.approx(theta_sq, rel=1e-9)  # plugged back in
        low = (P[:, :d] * lam[:d]) @ P[:, :d].T + torch.diag(r)

        def trace(alpha, low=low):
            return float(torch.trace(torch.linalg.inv(BETA * low + alpha * torch.eye(low.shape[0],
                                                                                       dtype=torch.float64))))

        # a root, with the trace strictly falling through it
        alpha = s0**-2
        assert trace(alpha * 0.99) > theta_sq > trace(alpha * 1.01)
    # the subspace σ0 stays available, and a fixed σ0 is used as it is
    sub = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", sigma0="eb_subspace",
                                  ggn_diagonal=torch.diagonal(G))
    assert sub.fit_sigma0(3) == ActiveSubspacePosterior(net, lam, P, beta=BETA).fit_sigma0(3)


def test_sampler_is_an_exact_root_with_matching_moments_and_common_random_numbers(cls_setup):
    net, X, G, lam, P = cls_setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", ggn_diagonal=torch.diagonal(G))
    D, d, n = P.shape[0], 3, 20000
    Sigma, _ = _dense_sigma(post, G, P, d)
    a_isqrt, Q, T = post._diag_sampler(d)
    root = a_isqrt[:, None] * (torch.eye(D, dtype=torch.float64) + Q @ T @ Q.T)
    torch.testing.assert_close(root @ root.T, Sigma, rtol=1e-9, atol=_tol(D) * float(Sigma.abs().max()))
    delta = post.sample_perturbations(n, d, random_state=3)
    emp = torch.cov(delta.T)
    dg = torch.diagonal(Sigma)
    se = torch.sqrt((torch.outer(dg, dg) + Sigma**2) / n)  # standard error of each sample covariance entry
    assert float(((emp - Sigma).abs() / se).max()) < 5.5
    assert float((delta.mean(0).abs() / torch.sqrt(dg / n)).max()) < 5.0
    # the same standard normals as the plain low-rank posterior (whose complement σ0 (I − PPᵀ) ε reveals them)
    # and as other d; a sample's draw does not depend on the number of samples
    eps = torch.linalg.solve(root, delta[:40].T).T
    low = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank")
    comp = torch.eye(D, dtype=torch.float64) - P[:, :d] @ P[:, :d].T
    torch.testing.assert_close(eps @ comp * low.fit_sigma0(d),
                               low.sample_perturbations(40, d, random_state=3) @ comp, rtol=1e-8, atol=1e-10)
    S5, _ = _dense_sigma(post, G, P, 5)
    a5, Q5, T5 = post._diag_sampler(5)
    root5 = a5[:, None] * (torch.eye(D, dtype=torch.float64) + Q5 @ T5 @ Q5.T)
    torch.testing.assert_close(torch.linalg.solve(root5, post.sample_perturbations(40, 5, random_state=3).T).T, eps,
                               rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(post.sample_perturbations(10, d, random_state=3), delta[:10], rtol=1e-12, atol=1e-14)
    # same seed, same path replayed: bitwise; predict_samples and linearized_samples use exactly these weights
    a = post.sample_perturbations(6, d, random_state=3)
    assert torch.equal(a, post.sample_perturbations(6, d, random_state=3))
    out = post.predict_samples(X, d, n_samples=6, random_state=3)
    lin = post.linearized_samples(X, d, n_samples=6, random_state=3)
    J = dense_jacobian(net, X)
    theta0 = flat_params(net)
    for s in range(6):
        ref = functional_call(net, post.layout.unflatten(theta0 + a[s]), (X,))
        torch.testing.assert_close(out[s], ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lin[s], net(X).detach() + J @ a[s], rtol=1e-10, atol=1e-12)


def test_low_rank_diag_errors_and_pickle(cls_setup):
    net, X, G, lam, P = cls_setup
    diag = torch.diagonal(G).clone()
    with pytest.raises(ValueError, match="needs ggn_diagonal"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag")
    with pytest.raises(ValueError, match="only by posterior='low_rank_diag'"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank", ggn_diagonal=diag)
    with pytest.raises(ValueError, match=r"shape \(D,\)"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", ggn_diagonal=diag[:-1])
    with pytest.raises(ValueError, match=">= 0"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", ggn_diagonal=diag - 1.0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", ggn_diagonal=diag.numpy())
    with pytest.raises(ValueError, match="residual_diagonal needs"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank").residual_diagonal(2)
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank_diag", ggn_diagonal=diag)
    v = post.linearized_variance(X, 4)
    back = pickle.loads(pickle.dumps(post))
    assert back.posterior == "low_rank_diag" and "low_rank_diag" in repr(back)
    torch.testing.assert_close(back.linearized_variance(X, 4), v, rtol=1e-12, atol=1e-15)


def test_fit_laplace_subspace_builds_the_diagonal_of_its_rows(cls_setup):
    net, X, G, _, _ = cls_setup
    fitted = fit_laplace_subspace(net, X, loss="cross_entropy", n_components=4, posterior="low_rank_diag",
                                  random_state=0, eigen_method="eigsh", tol=1e-10)
    post = fitted.posterior
    assert post.posterior == "low_rank_diag" and "ggn_diagonal" in fitted.timings
    torch.testing.assert_close(post._ggn_diag, torch.diagonal(G), rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="posterior"):
        fit_laplace_subspace(net, X, loss="cross_entropy", n_components=4, posterior="diag")


def test_estimators_with_low_rank_diag():
    from sklearn.datasets import make_blobs

    X, y = make_blobs(n_samples=120, centers=3, n_features=4, random_state=0)
    kw = dict(max_epochs=30, max_components=5, n_samples=50, random_state=0, dtype="float64")
    clf = LaplaceActiveSubspaceClassifier(**grouped(posterior="low_rank_diag", **kw)).fit(X, y)
    assert clf.predictive_.name == "linearized" and clf.posterior_.posterior == "low_rank_diag"
    proba = clf.predict_proba(X[:7])
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    labels, sets = clf.predict_set(X[:7], confidence_level=[0.8, 0.9])
    assert sets.shape == (7, 3, 2) and bool((sets[..., 0] <= sets[..., 1]).all())
    back = pickle.loads(pickle.dumps(clf))
    np.testing.assert_allclose(back.predict_proba(X[:7]), proba, rtol=1e-12)
    # the sampled predictive goes through the exact sampler
    sampled = LaplaceActiveSubspaceClassifier(**grouped(posterior="low_rank_diag", predictive="sampled",
                                                        **kw)).fit(X, y)
    assert sampled.predict_proba(X[:3]).shape == (3, 3)
    with pytest.raises(ValueError, match="posterior"):
        LaplaceActiveSubspaceClassifier(**grouped(posterior="low_rank_dia", **kw)).fit(X, y)

    rng = np.random.default_rng(0)
    Xr = rng.uniform(-1, 1, size=(150, 2))
    yr = np.sin(3 * Xr[:, 0]) + 0.1 * rng.standard_normal(150)
    reg = LaplaceActiveSubspaceRegressor(**grouped(posterior="low_rank_diag", **kw)).fit(Xr, yr)
    assert reg.sigma0_ == pytest.approx(reg.posterior_.fit_sigma0(reg.n_components_))
    assert reg.posterior_.sigma0_method == "eb_subspace"  # the regressor's per-task choice, as for "low_rank"
    y_pred, y_std = reg.predict(Xr[:5], return_std=True)
    _, pis = reg.predict_interval(Xr[:5])
    assert bool((pis[:, 0, 0] < y_pred).all() and (y_pred < pis[:, 1, 0]).all()) and bool((y_std > 0).all())
    assert reg.sample_y(Xr[:5], n_samples=4).shape == (5, 4)
    back = pickle.loads(pickle.dumps(reg))
    np.testing.assert_allclose(back.predict_interval(Xr[:5])[1], pis, rtol=1e-12)
    assert math.isfinite(float(reg.score(Xr, yr)))
