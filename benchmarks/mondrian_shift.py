"""Top-third extrapolation (``uci.shift_indices``, the protocol of ``uci_heteroscedastic.py --protocol shift``) for
the candidate default: the estimator's own training, heteroscedastic likelihood, conformal and Mondrian conformal
over σ̂ bins (``min_bin_size`` 100 and 30), against the homoscedastic default and MAPIE split conformal around the
default's network, per feature 0..3 (the test rows are the top third of that feature).

Usage::

    python benchmarks/mondrian_shift.py --sets yacht energy --features 4 --tag a
"""

from __future__ import annotations

import argparse
import json
import sys

import _common
import numpy as np
import regional_coverage as rc
import torch
import uci


def interval_score(y, pis):
    lo, hi = pis[:, 0], pis[:, 1]
    a = 1 - rc.LEVEL
    return float(np.mean((hi - lo) + 2 / a * (lo - y) * (y < lo) + 2 / a * (y - hi) * (y > hi)))


def render(results) -> str:
    """Per set: geometric mean over features of IS / split_nn per method, coverage; the geometric mean over sets."""
    runs = results["runs"]
    sets = list(dict.fromkeys(r["dataset"] for r in runs))
    methods = list(runs[0]["methods"])
    lines = ["# Top-third extrapolation: heteroscedastic + Mondrian against the homoscedastic default", "",
             f"`{results['command']}`", "", "1 torch thread, 2 shared CPU cores. Per set, the test rows are the top "
             "third of feature f (one run per f); IS / split conformal around the default's network (MAPIE), "
             "geometric mean over the runs; coverage % mean over the runs; the last column the geometric mean over "
             "the sets.", "",
             "| method | " + " | ".join(f"{s} ({sum(r['dataset'] == s for r in runs)} runs)" for s in sets)
             + " | geo. mean | vs `default` per set |", "|---|" + "---:|" * (len(sets) + 1) + "---|"]
    gm = {}
    for m in methods:
        per = {}
        for s in sets:
            rs = [r for r in runs if r["dataset"] == s]
            per[s] = (float(np.exp(np.mean([np.log(r["methods"][m]["is"] / r["methods"]["split_nn"]["is"])
                                            for r in rs]))),
                      100 * float(np.mean([r["methods"][m]["cov"] for r in rs])))
        gm[m] = per
    for m in methods:
        g = float(np.exp(np.mean([np.log(gm[m][s][0]) for s in sets])))
        vs = " / ".join(f"{gm[m][s][0] / gm['default'][s][0]:.2f}" for s in sets)
        lines.append(f"| `{m}` | " + " | ".join(f"{gm[m][s][0]:.3f} ({gm[m][s][1]:.0f} %)" for s in sets)
                     + f" | {g:.3f} | {vs} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sets", nargs="+", default=rc.UCI_SETS)
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--tag", default="run")
    p.add_argument("--report", help="render results/mondrian_shift_TAG.json to results/mondrian_shift.md")
    a = p.parse_args()
    if a.report:
        res = json.loads((_common.RESULTS / f"mondrian_shift_{a.report}.json").read_text())
        (_common.RESULTS / "mondrian_shift.md").write_text(render(res))
        return
    torch.set_num_threads(1)
    runs = []
    for name in a.sets:
        X, y = _common.load_uci(_common.data_dir("uci") / name)
        for f in range(min(a.features, X.shape[1])):
            train, test = uci.shift_indices(X, f, "extrapolation")
            perm = np.random.default_rng(1000 + f).permutation(train)
            n_cal = int(round(0.1 * len(train)))
            cal, fit = perm[:n_cal], perm[n_cal:]
            Xf, yf, Xc, yc, Xt, yt = X[fit], y[fit], X[cal], y[cal], X[test], y[test]
            r = {"dataset": name, "feature": f, "methods": {}}
            default = rc.fit_glas("gaussian", Xf, yf, Xc, yc, f)
            het = rc.fit_glas("heteroscedastic", Xf, yf, Xc, yc, f)
            for tag, est in (("default", default), ("het", het)):
                pis = est.predict_interval(Xt)[1][:, :, 0]
                r["methods"][tag] = {"is": interval_score(yt, pis), "cov": float(np.mean((yt >= pis[:, 0]) &
                                                                                         (yt <= pis[:, 1])))}
                for mt, cal_ in rc.MONDRIAN.items():
                    mp, _, nb = rc.mondrian_intervals(est, cal_, Xc, yc, Xt)
                    r["methods"][f"{tag}_{mt}"] = {"is": interval_score(yt, mp), "n_bins": nb,
                                                   "cov": float(np.mean((yt >= mp[:, 0]) & (yt <= mp[:, 1])))}
            sc = rc.split_conformal(default.predict, Xc, yc, Xt)
            r["methods"]["split_nn"] = {"is": interval_score(yt, sc), "cov": float(np.mean((yt >= sc[:, 0]) &
                                                                                       (yt <= sc[:, 1])))}
            print(name, f, {k: round(v["is"] / r["methods"]["split_nn"]["is"], 3) for k, v in r["methods"].items()},
                  flush=True)
            runs.append(r)
            (_common.RESULTS / f"mondrian_shift_{a.tag}.json").write_text(
                json.dumps({"command": "python " + " ".join(sys.argv), "runs": runs,
                            "machine": _common.machine_info("cpu")}, indent=1))


if __name__ == "__main__":
    main()
