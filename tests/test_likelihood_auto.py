"""likelihood="auto": the heteroscedastic network when held-out rows support a noise level that varies with x, the
Gaussian otherwise (and always on a user module)."""

import logging

import numpy as np
import pytest
import torch
from torch import nn

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Training
from glas_sklearn.estimators._likelihood_choice import (
    MIN_SUPPORT_GAIN,
    SUPPORT_Z,
    likelihood_support,
    retraining_epochs,
)
from glas_sklearn.likelihoods import Gaussian, HeteroscedasticGaussian
from tests.reference import grouped


def _nll(y, mu, var):
    return 0.5 * ((y - mu) ** 2 / var + np.log(var))


def _reference_gain(y, mu_h, var_h, mu_g):
    """The test statistic from its definition, in numpy: per-row NLL of N(μ_g, s²) minus that of N(μ_h, c σ_h²),
    c and s² their maximum-likelihood values on these rows."""
    c = np.mean((y - mu_h) ** 2 / var_h)
    s2 = np.mean((y - mu_g) ** 2)
    d = _nll(y, mu_g, s2) - _nll(y, mu_h, c * var_h)
    return d.mean(), d.std(ddof=1) / np.sqrt(len(d))


def _outputs(mu, var):
    return torch.tensor(np.stack([mu, np.log(var)], axis=1))


def test_support_statistic_matches_its_definition_and_decides_by_the_noise():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 400)
    mu = np.sin(3 * x)
    sigma = 0.05 + 0.5 * (x > 0)  # 11x noise contrast
    y = mu + sigma * rng.standard_normal(400)
    lik = HeteroscedasticGaussian()
    out = likelihood_support(lik, _outputs(mu, sigma**2), torch.tensor(mu[:, None]), torch.tensor(y[:, None]))
    gain, se = _reference_gain(y, mu, sigma**2, mu)
    assert out["nll_gain"] == pytest.approx(gain, rel=1e-10) and out["nll_gain_se"] == pytest.approx(se, rel=1e-10)
    # with the true σ(x) and the same mean, the expected gain is ½ E log σ² − ½ log E σ² ... > 0: here ~0.56 nats
    assert out["supported"] and gain > 0.4
    assert out["heteroscedastic_scale"][0] == pytest.approx(np.mean((y - mu) ** 2 / sigma**2))
    # constant noise: σ(x) that varies by chance around the same mean is not supported
    y0 = mu + 0.3 * rng.standard_normal(400)
    wobble = 0.09 * np.exp(0.3 * rng.standard_normal(400))
    out0 = likelihood_support(lik, _outputs(mu, wobble), torch.tensor(mu[:, None]), torch.tensor(y0[:, None]))
    assert not out0["supported"] and out0["nll_gain"] < SUPPORT_Z * out0["nll_gain_se"]


def test_a_significant_but_negligible_gain_is_not_support():
    """On many rows a σ(x) that varies by ±5 % passes the z test, but its expected gain, Var(log σ) ≈ 0.0025
    nats (log σ normal: ½ log E σ² − E log σ), is below the floor: the Gaussian (the variance head would cost a
    second, 2–3× dearer training for nothing). The same rows with ±40 % variation (gain ≈ 0.16) are supported."""
    rng = np.random.default_rng(3)
    m = 200_000
    mu = np.zeros(m)
    lik = HeteroscedasticGaussian()
    for spread, expected in ((0.05, False), (0.4, True)):
        sigma = np.exp(spread * rng.standard_normal(m))
        y = sigma * rng.standard_normal(m)
        out = likelihood_support(lik, _outputs(mu, sigma**2), torch.tensor(mu[:, None]), torch.tensor(y[:, None]))
        gain, se = _reference_gain(y, mu, sigma**2, mu)
        assert out["nll_gain"] == pytest.approx(gain, rel=1e-9)
        assert gain == pytest.approx(spread**2, rel=0.25)  # Var(log σ)
        assert gain > SUPPORT_Z * se  # the z test alone would take the head both times
        assert out["supported"] is expected and out["min_gain"] == MIN_SUPPORT_GAIN
    # the floor is a parameter: 0 gives the z test alone
    assert likelihood_support(lik, _outputs(mu, sigma**2), torch.tensor(mu[:, None]), torch.tensor(y[:, None]),
                              min_gain=0.0)["supported"]


def test_support_judges_the_mean_too():
    # near noise-free targets: the heteroscedastic network's σ(x) follows its residuals, but its mean is 2x off the
    # homoscedastic network's (the failure measured in docs/benchmarks/studies.md#naval-like) -> Gaussian
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, 500)
    y = np.sin(3 * x)
    err_g = 1e-3 * rng.standard_normal(500)
    scale_h = 2e-3 * (0.5 + np.abs(x))
    err_h = scale_h * rng.standard_normal(500)
    out = likelihood_support(HeteroscedasticGaussian(), _outputs(y + err_h, scale_h**2),
                             torch.tensor((y + err_g)[:, None]), torch.tensor(y[:, None]))
    gain, _ = _reference_gain(y, y + err_h, scale_h**2, y + err_g)
    assert out["nll_gain"] == pytest.approx(gain, rel=1e-10)
    assert not out["supported"] and gain < 0


def _data(noise, n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 2))
    return X, np.sin(2 * X[:, 0]) + noise(X) * rng.standard_normal(n)


def _fit(X, y, likelihood="auto", **kw):
    kw = {"max_epochs": 60, **kw}
    return LaplaceActiveSubspaceRegressor(**grouped(likelihood=likelihood, n_components=5, random_state=0, device="cpu",
                                                    n_threads=1, **kw)).fit(X, y)


def test_auto_is_heteroscedastic_where_the_noise_varies(caplog):
    X, y = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0))
    with caplog.at_level(logging.INFO, logger="glas_sklearn"):
        est = _fit(X, y)
    assert isinstance(est.likelihood_, HeteroscedasticGaussian)
    s = est.likelihood_support_
    assert s["supported"] and s["chosen"] == "heteroscedastic" and s["rows"] == "held-out training"
    assert s["n_rows"] == int(np.ceil(0.2 * est.n_records_))
    assert any("likelihood: auto chose heteroscedastic" in r.getMessage() for r in caplog.records)
    sd = est.predict_noise_std(X)
    assert np.median(sd[X[:, 1] > 0]) > 5 * np.median(sd[X[:, 1] <= 0])  # σ(x) follows the noise
    # the kept network is the one likelihood="heteroscedastic" trains (same seed, all training rows) for the epochs
    # its held-out loss picked: same intervals
    best = s["best_epochs"]["heteroscedastic"]
    assert est.n_iter_ == s["retraining_epochs"] == (best if best <= 15 else 60)
    het = _fit(X, y, likelihood="heteroscedastic", max_epochs=s["retraining_epochs"])
    assert het.likelihood_support_ is None
    np.testing.assert_allclose(est.predict_interval(X[:50])[1], het.predict_interval(X[:50])[1], rtol=1e-5,
                               atol=1e-6 * np.std(y))


def test_auto_is_gaussian_under_constant_noise():
    X, y = _data(lambda X: 0.3)
    est = _fit(X, y)
    assert isinstance(est.likelihood_, Gaussian)
    s = est.likelihood_support_
    assert not s["supported"] and s["chosen"] == "gaussian"
    best = s["best_epochs"]["gaussian"]
    assert np.ptp(est.predict_noise_std(X)) == 0 and len(est.loss_curve_) == s["retraining_epochs"]
    assert s["retraining_epochs"] == (best if best <= 15 else 60)
    gauss = _fit(X, y, likelihood="gaussian", max_epochs=s["retraining_epochs"])
    np.testing.assert_allclose(est.predict_interval(X[:50])[1], gauss.predict_interval(X[:50])[1], rtol=1e-5,
                               atol=1e-6 * np.std(y))


def test_auto_tests_on_the_validation_rows_when_training_holds_them_out():
    X, y = _data(lambda X: 0.02 + 0.6 * (X[:, 1] > 0), n=300)
    est = _fit(X, y, early_stopping=True, calibration_size=30)
    s = est.likelihood_support_
    assert s["rows"] == "validation" and s["n_rows"] == len(est.validation_indices_) == 27


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
    assert isinstance(est.likelihood_, Gaussian)
    assert est.likelihood_support_["n_rows"] == 0 and not est.likelihood_support_["supported"]


def test_auto_on_small_data_retrains_for_the_epochs_the_held_out_rows_picked():
    """Below 2,000 rows under early_stopping="auto": both test networks stop on the 20 % held out (their curves
    end ``patience`` epochs after their lowest held-out loss, before max_epochs), and the chosen one is trained
    again on all rows for the epoch of its lowest held-out loss when that is in the first quarter of max_epochs
    (here: noise around a smooth mean, the held-out loss bottoms out early): the network likelihood=<chosen>
    trains for that many epochs."""
    X, y = _data(lambda X: 0.5, n=300)
    curves = []
    original = Training.fit

    def recording(self, *args, **kw):
        history = original(self, *args, **kw)
        curves.append((history.validation_scores if history.validation_indices is not None else None,
                       history.n_iter))
        return history

    est = LaplaceActiveSubspaceRegressor(n_components=5, random_state=0,
                                         training=Training(max_epochs=400, n_iter_no_change=2),
                                         compute=Compute(device="cpu", n_threads=1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Training, "fit", recording)
        est.fit(X, y)
    s = est.likelihood_support_
    assert len(curves) == 3
    (het_curve, het_run), (gauss_curve, gauss_run), (last_curve, last_run) = curves
    for curve, run, name in ((het_curve, het_run, "heteroscedastic"), (gauss_curve, gauss_run, "gaussian")):
        assert len(curve) == run < 400  # stopped early
        assert s["best_epochs"][name] == int(np.argmin(curve)) + 1 < run
    chosen = est.likelihood_.name
    assert s["best_epochs"][chosen] <= 100
    assert last_curve is None and last_run == est.n_iter_ == s["retraining_epochs"] == s["best_epochs"][chosen]
    ref = LaplaceActiveSubspaceRegressor(likelihood=chosen, n_components=5, random_state=0,
                                         training=Training(max_epochs=s["retraining_epochs"]),
                                         compute=Compute(device="cpu", n_threads=1)).fit(X, y)
    np.testing.assert_allclose(est.predict(X[:50]), ref.predict(X[:50]), rtol=1e-5, atol=1e-6 * np.std(y))
    # early_stopping=False keeps its meaning: all max_epochs epochs, for the test networks and the one kept
    off = LaplaceActiveSubspaceRegressor(n_components=5, random_state=0,
                                         training=Training(max_epochs=40, early_stopping=False),
                                         compute=Compute(device="cpu", n_threads=1)).fit(X, y)
    assert off.n_iter_ == 40 and "retraining_epochs" not in off.likelihood_support_


def test_retraining_epochs_keep_max_epochs_for_a_late_optimum():
    """An optimum after the first quarter of max_epochs (the curve flat or noisy there, and more rows move it
    later) keeps the full max_epochs; an early one is used as it is; at least 1 epoch."""
    def batch(rows):
        return 64
    assert retraining_epochs(126, 400, 500, batch, 500) == 500
    assert retraining_epochs(125, 400, 500, batch, 500) == 125
    assert retraining_epochs(37, 400, 500, batch, 500) == 37
    assert retraining_epochs(0, 400, 500, batch, 500) == 1
