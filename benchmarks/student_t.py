"""The Student-t likelihood against the Gaussian on heavy-tailed synthetic data: coverage and interval score at 90 %.

Data (per seed): x ~ U(−1, 1)^5, f(x) = sin(3 x₁) + x₂² − x₃ x₄ + 0.5 x₅, y = f(x) + 0.2 ε with ε ~ N(0, 1), except
on 5 % of the rows (drawn at random, in the training, calibration and test rows alike, so that the rows stay
exchangeable) where ε ~ N(0, 10²): outliers 10× the noise. 1000 fitting rows (the estimator holds out its default
calibration share), 2000 test rows.

Per seed, three regressors with the default settings (``LaplaceActiveSubspaceRegressor(random_state=seed)``:
network, training, low-rank posterior, split-conformal intervals), differing only in ``likelihood=``:

- ``Gaussian()`` (the default);
- ``StudentT(df=4)``, ν given;
- ``StudentT(df=ν̂)``, ν fitted by maximum likelihood (``StudentT.from_residuals``) to the training residuals of
  the ν = 4 fit, then fitted again.

Metrics on the test rows at 90 %: coverage, mean width and the interval (Winkler) score (``glas_sklearn.metrics``),
and the RMSE of ŷ on the inlying test rows (how far the outliers dragged the fit).

Target (issue 26): the Student-t 90 % intervals cover 88–92 % with a smaller interval score than the Gaussian's.

Usage
-----
    python benchmarks/student_t.py                 # 5 seeds, 1 torch thread
    python benchmarks/student_t.py --quick         # 1 seed, 100 epochs, *_quick outputs
    python benchmarks/student_t.py --report-only   # the report again from student_t.json
"""

from __future__ import annotations

import argparse
import time
import warnings

import _common
import numpy as np
import torch

from glas_sklearn import LaplaceActiveSubspaceRegressor, coverage_score, interval_score, mean_width_score
from glas_sklearn.likelihoods import Gaussian, StudentT

LEVEL = 0.9
OUTLIER_SHARE, OUTLIER_FACTOR, NOISE = 0.05, 10.0, 0.2
METHODS = [
    ("gaussian", "Gaussian (default), conformal"),
    ("student_t4", "Student-t ν = 4, conformal"),
    ("student_t_fit", "Student-t ν fitted, conformal"),
]
METRICS = ("coverage", "width", "interval_score", "rmse_inliers")


def make_data(n: int, rng: np.random.Generator):
    X = rng.uniform(-1, 1, size=(n, 5))
    f = np.sin(3 * X[:, 0]) + X[:, 1] ** 2 - X[:, 2] * X[:, 3] + 0.5 * X[:, 4]
    outlier = rng.random(n) < OUTLIER_SHARE
    eps = rng.standard_normal(n) * np.where(outlier, OUTLIER_FACTOR, 1.0)
    return X, f + NOISE * eps, f, outlier


def _metrics(y, pis, f, outlier, y_pred) -> dict:
    return {"coverage": float(np.ravel(coverage_score(y, pis))[0]), "width": float(np.ravel(mean_width_score(pis))[0]),
            "interval_score": float(np.ravel(interval_score(y, pis, confidence_level=LEVEL))[0]),
            "rmse_inliers": float(np.sqrt(np.mean((y_pred[~outlier] - f[~outlier]) ** 2)))}


def run_seed(seed: int, cfg: argparse.Namespace) -> dict:
    rng = np.random.default_rng(seed)
    X, y, _, _ = make_data(cfg.n_train, rng)
    X_te, y_te, f_te, out_te = make_data(cfg.n_test, rng)
    kw = {} if cfg.epochs is None else {"max_epochs": cfg.epochs}
    out = {"seed": seed, "methods": {}, "seconds": {}}

    def fit(likelihood):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = LaplaceActiveSubspaceRegressor(**_common.grouped(likelihood=likelihood, random_state=seed, **kw))
            est.fit(X, y)
        return est, time.perf_counter() - t0

    fitted = {}
    fitted["gaussian"], out["seconds"]["gaussian"] = fit(Gaussian())
    fitted["student_t4"], out["seconds"]["student_t4"] = fit(StudentT(df=4.0))
    residuals = (y - fitted["student_t4"].predict(X)) / fitted["student_t4"].y_scale_[0]
    df_hat = StudentT.from_residuals(residuals).df
    out["df_fitted"] = df_hat
    fitted["student_t_fit"], out["seconds"]["student_t_fit"] = fit(StudentT(df=df_hat))
    for key, est in fitted.items():
        y_pred, pis = est.predict_interval(X_te)
        out["methods"][key] = _metrics(y_te, pis, f_te, out_te, y_pred)
    return out


def summarise(runs: list[dict]) -> dict:
    summary = {}
    for key, _ in METHODS:
        rows = [r["methods"][key] for r in runs]
        summary[key] = {m: {"mean": float(np.mean([x[m] for x in rows])),
                            "se": float(np.std([x[m] for x in rows], ddof=1) / np.sqrt(len(rows)))
                            if len(rows) > 1 else float("nan")} for m in METRICS}
    summary["df_fitted"] = [r["df_fitted"] for r in runs]
    return summary


def render(results: dict) -> str:
    cfg, summ, runs = results["config"], results["summary"], results["runs"]
    n = len(runs)

    def f(key, m, digits=3, scale=1.0):
        e = summ[key][m]
        se = "" if not np.isfinite(e["se"]) else f" ± {scale * e['se']:.{digits}f}"
        return f"{scale * e['mean']:.{digits}f}{se}"

    epochs = "the default max_epochs" if cfg["epochs"] is None else f"max_epochs = {cfg['epochs']}"
    lines = [f"# Student-t likelihood on heavy-tailed data{' (quick mode)' if cfg['quick'] else ''}", "",
             f"Generated by `{results['command']}` on {results['date']} "
             f"({_common.machine_line(results['machine'])}).", "",
             f"y = f(x) + {NOISE} ε, ε ~ N(0, 1) on 95 % of the rows and N(0, {OUTLIER_FACTOR:g}²) on "
             f"{100 * OUTLIER_SHARE:g} % (outliers everywhere, rows exchangeable); {cfg['n_train']} fitting rows, "
             f"{cfg['n_test']} test rows; default regressor settings ({epochs}), only ``likelihood=`` differs. "
             f"Mean ± standard error over {n} seed(s). Fitted ν per seed: "
             + ", ".join(f"{d:.2f}" for d in summ["df_fitted"]) + ".", "",
             "| likelihood, intervals | coverage (%) | mean width | interval score | RMSE of ŷ on inliers |",
             "|---|---|---|---|---|"]
    for key, label in METHODS:
        lines.append(f"| {label} | {f(key, 'coverage', 1, 100)} | {f(key, 'width')} | {f(key, 'interval_score')} | "
                     f"{f(key, 'rmse_inliers', 4)} |")
    g = summ["gaussian"]["interval_score"]["mean"]
    lines += ["", "## Against the target (coverage 88–92 %, interval score below the Gaussian's), computed", ""]
    for key in ("student_t4", "student_t_fit"):
        cov, score = 100 * summ[key]["coverage"]["mean"], summ[key]["interval_score"]["mean"]
        per_seed = [r["methods"][key]["interval_score"] / r["methods"]["gaussian"]["interval_score"] for r in runs]
        met = 88 <= cov <= 92 and score < g
        lines.append(f"- {dict(METHODS)[key]}: coverage {cov:.1f} %, interval score {score:.3f} vs Gaussian {g:.3f} "
                     f"({score / g:.3f}×; per seed " + ", ".join(f"{x:.3f}×" for x in per_seed)
                     + f"): target {'met' if met else 'not met'}.")
    lines.append("")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="1 seed, 100 epochs")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--n-train", type=int, default=1000)
    p.add_argument("--n-test", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=None, help="max_epochs (default: the estimator's; quick 100)")
    args = p.parse_args(argv)
    if args.quick and args.epochs is None:
        args.epochs = 100
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    json_path, md_path = _common.output_paths(args, "student_t")
    if args.report_only:
        R, text = _common.report_from_results(json_path, md_path, render)
        print(text)
        return R
    torch.set_num_threads(args.threads)
    results = {**_common.new_results(args), "runs": []}
    for seed in range(1 if args.quick else args.seeds):
        results["runs"].append(run_seed(seed, args))
        results["summary"] = summarise(results["runs"])
        r = results["runs"][-1]
        print(f"[student_t] seed {seed} (ν̂ {r['df_fitted']:.2f}; {sum(r['seconds'].values()):.0f} s): " + ", ".join(
            f"{k} {v['coverage']:.3f}/{v['interval_score']:.3f}" for k, v in r["methods"].items()), flush=True)
    command = _common.command_line(__file__, argv)
    R, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)
    return R


if __name__ == "__main__":
    main()
