"""Robust training of the heteroscedastic variance head: which option keeps σ(x) honest on unseen rows?

For each option the heteroscedastic regressor is fitted on the same fitting rows (the ``regional_coverage.py``
partitions: synthetic shapes, or the UCI standard splits with a seeded 90/10 fitting/calibration split) and scored:

- ``ratio_test`` / ``ratio_fit``: mean squared residual / mean σ²(x) on test / fitting rows (1: σ(x) matches the
  residuals; above 1: σ(x) too small, the head collapsed onto rows the mean interpolates);
- the conformal (normalised) 90 % intervals: coverage, interval score (IS), coverage per quintile of the own σ̂ and,
  synthetic, of the true σ(x); for the UCI splits IS / split conformal around the default's network, taken from the
  committed ``results/regional_coverage.json`` (same partitions, same seeds);
- ``+floor``: the same fit with σ̂² + c, c ≥ 0 one constant chosen by the Gaussian NLL of the calibration rows,
  then normalised conformal on those rows (a one-parameter post-hoc floor, computed from the fitted moments).

Options: ``het`` (the shipped heteroscedastic fit: β-NLL 0.5, early_stopping "auto"), ``es`` (early_stopping=True
at every size), ``natural`` (output="natural"), ``beta0`` / ``beta1`` (β-NLL exponent), ``wd`` (AdamW weight
decay 1e-2), ``es_wd`` (both), ``patience30``
(early stopping's patience 30 epochs instead of 10: does the variance head need longer than the mean?).

Usage::

    python benchmarks/variance_head.py --study uci --sets yacht energy --splits 3 --tag a
    python benchmarks/variance_head.py --study synthetic --shapes silent --seeds 1 --tag b
    python benchmarks/variance_head.py --merge a b
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
import warnings

import _common
import numpy as np
import regional_coverage as rc
import torch

from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.likelihoods import HeteroscedasticGaussian

LEVEL = 0.9
STEM = "variance_head"
OPTIONS = {
    "het": {"likelihood": "heteroscedastic"},
    "es": {"likelihood": "heteroscedastic", "early_stopping": True},
    "natural": {"likelihood": HeteroscedasticGaussian(output="natural")},
    "beta0": {"likelihood": HeteroscedasticGaussian(beta_nll=0.0)},
    "beta1": {"likelihood": HeteroscedasticGaussian(beta_nll=1.0)},
    "wd": {"likelihood": "heteroscedastic", "optimizer": "adamw", "weight_decay": 1e-2},
    "patience30": {"likelihood": "heteroscedastic", "n_iter_no_change": 30},
    "es_wd": {"likelihood": "heteroscedastic", "early_stopping": True, "optimizer": "adamw", "weight_decay": 1e-2},
}


def conformal(mu_c, sd_c, y_c, mu_t, sd_t):
    s = np.abs(y_c - mu_c) / sd_c
    n = len(s)
    q = np.quantile(s, min(1.0, np.ceil((n + 1) * LEVEL) / n), method="higher")
    return np.stack([mu_t - q * sd_t, mu_t + q * sd_t], axis=1)


def fit_floor(mu, sd, y):
    """c ≥ 0 minimising the Gaussian NLL of the rows under N(μ, a(σ̂² + c)) with a profiled out (a grid over c)."""
    r2, v = (y - mu) ** 2, sd**2
    best, best_c = np.inf, 0.0
    for c in np.concatenate([[0.0], np.quantile(v, [0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0]) * np.array(
            [1.0]) , np.mean(v) * np.array([2.0, 4.0, 8.0])]):
        w = v + c
        a = np.mean(r2 / w)
        nll = np.mean(np.log(a * w))  # + 1 constant
        if nll < best:
            best, best_c = nll, float(c)
    return best_c


def score(y, pis, sd, noise=None):
    lo, hi = pis[:, 0], pis[:, 1]
    cov = (y >= lo) & (y <= hi)
    a = 1 - LEVEL
    isc = (hi - lo) + 2 / a * (lo - y) * (y < lo) + 2 / a * (y - hi) * (y > hi)
    out = {"coverage": float(cov.mean()), "interval_score": float(isc.mean())}
    for key, v in (("own", sd), ("noise", noise)):
        if v is None:
            continue
        edges = np.quantile(v, np.linspace(0, 1, 6)[1:-1])
        b = np.searchsorted(edges, v, side="right")
        out[f"n_{key}"] = [int((b == i).sum()) for i in range(5)]
        out[f"cov_{key}"] = [int(cov[b == i].sum()) for i in range(5)]
    return out


def run_one(X_fit, y_fit, X_cal, y_cal, X_te, y_te, seed, noise=None, options=OPTIONS):
    res = {}
    for name in options:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = LaplaceActiveSubspaceRegressor(**_common.grouped(**OPTIONS[name], confidence_level=LEVEL,
                                                                   random_state=seed, device="cpu", n_threads=1))
            est.fit(X_fit, y_fit, X_cal=X_cal, y_cal=y_cal)
        e = {"fit_seconds": time.perf_counter() - t0, "n_iter": int(est.n_iter_)}
        for rows, Xr, yr in (("fit", X_fit, y_fit), ("test", X_te, y_te)):
            mu = est.predict(Xr)
            e[f"ratio_{rows}"] = float(np.mean((yr - mu) ** 2) / np.mean(est.predict_noise_std(Xr) ** 2))
        mu_c, sd_c = est.predict(X_cal, return_std=True)
        mu_t, sd_t = est.predict(X_te, return_std=True)
        e["conf"] = score(y_te, conformal(mu_c, sd_c, y_cal, mu_t, sd_t), sd_t, noise)
        c = fit_floor(mu_c, sd_c, y_cal)
        sdc, sdt = np.sqrt(sd_c**2 + c), np.sqrt(sd_t**2 + c)
        e["floor"] = score(y_te, conformal(mu_c, sdc, y_cal, mu_t, sdt), sdt, noise)
        e["floor_c_over_mean_var"] = float(c / np.mean(sd_c**2))
        e["ratio_test_floor"] = float(np.mean((y_te - mu_t) ** 2) / np.mean(
            est.predict_noise_std(X_te) ** 2 + c * (est.predict_noise_std(X_te) ** 2).mean() / np.mean(sd_t**2)))
        res[name] = e
        print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in e.items()
                     if k.startswith("ratio") or k in ("fit_seconds", "n_iter")},
              round(e["conf"]["interval_score"], 4), round(e["floor"]["interval_score"], 4), flush=True)
    return res


def render(results) -> str:
    """The markdown report from the merged JSON alone."""
    import json as _json
    ref = _json.loads((_common.RESULTS / "regional_coverage.json").read_text())
    snn = {(r["dataset"], r["split"]): r["methods"]["split_nn"]["interval_score"] for r in ref["uci"]}
    lines = ["# Training the variance head: options measured", "", *(f"`{c}`" for c in results["commands"]), "",
             "1 torch thread, 2 shared CPU cores. ratio = mean squared residual / mean σ²(x) (σ(x): the network's "
             "own noise, ``predict_noise_std``); conformal = normalised split conformal on the calibration rows "
             "with the fit's σ̂; IS relative to split conformal around the default's network from the committed "
             "``regional_coverage.json`` (same partitions) for the UCI sets, the absolute mean IS for the synthetic "
             "shapes; +floor: σ̂² + c with c ≥ 0 fitted by NLL on the calibration rows. Coverage per quintile "
             "pooled over runs.", ""]
    groups = {}
    for r in results["runs"]:
        groups.setdefault(r.get("dataset", r.get("shape")), []).append(r)
    for g, runs in groups.items():
        uci = "dataset" in runs[0]
        lines += [f"## {g} ({len(runs)} {'splits' if uci else 'seeds'}, "
                  f"{'IS / split_nn' if uci else 'IS'})", "",
                  "| option | ratio fit | ratio test | coverage % | IS (conformal) | IS +floor | per own-σ̂ quintile |"
                  " per true-σ quintile | epochs |", "|---|---:|---:|---:|---:|---:|---|---|---:|"]
        for m in dict.fromkeys(k for r in runs for k in r["methods"]):
            rs = [r for r in runs if m in r["methods"]]
            e = [r["methods"][m] for r in rs]

            def rel(k, e=e, rs=rs, uci=uci):
                if uci:
                    return float(np.exp(np.mean([np.log(x[k]["interval_score"] / snn[(r["dataset"], r["split"])])
                                                 for x, r in zip(e, rs, strict=True)])))
                return float(np.mean([x[k]["interval_score"] for x in e]))

            def q(key, e=e):
                n = np.sum([x["conf"].get("n_" + key, [0] * 5) for x in e], 0)
                c = np.sum([x["conf"].get("cov_" + key, [0] * 5) for x in e], 0)
                return " / ".join(f"{100 * a / b:.0f}" for a, b in zip(c, n, strict=True)) if n.sum() else ""

            lines.append(f"| `{m}` | {np.mean([x['ratio_fit'] for x in e]):.2f} | "
                         f"{np.mean([x['ratio_test'] for x in e]):.2f} | "
                         f"{100 * np.mean([x['conf']['coverage'] for x in e]):.1f} | {rel('conf'):.3f} | "
                         f"{rel('floor'):.3f} | {q('own')} | {q('noise')} | "
                         f"{np.mean([x['n_iter'] for x in e]):.0f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def merge(tags):
    runs, commands = [], []
    for t in tags:
        d = json.loads((_common.RESULTS / f"{STEM}_{t}.json").read_text())
        commands.append(d["command"])
        for r in d["runs"]:  # a later tag's options on the same partition join that partition's run
            same = [q for q in runs if (q.get("dataset"), q.get("shape"), q.get("split"), q.get("seed"))
                    == (r.get("dataset"), r.get("shape"), r.get("split"), r.get("seed"))]
            if same:
                same[0]["methods"].update({k: v for k, v in r["methods"].items() if k not in same[0]["methods"]})
            else:
                runs.append(r)
    results = {"command": " ; ".join(commands), "commands": commands, "runs": runs,
               "machine": _common.machine_info("cpu")}
    (_common.RESULTS / f"{STEM}.json").write_text(json.dumps(results, indent=1))
    text = render(results)
    md = _common.RESULTS / f"{STEM}.md"
    old = md.read_text() if md.exists() else ""
    mark = _common.DISCUSSION_MARK
    keep = old[old.index(mark):] if mark in old else mark + "\n"
    md.write_text(text + "\n" + keep)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--study", choices=["uci", "synthetic"])
    p.add_argument("--sets", nargs="+", default=rc.UCI_SETS)
    p.add_argument("--shapes", nargs="+", default=list(rc.SHAPES))
    p.add_argument("--splits", type=int, default=3)
    p.add_argument("--first-split", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--n-train", type=int, default=2500)
    p.add_argument("--options", nargs="+", default=list(OPTIONS))
    p.add_argument("--tag", default="run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--merge", nargs="+")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.merge:
        return merge(a.merge)
    opts = {k: OPTIONS[k] for k in a.options}
    runs = []
    out = _common.RESULTS / f"{STEM}_{a.tag}.json"
    if a.study == "uci":
        for name in a.sets:
            for split in range(a.first_split, a.splits):
                X, y, train, test = _common.load_uci(_common.data_dir("uci") / name, split)
                perm = np.random.default_rng(1000 + split).permutation(train)
                n_cal = int(round(0.1 * len(train)))
                cal, fit = perm[:n_cal], perm[n_cal:]
                print(name, split, flush=True)
                runs.append({"dataset": name, "split": split,
                             "methods": run_one(X[fit], y[fit], X[cal], y[cal], X[test], y[test], split,
                                                options=opts)})
                out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "runs": runs,
                                           "machine": _common.machine_info("cpu")}))
    else:
        for shape in a.shapes:
            for seed in range(a.seeds):
                rng = np.random.default_rng(7919 * seed + len(shape))
                X, y, _ = rc.draw(shape, a.n_train, rng)
                X_te, y_te, s_te = rc.draw(shape, 5000, rng)
                n_cal = int(round(0.2 * a.n_train))
                print(shape, seed, flush=True)
                runs.append({"shape": shape, "seed": seed,
                             "methods": run_one(X[n_cal:], y[n_cal:], X[:n_cal], y[:n_cal], X_te, y_te, seed,
                                                noise=s_te, options=opts)})
                out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "runs": runs,
                                           "machine": _common.machine_info("cpu"),
                                           "date": _dt.datetime.now().isoformat()}))


if __name__ == "__main__":
    main()
