"""The CPU cost of ``likelihood="auto"``'s support test on large tables: the test on all the training rows (two
networks on all rows, the default) against the test on a random subsample (two networks on the subsample, the
chosen one on all rows: ``SUPPORT_SUBSAMPLE_ROWS`` / ``SUPPORT_SUBSAMPLE_FIT`` in
glas_sklearn/estimators/_likelihood_choice.py), the subsample's networks trained with their own "auto" steps or
with the full table's (1,024 rows at lr 3e-3).

Every network training of the default fit is timed in CPU seconds (``time.process_time``, one torch thread), with
the rows it saw, its outputs (2: the variance head) and its epochs; the choice and the test statistic are recorded.

    python benchmarks/likelihood_test_cost.py --threads 1 --datasets friedman16_14k --splits 3
    python benchmarks/likelihood_test_cost.py --threads 1 --datasets friedman_50k --splits 1 --tag 50k
"""

from __future__ import annotations

import argparse
import time
import warnings

import _common
import default_fit
import numpy as np
import torch

from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.estimators import _likelihood_choice as choice
from glas_sklearn.estimators._network_training import NetworkTrainingMixin

# name: (SUPPORT_SUBSAMPLE_ROWS, SUPPORT_SUBSAMPLE_FIT, the subsample trained with the full table's steps)
VARIANTS = {
    "all_rows": (10**12, 0, False),
    "sub4000": (8000, 4000, False),
    "sub4000_full_steps": (8000, 4000, True),
    "sub2000_full_steps": (8000, 2000, True),
}


def fit_once(X, y, X_te, y_te, seed: int) -> dict:
    calls, train = [], NetworkTrainingMixin._theta0_module

    def timed(self, Xt, yt, n_outputs, seed, dtype, sample_weight=None):
        c0 = time.process_time()
        module = train(self, Xt, yt, n_outputs, seed, dtype, sample_weight)
        calls.append({"rows": len(yt), "outputs": n_outputs, "cpu_s": time.process_time() - c0,
                      "epochs": int(self.n_iter_)})
        return module

    NetworkTrainingMixin._theta0_module = timed
    try:
        est = LaplaceActiveSubspaceRegressor(confidence_level=default_fit.LEVEL, random_state=seed)
        c0 = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y)
        fit_cpu = time.process_time() - c0
    finally:
        NetworkTrainingMixin._theta0_module = train
    _, pis = est.predict_interval(X_te)
    s = est.likelihood_support_
    kept_outputs = 2 if s["chosen"] == "heteroscedastic" else 1  # the kept network: the last on all rows with them
    n_all = max(c["rows"] for c in calls)
    final = max(i for i, c in enumerate(calls) if c["outputs"] == kept_outputs and c["rows"] == n_all)
    return {"fit_cpu_s": fit_cpu, "trainings": calls,
            "test_cpu_s": sum(c["cpu_s"] for i, c in enumerate(calls) if i != final),
            "final_cpu_s": calls[final]["cpu_s"], "chosen": s["chosen"], "nll_gain": s["nll_gain"],
            "nll_gain_se": s["nll_gain_se"], "n_rows": s["n_rows"], "rows": s["rows"],
            **default_fit.scores(y_te, pis[:, 0, 0], pis[:, 1, 0])}


def render(payload: dict) -> str:
    lines = ["# The cost of likelihood=\"auto\"'s support test on large tables: all rows against a subsample", "",
             f"Commands: {'; '.join(f'`{c}`' for c in payload.get('runs', []))}. "
             + _common.machine_line(payload["machine"]) + " CPU seconds (`time.process_time`, one torch thread) "
             "of the whole fit and of each network training in it.", "",
             "*final*: the training of the network kept (on all the training rows); *test*: the other trainings "
             "(on all rows, the network not kept; on a subsample, the two subsample networks). Means over the "
             "splits.", ""]
    rows = []
    for name, per_variant in payload["results"].items():
        for variant, per_split in per_variant.items():
            res = list(per_split.values())
            choices = ", ".join(f"{k}: {r['chosen'][:5]} ({r['nll_gain']:+.4f} ± {r['nll_gain_se']:.4f}, "
                                f"{r['n_rows']} rows)" for k, r in per_split.items())
            rows.append([name, variant, len(res), f"{np.mean([r['fit_cpu_s'] for r in res]):.2f}",
                         f"{np.mean([r['test_cpu_s'] for r in res]):.2f}",
                         f"{np.mean([r['final_cpu_s'] for r in res]):.2f}",
                         f"{100 * np.mean([r['coverage'] for r in res]):.1f}",
                         f"{np.mean([r['interval_score'] for r in res]):.3f}", choices])
    lines += _common.markdown_table(["data set", "test on", "splits", "fit CPU (s)", "test CPU (s)", "final CPU (s)",
                                     "coverage (%)", "interval score", "choice per split (gain ± se, rows)"], rows)
    lines += ["", "Per training (rows, outputs, CPU s, epochs):", ""]
    for name, per_variant in payload["results"].items():
        for variant, per_split in per_variant.items():
            for k, r in per_split.items():
                lines.append(f"- {name} {variant} split {k}: " + "; ".join(
                    f"{c['rows']} rows/{c['outputs']} out {c['cpu_s']:.2f} s {c['epochs']} ep" for c in r["trainings"]))
    return "\n".join(lines + ["", _common.DISCUSSION_MARK, ""])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_arguments(parser, threads=1)
    parser.add_argument("--datasets", nargs="+", default=["friedman16_14k"], choices=default_fit.DATASETS)
    parser.add_argument("--splits", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--tag", default="", help="write likelihood_test_cost_TAG.json/.md")
    cfg = parser.parse_args(argv)
    stem = "likelihood_test_cost" + (f"_{cfg.tag}" if cfg.tag else "")
    json_path, md_path = cfg.out_dir / f"{stem}.json", cfg.out_dir / f"{stem}.md"
    if cfg.report_only:
        _common.report_from_results(json_path, md_path, render)
        return
    torch.set_num_threads(cfg.threads)
    from threadpoolctl import threadpool_limits
    threadpool_limits(cfg.threads)
    command = _common.command_line(__file__, argv)
    results = {}
    saved = choice.SUPPORT_SUBSAMPLE_ROWS, choice.SUPPORT_SUBSAMPLE_FIT, choice._SUBSAMPLE_AS_FULL
    for name in cfg.datasets:
        for split in range(cfg.splits):
            X, y, X_te, y_te = default_fit.load(name, split)
            for variant in cfg.variants:
                (choice.SUPPORT_SUBSAMPLE_ROWS, choice.SUPPORT_SUBSAMPLE_FIT,
                 choice._SUBSAMPLE_AS_FULL) = VARIANTS[variant]
                try:
                    res = fit_once(X, y, X_te, y_te, split)
                finally:
                    choice.SUPPORT_SUBSAMPLE_ROWS, choice.SUPPORT_SUBSAMPLE_FIT, choice._SUBSAMPLE_AS_FULL = saved
                results.setdefault(name, {}).setdefault(variant, {})[str(split)] = res
                print(f"[likelihood_test_cost] {name} split {split} {variant}: fit CPU {res['fit_cpu_s']:.2f} s, "
                      f"test {res['test_cpu_s']:.2f} s, final {res['final_cpu_s']:.2f} s, {res['chosen']}", flush=True)
                _common.write_results_and_report(json_path, md_path, {"results": results, "runs": [command]}, render,
                                                 command=command)
    print(render(_common.read_results(json_path)))


if __name__ == "__main__":
    main()
