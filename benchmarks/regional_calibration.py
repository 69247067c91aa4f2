"""Calibration methods per region, measured on cached predictive moments (one fit per partition, many calibrations).

The partitions, data and fitted estimators are those of ``regional_coverage.py`` (same seeds, same 80/20 or 90/10
fitting/calibration rows): per partition the heteroscedastic estimator (``likelihood="heteroscedastic"``, conformal)
and the homoscedastic default are fitted once, and their predictive moments (ŷ, σ̂ in user units; σ̂ is the conformal
normalisation times ``std_scale_``, a constant per fit, which moves no interval below) on the calibration and test
rows are cached (``--stage fit``). ``--stage eval`` then applies each calibration method to the cached moments through
the package's calibrators (``calibrate_predictions`` / ``region``) and scores the intervals per region
(:func:`glas_sklearn.regional_coverage.regional_coverage_from_predictions`), as ``regional_coverage.py`` does.

The ``shift`` study holds out the top third of feature f = 0..3 of each dev set (``uci.shift_indices``, the runs
of ``mondrian_shift.py``). Two synthetic studies serve Mondrian over σ̂ bins where the calibration sets are large
enough for it to act (≥ 200 rows): ``synthetic_shift`` (per shape and seed the synthetic study's 2500 + 5000 rows;
for feature f = 0, 1 the test rows are those above the training rows' 2/3 quantile of x_f, the fitting and
calibration rows (20 %) those at or below it: about 333 calibration rows, 3 Mondrian bins) and ``synthetic_large``
(6000 rows, 1200 of them calibration rows: 10 Mondrian bins of 120). ``synthetic_shift_large`` holds out the top
third of x_f as ``synthetic_shift`` does from 6000 rows: 800 calibration rows, 4 bands of the regressor's default
(200-row) Mondrian bins, 8 of 100 rows. ``--small-variants`` evaluates calibrations
aimed at tiny calibration sets (:data:`SMALL_METHODS`) on the ``uci`` and ``shift`` caches. The cache
(``benchmarks/results/cache_regional_calibration/``, not committed) is rebuilt by the fit stage; the eval stage
reads every cached run.

Usage::

    python benchmarks/regional_calibration.py --stage fit --study synthetic --seeds 3
    python benchmarks/regional_calibration.py --stage fit --study uci --splits 20
    python benchmarks/regional_calibration.py --stage fit --study shift
    python benchmarks/regional_calibration.py --stage fit --study synthetic_shift --seeds 10
    python benchmarks/regional_calibration.py --stage fit --study synthetic_large --seeds 10
    python benchmarks/regional_calibration.py --stage fit --study synthetic_shift_large --seeds 10
    python benchmarks/regional_calibration.py --stage eval --tag i27d
    python benchmarks/regional_calibration.py --stage eval --methods default het_fit het_fit_mondrian split_nn \
        --tag i27g
    python benchmarks/regional_calibration.py --stage eval --small-variants --tag i27g_small
    python benchmarks/regional_calibration.py --stage eval --studies synthetic_shift_large \
        --methods default het_fit het_fit_mondrian het_fit_mondrian200 split_nn --tag i27l
    python benchmarks/regional_calibration.py --stage eval --ranking-variants --studies uci shift synthetic_large \
        --tag i27o_ranking
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import _common
import numpy as np
import regional_coverage as rc
import torch

from glas_sklearn.calibration import (
    MondrianConformalCalibrator,
    conformal_quantile,
    epistemic_cap,
    fit_epistemic_weight,
    weighted_moments,
)
from glas_sklearn.predictive import RegressionMoments

CACHE = _common.RESULTS / "cache_regional_calibration"
STEM = "regional_calibration"
STUDIES = ("synthetic", "uci", "shift", "synthetic_shift", "synthetic_large", "synthetic_shift_large")
SHIFT_STUDIES = ("synthetic_shift", "synthetic_shift_large")  # the top third of x0 / x1 held out
LEVEL = rc.LEVEL
# the Mondrian calibrator as these reports measured it (before min_bins and the interpolated quantile)
PINNED = {"min_bins": 1, "quantile_method": "higher"}
METHODS = [
    ("default", "GLAS homoscedastic default (conformal; one variance part, so λ is moot)"),
    ("het", "heteroscedastic, split conformal with σ̂² = σ_ale² + σ_epi² (λ = 1: the calibration before this change)"),
    ("het_fit", "heteroscedastic, λ fitted on the calibration rows in the capped form, epistemic excess beyond "
                "their median σ_epi² counted at least in full (the default, `ConformalCalibrator()`, since i27f)"),
    ("het_fit_max", "as `het_fit` with the cap at the calibration rows' largest σ_epi² and λ fitted without it "
                    "(the default of i27d)"),
    ("het_fit_nocap", "as `het_fit` without the cap (σ̂² = σ_ale² + λ σ_epi² everywhere)"),
    ("het_mondrian", "heteroscedastic, λ = 1, Mondrian over σ̂ bins (min_bin_size 100)"),
    ("het_fit_mondrian", "`het_fit` + Mondrian over σ̂ bins (min_bin_size 100)"),
    ("het_fit_mondrian200", "`het_fit` + Mondrian over σ̂ bins (min_bin_size 200: `MondrianConformalCalibrator()`, "
                            "the regressor's default calibration since i27h)"),
    ("het_fit_mondrian30", "`het_fit` + Mondrian over σ̂ bins (min_bin_size 30)"),
    ("het_fit_mondrian9", "`het_fit` + Mondrian over σ̂ bins (min_bin_size 9 = ⌈1/γ⌉ − 1: as many bins as finite "
                          "quantiles allow, at most 10)"),
    ("het_gamma", "heteroscedastic, score |y − ŷ| / σ̂^γ, γ = least-squares slope of log|r| on log σ̂ on the "
                  "calibration rows, clipped to [0, 2]"),
    ("split_nn", "split conformal |y − ŷ| around the default's network (the reference)"),
]
# ``--small-variants``: calibrations aimed at tiny calibration sets, all on `het_fit`'s σ̂ (the lead's prototypes)
SMALL_METHODS = [(k, dict(METHODS)[k]) for k in ("default", "het_fit", "het_fit_mondrian")] + [
    ("het_fit_interp", "`het_fit` with the conformal quantile linearly interpolated between the order statistics "
                       "around rank (1 − γ)(n + 1) (deterministic; no finite-sample guarantee)"),
    ("het_fit_mondrian14_interp", "`het_fit` + Mondrian over ⌊n/14⌋ ≤ 5 equal-count σ̂ bins (one bin below 28 "
                                  "rows), each bin's quantile interpolated as `het_fit_interp`"),
    ("het_fit_local", "`het_fit` + localized conformal: triangle kernel in the calibration rank of log σ̂, half-width "
                      "max(15 rows, 0.3 n), weighted quantile of the scores at level (1 − γ)(1 + 1/n_eff) "
                      "(n_eff = (Σw)²/Σw²), linearly interpolated on the mid-point weighted ECDF"),
    ("split_nn", dict(METHODS)["split_nn"])]
# ``--ranking-variants``: other shapes of σ̂ from the same two parts (σ_ale of the variance head, σ_epi of the
# posterior), each fitted on the calibration rows by the Gaussian profile NLL (one scale left to the conformal
# quantile), pooled conformal; asked on the dev sets whether any σ̂ of these parts ranks energy's errors better
RANKING_METHODS = [(k, dict(METHODS)[k]) for k in ("default", "het_fit")] + [
    ("het_fit_power", "`het_fit`'s σ̂ raised to a power β ∈ [0, 2] fitted by the profile NLL of the calibration "
                      "residuals under σ = c σ̂^β (β < 1 compresses σ̂, β = 0 is split conformal around the same mean)"),
    ("het_loglin", "σ̂ = σ_ale^a σ_epi^b, (a, b) ∈ [0, 1.5]² fitted by the profile NLL on the calibration rows"),
    ("het_add", "σ̂ = σ_ale + λ σ_epi (standard deviations added, not variances), λ ∈ {0, 0.03, …, 3} fitted by "
                "the profile NLL on the calibration rows"),
    ("het_fit_mondrian30", dict(METHODS)["het_fit_mondrian30"]),
    ("split_nn", dict(METHODS)["split_nn"])]
# ``--variants``: variants of the cap m and the weight λ of ``het_fit``
# (name: (cap quantile, λ floor, λ fitted in the capped form))
VARIANTS = {
    "het_fit_q90": (0.9, 0.0, False), "het_fit_q75": (0.75, 0.0, False), "het_fit_q50": (0.5, 0.0, False),
    "het_fit_floor0.1": (1.0, 0.1, False), "het_fit_floor0.2": (1.0, 0.2, False),
    "het_fit_q90_capfit": (0.9, 0.0, True), "het_fit_q75_capfit": (0.75, 0.0, True),
    "het_fit_q50_capfit": (0.5, 0.0, True), "het_fit_q25_capfit": (0.25, 0.0, True),
    "het_fit_q90_floor0.1": (0.9, 0.1, False), "het_fit_q75_floor0.1": (0.75, 0.1, False),
}
VARIANT_METHODS = [(k, dict(METHODS)[k]) for k in ("default", "het", "het_fit", "het_fit_max")] + [
    (k, f"`het_fit` with m = the {q:g} quantile of the calibration rows' σ_epi², λ ≥ {f:g}"
        + (", λ fitted by the profile NLL of the capped σ̂² itself" if c else "")) for k, (q, f, c) in VARIANTS.items()
] + [("split_nn", dict(METHODS)["split_nn"])]

#: Every method a report may hold, with its description.
ALL_METHODS = dict(METHODS + VARIANT_METHODS + SMALL_METHODS + RANKING_METHODS)


def _fit_weight_capped(r, vn, ve, m):
    """λ minimising the profile NLL of σ̂² = vn + λ min(ve, m) + max(λ, 1)(ve − m)₊ (the form it is applied in)."""
    from glas_sklearn.calibration.conformal import EPISTEMIC_WEIGHTS, _profile_nll
    lo, ex = np.minimum(ve, m), np.maximum(ve - m, 0.0)
    best, out = _profile_nll(r, vn + lo + ex), 1.0
    for lam in EPISTEMIC_WEIGHTS:
        nll = _profile_nll(r, vn + lam * lo + max(lam, 1.0) * ex)
        if nll < best - 1e-9 * abs(best) - 1e-12:
            best, out = nll, float(lam)
    return np.array([out])


def _moments(est, X):
    mu, sd = est.predict(X, return_std=True)
    return mu, sd


def fit_partition(X_fit, y_fit, X_cal, y_cal, X_te, seed):
    out = {}
    for name, lik in (("het", "heteroscedastic"), ("default", "gaussian")):
        est = rc.fit_glas(lik, X_fit, y_fit, X_cal, y_cal, seed)
        for part, X in (("cal", X_cal), ("te", X_te)):
            mu, sd = _moments(est, X)
            out[f"{name}_mu_{part}"], out[f"{name}_sd_{part}"] = mu, sd
            # the noise part σ_ale(x) (user units) and the normalisation σ̂ itself (without std_scale_)
            out[f"{name}_ale_{part}"] = est.predict_noise_std(X) * np.ones(len(X))
            out[f"{name}_sdn_{part}"] = sd / np.atleast_1d(est.std_scale_)[0]
        out[f"{name}_pis_te"] = est.predict_interval(X_te)[1][:, :, 0]
        out[f"{name}_std_scale"] = np.atleast_1d(est.std_scale_)
    return out


def stage_fit(args):
    CACHE.mkdir(parents=True, exist_ok=True)
    if args.study in ("synthetic", "synthetic_large"):
        jobs = [(shape, seed) for seed in range(args.seeds) for shape in args.shapes]
    elif args.study in SHIFT_STUDIES:  # the top third of feature f = 0, 1 held out (group "<shape>_f<f>")
        jobs = [(f"{shape}_f{f}", seed) for seed in range(args.seeds) for shape in args.shapes for f in (0, 1)]
    elif args.study == "shift":  # mondrian_shift.py's runs: the top third of feature f held out, f = 0..3
        jobs = [(name, f) for name in args.datasets for f in range(4)]
    else:
        jobs = [(name, split) for split in range(args.first_split, args.splits) for name in args.datasets]
    for a, b in jobs:
        path = CACHE / f"{args.study}_{a}_{b}.npz"
        if path.exists():
            continue
        t0 = time.perf_counter()
        if args.study.startswith("synthetic"):
            shape, f = a.rsplit("_f", 1) if args.study in SHIFT_STUDIES else (a, None)
            n_train = args.n_train or (6000 if args.study in ("synthetic_large", "synthetic_shift_large") else 2500)
            rng = np.random.default_rng(7919 * b + len(shape))
            X, y, s = rc.draw(shape, n_train, rng)
            X_te, y_te, s_te = rc.draw(shape, 5000, rng)
            if f is not None:  # extrapolation: fit/calibrate at or below the 2/3 quantile of X[:, f], test above
                cut = np.quantile(X[:, int(f)], 2 / 3)
                keep, out = X[:, int(f)] <= cut, X_te[:, int(f)] > cut
                X, y, s, X_te, y_te, s_te = X[keep], y[keep], s[keep], X_te[out], y_te[out], s_te[out]
            n_cal = int(round(args.cal_share * len(y)))
            X_fit, y_fit, X_cal, y_cal, s_cal = X[n_cal:], y[n_cal:], X[:n_cal], y[:n_cal], s[:n_cal]
            extra = {"noise_te": s_te, "noise_cal": s_cal}
        else:
            if args.study == "shift":
                import uci
                X, y = _common.load_uci(args.data_dir / a)
                train, test = uci.shift_indices(X, b, "extrapolation")
            else:
                X, y, train, test = _common.load_uci(args.data_dir / a, b)
            perm = np.random.default_rng(1000 + b).permutation(train)
            n_cal = int(round(0.1 * len(train)))
            cal, fit = perm[:n_cal], perm[n_cal:]
            X_fit, y_fit, X_cal, y_cal, X_te, y_te = X[fit], y[fit], X[cal], y[cal], X[test], y[test]
            extra = {}
        mom = fit_partition(X_fit, y_fit, X_cal, y_cal, X_te, b)
        np.savez(path, y_cal=y_cal, y_te=y_te, X_te=X_te, X_fit_mean=X_fit.mean(0), X_fit_std=X_fit.std(0),
                 **mom, **extra)
        print(f"[fit] {a} {b}: {time.perf_counter() - t0:.0f}s", flush=True)


# ------------------------------------------------------------------------------------------------------- eval
def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64).reshape(len(a), -1))


def _parts(d, part):
    """(mean, aleatoric, epistemic variance) of the heteroscedastic fit on the rows, user units, as tensors (n, 1)."""
    sd, ale = d[f"het_sdn_{part}"], d[f"het_ale_{part}"]
    return _t(d[f"het_mu_{part}"]), _t(ale**2), _t(np.maximum(sd**2 - ale**2, 0.0))


def interpolated_quantile(scores, level):
    """The conformal quantile with the rank (1 − γ)(n + 1) taken fractionally: linear interpolation between the two
    order statistics around it (the largest score above rank n − 1, infinite above rank n; the smallest below 1)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    pos = level * (len(s) + 1) - 1  # 0-based fractional rank
    lo = int(np.floor(pos))
    if lo + 1 >= len(s):
        return float(s[-1]) if lo < len(s) else np.inf
    if lo < 0:
        return float(s[0])
    return float(s[lo] + (pos - lo) * (s[lo + 1] - s[lo]))


def equal_count_bins(sd_cal, sd_te, n_bins):
    """Bin indices of the calibration and test rows for ``n_bins`` equal-count bins of the calibration σ̂."""
    edges = np.quantile(sd_cal, np.linspace(0, 1, n_bins + 1)[1:-1])
    return np.searchsorted(edges, sd_cal), np.searchsorted(edges, sd_te)


def localized_quantile(scores, sd_cal, sd_te, level, share=0.3, min_rows=15):
    """Per test row, the weighted quantile of the calibration scores, weights a triangle kernel in the calibration
    rank of log σ̂ (half-width max(``min_rows``, ⌈share n⌉) rows), at level (1 − γ)(1 + 1/n_eff), interpolated on the
    mid-point weighted ECDF of the rows with positive weight (the largest such score above its last point)."""
    n = len(scores)
    h = max(min_rows, int(np.ceil(share * n))) / n
    log_c, log_t = np.log(sd_cal), np.log(sd_te)
    ranks = np.sort(log_c)
    u_c = (np.searchsorted(ranks, log_c, side="right") - 0.5) / n
    u_t = np.interp(log_t, ranks, (np.arange(n) + 0.5) / n)
    order = np.argsort(scores)
    s, u_c = np.asarray(scores, dtype=np.float64)[order], u_c[order]
    out = np.empty(len(sd_te))
    for i, u in enumerate(u_t):
        w = np.clip(1 - np.abs(u - u_c) / h, 0.0, None)
        keep = w > 0
        w, si = w[keep], s[keep]
        total = w.sum()
        lev = min(level * (1 + (w**2).sum() / total**2), 1.0)
        ecdf = (np.cumsum(w) - 0.5 * w) / total
        out[i] = np.interp(lev, ecdf, si)
    return out


def _het_fit_moments(d):
    """ŷ and σ̂ (user units up to std_scale_) of `het_fit` on the calibration and the test rows: λ fitted on the
    calibration rows with the median cap (``ConformalCalibrator()``'s σ̂, the one its Mondrian bins are built on)."""
    pc, pt = _parts(d, "cal"), _parts(d, "te")
    cap = epistemic_cap(pc[2].numpy())
    lam = fit_epistemic_weight(d["y_cal"] - d["het_mu_cal"], pc[1].numpy(), pc[2].numpy(), cap)
    mc, mt = weighted_moments(pc, 0.0, lam, cap), weighted_moments(pt, 0.0, lam, cap)
    return tuple(a.numpy()[:, 0] for a in (mc.mean, mc.std, mt.mean, mt.std)) + (float(lam[0]),)


def intervals(method, d):
    """(lower, upper) on the test rows for one method from the cached moments (the package's functions)."""
    y_cal = d["y_cal"]
    if method == "split_nn":
        q = conformal_quantile(np.abs(y_cal - d["default_mu_cal"]), LEVEL)[0]
        return d["default_mu_te"] - q, d["default_mu_te"] + q
    if method == "default":
        mu_c, sd_c, mu_t, sd_t = d["default_mu_cal"], d["default_sdn_cal"], d["default_mu_te"], d["default_sdn_te"]
    elif method in ("het_loglin", "het_add"):
        return _two_part_intervals(method, d)
    else:
        pc, pt = _parts(d, "cal"), _parts(d, "te")
        if method in ("het", "het_mondrian", "het_gamma"):
            lam, cap = np.ones(1), None
        elif method in VARIANTS:
            q, floor, capfit = VARIANTS[method]
            cap = np.quantile(pc[2].numpy(), q, axis=0)
            if capfit:
                lam = _fit_weight_capped(y_cal - d["het_mu_cal"], pc[1].numpy()[:, 0], pc[2].numpy()[:, 0], cap[0])
            else:
                lam = fit_epistemic_weight(y_cal - d["het_mu_cal"], pc[1].numpy(), pc[2].numpy())
            lam = np.maximum(lam, floor)
        elif method.startswith("het_fit") and method not in ("het_fit_nocap", "het_fit_max"):  # the default
            cap = epistemic_cap(pc[2].numpy())
            lam = fit_epistemic_weight(y_cal - d["het_mu_cal"], pc[1].numpy(), pc[2].numpy(), cap)
        else:
            lam = fit_epistemic_weight(y_cal - d["het_mu_cal"], pc[1].numpy(), pc[2].numpy())
            cap = None if method == "het_fit_nocap" else pc[2].amax(0).numpy()
        mc, mt = weighted_moments(pc, 0.0, lam, cap), weighted_moments(pt, 0.0, lam, cap)
        mu_c, sd_c, mu_t, sd_t = (a.numpy()[:, 0] for a in (mc.mean, mc.std, mt.mean, mt.std))
        score = np.abs(y_cal - mu_c) / sd_c
        if method == "het_fit_interp":
            w = interpolated_quantile(score, LEVEL) * sd_t
            return mu_t - w, mu_t + w
        if method == "het_fit_mondrian14_interp":
            n_bins = int(max(1, min(5, len(score) // 14)))
            bc, bt = equal_count_bins(sd_c, sd_t, n_bins)
            q = np.array([interpolated_quantile(score[bc == b] if (bc == b).any() else score, LEVEL)
                          for b in range(n_bins)])
            w = q[bt] * sd_t
            return mu_t - w, mu_t + w
        if method == "het_fit_local":
            w = localized_quantile(score, sd_c, sd_t, LEVEL) * sd_t
            return mu_t - w, mu_t + w
        if "mondrian" in method:
            cal = MondrianConformalCalibrator(min_bin_size=int(method.rsplit("mondrian", 1)[1] or 100), **PINNED)
            cal.calibrate_predictions(RegressionMoments(_t(mu_c), _t(sd_c)), _t(y_cal), LEVEL)
            b = cal.region(RegressionMoments(_t(mu_t), _t(sd_t)), LEVEL)[:, 0, :, 0].numpy()
            return b[:, 0], b[:, 1]
        if method in ("het_fit_power", "het_gamma"):
            ref = np.exp(np.log(sd_c).mean())
            if method == "het_fit_power":  # the profile-NLL exponent
                g = _profile_argmin(np.abs(y_cal - mu_c), [np.log(sd_c / ref)], [np.linspace(0.0, 2.0, 81)])[0]
            else:  # the least-squares slope of log|r| on log σ̂
                r, c = np.log(np.abs(y_cal - mu_c) + 1e-300), np.log(sd_c / ref)
                g = float(np.clip((c * (r - r.mean())).sum() / max((c**2).sum(), 1e-300), 0.0, 2.0))
            q = conformal_quantile(np.abs(y_cal - mu_c) / (sd_c / ref) ** g, LEVEL)[0]
            w = q * (sd_t / ref) ** g
            return mu_t - w, mu_t + w
    q = conformal_quantile(np.abs(y_cal - mu_c) / sd_c, LEVEL)[0]
    return mu_t - q * sd_t, mu_t + q * sd_t


def _profile_argmin(abs_r, log_parts, grids):
    """The exponents e (one per log part) on the grid minimising the Gaussian profile NLL of the residuals under
    σ = c exp(Σ e_j log_part_j), c in closed form: mean log σ + ½ log mean(r² / σ²) up to constants."""
    best, arg = np.inf, None
    for e in np.array(np.meshgrid(*grids, indexing="ij")).reshape(len(grids), -1).T:
        ls = sum(ej * lp for ej, lp in zip(e, log_parts, strict=True))
        nll = ls.mean() + 0.5 * np.log(np.mean(abs_r**2 * np.exp(-2 * ls)) + 1e-300)
        if nll < best:
            best, arg = nll, e
    return arg


def _two_part_intervals(method, d):
    """`het_loglin` and `het_add`: σ̂ built from σ_ale and σ_epi of the heteroscedastic fit in another shape, its
    parameters fitted by the profile NLL on the calibration rows, pooled conformal quantile."""
    tiny = 1e-12
    ale = {p: np.maximum(d[f"het_ale_{p}"], tiny) for p in ("cal", "te")}
    epi = {p: np.maximum(np.sqrt(np.maximum(d[f"het_sdn_{p}"] ** 2 - d[f"het_ale_{p}"] ** 2, 0.0)), tiny)
           for p in ("cal", "te")}
    abs_r = np.abs(d["y_cal"] - d["het_mu_cal"])
    if method == "het_loglin":
        ra, re = np.exp(np.log(ale["cal"]).mean()), np.exp(np.log(epi["cal"]).mean())
        grid = np.linspace(0.0, 1.5, 31)
        a, b = _profile_argmin(abs_r, [np.log(ale["cal"] / ra), np.log(epi["cal"] / re)], [grid, grid])
        sd = {p: (ale[p] / ra) ** a * (epi[p] / re) ** b for p in ("cal", "te")}
    else:
        lams = np.array([0.0, 0.03, 0.1, 0.3, 1.0, 3.0])
        nll = [np.log(ale["cal"] + lam * epi["cal"]).mean()
               + 0.5 * np.log(np.mean(abs_r**2 / (ale["cal"] + lam * epi["cal"]) ** 2)) for lam in lams]
        lam = lams[int(np.argmin(nll))]
        sd = {p: ale[p] + lam * epi[p] for p in ("cal", "te")}
    w = conformal_quantile(abs_r / sd["cal"], LEVEL)[0] * sd["te"]
    return d["het_mu_te"] - w, d["het_mu_te"] + w


def _quintile_counts(values, covered):
    edges = np.quantile(values, [0.2, 0.4, 0.6, 0.8])
    b = np.searchsorted(edges, values, side="left")
    return [int(covered[b == i].sum()) for i in range(5)], [int((b == i).sum()) for i in range(5)]


def evaluate(path, methods=METHODS):
    d = dict(np.load(path))
    y = d["y_te"]
    # the pre-calibration σ̂ of `het_fit` (fitted λ, median cap): the σ̂ its Mondrian bins are built on
    _, sd_pre_cal, _, sd_pre, lam = _het_fit_moments(d)
    out = {}
    for m, _ in methods:
        lo, hi = intervals(m, d)
        cov = (lo <= y) & (y <= hi)
        width = hi - lo
        e = {"coverage": float(cov.mean()), "interval_score": float(np.mean(
            width + 2 / (1 - LEVEL) * ((lo - y) * (y < lo) + (y - hi) * (y > hi))))}
        # own regions: quintiles of the half-width (a monotone map of the method's σ̂), broken ties by the het σ̂
        e["own"] = _quintile_counts(width + 1e-9 * np.std(width) * d["het_sdn_te"] / d["het_sdn_te"].max(), cov)
        e["ref"] = _quintile_counts(d["default_sd_te"], cov)
        e["pre"] = _quintile_counts(sd_pre, cov)
        if "noise_te" in d:
            e["noise"] = _quintile_counts(d["noise_te"], cov)
        out[m] = e
    n_cal = int(len(d["y_cal"]))
    n_bins = MondrianConformalCalibrator(min_bin_size=100, **PINNED).bins_for(n_cal, LEVEL)
    # the share of test rows above the calibration rows' (1 − 1/B) quantile of σ̂: in the top Mondrian bin
    top = float(np.mean(sd_pre > np.quantile(sd_pre_cal, 1 - 1 / n_bins))) if n_bins > 1 else 1.0
    n_bins200 = MondrianConformalCalibrator(min_bin_size=200, **PINNED).bins_for(n_cal, LEVEL)
    diag = {"lambda": lam, "n_cal": n_cal, "n_te": int(len(y)), "mondrian_bins": n_bins, "top_bin_share": top,
            "mondrian200_bins": n_bins200}
    if n_bins200 > 1:  # and in the top band of the 200-row bins (the regressor's default)
        diag["top200_bin_share"] = float(np.mean(sd_pre > np.quantile(sd_pre_cal, 1 - 1 / n_bins200)))
    return out, diag


def _cached_runs(study):
    """(group, index, path) of the cached runs of one study (``synthetic_*`` files of the other synthetic studies
    excluded: those of a study whose name extends this one's, e.g. ``synthetic_shift_large`` for
    ``synthetic_shift``)."""
    longer = [s for s in STUDIES if s.startswith(study + "_")]
    out = []
    for path in sorted(CACHE.glob(f"{study}_*.npz")):
        if any(path.stem.startswith(s + "_") for s in longer):
            continue
        group, index = path.stem[len(study) + 1:].rsplit("_", 1)
        if study == "synthetic" and group not in rc.SHAPES:
            continue
        out.append((group, int(index), path))
    return out


def _method_set(args):
    if args.variants:
        return VARIANT_METHODS
    if args.ranking_variants:
        return RANKING_METHODS
    methods = SMALL_METHODS if args.small_variants else METHODS
    if args.methods:  # split_nn always: the reference of the IS ratios
        methods = [(k, v) for k, v in dict(METHODS + SMALL_METHODS).items() if k in args.methods + ["split_nn"]]
    return methods


def stage_eval(args):
    results = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": vars(args) | {"data_dir": str(args.data_dir)}}
    studies = args.studies or (("uci", "shift") if args.small_variants else STUDIES)
    for study in studies:
        runs = []
        for group, index, path in _cached_runs(study):
            res, diag = evaluate(path, _method_set(args))
            runs.append({"group": group, "index": index, "methods": res, "diagnostics": diag})
        results[study] = runs
    json_path = _results_path(args.tag)
    print(_common.write_results_and_report(json_path, json_path.with_suffix(".md"), results, render,
                                           command=_common.command_line(__file__, None))[1])


def _results_path(tag):
    """The results JSON of ``--tag`` (its report: the same name, .md)."""
    return _common.RESULTS / f"{STEM}{'_' + tag if tag else ''}.json"


def _pooled(runs, m, key):
    c, n = np.zeros(5), np.zeros(5)
    for r in runs:
        if key in r["methods"][m]:
            c += r["methods"][m][key][0]
            n += r["methods"][m][key][1]
    return (c / np.maximum(n, 1)).tolist() if n.sum() else []


def _q(v):
    return " / ".join(f"{100 * x:.0f}" for x in v)


def _ok(v):
    return bool(v) and min(v) >= 0.85 - 1e-12 and max(v) <= 0.95 + 1e-12


def _subtitle(results) -> str:
    """Tells the reports of one study apart: the cap variants, the small-set calibrations, Mondrian against the
    conformal default, or which ``het_fit`` the run measured."""
    if "--variants" in results["command"]:
        return " (variants of the cap and the weight)"
    if "--small-variants" in results["command"]:
        return " (calibrations for small calibration sets)"
    if "--ranking-variants" in results["command"]:
        return " (other shapes of σ̂ from σ_ale and σ_epi)"
    if "--methods" in results["command"]:
        studies = [s for s in STUDIES if results.get(s)] if "--studies" in results["command"] else []
        return (" (Mondrian over σ̂ against the conformal default, median cap"
                + (f"; {', '.join(f'`{s}`' for s in studies)}" if studies else "") + ")")
    methods = {m for study in STUDIES for run in results.get(study, []) for m in run.get("methods", {})}
    return " (median cap)" if "het_fit_max" in methods else " (cap at the largest σ_epi²)"


TITLES = {"synthetic": "Synthetic noise shapes (in distribution)",
          "synthetic_large": "Synthetic noise shapes, 6000 rows (1200 calibration rows), in distribution",
          "synthetic_shift": "Synthetic noise shapes, top-third extrapolation (group `<shape>_f<f>`: the test rows "
                             "above the training rows' 2/3 quantile of feature f, fitted and calibrated at or below "
                             "it)",
          "synthetic_shift_large": "Synthetic noise shapes, 6000 rows, top-third extrapolation (group "
                                   "`<shape>_f<f>` as in the 2500-row study: about 800 calibration rows, 4 bins of "
                                   "200 and 8 of 100)",
          "uci": "UCI dev sets, standard splits, in distribution",
          "shift": "UCI dev sets, top-third extrapolation (feature f = 0..3 held out above its 2/3 quantile)"}
KEYS = ("noise", "pre", "own", "ref")


def _geo_ratio(rs, m, base):
    return float(np.exp(np.mean([np.log(r["methods"][m]["interval_score"] / r["methods"][base]["interval_score"])
                                 for r in rs])))


def _head_to_head(results, a="het_fit", b="het_fit_mondrian"):
    """One table, per study and group: IS of ``b`` / IS of ``a`` (geometric mean over runs; per study also over all
    its runs), the runs where ``b`` has the lower IS, mean coverage, and the lowest / highest pooled quintile
    coverage of each on the true noise and on the pre-calibration σ̂."""
    rows = []
    for study in STUDIES:
        runs = results.get(study) or []
        if not runs or a not in runs[0]["methods"] or b not in runs[0]["methods"] \
                or "mondrian_bins" not in runs[0]["diagnostics"]:  # (reports before i27g: no such table)
            continue
        for g in list(dict.fromkeys(r["group"] for r in runs)) + [None]:
            rs = [r for r in runs if g is None or r["group"] == g]
            if g is None and len(rs) == len([r for r in runs if r["group"] == runs[0]["group"]]):
                continue  # one group: no study line
            lower = sum(r["methods"][b]["interval_score"] < r["methods"][a]["interval_score"] for r in rs)
            bins = {r["diagnostics"]["mondrian_bins"] if b == "het_fit_mondrian" else
                    r["diagnostics"].get("mondrian200_bins", "–") if b == "het_fit_mondrian200" else
                    max(1, min(5, r["diagnostics"]["n_cal"] // 14)) if b == "het_fit_mondrian14_interp" else "–"
                    for r in rs}
            cells = [f"{study} / {g}" if g else f"**{study}, all runs**", ", ".join(str(x) for x in sorted(bins)),
                     f"{_geo_ratio(rs, b, a):.3f}", f"{lower}/{len(rs)}",
                     " / ".join(f"{100 * np.mean([r['methods'][m]['coverage'] for r in rs]):.1f}" for m in (a, b))]
            for key in ("noise", "pre"):
                cells.append(" / ".join(f"{100 * min(v):.0f}–{100 * max(v):.0f}" if v else "–"
                                        for v in (_pooled(rs, m, key) for m in (a, b))))
            rows.append(cells)
    if not rows:
        return []
    return _common.markdown_table(
        ["study / group", "bins", f"IS `{b}` / `{a}`", f"runs with `{b}` lower IS",
         f"coverage % `{a}` / `{b}`", f"true-σ quintiles min–max % `{a}` / `{b}`",
         f"pre-σ̂ quintiles min–max % `{a}` / `{b}`"], rows, "llrrrll")


def render(results) -> str:
    present = {m for study in STUDIES for run in results.get(study, []) for m in run["methods"]}
    lines = [f"# Calibration per region: the epistemic weight, Mondrian, a fitted exponent{_subtitle(results)}",
             "",
             f"`{results['command']}`", "", _common.machine_line(results["machine"]), "",
             "Per partition one heteroscedastic fit and one homoscedastic default fit (`regional_coverage.py`'s "
             "seeds and partitions; 1 torch thread), cached; every calibration below is then applied to the same "
             "cached moments with the package's functions (`fit_epistemic_weight`, `weighted_moments`, "
             "`MondrianConformalCalibrator.calibrate_predictions`, `conformal_quantile`)"
             + (" or, for the small-set calibrations, this script's" if present & set(dict(SMALL_METHODS[3:-1]))
                else "") + ". 90 % intervals. "
             "Methods: " + "; ".join(f"`{k}` {v}" for k, v in ALL_METHODS.items() if k in present) + ".", ""]
    if any("pre" in m for study in STUDIES for run in results.get(study, []) for m in run["methods"].values()):
        lines += ["Coverage per quintile (%) pooled over runs: of the true noise σ(x) (synthetic), of `het_fit`'s "
                  "pre-calibration σ̂ (`pre`: λ fitted, median cap, before the conformal quantile; the σ̂ the "
                  "Mondrian bins are built on, the same regions for every method), of the method's own half-width "
                  "(a monotone map of its σ̂ for one-quantile methods: the σ̂ quintiles of the issue's target; not "
                  "so for Mondrian at the bin edges), of the default's σ̂ (`ref`, the same regions for every "
                  "method). IS: mean interval score relative to `split_nn`, geometric mean over runs. Target (issue "
                  "27): every true-noise quintile and every σ̂ quintile 85–95 % (the column `in 85–95 %` checks the "
                  "true-noise quintiles where known, else the own ones).", ""]
    else:  # the reports before i27g
        lines += ["Coverage per quintile (%) pooled over runs: of the true noise σ(x) (synthetic), of the method's "
                  "own half-width (a monotone map of its σ̂: the σ̂ quintiles of the issue's target), of the "
                  "default's σ̂ (`ref`, the same regions for every method). IS: mean interval score relative to "
                  "`split_nn`, geometric mean over runs. Target (issue 27): every true-noise quintile and every σ̂ "
                  "quintile 85–95 %.", ""]
    for study in STUDIES:
        runs = results.get(study) or []
        if not runs:
            continue
        lines += [f"## {TITLES[study]}", ""]
        groups = list(dict.fromkeys(r["group"] for r in runs))
        has_pre = "pre" in next(iter(runs[0]["methods"].values()))  # (reports before i27g: no such column)
        summary = {}
        for g in groups:
            rs = [r for r in runs if r["group"] == g]
            lam = [r["diagnostics"]["lambda"] for r in rs]
            n_cal = sorted({r["diagnostics"]["n_cal"] for r in rs})
            n_cal = str(n_cal[0]) if len(n_cal) == 1 else f"{n_cal[0]}–{n_cal[-1]}"
            top = [r["diagnostics"].get("top_bin_share") for r in rs]
            top = f"; test rows in the top Mondrian bin {100 * np.mean(top):.0f} %" \
                if None not in top and rs[0]["diagnostics"]["mondrian_bins"] > 1 else ""
            top200 = [r["diagnostics"].get("top200_bin_share") for r in rs]
            top += f", in the top 200-row band {100 * np.mean(top200):.0f} %" if top and None not in top200 else ""
            lines += [f"### {g} ({len(rs)} runs, {n_cal} calibration rows; fitted λ median "
                      f"{np.median(lam):.3g}, range {min(lam):.3g}–{max(lam):.3g}{top})", ""]
            rows = []
            order = list(rs[0]["methods"]) if has_pre else list(ALL_METHODS)  # as evaluated
            for m in [k for k in order if k in rs[0]["methods"]]:
                ratio = _geo_ratio(rs, m, "split_nn")
                cov = 100 * float(np.mean([r["methods"][m]["coverage"] for r in rs]))
                noise, pre, own, ref = (_pooled(rs, m, k) for k in KEYS)
                target = noise or own
                summary.setdefault(m, []).append((ratio, _ok(target)))
                rows.append([f"`{m}`", f"{cov:.1f}", f"{ratio:.3f}", _q(noise)] + ([_q(pre)] if has_pre else [])
                            + ["one width" if m == "split_nn" else _q(own), _q(ref), "yes" if _ok(target) else "no"])
            lines += _common.markdown_table(["method", "coverage %", "IS / split_nn", "per true-σ quintile"]
                                            + (["per pre-σ̂ quintile"] if has_pre else [])
                                            + ["per own-σ̂ quintile", "per default-σ̂ quintile",
                                               "in 85–95 % (true σ / own σ̂)"], rows,
                                            "lrrl" + "l" * has_pre + "llr")
            lines += [""]
        lines += [f"Summary ({study}): IS / split_nn geometric mean over the groups; target met per group.", ""]
        lines += _common.markdown_table(
            ["method", "IS / split_nn (geo. mean)", "per group (" + ", ".join(groups) + ")", "target per group"],
            [[f"`{m}`", f"{np.exp(np.mean(np.log([x[0] for x in v]))):.3f}", " / ".join(f"{x[0]:.3f}" for x in v),
              " / ".join("yes" if x[1] else "no" for x in v)] for m, v in summary.items()], "lrll")
        lines += [""]
    small = [m for m, _ in SMALL_METHODS[3:-1] if m in present]
    for b in small or [m for m in ("het_fit_mondrian", "het_fit_mondrian200") if m in present]:
        h2h = _head_to_head(results, b=b)
        if h2h:
            lines += [f"## `{b}` against `het_fit`, per study and group", "",
                      f"IS ratio: geometric mean over the runs of IS(`{b}`) / IS(`het_fit`) (below 1: `{b}` better "
                      "in interval score); the study lines pool all its groups' runs. Quintile columns: "
                      "lowest–highest of the five quintile coverages pooled over the runs (the group's; for a study "
                      "line, over all its runs, each run's own quintiles). Bins: "
                      + ("⌊n_cal/100⌋ ≤ 10 (1 bin: the same intervals as `het_fit`)." if b == "het_fit_mondrian"
                         else "⌊n_cal/200⌋ ≤ 10 (1 bin: the same intervals as `het_fit`)." if b == "het_fit_mondrian200"
                         else "⌊n_cal/14⌋ ≤ 5." if "mondrian" in b else "none (one pooled or localized quantile)."),
                      ""] + h2h + [""]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="")
    p.add_argument("--stage", choices=("fit", "eval"), default="eval")
    p.add_argument("--study", choices=STUDIES, default="synthetic")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--splits", type=int, default=20)
    p.add_argument("--first-split", type=int, default=0)
    p.add_argument("--shapes", nargs="+", default=list(rc.SHAPES))
    p.add_argument("--datasets", nargs="+", default=rc.UCI_SETS)
    p.add_argument("--n-train", type=int, default=None,
                   help="synthetic rows before the hold-out (fitting + calibration; default 2500, 6000 for "
                        "synthetic_large and synthetic_shift_large)")
    p.add_argument("--cal-share", type=float, default=0.2)
    p.add_argument("--data-dir", type=Path, default=_common.data_dir("uci"))
    p.add_argument("--tag", default=None)
    p.add_argument("--variants", action="store_true",
                   help="evaluate the variants of the cap / weight of `het_fit` (VARIANTS) instead of METHODS")
    p.add_argument("--ranking-variants", action="store_true",
                   help="evaluate other shapes of σ̂ from σ_ale and σ_epi (RANKING_METHODS) instead of METHODS")
    p.add_argument("--small-variants", action="store_true",
                   help="evaluate the calibrations for tiny calibration sets (SMALL_METHODS; default studies uci, "
                        "shift) instead of METHODS")
    p.add_argument("--methods", nargs="+", default=None, choices=[k for k, _ in METHODS + SMALL_METHODS],
                   metavar="METHOD", help="eval: only these rows (of METHODS and SMALL_METHODS)")
    p.add_argument("--studies", nargs="+", default=None, choices=STUDIES,
                   help="eval: the cached studies to evaluate (default: all; uci and shift with --small-variants)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    if args.report_only:
        json_path = _results_path(args.tag)
        print(_common.report_from_results(json_path, json_path.with_suffix(".md"), render)[1])
    elif args.stage == "fit":
        stage_fit(args)
    else:
        stage_eval(args)


if __name__ == "__main__":
    main()
