"""MondrianConformalCalibrator: split conformal within bins of σ̂(x) (classes for classification).

- by hand: bin edges, per-bin quantiles (the ⌈(n_b + 1)(1 − γ)⌉-th smallest score of the bin, or interpolated
  between the ranks around (n_b + 1)(1 − γ)), intervals, the pooled quantile as a floor above the calibrated σ̂;
- the number of bins "auto" from the calibration rows;
- a simulation with known coverage: σ̂ that under-states the noise where it is large; over many seeds the coverage
  within every σ̂ bin is ≥ 1 − γ up to the Beta-binomial spread, where pooled split conformal under-covers the
  top bin far beyond it;
- end to end: calibration="mondrian" through the regressor (multi-output, sample weights, several levels, the
  heteroscedastic likelihood) and the classifier (class-conditional sets).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import (
    LAC,
    ConformalCalibrator,
    ConformalWarning,
    MondrianConformalCalibrator,
    StdNormalizedResidual,
    conformal_quantile,
    resolve_calibration,
    scores_alike_pvalue,
    std_bin_edges,
)
from glas_sklearn.likelihoods import Gaussian, HeteroscedasticGaussian, StudentT
from glas_sklearn.predictive import RegressionMoments
from tests.reference import grouped, step_noise_data

SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30, lr=0.05, batch_size=None,
             early_stopping=False, n_samples=50, max_components=3, dtype="float64", random_state=0)


def _moments(mean, std):
    t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64).reshape(len(a), -1))  # noqa: E731
    return RegressionMoments(t(mean), t(std))


def _rank(n, level):
    return int(math.ceil((n + 1) * level - 1e-9))


def test_bins_and_quantiles_by_hand():
    rng = np.random.default_rng(0)
    n = 40
    std = np.repeat([1.0, 2.0], n // 2)  # two σ̂ levels: the bins are exactly the two halves
    resid = rng.standard_normal(n) * np.repeat([1.0, 5.0], n // 2)
    cal = MondrianConformalCalibrator(n_bins=2, quantile_method="higher").calibrate_predictions(
        _moments(np.zeros(n), std), torch.as_tensor(resid[:, None]), 0.8)
    interp = MondrianConformalCalibrator(n_bins=2).calibrate_predictions(
        _moments(np.zeros(n), std), torch.as_tensor(resid[:, None]), 0.8)
    assert cal.edges_[0].tolist() == [1.5]  # the median of the σ̂ (interpolated between the halves)
    for b, half in enumerate((slice(0, 20), slice(20, 40))):
        s = np.sort(np.abs(resid[half]) / std[half])
        assert np.array_equal(cal.bin_scores_[0][b], s)
        assert cal.bins_["quantile"][b] == s[_rank(20, 0.8) - 1]  # the 17th of 20
        # interpolated: rank 21 · 0.8 = 16.8, 80 % of the way from the 16th to the 17th
        assert interp.bins_["quantile"][b] == pytest.approx(s[15] + 0.8 * (s[16] - s[15]))
    q0, q1 = cal.bins_["quantile"]
    # new rows: σ̂ 0.5 (below every calibration σ̂: bin 0), 1 (bin 0), 1.5 (the edge; right-closed: bin 0), 2 (bin 1,
    # the highest calibration σ̂), 3 (above it: the larger of bin 1's and the pooled quantile)
    bounds = cal.region(_moments([0.0, 1.0, 2.0, 3.0, 4.0], [0.5, 1.0, 1.5, 2.0, 3.0]), [0.8, 0.5])
    assert bounds.shape == (5, 1, 2, 2)
    upper = bounds[:, 0, 1, 0].numpy()
    scores = np.abs(resid) / std
    q_pooled = np.sort(scores)[_rank(40, 0.8) - 1]
    assert upper == pytest.approx([0.5 * q0, 1.0 + q0, 2.0 + 1.5 * q0, 3.0 + 2.0 * q1, 4.0 + 3.0 * max(q1, q_pooled)])
    # another level from the stored scores
    q_half = np.sort(np.abs(resid[20:]) / 2.0)[_rank(20, 0.5) - 1]
    assert float(bounds[3, 0, 1, 1]) == pytest.approx(3.0 + 2.0 * q_half)
    assert float(bounds[4, 0, 1, 1]) == pytest.approx(4.0 + 3.0 * max(q_half, np.sort(scores)[_rank(40, 0.5) - 1]))


def test_pooled_floor_above_the_calibrated_std_is_what_protects_extrapolated_rows():
    """Where σ̂ over-states the noise at its top (the last bin's quantile is the smallest), rows beyond every
    calibration σ̂ take the pooled quantile, and the std of predict is not scaled below σ̂ there."""
    rng = np.random.default_rng(3)
    n = 200
    std = rng.uniform(1.0, 2.0, n)
    resid = rng.standard_normal(n) * np.where(std > 1.8, 0.3, 1.0) * std  # the top fifth over-stated 3×
    cal = MondrianConformalCalibrator(n_bins=5).calibrate_predictions(
        _moments(np.zeros(n), std), torch.as_tensor(resid[:, None]), 0.9)
    q_last = cal.bins_["quantile"].iloc[-1]
    q_pooled = conformal_quantile(np.abs(resid) / std, 0.9, method="interpolated")[0]
    assert q_last < 0.6 * q_pooled
    inside, beyond = cal.std_max_[0] * 0.999, cal.std_max_[0] * 1.5
    up = cal.region(_moments(np.zeros(2), [inside, beyond]), 0.9)[:, 0, 1, 0].numpy()
    assert up == pytest.approx([inside * q_last, beyond * q_pooled])
    factor = cal.bin_std_factors(np.array([[inside], [beyond]]))[:, 0]
    last, pooled_ms = cal.bin_scores_[0][-1], np.mean((resid / std) ** 2)
    k = MondrianConformalCalibrator.SCALE_PRIOR_ROWS  # the bin's mean square shrunk towards the pooled one
    assert factor[0] == pytest.approx(np.sqrt((np.sum(last**2) + k * pooled_ms) / (last.size + k) / pooled_ms))
    assert factor[0] < 0.9 and factor[1] == 1.0


def _by_hand(cal, sd, level):
    """Per row of σ̂ ``sd`` (internal units, one output): the quantile (the row's bin's interpolated one, the pooled
    one as a floor above the calibrated σ̂) and the std factor (the bin's mean square shrunk by 30 pooled rows)."""
    bins, pooled = cal.bin_scores_[0], np.concatenate(cal.bin_scores_[0])
    b = np.searchsorted(cal.edges_[0], sd, side="left")
    q = np.array([conformal_quantile(bins[i], level, method="interpolated")[0] for i in b])
    ms = np.mean(pooled**2)
    f = np.array([np.sqrt((np.sum(bins[i] ** 2) + 30 * ms) / (bins[i].size + 30) / ms) for i in b])
    above = sd > cal.std_max_[0]
    q[above] = np.maximum(q[above], conformal_quantile(pooled, level, method="interpolated")[0])
    f[above] = np.maximum(f[above], 1.0)
    return q, f


def test_a_level_higher_than_the_bins_were_made_for_merges_neighbouring_bins():
    """Bins of 20 rows serve 90 % (≥ 9 rows); at predict time 97.5 % needs ⌈1/0.025⌉ − 1 = 39 rows, so bins are
    merged in neighbouring pairs and each pair's quantile (by hand) is used, finite, without a warning; 99.5 %
    needs 199 rows, more than there are: infinite, with the warning."""
    rng = np.random.default_rng(1)
    n = 80
    std = np.repeat([1.0, 2.0, 3.0, 4.0], n // 4)
    resid = rng.standard_normal(n) * std * np.repeat([1.0, 2.0, 0.5, 1.5], n // 4)
    cal = MondrianConformalCalibrator(n_bins=4, quantile_method="higher").calibrate_predictions(
        _moments(np.zeros(n), std), torch.as_tensor(resid[:, None]), 0.9)
    assert len(cal.edges_[0]) == 3
    scores = np.abs(resid) / std
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a finite quantile everywhere: no warning
        bounds = cal.region(_moments(np.zeros(4), [1.0, 2.0, 3.0, 4.0]), [0.9, 0.975])
    for row, pair in enumerate((slice(0, 40), slice(0, 40), slice(40, 80), slice(40, 80))):
        q_pair = np.sort(scores[pair])[_rank(40, 0.975) - 1]
        assert float(bounds[row, 0, 1, 1]) == pytest.approx((row + 1.0) * q_pair)
        own = np.sort(scores[20 * row:20 * (row + 1)])[_rank(20, 0.9) - 1]  # 90 %: each bin its own
        assert float(bounds[row, 0, 1, 0]) == pytest.approx((row + 1.0) * own)
    with pytest.warns(ConformalWarning, match="too few"):
        wide = cal.region(_moments(np.zeros(1), [1.0]), 0.995)
    assert np.isinf(float(wide[0, 0, 1, 0]))


def test_bins_are_merged_until_each_has_a_finite_quantile():
    std = np.r_[np.ones(30), np.linspace(2, 3, 10)]  # 30 ties, then 10 distinct
    edges = std_bin_edges(std, 4, min_rows=9)
    counts = np.bincount(np.searchsorted(edges, std, side="left"))
    assert counts.min() >= 9 and counts.sum() == 40
    assert std_bin_edges(std, 4, min_rows=41).size == 0  # one bin when the rows cannot fill two


@pytest.mark.parametrize(("n", "level", "min_bin_size", "min_bins", "expected"),
                         [(1000, 0.9, 100, 5, 10), (250, 0.9, 100, 5, 5), (50, 0.9, 100, 5, 5), (5000, 0.9, 100, 5, 10),
                          (100, 0.95, 10, 5, 5), (100, 0.9, 5, 5, 10), (28, 0.9, 200, 5, 3), (69, 0.9, 200, 5, 5),
                          (8, 0.9, 200, 5, 1), (60, 0.95, 200, 5, 3), (630, 0.9, 200, 5, 5), (1400, 0.9, 200, 5, 7),
                          (250, 0.9, 100, 1, 2), (50, 0.9, 100, 1, 1), (69, 0.9, 200, 3, 3)])
def test_auto_number_of_bins(n, level, min_bin_size, min_bins, expected):
    # max(⌊n / max(min_bin_size, m)⌋, min(min_bins, ⌊n / m⌋)), at most 10, m = ⌈1/γ⌉ − 1: 19 rows at 95 %, 9 at 90 %
    cal = MondrianConformalCalibrator(min_bin_size=min_bin_size, min_bins=min_bins)
    assert cal.bins_for(n, level) == expected
    # min_bins="auto": 5 for a likelihood whose network predicts the noise per row, 1 for the others
    if min_bins in (1, 5):
        lik = HeteroscedasticGaussian() if min_bins == 5 else Gaussian()
        assert MondrianConformalCalibrator(min_bin_size=min_bin_size).bins_for(n, level, lik) == expected


def test_min_bins_auto_follows_the_likelihood():
    cal = MondrianConformalCalibrator()
    assert cal.resolved_min_bins(HeteroscedasticGaussian()) == 5
    assert cal.resolved_min_bins(Gaussian()) == cal.resolved_min_bins(StudentT()) == cal.resolved_min_bins(None) == 1
    with pytest.raises(ValueError, match="min_bins must be an integer >= 1 or 'auto'"):
        MondrianConformalCalibrator(min_bins=0).bins_for(100, 0.9)


def _alike_or_not(rng, n: int, differ: bool):
    """σ̂ uniform on [1, 2] and targets around 0 whose std is σ̂, or (``differ``) 2σ̂ where σ̂ < 1.2 (the lowest
    fifth): there σ̂ under-states the error twofold."""
    sd = rng.uniform(1.0, 2.0, n)
    return sd, sd * np.where(differ & (sd < 1.2), 2.0, 1.0) * rng.standard_normal(n)


def test_min_bins_auto_takes_bands_where_the_scores_differ_across_them():
    """min_bins="auto" for a likelihood without a noise head, 150 calibration rows, 300 simulated studies each:
    where the scores do not depend on σ̂ the Kruskal–Wallis test takes five bands in 10 % of the studies (its
    level; binomial ± 4 SE) and coverage stays 90 % on average (± 4 SE of the mean over studies); where σ̂
    under-states the error twofold in its lowest fifth it takes them in most studies, and that fifth's
    coverage rises from about 69 % with one band (by construction: the pooled quantile of a mixture) to 80 % or
    more."""
    def m(a):
        return torch.as_tensor(a.reshape(-1, 1))

    for differ in (False, True):
        banded, coverage, low_auto, low_one = [], [], [], []
        for r in range(300):
            rng = np.random.default_rng(r)
            sd, y = _alike_or_not(rng, 150, differ)
            sd_t, y_t = _alike_or_not(rng, 2000, differ)
            for min_bins in ("auto", 1):
                cal = MondrianConformalCalibrator(min_bins=min_bins).calibrate_predictions(
                    RegressionMoments(m(np.zeros(150)), m(sd)), m(y), 0.9, Gaussian())
                b = cal.region(RegressionMoments(m(np.zeros(2000)), m(sd_t)), 0.9)[:, 0, :, 0].numpy()
                hit = (y_t >= b[:, 0]) & (y_t <= b[:, 1])
                if min_bins == "auto":
                    assert np.isfinite(cal.band_pvalue_[0]) and cal.min_bins_ == 1
                    banded.append(len(cal.edges_[0]) == 4)
                    coverage.append(hit.mean())
                    low_auto.append(hit[sd_t < 1.2].mean())
                else:
                    low_one.append(hit[sd_t < 1.2].mean())
        if not differ:
            assert abs(np.mean(banded) - 0.1) < 4 * math.sqrt(0.1 * 0.9 / 300)
            assert abs(np.mean(coverage) - 0.9) < 4 * np.std(coverage) / math.sqrt(300)
        else:
            assert np.mean(banded) > 0.6
            assert np.mean(low_one) < 0.75 and np.mean(low_auto) > 0.8


def test_scores_alike_pvalue_is_kruskal_wallis_over_the_std_bands():
    """The p-value is Kruskal–Wallis's over the equal-count bands of σ̂ (the bands by hand: sorted σ̂ in five
    runs of 30 rows), 1.0 with one band or equal scores."""
    rng = np.random.default_rng(4)
    sd, scores = rng.permutation(np.arange(150.0)), rng.exponential(size=150)
    order = np.argsort(sd)
    by_hand = stats.kruskal(*[scores[order[30 * b:30 * (b + 1)]] for b in range(5)]).pvalue
    np.testing.assert_allclose(scores_alike_pvalue(scores, sd, 5), by_hand, rtol=1e-12)
    assert np.isnan(scores_alike_pvalue(scores, sd, 1)) and scores_alike_pvalue(np.ones(150), sd, 5) == 1.0
    assert np.isnan(scores_alike_pvalue(scores, np.ones(150), 5))  # one σ̂: one band, nothing to compare
    assert scores_alike_pvalue(np.full(150, np.inf), sd, 5) == 1.0  # alike, if infinite
    with pytest.raises(ValueError, match="same length"):
        scores_alike_pvalue(scores, sd[:-1], 5)
    with pytest.raises(ValueError, match="NaN"):
        scores_alike_pvalue(scores, np.r_[sd[:-1], np.nan], 5)


def test_band_report_per_output_and_by_row_count():
    """The fit line says per output why it has its bands: 500 calibration rows give ⌊500/200⌋ = 2 bands by row
    count, five where the scores differ across five (output 0: noise ∝ σ̂²), and it says which output is which;
    a p-value just under the test's level is never printed as the level itself."""
    from glas_sklearn.calibration.mondrian import _pvalue

    rng = np.random.default_rng(0)
    sd = rng.uniform(0.5, 2.0, size=(500, 2))
    y = np.c_[sd[:, 0] ** 2 * rng.standard_normal(500), sd[:, 1] * rng.standard_normal(500)]
    cal = MondrianConformalCalibrator().calibrate_predictions(_moments(np.zeros((500, 2)), sd),
                                                             torch.as_tensor(y), 0.9, Gaussian())
    p0, p1 = cal.band_pvalue_
    assert p0 < 1e-6 and p1 > 0.1  # with this seed
    assert [len(e) + 1 for e in cal.edges_] == [5, 2]
    text = cal.bands_report(0.9, 500)
    assert text.startswith("output 0: 5 bands of σ̂, each with its own quantile, as the scores differ")
    assert f"output 1: 2 bands of σ̂, each with its own quantile, by the row count (the scores are alike " \
           f"across narrower ones, Kruskal–Wallis p = {p1:.2g})" in text
    assert _pvalue(0.0996) == "< 0.1" and _pvalue(0.43) == "= 0.43" and _pvalue(0.1) == "= 0.1"
    assert _pvalue(1.2e-7) == "= 1.2e-07"
    # a count the user set is said as set, not explained by the rows; the bands' rows are those of the highest level
    fixed = MondrianConformalCalibrator(n_bins=1).calibrate_predictions(_moments(np.zeros((500, 2)), sd),
                                                                      torch.as_tensor(y), 0.9, Gaussian())
    assert fixed.bands_report(0.9, 500) == "n_bins=1 as set"
    one = MondrianConformalCalibrator().calibrate_predictions(_moments(np.zeros(30), sd[:30, 1]),
                                                              torch.as_tensor(y[:30, 1:]), [0.8, 0.95], Gaussian())
    assert one.bands_report(0.95, 30) == "one band of σ̂: bands need 38 calibration rows"  # 2 × 19, at 95 %


def _beta_binomial(n_b: int, level: float, n_test: float, n_seeds: int, k=None) -> tuple[float, float]:
    """Mean and standard deviation of the seed-averaged coverage of one bin: given its n_b calibration rows the
    coverage is Beta(k, n_b + 1 − k), k = ⌈(n_b + 1) level⌉, and its ~n_test test rows add C(1 − C)/n_test."""
    k = _rank(n_b, level) if k is None else k
    a, b = k, n_b + 1 - k
    mean = a / (a + b)
    var_beta = a * b / ((a + b) ** 2 * (a + b + 1))
    var_binomial = (mean - (var_beta + mean**2)) / n_test
    return mean, math.sqrt((var_beta + var_binomial) / n_seeds)


@pytest.mark.parametrize("method", ["higher", "interpolated"])
def test_simulation_within_bin_coverage_holds_where_pooled_conformal_fails(method):
    level, n_cal, n_test, n_seeds = 0.9, 500, 2000, 200
    B = 5  # "auto" with 500 rows and min_bin_size=100
    rng = np.random.default_rng(12345)
    mondrian, pooled = np.zeros((n_seeds, B)), np.zeros((n_seeds, B))
    for r in range(n_seeds):
        x_cal, x_test = rng.uniform(0, 1, n_cal), rng.uniform(0, 1, n_test)
        sd = lambda x: 0.5 + x  # noqa: E731  (the model's σ̂)
        noise = lambda x: (0.5 + x) ** 3  # noqa: E731  (the true noise: 1/8 … 27/8, under-stated at high σ̂)
        y_cal = noise(x_cal) * rng.standard_normal(n_cal)
        y_test = noise(x_test) * rng.standard_normal(n_test)
        cal = MondrianConformalCalibrator(min_bin_size=100, quantile_method=method).calibrate_predictions(
            _moments(np.zeros(n_cal), sd(x_cal)), torch.as_tensor(y_cal[:, None]), level)
        assert len(cal.edges_[0]) == B - 1
        bounds = cal.region(_moments(np.zeros(n_test), sd(x_test)), level)[:, 0, :, 0].numpy()
        q = conformal_quantile(np.abs(y_cal) / sd(x_cal), level)[0]
        inside_m = (bounds[:, 0] <= y_test) & (y_test <= bounds[:, 1])
        inside_p = np.abs(y_test) <= q * sd(x_test)
        # the bins of the test rows: the calibration edges (true σ̂ quintiles would give the same picture)
        index = np.searchsorted(cal.edges_[0], sd(x_test), side="left")
        for b in range(B):
            mondrian[r, b] = inside_m[index == b].mean()
            pooled[r, b] = inside_p[index == b].mean()
    expected, spread = _beta_binomial(n_cal // B, level, n_test / B, n_seeds)
    assert expected == pytest.approx(91 / 101)
    if method == "interpolated":  # rank 101 · 0.9 = 90.9: on average 90.9/101 = 0.9 (the Beta's mean at k = 90.9)
        expected, spread = _beta_binomial(n_cal // B, level, n_test / B, n_seeds, k=(n_cal // B + 1) * level)
        assert expected == pytest.approx(level)
    per_bin = mondrian.mean(0)
    assert (per_bin >= expected - 4 * spread).all(), per_bin
    assert (per_bin <= expected + 4 * spread + 0.005).all(), per_bin  # not conservative beyond the edge effect
    assert pooled.mean(0)[-1] < level - 0.05  # pooled split conformal under-covers where σ̂ under-states the noise


def test_regressor_with_mondrian_end_to_end():
    X, y = step_noise_data(800)
    reg = LaplaceActiveSubspaceRegressor(**grouped(calibration="mondrian", calibration_size=0.5, **SMALL)).fit(X, y)
    obj = LaplaceActiveSubspaceRegressor(**grouped(calibration=MondrianConformalCalibrator(), calibration_size=0.5,
                                                   **SMALL)).fit(X, y)
    assert isinstance(reg.calibrator_, MondrianConformalCalibrator)
    assert int(reg.calibrator_.bins_["n"].sum()) == reg.n_calibration_rows_ == 400
    assert len(reg.calibrator_.edges_[0]) == 4  # "auto": max(⌊400 / 200⌋, min_bins=5) = 5 bins
    X_new, _ = step_noise_data(50, seed=1)
    y_pred, pis = reg.predict_interval(X_new, confidence_level=[0.5, 0.9])
    assert pis.shape == (50, 2, 2) and np.all(pis[:, 1, 1] - pis[:, 0, 1] >= pis[:, 1, 0] - pis[:, 0, 0])
    np.testing.assert_allclose(pis, obj.predict_interval(X_new, confidence_level=[0.5, 0.9])[1], rtol=1e-12)
    # the intervals by hand: ŷ ± q_b σ̂, with σ̂ the pooled conformal fit's std / std_scale_ (same network, same
    # rows, same predictive) and q_b of the row's bin
    plain = LaplaceActiveSubspaceRegressor(**grouped(calibration="conformal", calibration_size=0.5, **SMALL)).fit(X, y)
    sd_user = plain.predict(X_new, return_std=True)[1] / plain.std_scale_[0]
    sd_internal = sd_user / reg.y_scale_[0]
    q, factor = _by_hand(reg.calibrator_, sd_internal, 0.9)
    np.testing.assert_allclose(pis[:, 1, 1] - y_pred, q * sd_internal * reg.y_scale_[0], rtol=1e-9)
    # predict(return_std=True): σ̂ times its own bin's scale (shrunk towards the pooled one), not one pooled scale
    np.testing.assert_allclose(reg.predict(X_new, return_std=True)[1], factor * reg.std_scale_[0] * sd_user, rtol=1e-9)
    assert reg.std_scale_[0] == pytest.approx(np.sqrt(np.mean(np.concatenate(reg.calibrator_.bin_scores_[0]) ** 2)))
    assert len(set(np.round(factor, 12))) >= 3
    # a per-region calibration changes the intervals of plain conformal (same network, same rows)
    assert not np.allclose(plain.predict_interval(X_new)[1], reg.predict_interval(X_new)[1])
    assert "n_bins" in reg.calibration_.columns


def test_regressor_mondrian_multi_output_weights_and_heteroscedastic():
    X, Y = step_noise_data(300, outputs=2)
    reg = LaplaceActiveSubspaceRegressor(**grouped(calibration="mondrian", calibration_size=0.5, **SMALL))
    reg.fit(X, Y, sample_weight=np.linspace(0.5, 2.0, 300))
    _, pis = reg.predict_interval(X[:7], confidence_level=[0.8, 0.9])
    assert pis.shape == (7, 2, 2, 2) and len(reg.calibrator_.edges_) == 2
    assert set(reg.calibrator_.bins_["output"]) == {0, 1}

    X, y = step_noise_data(300)
    het = dict(SMALL, likelihood="heteroscedastic", calibration_size=0.5)
    m = LaplaceActiveSubspaceRegressor(**grouped(calibration=MondrianConformalCalibrator(n_bins=3), **het)).fit(X, y)
    c = LaplaceActiveSubspaceRegressor(**grouped(calibration="conformal", **het)).fit(X, y)
    assert isinstance(m.calibrator_, MondrianConformalCalibrator)
    assert type(c.calibrator_) is ConformalCalibrator  # the heteroscedastic predictive goes through the calibrators
    _, pm = m.predict_interval(X[:20], confidence_level=[0.5, 0.9])
    _, pc = c.predict_interval(X[:20], confidence_level=[0.5, 0.9])
    assert pm.shape == pc.shape == (20, 2, 2) and not np.allclose(pm, pc)
    # the heteroscedastic intervals are μ̂ ± q σ̂ and the std of predict is σ̂ · factor · std_scale_ (q and factor by
    # hand from the row's bin), so their ratio is q / (factor · std_scale_)
    mu, std = m.predict(X[:20], return_std=True)
    sd_internal = c.predict(X[:20], return_std=True)[1] / c.std_scale_[0] / c.y_scale_[0]  # σ̂: the same network
    q, factor = _by_hand(m.calibrator_, sd_internal, 0.9)
    np.testing.assert_allclose((pm[:, 1, 1] - mu) / std, q / (factor * m.std_scale_[0]), rtol=1e-9)


def test_class_conditional_sets_by_hand_and_end_to_end():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.8, 0.1],
                          [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    cal = MondrianConformalCalibrator(conformity_score=LAC(), quantile_method="higher")
    cal.calibrate_predictions(probs, labels, 0.5)
    # per class the scores 1 − p_y: class 0 {0.3, 0.4}, 1 {0.5, 0.2}, 2 {0.6, 0.4}; rank ⌈3 · 0.5⌉ = 2: the max
    assert cal.bins_["quantile"].tolist() == pytest.approx([0.4, 0.5, 0.6])
    interp = MondrianConformalCalibrator(conformity_score=LAC()).calibrate_predictions(probs, labels, 0.5)
    assert interp.bins_["quantile"].tolist() == pytest.approx([0.35, 0.35, 0.5])  # rank 1.5: half-way
    sets = cal.region(torch.tensor([[0.65, 0.5, 0.45]], dtype=torch.float64), [0.5])
    assert sets[0, :, 0].tolist() == [True, True, True]  # 0.35 ≤ 0.4, 0.5 ≤ 0.5, 0.55 ≤ 0.6
    sets = cal.region(torch.tensor([[0.55, 0.45, 0.35]], dtype=torch.float64), [0.5])
    assert sets[0, :, 0].tolist() == [False, False, False]

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, 300)
    Xc = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.2]])[codes] + 0.6 * rng.standard_normal((300, 2))
    clf = LaplaceActiveSubspaceClassifier(**grouped(calibration="mondrian", calibration_size=0.5,
                                                    **SMALL)).fit(Xc, codes)
    _, sets = clf.predict_set(Xc[:10], confidence_level=[0.8, 0.95])
    assert sets.shape == (10, 3, 2) and clf.calibrator_.bins_["n"].sum() == clf.n_calibration_rows_


def test_resolve_and_settings():
    assert isinstance(resolve_calibration("mondrian"), MondrianConformalCalibrator)
    assert isinstance(resolve_calibration("mondrian"), ConformalCalibrator)  # a split-conformal calibration
    with pytest.raises(ValueError, match="n_bins must be 'auto' or an integer"):
        MondrianConformalCalibrator(n_bins=0).bins_for(100, 0.9)
    m = MondrianConformalCalibrator(n_bins=3, conformity_score=StdNormalizedResidual())
    assert m.get_params()["n_bins"] == 3


def test_regressor_default_is_mondrian_over_sigma_bands_with_min_bins_on_small_data():
    """The regressor's default calibration on 300 calibration rows: five bands of σ̂ for the heteroscedastic
    predictive (min_bins "auto"), and for the Gaussian too, whose scores on this noise step differ across the bands
    (the Kruskal–Wallis p-value of its bands' scores, below 0.1), each with its interpolated quantile (by hand from
    the band's scores); ``min_bins=1, quantile_method="higher"`` is one band: the intervals and std of
    calibration="conformal" on the same network and rows. From 1,000 rows ⌊n / 200⌋ bands for either."""
    X, y = step_noise_data(600)
    X_new, _ = step_noise_data(40, seed=3)
    assert LaplaceActiveSubspaceRegressor().calibration == "mondrian"
    for likelihood, min_bins in (("heteroscedastic", 5), ("gaussian", 1)):
        kw = dict(SMALL, likelihood=likelihood, calibration_size=0.5)  # 300 calibration rows
        small = LaplaceActiveSubspaceRegressor(**grouped(**kw)).fit(X, y)
        plain = LaplaceActiveSubspaceRegressor(**grouped(calibration="conformal", **kw)).fit(X, y)
        cal = small.calibrator_
        assert isinstance(cal, MondrianConformalCalibrator) and cal.min_bins_ == min_bins
        assert sorted(cal.bins_["n"]) == [60] * 5
        if min_bins == 5:  # no test where the likelihood predicts the noise
            assert np.isnan(cal.band_pvalue_).all()
        else:
            assert cal.band_pvalue_[0] < 0.1
            np.testing.assert_allclose(cal.band_pvalue_[0], stats.kruskal(*cal.bin_scores_[0]).pvalue, rtol=1e-9)
        y_pred, pis = small.predict_interval(X_new)
        sd = plain.predict(X_new, return_std=True)[1] / plain.std_scale_[0] / small.y_scale_[0]  # σ̂, internal
        q, _ = _by_hand(small.calibrator_, sd, 0.9)
        np.testing.assert_allclose(pis[:, 1, 0] - y_pred, q * sd * small.y_scale_[0], rtol=1e-9)
    one = LaplaceActiveSubspaceRegressor(**grouped(calibration=MondrianConformalCalibrator(min_bins=1,
                                                                                           quantile_method="higher"),
                                                   **kw)).fit(X, y)
    assert len(one.calibrator_.edges_[0]) == 0
    # the same network and predictive in float64: only round-off in the order of the operations differs
    tol = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(one.predict_interval(X_new)[1], plain.predict_interval(X_new)[1], **tol)
    np.testing.assert_allclose(one.predict(X_new, return_std=True)[1], plain.predict(X_new, return_std=True)[1],
                               **tol)

    X, y = step_noise_data(2600, seed=5)
    big = LaplaceActiveSubspaceRegressor(**grouped(calibration_size=0.5,
                                                   **dict(SMALL, likelihood="gaussian"))).fit(X, y)
    assert big.n_calibration_rows_ == 1300 and len(big.calibrator_.edges_[0]) == 5  # ⌊1300 / 200⌋ = 6 bands
    assert sorted(big.calibrator_.bins_["n"]) == [216] * 2 + [217] * 4


def test_band_calibrated_estimator_served_from_threads():
    """The default calibration with several σ̂ bands is read-only at predict time: eight threads calling
    predict_interval (at two levels, one beyond the bands' own, which merges neighbours) and predict(return_std)
    on one fitted estimator get the one-at-a-time results (float64, the same operations: round-off only)."""
    import threading

    X, y = step_noise_data(900, seed=2)
    reg = LaplaceActiveSubspaceRegressor(**grouped(calibration_size=0.5,
                                                   **dict(SMALL, likelihood="gaussian"))).fit(X, y)
    # 450 calibration rows, the Gaussian on a noise step: five bands of 90 (its scores differ across them)
    assert len(reg.calibrator_.edges_[0]) == 4 and reg.calibrator_.band_pvalue_[0] < 0.1
    X_new, _ = step_noise_data(300, seed=4)
    X_new = np.r_[X_new, 3.0 * X_new[:20]]  # and rows off the calibrated σ̂ (the pooled quantile as a floor)
    levels = [0.9, 0.997]  # 0.997 needs 332 rows a band: the five bands merged (the pooled quantile), finite
    filters = list(warnings.filters)
    ref_pis = reg.predict_interval(X_new, confidence_level=levels)[1]
    assert np.isfinite(ref_pis).all()
    ref_std = reg.predict(X_new, return_std=True)[1]
    out, start = [None] * 8, threading.Barrier(8)

    def work(i):
        start.wait()
        for _ in range(3):
            out[i] = (reg.predict_interval(X_new, confidence_level=levels)[1], reg.predict(X_new, return_std=True)[1])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for pis, std in out:
        np.testing.assert_allclose(pis, ref_pis, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(std, ref_std, rtol=1e-12, atol=1e-12)
    assert warnings.filters == filters  # nothing silenced through the process-wide filters


def test_predictions_never_touch_the_process_wide_warning_filters(monkeypatch):
    """predict_interval with rows beyond the calibrated σ̂ (the pooled quantile as a floor, too few rows for it at
    a high level) and predict_set of a class-conditional classifier silence nothing through ``warnings``' filters:
    threads serving one estimator would restore each other's filters (and leak or drop an "ignore")."""
    X, y = step_noise_data(300, seed=2)
    reg = LaplaceActiveSubspaceRegressor(**grouped(calibration_size=0.5,
                                                   **dict(SMALL, likelihood="gaussian"))).fit(X, y)
    clf = LaplaceActiveSubspaceClassifier(**grouped(calibration="mondrian", **SMALL)).fit(X, (X[:, 0] > 0).astype(int))
    import sys

    touched = []  # calls from the library's own code (scikit-learn's input validation has its own)

    def recorder(name, original):
        def call(*args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("glas_sklearn"):
                touched.append(f"{name} in {caller}")
            return original(*args, **kwargs)
        return call

    for name in ("filterwarnings", "simplefilter", "catch_warnings", "resetwarnings"):
        monkeypatch.setattr(warnings, name, recorder(name, getattr(warnings, name)))
    try:
        reg.predict_interval(np.r_[X[:5], 4.0 * X[:5]], confidence_level=[0.9, 0.99])
        with pytest.warns(ConformalWarning, match="too few calibration rows"):  # said, not silenced
            clf.predict_set(X[:5], confidence_level=[0.9, 0.995])
    finally:
        monkeypatch.undo()
    assert not touched


def test_warnings_are_silenced_in_one_thread_only():
    """The library silences a warning it has already given for its own thread only: while one thread is inside
    ``silenced``, another still hears the same warning, and the process-wide filters are never touched."""
    import threading

    from glas_sklearn._silenced import is_silenced, silenced

    inside, done = threading.Event(), threading.Event()
    seen = {}

    def quiet():
        with silenced("few_calibration_rows"):
            seen["quiet"] = is_silenced("few_calibration_rows")
            seen["q"] = conformal_quantile([0.1, 0.2], 0.9)  # too few rows: +inf, no warning
            inside.set()
            done.wait(10)

    filters = list(warnings.filters)
    t = threading.Thread(target=quiet)
    t.start()
    assert inside.wait(10)
    with pytest.warns(ConformalWarning, match="too few"):  # this thread still hears it
        assert np.isinf(conformal_quantile([0.1, 0.2], 0.9)).all()
    assert not is_silenced("few_calibration_rows")
    done.set()
    t.join()
    assert seen["quiet"] and np.isinf(seen["q"]).all() and warnings.filters == filters
    with pytest.raises(ValueError, match="unknown warning kind"):
        with silenced("everything"):
            pass


def test_class_conditional_calibration_rows_per_class():
    """calibration="mondrian" for a classifier needs ⌈1/γ⌉ − 1 = 9 rows of each class for its 90 % quantile:
    the default 10 % share is raised until the rarest class has them (after the half that tunes σ0), with no
    warning; an X_cal short of one class is warned about once, before training, naming that class by its label,
    and that class is then in every set, which predict_set says once per call."""
    rng = np.random.default_rng(0)
    n = 600
    codes = rng.choice(4, size=n, p=[0.4, 0.3, 0.2, 0.1])
    centres = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.2], [0.0, -1.2]])
    X = centres[codes] + 0.5 * rng.standard_normal((n, 2))
    labels = np.array(["a", "b", "c", "d"])[codes]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConformalWarning)
        clf = LaplaceActiveSubspaceClassifier(**grouped(calibration="mondrian", **SMALL)).fit(X, labels)
        rows = [s.size for s in clf.calibrator_.bin_scores_[0]]
        assert min(rows) >= 9, rows  # 10 % of 600 would give the rarest class (≈ 60 rows) 6, and σ0 takes half
        assert np.isfinite(clf.calibrator_.class_quantiles(0.9)).all()
        assert clf.predict_set(X[:5])[1].shape == (5, 4, 1)
    assert clf.n_calibration_rows_ < n // 4  # raised as far as needed, not to everything
    pooled = LaplaceActiveSubspaceClassifier(**grouped(calibration="conformal", **SMALL)).fit(X, labels)
    assert len(pooled.calibration_indices_) == int(np.ceil(0.1 * n))  # a pooled calibration needs no raise
    # a class of 6 rows cannot give 19 (9 + 9 for σ0 + 1) with half the rows or fewer: the share stays, fit warns
    rare = np.where(np.arange(n) < 6, "e", labels)
    with pytest.warns(ConformalWarning, match=r"'e': \d"):
        kept = LaplaceActiveSubspaceClassifier(**grouped(calibration="mondrian", **SMALL)).fit(X, rare)
    assert len(kept.calibration_indices_) == int(np.ceil(0.1 * n))

    # X_cal with 4 rows of class "d": one warning, at the user's fit line, before training
    keep = np.flatnonzero(codes != 3)
    cal_rows = np.r_[keep[-120:], np.flatnonzero(codes == 3)[:4]]
    train = np.setdiff1d(np.arange(n), cal_rows)
    fixed = dict(SMALL, sigma0=1.0)  # every calibration row is the quantile's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short = LaplaceActiveSubspaceClassifier(**grouped(calibration="mondrian", **fixed)).fit(
            X[train], labels[train], X_cal=X[cal_rows], y_cal=labels[cal_rows])
    said = [w for w in caught if issubclass(w.category, ConformalWarning)]
    assert len(said) == 1 and said[0].filename == __file__, [str(w.message) for w in said]
    assert "'d': 4" in str(said[0].message) and "needs 9 calibration rows of every class" in str(said[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sets = short.predict_set(X[:50], confidence_level=[0.8, 0.9])[1]
    said = [w for w in caught if issubclass(w.category, ConformalWarning)]
    assert len(said) == 1 and "'d': 4" in str(said[0].message) and said[0].filename == __file__
    assert sets[:, 3, 1].all()  # class "d" in every 90 % set
    # the calibrator fitted on its own says it once too, at the caller's line (classes by index)
    p = short.posterior_
    Xt = short._inputs.rows_tensor(X[cal_rows], p.device, p.dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MondrianConformalCalibrator().fit(p, Xt, short._encode(labels[cal_rows]), likelihood=short.likelihood_)
    said = [w for w in caught if issubclass(w.category, ConformalWarning)]
    assert len(said) == 1 and "index 3: 4" in str(said[0].message) and said[0].filename == __file__
