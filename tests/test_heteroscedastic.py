"""The heteroscedastic Gaussian likelihoods (a variance head, and the Gaussian's network with a noise model fitted
after it: the regressor's likelihood="heteroscedastic"), against closed forms, dense autograd references and
simulations with a known noise level."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, LowRank, Subspace, Training
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.likelihoods import Categorical, HeteroscedasticGaussian, NaturalParameterHead, resolve_likelihood
from tests.reference import grouped

from .stubs import AbsoluteResidual

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

LAYOUTS = ("mean_logvar", "natural")
EPS64 = torch.finfo(torch.float64).eps


def _outputs(layout, n=7, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(n, 2 * k, generator=g, dtype=torch.float64)
    return NaturalParameterHead()(raw) if layout == "natural" else raw


# ------------------------------------------------------------------------------------------ the likelihood
@pytest.mark.parametrize("layout", LAYOUTS)
def test_output_hessian_is_the_expected_hessian_of_the_nll(layout):
    """H_n against the autograd Hessian of ℓ: for (μ, log σ²) the Hessian's entries are polynomials of degree ≤ 2 in
    the residual, so its mean over y = μ ± σ is exactly the expectation E_y; in natural parameters it does not depend
    on y at all."""
    lik = HeteroscedasticGaussian(layout)
    out = _outputs(layout, n=5, k=2)
    mu, var = lik.mean_and_variance(out)
    H = lik.output_hessian_matrix(out)
    for i in range(out.shape[0]):
        hessians = []
        for sign in (1.0, -1.0) if layout == "mean_logvar" else (0.37,):
            y = mu[i] + sign * var[i].sqrt() if layout == "mean_logvar" else torch.randn(2, dtype=torch.float64)
            hessians.append(torch.autograd.functional.hessian(lambda o, y=y: lik.nll_terms(o, y).sum(), out[i]))
        expected = torch.stack(hessians).mean(0)
        torch.testing.assert_close(H[i], expected, rtol=1e3 * EPS64, atol=1e3 * EPS64)
        u = torch.randn(out.shape[1], dtype=torch.float64)
        torch.testing.assert_close(lik.output_hessian_product(out[i:i + 1], u[None])[0], H[i] @ u,
                                   rtol=1e3 * EPS64, atol=1e3 * EPS64)
    if layout == "mean_logvar":  # diag(1/σ², ½)
        k = mu.shape[1]
        torch.testing.assert_close(torch.diagonal(H, dim1=-2, dim2=-1), torch.cat([1 / var, torch.full_like(var, 0.5)],
                                                                                   -1))
        assert float(H[:, :k, k:].abs().max()) == 0.0


def test_beta_nll_gradient_matches_the_closed_form():
    """∂/∂μ = −(y − μ) σ^(2b−2) / n and ∂/∂s = ½ (1 − r²/σ²) σ^(2b) / n for s = log σ², the weight σ^(2b) held fixed."""
    g = torch.Generator().manual_seed(1)
    n, b = 11, 0.5
    out = torch.randn(n, 2, generator=g, dtype=torch.float64).requires_grad_()
    y = torch.randn(n, 1, generator=g, dtype=torch.float64)
    HeteroscedasticGaussian(beta_nll=b).loss(out, y).backward()
    mu, s = out.detach()[:, :1], out.detach()[:, 1:]
    var, r = s.exp(), y - mu
    expected = torch.cat([-r / var * var**b, 0.5 * (1 - r**2 / var) * var**b], 1) / n
    torch.testing.assert_close(out.grad, expected, rtol=1e-12, atol=1e-14)
    # b = 0 is the plain Gaussian NLL (less ½ log 2π): its value checked against torch's
    loss0 = HeteroscedasticGaussian(beta_nll=0.0).loss(out.detach(), y)
    ref = torch.nn.functional.gaussian_nll_loss(out.detach()[:, :1], y, var, full=False, reduction="mean")
    torch.testing.assert_close(loss0, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ggn_with_the_likelihood_matches_the_dense_ggn(layout):
    """G V, its diagonal, and both product paths against (1/N) Σ Jᵀ H J formed densely with jacrev (float64)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 4)).double()
    if layout == "natural":
        net = nn.Sequential(net, NaturalParameterHead())
    X = torch.randn(19, 3, dtype=torch.float64)
    lik = HeteroscedasticGaussian(layout)
    params = {n: p.detach() for n, p in net.named_parameters()}
    theta = torch.cat([p.reshape(-1) for p in params.values()])

    def f(flat):
        parts, i = {}, 0
        for name, p in params.items():
            parts[name] = flat[i:i + p.numel()].reshape(p.shape)
            i += p.numel()
        return functional_call(net, parts, (X,))

    J = jacrev(f)(theta)
    H = lik.output_hessian_matrix(f(theta))
    G = torch.einsum("nmd,nmk,nke->de", J, H, J) / X.shape[0]
    V = torch.randn(theta.numel(), 3, dtype=torch.float64)
    tol = dict(rtol=1e4 * EPS64, atol=1e4 * EPS64 * float(G.abs().max()))
    for vectorize in (True, False):
        for reuse in (True, False):
            op = GGNOperator(net, X, loss=lik, vectorize_blocks=vectorize, reuse_linearization=reuse)
            torch.testing.assert_close(op @ V, G @ V, **tol)
    torch.testing.assert_close(op.diagonal(), torch.diagonal(G), **tol)
    assert resolve_likelihood("heteroscedastic") == HeteroscedasticGaussian()
    assert HeteroscedasticGaussian().beta("mean", 50) == 1.0 and HeteroscedasticGaussian().beta("standard", 50) == 50


def test_bad_likelihood_arguments_and_layouts_are_refused():
    with pytest.raises(ValueError, match="output must be one of"):
        HeteroscedasticGaussian("log_precision")
    with pytest.raises(ValueError, match="beta_nll"):
        HeteroscedasticGaussian(beta_nll=2.0)
    lik = HeteroscedasticGaussian("natural")
    with pytest.raises(ValueError, match="η2 ≥ 0"):
        lik.check_output(torch.tensor([[0.1, 0.5]]))
    with pytest.raises(ValueError, match="even number"):
        lik.check_output(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="non-finite"):
        HeteroscedasticGaussian().check_output(torch.tensor([[0.0, float("nan")]]))


# --------------------------------------------------------------------------------------------- the regressor
def _hetero_data(n, seed):
    """y = sin(3x) + x/2 + σ(x) ε with σ(x) growing 20× across x ∈ (−1, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n)
    sd = 0.05 * 20.0 ** ((x + 1) / 2)
    return x[:, None], np.sin(3 * x) + 0.5 * x + sd * rng.standard_normal(n), sd


FAST = dict(module_kwargs=dict(hidden_layer_sizes=(32,)), max_epochs=150, lr=3e-3, batch_size=64,
            max_components=10, random_state=0, dtype="float64")


@pytest.fixture(scope="module")
def fitted_pair():
    X, y, _ = _hetero_data(800, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the pooled conformal calibrator: the formulas below are those of one quantile and one scale (the
        # default, conformal within bands of σ̂, is tested in test_mondrian.py)
        kw = dict(calibration="conformal", calibration_size=0.25, **FAST)
        het = LaplaceActiveSubspaceRegressor(**grouped(likelihood="heteroscedastic", **kw)).fit(X, y)
        hom = LaplaceActiveSubspaceRegressor(**grouped(likelihood="gaussian", **kw)).fit(X, y)
    return het, hom


@pytest.fixture(scope="module")
def head_network():
    """A trained network with a variance head (2 outputs: μ, log σ²), the default MLP under
    ``likelihood=HeteroscedasticGaussian()`` (an instance: the variance head, not the noise stage)."""
    X, y, _ = _hetero_data(800, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(**grouped(likelihood=HeteroscedasticGaussian(), calibration="conformal",
                                                       calibration_size=0.25, **FAST)).fit(X, y)
    assert isinstance(est.likelihood_, HeteroscedasticGaussian)
    assert est.module_(torch.zeros(1, 1, dtype=torch.float64)).shape == (1, 2)
    return est


def test_conformal_intervals_cover_and_follow_the_noise(fitted_pair):
    """On 5000 new rows: coverage ≥ 1 − γ less a tolerance (the conformal coverage given 200 calibration rows is
    Beta-distributed, s.d. ≈ 0.021, plus the binomial s.d. 0.004 of the test rows: 3 s.d.), and in every fifth of
    the rows by their true noise level within 0.9 ± 0.08 (1000 rows each: binomial s.d. 0.0095, plus the calibration
    s.d.), while the homoscedastic default's intervals over-cover the quiet fifth and under-cover the noisy one."""
    het, hom = fitted_pair
    X, y, sd = _hetero_data(5000, 1)
    quintiles = np.array_split(np.argsort(sd), 5)
    cover = {}
    for name, est in (("het", het), ("hom", hom)):
        _, pis = est.predict_interval(X)
        inside = (y >= pis[:, 0, 0]) & (y <= pis[:, 1, 0])
        cover[name] = (inside.mean(), np.array([inside[q].mean() for q in quintiles]))
    assert cover["het"][0] >= 0.9 - 3 * 0.022
    assert np.all(np.abs(cover["het"][1] - 0.9) <= 0.08), cover["het"][1]
    assert cover["hom"][1][0] > 0.97 and cover["hom"][1][-1] < 0.82, cover["hom"][1]
    # the noise model follows the true noise: predict_noise_std against σ(x), within 35 %
    ratio = het.predict_noise_std(X) / sd
    assert np.median(np.abs(np.log(ratio))) < math.log(1.35)
    # the mean is the Gaussian network's, bit for bit (one network, the same training)
    np.testing.assert_array_equal(het.predict(X), hom.predict(X))
    # the defaults under this likelihood: β = Σ_n 1/σ²(x_n) over the training rows ("standard", scaling="auto": N/σ²
    # with each row's precision ratio σ²/σ²(x_n) in its record weight; σ² of the training residuals) and σ0 by
    # subspace EB; the Gaussian's β = 1/σ² ("mean")
    assert het.noise_source_ == "training" and het.posterior_.sigma0_method == "eb_subspace"
    Xt = het._check_fitted_X(_hetero_data(800, 0)[0][het.train_indices_])  # the training rows, network units
    row_var = het.likelihood_.row_noise_variance(None, Xt).to(torch.float64)
    assert het.beta_ == pytest.approx(float((1 / row_var).sum()), rel=1e-12)
    assert hom.beta_ == pytest.approx(1 / (hom.noise_std_ / hom.y_scale_[0]) ** 2)


def test_calibrated_std_has_the_maximum_likelihood_scale_and_a_better_held_out_nll(fitted_pair):
    """std_scale_² is the mean squared calibration score (the Gaussian MLE of the scale), and on new data the NLL of
    N(ŷ, std²) is not worse than that of the raw normalisation σ̂ = std / std_scale_, for both likelihoods."""
    X, y, _ = _hetero_data(3000, 2)
    for est in fitted_pair:
        np.testing.assert_allclose(est.std_scale_ ** 2, np.mean(est.conformity_scores_ ** 2, axis=0), rtol=1e-12)
        y_pred, std = est.predict(X, return_std=True)
        raw = std / est.std_scale_[0]

        def nll(s, y_pred=y_pred):
            return float(np.mean(0.5 * np.log(2 * np.pi * s**2) + 0.5 * (y - y_pred) ** 2 / s**2))

        assert nll(std) <= nll(raw) + 0.01, (nll(std), nll(raw))
        # the conformal interval is ŷ ± q σ̂ with the same σ̂
        _, pis = est.predict_interval(X[:20])
        q = est.conformity_scores_[int(math.ceil((est.n_calibration_rows_ + 1) * 0.9)) - 1, 0]
        np.testing.assert_allclose(pis[:, 1, 0] - pis[:, 0, 0], 2 * q * raw[:20], rtol=1e-9)


def test_heteroscedastic_predictive_moments_by_hand(fitted_pair):
    """ŷ = f(x; θ0) and std² = std_scale_² (σ²(x) + λ min(v, m) + max(λ, 1) (v − m)₊), σ²(x) the fitted noise
    model's and v = J Σ Jᵀ (the epistemic variance weighted by the calibration's λ up to its cap m), from the
    network, the noise model and the posterior directly."""
    het, _ = fitted_pair
    X, _, _ = _hetero_data(6, 3)
    Xt = torch.as_tensor((X - het.x_mean_) / het.x_scale_)
    with torch.no_grad():
        out = het.module_(Xt)
    assert out.shape == (6, 1)  # one output: the mean network
    noise = het.likelihood_.noise_model_.variance(Xt)[:, 0].numpy()
    var_f = het.posterior_.linearized_variance(Xt, het.n_components_)[:, 0]
    y_pred, std = het.predict(X, return_std=True)
    s = het.y_scale_[0]
    np.testing.assert_allclose(y_pred, out[:, 0].numpy() * s + het.y_mean_[0], rtol=1e-12)
    lam, m = het.calibrator_.epistemic_weight_[0], het.calibrator_.epistemic_cap_[0]
    v = var_f.numpy()
    expected = het.std_scale_[0] * np.sqrt(noise + lam * np.minimum(v, m) + max(lam, 1.0) * np.maximum(v - m, 0)) * s
    np.testing.assert_allclose(std, expected, rtol=1e-10)
    np.testing.assert_allclose(het.predict_noise_std(X), np.sqrt(noise) * s, rtol=1e-12)
    # sample_y draws y: over many draws, mean ŷ and variance σ² + σ_epi² (law of total variance), 5 s.e.
    draws = het.sample_y(X, n_samples=6000, random_state=4)
    raw_var = (noise + v) * s**2  # the posterior predictive's own variance (not calibrated)
    assert np.all(np.abs(draws.mean(1) - y_pred) < 5 * np.sqrt(raw_var / 6000))
    assert np.all(np.abs(draws.var(1) / raw_var - 1) < 5 * math.sqrt(2 / 6000) * 1.5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefit_module_with_a_declared_layout(layout):
    """A trained module that outputs (μ, log σ²) or (η1, η2) is used as θ0 as it is; its means and noise are read
    through the declared layout, and the module's weights are unchanged."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    if layout == "natural":
        net = nn.Sequential(net, NaturalParameterHead())
    X, y, _ = _hetero_data(120, 5)
    X_cal, y_cal, _ = _hetero_data(30, 10)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    lik = HeteroscedasticGaussian(layout)
    est = LaplaceActiveSubspaceRegressor(module=net, prefit=True, likelihood=lik, random_state=0,
                                         posterior=LowRank(max_components=5),
                                         compute=Compute(dtype="float64")).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    X_new, _, _ = _hetero_data(5, 12)  # rows the network was not trained on
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    with torch.no_grad():
        mu, var = lik.mean_and_variance(net(torch.as_tensor(X_new)))
    np.testing.assert_allclose(est.predict(X_new), mu[:, 0].numpy(), rtol=1e-12)
    np.testing.assert_allclose(est.predict_noise_std(X_new), var[:, 0].sqrt().numpy(), rtol=1e-12)
    _, pis = est.predict_interval(X_new)
    assert np.all(pis[:, 0, 0] < est.predict(X_new)) and np.all(est.predict(X_new) < pis[:, 1, 0])


def test_bad_layouts_and_settings_are_refused_clearly():
    X, y, _ = _hetero_data(60, 6)
    X_cal, y_cal, _ = _hetero_data(15, 11)
    cal = dict(X_cal=X_cal, y_cal=y_cal)  # prefit fits need calibration rows; the layout is refused first
    odd = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    with pytest.raises(ValueError, match="odd number"):
        LaplaceActiveSubspaceRegressor(module=odd, prefit=True, likelihood="heteroscedastic",
                                       compute=Compute(dtype="float64")).fit(X, y, **cal)

    class NaNVariance(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 2).double()

        def forward(self, x):
            out = self.lin(x)
            return torch.cat([out[:, :1], out[:, 1:] * float("nan")], 1)

    with pytest.raises(ValueError, match="non-finite"):
        LaplaceActiveSubspaceRegressor(module=NaNVariance(), prefit=True, likelihood="heteroscedastic",
                                       compute=Compute(dtype="float64")).fit(X, y, **cal)
    positive = nn.Sequential(nn.Linear(1, 2), nn.Softplus()).double()  # η2 > 0 is no natural parameter
    with pytest.raises(ValueError, match="η2 ≥ 0"):
        LaplaceActiveSubspaceRegressor(module=positive, prefit=True, likelihood=HeteroscedasticGaussian("natural"),
                                       compute=Compute(dtype="float64")).fit(X, y, **cal)
    with pytest.raises(ValueError, match="include_noise"):
        LaplaceActiveSubspaceRegressor(likelihood="heteroscedastic", training=Training(max_epochs=1),
                                       posterior=LowRank(include_noise=True)).fit(X, y)
    with pytest.raises(ValueError, match="classification"):
        LaplaceActiveSubspaceRegressor(likelihood=Categorical(), training=Training(max_epochs=1)).fit(X, y)
    with pytest.raises(ValueError, match="likelihood"):
        LaplaceActiveSubspaceRegressor(likelihood="poisson", training=Training(max_epochs=1)).fit(X, y)


def _sampled_coverage_by_hand(est, Xc, yc, d, level):
    """Coverage of the Gaussian intervals of N(μ̂, σ_ale² + σ_epi²) from S posterior samples (law of total
    variance), written out from the samples, in internal units."""
    from scipy import stats

    s = est.posterior_.predict_samples(Xc, d, n_samples=est.get_params()["posterior__n_samples"],
                                       random_state=est.calibrator_.sample_seed_)
    mu, var = s[..., 0], s[..., 1].clamp(-30, 30).exp()
    mean, total = mu.mean(0), var.mean(0) + mu.var(0, unbiased=False)
    half = stats.norm.ppf(0.5 + level / 2) * total.sqrt()
    return float(((yc - mean).abs() <= half).double().mean())


def test_the_papers_method_is_one_argument_away_with_the_heteroscedastic_likelihood():
    """calibration="coverage", posterior="subspace" with a variance head: the coverage calibrator (as for the
    Gaussian) searches d on the likelihood's own intervals, here the Gaussian intervals of N(ŷ, σ_ale² + σ_epi²)
    from posterior samples; every d in the table has the coverage of those intervals by hand, and the chosen d
    reaches the level where the one below it, if evaluated, does not."""
    from glas_sklearn.calibration import CoverageCalibrator

    X, y, _ = _hetero_data(300, 7)
    X_cal, y_cal, _ = _hetero_data(60, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(likelihood=HeteroscedasticGaussian(), calibration="coverage",
                                             random_state=0, training=Training(max_epochs=60, lr=3e-3),
                                             posterior=Subspace(n_samples=64, max_components=4),
                                             compute=Compute(dtype="float64")).fit(X, y, X_cal=X_cal,
                                                                                            y_cal=y_cal)
    assert est.predictive_.name == "sampled" and est.posterior_.posterior == "subspace"
    assert isinstance(est.calibrator_, CoverageCalibrator) and est.calibrator_.likelihood_ is est.likelihood_
    Xc = torch.as_tensor((X_cal - est.x_mean_) / est.x_scale_)
    yc = torch.as_tensor((y_cal - est.y_mean_[0]) / est.y_scale_[0])
    table = est.calibration_
    for d, cov in zip(table["d"], table["coverage"], strict=True):
        assert cov == pytest.approx(_sampled_coverage_by_hand(est, Xc, yc, int(d), 0.9), abs=1e-12)
    chosen = table.set_index("d")["coverage"]
    if est.calibration_reached_:
        assert chosen[est.n_components_] >= 0.9
        assert est.n_components_ - 1 not in chosen.index or chosen[est.n_components_ - 1] < 0.9
    np.testing.assert_allclose(est.std_scale_, 1.0)  # the posterior's own std under "coverage"
    _, pis = est.predict_interval(X[:4])
    assert pis.shape == (4, 2, 1)
    # the whole curve, d = 1 … 4, from the same samples
    curve = est.coverage_curve(X_cal, y_cal)
    assert list(curve["d"]) == [1, 2, 3, 4]
    for d, cov in zip(curve["d"], curve["coverage"], strict=True):
        assert cov == pytest.approx(_sampled_coverage_by_hand(est, Xc, yc, int(d), 0.9), abs=1e-12)


def test_user_conformity_score_coverage_curve_and_display_under_the_heteroscedastic_likelihood(fitted_pair,
                                                                                              head_network):
    """A user's ConformityScore instance is calibrated on the likelihood's predictive (ŷ = μ(x; θ0)) by split
    conformal as by hand; the calibrator is never None; coverage_curve gives the linearised Gaussian intervals of
    N(μ̂, σ² + σ_epi²) at every d by hand; the coverage Display draws from the estimator."""
    from scipy import stats

    from glas_sklearn.calibration import ConformalCalibrator

    assert isinstance(fitted_pair[0].calibrator_, ConformalCalibrator)  # the default, not None
    het = head_network  # a network with a variance head, used as a prefit module
    X, y, _ = _hetero_data(800, 0)
    X_cal, y_cal, _ = _hetero_data(50, 11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(module=het.module_, prefit=True, likelihood="heteroscedastic",
                                             sigma0="eb_full", random_state=0,
                                             calibration=ConformalCalibrator(AbsoluteResidual()),
                                             training=Training(standardize=False), posterior=LowRank(max_components=5),
                                             compute=Compute(dtype="float64"))
        est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    X_new, _, _ = _hetero_data(7, 12)
    with torch.no_grad():
        mu_cal = het.module_(torch.as_tensor(X_cal))[:, 0].numpy()
        mu_new = het.module_(torch.as_tensor(X_new))[:, 0].numpy()
    scores = np.sort(np.abs(y_cal - mu_cal))
    np.testing.assert_allclose(est.conformity_scores_[:, 0], scores, rtol=1e-12, atol=1e-12)
    q = scores[math.ceil(51 * 0.9 - 1e-9) - 1]
    y_pred, pis = est.predict_interval(X_new)
    np.testing.assert_allclose(y_pred, mu_new, rtol=1e-12)
    np.testing.assert_allclose(pis[:, 1, 0] - mu_new, q, rtol=1e-12)
    np.testing.assert_allclose(mu_new - pis[:, 0, 0], q, rtol=1e-12)
    # coverage_curve: the posterior's own linearised intervals μ̂ ± z sqrt(σ² + σ_epi²) at every d
    curve = est.coverage_curve(X_cal, y_cal, d_max=5)
    Xc = torch.as_tensor(X_cal)
    with torch.no_grad():
        out = het.module_(Xc)
    z = stats.norm.ppf(0.95)
    for d, cov, width in zip(curve["d"], curve["coverage"], curve["mean_width"], strict=True):
        epi = est.posterior_.linearized_variance(Xc, int(d))[:, 0]  # σ0 refitted at d by EB, as the curve does
        half = z * np.sqrt(out[:, 1].exp().numpy() + epi.numpy())
        assert cov == pytest.approx(np.mean(np.abs(y_cal - out[:, 0].numpy()) <= half), abs=1e-12)
        assert width == pytest.approx(2 * half.mean(), rel=1e-10)
    # the coverage Display of an estimator calibrated by coverage, under this likelihood
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from glas_sklearn.plotting import CoverageDisplay

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_cov = LaplaceActiveSubspaceRegressor(module=het.module_, prefit=True, likelihood="heteroscedastic",
                                                calibration="coverage", random_state=0,
                                                training=Training(standardize=False),
                                                posterior=LowRank(max_components=5),
                                                compute=Compute(dtype="float64")).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    disp = CoverageDisplay.from_estimator(by_cov)
    np.testing.assert_array_equal(disp.line_.get_xdata(), by_cov.calibration_["d"])
    np.testing.assert_allclose(disp.line_.get_ydata(), by_cov.calibration_["coverage"])


def test_sigma0_by_held_out_nll_under_the_heteroscedastic_likelihood(head_network):
    """sigma0="nll": the σ0 in [0, σ0_EB] of the lowest mean Gaussian NLL of N(μ̂, σ² + σ_epi²) on half of the
    calibration rows, both ends evaluated, the conformal scores from the other half (the trained network reused as
    a prefit module on the standardised data)."""
    het = head_network
    X, y, _ = _hetero_data(800, 0)
    X_cal, y_cal, _ = _hetero_data(200, 9)  # rows the network was not trained on

    def standardised(X, y):
        return (X - het.x_mean_) / het.x_scale_, (y - het.y_mean_[0]) / het.y_scale_[0]

    Xs, ys = standardised(X, y)
    Xc, yc = standardised(X_cal, y_cal)
    est = LaplaceActiveSubspaceRegressor(module=het.module_, prefit=True, likelihood="heteroscedastic", sigma0="nll",
                                         random_state=0, posterior=LowRank(max_components=10),
                                         compute=Compute(dtype="float64")).fit(Xs, ys, X_cal=Xc, y_cal=yc)
    search = est.sigma0_search_
    table = search.table
    assert set(table["sigma0"]) >= {0.0, search.sigma0_upper}
    assert search.nll == table["nll"].min() and est.sigma0_ == search.sigma0 <= search.sigma0_upper
    assert est.n_sigma0_rows_ + est.n_calibration_rows_ == 200 and est.conformity_scores_.shape == (100, 1)


def test_default_network_in_natural_parameters_is_trained_through_its_head():
    X, y, _ = _hetero_data(200, 8)
    est = LaplaceActiveSubspaceRegressor(**grouped(likelihood=HeteroscedasticGaussian("natural", beta_nll=0.0),
                                                   **{**FAST, "max_epochs": 20})).fit(X, y)
    assert isinstance(est.module_[-1], NaturalParameterHead)
    assert est.training_loss_[-1] < est.training_loss_[0]
    y_pred, std = est.predict(X[:10], return_std=True)
    assert np.isfinite(y_pred).all() and (std > 0).all() and (est.predict_noise_std(X[:10]) > 0).all()


def test_the_papers_method_with_the_fitted_noise_model():
    """likelihood="heteroscedastic" on the estimator's network under calibration="coverage": d is chosen on the
    Gaussian intervals f ± z sqrt(σ²(x) + σ_epi²) of the Gaussian network, σ²(x) the noise model's; every d in the
    table has the coverage of those intervals by hand (linearised predictive)."""
    from scipy import stats

    X, y, _ = _hetero_data(300, 7)
    X_cal, y_cal, _ = _hetero_data(60, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(likelihood="heteroscedastic", calibration="coverage", random_state=0,
                                             training=Training(max_epochs=60, lr=3e-3),
                                             posterior=Subspace(predictive="linearized", max_components=4),
                                             compute=Compute(dtype="float64")).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    Xc = torch.as_tensor((X_cal - est.x_mean_) / est.x_scale_)
    yc = (y_cal - est.y_mean_[0]) / est.y_scale_[0]
    with torch.no_grad():
        f = est.module_(Xc)[:, 0].numpy()
    noise = est.likelihood_.noise_model_.variance(Xc)[:, 0].numpy()
    z = stats.norm.ppf(0.95)
    for d, cov in zip(est.calibration_["d"], est.calibration_["coverage"], strict=True):
        epi = est.posterior_.linearized_variance(Xc, int(d))[:, 0].numpy()
        assert cov == pytest.approx(np.mean(np.abs(yc - f) <= z * np.sqrt(noise + epi)), abs=1e-12)
