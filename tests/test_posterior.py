import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils import vector_to_parameters

from glas_sklearn._jacobians import LinearFactors
from glas_sklearn.likelihoods import Categorical, Gaussian
from glas_sklearn.posterior import ActiveSubspacePosterior, _evaluation, estimate_noise_variance
from glas_sklearn.posterior._evaluation import jacobians_cheaper

from .reference import TinyLSTM, assert_unchanged, dense_ggn, dense_jacobian, flat_params, mlp, snapshot

BETA = 40.0
K = 8


def _eigenpairs(net, X, loss="mse", k=K):
    """Top-k eigenpairs of the dense GGN (descending), plus the full decomposition."""
    G = dense_ggn(net, X, loss)
    lam, V = torch.linalg.eigh(G)
    lam, V = lam.flip(0), V.flip(1)
    return lam[:k].clamp_min(0), V[:, :k], G


@pytest.fixture(scope="module")
def setup():
    net = mlp(n_out=1)
    X = torch.randn(30, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lam, P, G = _eigenpairs(net, X)
    return net, X, lam, P, G


@pytest.fixture(scope="module")
def setup2():
    net = mlp(n_out=2, seed=3)
    X = torch.randn(25, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    lam, P, _ = _eigenpairs(net, X)
    return net, X, lam, P


def _evidence(log_alpha, w_sq, blam):
    """Eq. (39) as a function of α = σ0⁻² (up to a constant): −α‖w0‖²/2 + d/2 log α − ½ Σ log(βλ_i + α)."""
    alpha = np.exp(log_alpha)[:, None]
    return (-0.5 * alpha[:, 0] * w_sq + 0.5 * blam.size * np.log(alpha[:, 0])
            - 0.5 * np.log(blam[None, :] + alpha).sum(1))


# ----------------------------------------------------------------------------- beta


def test_beta_table():
    assert Gaussian().beta("mean", 50, noise_var=0.01) == pytest.approx(100.0)
    assert Gaussian().beta("standard", 50, noise_var=0.01) == pytest.approx(5000.0)
    assert Categorical().beta("mean", 50) == 1.0
    assert Categorical().beta("standard", 50) == 50.0
    assert Gaussian().beta(3.5, 50) == 3.5
    assert Categorical().beta(np.float32(2.0), 10) == 2.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(scaling="mean", n_records=10), "noise_var"),
    (dict(scaling="mean", n_records=10, noise_var=0.0), "noise_var"),
    (dict(scaling="bayes", n_records=10, noise_var=1.0), "scaling"),
    (dict(scaling=-1.0, n_records=10), "scaling"),
    (dict(scaling=True, n_records=10), "scaling"),
    (dict(scaling="mean", n_records=0, noise_var=1.0), "n_records"),
])
def test_beta_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Gaussian().beta(**kwargs)


def test_estimate_noise_variance():
    r = np.random.default_rng(0).normal(size=(40, 3))
    assert estimate_noise_variance(r) == pytest.approx((r**2).sum() / r.size, rel=1e-14)
    assert estimate_noise_variance(torch.tensor(r, dtype=torch.float32)) == pytest.approx((r**2).mean(), rel=1e-6)
    with pytest.raises(ValueError, match="NaN"):
        estimate_noise_variance(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="empty"):
        estimate_noise_variance(np.zeros(0))


# ------------------------------------------------------------------ empirical Bayes


@pytest.mark.parametrize("d", [1, 2, 4, 8])
def test_sigma0_solves_eb_equation_and_maximises_evidence(setup, d):
    net, _, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    alpha = post.fit_sigma0(d) ** -2
    w_sq = float(((P[:, :d].T @ flat_params(net)) ** 2).sum())
    blam = BETA * lam[:d].numpy()
    rhs = np.sum(1 / alpha - 1 / (blam + alpha))
    assert rhs == pytest.approx(w_sq, rel=1e-9)
    grid = np.linspace(np.log(alpha) - 8, np.log(alpha) + 8, 16001)  # spacing 1e-3 in log α
    best = grid[np.argmax(_evidence(grid, w_sq, blam))]
    assert abs(best - np.log(alpha)) <= 1.1e-3


def test_sigma0_synthetic_spectrum_with_zero_eigenvalues():
    """Spread spectrum with exact zeros; the zero directions drop out of eq. (41)."""
    net = mlp(n_out=1)
    D = flat_params(net).numel()
    P, _ = torch.linalg.qr(torch.randn(D, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))
    lam = torch.tensor([1e4, 30.0, 1.0, 1e-3, 0.0, 0.0], dtype=torch.float64)
    post = ActiveSubspacePosterior(net, lam, P, beta=2.0)
    w_sq = np.cumsum(((P.T @ flat_params(net)) ** 2).numpy())
    for d in range(1, 7):
        alpha = post.fit_sigma0(d) ** -2
        blam = 2.0 * lam[:d].numpy()
        grid = np.linspace(np.log(alpha) - 10, np.log(alpha) + 10, 20001)
        assert abs(grid[np.argmax(_evidence(grid, w_sq[d - 1], blam))] - np.log(alpha)) <= 1.1e-3
        assert np.sum(blam / (alpha * (blam + alpha))) == pytest.approx(w_sq[d - 1], rel=1e-9)


def test_sigma0_fixed_and_errors(setup):
    net, _, lam, P, _ = setup
    assert ActiveSubspacePosterior(net, lam, P, beta=BETA, sigma0=0.3).fit_sigma0(5) == 0.3
    post = ActiveSubspacePosterior(net, torch.zeros(K, dtype=torch.float64), P, beta=BETA)
    with pytest.raises(ValueError, match="eigenvalues are 0"):
        post.fit_sigma0(3)
    # eigenvectors orthogonal to θ0: ‖w0‖ = 0
    theta = flat_params(net)
    A = torch.randn(theta.numel(), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    A = A - torch.outer(theta, theta @ A) / (theta @ theta)
    Q, _ = torch.linalg.qr(A)
    post = ActiveSubspacePosterior(net, lam[:3], Q, beta=BETA)
    with pytest.raises(ValueError, match="no component"):
        post.fit_sigma0(2)


# ------------------------------------------------------------- variances & diagnostics


def test_variances_equal_dense_laplace_covariance(setup):
    net, _, lam, P, G = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    D = G.shape[0]
    for d in (1, 3, K):
        s0 = post.fit_sigma0(d)
        cov = torch.linalg.inv(BETA * G + s0**-2 * torch.eye(D, dtype=torch.float64))
        proj = P[:, :d].T @ cov @ P[:, :d]
        torch.testing.assert_close(proj, torch.diag(post.variances(d)), rtol=1e-8, atol=1e-12)
        # eq. (10) in its other form, (σ0² − σ_j²) / σ0²
        torch.testing.assert_close(post.contraction(d), (s0**2 - post.variances(d)) / s0**2, rtol=1e-9, atol=1e-12)


def test_activity_scores(setup):
    net, _, lam, P, G = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    d = 4
    nu = post.activity_scores(d)
    ref = torch.stack([sum(lam[j] * P[i, j] ** 2 for j in range(d)) for i in range(P.shape[0])])
    torch.testing.assert_close(nu, ref)
    torch.testing.assert_close(nu, torch.diagonal(P[:, :d] @ torch.diag(lam[:d]) @ P[:, :d].T))
    kappa = post.cumulative_activity(d)
    assert kappa.shape == (P.shape[0],)
    assert torch.all(kappa[1:] >= kappa[:-1])
    assert float(kappa[-1]) == pytest.approx(1.0)
    assert float(kappa[0]) == pytest.approx(float(nu.max() / lam[:d].sum()))


# --------------------------------------------------------------------------- sampling


def test_sample_statistics_reproducibility_and_common_random_numbers(setup):
    net, _, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    n, d = 20000, 3
    z = post.sample(n, d, random_state=7)
    var = post.variances(d)
    assert z.shape == (n, d) and z.dtype == torch.float64
    emp_cov = torch.cov(z.T)
    rel = emp_cov / torch.sqrt(torch.outer(var, var))
    # standard errors: √(2/n) ≈ 0.01 on the diagonal, √(1/n) ≈ 0.007 off it; 5 SE bounds
    torch.testing.assert_close(torch.diagonal(rel), torch.ones(d, dtype=torch.float64), atol=0.05, rtol=0)
    assert float((rel - torch.diag(torch.diagonal(rel))).abs().max()) < 0.035
    assert float((z.mean(0) / var.sqrt()).abs().max()) < 0.035
    assert torch.equal(post.sample(50, d, random_state=7), post.sample(50, d, random_state=7))
    assert not torch.equal(post.sample(50, d, random_state=7), post.sample(50, d, random_state=8))
    # common random numbers: the standard normals behind d=2 are the leading columns of those behind d=6
    e2 = post.sample(50, 2, random_state=11) / post.variances(2).sqrt()
    e6 = post.sample(50, 6, random_state=11) / post.variances(6).sqrt()
    torch.testing.assert_close(e2, e6[:, :2], rtol=1e-12, atol=1e-12)


def test_perturbations_and_parameters(setup):
    net, X, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    z = post.sample(4, 3, random_state=0)
    torch.testing.assert_close(post.perturbations(z), (P[:, :3] @ z.T).T)
    params = post.parameters(z[1])
    assert list(params) == [n for n, _ in net.named_parameters()]
    out = functional_call(net, params, (X,))
    torch.testing.assert_close(out, post.predict_samples(X, 3, n_samples=4, random_state=0)[1])
    with pytest.raises(ValueError, match="shape"):
        post.parameters(z)


def _reference_samples(net, theta0, P, z, X):
    """Independent reference: a deep copy of the model with θ0 + P z loaded, called normally."""
    outs = []
    for zs in z:
        m = copy.deepcopy(net).eval()
        vector_to_parameters(theta0 + P[:, :z.shape[1]] @ zs, m.parameters())
        with torch.no_grad():
            outs.append(m(X))
    return torch.stack(outs)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_predict_samples_matches_deepcopy_loop(setup2, batch_size):
    net, X, lam, P = setup2
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    out = post.predict_samples(X[:9], 3, n_samples=6, random_state=1, batch_size=batch_size)
    ref = _reference_samples(net, flat_params(net), P, post.sample(6, 3, random_state=1), X[:9])
    assert out.shape == (6, 9, 2)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(post.predict_mean(X), net(X).detach())


def test_predict_samples_in_float32_across_chunks_matches_the_float64_reference(setup2, monkeypatch):
    """The weights θ0 + P z of each chunk are formed in one buffer reused by every chunk (in one product, or
    in blocks of weights when single-threaded): with chunks of 3 samples (8 samples: 3, 3 and a partial 2)
    the float32 outputs equal a float64 deep-copy reference up to float32 round-off (D ≈ 100 weights, a few
    layers: a tolerance of 100 ε₃₂ relative to the outputs' scale)."""
    net64, X64, lam, P64 = setup2
    net = copy.deepcopy(net64).float()
    post = ActiveSubspacePosterior(net, lam.float(), P64.float(), beta=BETA)
    D = post.n_weights
    monkeypatch.setattr("glas_sklearn.posterior._evaluation._WEIGHT_CHUNK_BYTES", 3 * D * 4)
    assert post._chunk(9, 8) == 3
    out = post.predict_samples(X64[:9].float(), 3, n_samples=8, random_state=4)
    # single-threaded, the weights are formed in blocks of _FORM_BLOCK: blocks of 7 (the last one partial)
    monkeypatch.setattr("glas_sklearn.posterior._evaluation._FORM_BLOCK", 7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        blocked = post.predict_samples(X64[:9].float(), 3, n_samples=8, random_state=4)
    finally:
        torch.set_num_threads(threads)
    z = post.sample(8, 3, random_state=4).double()
    ref = _reference_samples(net64, flat_params(net).double(), P64.float().double(), z, X64[:9].float().double())
    assert out.dtype == torch.float32 and out.shape == ref.shape == (8, 9, 2)
    scale = float(ref.abs().max())
    for got in (out, blocked):
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=100 * torch.finfo(torch.float32).eps * scale)


class _Grid(nn.Module):
    """Outputs of shape (n, 2, 3), with data-dependent Python control flow (vmap cannot batch .item())."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 6)

    def forward(self, x):
        h = self.lin(x)
        if h.abs().max().item() > 1e300:  # never true; forces the loop fallback
            h = h * 0
        return torch.tanh(h).reshape(-1, 2, 3)


def test_predict_samples_any_output_shape_and_loop_fallback():
    torch.manual_seed(0)
    net = _Grid().double()
    D = flat_params(net).numel()
    P, _ = torch.linalg.qr(torch.randn(D, 4, dtype=torch.float64))
    post = ActiveSubspacePosterior(net, torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64), P, beta=1.0)
    X = torch.randn(5, 3, dtype=torch.float64)
    out = post.predict_samples(X, 4, n_samples=3, random_state=2)
    assert post._vmap_forward_ok is False
    ref = _reference_samples(net, flat_params(net), P, post.sample(3, 4, random_state=2), X)
    assert out.shape == (3, 5, 2, 3)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


# -------------------------------------------------------------------------- linearised


@pytest.mark.parametrize("which", ["one", "two"])
def test_linearized_variance_matches_dense_jacobian(setup, setup2, which):
    if which == "one":
        net, X, lam, P, _ = setup
    else:
        net, X, lam, P = setup2
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    J = dense_jacobian(net, X)  # (n, M, D)
    for d in (1, 5):
        Sigma = P[:, :d] @ torch.diag(post.variances(d)) @ P[:, :d].T
        full = J @ Sigma @ J.transpose(1, 2)  # (n, M, M)
        torch.testing.assert_close(post.linearized_variance(X, d, full_cov=True), full, rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(post.linearized_variance(X, d), torch.diagonal(full, dim1=1, dim2=2),
                                   rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(post.jacobian_projections(X, d), J @ P[:, :d], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("factored", [False, True])
def test_jacobian_projection_cache_costs_k_jvps(setup, factored, monkeypatch):
    """d = 1, ..., K cost K columns in total, by products along the eigenvectors or from the MLP's factored
    Jacobians."""
    net, X, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    counted = []
    if factored:
        original = LinearFactors.projections

        def counting(self, tangents):
            counted.append(next(iter(tangents.values())).shape[0])
            return original(self, tangents)

        monkeypatch.setattr(LinearFactors, "projections", counting)
    else:
        post._linear_factors_ok = False  # an MLP takes the factored path otherwise
        original = post.tangent_products

        def counting(Xb, tangents):
            counted.append(tangents.shape[0])
            return original(Xb, tangents)

        post.tangent_products = counting
    for d in range(1, K + 1):
        post.linearized_variance(X, d)
    post.linearized_variance(X, 3)
    # (the factored path checks itself once on three random tangents)
    assert sum(counted) == K + 3 * factored
    # an in-place change of X invalidates the cache
    X2 = X.clone()
    post.linearized_variance(X2, 2)
    X2.mul_(2.0)
    J = dense_jacobian(net, X2)
    torch.testing.assert_close(post.jacobian_projections(X2, 2), J @ P[:, :2], rtol=1e-10, atol=1e-14)


def test_lstm_sequence_outputs():
    """Token inputs, (n, T, V) logits: vmap may fail for nn.LSTM, the fallbacks must agree with references."""
    torch.manual_seed(1)
    net = TinyLSTM(vocab=4, hidden=3).double()
    tokens = torch.randint(0, 4, (3, 4))
    lam, P, _ = _eigenpairs(net, tokens, "cross_entropy", k=3)
    post = ActiveSubspacePosterior(net, lam, P, beta=5.0)
    J = dense_jacobian(net, tokens)  # (n, T, V, D)
    torch.testing.assert_close(post.jacobian_projections(tokens, 3), J @ P, rtol=1e-9, atol=1e-12)
    var = post.linearized_variance(tokens, 3)
    torch.testing.assert_close(var, ((J @ P) ** 2 * post.variances(3)).sum(-1), rtol=1e-9, atol=1e-12)
    assert post.linearized_variance(tokens, 3, full_cov=True).shape == (3, 4, 4, 4)
    out = post.predict_samples(tokens, 2, n_samples=3, random_state=0)
    ref = _reference_samples(net, flat_params(net), P, post.sample(3, 2, random_state=0), tokens)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------- model untouched


class _TrainModeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(4, 2)
        for p in self.frozen.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.head(self.drop(torch.tanh(self.bn(self.frozen(x)))))


def test_model_unchanged_by_every_public_call():
    torch.manual_seed(0)
    net = _TrainModeNet().double()
    net.train()
    net.head.weight.grad = torch.ones_like(net.head.weight)
    before = snapshot(net)
    D = sum(p.numel() for p in net.parameters() if p.requires_grad)
    P, _ = torch.linalg.qr(torch.randn(D, 3, dtype=torch.float64))
    lam = torch.tensor([3.0, 1.0, 0.5], dtype=torch.float64)
    X = torch.randn(6, 3, dtype=torch.float64)
    post = ActiveSubspacePosterior(net, lam, P, beta=2.0)
    assert post.n_weights == D == 8 + 10  # batch norm and head only: the frozen layer is not a weight
    post.fit_sigma0(2), post.variances(3), post.contraction(2), post.activity_scores(3), post.cumulative_activity(3)
    z = post.sample(4, 2, random_state=0)
    post.perturbations(z), post.parameters(z[0])
    mean = post.predict_mean(X)
    samples = post.predict_samples(X, 2, n_samples=4, random_state=0)
    post.linearized_variance(X, 3, full_cov=True)
    post.jacobian_projections(X, 2)
    assert_unchanged(net, before)
    assert net.training and net.bn.training
    # predictions use eval mode (no dropout noise, running statistics)
    ref = copy.deepcopy(net).eval()
    with torch.no_grad():
        torch.testing.assert_close(mean, ref(X))
    assert samples.shape == (4, 6, 2)


# -------------------------------------------------------------------------- bad inputs


def test_bad_inputs(setup):
    net, X, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    with pytest.raises(ValueError, match=f"K = {K}"):
        post.variances(K + 1)
    with pytest.raises(ValueError, match="between 1 and"):
        post.sample(5, 0)
    with pytest.raises(ValueError, match="integer"):
        post.fit_sigma0(1.5)
    with pytest.raises(ValueError, match="n_samples"):
        post.sample(0, 2)
    bad = X.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        post.predict_samples(bad, 2, n_samples=3)
    with pytest.raises(ValueError, match="NaN"):
        post.linearized_variance(bad, 2)
    with pytest.raises(TypeError, match="dtype"):
        post.predict_mean(X.float())
    with pytest.raises(TypeError, match="torch.Tensor"):
        post.predict_mean(X.numpy())
    with pytest.raises(ValueError, match="shape"):
        ActiveSubspacePosterior(net, lam, P[:-1], beta=BETA)
    with pytest.raises(ValueError, match="shape"):
        ActiveSubspacePosterior(net, lam[:3], P, beta=BETA)
    with pytest.raises(ValueError, match="orthonormal"):
        ActiveSubspacePosterior(net, lam, 2 * P, beta=BETA)
    with pytest.raises(ValueError, match=">= 0"):
        ActiveSubspacePosterior(net, lam - 0.5 * lam[0], P, beta=BETA)
    with pytest.raises(ValueError, match="beta"):
        ActiveSubspacePosterior(net, lam, P, beta=0.0)
    with pytest.raises(ValueError, match="sigma0"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, sigma0="eb")
    with pytest.raises(ValueError, match="shape"):
        post.perturbations(torch.zeros(2, 3, 4, dtype=torch.float64))


def test_eigenpair_conditioning(setup):
    """Ascending order is sorted; other dtypes are converted (round-off negatives: the test below)."""
    net, X, lam, P, _ = setup
    ref = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    flipped = ActiveSubspacePosterior(net, lam.flip(0), P.flip(1), beta=BETA)
    torch.testing.assert_close(flipped.variances(K), ref.variances(K), rtol=1e-12, atol=0)
    torch.testing.assert_close(flipped.linearized_variance(X, 4), ref.linearized_variance(X, 4))
    post32 = ActiveSubspacePosterior(net, lam.float(), P.float(), beta=BETA)
    assert post32.eigenvectors.dtype == torch.float64
    assert math.isfinite(post32.fit_sigma0(2))


def test_pickle_round_trip_keeps_every_output(setup2):
    """The posterior (and the FunctionalModel it holds) pickles; the J P cache of the last inputs is dropped."""
    import pickle

    net, X, lam, P = setup2
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    var = post.linearized_variance(X, 4)
    assert post._jp_cache is not None
    loaded = pickle.loads(pickle.dumps(post))
    assert loaded._jp_cache is None
    assert loaded.layout == post.layout and loaded.device == post.device and loaded.dtype == post.dtype
    assert torch.equal(loaded.theta0, post.theta0)
    # the same computations replayed on equal tensors: equal bit for bit
    assert torch.equal(loaded.linearized_variance(X, 4), var)
    assert torch.equal(loaded.predict_samples(X, 3, n_samples=5, random_state=0),
                       post.predict_samples(X, 3, n_samples=5, random_state=0))
    assert [loaded.fit_sigma0(d) for d in (1, 4)] == [post.fit_sigma0(d) for d in (1, 4)]


def test_shares_the_functional_model_binding(setup):
    net, X, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA)
    f = post.functional_model
    assert post.layout is f.layout and post.theta0 is f.theta0 and post.n_weights == f.n_weights
    torch.testing.assert_close(post.predict_mean(X), f(X), rtol=0, atol=0)
    with pytest.raises(ValueError, match="X is on meta"):  # the posterior's input checks are the binding's
        post.predict_mean(torch.zeros(2, 3, dtype=torch.long, device="meta"))


# --------------------------------------------------------------------- low-rank posterior


def _dense_low_rank_cov(post, P, d):
    """Σ = (β P_d Λ_d P_dᵀ + σ0⁻² I)⁻¹, inverted explicitly (an independent path to P diag Pᵀ + σ0²(I − PPᵀ))."""
    D = P.shape[0]
    lam = post.eigenvalues[:d].to(torch.float64)
    prec = post.beta * (P[:, :d] * lam) @ P[:, :d].T + post.fit_sigma0(d) ** -2 * torch.eye(D, dtype=torch.float64)
    return torch.linalg.inv(prec)


@pytest.fixture(scope="module")
def setup3():
    net = mlp(n_out=3, seed=5)
    X = torch.randn(20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    lam, P, _ = _eigenpairs(net, X, loss="cross_entropy", k=6)
    return net, X, lam, P


@pytest.mark.parametrize("sigma0", ["auto", "eb_subspace", 0.7])
def test_low_rank_linearized_covariance_matches_dense_sigma(setup3, sigma0):
    net, X, lam, P = setup3
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank", sigma0=sigma0)
    assert post.sigma0_method == {"auto": "eb_full", "eb_subspace": "eb_subspace", 0.7: None}[sigma0]
    J = dense_jacobian(net, X)  # (n, C, D)
    torch.testing.assert_close(post.jacobian_gram(X, full_cov=True), J @ J.transpose(1, 2), rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(post.jacobian_gram(X), (J**2).sum(-1), rtol=1e-10, atol=1e-13)
    for d in (1, 4, 6):
        Sigma = _dense_low_rank_cov(post, P, d)
        s0 = post.fit_sigma0(d)
        closed = P[:, :d] @ torch.diag(post.variances(d)) @ P[:, :d].T + s0**2 * (
            torch.eye(P.shape[0], dtype=torch.float64) - P[:, :d] @ P[:, :d].T)
        torch.testing.assert_close(closed, Sigma, rtol=1e-9, atol=1e-12)
        full = J @ Sigma @ J.transpose(1, 2)  # the C × C logit covariances
        torch.testing.assert_close(post.linearized_variance(X, d, full_cov=True), full, rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(post.linearized_variance(X, d), torch.diagonal(full, dim1=1, dim2=2),
                                   rtol=1e-8, atol=1e-12)
    # the complement adds variance: low-rank ≥ subspace at the same σ0
    sub = ActiveSubspacePosterior(net, lam, P, beta=BETA, sigma0=post.fit_sigma0(3))
    assert bool((post.linearized_variance(X, 3) > sub.linearized_variance(X, 3)).all())


def test_low_rank_scalar_output_and_loop_fallback(setup):
    net, X, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank")
    J = dense_jacobian(net, X)[:, 0]  # (n, D)
    ref = torch.einsum("nd,de,ne->n", J, _dense_low_rank_cov(post, P, 3), J)
    torch.testing.assert_close(post.linearized_variance(X, 3)[:, 0], ref, rtol=1e-8, atol=1e-12)
    loop = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank")
    loop._vmap_jac_ok = False  # the per-record loop must agree with the vectorised Jacobians
    torch.testing.assert_close(loop.jacobian_gram(X, batch_size=7), post.jacobian_gram(X), rtol=1e-10, atol=1e-13)


def test_full_space_eb_matches_brute_force_dense_solve(setup):
    net, _, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank")
    D = P.shape[0]
    theta_sq = float(flat_params(net).pow(2).sum())
    for d in (1, 5, K):
        lamd = lam[:d]

        def trace_minus(log_alpha, d=d, lamd=lamd):  # tr (β P Λ Pᵀ + α I)⁻¹ − ‖θ0‖², dense
            prec = BETA * (P[:, :d] * lamd) @ P[:, :d].T + math.exp(log_alpha) * torch.eye(D, dtype=torch.float64)
            return float(torch.trace(torch.linalg.inv(prec))) - theta_sq

        lo, hi = math.log(1e-8), math.log(1e8)  # plain bisection on a wide bracket
        assert trace_minus(lo) > 0 > trace_minus(hi)
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if trace_minus(mid) > 0 else (lo, mid)
        assert post.fit_sigma0(d) == pytest.approx(math.exp(-0.25 * (lo + hi)), rel=1e-9)
        # and the posterior's trace is ‖θ0‖²
        assert float(torch.trace(_dense_low_rank_cov(post, P, d))) == pytest.approx(theta_sq, rel=1e-9)
    # a subspace posterior may use the full-space σ0 too
    sub = ActiveSubspacePosterior(net, lam, P, beta=BETA, sigma0="eb_full")
    assert sub.fit_sigma0(4) == post.fit_sigma0(4)


def test_low_rank_sample_moments_reproducibility_and_common_random_numbers(setup):
    net, X, lam, P, _ = setup
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank")
    n, d = 20000, 3
    delta = post.sample_perturbations(n, d, random_state=3)
    assert delta.shape == (n, P.shape[0]) and delta.dtype == torch.float64
    Sigma = _dense_low_rank_cov(post, P, d)
    emp = torch.cov(delta.T)
    dg = torch.diagonal(Sigma)
    se = torch.sqrt((torch.outer(dg, dg) + Sigma**2) / n)  # standard error of each sample covariance entry
    assert float(((emp - Sigma).abs() / se).max()) < 5.5
    assert float((delta.mean(0).abs() / torch.sqrt(dg / n)).max()) < 5.0
    # same seed → same draws (the same path replayed: bitwise)
    a = post.sample_perturbations(40, d, random_state=3)
    assert torch.equal(a, post.sample_perturbations(40, d, random_state=3))
    assert not torch.equal(a, post.sample_perturbations(40, d, random_state=4))
    # each sample's complement normals ε_s do not depend on how many samples are drawn
    P5 = P[:, :5]
    out5 = torch.eye(P.shape[0], dtype=torch.float64) - P5 @ P5.T
    torch.testing.assert_close(a[:10] @ out5, post.sample_perturbations(10, d, random_state=3) @ out5,
                               rtol=1e-12, atol=1e-14)
    # common random numbers across d: the same ε behind the complement, the same normals behind z
    e = {k: post.sample_perturbations(40, k, random_state=3) for k in (2, 5)}
    torch.testing.assert_close(e[2] @ out5 / post.fit_sigma0(2), e[5] @ out5 / post.fit_sigma0(5),
                               rtol=1e-10, atol=1e-12)
    z = {k: (e[k] @ P[:, :k]) / post.variances(k).sqrt() for k in (2, 5)}
    torch.testing.assert_close(z[2], z[5][:, :2], rtol=1e-9, atol=1e-10)
    # predict_samples pushes exactly these weights through the network
    out = post.predict_samples(X, d, n_samples=6, random_state=3)
    theta0 = flat_params(net)
    for s in range(6):
        ref = functional_call(net, post.layout.unflatten(theta0 + a[s]), (X,))
        torch.testing.assert_close(out[s], ref, rtol=1e-12, atol=1e-12)


def test_low_rank_options_errors_and_pickle(setup):
    import pickle

    net, X, lam, P, _ = setup
    with pytest.raises(ValueError, match="posterior"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="full")
    with pytest.raises(ValueError, match="sigma0"):
        ActiveSubspacePosterior(net, lam, P, beta=BETA, sigma0="eb")
    zero = copy.deepcopy(net)
    with torch.no_grad():
        for p in zero.parameters():
            p.zero_()
    with pytest.raises(ValueError, match="all 0"):
        ActiveSubspacePosterior(zero, lam, P, beta=BETA, posterior="low_rank").fit_sigma0(2)
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior="low_rank")
    v = post.linearized_variance(X, 4)
    back = pickle.loads(pickle.dumps(post))
    assert back.posterior == "low_rank" and "low_rank" in repr(back)
    torch.testing.assert_close(back.linearized_variance(X, 4), v, rtol=1e-12, atol=1e-15)


def test_linearized_samples_are_the_linearised_network_at_the_weight_draws(setup2):
    net, X, lam, P = setup2
    for kind in ("subspace", "low_rank"):
        post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior=kind)
        delta = post.sample_perturbations(5, 3, random_state=2)
        J = dense_jacobian(net, X)  # (n, M, D)
        ref = net(X).detach()[None] + torch.einsum("nmd,sd->snm", J, delta)
        torch.testing.assert_close(post.linearized_samples(X, 3, n_samples=5, random_state=2, batch_size=7), ref,
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pair_dtype", [torch.float64, torch.float32])
def test_roundoff_negative_eigenvalue_accepted_real_negative_refused(setup, pair_dtype):
    """Below 0 by less than the round-off of the products' dtype (the eigenpairs' or the model's, whichever is
    coarser) on D weights: set to 0. Below by more: refused, with what to change."""
    from glas_sklearn.eigen import roundoff_tolerance

    net, X, lam, P, _ = setup
    D = P.shape[0]
    tol = roundoff_tolerance(float(lam[0]), D, pair_dtype)
    lam2 = lam.clone()
    lam2[-1] = -0.5 * tol
    post = ActiveSubspacePosterior(net, lam2.to(pair_dtype), P.to(pair_dtype), beta=BETA)
    assert float(post.eigenvalues[-1]) == 0.0
    torch.testing.assert_close(post.eigenvalues[:-1], lam[:-1].to(pair_dtype).double())
    for negative in (-2 * tol, -1e-3 * float(lam[0])):
        lam2[-1] = negative
        with pytest.raises(ValueError, match=r"not positive semi-definite.*Hessian") as err:
            ActiveSubspacePosterior(net, lam2.to(pair_dtype), P.to(pair_dtype), beta=BETA)
        assert f"D={D}" in str(err.value) and str(pair_dtype).removeprefix("torch.") in str(err.value)


# ------------------------------------------------------------- the ways to J P, and the choice between them
def _force_path(post, path, monkeypatch):
    """Take ``path`` for J P: the MLP's factored Jacobians (its own choice), products along the eigenvectors
    (reverse over reverse, or forward mode), or the per-record Jacobians times P."""
    if path == "factors":
        return
    post._linear_factors_ok = False
    if path == "forward mode":
        post._reverse_jvp_ok = False
    cheaper = path == "jacobians"
    monkeypatch.setattr(_evaluation, "jacobians_cheaper", lambda *a, **k: cheaper)


@pytest.mark.parametrize("path", ["factors", "tangents", "forward mode", "jacobians"])
@pytest.mark.parametrize("kind", ["subspace", "low_rank"])
def test_every_path_to_jp_matches_the_dense_reference(setup3, path, kind, monkeypatch):
    """J P and J Σ Jᵀ (diagonal and blocks) by each way against the dense Jacobian and Σ (float64, 3 outputs)."""
    net, X, lam, P = setup3
    post = ActiveSubspacePosterior(net, lam, P, beta=BETA, posterior=kind, sigma0=0.7)
    _force_path(post, path, monkeypatch)
    J = dense_jacobian(net, X)  # (n, C, D)
    for d in (2, 6):
        torch.testing.assert_close(post.jacobian_projections(X, d), J @ P[:, :d], rtol=1e-10, atol=1e-13)
    d = 4
    Sigma = P[:, :d] @ torch.diag(post.variances(d)) @ P[:, :d].T
    if kind == "low_rank":
        Sigma = Sigma + 0.7**2 * (torch.eye(P.shape[0], dtype=P.dtype) - P[:, :d] @ P[:, :d].T)
    full = J @ Sigma @ J.transpose(1, 2)
    X2 = X.clone()  # a new tensor: nothing cached
    torch.testing.assert_close(post.linearized_variance(X2, d), torch.diagonal(full, dim1=1, dim2=2), rtol=1e-9,
                               atol=1e-12)
    torch.testing.assert_close(post.linearized_variance(X2, d, full_cov=True), full, rtol=1e-9, atol=1e-12)
    assert (path == "factors") == bool(getattr(post, "_linear_factors_ok", False))


@pytest.mark.parametrize("path", ["factors", "tangents", "jacobians"])
def test_float32_paths_agree_with_the_float64_reference(path, monkeypatch):
    """In float32, each way's J P within round-off (a sum over D products) of the float64 dense reference."""
    net = mlp(n_out=2, hidden=16, seed=7)
    X = torch.randn(12, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    lam, P, _ = _eigenpairs(net, X, k=5)
    J = dense_jacobian(net, X) @ P
    post = ActiveSubspacePosterior(net.float(), lam.float(), P.float(), beta=BETA, posterior="low_rank")
    _force_path(post, path, monkeypatch)
    got = post.jacobian_projections(X.float(), 5)
    tol = 20 * math.sqrt(P.shape[0]) * torch.finfo(torch.float32).eps * float(J.abs().max())
    torch.testing.assert_close(got.double(), J, rtol=0, atol=tol)


def test_the_choice_of_path_by_size():
    """Products along the eigenvectors for a dense network (the paper's 10⁶-weight MLP: 103 rows, 50 columns, one
    output), also where the kind needs the Jacobians anyway; the per-record Jacobians where every weight is used
    many times per record (convolutions, recurrent layers) and few outputs are asked for, or where the kind needs
    them anyway and weights are shared; products again when many outputs make the Jacobians large."""
    assert not jacobians_cheaper(103, 1, 50, 1.0)
    assert not jacobians_cheaper(103, 1, 50, 1.0, jacobians_needed=True)
    assert not jacobians_cheaper(1, 1, 50, 1.0, jacobians_needed=True)
    assert jacobians_cheaper(16, 1, 50, 200.0)
    assert jacobians_cheaper(16, 1, 50, 8.0, jacobians_needed=True)
    assert not jacobians_cheaper(16, 1000, 50, 8.0, jacobians_needed=True)
    assert not jacobians_cheaper(16, 1000, 50, 200.0)
