"""The default regressor's contract as client code meets it: bugs found by an outside review (issue 27).

- intervals nested across levels: a row's 95 % interval contains its 90 % one, also where Mondrian bins too small
  for the higher level are merged with their neighbours (by hand on known scores, and end to end);
- the per-region diagnostic names a column it cannot find instead of failing inside numpy / ``int()``;
- the conformal warning states the rows a finite quantile needs (⌈1/γ⌉ − 1: 9 at 90 %), as many as suffice;
- a fitted regressor does not share the user's likelihood object: changing it afterwards (``set_params``) leaves
  the fitted predictions alone, as for the calibration object;
- for every likelihood, end to end on tiny data: several levels and one, multi-output, the per-region table and
  its Display, pickle, and threads that neither change the results nor the estimator.
"""

from __future__ import annotations

import pickle
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
import torch

from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import (
    LAC,
    ConformalCalibrator,
    ConformalWarning,
    MondrianConformalCalibrator,
    conformal_quantile,
)
from glas_sklearn.likelihoods import HeteroscedasticGaussian
from glas_sklearn.predictive import RegressionMoments
from glas_sklearn.regional_coverage import regional_coverage
from tests.reference import grouped, step_noise_data

SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=30, lr=0.05, batch_size=None,
             max_components=3, random_state=0)
LEVELS = [0.8, 0.9, 0.95]


def _moments(std):
    std = torch.as_tensor(np.asarray(std, dtype=np.float64)[:, None])
    return RegressionMoments(torch.zeros_like(std), std)


def test_intervals_are_nested_across_levels_where_bins_are_merged():
    """Three σ̂ bins of 18 scores serve 90 % alone (≥ 9 rows); 95 % needs 19, so they are merged. The top bin holds
    the largest score, 5: its 90 % quantile is 5 (the 18th of 18), and its 95 % one must not be less (the merged
    quantile alone is the 2nd largest of all 54, below 5): widening keeps the level within the merged groups."""
    rng = np.random.default_rng(0)
    scores = [rng.uniform(0, 1, 18), rng.uniform(0, 1, 18), np.r_[rng.uniform(0, 1, 17), 5.0]]
    std = np.repeat([1.0, 2.0, 3.0], 18)
    y = np.concatenate(scores) * std  # |y − 0| / σ̂ = the scores
    cal = MondrianConformalCalibrator(n_bins=3, quantile_method="higher").calibrate_predictions(
        _moments(std), torch.as_tensor(y[:, None]), 0.9)
    assert [s.size for s in cal.bin_scores_[0]] == [18, 18, 18]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConformalWarning)
        q = cal.band_quantiles(0, [0.9, 0.95])
    assert q[2, 0] == 5.0 and q[2, 1] >= 5.0
    assert np.all(q[:, 1] >= q[:, 0])
    # not below the merged groups' own quantile (the level holds within them), and one level alone gives the same
    assert np.all(q[:, 1] >= conformal_quantile(np.concatenate(scores), 0.95)[0])
    np.testing.assert_array_equal(cal.band_quantiles(0, 0.95)[:, 0], q[:, 1])
    # interpolated (the default): the top bin's 90 % lies between its 17th and 18th score, and 95 % is not below it
    cal.set_params(quantile_method="interpolated")
    q = cal.band_quantiles(0, [0.9, 0.95])
    top = np.sort(scores[2])
    assert q[2, 0] == pytest.approx(top[16] + 0.1 * (top[17] - top[16])) and np.all(q[:, 1] >= q[:, 0])


def _merged_quantile(scores, min_rows, level, method):
    """Per bin: the quantile of its group when neighbouring bins are merged until each group has min_rows (the rule
    of a single level, written again here)."""
    groups, current = [], []
    for b in range(len(scores)):
        current.append(b)
        if sum(scores[i].size for i in current) >= min_rows:
            groups, current = [*groups, current], []
    if current:
        groups = [*groups[:-1], groups[-1] + current] if groups else [current]
    q = np.empty(len(scores))
    for g in groups:
        q[g] = conformal_quantile(np.concatenate([scores[i] for i in g]), level, method=method)[0]
    return q


@pytest.mark.parametrize("method", ["higher", "interpolated"])
def test_merged_quantiles_are_the_envelope_over_every_lower_level(method):
    """Brute force: at level ℓ, each bin's quantile is the largest single-level quantile over ℓ and every level
    below it; a merging into groups of ≥ m rows serves the levels up to m/(m + 1), so every integer m < ⌈1/γ⌉ − 1
    is tried (not only the bins' run lengths)."""
    rng = np.random.default_rng(5)
    for _ in range(40):
        scores = [np.sort(rng.exponential(size=rng.integers(3, 25)) * rng.uniform(0.5, 3))
                  for _ in range(rng.integers(2, 6))]
        cal = MondrianConformalCalibrator(quantile_method=method)
        cal.bin_scores_, cal.edges_ = [scores], [np.arange(len(scores) - 1.0)]
        level = float(rng.uniform(0.6, 0.985))
        min_rows = int(np.ceil(1 / (1 - level) - 1e-9)) - 1
        total = sum(s.size for s in scores)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConformalWarning)
            want = _merged_quantile(scores, min_rows, level, method)
            for m in range(1, min(min_rows, total + 1)):
                want = np.maximum(want, _merged_quantile(scores, m, m / (m + 1), method))
            np.testing.assert_array_equal(cal.band_quantiles(0, level)[:, 0], want)


def test_end_to_end_explicit_bins_give_nested_intervals():
    X, y = step_noise_data(300, seed=4)
    reg = LaplaceActiveSubspaceRegressor(**grouped(likelihood="gaussian",
                                                   calibration=MondrianConformalCalibrator(n_bins=3), **SMALL))
    reg.fit(X[:200], y[:200], X_cal=X[200:254], y_cal=y[200:254])
    _, pis = reg.predict_interval(X[254:], confidence_level=[0.9, 0.95])
    width = pis[:, 1] - pis[:, 0]
    assert np.all(width[:, 1] >= width[:, 0])
    np.testing.assert_allclose(reg.predict_interval(X[254:], confidence_level=0.95)[1][..., 0], pis[..., 1],
                               rtol=1e-12, atol=0)


def test_regional_coverage_names_a_column_it_cannot_find():
    X, y = step_noise_data(120, seed=1)
    reg = LaplaceActiveSubspaceRegressor(**grouped(likelihood="gaussian", **SMALL)).fit(X[:80], y[:80])
    frame = pd.DataFrame(X[80:], columns=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"column 'zz'.*\['a', 'b', 'c'\]"):
        regional_coverage(reg, frame, y[80:], columns=["zz"], n_directions=5)
    with pytest.raises(ValueError, match=r"column 7 is not a column of X.*3 columns"):
        regional_coverage(reg, X[80:], y[80:], columns=[7], n_directions=5)
    with pytest.raises(ValueError, match=r"column 'a'.*DataFrame.*indices 0 … 2"):
        regional_coverage(reg, X[80:], y[80:], columns=["a"], n_directions=5)


def test_the_conformal_warning_states_the_rows_that_suffice():
    # 9 scores give a finite 90 % quantile (the ⌈10 · 0.9⌉ = 9th), so the warning for 8 must ask for 9, not 10
    assert np.isfinite(conformal_quantile(np.arange(9.0), 0.9)[0])
    with pytest.warns(ConformalWarning, match="needs n ≥ 9\\)"):
        conformal_quantile(np.arange(8.0), 0.9)
    with pytest.warns(ConformalWarning, match="needs n ≥ 19\\)"):
        conformal_quantile(np.arange(8.0), 0.95)


def test_the_fitted_likelihood_is_not_the_users_object():
    X, y = step_noise_data(200, seed=2)
    likelihood = HeteroscedasticGaussian()
    reg = LaplaceActiveSubspaceRegressor(**grouped(likelihood=likelihood, **SMALL)).fit(X[:150], y[:150])
    before = reg.predict_interval(X[150:])[1]
    reg.set_params(likelihood__output="natural")  # the user's object changes; the fitted model must not
    assert likelihood.output == "natural" and reg.likelihood_.output == "mean_logvar"
    np.testing.assert_array_equal(reg.predict_interval(X[150:])[1], before)


def _state(obj) -> dict:
    """A copy of an object's attributes that compares by value (tensors and modules by their numbers)."""
    out = {}
    for k, v in vars(obj).items():
        if isinstance(v, torch.nn.Module):
            out[k] = {n: t.detach().clone() for n, t in v.state_dict().items()}
        elif isinstance(v, torch.Tensor):
            out[k] = v.detach().clone()
        elif isinstance(v, (np.ndarray, pd.DataFrame, float, int, str, bool, tuple, type(None))):
            out[k] = v.copy() if hasattr(v, "copy") else v
    return out


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, pd.DataFrame):
        return a.equals(b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    return a == b


@pytest.mark.parametrize("likelihood", ["auto", "heteroscedastic", "gaussian", "student_t"])
def test_every_likelihood_end_to_end(likelihood, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from glas_sklearn.plotting import RegionalCoverageDisplay

    X, Y = step_noise_data(560, seed=3, outputs=2)
    reg = LaplaceActiveSubspaceRegressor(**grouped(likelihood=likelihood, calibration_size=400,
                                                   **SMALL)).fit(X[:500], Y[:500])
    # per output: five bands of σ̂ where the network predicts the noise (min_bins "auto") or where the scores
    # differ across five bands (Kruskal–Wallis p < 0.1), else ⌊400/200⌋ = 2
    cal, het = reg.calibrator_, reg.likelihood_.noise_per_row
    assert np.isnan(cal.band_pvalue_).all() if het else np.isfinite(cal.band_pvalue_).all()
    five = [het or p < 0.1 for p in cal.band_pvalue_]
    if het:  # five bands per output; ties of a piecewise-constant noise model may make them uneven
        assert cal.bins_.groupby("output")["n"].agg(["size", "sum"]).values.tolist() == [[5, 400]] * 2
    else:
        assert cal.bins_["n"].tolist() == sum(([80] * 5 if f else [200] * 2 for f in five), [])
    Xt, Yt = X[500:], Y[500:]
    y_pred, pis = reg.predict_interval(Xt, confidence_level=LEVELS)
    assert y_pred.shape == (60, 2) and pis.shape == (60, 2, 2, 3)
    width = pis[:, :, 1] - pis[:, :, 0]
    assert np.all(np.diff(width, axis=-1) >= 0)
    np.testing.assert_allclose(reg.predict_interval(Xt, confidence_level=0.9)[1][..., 0], pis[..., 1], rtol=1e-12)

    table = regional_coverage(reg, Xt, Yt, columns=[1], n_bins=2, n_directions=20)
    assert set(table["by"]) == {"all", "std", "x1", "worst slab"}
    inside = (pis[..., 0, 1] <= Yt) & (Yt <= pis[..., 1, 1])
    np.testing.assert_allclose(table[table["by"] == "all"]["coverage"], inside.mean(0))
    disp = RegionalCoverageDisplay(table=table, by="x1", output=1).plot()
    assert disp.coverage_line_.get_ydata().size == 2
    plt.close(disp.figure_)
    assert reg.coverage_curve(Xt, Yt).shape[0] >= 1

    again = pickle.loads(pickle.dumps(reg))
    np.testing.assert_array_equal(again.predict_interval(Xt, confidence_level=LEVELS)[1], pis)

    serial = reg.predict(Xt, return_std=True)
    before = (_state(reg), _state(reg.calibrator_))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: reg.predict_interval(Xt, confidence_level=LEVELS)[1] if i % 2
                                else reg.predict(Xt, return_std=True), range(16)))
    for i, r in enumerate(results):
        for got, want in zip(r if isinstance(r, tuple) else (r,), serial if i % 2 == 0 else (pis,), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert _same(before[0], _state(reg)) and _same(before[1], _state(reg.calibrator_))


@pytest.mark.parametrize("where", ["X_cal", "calibration_size"])
def test_too_few_calibration_rows_for_sigma0_nll_raise_before_training(where):
    """sigma0="nll" tunes σ0 on some calibration rows and keeps ⌈1/γ⌉ − 1 = 9 (90 %) for the conformal quantile:
    9 rows are too few, which is known before the network is trained, so nothing is trained."""
    X, y = step_noise_data(100, seed=6)
    reg = LaplaceActiveSubspaceRegressor(**grouped(sigma0="nll", likelihood="gaussian", **SMALL))
    if where == "X_cal":
        fit = lambda: reg.fit(X[:80], y[:80], X_cal=X[80:89], y_cal=y[80:89])  # noqa: E731
    else:
        reg.set_params(calibration_size=9)
        fit = lambda: reg.fit(X, y)  # noqa: E731
    with pytest.raises(ValueError, match="sigma0='nll' needs at least 10 calibration rows.*got 9"):
        fit()
    assert not hasattr(reg, "module_")
    reg.fit(X[:80], y[:80], X_cal=X[80:90], y_cal=y[80:90])  # 10 rows: one to tune σ0 on
    assert reg.sigma0_rows_.size == 1


@pytest.mark.parametrize(("calibration", "message"), [
    (MondrianConformalCalibrator(n_bins=0), "n_bins must be 'auto' or an integer >= 1"),
    (MondrianConformalCalibrator(min_bin_size=0), "min_bin_size must be an integer >= 1"),
    (MondrianConformalCalibrator(epistemic_weight=-1.0), "epistemic_weight must be 'fit' or a finite number"),
    (ConformalCalibrator(epistemic_weight="fitted"), "epistemic_weight must be 'fit' or a number"),
    (ConformalCalibrator(conformity_score=LAC()), "is not a RegressionScore"),
])
def test_bad_calibrator_settings_raise_before_training(calibration, message):
    X, y = step_noise_data(100, seed=7)
    reg = LaplaceActiveSubspaceRegressor(**grouped(calibration=calibration, likelihood="gaussian", **SMALL))
    with pytest.raises(ValueError, match=message):
        reg.fit(X, y)
    assert not hasattr(reg, "module_")


@pytest.mark.parametrize(("param", "value", "message"), [
    ("beta_nll", 5.0, "beta_nll must be a number in \\[0, 1\\]"),
    ("output", "foo", "output must be"),
])
def test_likelihood_settings_changed_by_set_params_are_checked_at_fit(param, value, message):
    """The likelihoods check their arguments when constructed; set_params (as GridSearchCV uses) must not get round
    that: a β of 5 trained silently, an unknown output layout ended in 'the training loss diverged'."""
    X, y = step_noise_data(100, seed=8)
    reg = LaplaceActiveSubspaceRegressor(**grouped(likelihood=HeteroscedasticGaussian(), **SMALL))
    reg.set_params(**{f"likelihood__{param}": value})
    with pytest.raises(ValueError, match=message):
        reg.fit(X, y)
    assert not hasattr(reg, "module_")
