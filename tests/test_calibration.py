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
    res = choose_dimension(post, X, labels, task="classification", predictive=predictive, linearized_method=method,
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
    with pytest.raises(ValueError, match="task"):
        choose_dimension(post, X, y, task="ranking")
    with pytest.raises(ValueError, match="predictive"):
        choose_dimension(post, X, y, predictive="exact")
    with pytest.raises(ValueError, match="d_max"):
        choose_dimension(post, X, y, d_max=0)
    with pytest.raises(ValueError, match="noise_var"):
        choose_dimension(post, X, y.long(), task="classification", noise_var=0.1)
    bad = X.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        choose_dimension(post, bad, y)
    with pytest.raises(TypeError, match="ActiveSubspacePosterior"):
        choose_dimension(object(), X, y)
    _, cpost, cX, labels = _classification_case()
    with pytest.raises(ValueError, match="between 0 and 1"):
        choose_dimension(cpost, cX, labels + 1, task="classification", predictive="linearized")


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
