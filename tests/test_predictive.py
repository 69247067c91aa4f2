import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from glas_sklearn.predictive import (
    interval_coverage,
    linearized_interval,
    linearized_probabilities,
    mean_interval_width,
    mean_set_size,
    prediction_sets,
    sampled_interval,
    sampled_probabilities,
    set_coverage,
)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -------------------------------------------------------------------------- regression


def test_sampled_interval_matches_numpy_quantiles():
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(201, 7, 2))
    levels = [0.5, 0.9, 0.95]
    mean, bounds = sampled_interval(samples, levels)
    assert isinstance(bounds, np.ndarray) and bounds.shape == (7, 2, 2, 3)
    np.testing.assert_allclose(mean, samples.mean(0))
    for i, lev in enumerate(levels):
        g = 1 - lev
        np.testing.assert_allclose(bounds[..., 0, i], np.quantile(samples, g / 2, axis=0), rtol=1e-12)
        np.testing.assert_allclose(bounds[..., 1, i], np.quantile(samples, 1 - g / 2, axis=0), rtol=1e-12)
    # torch in, torch out; a single level keeps its axis
    mean_t, bounds_t = sampled_interval(torch.tensor(samples), 0.9)
    assert isinstance(bounds_t, torch.Tensor) and bounds_t.shape == (7, 2, 2, 1)
    np.testing.assert_allclose(bounds_t.numpy()[..., 0], bounds[..., 1])


def _mixture_quantile(f, sd, q):
    """Independent reference: brentq on the mixture CDF (1/S) Σ Φ((t − f_s)/σ) = q."""
    return brentq(lambda t: norm.cdf((t - f) / sd).mean() - q, f.min() - 20 * sd, f.max() + 20 * sd, xtol=1e-14)


@pytest.mark.parametrize("noise_var", [0.25, [0.5, 0.01]])
def test_sampled_interval_with_noise_is_the_mixture_quantile(noise_var):
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(300, 6, 2)) * np.array([0.3, 2.0]) + np.array([1.0, -4.0])
    levels = [0.9, 0.5]
    _, b = sampled_interval(samples, levels, noise_var=noise_var)
    sd = np.sqrt(np.broadcast_to(np.asarray(noise_var, dtype=float), (2,)))
    for i, m, k in itertools.product(range(6), range(2), range(2)):
        g = 1 - levels[k]
        assert b[i, m, 0, k] == pytest.approx(_mixture_quantile(samples[:, i, m], sd[m], g / 2), abs=1e-9)
        assert b[i, m, 1, k] == pytest.approx(_mixture_quantile(samples[:, i, m], sd[m], 1 - g / 2), abs=1e-9)
    # deterministic, and a row's interval does not depend on the other rows. Two batch shapes may reduce the
    # mixture sums in different orders, so the two roots agree within the solver's stopping rules, not
    # bitwise: |F(t) − q| ≤ 1e-12 (float64) moves t by at most 1e-12 / F'(t) each, and the step rule stops at
    # 8 ulps of 1 + |t|.
    _, again = sampled_interval(samples[:, 2:4], levels, noise_var=noise_var)
    t = b[2:4]
    f = samples[:, 2:4, :, None, None]
    density = (norm.pdf((t - f) / sd[:, None, None]) / sd[:, None, None]).mean(0)
    tol = 2 * 1e-12 / density + 2 * 8 * np.finfo(np.float64).eps * (1 + np.abs(t))
    assert np.all(np.abs(again - t) <= tol)


def test_sampled_interval_with_noise_limits_and_float32():
    zero = torch.zeros(50, 3, 1, dtype=torch.float64)
    _, b = sampled_interval(zero, [0.9], noise_var=0.25)  # all samples equal: exactly N(0, 0.25)
    np.testing.assert_allclose(b[:, 0, 1, 0].numpy(), 0.5 * norm.ppf(0.95), rtol=1e-10)
    np.testing.assert_allclose(b[:, 0, 0, 0].numpy(), -0.5 * norm.ppf(0.95), rtol=1e-10)
    _, b0 = sampled_interval(zero, [0.9])
    assert torch.count_nonzero(b0) == 0
    # large noise: the mixture is close to the moment-matched Gaussian
    rng = np.random.default_rng(1)
    f = rng.normal(size=(2000, 4, 1)) * 0.1
    _, b = sampled_interval(f, 0.95, noise_var=100.0)
    np.testing.assert_allclose(b[:, 0, 1, 0], f.mean(0)[:, 0] + norm.ppf(0.975) * np.sqrt(100 + f.var(0)[:, 0]),
                               rtol=1e-4)
    # float32 samples: level accuracy 1e-6 in the mixture CDF
    f32 = torch.tensor(rng.normal(size=(500, 20, 1)), dtype=torch.float32)
    _, b32 = sampled_interval(f32, 0.9, noise_var=0.01)
    assert b32.dtype == torch.float32
    for i in range(20):
        cdf = norm.cdf((float(b32[i, 0, 1, 0]) - f32[:, i, 0].double().numpy()) / 0.1).mean()
        assert abs(cdf - 0.95) < 2e-6


def test_noise_var_checks():
    s = np.zeros((4, 3, 2))
    for bad in (-1.0, [0.1, -0.1], [0.1, 0.2, 0.3], [[0.1, 0.2]], float("nan"), "0.1"):
        with pytest.raises(ValueError, match="noise_var"):
            sampled_interval(s, 0.9, noise_var=bad)
        with pytest.raises(ValueError, match="noise_var"):
            linearized_interval(s[0], s[0], 0.9, noise_var=bad)


def test_linearized_interval():
    mean = np.array([[0.0, 1.0], [2.0, -1.0]])
    var = np.array([[1.0, 4.0], [0.25, 0.0]])
    for noise in (0.5, np.array([0.5, 2.0])):
        b = linearized_interval(mean, var, [0.68, 0.95], noise_var=noise)
        assert b.shape == (2, 2, 2, 2)
        for i, lev in enumerate([0.68, 0.95]):
            lo, hi = norm.interval(lev, loc=mean, scale=np.sqrt(var + noise))
            np.testing.assert_allclose(b[..., 0, i], lo, rtol=1e-12)
            np.testing.assert_allclose(b[..., 1, i], hi, rtol=1e-12)
    b_t = linearized_interval(torch.tensor(mean), torch.tensor(var), 0.9)
    assert isinstance(b_t, torch.Tensor) and b_t.shape == (2, 2, 2, 1)
    assert b_t[1, 1, 0, 0] == b_t[1, 1, 1, 0] == -1.0  # zero variance, no noise: a point


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.2, -0.1, [], [0.5, 1.0], float("nan"), "0.9", None, [[0.9]]])
def test_bad_confidence_levels(bad):
    s = np.zeros((5, 2, 1))
    with pytest.raises(ValueError, match="confidence_levels"):
        sampled_interval(s, bad)
    with pytest.raises(ValueError, match="confidence_levels"):
        linearized_interval(s[0], s[0], bad)
    with pytest.raises(ValueError, match="confidence_levels"):
        prediction_sets(np.full((2, 2), 0.5), bad)


def test_regression_bad_inputs():
    with pytest.raises(ValueError, match="must match"):
        linearized_interval(np.zeros((3, 1)), np.zeros((3, 2)), 0.9)
    with pytest.raises(ValueError, match=">= 0"):
        linearized_interval(np.zeros((3, 1)), -np.ones((3, 1)), 0.9)
    with pytest.raises(ValueError, match="NaN"):
        sampled_interval(np.full((4, 3, 1), np.nan), 0.9)
    with pytest.raises(ValueError, match="shape"):
        sampled_interval(np.zeros(4), 0.9)


# ----------------------------------------------------------------------- classification


def test_sampled_probabilities():
    logits = np.random.default_rng(1).normal(size=(30, 4, 3))
    np.testing.assert_allclose(sampled_probabilities(logits), _softmax(logits).mean(0), rtol=1e-12)


def test_probit_formula_and_limits():
    rng = np.random.default_rng(2)
    mu = rng.normal(size=(5, 4))
    A = rng.normal(size=(5, 4, 4))
    cov = A @ A.transpose(0, 2, 1)
    p = linearized_probabilities(mu, cov, method="probit")
    ref = _softmax(mu / np.sqrt(1 + np.pi / 8 * np.diagonal(cov, axis1=1, axis2=2)))
    np.testing.assert_allclose(p, ref, rtol=1e-12)
    np.testing.assert_allclose(linearized_probabilities(mu, np.diagonal(cov, axis1=1, axis2=2)), ref, rtol=1e-12)
    # Σ → 0: both approximations tend to softmax(μ)
    tiny = 1e-12 * cov
    np.testing.assert_allclose(linearized_probabilities(mu, tiny), _softmax(mu), atol=1e-10)
    np.testing.assert_allclose(linearized_probabilities(mu, tiny, method="mc", n_samples=200, generator=0),
                               _softmax(mu), atol=1e-5)


def test_probit_close_to_monte_carlo_for_small_variance():
    rng = np.random.default_rng(3)
    mu = rng.normal(size=(6, 3))
    A = 0.2 * rng.normal(size=(6, 3, 3))
    cov = A @ A.transpose(0, 2, 1)  # logit standard deviations ≈ 0.3
    probit = linearized_probabilities(mu, cov, method="probit")
    mc = linearized_probabilities(torch.tensor(mu), torch.tensor(cov), method="mc", n_samples=100000, generator=0)
    assert isinstance(mc, torch.Tensor)
    np.testing.assert_allclose(mc.numpy(), probit, atol=0.01)
    assert np.abs(mc.numpy() - _softmax(mu)).max() > 1e-3  # the variance does matter


def test_monte_carlo_with_singular_covariance_matches_reference_sampler():
    """A rank-1 logit covariance (as from d = 1): compare with explicit sampling along the one direction."""
    rng = np.random.default_rng(4)
    mu = rng.normal(size=(4, 3))
    u = rng.normal(size=(4, 3))
    cov = u[:, :, None] * u[:, None, :]
    mc = linearized_probabilities(mu, cov, method="mc", n_samples=200000, generator=1)
    t = rng.normal(size=(200000, 1, 1))
    ref = _softmax(mu + t * u).mean(0)
    np.testing.assert_allclose(mc, ref, atol=0.005)
    again = linearized_probabilities(mu, cov, method="mc", n_samples=1000, generator=5)
    np.testing.assert_array_equal(again, linearized_probabilities(mu, cov, method="mc", n_samples=1000, generator=5))


def test_linearized_probabilities_bad_inputs():
    with pytest.raises(ValueError, match="method"):
        linearized_probabilities(np.zeros((2, 3)), np.zeros((2, 3)), method="laplace")
    with pytest.raises(ValueError, match="cov must have shape"):
        linearized_probabilities(np.zeros((2, 3)), np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match=">= 0"):
        linearized_probabilities(np.zeros((2, 3)), -np.ones((2, 3)))


def _brute_force_min_size(p, level):
    C = p.size
    for size in range(1, C + 1):
        if any(p[list(s)].sum() >= level for s in itertools.combinations(range(C), size)):
            return size
    raise AssertionError


def test_prediction_sets_are_minimal():
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.full(5, 0.7), size=40)
    levels = [0.05, 0.5, 0.8, 0.95, 0.999]
    sets = prediction_sets(probs, levels)
    assert sets.shape == (40, 5, 5) and sets.dtype == bool
    for i in range(40):
        for k, lev in enumerate(levels):
            chosen = sets[i, :, k]
            assert probs[i, chosen].sum() >= lev
            assert chosen.sum() == _brute_force_min_size(probs[i], lev)
            # the set holds the most probable classes
            assert probs[i, chosen].min() >= probs[i, ~chosen].max(initial=0)
    assert sets[..., 0].sum(1).min() >= 1
    # nested in the level
    assert np.all(sets[..., :-1] <= sets[..., 1:])


def test_prediction_sets_ties_and_torch():
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float32)
    s = prediction_sets(p, [0.5, 0.75])
    assert isinstance(s, torch.Tensor)
    assert s[0, :, 0].tolist() == [True, True, False, False]
    assert s[0, :, 1].tolist() == [True, True, True, False]
    assert s[1, :, 1].tolist() == [True, False, False, False]
    with pytest.raises(ValueError, match="logits"):
        prediction_sets(np.array([[2.0, -1.0]]), 0.9)


# ----------------------------------------------------------------------------- summaries


def test_interval_coverage_and_width_on_hand_made_arrays():
    # 3 records, 2 outputs, 2 levels: narrow [-1, 1] and wide [-2, 2] around 0
    bounds = np.zeros((3, 2, 2, 2))
    bounds[..., 0, 0], bounds[..., 1, 0] = -1, 1
    bounds[..., 0, 1], bounds[..., 1, 1] = -2, 2
    y = np.array([[0.0, 1.5], [1.0, -3.0], [-1.0, 2.0]])
    # narrow covers 0, 1 (edge), -1 (edge) → 3 of 6; wide adds 1.5 and 2 (edge) → 5 of 6
    np.testing.assert_allclose(interval_coverage(y, bounds), [3 / 6, 5 / 6])
    np.testing.assert_allclose(mean_interval_width(bounds), [2.0, 4.0])
    cov_t = interval_coverage(torch.tensor(y), torch.tensor(bounds))
    assert isinstance(cov_t, np.ndarray) and cov_t.dtype == np.float64
    # 1-D targets against single-output bounds
    np.testing.assert_allclose(interval_coverage(y[:, 0], bounds[:, :1]), [1.0, 1.0])
    with pytest.raises(ValueError, match="expected y of shape"):
        interval_coverage(y[:2], bounds)
    with pytest.raises(ValueError, match="lower/upper"):
        interval_coverage(y, np.zeros((3, 2, 3, 2)))


def test_set_coverage_and_size_on_hand_made_arrays():
    sets = np.zeros((4, 3, 2), dtype=bool)
    sets[:, 0, :] = True
    sets[[1, 2], 1, 1] = True
    sets[3, :, 1] = True
    labels = np.array([0, 1, 2, 2])
    np.testing.assert_allclose(set_coverage(labels, sets), [1 / 4, 3 / 4])
    np.testing.assert_allclose(mean_set_size(sets), [1.0, (2 + 2 + 1 + 3) / 4])
    np.testing.assert_allclose(set_coverage(torch.tensor(labels), torch.tensor(sets)), [1 / 4, 3 / 4])
    with pytest.raises(ValueError, match="between 0 and 2"):
        set_coverage(np.array([0, 1, 2, 3]), sets)
    with pytest.raises(ValueError, match="labels has shape"):
        set_coverage(labels[:3], sets)
    with pytest.raises(ValueError, match="boolean"):
        set_coverage(labels, sets.astype(float))


# ---------------------------------------------------------------------------- conformal


def test_conformal_interval_by_hand():
    from glas_sklearn.predictive import conformal_interval

    mean = np.array([[0.0, 1.0], [2.0, -1.0]])
    std = np.array([[1.0, 0.5], [2.0, 0.25]])
    b = conformal_interval(mean, std, [[1.0, 2.0], [3.0, 4.0]])  # levels × outputs
    assert b.shape == (2, 2, 2, 2)
    np.testing.assert_allclose(b[1, 0, :, 0], [0.0, 4.0])  # 2 ± 1 · 2
    np.testing.assert_allclose(b[1, 1, :, 1], [-2.0, 0.0])  # −1 ± 4 · 0.25
    np.testing.assert_allclose(b[0, 1, :, 0], [0.0, 2.0])  # 1 ± 2 · 0.5
    one = conformal_interval(mean, std, [1.5])  # one quantile shared by the outputs
    np.testing.assert_allclose(one[..., 1, 0] - one[..., 0, 0], 3.0 * std)
    inf = conformal_interval(torch.zeros(3, 1), torch.tensor([[1.0], [0.0], [2.0]]), [np.inf])
    assert torch.isinf(inf).all() and bool((inf[:, 0, 0, 0] < 0).all())
    with pytest.raises(ValueError, match="match"):
        conformal_interval(mean, std[:, :1], [1.0])
    with pytest.raises(ValueError, match=">= 0"):
        conformal_interval(mean, std, [-1.0])
    with pytest.raises(ValueError, match="columns"):
        conformal_interval(mean, std, np.ones((1, 3)))


def test_conformal_sets_by_hand():
    from glas_sklearn.predictive import conformal_sets

    probs = torch.tensor([[0.1, 0.6, 0.3], [0.34, 0.33, 0.33]])
    sets = conformal_sets(probs, [0.4, 0.7, 0.0, np.inf])
    assert sets.shape == (2, 3, 4) and sets.dtype == torch.bool
    assert sets[0, :, 0].tolist() == [False, True, False]  # 1 − p ≤ 0.4 ⇔ p ≥ 0.6
    assert sets[0, :, 1].tolist() == [False, True, True]
    assert sets[1, :, 0].tolist() == [False, False, False]  # an empty set: nothing is probable enough
    assert not sets[..., 2].any() and sets[..., 3].all()
    np.testing.assert_allclose(set_coverage(np.array([1, 0]), sets.numpy()), [0.5, 1.0, 0.0, 1.0])


# ------------------------------------------------------------------------------ the predictive modes


class _StubPosterior:
    """The posterior protocol the modes ask, with fixed tensors: f(x; θ0), J Σ Jᵀ's diagonal and S output samples."""

    off_subspace = False

    def __init__(self, seed=0, n=6, m=2, s=400):
        g = torch.Generator().manual_seed(seed)
        self.mean = torch.randn(n, m, generator=g, dtype=torch.float64)
        self.var = torch.rand(n, m, generator=g, dtype=torch.float64)
        self.samples = self.mean + self.var.sqrt() * torch.randn(s, n, m, generator=g, dtype=torch.float64)

    def predict_mean(self, X, batch_size=None):
        return self.mean

    def linearized_variance(self, X, d, full_cov=False, batch_size=None):
        return torch.diag_embed(self.var) if full_cov else self.var

    def predict_samples(self, X, d, n_samples=1000, random_state=None, batch_size=None):
        return self.samples


def test_predictive_modes_resolve_once_and_answer_from_the_posterior_protocol():
    from glas_sklearn.predictive import Linearized, PredictiveMode, Sampled, predictive_interval, resolve_predictive

    assert type(resolve_predictive("sampled")) is Sampled and type(resolve_predictive("linearized")) is Linearized
    mode = Sampled()
    assert resolve_predictive(mode) is mode and isinstance(mode, PredictiveMode) and mode == Sampled()
    with pytest.raises(ValueError, match="predictive"):
        resolve_predictive("exact")
    assert Sampled().values_per_output(50, 7) == 50 and Linearized().values_per_output(50, 7) == 9
    assert Linearized().scans_every_dimension and not Sampled().scans_every_dimension

    post, noise = _StubPosterior(), np.array([0.3, 0.0])
    # linearised: f(x; θ0) ± z sqrt(σ_f² + σ²), the exact normal quantile
    mean, std, bounds = predictive_interval(post, None, 1, [0.9], predictive=Linearized(), noise_var=noise)
    sd = np.sqrt(post.var.numpy() + noise)
    np.testing.assert_allclose(std.numpy(), sd, rtol=1e-14)
    np.testing.assert_allclose(bounds[..., 1, 0].numpy(), post.mean.numpy() + norm.ppf(0.95) * sd, rtol=1e-12)
    # sampled, without noise: the samples' mean, population std and numpy's quantiles
    mean, std, bounds = predictive_interval(post, None, 1, [0.8], predictive="sampled")
    s = post.samples.numpy()
    np.testing.assert_allclose(mean.numpy(), s.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std.numpy(), s.std(0), rtol=1e-12)
    np.testing.assert_allclose(bounds[..., 0, 0].numpy(), np.quantile(s, 0.1, axis=0), rtol=1e-12)


def test_every_posterior_kind_answers_the_protocol_the_modes_ask():
    """The modes type their posterior as predictive.PosteriorProtocol (predictive/ never imports posterior/): each
    kind, and the stub above, has its members with the protocol's parameters, in order, with the same defaults."""
    import inspect

    from glas_sklearn.posterior import LowRankDiagPosterior, LowRankPosterior, SubspacePosterior
    from glas_sklearn.predictive import PosteriorProtocol

    members = [m for m in vars(PosteriorProtocol) if not m.startswith("_")]
    assert set(members) >= {"predict_mean", "linearized_variance", "predict_samples", "linearized_samples"}
    assert "off_subspace" in PosteriorProtocol.__annotations__
    for kind in (SubspacePosterior, LowRankPosterior, LowRankDiagPosterior):
        assert isinstance(kind.off_subspace, bool)
        for name in members:
            want = list(inspect.signature(getattr(PosteriorProtocol, name)).parameters.values())
            have = list(inspect.signature(getattr(kind, name)).parameters.values())
            assert [(p.name, p.default) for p in have[:len(want)]] == [(p.name, p.default) for p in want], (kind, name)
    stub = _StubPosterior()
    assert all(hasattr(stub, m) for m in members if m != "linearized_samples") and hasattr(stub, "off_subspace")


def test_the_modes_ask_the_likelihood_for_its_moments_of_y():
    """The heteroscedastic likelihood through each mode: sampled, the law of total variance over the samples;
    linearised, μ(x; θ0), σ²(x; θ0) and the variance of the mean outputs (by hand)."""
    from glas_sklearn.likelihoods import HeteroscedasticGaussian
    from glas_sklearn.predictive import Linearized, Sampled

    post, lik = _StubPosterior(m=4), HeteroscedasticGaussian()
    mu_s, var_s = post.samples[..., :2].numpy(), np.exp(post.samples[..., 2:].numpy())
    mu, ale, epi = Sampled().likelihood_parts(lik, post, None, 1)
    np.testing.assert_allclose(mu.numpy(), mu_s.mean(0), rtol=1e-12)
    np.testing.assert_allclose(ale.numpy(), var_s.mean(0), rtol=1e-12)
    np.testing.assert_allclose(epi.numpy(), mu_s.var(0), rtol=1e-10)
    mu, ale, epi = Linearized().likelihood_parts(lik, post, None, 1)
    np.testing.assert_allclose(mu.numpy(), post.mean[:, :2].numpy())
    np.testing.assert_allclose(ale.numpy(), np.exp(post.mean[:, 2:].numpy()), rtol=1e-14)
    np.testing.assert_allclose(epi.numpy(), post.var[:, :2].numpy())
