"""``likelihood="auto"`` on small data (below 2,000 training rows): three networks of ``max_epochs`` fixed epochs
(today) against two early-stopped on the 20 % held out for the test and the chosen one trained again on all rows
for the epochs its held-out curve picked.

Data: the four UCI dev sets (concrete, energy, yacht, wine-quality-red), their standard splits
(``_common.load_uci``, as ``benchmarks/default_fit.py``). Two stages:

- ``--stage curves``: where the held-out loss optimum lies. The default estimator is fitted with
  ``n_iter_no_change=10**6`` (no stop: the two networks on 80 % of the training rows run all 500 epochs and record
  their held-out loss, the Gaussian NLL for the variance head and the mean squared error for the Gaussian, after
  every epoch); reported per network: the epoch of the lowest held-out loss out of 500, the epoch at which the
  default patience (``n_iter_no_change=10`` epochs of at least 50 steps) would have stopped, and the held-out loss
  at the best epoch, at the epoch kept under that patience and at epoch 500.
- ``--stage compare``: interval score and coverage at 90 % on the test rows and the fit's CPU seconds
  (``time.process_time``; one torch thread) of, on the same splits in the same process, in turn:

  - ``today``: ``LaplaceActiveSubspaceRegressor(random_state=split, early_stopping=False)``, which below 2,000
    training rows is today's default exactly (``early_stopping="auto"`` is off there, and ``early_stopping=False``
    keeps the three trainings of ``max_epochs`` epochs);
  - ``new``: ``LaplaceActiveSubspaceRegressor(random_state=split)``, the candidate default (the two networks
    early-stopped on the held-out rows, the chosen one retrained on all rows for the epoch its held-out loss
    picked);
  - ``new_steps`` (``--methods``): the same with the retraining for the same number of optimizer steps instead of
    the same epochs (``_likelihood_choice.RETRAIN_RULE = "steps"``: ×0.8 epochs with the default batches of 64);
  - ``new_half``: retrained for the epoch picked when it is at most ``max_epochs / 2``, else ``max_epochs``;
  - ``new_quarter_p4`` (the candidate default): the test networks with 4× the patience (``n_iter_no_change=40``:
    40 epochs of at least 50 steps), the chosen one retrained for the epoch picked when it is at most
    ``max_epochs / 4``, else ``max_epochs``.

Usage
-----
    python benchmarks/auto_epochs.py --stage curves --splits 0 5 10 15
    python benchmarks/auto_epochs.py --stage compare --splits 8
    python benchmarks/auto_epochs.py --report-only
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import _common
import numpy as np
import torch

from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.estimators import _likelihood_choice
from glas_sklearn.estimators._network_training import NetworkTrainingMixin
from glas_sklearn.estimators._training import PATIENCE_STEPS, batch_slices
from glas_sklearn.metrics import coverage_score, interval_score

LEVEL = 0.9
UCI = ["yacht", "energy", "concrete", "wine-quality-red"]
METHODS = {"today": {"early_stopping": False}, "new": {}, "new_steps": {}, "new_half": {}, "new_quarter_p4": {}}
# the retraining rule and test patience (× n_iter_no_change) of each candidate (_likelihood_choice.RETRAIN_RULE,
# TEST_PATIENCE)
RULES = {"new": ("epochs", 1), "new_steps": ("steps", 1), "new_half": ("half", 1), "new_quarter_p4": ("quarter", 4)}
# acceptance: no set's interval score (geometric mean of the per-split ratios) worse than this × today's
MAX_SCORE_RATIO = 1.01


def load(name: str, split: int):
    X, y, train, test = _common.load_uci(_common.data_dir("uci") / name, split)
    return X[train], y[train], X[test], y[test]


def fit(X, y, seed: int, **settings):
    """The fitted estimator, its fit's CPU and wall seconds, and the record of every network trained in it."""
    trained, original = [], NetworkTrainingMixin._train

    def recording(self, module, Xt, yt, seed, sample_weight, **kw):
        original(self, module, Xt, yt, seed, sample_weight, **kw)
        held, scores = self.validation_indices_, self.validation_scores_
        n_fit = len(yt) - (0 if held is None else len(held))
        trained.append({"likelihood": self.likelihood_.name, "n_iter": self.n_iter_, "n_fit": n_fit,
                        "batch": self._batch_size(n_fit),
                        "validation_scores": None if scores is None else list(scores)})

    est = LaplaceActiveSubspaceRegressor(**_common.grouped(confidence_level=LEVEL, random_state=seed, **settings))
    NetworkTrainingMixin._train = recording
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        NetworkTrainingMixin._train = original
    return est, cpu, wall, trained


def patience_stop(scores: list[float], n_fit: int, batch: int, n_iter_no_change: int = 10, tol: float = 1e-4):
    """(epoch stopped, epoch kept) of the default patience replayed on a full held-out curve (as train_module)."""
    steps = len(batch_slices(n_fit, batch or n_fit))
    patience = max(n_iter_no_change, -(-n_iter_no_change * PATIENCE_STEPS // steps))
    best, best_epoch, no_change = None, 0, 0
    for epoch, s in enumerate(scores, 1):
        no_change = 0 if best is None or s < best - tol * abs(best) else no_change + 1
        if best is None or s < best:
            best, best_epoch = s, epoch
        if no_change >= patience:
            return epoch, best_epoch, patience
    return len(scores), best_epoch, patience


def run_curves(name: str, split: int) -> dict:
    X, y, _, _ = load(name, split)
    est, cpu, _, trained = fit(X, y, split, n_iter_no_change=10**6)
    out = {"n_train_rows": len(y), "chosen": est.likelihood_support_["chosen"]}
    for t in trained[:2]:
        s = t["validation_scores"]
        best = int(np.argmin(s)) + 1
        stop, kept, patience = patience_stop(s, t["n_fit"], t["batch"])
        out[t["likelihood"]] = {"epochs_run": t["n_iter"], "best_epoch": best, "patience": patience,
                                "patience_stop": stop, "patience_best_epoch": kept, "loss_best": s[best - 1],
                                "loss_patience": s[kept - 1], "loss_last": s[-1], "n_fit": t["n_fit"],
                                "batch": t["batch"]}
    return out


def run_compare(name: str, split: int, methods) -> dict:
    X, y, X_te, y_te = load(name, split)
    out = {}
    for method in methods:
        defaults = _likelihood_choice.RETRAIN_RULE, _likelihood_choice.TEST_PATIENCE
        _likelihood_choice.RETRAIN_RULE, _likelihood_choice.TEST_PATIENCE = RULES.get(method, defaults)
        try:
            est, cpu, wall, trained = fit(X, y, split, **METHODS[method])
        finally:
            _likelihood_choice.RETRAIN_RULE, _likelihood_choice.TEST_PATIENCE = defaults
        _, pis = est.predict_interval(X_te)
        pis = np.stack([pis[:, 0, 0], pis[:, 1, 0]], axis=1)
        s = est.likelihood_support_
        out[method] = {"fit_cpu_s": cpu, "fit_s": wall, "interval_score": float(interval_score(y_te, pis,
                                                                                              confidence_level=LEVEL)),
                       "coverage": float(coverage_score(y_te, pis)), "chosen": s["chosen"],
                       "nll_gain": s["nll_gain"], "nll_gain_se": s["nll_gain_se"],
                       "epochs": [t["n_iter"] for t in trained], "retraining_epochs": s.get("retraining_epochs")}
    return out


# ----------------------------------------------------------------------------------------------------- report
def _gmean(x) -> float:
    return float(np.exp(np.mean(np.log(x))))


def render(payload: dict) -> str:
    lines = ["# `likelihood=\"auto\"` on small data: early-stopped test networks and a retraining for the epochs "
             "they picked", "", f"{_common.machine_line(payload['machine'])}; runs:", ""]
    lines += [f"- `{c}`" for c in payload.get("runs", [])]
    curves = payload.get("curves", {})
    if curves:
        lines += ["", "## Where the held-out loss is lowest (networks on 80 % of the training rows, 500 epochs)", "",
                  "Per data set, over the splits run: the epoch of the lowest held-out loss (median, min–max), the "
                  "epoch the default patience stops at (median), and the held-out loss at the epoch kept under "
                  "that patience and at epoch 500 relative to the lowest (means; NLL for the variance head, "
                  "mean squared error in standardised units for the Gaussian).", ""]
        rows = []
        for name, per_split in curves.items():
            for lik in ("heteroscedastic", "gaussian"):
                r = [s[lik] for s in per_split.values()]
                best = [x["best_epoch"] for x in r]
                stop = [x["patience_stop"] for x in r]

                def rel(key, r=r):
                    diffs = [x[key] - x["loss_best"] for x in r]
                    return f"{np.mean(diffs):+.4f}"
                rows.append([name, lik, len(r), f"{np.median(best):.0f} ({min(best)}–{max(best)})",
                             f"{np.median(stop):.0f}", r[0]["patience"], rel("loss_patience"), rel("loss_last")])
        lines += _common.markdown_table(["data set", "network", "splits", "best epoch", "patience stops at",
                                         "patience (epochs)", "loss kept − best", "loss at 500 − best"], rows,
                                        "llrrrrrr")
    for run in payload.get("compare_runs", []):
        lines += _compare_section(run)
    lines += ["", _common.DISCUSSION_MARK, ""]
    return "\n".join(lines)


def _compare_section(run: dict) -> list[str]:
    compare = run["results"]
    lines = ["", f"## Against today's default, same splits, same process: `{run['command']}`", "",
             "Interval score ratio: geometric mean over the splits of the per-split ratio to `today`; "
             "CPU ratio: summed fit CPU seconds over `today`'s; *choice agreement*: splits on which the "
             "method kept the same likelihood as `today`; *final epochs*: of the network kept (median).", ""]
    if True:
        rows, checks = [], []
        for name, per_split in compare.items():
            splits = list(per_split.values())
            for method in METHODS:
                rs = [s for s in splits if method in s and "today" in s]
                if not rs:
                    continue
                ratio = _gmean([s[method]["interval_score"] / s["today"]["interval_score"] for s in rs])
                cpu = sum(s[method]["fit_cpu_s"] for s in rs) / sum(s["today"]["fit_cpu_s"] for s in rs)
                agree = sum(s[method]["chosen"] == s["today"]["chosen"] for s in rs)
                het = sum(s[method]["chosen"] == "heteroscedastic" for s in rs)
                epochs = [s[method]["retraining_epochs"] or s[method]["epochs"][-1] for s in rs]
                rows.append([name, method, len(rs), f"{ratio:.3f}",
                             f"{100 * np.mean([s[method]['coverage'] for s in rs]):.1f}",
                             f"{np.mean([s[method]['fit_cpu_s'] for s in rs]):.2f}", f"{cpu:.2f}",
                             f"{agree}/{len(rs)}", f"{het}", f"{np.median(epochs):.0f}"])
                if method != "today":
                    checks.append([name, method, f"{ratio:.3f}",
                                   "met" if ratio <= MAX_SCORE_RATIO else "missed"])
        lines += _common.markdown_table(["data set", "method", "splits", "interval score / today (gmean)",
                                         "coverage (%)", "fit CPU (s, mean)", "CPU / today", "choice agreement",
                                         "variance head kept", "final epochs (median)"], rows, "llrrrrrrrr")
        lines += ["", f"Acceptance: interval score ≤ {MAX_SCORE_RATIO}× today's on every set.", ""]
        lines += _common.markdown_table(["data set", "method", "ratio", ""], checks)
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_arguments(parser, threads=1)
    parser.add_argument("--stage", choices=["curves", "compare"], default="compare")
    parser.add_argument("--datasets", nargs="+", default=UCI, choices=UCI)
    parser.add_argument("--splits", type=int, nargs="+", default=[8],
                        help="one number k: splits 0..k-1; several: those splits")
    parser.add_argument("--methods", nargs="+", default=["today", "new"], choices=list(METHODS))
    cfg = parser.parse_args(argv)
    json_path, md_path = _common.output_paths(cfg, "auto_epochs")
    if cfg.report_only:
        _common.report_from_results(json_path, md_path, render)
        return
    torch.set_num_threads(cfg.threads)
    previous = json.loads(json_path.read_text()) if json_path.exists() else {}
    results = {"curves": previous.get("curves", {}), "compare_runs": previous.get("compare_runs", [])}
    runs = previous.get("runs", [])
    command = _common.command_line(__file__, argv)
    runs.append(command)
    if cfg.stage == "compare":  # each run its own table: the CPU ratios are within one process
        results["compare_runs"].append({"command": command, "results": {}})
    splits = range(cfg.splits[0]) if len(cfg.splits) == 1 else cfg.splits
    if cfg.quick:
        cfg.datasets, splits = ["yacht"], [0]
    for name in cfg.datasets:
        for split in splits:
            if cfg.stage == "curves":
                res = run_curves(name, split)
            else:
                res = run_compare(name, split, cfg.methods)
            if cfg.stage == "curves":
                results["curves"].setdefault(name, {})[str(split)] = res
            else:
                results["compare_runs"][-1]["results"].setdefault(name, {})[str(split)] = res
            print(f"[auto_epochs] {name} split {split}: {json.dumps(res)}", flush=True)
            _common.write_results_and_report(json_path, md_path, {**results, "runs": runs}, render,
                                             command=command)
    print(render(json.loads(json_path.read_text())))


if __name__ == "__main__":
    main()
