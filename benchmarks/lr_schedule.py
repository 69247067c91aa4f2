"""The learning-rate schedule of ``Training``: ``schedule="constant"`` (the default) against ``"warmup_cosine"`` on
UCI sets, the default estimator otherwise (``likelihood="gaussian"`` so that one network is trained per fit), one
torch thread: fit time and the 90 % interval score on the test rows of each standard split.

    python benchmarks/lr_schedule.py --datasets yacht energy --splits 0 1

Writes ``results/lr_schedule.json`` and ``.md`` (``--out-dir`` for another folder).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _common
import numpy as np
import torch

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Training
from glas_sklearn.metrics import coverage_score, interval_score

SCHEDULES = ("constant", "warmup_cosine")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--datasets", nargs="+", default=["yacht", "energy"])
    p.add_argument("--splits", nargs="+", type=int, default=[0, 1])
    p.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.datasets:
        for split in args.splits:
            X, y, train, test = _common.load_uci(_common.data_dir("uci") / name, split)
            for schedule in SCHEDULES:
                reg = LaplaceActiveSubspaceRegressor(likelihood="gaussian", training=Training(schedule=schedule),
                                                     compute=Compute(n_threads=1), random_state=split)
                t0 = time.perf_counter()
                reg.fit(X[train], y[train])
                seconds = time.perf_counter() - t0
                _, pis = reg.predict_interval(X[test])
                rows.append({"dataset": name, "split": split, "schedule": schedule, "fit_seconds": seconds,
                             "interval_score": float(interval_score(y[test], pis, 0.9)[0]),
                             "coverage": float(coverage_score(y[test], pis)[0])})
                print(rows[-1], flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "lr_schedule.json").write_text(json.dumps(rows, indent=1))
    lines = ["# Learning-rate schedule: constant against warm-up + cosine", "",
             f"`python benchmarks/lr_schedule.py --datasets {' '.join(args.datasets)} --splits "
             f"{' '.join(map(str, args.splits))}` (one torch thread; default estimator, `likelihood=\"gaussian\"`).",
             "", "| dataset | split | schedule | fit s | interval score | coverage |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['split']} | {r['schedule']} | {r['fit_seconds']:.2f} | "
                     f"{r['interval_score']:.4g} | {r['coverage']:.3f} |")
    for name in args.datasets:
        ratio = [np.mean([r["interval_score"] for r in rows if r["dataset"] == name and r["schedule"] == s])
                 for s in SCHEDULES]
        lines.append(f"\n{name}: mean interval score warmup_cosine / constant = {ratio[1] / ratio[0]:.3f}")
    (args.out_dir / "lr_schedule.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
