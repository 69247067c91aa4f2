"""glas_sklearn.regional_coverage and RegionalCoverageDisplay: per-region coverage against by-hand counts."""

import itertools

import numpy as np
import pandas as pd
import pytest

from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank, Training, coverage_score
from glas_sklearn.regional_coverage import (
    coverage_gap,
    quantile_bins,
    regional_coverage,
    regional_coverage_from_predictions,
    worst_slab_coverage,
)


def _known():
    """10 rows; std 1..10 (two rows per quintile); intervals [y − 1, y + 1] shifted off y on rows 1, 4, 5 and 9."""
    y = np.arange(10.0)
    std = np.arange(1.0, 11.0)
    half = np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0])
    centre = y.copy()
    centre[[1, 4, 5, 9]] += np.array([2.0, 10.0, -4.0, 6.0])  # misses by 1, 7, 1, 1
    pis = np.stack([centre - half, centre + half], axis=1)
    return y, pis, std


def test_bins_coverage_width_and_interval_score_by_hand():
    y, pis, std = _known()
    t = regional_coverage_from_predictions(y, pis, std=std, n_bins=5, confidence_level=0.8)
    b = t[t["by"] == "std"]
    assert b["n"].tolist() == [2] * 5
    assert b["low"].tolist() == [1.0, 3.0, 5.0, 7.0, 9.0] and b["high"].tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]
    # rows 1 (bin 0), 4 and 5 (bin 2), 9 (bin 4) are missed
    assert b["coverage"].tolist() == [0.5, 1.0, 0.0, 1.0, 0.5]
    assert b["mean_width"].tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]
    # Winkler at γ = 0.2: width + 10 · miss distance; misses 1 (row 1), 7 and 1 (rows 4, 5), 1 (row 9)
    assert b["interval_score"].tolist() == pytest.approx([2 + 10 * 1 / 2, 4, 6 + 10 * 8 / 2, 8, 10 + 10 * 1 / 2])
    assert b["gap"].tolist() == pytest.approx([-0.3, 0.2, -0.8, 0.2, -0.3])
    whole = t[t["by"] == "all"].iloc[0]
    assert (whole["n"], whole["coverage"], whole["mean_width"]) == (10, 0.6, 6.0)
    assert t.attrs["coverage_gap"]["std"] == pytest.approx((0.3 + 0.2 + 0.8 + 0.2 + 0.3) / 5)
    assert t.attrs["worst_slab_coverage"] is None  # no X


def test_without_std_the_half_width_is_binned_and_user_columns_too():
    y, pis, _ = _known()
    X = pd.DataFrame({"a": np.arange(10.0)[::-1], "b": np.zeros(10)})
    t = regional_coverage_from_predictions(y, pis, columns=["a", "b"], X=X, n_bins=2, n_directions=20)
    assert set(t["by"]) == {"all", "width", "a", "b", "worst slab"}
    w = t[t["by"] == "width"]
    # half-widths 1 1 2 2 3 3 | 4 4 5 5: the median 3 is the edge, right-closed, so both 3s fall in bin 0
    assert w["n"].tolist() == [6, 4] and w["low"].tolist() == [1.0, 4.0]
    assert w["coverage"].tolist() == [0.5, 0.75]  # missed rows 1, 4, 5 | 9
    a = t[t["by"] == "a"]  # a = 9 − i: bin 0 holds rows 5..9 (missed 5, 9), bin 1 rows 0..4 (missed 1, 4)
    assert a["coverage"].tolist() == [0.6, 0.6] and a["n"].tolist() == [5, 5]
    b = t[t["by"] == "b"]  # a constant column: one bin, not five empty ones
    assert b["n"].tolist() == [10]
    slab = t[t["by"] == "worst slab"].iloc[0]
    assert slab["n"] >= 1 and 0.0 <= slab["coverage"] <= 0.6


def test_quantile_bins_are_right_closed_and_ties_share_a_bin():
    index, edges = quantile_bins([0.0, 1.0, 1.0, 1.0, 2.0, 3.0], 2)
    assert edges.tolist() == [0.0, 1.0, 3.0]
    assert index.tolist() == [0, 0, 0, 0, 1, 1]


def _brute_force_wsc(x, cover, k, V):
    """min over the directions and all windows of ≥ k consecutive rows in the order of vᵀx."""
    best = 1.0
    for v in V:
        c = cover[np.argsort(x @ v, kind="stable")]
        for s, e in itertools.combinations(range(len(c) + 1), 2):
            if e - s >= k:
                best = min(best, c[s:e].mean())
    return best


def test_worst_slab_against_every_window_and_the_mapie_example():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((23, 3))
    y = rng.standard_normal(23)
    half = rng.uniform(0.2, 2.0, 23)
    pis = np.stack([-half, half], axis=1)
    cover = ((-half <= y) & (y <= half)).astype(float)
    for delta in (0.1, 0.3, 0.5):
        value, (v, a, b, n_in) = worst_slab_coverage(x, y, pis, delta=delta, n_directions=7, random_state=11,
                                                     return_slab=True)
        V = np.random.default_rng(11).standard_normal((7, 3))
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        assert value == pytest.approx(_brute_force_wsc(x, cover, int(np.ceil(delta * 23)), V), abs=1e-12)
        z = x @ v  # the bounds are on the same projections up to round-off
        inside = (z >= a - 1e-12) & (z <= b + 1e-12)
        assert inside.sum() == n_in >= np.ceil(delta * 23) and cover[inside].mean() == pytest.approx(value)
    # the example of MAPIE 1.5's worst_slab_coverage
    X1, y1 = np.arange(4.0)[:, None], np.arange(4.0)
    pis1 = np.array([[0.0, 1.0], [0.0, 2.0], [1.0, 2.0], [4.0, 5.0]])
    assert worst_slab_coverage(X1, y1, pis1, delta=0.5, n_directions=5) == 0.5
    assert worst_slab_coverage(X1, y1, pis1, delta=0.2, n_directions=5) == 0.0  # the last row alone


def test_coverage_gap_unweighted_and_weighted_by_hand():
    y = np.zeros(6)
    pis = np.array([[-1, 1], [1, 2], [-1, 1], [-1, 1], [-1, 1], [1, 2]], dtype=float)  # covered 1 0 1 1 1 0
    groups = np.array(["a", "a", "b", "b", "b", "c"])
    # coverages a 0.5, b 1.0, c 0.0 at level 0.9: gaps 0.4, 0.1, 0.9
    assert coverage_gap(y, pis, groups, 0.9) == pytest.approx((0.4 + 0.1 + 0.9) / 3)
    assert coverage_gap(y, pis, groups, 0.9, weighted=True) == pytest.approx((2 * 0.4 + 3 * 0.1 + 0.9) / 6)


def test_multi_output_gets_rows_per_output():
    y, pis, std = _known()
    Y = np.stack([y, y], axis=1)
    P = np.stack([pis, np.stack([y - 1, y + 1], axis=1)], axis=1)[..., None]  # (10, 2, 2, 1)
    t = regional_coverage_from_predictions(Y, P, std=np.stack([std, std], axis=1), n_bins=5)
    assert t[(t["by"] == "std") & (t["output"] == 0)]["coverage"].tolist() == [0.5, 1.0, 0.0, 1.0, 0.5]
    assert t[(t["by"] == "std") & (t["output"] == 1)]["coverage"].tolist() == [1.0] * 5


def test_bad_input_is_refused_clearly():
    y, pis, std = _known()
    with pytest.raises(ValueError, match="levels"):
        regional_coverage_from_predictions(y, np.stack([pis, pis], axis=-1))
    with pytest.raises(ValueError, match="std has shape"):
        regional_coverage_from_predictions(y, pis, std=std[:5])
    with pytest.raises(ValueError, match="delta"):
        worst_slab_coverage(y[:, None], y, pis, delta=1.5)


def test_from_a_fitted_estimator():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(260, 2))
    y = X[:, 0] + (0.05 + 0.4 * (X[:, 1] > 0)) * rng.standard_normal(260)
    reg = LaplaceActiveSubspaceRegressor(random_state=0,
                                         training=Training(module_kwargs=dict(hidden_layer_sizes=(16,)), max_epochs=30),
                                         posterior=LowRank(n_samples=50, max_components=4)).fit(X[:160], y[:160])
    t = regional_coverage(reg, X[160:], y[160:], columns=[1], n_directions=30)
    _, pis = reg.predict_interval(X[160:])
    assert t[t["by"] == "all"]["coverage"].iloc[0] == pytest.approx(coverage_score(y[160:], pis))
    assert t[t["by"] == "std"]["n"].sum() == 100 and len(t[t["by"] == "x1"]) == 5
    _, std = reg.predict(X[160:], return_std=True)
    first = t[(t["by"] == "std") & (t["bin"] == 0)].iloc[0]
    assert first["low"] == pytest.approx(std.min()) and first["n"] == 20


def test_display_draws_the_table(plt):
    from glas_sklearn.plotting import RegionalCoverageDisplay

    y, pis, std = _known()
    disp = RegionalCoverageDisplay.from_predictions(y, pis, std=std, X=y[:, None], confidence_level=0.8,
                                                    n_directions=3)
    assert disp.coverage_line_.get_ydata().tolist() == [0.5, 1.0, 0.0, 1.0, 0.5]
    assert disp.width_line_.get_ydata().tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert disp.target_line_.get_ydata()[0] == 0.8 and disp.overall_line_.get_ydata()[0] == 0.6
    assert disp.worst_slab_line_ is not None
    again = RegionalCoverageDisplay(table=disp.table).plot(ax=disp.ax_, label="second")
    assert again.target_line_ is disp.target_line_  # one target line for overlaid curves
    with pytest.raises(ValueError, match="no bins of 'zzz'"):
        RegionalCoverageDisplay(table=disp.table, by="zzz").plot()


@pytest.fixture(scope="module")
def plt():
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    yield pyplot
    pyplot.close("all")


def test_equal_widths_up_to_round_off_are_one_bin():
    mu = np.random.default_rng(0).uniform(-100, 100, 50)  # ŷ ± 0.3 in float64: half-widths differ in the last bits
    pis = np.stack([mu - 0.3, mu + 0.3], axis=1)
    assert np.ptp((pis[:, 1] - pis[:, 0]) / 2) > 0
    t = regional_coverage_from_predictions(np.zeros(50), pis)
    assert t[t["by"] == "width"]["n"].tolist() == [50]


def test_a_mapie_regressor_is_diagnosed_at_its_fixed_level():
    mapie_regression = pytest.importorskip("mapie.regression")
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = X[:, 0] + rng.normal(size=600) * (1 + X[:, 1] ** 2)
    m = mapie_regression.SplitConformalRegressor(LinearRegression(), confidence_level=0.9, prefit=False)
    m.fit(X[:200], y[:200]).conformalize(X[200:400], y[200:400])
    with pytest.raises(ValueError, match="pass confidence_level="):
        regional_coverage(m, X[400:], y[400:])
    t = regional_coverage(m, X[400:], y[400:], columns=[1], n_directions=20, confidence_level=0.9)
    _, pis = m.predict_interval(X[400:])
    assert t[t["by"] == "all"]["coverage"].iloc[0] == pytest.approx(coverage_score(y[400:], pis))
    assert t[t["by"] == "width"]["n"].tolist() == [200]  # split conformal: one width, one bin
    x1 = t[t["by"] == "x1"]
    assert x1["n"].tolist() == [40] * 5 and x1["coverage"].min() < 0.9 < x1["coverage"].max()
