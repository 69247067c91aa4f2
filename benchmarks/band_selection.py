"""How many σ̂ bands the default's Mondrian calibration takes on small calibration sets, chosen per fit.

Stage ``fit`` (minutes) fits the default as a user fits it (``LaplaceActiveSubspaceRegressor(random_state=seed)``)
on the partitions of ``regional_coverage.py --study uci`` (20 standard splits of the four UCI dev sets) and of
``mondrian_shift.py`` (top third of feature 0..3 held out) and caches, per run, its predictive moments (user
units, σ̂ with the one pooled scale) on the calibration and test rows, with their targets, under
``results/cache_band_selection``. Stage ``calibrate`` (seconds) applies calibrator variants to the cached moments.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import regional_coverage as rc  # noqa: E402
import uci  # noqa: E402

CACHE = _common.RESULTS / "cache_band_selection"


def _moments(est, X):
    mu, sd = est.predict(X, return_std=True)
    return np.asarray(mu, dtype=np.float64).reshape(-1), np.asarray(rc._pooled_std(est, X, sd),
                                                                    dtype=np.float64).reshape(-1)


def fit_one(path, X_fit, y_fit, X_cal, y_cal, X_te, y_te, seed):
    t0 = time.process_time()
    est = rc.fit_default(X_fit, y_fit, X_cal, y_cal, seed)
    mu_c, sd_c = _moments(est, X_cal)
    mu_t, sd_t = _moments(est, X_te)
    np.savez(path, mu_c=mu_c, sd_c=sd_c, y_c=np.asarray(y_cal, float).reshape(-1), mu_t=mu_t, sd_t=sd_t,
             y_t=np.asarray(y_te, float).reshape(-1),
             noise_in_outputs=bool(getattr(est.likelihood_, "noise_in_outputs", False)),
             likelihood=type(est.likelihood_).__name__, cpu=time.process_time() - t0)
    print(f"[bands] {path.name}: {type(est.likelihood_).__name__} {time.process_time() - t0:.1f}s", flush=True)


def stage_fit(study, splits, first):
    CACHE.mkdir(parents=True, exist_ok=True)
    for name in rc.UCI_SETS:
        if study == "uci":
            for split in range(first, splits):
                path = CACHE / f"uci_{name}_{split}.npz"
                if path.exists():
                    continue
                X, y, train, test = _common.load_uci(_common.data_dir("uci") / name, split)
                perm = np.random.default_rng(1000 + split).permutation(train)
                n_cal = int(round(0.1 * len(train)))
                cal, fit = perm[:n_cal], perm[n_cal:]
                fit_one(path, X[fit], y[fit], X[cal], y[cal], X[test], y[test], split)
        else:
            X, y = _common.load_uci(_common.data_dir("uci") / name)
            for f in range(min(4, X.shape[1])):
                path = CACHE / f"shift_{name}_{f}.npz"
                if path.exists():
                    continue
                train, test = uci.shift_indices(X, f, "extrapolation")
                perm = np.random.default_rng(1000 + f).permutation(train)
                n_cal = int(round(0.1 * len(train)))
                cal, fit = perm[:n_cal], perm[n_cal:]
                fit_one(path, X[fit], y[fit], X[cal], y[cal], X[test], y[test], f)


# ------------------------------------------------------------------------------------------------ calibrate
from scipy import stats  # noqa: E402

from glas_sklearn.calibration import MondrianConformalCalibrator  # noqa: E402
from glas_sklearn.likelihoods import Gaussian, HeteroscedasticGaussian  # noqa: E402
from glas_sklearn.metrics import interval_score  # noqa: E402
from glas_sklearn.predictive import RegressionMoments  # noqa: E402

LEVEL = 0.9


def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64).reshape(len(a), -1))


def apply(cal, d):
    likelihood = HeteroscedasticGaussian() if bool(d["noise_in_outputs"]) else Gaussian()
    cal.calibrate_predictions(RegressionMoments(_t(d["mu_c"]), _t(d["sd_c"])), _t(d["y_c"]), LEVEL, likelihood)
    pis = cal.region(RegressionMoments(_t(d["mu_t"]), _t(d["sd_t"])), LEVEL)[:, 0, :, 0].numpy()
    std = d["sd_t"] * cal.bin_std_factors(d["sd_t"].reshape(-1, 1)).reshape(-1)
    return pis, std, len(cal.edges_[0]) + 1


def homogeneity_p(d, test, n_bands=5, rng=None):
    """p-value of 'the calibration scores do not depend on the σ̂ band'."""
    s = np.abs(d["y_c"] - d["mu_c"]) / d["sd_c"]
    cal = MondrianConformalCalibrator(n_bins=n_bands)
    cal.calibrate_predictions(RegressionMoments(_t(d["mu_c"]), _t(d["sd_c"])), _t(d["y_c"]), LEVEL)
    band = cal._bands_of(0, d["sd_c"])
    groups = [s[band == b] for b in range(band.max() + 1)]
    if len(groups) < 2:
        return 1.0
    if test == "kw":
        return float(stats.kruskal(*groups).pvalue)
    if test == "exceed":  # permutation test of the pooled quantile's exceedances across bands
        q = np.quantile(s, LEVEL)
        e = (s > q).astype(float)
        rng = np.random.default_rng(0) if rng is None else rng

        def stat(lab):
            return sum((e[lab == b].sum() - e.mean() * (lab == b).sum()) ** 2 / max((lab == b).sum(), 1)
                       for b in range(band.max() + 1))
        t0 = stat(band)
        perm = [stat(rng.permutation(band)) for _ in range(999)]
        return (1 + sum(p >= t0 for p in perm)) / 1000.0
    raise ValueError(test)


def variant(name, d):
    het = bool(d["noise_in_outputs"])
    if name == "auto":
        return MondrianConformalCalibrator()
    if name == "five":
        return MondrianConformalCalibrator(min_bins=5)
    if name == "one":
        return MondrianConformalCalibrator(min_bins=1)
    kind, test, alpha = name.split("_")  # e.g. "homo_kw_0.1" (test on the homoscedastic only), "all_kw_0.1"
    if kind == "homo" and het:
        return MondrianConformalCalibrator()
    return MondrianConformalCalibrator(min_bins=5 if homogeneity_p(d, test) < float(alpha) else 1)


def _reference():
    ref = {}
    r = _common.read_results(_common.RESULTS / "regional_coverage_int_uci.json")
    for u in r["uci"]:
        ref[f"uci_{u['dataset']}_{u['split']}"] = u["methods"]["split_nn"]["interval_score"]
    r = _common.read_results(_common.RESULTS / "mondrian_shift_int_shift.json")
    for u in r["runs"]:
        ref[f"shift_{u['dataset']}_{u['feature']}"] = u["methods"]["split_nn"]["interval_score"]
    return ref


def quintiles(std, hit):
    order = np.argsort(std, kind="stable")
    return [(hit[g].sum(), g.size) for g in np.array_split(order, 5)]


def stage_calibrate(study, names):
    ref = _reference()
    for name in names:
        per_set = {}
        for s in rc.UCI_SETS:
            files = sorted(CACHE.glob(f"{study}_{s}_*.npz"))
            ratios, covs, q, chosen = [], [], np.zeros((5, 2)), []
            for f in files:
                d = dict(np.load(f))
                pis, std, nb = apply(variant(name, d), d)
                ratios.append(interval_score(d["y_t"], pis, LEVEL)
                              / ref[f.stem])
                hit = (d["y_t"] >= pis[:, 0]) & (d["y_t"] <= pis[:, 1])
                covs.append(hit.mean())
                q += np.array(quintiles(std, hit))
                chosen.append(nb)
            per_set[s] = (float(np.exp(np.mean(np.log(ratios)))), float(np.mean(covs)), 100 * q[:, 0] / q[:, 1],
                          np.mean(np.array(chosen) > 1), len(files))
        geo = np.exp(np.mean([np.log(v[0]) for v in per_set.values()]))
        cov = np.mean([v[1] for v in per_set.values()])
        print(f"{name:16s} geo {geo:.3f} cov {100 * cov:.1f} | " + " | ".join(
            f"{s[:6]} {v[0]:.3f} {100 * v[1]:.1f} {'/'.join(f'{x:.1f}' for x in v[2])} b{v[3]:.2f} n{v[4]}"
            for s, v in per_set.items()), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", choices=("fit", "calibrate"), default="calibrate")
    p.add_argument("--study", choices=("uci", "shift"), default="uci")
    p.add_argument("--splits", type=int, default=20)
    p.add_argument("--first-split", type=int, default=0)
    p.add_argument("--variants", nargs="+", default=["one", "auto", "five"])
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.stage == "fit":
        stage_fit(a.study, a.splits, a.first_split)
    else:
        stage_calibrate(a.study, a.variants)


if __name__ == "__main__":
    main()
