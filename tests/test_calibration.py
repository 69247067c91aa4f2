"""choose_dimension on constructed posteriors whose coverage grows with d by design.

A bias-free linear model with one-hot inputs x = e_k and eigenvectors equal to coordinate axes: direction j
moves only the output of the records with k = j, so a record's interval (or set) has width 0 until its
direction is in the subspace (d > k). With k = [0]*5 + [1]*3 + [2] + [3], the coverage is exactly
0.5, 0.8, 0.9, 1.0 for d = 1, 2, 3, 4, for sampled and linearised predictives alike.
"""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from glas_sklearn.calibration import CalibrationResult, CalibrationWarning, choose_dimension
from glas_sklearn.likelihoods import Categorical, Gaussian
from glas_sklearn.posterior import ActiveSubspacePosterior
from glas_sklearn.predictive import interval_coverage, mean_interval_width, sampled_interval

from .reference import assert_unchanged, snapshot

KS = [0, 0, 0, 0, 0, 1, 1, 1, 2, 3]
EXPECTED = [0.5, 0.8, 0.9, 1.0]


def _one_hot():
    return torch.eye(4, dtype=torch.float64)[KS]


def _regression_case(sigma0=1.0):
    net = nn.Linear(4, 1, bias=False).double()
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    with torch.no_grad():
        net.weight.copy_(w[None])
    lam = torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    post = ActiveSubspacePosterior(net, lam, torch.eye(4, dtype=torch.float64), beta=1.0, sigma0=sigma0)
    X = _one_hot()
    sd = post.variances(4).sqrt() if sigma0 != "auto" else torch.full((4,), 2e-3, dtype=torch.float64)
    y = w[KS] + 0.5 * sd[KS]  # inside ±1.645 σ_k once direction k is in, outside the zero-width interval before
    return net, post, X, y


def _classification_case():
    net = nn.Linear(4, 2, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[0.0] * 4, [-3.0] * 4], dtype=torch.float64))
    # directions: the class-1 logit weight of input k (flat index 4 + k)
    P = torch.eye(8, dtype=torch.float64)[:, 4:]
    lam = torch.tensor([4e-3, 3e-3, 2e-3, 1e-3], dtype=torch.float64)
    post = ActiveSubspacePosterior(net, lam, P, beta=1.0, sigma0=10.0)  # σ_j² ≈ 70–90: class 1 becomes plausible
    labels = torch.ones(len(KS), dtype=torch.long)  # p(class 1) ≈ 0.05 without uncertainty: the 90 % set is {0}
    return net, post, _one_hot(), labels


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_regression_smallest_d_reaching_level(predictive):
    net, post, X, y = _regression_case()
    before = snapshot(net)
    res = choose_dimension(post, X, y, predictive=predictive, confidence_level=0.9, n_samples=2000, random_state=0)
    assert isinstance(res, CalibrationResult)
    assert res.n_components == 3 and res.reached
    assert res.coverage == pytest.approx(0.9) and res.confidence_level == 0.9
    assert res.sigma0 == 1.0
    assert list(res.table.columns) == ["d", "coverage", "mean_width", "sigma0"]
    assert res.table["d"].tolist() == [1, 2, 3]
    np.testing.assert_allclose(res.table["coverage"], EXPECTED[:3])
    assert np.all(np.diff(res.table["mean_width"]) > 0)
    assert_unchanged(net, before)


def test_regression_2d_targets_full_curve_and_reproducible():
    _, post, X, y = _regression_case()
    res = choose_dimension(post, X, y[:, None], confidence_level=0.9, full_curve=True, n_samples=500, random_state=3)
    assert res.n_components == 3
    np.testing.assert_allclose(res.table["coverage"], EXPECTED)
    again = choose_dimension(post, X, y[:, None], confidence_level=0.9, full_curve=True, n_samples=500,
                             random_state=3)
    pd.testing.assert_frame_equal(res.table, again.table)


def test_empirical_bayes_sigma0_refitted_per_d():
    _, post, X, y = _regression_case(sigma0="auto")
    res = choose_dimension(post, X, y.numpy(), predictive="linearized", full_curve=True, d_max=50)
    assert len(res.table) == 4  # d_max capped at K
    assert res.n_components == 3
    assert res.table["sigma0"].tolist() == [post.fit_sigma0(d) for d in range(1, 5)]
    assert res.sigma0 == post.fit_sigma0(3)


def test_noise_widens_regression_intervals():
    _, post, X, y = _regression_case()
    for predictive in ("linearized", "sampled"):
        res = choose_dimension(post, X, y, predictive=predictive, noise_var=1.0, n_samples=500, random_state=0)
        assert res.n_components == 1 and res.table["coverage"].iloc[0] == 1.0


def test_warns_when_never_reached():
    _, post, X, y = _regression_case()
    with pytest.warns(CalibrationWarning, match=r"best was 80\.0% at d=2"):
        res = choose_dimension(post, X, y, predictive="linearized", confidence_level=0.95, d_max=2)
    assert issubclass(CalibrationWarning, UserWarning)
    assert res.n_components == 2 and not res.reached
    assert res.coverage == pytest.approx(0.8)
    np.testing.assert_allclose(res.table["coverage"], EXPECTED[:2])


@pytest.mark.parametrize("predictive,method", [("sampled", "probit"), ("linearized", "probit"),
                                               ("linearized", "mc")])
def test_classification_smallest_d_reaching_level(predictive, method):
    net, post, X, labels = _classification_case()
    before = snapshot(net)
    res = choose_dimension(post, X, labels, likelihood=Categorical(), predictive=predictive, linearized_method=method,
                           confidence_level=0.9, n_samples=2000, random_state=0, full_curve=True)
    assert list(res.table.columns) == ["d", "coverage", "mean_set_size", "sigma0"]
    np.testing.assert_allclose(res.table["coverage"], EXPECTED)
    # a record's set holds both classes exactly when it is covered
    np.testing.assert_allclose(res.table["mean_set_size"], 1 + np.array(EXPECTED))
    assert res.n_components == 3 and res.reached
    assert_unchanged(net, before)


def test_progress_bar_only_when_verbose(capsys):
    _, post, X, y = _regression_case()
    choose_dimension(post, X, y, predictive="linearized", verbose=0)
    assert capsys.readouterr().err == ""
    choose_dimension(post, X, y, predictive="linearized", verbose=1)
    assert "calibrating d" in capsys.readouterr().err


def test_bad_inputs():
    _, post, X, y = _regression_case()
    with pytest.raises(ValueError, match="rows"):
        choose_dimension(post, X, y[:5])
    with pytest.raises(ValueError, match="shapes? "):
        choose_dimension(post, X, torch.stack([y, y], 1), predictive="linearized")
    with pytest.raises(ValueError, match="single number"):
        choose_dimension(post, X, y, confidence_level=[0.8, 0.9])
    with pytest.raises(ValueError, match="confidence_levels"):
        choose_dimension(post, X, y, confidence_level=1.0)
    with pytest.raises(TypeError, match="likelihood"):
        choose_dimension(post, X, y, likelihood="ranking")
    with pytest.raises(ValueError, match="predictive"):
        choose_dimension(post, X, y, predictive="exact")
    with pytest.raises(ValueError, match="d_max"):
        choose_dimension(post, X, y, d_max=0)
    with pytest.raises(ValueError, match="noise_var"):
        choose_dimension(post, X, y.long(), likelihood=Categorical(), noise_var=0.1)
    bad = X.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        choose_dimension(post, bad, y)
    with pytest.raises(TypeError, match="ActiveSubspacePosterior"):
        choose_dimension(object(), X, y)
    _, cpost, cX, labels = _classification_case()
    with pytest.raises(ValueError, match="between 0 and 1"):
        choose_dimension(cpost, cX, labels + 1, likelihood=Categorical(), predictive="linearized")
    with pytest.raises(ValueError, match="between 0 and 1"):  # the sampled search's linearised guess checks them too
        choose_dimension(cpost, cX, labels + 1, likelihood=Categorical(), predictive="sampled")


@pytest.mark.parametrize("predictive", ["sampled", "linearized"])
def test_single_given_dimension_matches_full_curve(predictive):
    _, post, X, y = _regression_case()
    full = choose_dimension(post, X, y, predictive=predictive, full_curve=True, n_samples=500, random_state=3)
    for d in (2, 4):
        with warnings.catch_warnings():  # d = 2 does not reach the level: the coverage is still reported
            warnings.simplefilter("ignore", CalibrationWarning)
            one = choose_dimension(post, X, y, predictive=predictive, d_min=d, d_max=d, n_samples=500,
                                   random_state=3)
        assert one.table["d"].tolist() == [d]
        np.testing.assert_allclose(one.table["coverage"], full.table.loc[full.table["d"] == d, "coverage"])
    with pytest.raises(ValueError, match="d_min"):
        choose_dimension(post, X, y, d_min=5, d_max=4)


def test_result_carries_the_seed_of_its_posterior_samples():
    """Drawing with ``sample_seed`` reproduces the samples behind the table (the estimators' predictions rely on
    it); one seed serves every d, whichever d are tried."""
    _, post, X, y = _regression_case()
    res = choose_dimension(post, X, y, full_curve=True, n_samples=300, random_state=7)
    assert isinstance(res.sample_seed, int)
    for d in (1, 3, 4):
        samples = post.predict_samples(X, d, n_samples=300, random_state=res.sample_seed)
        _, bounds = sampled_interval(samples, 0.9)
        row = res.table.loc[res.table["d"] == d].iloc[0]
        # the computation of choose_dimension replayed with its own seed: equal, not approximately
        assert float(interval_coverage(y[:, None], bounds)[0]) == row["coverage"]
        assert float(mean_interval_width(bounds)[0]) == row["mean_width"]
    one = choose_dimension(post, X, y, d_min=3, d_max=3, n_samples=300, random_state=7)
    assert one.sample_seed == res.sample_seed
    assert choose_dimension(post, X, y, n_samples=300, random_state=8).sample_seed != res.sample_seed
    # a different seed draws other samples: the widths move (the coverage, a ratio of 10 records, may not)
    other = post.predict_samples(X, 4, n_samples=300, random_state=res.sample_seed + 1)
    assert float(mean_interval_width(sampled_interval(other, 0.9)[1])[0]) != res.table["mean_width"].iloc[-1]


# ------------------------------------------------------------------------------ conformal


def test_conformal_quantile_hand_computation():
    from glas_sklearn.calibration import ConformalWarning, conformal_quantile

    s = np.array([0.7, 0.1, 0.5, 0.3, 0.9, 0.2, 0.8, 0.4, 0.6])  # n = 9; sorted: 0.1 … 0.9
    # ⌈10 · 0.8⌉ = 8 → 0.8; ⌈10 · 0.5⌉ = 5 → 0.5; ⌈10 · 0.75⌉ = 8 (7.5 rounds up) → 0.8; ⌈10 · 0.9⌉ = 9 → 0.9
    np.testing.assert_array_equal(conformal_quantile(s, [0.8, 0.5, 0.75, 0.9]), [0.8, 0.5, 0.8, 0.9])
    # one quantile per output column
    two = np.stack([s, 10 * s[::-1]], 1)
    np.testing.assert_array_equal(conformal_quantile(two, 0.5), [[0.5, 5.0]])
    # (n + 1)(1 − γ) = 100 · 0.9 is 90.00000000000001 in floating point: still the 90th smallest
    np.testing.assert_array_equal(conformal_quantile(np.arange(1.0, 100.0), 0.9), [90.0])
    # rank > n: infinite, with a warning (n = 9 supports levels up to 0.9)
    with pytest.warns(ConformalWarning, match="too few"):
        q = conformal_quantile(s, [0.9, 0.95])
    np.testing.assert_array_equal(q, [0.9, np.inf])
    with pytest.raises(ValueError, match="NaN"):
        conformal_quantile([0.1, np.nan], 0.5)
    with pytest.raises(ValueError, match="shape"):
        conformal_quantile(np.zeros((2, 2, 2)), 0.5)


def _gradient_descent(net, loss_fn, lr, steps):
    """Plain full-batch gradient descent (no torch.optim: its first import is slow)."""
    for _ in range(steps):
        net.zero_grad()
        loss_fn().backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad


def _trained_pool(n_pool=600, seed=0):
    """A small fitted network (trained on separate rows), its low-rank posterior, and a pool of fresh rows."""
    from glas_sklearn.laplace import fit_laplace_subspace

    g = torch.Generator().manual_seed(seed)

    def data(n):
        x = torch.rand(n, 1, generator=g, dtype=torch.float64) * 2 - 1
        y = torch.sin(3 * x[:, 0]) + (0.1 + 0.2 * x[:, 0].abs()) * torch.randn(n, generator=g, dtype=torch.float64)
        return x, y

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    x, y = data(80)
    _gradient_descent(net, lambda: ((net(x)[:, 0] - y) ** 2).mean(), lr=0.2, steps=300)
    fitted = fit_laplace_subspace(net, x, y[:, None], n_components=5, posterior="low_rank", random_state=0)
    xp, yp = data(n_pool)
    return fitted, xp, yp


def test_conformal_calibrate_matches_hand_computation_and_guarantee_by_simulation():
    from glas_sklearn.calibration import conformal_calibrate, conformal_quantile, regression_moments
    from glas_sklearn.predictive import conformal_interval

    fitted, xp, yp = _trained_pool()
    post, nv, d = fitted.posterior, fitted.noise_var, 5
    # σ̂² = σ_f² + σ² by the dense-free path the estimators use, checked against J Σ Jᵀ + σ² here
    mean, std = regression_moments(post, xp, d, noise_var=nv)
    torch.testing.assert_close(std**2, post.linearized_variance(xp, d) + nv, rtol=1e-10, atol=1e-14)
    res = conformal_calibrate(post, xp[:24], yp[:24], d=d, confidence_level=[0.9, 0.5], noise_var=nv)
    scores = ((yp[:24, None] - mean[:24]).abs() / std[:24]).numpy()
    np.testing.assert_allclose(res.scores, np.sort(scores, 0), rtol=1e-12)
    np.testing.assert_allclose(res.quantiles[:, 0], [np.sort(scores[:, 0])[22], np.sort(scores[:, 0])[12]], rtol=1e-12)
    np.testing.assert_allclose(res.quantile(0.9), res.quantiles[:1], rtol=0)
    assert list(res.table["level"]) == [0.9, 0.5] and (res.table["coverage"] >= [0.9, 0.5]).all()

    # the finite-sample guarantee: random exchangeable calibration/test splits of the pool. With n = 24 rows and
    # continuous scores, a test row is covered with probability exactly ⌈25 · 0.9⌉ / 25 = 0.92 (≥ 0.9)
    rng = np.random.default_rng(0)
    s_all = ((yp[:, None] - mean).abs() / std).numpy()[:, 0]
    n_cal, trials, level = 24, 3000, 0.9
    covs = np.empty(trials)
    for t in range(trials):
        perm = rng.permutation(len(yp))
        cal, test = perm[:n_cal], perm[n_cal:]
        q = conformal_quantile(s_all[cal], level)
        covs[t] = np.mean(s_all[test] <= q[0])  # y ∈ ŷ ± q σ̂  ⇔  |y − ŷ| / σ̂ ≤ q
        if t == 0:  # the same, through the interval bounds
            b = conformal_interval(mean[test], std[test], q).numpy()[:, 0, :, 0]
            assert covs[t] == np.mean((yp[test].numpy() >= b[:, 0]) & (yp[test].numpy() <= b[:, 1]))
    expected = 23 / 25
    se = covs.std(ddof=1) / np.sqrt(trials)  # ≈ 0.001: the per-split coverage varies like Beta(23, 2)
    assert covs.mean() >= level - 3 * se
    assert abs(covs.mean() - expected) < 4 * se
    # whereas the un-calibrated Gaussian ±1.645 σ̂ interval of the same posterior is not at 90 % here
    gauss = np.mean(np.abs(yp.numpy() - mean[:, 0].numpy()) <= 1.6448536 * std[:, 0].numpy())
    assert abs(gauss - level) > 0.02


def test_conformal_classification_lac_guarantee_by_simulation():
    from glas_sklearn.calibration import class_probabilities, conformal_calibrate, conformal_quantile
    from glas_sklearn.laplace import fit_laplace_subspace
    from glas_sklearn.predictive import conformal_sets

    g = torch.Generator().manual_seed(1)
    centers = torch.tensor([[0.0, 0.0], [1.2, 0.0], [0.0, 1.2]], dtype=torch.float64)

    def data(n):
        lab = torch.randint(0, 3, (n,), generator=g)
        return centers[lab] + 0.6 * torch.randn(n, 2, generator=g, dtype=torch.float64), lab

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x, lab = data(90)
    _gradient_descent(net, lambda: nn.functional.cross_entropy(net(x), lab), lr=0.5, steps=200)
    post = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior="low_rank",
                                random_state=0).posterior
    xp, lp = data(500)
    probs = class_probabilities(post, xp, 4, predictive="linearized")
    res = conformal_calibrate(post, xp[:30], lp[:30], d=4, likelihood=Categorical(), confidence_level=0.8,
                              predictive="linearized")
    s = (1 - probs[torch.arange(500), lp]).numpy()
    np.testing.assert_allclose(res.scores, np.sort(s[:30]), rtol=1e-12)
    assert res.quantiles[0] == pytest.approx(np.sort(s[:30])[24], rel=1e-12)  # ⌈31 · 0.8⌉ = 25
    rng = np.random.default_rng(1)
    covs = []
    for _ in range(2000):
        perm = rng.permutation(500)
        cal, test = perm[:30], perm[30:]
        q = conformal_quantile(s[cal], 0.8)
        covs.append(np.mean(s[test] <= q[0]))  # y ∈ {c : 1 − p_c ≤ q}  ⇔  1 − p_y ≤ q
        if len(covs) == 1:
            sets = conformal_sets(probs[test], q).numpy()[:, :, 0]
            assert covs[0] == sets[np.arange(len(test)), lp[test].numpy()].mean()
    covs = np.array(covs)
    se = covs.std(ddof=1) / np.sqrt(len(covs))
    assert covs.mean() >= 0.8 - 3 * se and abs(covs.mean() - 25 / 31) < 4 * se


# ------------------------------------------------------------------------------- the sampled search
# A sampled calibration evaluates S forward passes per d, so choose_dimension searches instead of scanning:
# it must return the full scan's d whenever "coverage ≥ level" is monotone in d, in a handful of evaluations.


def _axes_case(counts, task="regression", never=0):
    """The one-hot construction with K = len(counts) directions: counts[k] records move with direction k,
    so the coverage at d is (Σ_{k<d} counts[k]) / n, exactly (a monotone curve, flat where counts[k] = 0).
    ``never`` more records are never covered (their targets lie far outside every interval / their label
    is class 1 with a zero-variance logit)."""
    K = len(counts)
    ks = np.repeat(np.arange(K), counts).tolist() + [K - 1] * never
    X = torch.eye(K, dtype=torch.float64)[ks]
    lam = torch.linspace(2.0, 1.0, K, dtype=torch.float64)
    if task == "regression":
        net = nn.Linear(K, 1, bias=False).double()
        w = torch.linspace(-1.0, 1.0, K, dtype=torch.float64)
        with torch.no_grad():
            net.weight.copy_(w[None])
        post = ActiveSubspacePosterior(net, lam, torch.eye(K, dtype=torch.float64), beta=1.0, sigma0=1.0)
        sd = post.variances(K).sqrt()
        y = w[ks] + 0.1 * sd[ks]  # inside every interval of level ≥ 0.3 once direction k is in
        y[len(ks) - never:] += 100.0
        return post, X, y
    # input feature K (the never-covered records) has logits (5, −5) and no direction: its 90 % set is {0}
    net = nn.Linear(K + 1, 2, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[0.0] * K + [5.0], [-3.0] * K + [-5.0]], dtype=torch.float64))
    P = torch.eye(2 * K + 2, dtype=torch.float64)[:, K + 1:2 * K + 1]  # the class-1 logit weights of inputs < K
    post = ActiveSubspacePosterior(net, lam * 1e-3, P, beta=1.0, sigma0=10.0)
    X = torch.eye(K + 1, dtype=torch.float64)[ks[:len(ks) - never] + [K] * never]
    return post, X, torch.ones(len(ks), dtype=torch.long)


def _scan_answer(full, level):
    hit = full.table.loc[full.table["coverage"] >= level - 1e-12, "d"]
    return int(hit.iloc[0]) if len(hit) else None


_LIKELIHOOD = {"regression": Gaussian(), "classification": Categorical()}
PLATEAU_COUNTS = [2, 0, 0, 1, 0, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 2, 0, 1]  # n = 10 records, K = 20


@pytest.mark.parametrize("task,level", [("regression", v) for v in (0.3, 0.5, 0.6, 0.65, 0.8, 0.85, 0.9, 0.95)]
                         + [("classification", v) for v in (0.7, 0.9, 0.95)])
def test_sampled_search_returns_the_full_scans_d_on_a_curve_with_plateaus(task, level):
    post, X, y = _axes_case(PLATEAU_COUNTS, task)
    kw = dict(likelihood=_LIKELIHOOD[task], confidence_level=level, n_samples=400, random_state=1)
    full = choose_dimension(post, X, y, full_curve=True, **kw)
    # the construction: coverage (Σ_{k<d} counts) / n at every d
    np.testing.assert_allclose(full.table["coverage"], np.cumsum(PLATEAU_COUNTS) / 10, atol=1e-12)
    res = choose_dimension(post, X, y, **kw)
    expected = _scan_answer(full, level)
    assert res.reached and res.n_components == expected
    assert res.n_evaluations == len(res.table) == len(set(res.evaluation_order)) <= 3 + 1 + 5
    assert res.table["d"].tolist() == sorted(res.evaluation_order)
    # the rows are those of the full curve at the same d (the same samples: one seed, the same path replayed)
    ref = full.table.set_index("d").loc[res.table["d"]].reset_index()
    pd.testing.assert_frame_equal(res.table, ref)
    assert res.coverage == ref.set_index("d").loc[expected, "coverage"]


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_sampled_search_never_reached_costs_one_evaluation(task):
    post, X, y = _axes_case(PLATEAU_COUNTS, task, never=3)  # at most 10 of 13 records are ever covered
    kw = dict(likelihood=_LIKELIHOOD[task], confidence_level=0.9, n_samples=400, random_state=1)
    with pytest.warns(CalibrationWarning, match=r"best was 76\.9% at d=20"):
        res = choose_dimension(post, X, y, **kw)
    assert not res.reached and res.n_components == 20
    assert res.n_evaluations == 1 and res.table["d"].tolist() == [20]
    with pytest.warns(CalibrationWarning):
        full = choose_dimension(post, X, y, full_curve=True, **kw)
    assert _scan_answer(full, 0.9) is None and full.n_evaluations == 20


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1e2])
@pytest.mark.parametrize("level", [0.3, 0.65, 0.9])
def test_sampled_search_is_exact_with_a_misleading_linearised_guess(monkeypatch, scale, level):
    """The linearised curve only decides whether to scan from d_min first: with its variances scaled far off
    (the guess reaches the level much too early, too late or never), the answer is still the scan's."""
    post, X, y = _axes_case(PLATEAU_COUNTS)
    kw = dict(confidence_level=level, n_samples=400, random_state=1)
    full = choose_dimension(post, X, y, full_curve=True, **kw)
    original = post.linearized_variance
    monkeypatch.setattr(post, "linearized_variance", lambda *a, **k: scale * original(*a, **k))
    res = choose_dimension(post, X, y, **kw)
    assert res.n_components == _scan_answer(full, level)
    assert res.n_evaluations <= 3 + 1 + 5  # scan, d_max, bisection of 20


class _Curve:
    """A stand-in posterior whose sampled coverage at d is ``counts[d - 1] / n`` (any shape) and whose
    linearised coverage is ``guess[d - 1] / n``; it counts the sampled evaluations."""

    def __init__(self, post, counts, guess, n):
        self.counts, self.guess, self.n, self.calls = counts, guess, n, []
        self.post = post

    def predict_samples(self, X, d, n_samples=1000, random_state=None, batch_size=None):
        self.calls.append(d)
        s = torch.zeros(n_samples, self.n, 1, dtype=torch.float64)
        s[:, : self.counts[d - 1], 0] = torch.linspace(-1.0, 2.0, n_samples, dtype=torch.float64)[:, None]
        return s  # rows below the count: an interval around y = 0.5; the others: [0, 0]

    def predict_mean(self, X, batch_size=None):
        return torch.zeros(self.n, 1, dtype=torch.float64)

    def linearized_variance(self, X, d, full_cov=False, batch_size=None):
        var = torch.zeros(self.n, 1, dtype=torch.float64)
        var[: self.guess[d - 1]] = 1.0
        return var


def _fake(monkeypatch, counts, guess):
    n, K = 20, len(counts)
    net = nn.Linear(K, 1, bias=False).double()
    post = ActiveSubspacePosterior(net, torch.ones(K, dtype=torch.float64), torch.eye(K, dtype=torch.float64),
                                   beta=1.0, sigma0=1.0)
    fake = _Curve(post, counts, guess, n)
    for name in ("predict_samples", "predict_mean", "linearized_variance"):
        monkeypatch.setattr(post, name, getattr(fake, name))
    return post, fake, torch.zeros(n, K, dtype=torch.float64), torch.full((n,), 0.5, dtype=torch.float64)


def test_sampled_search_on_random_curves(monkeypatch):
    """Random curves (K = 50, 20 records), random guesses: monotone curves give the scan's d, with at most
    ⌈log2 K⌉ + 4 sampled evaluations (a scan of at most 3, d_max, bisection); curves that are not
    monotone give a d where the curve crosses the level (below it at d − 1, at or above it at d)."""
    rng = np.random.default_rng(0)
    K, n, level = 50, 20, 0.9
    need = int(np.ceil(level * n - 1e-9))
    worst = 0
    for trial in range(150):
        monotone = trial % 3 != 2
        if monotone:
            counts = np.sort(rng.integers(0, n + 1, K))
            if trial % 7 == 0:  # long plateaus just below the level
                counts = np.minimum(counts, need - 1)
                counts[rng.integers(K // 2, K):] = need
        else:
            counts = np.clip(np.sort(rng.integers(0, n + 1, K)) + rng.integers(-2, 3, K), 0, n)
        guess = np.clip(np.sort(rng.integers(0, n + 1, K)) if trial % 2 else counts + rng.integers(-3, 4, K), 0, n)
        post, fake, X, y = _fake(monkeypatch, counts.tolist(), guess.tolist())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            res = choose_dimension(post, X, y, confidence_level=level, n_samples=50, random_state=0)
        reached = counts >= need
        assert res.n_evaluations == len(fake.calls) == len(set(fake.calls))
        assert res.table["coverage"].tolist() == [counts[d - 1] / n for d in sorted(fake.calls)]
        if not reached[-1]:
            assert not res.reached and res.n_components == K
        else:
            d = res.n_components
            assert res.reached and reached[d - 1] and (d == 1 or not reached[d - 2])
        if monotone:
            expected = int(np.argmax(reached)) + 1 if reached.any() else K
            assert res.n_components == expected and res.reached == bool(reached.any())
            worst = max(worst, res.n_evaluations)
    assert worst <= int(np.ceil(np.log2(K))) + 4
