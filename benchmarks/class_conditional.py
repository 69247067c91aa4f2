"""Class-conditional (Mondrian) conformal prediction sets of the classifier on digits at 90 %: coverage per digit.

Split conformal pools the calibration scores of all classes, so its 90 % is an average over the classes: digits the
network confuses more (8, 3, 9 …) may be covered less, easy ones more. Class-conditional (Mondrian) conformal takes
one quantile per class from the calibration rows of that class, so that 90 % holds for each digit, at the price of
the rows: a class's quantile is finite only with at least ⌈1/γ⌉ − 1 = 9 of its rows among the conformal rows.

Data: scikit-learn's 8×8 digits (bundled, 1797 rows, 10 classes). Per seed s, a stratified split into fitting rows
and 30 % test rows (``train_test_split(test_size=0.3, stratify=y, random_state=s)``: 1257 and 540). On the fitting
rows, for each calibration share (``calibration_size`` 0.1, the default, 0.2 and 0.3; the estimator holds them out
itself, stratified) and each calibration:

- ``conformal``: ``calibration="conformal"``, pooled split conformal (the classifier's default);
- ``mondrian``: ``calibration="mondrian"``, one conformal quantile per class, interpolated between ranks
  (:class:`~glas_sklearn.calibration.MondrianConformalCalibrator`'s default ``quantile_method``);
- ``mondrian_higher``: ``calibration=MondrianConformalCalibrator(quantile_method="higher")``, the rank rounded up
  (the finite-sample guarantee ≥ 90 % per class);

a small classifier is fitted, ``LaplaceActiveSubspaceClassifier(module_kwargs={"hidden_layer_sizes": (32,)},
max_epochs=60, verbose=0, n_threads=1, random_state=s, ...)`` (everything else the default: σ0 by the NLL of half
of the calibration rows, the conformity scores on the other half, LAC with the top class added to an empty set).
With the same seed and share the fits that hold out the same rows train the same network and hold out the same
calibration and σ0 rows; only the calibrator differs (the script records the largest difference of their test
probabilities from the first method's). Where the classifier raises the share for the class-conditional
quantiles (each class needs its own rows), the Mondrian fits hold out more rows and train another network. Sets
are ``predict_set(X_test)`` at the estimator's level, 90 %.

Per method and share: mean coverage over the seeds; per digit, the coverage over all its test rows across the seeds
(pooled), its minimum (the worst digit) and maximum; mean set size, the share of sets holding all 10 classes; the
conformal calibration rows per class (``calibrator_.bins_["n"]`` for Mondrian, the labels of the conformal rows for
the pooled calibrator), the share of class quantiles that are infinite; the ``ConformalWarning`` calls per ``fit``
and per ``predict_set`` (recorded with ``simplefilter("always")``); fit seconds.

Usage
-----
    python benchmarks/class_conditional.py                 # 45 seeds, 1 torch thread (about 9 min)
    python benchmarks/class_conditional.py --quick         # 1 seed, 20 epochs, *_quick outputs
    python benchmarks/class_conditional.py --report-only   # the report again from class_conditional.json
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import _common
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from glas_sklearn import Compute, LaplaceActiveSubspaceClassifier, Training
from glas_sklearn.calibration import ConformalWarning, MondrianConformalCalibrator

LEVEL = 0.9
TEST_SIZE = 0.3
SHARES = (0.1, 0.2, 0.3)
METHODS = {
    "conformal": ('pooled: `calibration="conformal"`', lambda: "conformal"),
    "mondrian": ('class-conditional: `calibration="mondrian"` (interpolated)', lambda: "mondrian"),
    "mondrian_higher": ('class-conditional: `MondrianConformalCalibrator(quantile_method="higher")`',
                        lambda: MondrianConformalCalibrator(quantile_method="higher")),
}


def _warning_record(caught) -> dict:
    """ConformalWarning calls and where they point (file:line as the user sees them)."""
    ours = [w for w in caught if issubclass(w.category, ConformalWarning)]
    return {"n": len(ours), "where": sorted({f"{Path(w.filename).name}:{w.lineno}" for w in ours}),
            "messages": sorted({str(w.message)[:60] for w in ours})}


def run_one(X_fit, y_fit, X_te, y_te, seed: int, share: float, method: str, cfg) -> tuple[dict, np.ndarray]:
    clf = LaplaceActiveSubspaceClassifier(verbose=0, random_state=seed, calibration=METHODS[method][1](),
                                          calibration_size=share, confidence_level=LEVEL,
                                          training=Training(module_kwargs={"hidden_layer_sizes": tuple(cfg.hidden)},
                                                            max_epochs=cfg.epochs), compute=Compute(n_threads=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        clf.fit(X_fit, y_fit)
        fit_seconds = time.perf_counter() - t0
    fit_warnings = _warning_record(caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        labels, sets = clf.predict_set(X_te)
    predict_warnings = _warning_record(caught)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proba = clf.predict_proba(X_te)
    sets = np.asarray(sets)[..., 0]
    n_classes = len(clf.classes_)
    codes = np.searchsorted(clf.classes_, y_te)
    covered = sets[np.arange(len(codes)), codes]
    sizes = sets.sum(1)
    # the conformal rows: the held-out calibration rows less the σ0 rows
    cal_labels = np.searchsorted(clf.classes_, y_fit[clf.calibration_indices_])
    conformal_rows = np.setdiff1d(np.arange(len(cal_labels)), clf.sigma0_rows_)
    rows_per_class = np.bincount(cal_labels[conformal_rows], minlength=n_classes)
    assert len(conformal_rows) == clf.n_calibration_rows_
    cal = clf.calibrator_
    out = {"seed": seed, "share": share, "method": method, "fit_seconds": fit_seconds,
           "timings": {k: float(v) for k, v in clf.timings_.items()},
           "n_calibration_held_out": int(len(clf.calibration_indices_)),
           "n_sigma0_rows": int(clf.n_sigma0_rows_), "n_calibration_rows": int(clf.n_calibration_rows_),
           "sigma0": float(clf.sigma0_), "accuracy": float(np.mean(labels == y_te)),
           "rows_per_class": rows_per_class.tolist(),
           "pooled_quantile": float(clf.calibration_["quantile"].iloc[0]),
           "calibration_coverage": float(clf.calibration_["coverage"].iloc[0]),
           "calibration_mean_set_size": float(clf.calibration_["mean_set_size"].iloc[0]),
           "coverage": float(covered.mean()),
           "covered_per_class": np.bincount(codes, weights=covered, minlength=n_classes).astype(int).tolist(),
           "test_per_class": np.bincount(codes, minlength=n_classes).tolist(),
           "mean_size": float(sizes.mean()), "n_all": int((sizes == n_classes).sum()),
           "n_empty": int((sizes == 0).sum()), "n_singleton": int((sizes == 1).sum()), "n_test": int(len(codes)),
           "fit_warnings": fit_warnings, "predict_warnings": predict_warnings}
    if hasattr(cal, "bins_"):  # Mondrian: one group per class
        n_bins = cal.bins_["n"].to_numpy()
        assert np.array_equal(n_bins, rows_per_class), (n_bins, rows_per_class)
        out["class_quantiles"] = [float(q) for q in cal.bins_["quantile"]]
    return out, proba


def run_seed(seed: int, cfg) -> list[dict]:
    X, y = load_digits(return_X_y=True)
    X_fit, X_te, y_fit, y_te = train_test_split(X, y, test_size=TEST_SIZE, stratify=y, random_state=seed)
    runs = []
    for share in cfg.shares:
        reference = None
        for method in cfg.methods:
            r, proba = run_one(X_fit, y_fit, X_te, y_te, seed, share, method, cfg)
            reference = proba if reference is None else reference
            r["proba_max_diff"] = float(np.abs(proba - reference).max())  # vs the first method: the same network
            runs.append(r)
    return runs


# ------------------------------------------------------------------------------------------------- summary
def summarise(runs: list[dict]) -> dict:
    out = {}
    for share in sorted({r["share"] for r in runs}):
        for method in METHODS:
            rs = [r for r in runs if r["share"] == share and r["method"] == method]
            if not rs:
                continue
            covered = np.sum([r["covered_per_class"] for r in rs], axis=0)
            tested = np.sum([r["test_per_class"] for r in rs], axis=0)
            per_class = covered / tested
            rows = np.array([r["rows_per_class"] for r in rs])
            per_seed_worst = [min(c / t for c, t in zip(r["covered_per_class"], r["test_per_class"], strict=True))
                              for r in rs]
            s = {"n_runs": len(rs), "coverage": float(np.mean([r["coverage"] for r in rs])),
                 "coverage_se": float(np.std([r["coverage"] for r in rs], ddof=1) / np.sqrt(len(rs)))
                 if len(rs) > 1 else float("nan"),
                 "per_class": per_class.tolist(),
                 "worst": float(per_class.min()), "worst_class": int(per_class.argmin()),
                 "best": float(per_class.max()), "best_class": int(per_class.argmax()),
                 "per_seed_worst": float(np.mean(per_seed_worst)),
                 "mean_size": float(np.mean([r["mean_size"] for r in rs])),
                 "all_share": float(np.sum([r["n_all"] for r in rs]) / np.sum([r["n_test"] for r in rs])),
                 "n_empty": int(np.sum([r["n_empty"] for r in rs])),
                 "rows_per_class_mean": float(rows.mean()), "rows_per_class_min": int(rows.min()),
                 "rows_per_class_max": int(rows.max()),
                 "n_calibration_rows": float(np.mean([r["n_calibration_rows"] for r in rs])),
                 "n_sigma0_rows": float(np.mean([r["n_sigma0_rows"] for r in rs])),
                 "accuracy": float(np.mean([r["accuracy"] for r in rs])),
                 "fit_seconds": float(np.mean([r["fit_seconds"] for r in rs])),
                 "fit_warnings": float(np.mean([r["fit_warnings"]["n"] for r in rs])),
                 "predict_warnings": float(np.mean([r["predict_warnings"]["n"] for r in rs])),
                 "proba_max_diff": float(np.max([r["proba_max_diff"] for r in rs]))}
            if "class_quantiles" in rs[0]:
                q = np.array([r["class_quantiles"] for r in rs])
                s["infinite_share"] = float(np.mean(~np.isfinite(q)))
                s["runs_all_infinite"] = int(np.sum(~np.isfinite(q).any(axis=1)))
            out[f"{method}@{share:g}"] = s
    return out


def render(results: dict) -> str:
    cfg, summ, runs, model = results["config"], results["summary"], results["runs"], results["model"]
    seeds = sorted({r["seed"] for r in runs})
    shares = sorted({r["share"] for r in runs})
    methods = [m for m in METHODS if any(r["method"] == m for r in runs)]
    n_te = runs[0]["n_test"]
    wall = results.get("wall_seconds")
    lines = [f"# Class-conditional conformal sets on digits at 90 %{_common.title_tag(results['command'])}"
             f"{' (quick mode)' if cfg['quick'] else ''}", "",
             f"Generated by `{results['command']}` on {results['date']} "
             f"({_common.machine_line(results['machine'])})" + (f"; {wall / 60:.1f} min in all" if wall else "") + ".",
             "",
             f"`LaplaceActiveSubspaceClassifier(module_kwargs={{\"hidden_layer_sizes\": {tuple(model['hidden'])}}}, "
             f"max_epochs={model['epochs']}, verbose=0, n_threads=1, random_state=seed, calibration=..., "
             f"calibration_size=share)`, the rest default (σ0 by the NLL of half of the calibration rows, LAC scores "
             f"on the other half). {len(seeds)} seed(s): per seed a stratified 70/30 split of the 1797 digits "
             f"({n_te} test rows, about {n_te // 10} per digit; {len(seeds) * n_te} test rows per row of the table). "
             "Coverage: mean over the seeds (± standard error); per digit: the coverage over all its test rows of "
             "all seeds; *worst*: the lowest of these (which digit), *range*: lowest–highest; *seed worst*: the "
             f"lowest digit's coverage within one seed (about {n_te // 10} rows a digit), mean over the seeds. "
             "*all 10*: share of test sets holding every class. *rows / class*: the conformal calibration rows per "
             "class, mean (min–max over classes and seeds). *∞ q*: share of class quantiles that are infinite. "
             "*warns*: `ConformalWarning` calls per `fit` / per `predict_set`.", "",
             "| share | method | accuracy | coverage | worst digit | range | seed worst | mean set size | all 10 "
             "| rows / class | ∞ q | warns | fit s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for share in shares:
        for m in methods:
            s = summ[f"{m}@{share:g}"]
            se = f" ± {s['coverage_se']:.3f}" if np.isfinite(s["coverage_se"]) else ""
            inf = f"{100 * s['infinite_share']:.0f} %" if "infinite_share" in s else "–"
            lines.append(
                f"| {share:g} | `{m}` | {s['accuracy']:.3f} | {s['coverage']:.3f}{se} | {s['worst']:.3f} "
                f"({s['worst_class']}) | {s['worst']:.3f}–{s['best']:.3f} | {s['per_seed_worst']:.3f} | "
                f"{s['mean_size']:.2f} | "
                f"{100 * s['all_share']:.1f} % | {s['rows_per_class_mean']:.1f} ({s['rows_per_class_min']}–"
                f"{s['rows_per_class_max']}) | {inf} | {s['fit_warnings']:.0f} / {s['predict_warnings']:.0f} | "
                f"{s['fit_seconds']:.1f} |")
    keys = [f"{m}@{share:g}" for share in shares for m in methods]
    lines += ["", "## Coverage per digit (pooled over the seeds)", "",
              "| digit | " + " | ".join(f"`{k}`" for k in keys) + " |",
              "|---:|" + "---:|" * len(keys)]
    for c in range(len(summ[keys[0]]["per_class"])):
        lines.append(f"| {c} | " + " | ".join(f"{summ[k]['per_class'][c]:.3f}" for k in keys) + " |")
    lines += ["", "## Calibration rows", ""]
    for share in shares:
        held = {m: summ[f"{m}@{share:g}"] for m in methods}
        groups = {}  # methods with the same rows held out (a class-conditional share may be raised)
        for m, s in held.items():
            groups.setdefault((s["n_sigma0_rows"], s["n_calibration_rows"]), []).append(m)
        for (n_tune, n_conf), ms in groups.items():
            s = held[ms[0]]
            if methods[0] in ms:  # the probabilities are compared with the first method's fit
                same = max(held[m]["proba_max_diff"] for m in ms)
                how = f"the test probabilities differ by at most {same:.1e} across them"
            else:
                how = (f"the share raised for the class-conditional quantiles (other rows held out than "
                       f"`{methods[0]}`'s, so another network)")
            lines.append(f"- share {share:g}, {', '.join(f'`{m}`' for m in ms)}: {n_tune + n_conf:.0f} rows held out, "
                         f"{n_tune:.0f} of them choose σ0, {n_conf:.0f} give the conformal scores "
                         f"({s['rows_per_class_mean']:.1f} per class); {how}.")
    mond = [k for k in keys if "runs_all_infinite" in summ[k]]
    if mond:
        lines.append("- Mondrian fits with every class quantile infinite: " + ", ".join(
            f"`{k}` {summ[k]['runs_all_infinite']} of {summ[k]['n_runs']}" for k in mond) + ".")
    where = sorted({w for r in runs for w in r["fit_warnings"]["where"] + r["predict_warnings"]["where"]})
    if where:
        lines.append("- `ConformalWarning` raised at: " + ", ".join(f"`{w}`" for w in where) + ".")
    lines += ["", _common.DISCUSSION_MARK, ""]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="1 seed, 20 epochs")
    p.add_argument("--seeds", type=int, default=45, help="random splits 0 .. seeds − 1 (default 45)")
    p.add_argument("--shares", type=float, nargs="+", default=list(SHARES), help="calibration_size values")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--hidden", type=int, nargs="+", default=[32], help="hidden layer sizes (default 32)")
    p.add_argument("--epochs", type=int, default=60, help="max_epochs (default 60; quick 20)")
    p.add_argument("--tag", default=None, help="suffix of the output files")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs = 1, 20
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    json_path, md_path = _common.output_paths(args, "class_conditional" + (f"_{args.tag}" if args.tag else ""))
    if args.report_only:
        R, text = _common.report_from_results(json_path, md_path, render)
        print(text)
        return R
    torch.set_num_threads(args.threads)
    results = {**_common.new_results(args), "model": {"hidden": list(args.hidden), "epochs": args.epochs},
               "runs": []}
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        runs = run_seed(seed, args)
        results["runs"] += runs
        print(f"[class_conditional] seed {seed} ({time.perf_counter() - t0:.0f} s): " + "; ".join(
            f"{r['method']}@{r['share']:g} {r['coverage']:.3f}/{r['mean_size']:.2f}" for r in runs), flush=True)
    results["wall_seconds"] = time.perf_counter() - t0
    results["summary"] = summarise(results["runs"])
    command = _common.command_line(__file__, argv)
    R, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)
    return R


if __name__ == "__main__":
    main()
