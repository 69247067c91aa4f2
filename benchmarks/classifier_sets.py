"""Conformal prediction sets of the classifier on digits at 90 %: coverage, set size and empty sets per score.

Data: scikit-learn's 8×8 digits (bundled, 1797 rows, 10 classes). Per seed, a stratified split into 1347 fitting
rows and 450 test rows (``train_test_split(test_size=0.25)``, as a user would), and the fitting rows into training
rows and 10 % calibration rows (stratified; the share of the estimator's default ``calibration_size``).

Per seed, one default classifier, ``LaplaceActiveSubspaceClassifier(random_state=seed)`` (the default network,
training, posterior and σ0, ``calibration="conformal"``), is fitted with those calibration rows as ``X_cal``. Its
σ0 is chosen on half of them (``sigma0_rows_``); the conformity scores are computed on the other half. Every
score below is calibrated on exactly those rows and the same predictive probabilities (``predict_proba``, the
calibration's posterior samples), so the scores differ only in how they turn probabilities into sets: split
conformal as :class:`~glas_sklearn.calibration.ConformalCalibrator` does it (the ⌈(n + 1)(1 − γ)⌉-th smallest
calibration score, then the score's ``region``). The script checks that for LAC this reproduces the estimator's
own calibration scores and ``predict_set`` sets.

Metrics on the test rows at 90 %: coverage, mean set size, the number of empty sets and of singletons. The rule for
the classifier's default score, fixed before the run: among the scores with no empty set on any seed and a mean
coverage ≥ 89 % (the promised 90 % less the sampling error the issue allows), the smallest mean set size.

Usage
-----
    python benchmarks/classifier_sets.py                 # 5 seeds, 1 torch thread
    python benchmarks/classifier_sets.py --quick         # 1 seed, 60 epochs, *_quick outputs
    python benchmarks/classifier_sets.py --report-only   # the report again from classifier_sets.json
"""

from __future__ import annotations

import argparse
import time
import warnings

import _common
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from glas_sklearn import LaplaceActiveSubspaceClassifier
from glas_sklearn.calibration import conformal_quantile
from glas_sklearn.conformity_scores import APS, LAC, RAPS, TopK

LEVEL = 0.9
SCORES = [
    ("lac", "LAC 1 − p_y", LAC()),
    ("lac_never_empty", "LAC, the top class added to an empty set", LAC(never_empty=True)),
    ("aps", "APS (include_last)", APS()),
    ("aps_exact", "APS, exact inverse (include_last=False)", APS(include_last=False)),
    ("raps", "RAPS λ = 0.01, k_reg = 1", RAPS(lam=0.01, k_reg=1)),
    ("raps_01", "RAPS λ = 0.1, k_reg = 1", RAPS(lam=0.1, k_reg=1)),
    ("topk", "top-k (rank of y)", TopK()),
]
METRICS = ("coverage", "mean_size", "n_empty", "n_singleton")


def set_metrics(sets: np.ndarray, labels: np.ndarray) -> dict:
    sizes = sets.sum(1)
    return {"coverage": float(sets[np.arange(len(labels)), labels].mean()), "mean_size": float(sizes.mean()),
            "n_empty": int((sizes == 0).sum()), "n_singleton": int((sizes == 1).sum())}


def run_seed(seed: int, cfg: argparse.Namespace) -> dict:
    X, y = load_digits(return_X_y=True)
    X_fit, X_te, y_fit, y_te = train_test_split(X, y, test_size=0.25, stratify=y, random_state=seed)
    X_tr, X_ca, y_tr, y_ca = train_test_split(X_fit, y_fit, test_size=0.1, stratify=y_fit, random_state=seed)
    t0 = time.perf_counter()
    kw = {} if cfg.epochs is None else {"max_epochs": cfg.epochs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = LaplaceActiveSubspaceClassifier(**_common.grouped(random_state=seed,
                                                        **kw)).fit(X_tr, y_tr, X_cal=X_ca, y_cal=y_ca)
    fit_seconds = time.perf_counter() - t0
    conf_rows = np.setdiff1d(np.arange(len(X_ca)), clf.sigma0_rows_)
    codes_ca = np.searchsorted(clf.classes_, y_ca[conf_rows])
    codes_te = np.searchsorted(clf.classes_, y_te)
    p_ca = torch.as_tensor(clf.predict_proba(X_ca[conf_rows]), dtype=torch.float64)
    p_te = torch.as_tensor(clf.predict_proba(X_te))
    labels_ca = torch.as_tensor(codes_ca)
    out = {"seed": seed, "n_train": len(X_tr), "n_cal": len(X_ca), "n_conformal": len(conf_rows),
           "n_test": len(X_te), "accuracy": float((p_te.argmax(1).numpy() == codes_te).mean()),
           "fit_seconds": fit_seconds, "scores": {}}
    for key, _, score in SCORES:
        s = np.asarray(score.score(labels_ca, p_ca), dtype=np.float64)
        q = conformal_quantile(s, LEVEL)
        if key == "lac":  # the estimator's own calibration, reproduced
            np.testing.assert_allclose(np.sort(s), clf.conformity_scores_, rtol=0, atol=1e-6)
            _, own_sets = clf.predict_set(X_te)
            assert np.array_equal(np.asarray(score.region(p_te, q)), own_sets), "LAC sets differ from predict_set"
        sets = np.asarray(score.region(p_te, q))[..., 0]
        out["scores"][key] = {"quantile": float(np.ravel(q)[0]), **set_metrics(sets, codes_te)}
    return out


def summarise(runs: list[dict]) -> dict:
    summary = {}
    for key, _, _ in SCORES:
        rows = [r["scores"][key] for r in runs]
        summary[key] = {m: {"mean": float(np.mean([x[m] for x in rows])),
                            "se": float(np.std([x[m] for x in rows], ddof=1) / np.sqrt(len(rows)))
                            if len(rows) > 1 else float("nan"),
                            "total": float(np.sum([x[m] for x in rows]))}
                        for m in METRICS}
    eligible = [k for k, _, _ in SCORES
                if summary[k]["n_empty"]["total"] == 0 and summary[k]["coverage"]["mean"] >= LEVEL - 0.01]
    summary["chosen_default"] = min(eligible, key=lambda k: summary[k]["mean_size"]["mean"]) if eligible else None
    return summary


def render(results: dict) -> str:
    cfg, summ, runs = results["config"], results["summary"], results["runs"]
    n, n_te = len(runs), runs[0]["n_test"]

    def f(key, m, digits=3):
        e = summ[key][m]
        se = "" if not np.isfinite(e["se"]) else f" ± {e['se']:.{digits}f}"
        return f"{e['mean']:.{digits}f}{se}"

    epochs = "the default max_epochs" if cfg["epochs"] is None else f"max_epochs = {cfg['epochs']}"
    lines = [f"# Classifier prediction sets on digits at 90 %{' (quick mode)' if cfg['quick'] else ''}", "",
             f"Generated by `{results['command']}` on {results['date']} "
             f"({_common.machine_line(results['machine'])}).", "",
             f"Default `LaplaceActiveSubspaceClassifier(random_state=seed)` ({epochs}); per seed {runs[0]['n_train']} "
             f"training, {runs[0]['n_cal']} calibration rows (σ0 on half, the conformity scores on the other "
             f"{runs[0]['n_conformal']}), {n_te} test rows; every score is calibrated on the same rows and "
             f"probabilities. Mean ± standard error over {n} seed(s); empty sets and singletons are totals over the "
             f"{n} × {n_te} test rows. Test accuracy "
             f"{np.mean([r['accuracy'] for r in runs]):.3f}.", "",
             "| score | coverage | mean set size | empty sets | singletons |", "|---|---|---|---|---|"]
    for key, label, _ in SCORES:
        lines.append(f"| {label} | {f(key, 'coverage')} | {f(key, 'mean_size', 2)} | "
                     f"{int(summ[key]['n_empty']['total'])} / {n * n_te} | "
                     f"{int(summ[key]['n_singleton']['total'])} / {n * n_te} |")
    chosen = summ["chosen_default"]
    label = dict((k, lab) for k, lab, _ in SCORES).get(chosen, "none")
    lines += ["", "## The default score, computed", "",
              "Rule (fixed before the run): no empty set on any seed, mean coverage ≥ 89 %, then the smallest mean "
              f"set size. Chosen: **{label}**" + (f" (coverage {summ[chosen]['coverage']['mean']:.3f}, mean set size "
                                                  f"{summ[chosen]['mean_size']['mean']:.2f})." if chosen else "."),
              "", "Per seed (coverage / mean size / empty):", ""]
    for key, lab, _ in SCORES:
        lines.append(f"- {lab}: " + "; ".join(
            f"{r['scores'][key]['coverage']:.3f} / {r['scores'][key]['mean_size']:.2f} / {r['scores'][key]['n_empty']}"
            for r in runs))
    lines.append("")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="1 seed, 60 epochs")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=None, help="max_epochs (default: the estimator's; quick 60)")
    args = p.parse_args(argv)
    if args.quick and args.epochs is None:
        args.epochs = 60
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    json_path, md_path = _common.output_paths(args, "classifier_sets")
    if args.report_only:
        R, text = _common.report_from_results(json_path, md_path, render)
        print(text)
        return R
    torch.set_num_threads(args.threads)
    results = {**_common.new_results(args), "runs": []}
    for seed in range(1 if args.quick else args.seeds):
        results["runs"].append(run_seed(seed, args))
        results["summary"] = summarise(results["runs"])
        print(f"[classifier_sets] seed {seed} ({results['runs'][-1]['fit_seconds']:.0f} s): " + ", ".join(
            f"{k} {v['coverage']:.3f}/{v['mean_size']:.2f}/{v['n_empty']}"
            for k, v in results["runs"][-1]["scores"].items()), flush=True)
    command = _common.command_line(__file__, argv)
    R, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)
    return R


if __name__ == "__main__":
    main()
