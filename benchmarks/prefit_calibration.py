"""A prefit network calibrated on its own training rows against one calibrated on unseen rows (issue 22).

On UCI concrete (random 80 % / 20 % train / test splits, 824 / 206 rows, inputs and target standardized with the
training part) a tanh MLP 8-256-256-1 trained by 1,500 full-batch Adam steps (lr 1e-3, half MSE) overfits its
training rows. For every seed it is wrapped by ``LaplaceActiveSubspaceRegressor(prefit=True)`` three ways:

- **seen (the old behaviour)**: the network trained on all 824 rows, the calibration rows taken out of those
  824 rows exactly as ``fit(X_train, y_train)`` used to do (``calibration_size=0.1``: 83 rows, the same
  ``train_test_split`` with the estimator's seed), passed here as ``X_cal``. ``fit`` now refuses this case; the
  refusal is what the measurement below is the evidence for;
- **unseen, network on 90 %**: the network trained on 741 of the 824 rows, the other 83 (which it never saw)
  passed as ``X_cal`` — what the refusal's message asks for;
- **unseen, network on 100 %**: the network trained on all 824 rows, calibrated on half of the test rows
  (103, unseen) and tested on the other half (the calibration effect alone, without the smaller training set).

Each under the estimator's default (low-rank posterior, split conformal, linearised) and the paper's method
(subspace posterior, d by coverage, sampled predictive). Reported: coverage of the 90 % intervals on the test
rows, mean width (standardized units) and d.

Usage::

    python benchmarks/prefit_calibration.py [--threads 1] [--seeds 0 1 2 3 4] [--steps 1500]
    python benchmarks/prefit_calibration.py --quick        # smoke run: 2 seeds, 300 steps, width 64
    python benchmarks/prefit_calibration.py --report-only  # re-render the report from the JSON

Writes ``benchmarks/results/prefit_calibration.json`` and the report ``prefit_calibration.md`` rendered from it
(``_quick`` in the names for smoke runs).
"""

from __future__ import annotations

import argparse
import time
import warnings

import _common
import numpy as np
import torch
from sklearn.model_selection import train_test_split

from glas_sklearn import LaplaceActiveSubspaceRegressor, coverage_score, mean_width_score
from glas_sklearn.calibration import CalibrationWarning
from glas_sklearn.datasets import load_concrete

LEVEL = 0.9
SETTINGS = {  # name: estimator settings on top of the common ones
    "default (low-rank, conformal, linearised)": dict(),
    "paper (subspace, coverage, sampled)": dict(posterior="subspace", calibration="coverage", predictive="sampled"),
}
WAYS = {
    "seen": "calibration rows are 10 % of the network's training rows (the old fit(X, y))",
    "unseen_90": "network trained on 90 %, the other 10 % passed as X_cal",
    "unseen_test": "network trained on all rows, half of the test rows passed as X_cal",
}


def split(seed: int):
    """Standardized 80/20 split of concrete (training statistics)."""
    X, y = load_concrete()
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.2, random_state=seed)
    mx, sx, my, sy = X_tr.mean(0), X_tr.std(0), y_tr.mean(), y_tr.std()
    return ((X_tr - mx) / sx, (y_tr - my) / sy), ((X_te - mx) / sx, (y_te - my) / sy)


def trained_net(X: np.ndarray, y: np.ndarray, *, width: int, steps: int, seed: int) -> tuple:
    """The network, its training seconds and its training RMSE."""
    net = _common.mlp(X.shape[1], (width, width), seed=seed)
    Xt, yt = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y[:, None], dtype=torch.float32)
    t0 = time.perf_counter()
    _common.train_adam(net, Xt, yt, steps=steps, lr=1e-3, loss=_common.half_mse)
    with torch.no_grad():
        rmse = float((net(Xt) - yt).pow(2).mean().sqrt())
    return net, time.perf_counter() - t0, rmse


def evaluate(net, X, y, X_cal, y_cal, X_te, y_te, *, settings: dict, seed: int, n_samples: int, K: int) -> dict:
    est = LaplaceActiveSubspaceRegressor(net,
                                         **_common.grouped(prefit=True, confidence_level=LEVEL, max_components=K,
                                                   n_samples=n_samples, random_state=seed, **settings))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # a level not reached shows in the coverage
        est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    _, pis = est.predict_interval(X_te)
    return {"coverage": float(coverage_score(y_te, pis)[0]), "mean_width": float(mean_width_score(pis)[0]),
            "d": int(est.n_components_), "n_cal": int(len(X_cal)), "n_test": int(len(X_te)),
            "seconds": time.perf_counter() - t0}


def run(args) -> dict:
    width, steps, K, n_samples, seeds = args.width, args.steps, 50, args.n_samples, args.seeds
    if args.quick:
        width, steps, K, n_samples, seeds = 64, min(steps, 300), 10, 100, seeds[:2]
    rows = []
    for seed in seeds:
        (X_tr, y_tr), (X_te, y_te) = split(seed)
        # the old fit(X_train, y_train): ceil(10 %) of the training rows, split with the estimator's seed
        n_cal = int(np.ceil(0.1 * len(X_tr)))
        X_fit, X_seen, y_fit, y_seen = train_test_split(X_tr, y_tr, test_size=n_cal, random_state=seed)
        half = len(X_te) // 2
        net_all, t_all, rmse_all = trained_net(X_tr, y_tr, width=width, steps=steps, seed=seed)
        net_90, t_90, rmse_90 = trained_net(X_fit, y_fit, width=width, steps=steps, seed=seed)
        with torch.no_grad():
            pred = net_all(torch.as_tensor(X_te, dtype=torch.float32))[:, 0].double().numpy()
        test_rmse = float(np.sqrt(np.mean((pred - y_te) ** 2)))
        print(f"[prefit_calibration] seed {seed}: training RMSE {rmse_all:.3f}, test RMSE {test_rmse:.3f} "
              f"(standardized), trained in {t_all:.0f} + {t_90:.0f} s", flush=True)
        for name, settings in SETTINGS.items():
            common = dict(settings=settings, seed=seed, n_samples=n_samples, K=K)
            cases = {
                "seen": evaluate(net_all, X_fit, y_fit, X_seen, y_seen, X_te, y_te, **common),
                "unseen_90": evaluate(net_90, X_fit, y_fit, X_seen, y_seen, X_te, y_te, **common),
                "unseen_test": evaluate(net_all, X_tr, y_tr, X_te[:half], y_te[:half], X_te[half:], y_te[half:],
                                        **common),
            }
            for way, res in cases.items():
                rows.append({"seed": seed, "settings": name, "way": way, **res,
                             "train_rmse": rmse_90 if way == "unseen_90" else rmse_all, "test_rmse": test_rmse})
                print(f"  {name:45s} {way:12s} coverage {res['coverage']:.3f}  d {res['d']}", flush=True)
    return {"level": LEVEL, "width": width, "steps": steps, "K": K, "n_samples": n_samples, "seeds": list(seeds),
            "rows": rows}


def render(payload: dict) -> str:
    R = payload
    rows = R["rows"]
    lines = ["# Coverage of a prefit network calibrated on its own training rows, against unseen rows", "",
             f"Command: `{payload['command']}`  ", _common.machine_line(payload["machine"]), "",
             f"UCI concrete, random 80/20 splits (seeds {', '.join(map(str, R['seeds']))}), inputs and target "
             f"standardized with the training part; tanh MLP 8-{R['width']}-{R['width']}-1 trained by "
             f"{R['steps']} full-batch Adam steps (lr 1e-3). `LaplaceActiveSubspaceRegressor(prefit=True)`, "
             f"K = {R['K']}, {R['n_samples']} samples for the sampled predictive, {R['level']:.0%} intervals.", ""]
    for way, text in WAYS.items():
        lines.append(f"- **{way}**: {text}")
    lines += ["", "Coverage of the 90 % intervals on the test rows (mean over seeds, min–max; "
              "mean width in standardized units; d chosen):", ""]
    table = []
    for name in SETTINGS:
        for way in WAYS:
            sel = [r for r in rows if r["settings"] == name and r["way"] == way]
            if not sel:
                continue
            cov = np.array([r["coverage"] for r in sel])
            table.append([name, way, f"{cov.mean():.3f}", f"{cov.min():.3f}–{cov.max():.3f}",
                          f"{np.mean([r['mean_width'] for r in sel]):.3f}",
                          ", ".join(str(r["d"]) for r in sel), str(sel[0]["n_cal"]), str(sel[0]["n_test"])])
    lines += _common.markdown_table(["settings", "calibration rows", "coverage", "min–max", "mean width", "d",
                                     "cal. rows", "test rows"], table, align="llrrrlrr")
    train = np.mean([r["train_rmse"] for r in rows if r["way"] == "seen"])
    test = np.mean([r["test_rmse"] for r in rows if r["way"] == "seen"])
    lines += ["", f"The network fits its training rows to RMSE {train:.3f} and the test rows to {test:.3f} "
              "(standardized, mean over seeds): residuals on rows it was trained on understate its error on new "
              "rows, so calibration rows taken from them give intervals that are too narrow. "
              "`fit(X, y)` with `prefit=True` and no `X_cal` is therefore refused, naming `X_cal`.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_arguments(parser, threads=1, quick="2 seeds, width 64, 300 steps, K = 10, 100 samples")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--n-samples", type=int, default=1000)
    args = parser.parse_args(argv)
    stem = "prefit_calibration" + ("_quick" if args.quick else "")
    path, md_path = args.out_dir / f"{stem}.json", args.out_dir / f"{stem}.md"
    if args.report_only:
        _, text = _common.report_from_results(path, md_path, render)
    else:
        torch.set_num_threads(args.threads)
        _, text = _common.write_results_and_report(path, md_path, run(args), render,
                                                   command=_common.command_line(__file__, argv))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
