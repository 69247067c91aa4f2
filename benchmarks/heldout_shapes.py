"""Noise shapes the defaults were never tuned on: coverage per true-noise fifth of the default regressor.

``regional_coverage.py``'s three synthetic shapes guided the choices of issue 27 (the variance head, the fitted
epistemic weight, the σ̂ bands). This script asks the same questions of three shapes that played no part in them,
with ``regional_coverage.run_methods`` (the same fits, seeds per run, scores and per-region bins):

- ``radial`` (p = 6): mean sin(2‖x‖), noise 0.05 + 0.6 ‖x‖/√6 (noise growing from the centre of the cube);
- ``step`` (p = 4): mean x₁x₂ + cos 2x₃, noise 0.15 for x₀ < 0 and 0.8 above (a jump; two true-noise groups);
- ``heavy`` (p = 8): mean Σ₀³ xⱼ + sin 3x₄, noise (0.1 + 0.6 sigmoid(4x₅)) · t₃/√3 (heavy tails, unit variance
  scale, tied to a feature that does not move the mean).

x uniform on [−1, 1]^p, ``--n-train`` rows (a fifth of them calibration rows, passed as ``X_cal``), 5,000 test rows
per seed. Rows: the default (``LaplaceActiveSubspaceRegressor()``) and split conformal around the homoscedastic
network (the reference of the interval-score ratio). Target (issue 27): every true-noise fifth 85–95 %.
Writes ``results/heldout_shapes[_TAG].{json,md}``. Run from the repository root:
``python benchmarks/heldout_shapes.py --seeds 4`` (one torch thread; about 1.5 min per shape and seed at 2,500 rows).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import regional_coverage as rc  # noqa: E402

METHODS = ("default", "split_nn")


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _radial(x):
    r = np.linalg.norm(x, axis=1)
    return np.sin(2 * r), 0.05 + 0.6 * r / np.sqrt(x.shape[1])


def _step(x):
    return x[:, 1] * x[:, 2] + np.cos(2 * x[:, 3]), np.where(x[:, 0] < 0, 0.15, 0.8)


def _heavy(x):
    return x[:, :4].sum(1) + np.sin(3 * x[:, 4]), 0.1 + 0.6 * _sigmoid(4 * x[:, 5])


#: name: (features, mean and noise scale of x, noise law)
SHAPES = {"radial": (6, _radial, "normal"), "step": (4, _step, "normal"), "heavy": (8, _heavy, "t3")}


def draw(shape, n, rng):
    p, f, law = SHAPES[shape]
    x = rng.uniform(-1, 1, size=(n, p))
    m, s = f(x)
    e = rng.standard_normal(n) if law == "normal" else rng.standard_t(3, n) / np.sqrt(3)
    return x, m + s * e, s


def run(args):
    runs = []
    for shape in args.shapes:
        for seed in range(args.seeds):
            rng = np.random.default_rng(100 + seed)
            X, y, _ = draw(shape, args.n_train, rng)
            X_te, y_te, s_te = draw(shape, 5000, rng)
            n_cal = int(round(args.cal_share * args.n_train))
            res, diag = rc.run_methods(X[n_cal:], y[n_cal:], X[:n_cal], y[:n_cal], X_te, y_te, seed,
                                       {"noise": s_te}, methods=list(METHODS))
            runs.append({"shape": shape, "seed": seed, "n_cal": n_cal,
                         "methods": {m: res[m] for m in METHODS}})
            print(shape, seed, {m: round(res[m]["interval_score"], 3) for m in METHODS}, flush=True)
    return {"runs": runs}


def render(p):
    c = p["config"]
    lines = [f"# Noise shapes the defaults were never tuned on: coverage per true-noise fifth ({c['n_train']:,} rows)",
             "",
             f"`{p['command']}`; {_common.machine_line(p['machine'])}.", "",
             f"{c['seeds']} seed(s), {c['n_train']} rows ({c['cal_share']:g} of them calibration rows), 5,000 test "
             "rows per seed; 90 % intervals. Coverage per fifth of the test rows by their true noise (a jump gives "
             "fewer groups: `step` has two noise levels), pooled over the seeds; IS: mean interval score relative "
             "to split conformal around the homoscedastic network, geometric mean over the seeds. Target (issue "
             "27): every true-noise fifth 85–95 %.", "",
             "| shape | method | coverage % | per true-noise fifth (quiet → noisy) | IS / split_nn | 85–95 % in every "
             "fifth |", "|---|---|---:|---|---:|---|"]
    for shape in dict.fromkeys(r["shape"] for r in p["runs"]):
        rs = [r for r in p["runs"] if r["shape"] == shape]
        for m in METHODS:
            cov = 100 * float(np.mean([r["methods"][m]["coverage"] for r in rs]))
            ratio = float(np.exp(np.mean([np.log(r["methods"][m]["interval_score"]
                                                 / r["methods"]["split_nn"]["interval_score"]) for r in rs])))
            f = rc.pooled_bins(rs, m, "noise")[0]
            ok = all(0.85 <= v <= 0.95 for v in f)
            lines.append(f"| {shape} | `{m}` | {cov:.1f} | {' / '.join(f'{100 * v:.0f}' for v in f)} | "
                         f"{ratio:.3f} | {'yes' if ok else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_arguments(parser, quick="one seed of 1,000 rows")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--n-train", type=int, default=2500)
    parser.add_argument("--cal-share", type=float, default=0.2)
    parser.add_argument("--tag", default=None, help="suffix of the output files")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.n_train = 1, 1000
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    json_path, md_path = _common.output_paths(args, "heldout_shapes" + (f"_{args.tag}" if args.tag else ""))
    if args.report_only:
        _, text = _common.report_from_results(json_path, md_path, render)
    else:
        results = _common.new_results(args) | run(args)
        _, text = _common.write_results_and_report(json_path, md_path, results, render,
                                                   command=_common.command_line(__file__, argv))
    print(text)


if __name__ == "__main__":
    main()
