"""Top-third extrapolation (``uci.shift_indices``, the protocol of ``uci_heteroscedastic.py --protocol shift``) with
the rows of ``regional_coverage.py``: the default as it is when run and the default of 03f817a pinned
(``default_before``), the heteroscedastic option, Mondrian conformal over σ̂ bins, split conformal, MAPIE's normalised
score, CQR (quantile network of the same size; HistGradientBoosting), a deep ensemble and laplace-torch Kron, per
feature 0..3 (the test rows are the top third of that feature; the other rows split 90/10 into fitting and
calibration rows, seeded by the feature), each scored overall and per region (coverage per quintile of the own σ̂
and of ``default_before``'s σ̂, worst slab) by ``regional_coverage.score``.

Usage::

    python benchmarks/mondrian_shift.py --tag anchors                  # all rows, the four dev sets, features 0..3
    python benchmarks/mondrian_shift.py --sets yacht energy --features 2 --methods default default_before split_nn
    python benchmarks/mondrian_shift.py --report anchors               # the report again from its JSON

Writes ``results/mondrian_shift_TAG.json`` and ``.md`` after every run. (``mondrian_shift_a.json`` /
``mondrian_shift.md`` hold the earlier run with the short method set; ``--report a`` renders it in the new layout
to ``mondrian_shift_a.md``.)
"""

from __future__ import annotations

import argparse
import time

import _common
import numpy as np
import regional_coverage as rc
import torch
import uci

STEM = "mondrian_shift"


def _is(m):
    return m["interval_score"] if "interval_score" in m else m["is"]  # the earlier runs stored "is" / "cov"


def _cov(m):
    return m["coverage"] if "coverage" in m else m["cov"]


def _pooled(rs, method, key):
    """Coverage per quintile of ``key`` ("own", "ref"), pooled over the runs; [] when the runs lack it."""
    if not all("bins" in r["methods"][method] and key in r["methods"][method]["bins"] for r in rs):
        return []
    return rc.pooled_bins(rs, method, key)[0]


def _range(values):
    return f"{100 * min(values):.0f}–{100 * max(values):.0f}" if len(values) > 1 else "one width"


def render(results) -> str:
    """Per set and method: IS / split_nn (geometric mean over the features), coverage, per-region columns; then the
    geometric mean over the sets and the issue's extrapolation targets."""
    runs = results["runs"]
    sets = list(dict.fromkeys(r["dataset"] for r in runs))
    order = [m for m, _ in rc.METHODS]
    present = [m for m in order if all(m in r["methods"] for r in runs)]
    present += [m for m in runs[0]["methods"] if m not in present and all(m in r["methods"] for r in runs)]
    ref = rc.REFERENCE
    homo = "default_before" if "default_before" in present else "default"
    title = "# Top-third extrapolation, every row of regional_coverage, per region"
    lines = [title + _common.title_tag(results["command"]), "",
             f"`{results['command']}`", "", _common.machine_line(results.get("machine", {})) or "1 torch thread", "",
             "Per set, the test rows are the top third of feature f (one run per f, features 0.."
             f"{max(r['feature'] for r in runs)}); the other rows split 90/10 into fitting and calibration rows. "
             f"IS / `{ref}` (split conformal around `default_before`'s network): geometric mean over the runs; "
             "coverage: mean over the runs; per σ̂ quintile: coverage (%) per quintile of the method's own σ̂ (the "
             "half-width for rows without one), pooled over the runs, lowest–highest; per `ref` quintile: the same "
             "over the quintiles of `default_before`'s σ̂ (the same regions for every method); worst slab: mean "
             "over the runs (standardised test inputs, δ = 0.1, 100 directions). Rows: see regional_coverage.md.", ""]
    gm = {}
    for s in sets:
        rs = [r for r in runs if r["dataset"] == s]
        rows = []
        for m in present:
            ratio = float(np.exp(np.mean([np.log(_is(r["methods"][m]) / _is(r["methods"][ref])) for r in rs])))
            cov = float(np.mean([_cov(r["methods"][m]) for r in rs]))
            gm.setdefault(m, {})[s] = (ratio, cov)
            own, refq = _pooled(rs, m, "own"), _pooled(rs, m, "ref")
            slab = [r["methods"][m]["worst_slab"] for r in rs if "worst_slab" in r["methods"][m]]
            rows.append([f"`{m}`", f"{100 * cov:.0f}", f"{ratio:.3f}", _range(own) if own else "–",
                         rc._q(refq) if refq else "–", f"{100 * np.mean(slab):.0f}" if slab else "–"])
        lines += [f"## {s} ({len(rs)} runs)", ""]
        lines += _common.markdown_table(["method", "coverage %", f"IS / {ref}", "per own-σ̂ quintile, min–max %",
                                         "per `ref` σ̂ quintile %", "worst slab %"], rows, "lrrllr")
        lines += [""]
    rows = []
    for m in present:
        g = float(np.exp(np.mean([np.log(gm[m][s][0]) for s in sets])))
        vs = [gm[m][s][0] / gm[homo][s][0] for s in sets]
        ok = g <= 0.60 and max(vs) <= 1.03
        rows.append([f"`{m}`", " / ".join(f"{gm[m][s][0]:.3f} ({100 * gm[m][s][1]:.0f} %)" for s in sets),
                     f"{g:.3f}", " / ".join(f"{v:.2f}" for v in vs), "**pass**" if ok else "fail"])
    lines += ["## Summary over the sets", "",
              f"Targets (the issue's, extrapolation): ≤ 0.60× split conformal (geometric mean over the sets), no set "
              f"worse than the homoscedastic default (`{homo}`) by more than 3 %.", ""]
    lines += _common.markdown_table(["method", f"IS / {ref} (coverage) per set: " + ", ".join(sets), "geo. mean",
                                     f"vs `{homo}` per set", "targets"], rows, "llrll")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", nargs="+", default=rc.UCI_SETS)
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--methods", nargs="+", default=None, choices=[m for m, _ in rc.METHODS], metavar="METHOD",
                   help="the rows to compute (default: all of regional_coverage's)")
    p.add_argument("--tag", default="run")
    p.add_argument("--out-dir", type=_common.Path, default=_common.RESULTS)
    p.add_argument("--report", help="no computation: render results/mondrian_shift_TAG.json to mondrian_shift_TAG.md")
    a = p.parse_args(argv)
    if a.report:
        path = a.out_dir / f"{STEM}_{a.report}.json"
        print(_common.report_from_results(path, path.with_suffix(".md"), render)[1])
        return
    torch.set_num_threads(1)
    json_path = a.out_dir / f"{STEM}_{a.tag}.json"
    command = _common.command_line(__file__, argv)
    results = {**_common.new_results(a), "runs": []}
    for f in range(a.features):  # feature-major: an interrupted run has the same features of every set
        for name in a.sets:
            X, y = _common.load_uci(_common.data_dir("uci") / name)
            if f >= X.shape[1]:
                continue
            train, test = uci.shift_indices(X, f, "extrapolation")
            perm = np.random.default_rng(1000 + f).permutation(train)
            n_cal = int(round(0.1 * len(train)))
            cal, fit = perm[:n_cal], perm[n_cal:]
            t0, c0 = time.perf_counter(), time.process_time()
            res, diag = rc.run_methods(X[fit], y[fit], X[cal], y[cal], X[test], y[test], f, {}, methods=a.methods)
            r = {"dataset": name, "feature": f, "n_cal": int(n_cal), "methods": res, "diagnostics": diag,
                 "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}
            results["runs"].append(r)
            print(f"[shift] {name} f{f}: {r['seconds']:.0f}s (CPU {r['cpu_seconds']:.0f}s) ",
                  {k: round(_is(v) / _is(res[rc.REFERENCE]), 3) for k, v in res.items()}, flush=True)
            _common.write_results_and_report(json_path, json_path.with_suffix(".md"), results, render,
                                             command=command)


if __name__ == "__main__":
    main()
