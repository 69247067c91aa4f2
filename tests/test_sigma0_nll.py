"""σ0 by held-out NLL (``tune_sigma0``, ``sigma0="nll"``): against a brute-force grid of the NLL built from a dense
Σ and explicit Jacobians, the σ0 → 0 end against the MAP network, the conformal guarantee of the tuning /
conformal split by simulation, and the estimator's bookkeeping (rows, errors, pickling, clone, grid search)."""

import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from torch import nn
from torch.func import functional_call, jacrev

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import (
    CalibrationWarning,
    class_probabilities,
    conformal_calibrate,
    conformal_quantile,
    tune_sigma0,
)
from glas_sklearn.laplace import fit_laplace_subspace
from glas_sklearn.likelihoods import Categorical, Gaussian
from tests.reference import grouped

CENTERS = torch.tensor([[0.0, 0.0], [1.2, 0.0], [0.0, 1.2]], dtype=torch.float64)


def _blobs(n, g):
    lab = torch.randint(0, 3, (n,), generator=g)
    return CENTERS[lab] + 0.6 * torch.randn(n, 2, generator=g, dtype=torch.float64), lab


def _trained_classifier(seed=0):
    """A 2-6-3 tanh network trained by plain gradient descent on three overlapping blobs."""
    g = torch.Generator().manual_seed(seed + 1)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x, lab = _blobs(90, g)
    for _ in range(200):
        net.zero_grad()
        nn.functional.cross_entropy(net(x), lab).backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.5 * p.grad
    return net, x, lab, g


def _dense_jacobians(net, X):
    """J(x) of the logits with respect to all D weights, (n, C, D), by reverse mode on the flat weight vector."""
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for _, p in net.named_parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in net.parameters()])

    def f(flat):
        parts, i = {}, 0
        for n, s in zip(names, shapes, strict=True):
            parts[n] = flat[i:i + math.prod(s)].reshape(s)
            i += math.prod(s)
        return functional_call(net, parts, (X,))

    return jacrev(f)(theta)


def _dense_nll(post, net, X, lab, d, sigma0, per_row=False):
    """Mean −log p_y of the probit predictive, Σ = P diag(1/(βλ + σ0⁻²)) Pᵀ + σ0² (I − P Pᵀ) formed explicitly
    (``per_row``: the (n,) values)."""
    P = post.eigenvectors[:, :d]
    D = P.shape[0]
    if sigma0 == 0:
        sigma = torch.zeros(D, D, dtype=torch.float64)
    else:
        var = 1.0 / (post.beta * post.eigenvalues[:d] + sigma0**-2)
        sigma = (P * var) @ P.T + sigma0**2 * (torch.eye(D, dtype=torch.float64) - P @ P.T)
    J = _dense_jacobians(net, X)
    logit_var = torch.einsum("ncd,de,nce->nc", J, sigma, J)
    with torch.no_grad():
        probs = torch.softmax(net(X) / torch.sqrt(1 + math.pi / 8 * logit_var), -1)
    rows = -torch.log(probs[torch.arange(len(lab)), lab])
    return rows.numpy() if per_row else float(rows.mean())


@pytest.mark.parametrize("scaling,where", [("mean", "interior"), ("standard", "upper")])
def test_chosen_sigma0_against_a_dense_brute_force_grid(scaling, where):
    net, x, _, g = _trained_classifier()
    post = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior="low_rank", sigma0="eb_full",
                                scaling=scaling, random_state=0).posterior
    xt, lt = _blobs(40, g)
    d, upper = 4, post.fit_sigma0(4)
    res = tune_sigma0(post, xt, lt, d=d, likelihood=Categorical())
    assert res.sigma0_upper == upper and post.sigma0 == "eb_full" and post.fit_sigma0(d) == upper  # left as it was
    grid = np.exp(np.linspace(math.log(upper * 1e-4), math.log(upper), 801))  # spacing 0.0115 in log σ0
    nll = np.array([_dense_nll(post, net, xt, lt, d, s) for s in grid])
    nll_zero = _dense_nll(post, net, xt, lt, d, 0.0)
    assert res.nll_at_zero == pytest.approx(nll_zero, rel=1e-10)
    assert res.nll_at_upper == pytest.approx(nll[-1], rel=1e-10)
    assert res.nll == pytest.approx(_dense_nll(post, net, xt, lt, d, res.sigma0), rel=1e-10)
    best = int(np.argmin(nll))
    assert res.nll <= min(nll.min(), nll_zero) + 1e-9  # no grid point (nor σ0 = 0) is better than the search
    spacing = math.log(grid[1] / grid[0])
    if where == "upper":  # the EB end is best on these rows: it is evaluated exactly, and chosen
        assert best == len(grid) - 1 and nll_zero > nll[-1] and res.sigma0 == upper
    else:  # the grid's minimiser, within the grid spacing and the search's tolerance in log σ0
        assert 0 < best < len(grid) - 1 and nll_zero > nll[best]
        assert abs(math.log(res.sigma0) - math.log(grid[best])) <= spacing + res.xtol
        assert res.sigma0 < upper  # the EB value is too wide here: the case the search exists for


@pytest.mark.parametrize("rows", ["one_far_wrong_row", "random_rows", "random_and_three_far_wrong_rows"])
def test_one_se_rule_against_the_dense_per_row_nll(rows):
    """``rule="one_se"``: the smallest evaluated σ0 whose per-row NLL differences from the lowest have a mean within
    their standard error, recomputed from the dense Σ's per-row NLL at every evaluated σ0. A gain carried by one
    confidently wrong row far from the data (39 rows classified right beside it) is within one standard error: the
    lowest NLL is at σ0 > 0, the rule keeps σ0 = 0; a gain shared by several such rows is not."""
    net, x, _, g = _trained_classifier()
    post = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior="low_rank", sigma0="eb_full",
                                scaling="mean", random_state=0).posterior
    xt, lt = _blobs(200, g)
    far = torch.tensor([[-3.0, -3.0], [-3.5, -2.0], [-2.0, -3.5]], dtype=torch.float64)
    with torch.no_grad():
        wrong = torch.softmax(net(far), -1).argmin(1)  # the least probable class far from the data
        right = torch.nonzero(net(xt).argmax(1) == lt)[:, 0]
    if rows == "one_far_wrong_row":
        X, L = torch.cat([xt[right[:39]], far[:1]]), torch.cat([lt[right[:39]], wrong[:1]])
    elif rows == "random_rows":
        X, L = xt[:40], lt[:40]
    else:
        X, L = torch.cat([xt[:40], far]), torch.cat([lt[:40], wrong])
    lowest = tune_sigma0(post, X, L, d=4, likelihood=Categorical())
    res = tune_sigma0(post, X, L, d=4, likelihood=Categorical(), rule="one_se")
    assert res.rule == "one_se" and lowest.rule == "lowest" and lowest.sigma0 == lowest.sigma0_lowest
    # the same evaluations (the search does not depend on the rule): the same lowest
    assert res.sigma0_lowest == lowest.sigma0 and list(res.table.sigma0) == list(lowest.table.sigma0)
    sigmas = res.table.sigma0.to_numpy()
    dense = np.stack([_dense_nll(post, net, X, L, 4, s, per_row=True) for s in sigmas])  # (evaluations, n)
    np.testing.assert_allclose(res.table.nll, dense.mean(1), rtol=1e-9)
    best = int(np.argmin(dense.mean(1)))
    diff = dense - dense[best]
    se = diff.std(1, ddof=1) / math.sqrt(diff.shape[1])
    np.testing.assert_allclose(res.table.se, se, rtol=1e-6, atol=1e-12)
    expected = min(s for s, m, e in zip(sigmas, diff.mean(1), se, strict=True) if m <= e)
    assert res.sigma0 == expected and res.nll == pytest.approx(dense.mean(1)[list(sigmas).index(expected)])
    assert res.sigma0 <= lowest.sigma0
    if rows == "one_far_wrong_row":
        assert lowest.sigma0 > 0 and res.sigma0 == 0.0 and res.nll == res.nll_at_zero
    if rows == "random_and_three_far_wrong_rows":
        assert res.sigma0 > 0


def test_one_se_rule_takes_a_round_off_difference_for_none():
    """The one-SE choice: a larger σ0 whose mean NLL is below a smaller one's by a few ulps of the per-row NLLs'
    dtype (with a zero standard error, as when every row moves alike) does not beat it; a gain above round-off
    and above the standard error does, and one within the standard error does not."""
    from glas_sklearn.calibration.sigma0 import _one_se_choice

    sigmas, base = [1.0, 0.0], 0.07
    for dtype in (torch.float32, torch.float64):
        eps = torch.finfo(dtype).eps
        assert _one_se_choice(sigmas, [base, base + 4 * eps], [0.0, 0.0], eps=eps) == 1  # a few ulps
        assert _one_se_choice(sigmas, [base, base + 1e3 * eps], [0.0, 0.0], eps=eps) == 0  # a real gain
        assert _one_se_choice(sigmas, [base, base + 1e3 * eps], [0.0, 2e3 * eps], eps=eps) == 1  # within its SE
        assert _one_se_choice(sigmas, [base, base + 1e3 * eps], [0.0, math.nan], eps=eps) == 0  # no SE: none
    # the float32 tolerance is wider than float64's: the same difference is round-off for one, a gain for the other
    gap = 10 * torch.finfo(torch.float32).eps
    assert _one_se_choice(sigmas, [base, base + gap], [0.0, 0.0], eps=torch.finfo(torch.float32).eps) == 1
    assert _one_se_choice(sigmas, [base, base + gap], [0.0, 0.0], eps=torch.finfo(torch.float64).eps) == 0


def test_sigma0_zero_gives_the_map_probabilities_for_every_posterior_and_predictive():
    net, x, _, g = _trained_classifier()
    xt, _ = _blobs(30, g)
    with torch.no_grad():
        map_probs = torch.softmax(net(xt), -1)
    tol = dict(rtol=0, atol=20 * torch.finfo(torch.float64).eps)
    for kind in ("low_rank", "low_rank_diag", "subspace"):
        post = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior=kind,
                                    random_state=0).posterior
        assert post.set_sigma0(0.0) is post and post.fit_sigma0(2) == 0.0
        assert float(post.linearized_variance(xt, 4).abs().max()) == 0.0
        torch.testing.assert_close(class_probabilities(post, xt, 4, predictive="linearized"), map_probs, **tol)
        torch.testing.assert_close(class_probabilities(post, xt, 4, predictive="sampled", n_samples=5,
                                                       random_state=0), map_probs, **tol)
        post.set_sigma0("auto")  # back to empirical Bayes: the caches do not keep the zero variances
        assert post.fit_sigma0(4) > 0 and float(post.linearized_variance(xt, 4).max()) > 0


def test_set_sigma0_replaces_the_cached_variances():
    net, x, _, g = _trained_classifier()
    xt, _ = _blobs(10, g)
    post = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior="low_rank_diag",
                                random_state=0).posterior
    v_eb = post.linearized_variance(xt, 3)
    fresh = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior="low_rank_diag",
                                 sigma0=0.3, random_state=0).posterior
    post.set_sigma0(0.3)
    torch.testing.assert_close(post.linearized_variance(xt, 3), fresh.linearized_variance(xt, 3), rtol=1e-10,
                               atol=0)
    torch.testing.assert_close(post.sample_perturbations(4, 3, random_state=1),
                               fresh.sample_perturbations(4, 3, random_state=1), rtol=1e-10, atol=1e-14)
    post.set_sigma0("eb_full")
    torch.testing.assert_close(post.linearized_variance(xt, 3), v_eb, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="sigma0"):
        post.set_sigma0(-1.0)
    with pytest.raises(ValueError, match="sigma0"):
        post.set_sigma0("nll")  # a choice of the estimators (it needs held-out rows), not of the posterior


def test_regression_nll_is_the_gaussian_density_with_the_interval_noise():
    from glas_sklearn.calibration import predictive_nll

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    x = torch.rand(60, 1, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(60, generator=g, dtype=torch.float64)
    for _ in range(300):
        net.zero_grad()
        ((net(x)[:, 0] - y) ** 2).mean().backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.2 * p.grad
    fitted = fit_laplace_subspace(net, x, y[:, None], n_components=5, posterior="low_rank", random_state=0)
    post, nv = fitted.posterior, fitted.noise_var
    xt = torch.rand(30, 1, generator=g, dtype=torch.float64) * 4 - 2
    yt = torch.sin(2 * xt[:, 0]) + 0.1 * torch.randn(30, generator=g, dtype=torch.float64)
    res = tune_sigma0(post, xt, yt, d=5, likelihood=Gaussian(), noise_var=nv)
    post.set_sigma0(res.sigma0)
    with torch.no_grad():
        mu = net(xt)[:, 0]
    v = post.linearized_variance(xt, 5)[:, 0] + nv
    hand = float((0.5 * torch.log(2 * math.pi * v) + 0.5 * (yt - mu) ** 2 / v).mean())
    assert res.nll == pytest.approx(hand, rel=1e-10)
    assert predictive_nll(post, xt, yt, 5, likelihood=Gaussian(), noise_var=nv) == pytest.approx(hand, rel=1e-12)
    # per row: the standard errors of the one-SE rule, from the same density row by row
    one_se = tune_sigma0(post.set_sigma0("auto"), xt, yt, d=5, likelihood=Gaussian(), noise_var=nv, rule="one_se")
    per_row = []
    for s0 in one_se.table.sigma0:
        post.set_sigma0(float(s0))
        v = post.linearized_variance(xt, 5)[:, 0] + nv
        per_row.append((0.5 * torch.log(2 * math.pi * v) + 0.5 * (yt - mu) ** 2 / v).numpy())
    diff = np.array(per_row) - per_row[int(np.argmin(one_se.table.nll))]
    np.testing.assert_allclose(one_se.table.se, diff.std(1, ddof=1) / math.sqrt(30), rtol=1e-6, atol=1e-12)
    assert one_se.sigma0_lowest == res.sigma0 and one_se.sigma0 <= res.sigma0
    # without noise, σ0 = 0 is a zero-variance Gaussian: no density, never chosen
    assert math.isinf(tune_sigma0(post.set_sigma0("auto"), xt, yt, d=5, likelihood=Gaussian()).nll_at_zero)


def test_conformal_guarantee_survives_tuning_sigma0_on_other_rows_by_simulation():
    """Random exchangeable splits of a pool into tuning (σ0 by NLL), conformal and test rows: the LAC sets' mean
    test coverage is ⌈(n + 1)(1 − γ)⌉ / (n + 1) = 17 / 21 for n = 20 conformal rows at 80 %, whatever σ0 the
    tuning rows chose (continuous scores: exactly that, within its simulation error)."""
    net, x, _, g = _trained_classifier()
    post = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior="low_rank", sigma0="eb_full",
                                random_state=0).posterior
    xp, lp = _blobs(300, g)
    rng = np.random.default_rng(0)
    level, n_tune, n_conf, trials = 0.8, 20, 20, 300
    covs, chosen = np.empty(trials), set()
    for t in range(trials):
        perm = torch.as_tensor(rng.permutation(len(lp)))
        tune, conf, test = perm[:n_tune], perm[n_tune:n_tune + n_conf], perm[n_tune + n_conf:]
        post.set_sigma0("eb_full")
        res = tune_sigma0(post, xp[tune], lp[tune], d=4, likelihood=Categorical(), xtol=0.05)
        post.set_sigma0(res.sigma0)
        chosen.add(round(res.sigma0, 6))
        cal = conformal_calibrate(post, xp[conf], lp[conf], d=4, likelihood=Categorical(), confidence_level=level)
        q = conformal_quantile(cal.scores, level)[0]
        p_test = class_probabilities(post, xp[test], 4, predictive="linearized")
        covs[t] = float(((1 - p_test[torch.arange(len(test)), lp[test]]) <= q).to(torch.float64).mean())
    assert len(chosen) > 10  # σ0 really moves with the tuning rows
    se = covs.std(ddof=1) / np.sqrt(trials)
    assert covs.mean() >= level - 3 * se
    assert abs(covs.mean() - 17 / 21) < 4 * se


# ----------------------------------------------------------------------------------------- the estimators


def _labels(n, seed):
    rng = np.random.default_rng(seed)
    lab = rng.integers(0, 3, n)
    X = np.array([[0.0, 0.0], [1.5, 0.0], [0.0, 1.5]])[lab] + 0.7 * rng.standard_normal((n, 2))
    return X, np.array(["cat", "dog", "emu"])[lab]


FAST = dict(max_epochs=40, max_components=6, random_state=0, dtype="float64")


def test_default_classifier_tunes_sigma0_on_disjoint_stratified_reproducible_rows():
    X, y = _labels(120, 0)
    X_cal, y_cal = _labels(60, 1)
    clf = LaplaceActiveSubspaceClassifier(**grouped(**FAST)).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    tune = clf.sigma0_rows_
    conf = np.setdiff1d(np.arange(60), tune)
    assert clf.n_sigma0_rows_ == len(tune) == 30 and clf.n_calibration_rows_ == len(conf) == 30
    assert len(np.unique(tune)) == 30
    for c in clf.classes_:  # stratified: each class split as evenly as its count allows
        assert abs(2 * np.sum(y_cal[tune] == c) - np.sum(y_cal == c)) <= 1
    # σ0: the search on the tuning rows, fixed in the posterior, and what sigma0_ reports
    search = clf.sigma0_search_
    assert clf.posterior_.sigma0 == clf.sigma0_ == search.sigma0 and search.n_rows == 30
    # the network is the MAP under the N(0, 1) prior: the smallest σ0 within one standard error of the lowest NLL
    table = search.table
    assert clf.weight_decay_ > 0 and search.rule == "one_se"
    assert clf.sigma0_ == table.sigma0[table.nll - table.nll.min() <= table.se].min()
    assert 0 <= clf.sigma0_ <= search.sigma0_upper
    # the conformal scores are those of the other rows, at that σ0
    proba = clf.predict_proba(X_cal[conf])
    codes = np.searchsorted(clf.classes_, y_cal[conf])
    np.testing.assert_allclose(clf.conformity_scores_, np.sort(1 - proba[np.arange(30), codes]), rtol=1e-9,
                               atol=1e-12)
    # reproducible from random_state (the same path replayed: equal), another seed another split
    again = LaplaceActiveSubspaceClassifier(**grouped(**FAST)).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    np.testing.assert_array_equal(again.sigma0_rows_, tune)
    assert again.sigma0_ == clf.sigma0_
    other = LaplaceActiveSubspaceClassifier(**grouped(**{**FAST, "random_state": 1})).fit(X, y, X_cal=X_cal,
                                                                                           y_cal=y_cal)
    assert not np.array_equal(other.sigma0_rows_, tune)


def test_sigma0_rule_follows_where_the_network_comes_from():
    """A network trained here under a weight prior keeps σ0 = 0 unless a larger σ0 beats it by one standard error;
    the same network passed prefit, or one trained without a prior, gets the σ0 of the lowest NLL. Either way the
    search is the same (the same evaluations for the same network and rows)."""
    X, y = _labels(120, 0)
    X_cal, y_cal = _labels(60, 1)
    trained = LaplaceActiveSubspaceClassifier(**grouped(**FAST)).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    settings = {k: v for k, v in FAST.items() if k != "max_epochs"}
    prefit = LaplaceActiveSubspaceClassifier(**grouped(**settings, module=trained.module_, prefit=True))
    prefit.fit((X - trained.x_mean_) / trained.x_scale_, y, X_cal=(X_cal - trained.x_mean_) / trained.x_scale_,
               y_cal=y_cal)
    assert trained.sigma0_search_.rule == "one_se" and prefit.sigma0_search_.rule == "lowest"
    assert prefit.sigma0_ == prefit.sigma0_search_.sigma0_lowest
    assert trained.sigma0_search_.sigma0_lowest == pytest.approx(prefit.sigma0_search_.sigma0_lowest, rel=1e-6)
    no_prior = LaplaceActiveSubspaceClassifier(**grouped(**FAST, weight_decay=0.0))
    no_prior.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert no_prior.weight_decay_ in (None, 0.0) and no_prior.sigma0_search_.rule == "lowest"


def test_one_se_falls_back_to_the_lowest_for_a_likelihood_with_only_a_mean_nll():
    """A likelihood that redefines ``predictive_nll`` (not ``predictive_nll_rows``) is searched by its own mean NLL;
    with no per-row values the one-SE rule has no standard error and keeps the lowest."""

    class Doubled(Categorical):
        def predictive_nll(self, prediction, target):
            return 2.0 * super().predictive_nll(prediction, target)

    net, x, _, g = _trained_classifier()
    post = fit_laplace_subspace(net, x, loss="cross_entropy", n_components=4, posterior="low_rank", sigma0="eb_full",
                                random_state=0).posterior
    xt, lt = _blobs(40, g)
    plain = tune_sigma0(post, xt, lt, d=4, likelihood=Categorical())
    doubled = tune_sigma0(post, xt, lt, d=4, likelihood=Doubled(), rule="one_se")
    np.testing.assert_allclose(doubled.table.nll, 2 * plain.table.nll, rtol=1e-12)
    assert doubled.table.se.isna().all() and doubled.sigma0 == doubled.sigma0_lowest == plain.sigma0


@pytest.mark.parametrize("posterior", ["low_rank", "subspace"])
def test_classifier_sigma0_zero_is_the_network_s_own_probabilities(posterior):
    """``sigma0=0.0``: the trained network's softmax, one argument away (float32 network: a few ulps of 1); the
    regressor refuses it before training, since its normalised scores would divide by a zero std."""
    X, y = _labels(120, 0)
    settings = {**FAST, "dtype": "float32"}
    clf = LaplaceActiveSubspaceClassifier(**grouped(**settings, posterior=posterior), sigma0=0.0).fit(X, y)
    assert clf.sigma0_ == 0.0 and clf.sigma0_search_ is None
    with torch.no_grad():
        logits = clf.module_(torch.as_tensor((X - clf.x_mean_) / clf.x_scale_, dtype=torch.float32))
    np.testing.assert_allclose(clf.predict_proba(X), torch.softmax(logits.double(), -1).numpy(), rtol=0,
                               atol=32 * np.finfo(np.float32).eps)
    with pytest.raises(ValueError, match="sigma0 must be .* float > 0, got 0.0"):
        LaplaceActiveSubspaceRegressor(sigma0=0.0).fit(X, np.arange(120.0))


def test_sigma0_nll_errors_and_the_auto_fallback():
    X, y = _labels(80, 0)
    with pytest.raises(ValueError, match="sigma0='nll'.*calibration='coverage'"):
        LaplaceActiveSubspaceClassifier(**grouped(sigma0="nll", calibration="coverage", **FAST)).fit(X, y)
    X_cal, y_cal = _labels(9, 1)  # exactly the 9 rows a conformal quantile needs at 90 %: none left to tune on
    with pytest.raises(ValueError, match="at least 10 calibration rows"):
        LaplaceActiveSubspaceClassifier(**grouped(sigma0="nll", **FAST)).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    auto = LaplaceActiveSubspaceClassifier(**grouped(**FAST)).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    assert auto.posterior_.sigma0_method == "eb_full" and auto.n_sigma0_rows_ == 0 and auto.sigma0_search_ is None
    assert auto.n_calibration_rows_ == 9
    # with a fraction, the held-out rows are raised to 10 so that both parts exist
    frac = LaplaceActiveSubspaceClassifier(**grouped(calibration_size=0.05, **FAST)).fit(X, y)
    assert (frac.n_sigma0_rows_, frac.n_calibration_rows_) == (1, 9)
    # under the paper's calibration "auto" stays empirical Bayes
    with warnings.catch_warnings():  # whether the paper's calibration reaches 90 % is beside the point here
        warnings.simplefilter("ignore", CalibrationWarning)
        paper = LaplaceActiveSubspaceClassifier(**grouped(calibration="coverage", **FAST)).fit(X, y)
    assert paper.posterior_.sigma0_method == "eb_full" and paper.sigma0_search_ is None


def test_sigma0_nll_pickles_clones_and_grid_searches():
    X, y = _labels(150, 0)
    clf = LaplaceActiveSubspaceClassifier(**grouped(sigma0="nll", **FAST)).fit(X, y)
    back = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(back.predict_proba(X[:20]), clf.predict_proba(X[:20]))
    assert back.sigma0_ == clf.sigma0_ and back.sigma0_search_.sigma0 == clf.sigma0_search_.sigma0
    assert clone(clf).get_params()["sigma0"] == "nll"
    grid = GridSearchCV(LaplaceActiveSubspaceClassifier(**grouped(**FAST)), {"sigma0": ["nll", "eb_full"]}, cv=2,
                        scoring="neg_log_loss").fit(X, y)
    assert grid.best_params_["sigma0"] in ("nll", "eb_full")
    assert set(grid.cv_results_["param_sigma0"]) == {"nll", "eb_full"}


def test_regressor_sigma0_nll_and_its_unchanged_default():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (160, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(160)
    kw = dict(max_epochs=60, max_components=6, random_state=0, dtype="float64", include_noise=True)
    reg = LaplaceActiveSubspaceRegressor(**grouped(sigma0="nll", **kw)).fit(X, y)
    assert reg.sigma0_ == reg.posterior_.sigma0 == reg.sigma0_search_.sigma0
    # 16 calibration rows: the conformal part keeps the 9 a quantile needs at 90 %, 7 tune σ0
    assert (reg.n_sigma0_rows_, reg.n_calibration_rows_) == (7, 9) and reg.conformity_scores_.shape == (9, 1)
    _, pis = reg.predict_interval(X[:5])
    assert np.all(pis[:, 1, 0] > pis[:, 0, 0])
    default = LaplaceActiveSubspaceRegressor(**grouped(**kw)).fit(X, y)
    assert default.posterior_.sigma0_method == "eb_subspace" and default.sigma0_search_ is None
