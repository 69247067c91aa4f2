"""The noise stage after the mean network (glas_sklearn.likelihoods.noise_model) and likelihood="auto": one mean
network, the Gaussian's, and a noise model σ(x) of its residuals kept when cross-fitting on the training rows
supports it against one constant σ (always the Gaussian on a user module)."""

import logging

import numpy as np
import pytest
import torch
from torch import nn

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Training
from glas_sklearn.likelihoods import FittedNoiseGaussian, Gaussian, fit_noise_model, noise_support
from glas_sklearn.likelihoods.noise_model import MIN_SUPPORT_GAIN, SUPPORT_Z
from tests.reference import grouped


def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64).reshape(len(a), -1))


def _residual_data(sigma, n, seed, p=2):
    """Rows x ~ U(−1, 1)^p and targets y = σ(x) ε around a mean of 0 (the mean network's outputs)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, p))
    s = sigma(X)
    return _t(X), _t(s * rng.standard_normal(n)), _t(np.zeros(n)), s


# ---------------------------------------------------------------------------------------- the noise model
def test_noise_model_recovers_a_known_noise_level():
    """σ(x) = 0.1 exp(1.2 x0) (a 11× range along one of two features; the other does not move it): the boosted
    Gamma fit of |r| recovers it on new rows. Each leaf of the trees holds at least 40 rows, whose mean |r|/σ has
    a relative standard error sqrt(π/2 − 1)/sqrt(40) ≈ 0.12, i.e. about 0.12 in log σ; the trees are piecewise constant
    along a smooth σ(x) (bias), so the median |log σ̂/σ| is asked to be below 0.15 and the 95th percentile below
    0.4, on 4,000 rows."""
    def sigma(X):
        return 0.1 * np.exp(1.2 * X[:, 0])

    X, y, mean, _ = _residual_data(sigma, 4000, 0)
    model = fit_noise_model(X, y, mean, seed=0)
    X_new, _, _, s_new = _residual_data(sigma, 2000, 1)
    ratio = np.log(model.variance(X_new)[:, 0].numpy()) / 2 - np.log(s_new)
    assert np.median(np.abs(ratio)) < 0.15 and np.quantile(np.abs(ratio), 0.95) < 0.4
    assert model.variance(X_new).dtype == torch.float64 and model.variance(X_new).shape == (2000, 1)


def test_noise_model_evaluates_its_trees_as_scikit_learn_does():
    """The trees held as plain arrays give HistGradientBoostingRegressor.predict's E[|r| | x] on new rows (our numpy
    traversal against scikit-learn's own), rows with a missing feature routed as it routes them."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    from glas_sklearn.likelihoods import BoostedNoiseModel
    from glas_sklearn.likelihoods.noise_model import BOOSTING

    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, size=(1500, 3))
    r = np.abs((0.1 + X[:, 0] ** 2) * rng.standard_normal(1500)) + 1e-9
    boosted = HistGradientBoostingRegressor(**BOOSTING, random_state=0).fit(X, r)
    model = BoostedNoiseModel.from_boosted([boosted, boosted], np.zeros(2))
    X_new = rng.uniform(-1.5, 1.5, size=(700, 3))
    X_new[::7, 0] = np.nan
    expected = boosted.predict(X_new)
    got = model.mean_abs_residual(X_new)
    assert got.shape == (700, 2) and np.ptp(expected) > 0.1 * expected.mean()
    np.testing.assert_allclose(got, np.stack([expected, expected], 1), rtol=1e-12)


def test_noise_model_fits_every_target():
    """Two targets get a noise model each: one constant, one stepping 20× on the second feature."""
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, size=(600, 2))
    y = np.stack([0.1 * rng.standard_normal(600), (0.05 + (X[:, 1] > 0)) * rng.standard_normal(600)], axis=1)
    model = fit_noise_model(_t(X), _t(y), _t(np.zeros((600, 2))), seed=0)
    var = model.variance(_t(np.array([[0.0, -0.5], [0.0, 0.5]]))).numpy()
    assert var.shape == (2, 2) and var[1, 1] > 20 * var[0, 1]  # σ ≈ 0.05 against ≈ 1.05 on the second target
    assert var[1, 0] / var[0, 0] == pytest.approx(1.0, rel=0.5)  # the first target's noise does not move


def test_support_statistic_is_near_its_expectation_and_decides_by_the_noise():
    """A noise step (σ = 0.05 or 0.55 on either half): with the true σ(x) the expected gain per row over one
    constant σ is ½ log E σ² − E log σ = 0.856 nats; the cross-fitted noise model gets close (each fold's trees
    are fitted on half the rows), within 4 standard errors and a 0.1-nat allowance for the fitted model, and the
    test supports it. Constant noise on the same rows is not supported, on every one of 5 seeds."""
    def step(X):
        return 0.05 + 0.5 * (X[:, 0] > 0)

    expected = 0.5 * np.log((0.05**2 + 0.55**2) / 2) - (np.log(0.05) + np.log(0.55)) / 2
    X, y, mean, _ = _residual_data(step, 600, 0)
    out = noise_support(X, y, mean, seed=0)
    assert out["supported"] and out["n_rows"] == 600 and out["z"] == SUPPORT_Z and out["min_gain"] == MIN_SUPPORT_GAIN
    assert expected - 4 * out["nll_gain_se"] - 0.1 < out["nll_gain"] < expected + 4 * out["nll_gain_se"]
    for seed in range(5):
        X, y, mean, _ = _residual_data(lambda X: np.full(len(X), 0.3), 600, 10 + seed)
        out = noise_support(X, y, mean, seed=seed)
        assert not out["supported"] and out["nll_gain"] < SUPPORT_Z * out["nll_gain_se"] + MIN_SUPPORT_GAIN


def test_a_significant_but_negligible_gain_is_not_support():
    """On many rows a σ(x) that varies by ±5 % may pass the z test, but its gain (about Var(log σ) = 0.0025
    nats) is below the floor: a constant σ. ±40 % variation (gain about 0.16 nats) is supported."""
    for spread, expected in ((0.05, False), (0.4, True)):
        X, y, mean, _ = _residual_data(lambda X, spread=spread: np.exp(spread * 2 * X[:, 0]), 20_000, 3)
        out = noise_support(X, y, mean, seed=0)
        assert out["supported"] is expected
    # the floor is a parameter: 0 leaves the z test alone, which a ±5 % variation passes on this many rows
    X, y, mean, _ = _residual_data(lambda X: np.exp(0.05 * 2 * X[:, 0]), 20_000, 3)
    out = noise_support(X, y, mean, seed=0, min_gain=0.0, z=1.0)
    assert out["nll_gain"] < MIN_SUPPORT_GAIN and out["supported"] == (out["nll_gain"] > out["nll_gain_se"])


def test_no_test_on_too_few_rows():
    X, y, mean, _ = _residual_data(lambda X: 0.05 + (X[:, 0] > 0), 60, 0)
    out = noise_support(X, y, mean)
    assert not out["supported"] and np.isnan(out["nll_gain"]) and out["n_rows"] == 60


# ------------------------------------------------------------------------------------------- the regressor
def _data(noise, n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 2))
    return X, np.sin(2 * X[:, 0]) + noise(X) * rng.standard_normal(n)


def _fit(X, y, likelihood="auto", max_epochs=60, seed=0, **kw):
    return LaplaceActiveSubspaceRegressor(**grouped(likelihood=likelihood, max_epochs=max_epochs, n_components=5,
                                                    random_state=seed, device="cpu", n_threads=1, **kw)).fit(X, y)


def test_auto_keeps_sigma_x_where_the_noise_varies_around_the_gaussians_own_mean(caplog):
    """The noise steps up 30× on a feature that does not move the mean: auto keeps σ(x) (on 3 seeds), its
    predict_noise_std follows the step, and its mean is the Gaussian network's bit for bit (one network, the same
    seed and training path); likelihood="heteroscedastic" is the same noise stage without the test."""
    for seed in range(3):
        X, y = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0), seed=seed)
        with caplog.at_level(logging.INFO, logger="glas_sklearn"):
            est = _fit(X, y, seed=seed)
        assert isinstance(est.likelihood_, FittedNoiseGaussian)
        s = est.likelihood_support_
        assert s["supported"] and s["chosen"] == "heteroscedastic" and s["rows"] == "training"
        assert s["n_rows"] == est.n_records_
        sd = est.predict_noise_std(X)
        assert np.median(sd[X[:, 1] > 0]) > 5 * np.median(sd[X[:, 1] <= 0])  # σ(x) follows the noise
        gauss = _fit(X, y, "gaussian", seed=seed)
        np.testing.assert_array_equal(est.predict(X), gauss.predict(X))
        assert est.n_iter_ == gauss.n_iter_ and gauss.likelihood_support_ is None
    assert any("likelihood: auto chose heteroscedastic" in r.getMessage() for r in caplog.records)
    het = _fit(X, y, "heteroscedastic", seed=2)
    assert het.likelihood_support_ is None
    np.testing.assert_array_equal(het.predict(X), est.predict(X))
    np.testing.assert_allclose(het.predict_interval(X[:50])[1], est.predict_interval(X[:50])[1], rtol=1e-10)


def test_auto_is_gaussian_under_constant_noise():
    """Constant noise (3 seeds): the Gaussian, whose fit is likelihood="gaussian"'s (same intervals)."""
    for seed in range(3):
        X, y = _data(lambda X: 0.3, seed=seed)
        est = _fit(X, y, seed=seed)
        assert type(est.likelihood_) is Gaussian
        s = est.likelihood_support_
        assert not s["supported"] and s["chosen"] == "gaussian"
        assert np.ptp(est.predict_noise_std(X)) == 0
        gauss = _fit(X, y, "gaussian", seed=seed)
        np.testing.assert_array_equal(est.predict_interval(X[:50])[1], gauss.predict_interval(X[:50])[1])


def test_the_calibration_rows_are_never_used_before_calibration():
    """The same training rows with other calibration targets: the same network, the same test and the same noise
    model (only the calibration, which comes after, sees those rows)."""
    X, y = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0), n=500)
    X_cal, y_cal = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0), n=100, seed=5)
    fits = [LaplaceActiveSubspaceRegressor(**grouped(max_epochs=40, n_components=5, random_state=0, device="cpu",
                                                     n_threads=1)).fit(X, y, X_cal=X_cal, y_cal=y_cal + shift)
            for shift in (0.0, 10.0 * np.sin(7 * X_cal[:, 1]))]
    a, b = fits
    np.testing.assert_array_equal(a.predict(X), b.predict(X))
    assert a.likelihood_support_["nll_gain"] == b.likelihood_support_["nll_gain"]
    np.testing.assert_array_equal(a.predict_noise_std(X), b.predict_noise_std(X))
    assert not np.array_equal(a.conformity_scores_, b.conformity_scores_)  # the calibration did see them


def test_auto_is_gaussian_on_a_user_module():
    X, y = _data(lambda X: 0.05 + 0.5 * (X[:, 1] > 0), n=80)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    est = LaplaceActiveSubspaceRegressor(module=module, likelihood="auto", n_components=2, random_state=0,
                                         training=Training(max_epochs=3), compute=Compute(device="cpu")).fit(X, y)
    assert isinstance(est.likelihood_, Gaussian) and est.likelihood_support_ is None
    assert np.ptp(est.predict_noise_std(X)) == 0  # one noise level


@pytest.mark.parametrize("setting", [{"include_noise": True}, {"calibration": "coverage", "posterior": "subspace"}])
def test_auto_is_gaussian_under_the_papers_settings(setting):
    # the paper's calibration (d chosen by coverage) and intervals with the constant noise are the Gaussian's
    X, y = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0), n=150)
    est = LaplaceActiveSubspaceRegressor(**grouped(max_epochs=5, n_components=3, random_state=0, device="cpu",
                                                   **setting))
    est.fit(X, y)
    assert est.likelihood == "auto" and isinstance(est.likelihood_, Gaussian) and est.likelihood_support_ is None


def test_auto_is_gaussian_without_rows_to_test_on():
    X, y = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0), n=90)
    est = LaplaceActiveSubspaceRegressor(n_components=3, random_state=0, training=Training(max_epochs=5),
                                         compute=Compute(device="cpu")).fit(X, y)
    assert type(est.likelihood_) is Gaussian
    assert not est.likelihood_support_["supported"] and np.isnan(est.likelihood_support_["nll_gain"])


def test_a_fitted_noise_likelihood_instance_is_the_noise_stage_always_on():
    """likelihood=FittedNoiseGaussian() (an instance, no noise model yet) is likelihood="heteroscedastic": the same
    network, noise model and intervals, on a network built here and on a module of the user's."""
    X, y = _data(lambda X: 0.3, n=200)
    by_name = _fit(X, y, "heteroscedastic", max_epochs=5)
    by_object = _fit(X, y, FittedNoiseGaussian(), max_epochs=5)
    assert by_object.likelihood_.noise_model_ is not None and by_object.likelihood_support_ is None
    np.testing.assert_array_equal(by_object.predict_interval(X)[1], by_name.predict_interval(X)[1])
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    own = LaplaceActiveSubspaceRegressor(module=module, likelihood=FittedNoiseGaussian(), n_components=2,
                                         random_state=0, training=Training(max_epochs=3),
                                         compute=Compute(device="cpu")).fit(X, y)
    assert isinstance(own.likelihood_, FittedNoiseGaussian) and own.likelihood_.noise_model_ is not None
    assert own.predict_noise_std(X).shape == (200,) and np.all(own.predict_noise_std(X) > 0)


# ------------------------------------------------------------------------------- the curvature under σ(x)
class _KnownNoise:
    """A noise model of known σ²(x) per row and target."""

    def __init__(self, fn):
        self.fn = fn

    def variance(self, X):
        return self.fn(X)


def test_curvature_row_weights_are_the_precision_ratios():
    """σ²/σ²(x) per row (one target), the mean of the targets' ratios (several), 1 for a noise model constant at
    σ², and a clear error for a σ² of the wrong length; the Gaussian has none."""
    X = torch.linspace(-1, 1, 7, dtype=torch.float64).reshape(-1, 1)
    one = FittedNoiseGaussian().with_noise_model(_KnownNoise(lambda X: 0.1 + X**2))
    np.testing.assert_allclose(one.curvature_row_weights(X, 0.4).numpy(), (0.4 / (0.1 + X**2)).ravel().numpy(),
                               rtol=1e-15)
    two = FittedNoiseGaussian().with_noise_model(_KnownNoise(lambda X: torch.cat([0.5 + 0 * X, 0.1 + X**2], 1)))
    expected = 0.5 * (0.5 / 0.5 + 2.0 / (0.1 + X**2)).ravel()
    np.testing.assert_allclose(two.curvature_row_weights(X, np.array([0.5, 2.0])).numpy(), expected.numpy(),
                               rtol=1e-15)
    flat = FittedNoiseGaussian().with_noise_model(
        _KnownNoise(lambda X: torch.full((len(X), 1), 0.3, dtype=torch.float64)))
    np.testing.assert_allclose(flat.curvature_row_weights(X, 0.3).numpy(), np.ones(7), rtol=1e-15)
    with pytest.raises(ValueError, match="noise_var has 3 values for 2 targets"):
        two.curvature_row_weights(X, np.ones(3))
    assert Gaussian().curvature_row_weights(X, 0.3) is None


def test_the_posterior_under_sigma_x_weighs_each_row_by_its_precision():
    """With a noise model kept, the posterior's precision in its eigendirections, β λ_j, is the top of the dense
    Σ_n J_nᵀ J_n / σ²(x_n) (the Gauss-Newton matrix of N(f, σ²(x)) at the trained weights), and under the Gaussian
    the top of Σ_n J_nᵀ J_n / σ²; the same network (bit for bit), different curvatures. With row weights w_n the
    dense reference is Σ_n w_n J_nᵀ J_n / σ²(x_n), w normalised to mean 1 as fit does."""
    from sklearn.base import clone

    from tests.reference import dense_jacobian

    X, y = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0), n=300)
    w = np.random.default_rng(3).uniform(0.5, 2.0, len(y))
    for weight in (None, w):
        kw = dict(max_epochs=40, dtype="float64", calibration_size=0.2, scaling="standard")
        het = _fit(X, y, "heteroscedastic", **kw)
        gauss = _fit(X, y, "gaussian", **kw)
        if weight is not None:
            het = clone(het).fit(X, y, sample_weight=weight)
            gauss = clone(gauss).fit(X, y, sample_weight=weight)
        np.testing.assert_array_equal(het.predict(X), gauss.predict(X))
        rows = het.train_indices_
        Xt = het._check_fitted_X(X[rows])  # the training rows in the network's units
        J = dense_jacobian(het.module_, Xt).reshape(len(rows), -1)
        wt = (torch.ones(len(rows), dtype=torch.float64) if weight is None  # fit normalises weights to mean 1
              else torch.as_tensor((weight / weight.mean())[rows]))
        s2 = het.likelihood_.row_noise_variance(None, Xt).reshape(-1)
        assert float(s2.max() / s2.min()) > 20  # the noise model follows the step
        sigma2 = (gauss.noise_std_ / gauss.y_scale_[0]) ** 2
        for est, precision in ((het, wt / s2), (gauss, wt / float(sigma2))):
            dense = torch.linalg.eigvalsh(J.T @ (precision[:, None] * J)).flip(0)[:len(est.eigenvalues_)].numpy()
            np.testing.assert_allclose(est.beta_ * est.eigenvalues_, dense, rtol=1e-6, atol=1e-8 * dense[0])
        assert abs(het.beta_ * het.eigenvalues_[0] / (gauss.beta_ * gauss.eigenvalues_[0]) - 1) > 0.1
