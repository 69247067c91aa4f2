"""A naval-LIKE simulator (NOT the UCI data set): near noise-free targets on a grid, one feature driving all others.

The UCI "condition based maintenance of naval propulsion plants" set (11,934 rows) is a full grid over lever
position (9 levels), compressor decay kMc (51 levels in [0.95, 1]) and turbine decay kMt (26 levels in [0.975, 1]);
its 16 sensor columns are smooth deterministic functions of those three, the target kMc is recovered from small
relative changes of the sensors, and the lever position moves every sensor. We have no copy of it; this module
builds a set with the same structure (same grid, 16 columns, smooth nonlinear sensors whose level is set by the
lever position and modulated by 0.3–4 % by the two decays, relative sensor noise 1e-5) so that the failure the
issue reports on a held-out near noise-free set can be looked at. The sensor formulas are ours, not the plant's.

Protocols: ``random`` (a random third of the rows is the test set) and ``extrapolation`` (the test rows are the top
third of the lever position, as ``uci.shift_indices``); the rest split 90/10 into fitting/calibration rows. Methods
(90 %): ``default`` (homoscedastic Gaussian), ``het`` (``likelihood="heteroscedastic"``), ``auto``
(``likelihood="auto"``, the support test of :mod:`glas_sklearn.likelihoods.support`) when the installed regressor
has it, ``split_hgb`` and ``cqr_hgb`` (MAPIE around HistGradientBoosting). Diagnostics of the two networks: RMSE,
the held-out mean squared residual / mean σ²(x) (σ(x) the network's aleatoric part, or the constant noise),
Spearman correlation of σ̂(x) with |residual| on the test rows, the share of the epistemic variance in σ̂².

Usage::

    python benchmarks/naval_like.py --protocols random extrapolation --seeds 1 --tag a
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import _common
import numpy as np
import regional_coverage as rc
import torch
from scipy.stats import spearmanr

LEVER = np.array([1.138, 2.088, 3.144, 4.161, 5.14, 6.175, 7.148, 8.206, 9.3])


def naval_like(noise: float = 1e-5, seed: int = 0):
    """The naval-like grid: X (11,934 × 16), y = kMc, and the driving feature's column (0, the lever position)."""
    rng = np.random.default_rng(seed)
    lp, kmc, kmt = (a.ravel() for a in np.meshgrid(LEVER, np.round(np.linspace(0.95, 1.0, 51), 3),
                                                   np.round(np.linspace(0.975, 1.0, 26), 3), indexing="ij"))
    u = (lp - LEVER[0]) / (LEVER[-1] - LEVER[0])      # load in [0, 1]
    dc = (1.0 - kmc) / 0.05                              # compressor decay in [0, 1]
    dt = (1.0 - kmt) / 0.025                             # turbine decay in [0, 1]
    speed = 3.0 * (1 + np.searchsorted(LEVER, lp))
    cols = [lp, speed]
    # (base level as a function of load, relative effect of compressor decay, of turbine decay, load interaction)
    specs = [(lambda u: 250 + 72000 * u ** 1.8, 0.010, 0.020, 0.5),     # GT shaft torque
             (lambda u: 1300 + 2400 * u ** 0.9, 0.004, 0.012, 0.3),     # GT rate of revolutions
             (lambda u: 6600 + 3000 * u ** 0.7, 0.006, 0.003, -0.4),    # gas generator rate
             (lambda u: 5 + 640 * u ** 1.9, 0.012, 0.020, 0.6),         # starboard propeller torque
             (lambda u: 5 + 640 * u ** 1.9, 0.012, 0.020, 0.6),         # port propeller torque
             (lambda u: 440 + 750 * u ** 1.1, 0.030, 0.015, -0.5),      # HP turbine exit temperature
             (lambda u: 570 + 220 * u ** 1.2, 0.040, 0.004, -0.6),      # compressor outlet temperature
             (lambda u: 1.1 + 3.4 * u ** 1.4, 0.020, 0.030, 0.4),       # HP turbine exit pressure
             (lambda u: 1.0 + 1.7 * u ** 1.3, 0.003, 0.025, 0.2),       # GT exhaust pressure
             (lambda u: 5.8 + 17 * u ** 1.5, 0.035, 0.010, -0.3),       # compressor outlet pressure
             (lambda u: 0.07 + 1.75 * u ** 1.7, 0.045, 0.030, -0.5),    # fuel flow
             (lambda u: 1.0 + 0 * u, 0.0, 0.0, 0.0),                     # turbine injection control (near constant)
             (lambda u: 1.02 + 0.03 * u, 0.002, 0.001, 0.0),            # GT exhaust gas pressure
             (lambda u: 288 + 0 * u, 0.0, 0.0, 0.0)]                     # compressor inlet temperature (constant)
    for base, a, b, c in specs:
        rel = a * dc * (1 + c * u) + b * dt * (1 - 0.5 * c * u) + 0.3 * a * dc ** 2 + 0.2 * b * dc * dt
        v = base(u) * (1 + rel)
        moving = a > 0 or b > 0                          # the constant columns stay exactly constant (as in UCI)
        cols.append(v * (1 + noise * rng.standard_normal(len(v))) if moving else v)
    X = np.stack(cols, axis=1)
    return X, kmc.astype(np.float64)


def friedman_near_noise_free(n: int = 6000, seed: int = 0):
    from sklearn.datasets import make_friedman1
    X, y = make_friedman1(n, noise=0.0, random_state=seed)
    return X, y + 1e-3 * np.random.default_rng(seed).standard_normal(n)


DATASETS = {"naval_like": lambda seed: naval_like(seed=seed),
            "friedman_1e-3": lambda seed: friedman_near_noise_free(seed=seed)}


def interval_score(y, pis):
    lo, hi = pis[:, 0], pis[:, 1]
    a = 1 - rc.LEVEL
    return float(np.mean((hi - lo) + 2 / a * (lo - y) * (y < lo) + 2 / a * (y - hi) * (y > hi)))


def partition(n, X, protocol, seed):
    rng = np.random.default_rng(1000 + seed)
    if protocol == "random":
        perm = rng.permutation(n)
        test, train = perm[: n // 3], perm[n // 3:]
    else:
        import uci
        train, test = uci.shift_indices(X, 0, "extrapolation")
    perm = rng.permutation(train)
    n_cal = int(round(0.1 * len(train)))
    return perm[n_cal:], perm[:n_cal], np.sort(test)


def network_diagnostics(est, X_te, y_te):
    mu, sd = est.predict(X_te, return_std=True)
    ale = est.predict_noise_std(X_te)
    res = y_te - mu
    total = (sd / float(np.atleast_1d(est.std_scale_)[0])) ** 2          # σ̂² (uncalibrated)
    return {"rmse": float(np.sqrt(np.mean(res ** 2))),
            "resid2_over_sigma_ale2": float(np.mean(res ** 2) / np.mean(ale ** 2)),
            "spearman_sigma_absres": float(spearmanr(sd, np.abs(res)).statistic),
            "epistemic_share": float(np.mean(np.clip(1 - ale ** 2 / np.maximum(total, 1e-300), 0, 1))),
            "std_scale": float(np.atleast_1d(est.std_scale_)[0]), "epochs": int(est.n_iter_)}


def run(name, protocol, seed, methods):
    X, y = DATASETS[name](seed)
    fit, cal, test = partition(len(y), X, protocol, seed)
    Xf, yf, Xc, yc, Xt, yt = X[fit], y[fit], X[cal], y[cal], X[test], y[test]
    r = {"dataset": name, "protocol": protocol, "seed": seed, "n_fit": len(fit), "n_cal": len(cal),
         "n_test": len(test), "methods": {}}
    for tag, lik in (("default", "gaussian"), ("het", "heteroscedastic"), ("auto", "auto")):
        if tag not in methods:
            continue
        t0 = time.perf_counter()
        est = rc.fit_glas(lik, Xf, yf, Xc, yc, seed)
        secs = time.perf_counter() - t0
        pis = est.predict_interval(Xt)[1][:, :, 0]
        r["methods"][tag] = {"is": interval_score(yt, pis), "cov": float(np.mean((yt >= pis[:, 0]) &
                                                                                   (yt <= pis[:, 1]))),
                             "fit_seconds": secs, **network_diagnostics(est, Xt, yt)}
        support = getattr(est, "likelihood_support_", None)
        if support is not None:
            r["methods"][tag]["support"] = {k: v for k, v in support.items() if not isinstance(v, np.ndarray)}
    for k, pis in rc.hgb_methods(Xf, yf, Xc, yc, Xt, seed).items():
        r["methods"][k] = {"is": interval_score(yt, pis), "cov": float(np.mean((yt >= pis[:, 0]) &
                                                                               (yt <= pis[:, 1])))}
    return r


def render(results) -> str:
    runs = results["runs"]
    lines = ["# Near noise-free sets: a naval-like simulator and Friedman #1 (σ = 1e-3)", "",
             f"`{results['command']}`", "",
             "1 torch thread, 2 shared CPU cores. The naval-like set is OUR simulator with the structure of UCI "
             "naval propulsion (9 × 51 × 26 grid, 16 smooth sensors of lever position and two decays, relative "
             "noise 1e-5, target kMc), not the UCI data. `random`: a random third of the rows is the test set; "
             "`extrapolation`: the top third of the driving feature (column 0). IS relative to split conformal "
             "around HistGradientBoosting (`split_hgb`); cov = coverage of 90 % intervals. Network diagnostics on "
             "the test rows: RMSE, mean squared residual / mean σ_ale²(x) (σ_ale the network's noise), Spearman "
             "ρ(σ̂, |residual|), the mean share of the epistemic part in σ̂², the conformal std_scale_.", ""]
    for r in runs:
        m = r["methods"]
        ref = m["split_hgb"]["is"]
        lines += [f"## {r['dataset']}, {r['protocol']}, seed {r['seed']} ({r['n_fit']} fitting, {r['n_cal']} "
                  f"calibration, {r['n_test']} test rows)", "",
                  "| method | IS / split_hgb | cov % | RMSE | resid²/σ_ale² | ρ(σ̂,|res|) | epistemic share | "
                  "std_scale_ | epochs | fit s | support |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for k, v in m.items():
            def g(key, fmt, v=v):
                return format(v[key], fmt) if key in v else ""
            sup = v.get("support", {})
            stext = f"{sup.get('chosen', '')} (ΔNLL/row {sup.get('nll_gain', float('nan')):.3g})" if sup else ""
            lines.append(f"| `{k}` | {v['is'] / ref:.3f} | {100 * v['cov']:.1f} | {g('rmse', '.3g')} | "
                         f"{g('resid2_over_sigma_ale2', '.3g')} | {g('spearman_sigma_absres', '.2f')} | "
                         f"{g('epistemic_share', '.2f')} | {g('std_scale', '.3g')} | {g('epochs', 'd')} | "
                         f"{g('fit_seconds', '.0f')} | {stext} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--datasets", nargs="+", default=list(DATASETS))
    p.add_argument("--protocols", nargs="+", default=["random", "extrapolation"])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--methods", nargs="+", default=["default", "het", "auto"])
    p.add_argument("--tag", default="run")
    p.add_argument("--report", help="render results/naval_like_TAG.json to results/naval_like.md")
    a = p.parse_args()
    if a.report:
        res = json.loads((_common.RESULTS / f"naval_like_{a.report}.json").read_text())
        _common.write_report(_common.RESULTS / "naval_like.md", render(res))
        return
    torch.set_num_threads(1)
    runs = []
    for name in a.datasets:
        for protocol in a.protocols:
            for seed in range(a.seeds):
                r = run(name, protocol, seed, a.methods)
                print(json.dumps({k: v for k, v in r.items() if k != "methods"}),
                      {k: (round(v["is"] / r["methods"]["split_hgb"]["is"], 3), round(v["cov"], 3),
                           round(v.get("rmse", float("nan")), 5)) for k, v in r["methods"].items()}, flush=True)
                runs.append(r)
                res = {"command": "python " + " ".join(sys.argv), "runs": runs, "machine": _common.machine_info("cpu")}
                (_common.RESULTS / f"naval_like_{a.tag}.json").write_text(json.dumps(res, indent=1))
    _common.write_report(_common.RESULTS / "naval_like.md", render(res))


if __name__ == "__main__":
    main()
