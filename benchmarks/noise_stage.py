"""The default regressor (``likelihood="auto"``) against the Gaussian network alone: fit time, RMSE, interval score,
coverage per fifth of σ̂ and of the true noise. Run it once against each checkout (``PYTHONPATH``) for a
before / after table: whatever ``likelihood="auto"`` is in the imported package is what is measured.

Tables (90 % intervals, a fifth of the training rows calibration rows where the estimator's ``calibration_size``
does not apply):

- ``silent_peak`` (the table of issue 42): x ~ U(−1, 1)^6, mean sin 2x0 + ½ x1 − ½ x2 + 0.3 x3 x4, noise
  0.05 + 0.75 exp(−(x5/0.3)²) (peaked mid-range of a feature that does not move the mean), 2,500 rows (500 of
  them calibration rows), 3,000 test rows; ``--seeds`` seeds;
- ``peaked`` and ``silent`` of ``regional_coverage.py`` and ``radial`` / ``heavy`` of ``heldout_shapes.py``: the
  same protocol;
- ``concrete_shipped``: ``load_concrete()``, 772 training rows (a quarter for testing, the README's split);
- ``friedman8_8k``: ``make_friedman1(n_samples=10_192, n_features=8, noise=0.5)``, 8,192 training rows (kin8nm's
  size and width), with MAPIE ``SplitConformalRegressor(HistGradientBoostingRegressor())`` on the same rows (90 / 10)
  timed in the same process;
- ``naval_like`` (``naval_like.py``: near noise-free, 11,934 rows, a random 10 % test rows).

Times: wall seconds of ``fit``, and CPU seconds of the process (``time.process_time``) beside it, since the machine
is shared; one torch thread and HistGradientBoosting's OpenMP limited to one (threadpoolctl).

Usage::

    PYTHONPATH=$PWD python benchmarks/noise_stage.py --seeds 3 --tag after
    PYTHONPATH=/path/to/main python benchmarks/noise_stage.py --seeds 3 --tag before
    python benchmarks/noise_stage.py --report before after          # → results/noise_stage.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import heldout_shapes as hs  # noqa: E402
import naval_like as nl  # noqa: E402
import regional_coverage as rc  # noqa: E402

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, load_concrete  # noqa: E402

LEVEL = 0.9
RESULTS = Path(__file__).resolve().parent / "results"


def silent_peak(x):
    m = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] - 0.5 * x[:, 2] + 0.3 * x[:, 3] * x[:, 4]
    return m, 0.05 + 0.75 * np.exp(-((x[:, 5] / 0.3) ** 2))


SHAPES = {"silent_peak": (6, silent_peak, "normal"), "peaked": (5, rc.SHAPES["peaked"][1], "normal"),
          "silent": (10, rc.SHAPES["silent"][1], "normal"), "radial": hs.SHAPES["radial"],
          "heavy": hs.SHAPES["heavy"]}


def draw(shape, n, rng):
    p, f, law = SHAPES[shape]
    x = rng.uniform(-1, 1, size=(n, p))
    m, s = f(x)
    e = rng.standard_normal(n) if law == "normal" else rng.standard_t(3, n) / np.sqrt(3)
    return x, m + s * e, s


def interval_score(y, lo, hi):
    a = 1 - LEVEL
    return float(np.mean((hi - lo) + 2 / a * (lo - y) * (y < lo) + 2 / a * (y - hi) * (y > hi)))


def fifths(inside, key):
    order = np.argsort(key, kind="stable")
    return [float(inside[b].mean()) for b in np.array_split(order, 5)]


def fit_ours(likelihood, X, y, X_cal, y_cal, seed):
    est = LaplaceActiveSubspaceRegressor(likelihood=likelihood, random_state=seed,
                                         compute=Compute(device="cpu", n_threads=1))
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if X_cal is None:
            est.fit(X, y)
        else:
            est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    return est, time.perf_counter() - t0, time.process_time() - c0


def score(est, secs, cpu, X_te, y_te, noise=None):
    y_pred, pis = est.predict_interval(X_te)
    _, std = est.predict(X_te, return_std=True)
    lo, hi = pis[:, 0, 0], pis[:, 1, 0]
    inside = (y_te >= lo) & (y_te <= hi)
    support = getattr(est, "likelihood_support_", None) or {}
    out = {"seconds": secs, "cpu": cpu, "rmse": float(np.sqrt(np.mean((y_pred - y_te) ** 2))),
           "interval_score": interval_score(y_te, lo, hi), "coverage": float(inside.mean()),
           "width": float(np.mean(hi - lo)), "cov_std_fifths": fifths(inside, std), "chosen": est.likelihood_.name,
           "nll_gain": support.get("nll_gain"), "epochs": int(est.n_iter_)}
    if noise is not None:
        out.update(corr_std_noise=float(np.corrcoef(std, noise)[0, 1]), cov_noise_fifths=fifths(inside, noise))
    return out


def run_pair(X, y, X_cal, y_cal, X_te, y_te, seed, noise=None):
    res = {}
    for lik in ("gaussian", "auto"):
        est, secs, cpu = fit_ours(lik, X, y, X_cal, y_cal, seed)
        res[lik] = score(est, secs, cpu, X_te, y_te, noise)
    return res


def mapie_split_hgb(X, y, X_te, y_te, seed):
    from mapie.regression import SplitConformalRegressor
    from sklearn.ensemble import HistGradientBoostingRegressor
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    n_cal = int(round(0.1 * len(y)))
    cal, fit = perm[:n_cal], perm[n_cal:]
    t0, c0 = time.perf_counter(), time.process_time()
    m = SplitConformalRegressor(HistGradientBoostingRegressor(random_state=seed), confidence_level=LEVEL,
                                prefit=False)
    m.fit(X[fit], y[fit]).conformalize(X[cal], y[cal])
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    y_pred, pis = m.predict_interval(X_te)
    lo, hi = pis[:, 0, 0], pis[:, 1, 0]
    return {"seconds": secs, "cpu": cpu, "rmse": float(np.sqrt(np.mean((y_pred - y_te) ** 2))),
            "interval_score": interval_score(y_te, lo, hi), "coverage": float(np.mean((y_te >= lo) & (y_te <= hi)))}


def run(args):
    runs = []
    for shape in args.shapes:
        for seed in range(args.seeds):
            rng = np.random.default_rng(100 + seed)
            X, y, _ = draw(shape, args.n_train, rng)
            X_te, y_te, s_te = draw(shape, 3000, rng)
            n_cal = args.n_train // 5
            res = run_pair(X[n_cal:], y[n_cal:], X[:n_cal], y[:n_cal], X_te, y_te, seed, s_te)
            runs.append({"table": shape, "seed": seed, "methods": res})
            print(shape, seed, {k: (round(v["interval_score"], 4), round(v["corr_std_noise"], 3), v["chosen"])
                                for k, v in res.items()}, flush=True)
    for table in args.tables:
        for seed in range(args.table_seeds):
            if table == "concrete_shipped":
                from sklearn.model_selection import train_test_split
                Xa, ya = load_concrete(return_X_y=True)
                X, X_te, y, y_te = train_test_split(np.asarray(Xa, float), np.asarray(ya, float), random_state=seed)
            elif table == "friedman8_8k":
                from sklearn.datasets import make_friedman1
                Xa, ya = make_friedman1(n_samples=10_192, n_features=8, noise=0.5, random_state=seed)
                X, y, X_te, y_te = Xa[:8192], ya[:8192], Xa[8192:], ya[8192:]
            else:  # naval_like
                Xa, ya = nl.naval_like(seed=seed)
                perm = np.random.default_rng(seed).permutation(len(ya))
                te, tr = perm[: len(ya) // 10], perm[len(ya) // 10:]
                X, y, X_te, y_te = Xa[tr], ya[tr], Xa[te], ya[te]
            res = run_pair(X, y, None, None, X_te, y_te, seed)
            if table == "friedman8_8k":
                res["mapie_split_hgb"] = mapie_split_hgb(X, y, X_te, y_te, seed)
            runs.append({"table": table, "seed": seed, "n_train": len(y), "methods": res})
            print(table, seed, {k: (round(v["seconds"], 2), round(v["cpu"], 2), round(v["rmse"], 5),
                                    round(v["interval_score"], 5)) for k, v in res.items()}, flush=True)
    return runs


def _agg(runs, table, method, key):
    vals = [r["methods"][method][key] for r in runs if r["table"] == table and method in r["methods"]]
    return vals


def _fifths(vals):
    return " / ".join(f"{100 * v:.0f}" for v in np.mean(vals, axis=0)) if vals else "–"


def render(before: dict, after: dict) -> str:
    """The before / after table (markdown) from two runs' JSON."""
    lines = ["# The noise stage: one mean network, σ(x) fitted after it", "",
             f"`{after['command']}` against the package of this branch (after) and of main before it (before), "
             "one torch thread; CPU seconds of the fit (`time.process_time`: the shared machine's wall times are "
             "not comparable); ratios are the default's (`likelihood=\"auto\"`) over the Gaussian network's "
             "(`likelihood=\"gaussian\"`) of the same run, averaged over seeds (geometric mean for ratios); "
             "coverage per fifth of the test rows by σ̂ (the reported std) and by the true noise, pooled over seeds "
             "(quiet → noisy).", "",
             "| table | run | σ(x) kept | fit CPU ratio | RMSE ratio | IS ratio | width ratio | coverage % "
             "| per σ̂ fifth % | per true-noise fifth % | corr(std, noise) per seed |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    tables = list(dict.fromkeys(r["table"] for r in after["runs"]))
    for table in tables:
        for tag, payload in (("before", before), ("after", after)):
            runs = [r for r in payload["runs"] if r["table"] == table]
            if not runs:
                continue

            def ratio(key, runs=runs):
                v = [r["methods"]["auto"][key] / r["methods"]["gaussian"][key] for r in runs]
                return float(np.exp(np.mean(np.log(v))))
            kept = sum(r["methods"]["auto"]["chosen"] == "heteroscedastic" for r in runs)
            a = [r["methods"]["auto"] for r in runs]
            corr = " / ".join(f"{m['corr_std_noise']:.2f}" for m in a) if "corr_std_noise" in a[0] else "–"
            noise = _fifths([m["cov_noise_fifths"] for m in a]) if "cov_noise_fifths" in a[0] else "–"
            lines.append(f"| {table} | {tag} | {kept}/{len(runs)} | {ratio('cpu'):.2f} | {ratio('rmse'):.3f} | "
                         f"{ratio('interval_score'):.3f} | {ratio('width'):.3f} | "
                         f"{100 * np.mean([m['coverage'] for m in a]):.1f} | "
                         f"{_fifths([m['cov_std_fifths'] for m in a])} | {noise} | {corr} |")
    mapie = [(r, p) for p in (before, after) for r in p["runs"] if "mapie_split_hgb" in r["methods"]]
    if mapie:
        lines += ["", "kin8nm-sized table (`friedman8_8k`, 8,192 training rows), CPU seconds in one process:", ""]
        for r, p in mapie:
            tag = "before" if p is before else "after"
            m = r["methods"]
            lines.append(f"- {tag}: default {m['auto']['cpu']:.2f} s, Gaussian {m['gaussian']['cpu']:.2f} s, "
                         f"MAPIE split conformal + HistGradientBoosting {m['mapie_split_hgb']['cpu']:.2f} s: "
                         f"default / MAPIE {m['auto']['cpu'] / m['mapie_split_hgb']['cpu']:.1f}×; IS default / MAPIE "
                         f"{m['auto']['interval_score'] / m['mapie_split_hgb']['interval_score']:.3f}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--n-train", type=int, default=2500)
    p.add_argument("--tables", nargs="+", default=["concrete_shipped", "friedman8_8k", "naval_like"])
    p.add_argument("--table-seeds", type=int, default=1)
    p.add_argument("--tag", default="run")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="where noise_stage_{TAG}.json is written")
    p.add_argument("--report", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="no computation: render results/noise_stage_{BEFORE,AFTER}.json to results/noise_stage.md")
    args = p.parse_args(argv)
    if args.report:
        before, after = (json.loads((RESULTS / f"noise_stage_{t}.json").read_text()) for t in args.report)
        (RESULTS / "noise_stage.md").write_text(render(before, after))
        return
    torch.set_num_threads(1)
    with threadpool_limits(limits=1, user_api="openmp"):
        runs = run(args)
    import glas_sklearn
    out = {"command": "python benchmarks/noise_stage.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": _common.machine_info(), "package": glas_sklearn.__file__, "threads": 1, "runs": runs}
    path = args.results_dir / f"noise_stage_{args.tag}.json"
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
