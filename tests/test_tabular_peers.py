"""The tabular peers of the UCI benchmark and the shift study (benchmarks/_common.py: ``tabular_peer``), and
uci.py's merge of tagged runs and its comparison of the default with the peers.

Each peer's intervals are checked against the conformal quantile computed by hand on its own calibration scores
(the ⌈(n + 1)·level⌉-th smallest), on small synthetic rows; a peer whose package is not installed is skipped.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    """A benchmarks/ module as the scripts see it (``import _common``), registered under its name."""
    if name in sys.modules:
        return sys.modules[name]
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


common = _load("_common")
LEVEL = 0.9


def _rows(n_fit=300, n_cal=60, n_te=200, seed=0):
    """y = 2 x0 + sin 3 x1 + noise that grows with x0, three inputs on different scales."""
    rng = np.random.default_rng(seed)
    n = n_fit + n_cal + n_te
    X = np.column_stack([rng.uniform(-1, 1, n), rng.uniform(-1, 1, n) * 100, rng.normal(size=n)])
    y = 2 * X[:, 0] + np.sin(3 * X[:, 1] / 100) + (0.1 + 0.4 * (X[:, 0] + 1)) * rng.normal(size=n)
    a, b = n_fit, n_fit + n_cal
    return X[:a], y[:a], X[a:b], y[a:b], X[b:], y[b:]


def _conformal_quantile(scores, level=LEVEL):
    """The ⌈(n + 1) level⌉-th smallest score (the finite-sample split-conformal quantile)."""
    k = int(np.ceil((len(scores) + 1) * level))
    return np.sort(scores)[k - 1]


def _need(name):
    missing = common.tabular_peers_missing([name])
    if missing:
        pytest.skip(missing[name])


def test_unknown_peer_is_refused_with_the_names():
    with pytest.raises(ValueError, match="unknown tabular peer 'forest'.*qrf"):
        common.tabular_peer("forest", *_rows()[:5], seed=0)


def test_missing_packages_are_named_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(common, "package_version", lambda name: None if name == "ngboost" else "1.0")
    missing = common.tabular_peers_missing()
    assert set(missing) == {"ngboost", "ngboost_cp"}
    assert "ngboost not installed" in missing["ngboost"] and "constraints.txt" in missing["ngboost"]
    assert common.tabular_peers_missing(["qrf", "split_hgb"]) == {}


def test_split_conformal_around_hgb_is_the_conformal_quantile_of_its_residuals():
    _need("split_hgb")
    from sklearn.ensemble import HistGradientBoostingRegressor
    X_fit, y_fit, X_cal, y_cal, X_te, _ = _rows()
    pis, std = common.tabular_peer("split_hgb", X_fit, y_fit, X_cal, y_cal, X_te, 3)
    mean = HistGradientBoostingRegressor(random_state=3).fit(X_fit, y_fit)
    q = _conformal_quantile(np.abs(y_cal - mean.predict(X_cal)))
    mu = mean.predict(X_te)
    assert std is None and pis.shape == (len(X_te), 2)
    np.testing.assert_allclose(pis, np.column_stack([mu - q, mu + q]), rtol=1e-10, atol=1e-10)


def test_cqr_on_the_quantile_forest_widens_its_quantiles_by_the_conformal_quantile():
    _need("qrf_cqr")
    from quantile_forest import RandomForestQuantileRegressor
    X_fit, y_fit, X_cal, y_cal, X_te, _ = _rows()
    forest = RandomForestQuantileRegressor(random_state=1).fit(X_fit, y_fit)
    cache = {}
    raw, _ = common.tabular_peer("qrf", X_fit, y_fit, X_cal, y_cal, X_te, 1, cache=cache)
    assert isinstance(cache["qrf"], RandomForestQuantileRegressor)
    np.testing.assert_allclose(raw, forest.predict(X_te, quantiles=[0.05, 0.95]))
    lo, hi = forest.predict(X_cal, quantiles=[0.05, 0.95]).T
    # MAPIE's default CQR (symmetric_correction=False): each bound moved by the conformal quantile at 95 % of its
    # own signed miss
    q_lo, q_hi = _conformal_quantile(lo - y_cal, 0.95), _conformal_quantile(y_cal - hi, 0.95)
    pis, _ = common.tabular_peer("qrf_cqr", X_fit, y_fit, X_cal, y_cal, X_te, 1, cache=cache)
    assert list(cache) == ["qrf"]  # one forest for both rows; a fresh fit with the same seed gives the same
    np.testing.assert_allclose(pis, np.column_stack([raw[:, 0] - q_lo, raw[:, 1] + q_hi]), rtol=1e-10, atol=1e-10)


def test_crepes_normalised_intervals_scale_with_the_knn_difficulty():
    _need("crepes_norm_hgb")
    X_fit, y_fit, X_cal, y_cal, X_te, y_te = _rows()
    pis, sigma = common.tabular_peer("crepes_norm_hgb", X_fit, y_fit, X_cal, y_cal, X_te, 0)
    half = (pis[:, 1] - pis[:, 0]) / 2
    ratio = half / sigma
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)  # one conformal quantile of |y − ŷ| / σ
    assert np.ptp(sigma) > 0.1 * np.mean(sigma)  # and σ does vary from row to row


def test_crepes_mondrian_with_one_category_is_split_conformal_around_the_same_trees():
    """Under 2 × 20 calibration rows crepes' Mondrian conformal has one category: the plain split-conformal
    interval of the boosted trees (which standardised inputs leave unchanged), with crepes' own rank: the
    ⌊(1 − level)(n + 1)⌋-th largest |y − ŷ| in floating point, for n = 39 the 3rd largest (0.1 · 40 rounds to
    3.999…), one rank above MAPIE's ⌈level (n + 1)⌉-th smallest."""
    _need("crepes_mondrian_hgb")
    from sklearn.ensemble import HistGradientBoostingRegressor
    X_fit, y_fit, X_cal, y_cal, X_te, _ = _rows(n_cal=39)
    cache = {}
    common.tabular_peer("crepes_norm_hgb", X_fit, y_fit, X_cal, y_cal, X_te, 2, cache=cache)
    pis, _ = common.tabular_peer("crepes_mondrian_hgb", X_fit, y_fit, X_cal, y_cal, X_te, 2, cache=cache)
    fresh, _ = common.tabular_peer("crepes_mondrian_hgb", X_fit, y_fit, X_cal, y_cal, X_te, 2)
    np.testing.assert_array_equal(pis, fresh)  # the cached trees, recalibrated, as a fit of their own
    mean = HistGradientBoostingRegressor(random_state=2).fit(X_fit, y_fit)
    scores = np.sort(np.abs(y_cal - mean.predict(X_cal)))[::-1]
    rank = int((1 - LEVEL) * (len(y_cal) + 1))
    assert rank == 3
    mu, q = mean.predict(X_te), scores[rank - 1]
    np.testing.assert_allclose(pis, np.column_stack([mu - q, mu + q]), rtol=1e-8, atol=1e-8)
    ref, _ = common.tabular_peer("split_hgb", X_fit, y_fit, X_cal, y_cal, X_te, 2)
    np.testing.assert_allclose(ref.mean(1), pis.mean(1), rtol=1e-8, atol=1e-8)  # the same trees as MAPIE's
    assert np.all(ref[:, 1] - ref[:, 0] <= pis[:, 1] - pis[:, 0])


def test_ngboost_raw_intervals_are_its_normal_quantiles_and_conformal_ones_its_scaled_residual_quantiles():
    """With one cache the raw and the conformalised rows share one NGBoost fit: half-widths 1.645 σ; the upper
    conformal bound μ + q σ with q the ⌈(n + 1)·0.9⌉-th smallest |y − μ| / σ of the calibration rows. (MAPIE's
    symmetric ``std_normalized`` score takes the lower bound one rank lower, the next smaller score: its quantile
    of the reversed scores; seen in MAPIE 1.6 and kept, the peer as MAPIE gives it.)"""
    _need("ngboost_cp")
    X_fit, y_fit, X_cal, y_cal, X_te, _ = _rows(n_fit=200)
    cache = {}
    raw, sd = common.tabular_peer("ngboost", X_fit, y_fit, X_cal, y_cal, X_te, 0, cache=cache)
    cp, sd2 = common.tabular_peer("ngboost_cp", X_fit, y_fit, X_cal, y_cal, X_te, 0, cache=cache)
    assert list(cache) == ["ngboost"]
    np.testing.assert_array_equal(sd, sd2)
    np.testing.assert_allclose((raw[:, 1] - raw[:, 0]) / 2, 1.6448536269514722 * sd, rtol=1e-9)
    mu = raw.mean(1)
    dist = cache["ngboost"].pred_dist(X_cal)
    scores = np.sort(np.abs(y_cal - dist.params["loc"]) / dist.params["scale"])
    k = int(np.ceil((len(y_cal) + 1) * LEVEL))
    np.testing.assert_allclose(cp[:, 1], mu + scores[k - 1] * sd, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(cp[:, 0], mu - scores[k - 2] * sd, rtol=1e-9, atol=1e-9)
    assert np.ptp(sd) > 0.1 * np.mean(sd)


# ------------------------------------------------------------------------------------------------ uci.py
def _split(k, methods, n_cal=10):
    return {"split": k, "n_fit": 90, "n_cal": n_cal, "n_test": 20,
            "methods": {m: {"coverage": c, "interval_score": s} for m, (c, s) in methods.items()}}


def _results(splits, command="python benchmarks/uci.py"):
    return {"command": command, "versions": {"mapie": "1.6"}, "datasets": {"toy": {"splits": splits, "summary": {}}}}


def test_merge_adds_the_rows_of_a_tagged_run_to_the_same_splits_and_refuses_other_rows():
    uci = _load("uci")
    base = _results([_split(0, {"split_conformal": (0.9, 3.0)}), _split(1, {"split_conformal": (0.8, 4.0)})])
    part = _results([_split(1, {"default": (0.9, 2.0), "qrf": (0.85, 5.0)})], command="python benchmarks/uci.py -x")
    out = uci.merge_rows(base, [part])
    s0, s1 = out["datasets"]["toy"]["splits"]
    assert set(s0["methods"]) == {"split_conformal"} and set(s1["methods"]) == {"split_conformal", "default", "qrf"}
    assert out["merged"] == ["python benchmarks/uci.py -x"] and out["command"] == base["command"]
    assert out["datasets"]["toy"]["summary"]["qrf"]["n_splits"] == 1
    assert "default" not in base["datasets"]["toy"]["splits"][1]["methods"]  # the base is not mutated
    other = _results([_split(1, {"default": (0.9, 2.0)}, n_cal=11)])
    with pytest.raises(ValueError, match="split 1.*n_cal"):
        uci.merge_rows(base, [other])


def test_the_comparison_with_the_peers_pairs_the_splits_and_names_the_best():
    uci = _load("uci")
    results = _results([_split(0, {"default": (0.9, 2.0), "split_hgb": (0.9, 4.0), "qrf": (0.8, 1.0)}),
                        _split(1, {"default": (0.9, 4.0), "split_hgb": (0.9, 4.0), "qrf": (0.8, 4.0)}),
                        _split(2, {"default": (0.9, 9.0), "split_hgb": (0.9, 1.0)})])  # no qrf: left out
    comp = uci.tabular_comparison(results)["toy"]
    assert comp["splits"] == [0, 1] and comp["best"] == "qrf"
    rows = comp["rows"]
    assert rows["default"]["interval_score"] == 3.0 and rows["qrf"]["to_default"] == pytest.approx(2.5 / 3)
    assert rows["split_hgb"]["to_default"] == pytest.approx(4 / 3) and rows["qrf"]["wins"] == 1
    assert rows["default"]["to_split_hgb"] == pytest.approx(0.75)
    line = next(x for x in uci.tabular_section(results) if x.startswith("- **toy**"))
    assert "best peer `qrf` IS 2.5 " in line and "the default is 20.0 % behind it" in line


def test_the_shift_section_names_the_best_peer_per_set_by_its_geometric_mean_ratio():
    rc = _load("regional_coverage")

    def run(name, f, default, qrf, cqr, proto):
        scores = {"default": default, "qrf": qrf, "cqr_hgb": cqr, "hgb_residual": proto}
        return {"dataset": name, "feature": f,
                "methods": {k: {"coverage": 0.9, "interval_score": v} for k, v in scores.items()}}

    runs = [run("concrete", 0, 10.0, 5.0, 8.0, 9.0), run("concrete", 1, 10.0, 20.0, 8.0, 9.0),  # qrf geo 1.0×
            run("energy", 0, 2.0, 1.0, 3.0, 4.0), run("energy", 1, 2.0, 1.0, 3.0, 4.0)]
    lines = rc._shift_peers(runs, ["concrete", "energy"])
    verdicts = [x for x in lines if x.startswith("- **")]
    assert "best peer `cqr_hgb` at 0.800×" in verdicts[0] and "the default is 25.0 % behind it" in verdicts[0]
    assert "best peer `qrf` at 0.500×" in verdicts[1] and "100.0 % behind it" in verdicts[1]
    proto = next(x for x in lines if x.startswith("Prototype"))
    assert "concrete 0.900×" in proto and "energy 2.000×" in proto and "best peer 0.500×" in proto
    assert rc._shift_peers([{**r, "methods": {"default": r["methods"]["default"]}} for r in runs], ["energy"]) == []
