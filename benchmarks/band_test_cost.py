"""What choosing the σ̂ bands by a test on the calibration scores costs the level, where there is nothing to find.

``MondrianConformalCalibrator(min_bins="auto")`` takes five σ̂ bands for a predictive without a noise head only where
a Kruskal–Wallis test finds the calibration scores differ across them (p < 0.1). The partition then depends on the
calibration targets, so within the fits that took bands the scores are no longer exchangeable with a new row's.
Simulated here under "no dependence" (σ̂ uniform on [1, 2], targets N(0, σ̂²): the scores |y|/σ̂ are alike in
every band), for several calibration sizes: the share of studies that take bands, and the coverage of 20,000 test
rows per study, over all studies and within those that took bands or not; ``min_bins=1`` on the same rows (no
test: one pooled quantile below 400 rows, ⌊n/200⌋ bands from 400) as the reference. Seconds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

from glas_sklearn.calibration import MondrianConformalCalibrator  # noqa: E402
from glas_sklearn.likelihoods import Gaussian  # noqa: E402
from glas_sklearn.predictive import RegressionMoments  # noqa: E402

STEM = "band_test_cost"
LEVEL = 0.9
N_TEST = 20_000


def _moments(sd):
    return RegressionMoments(torch.zeros(len(sd), 1, dtype=torch.float64), torch.as_tensor(sd.reshape(-1, 1)))


def _coverage(cal, sd_t, y_t) -> float:
    b = cal.region(_moments(sd_t), LEVEL)[:, 0, :, 0].numpy()
    return float(np.mean((y_t >= b[:, 0]) & (y_t <= b[:, 1])))


def study(n: int, seed: int) -> dict:
    """One simulated calibration set of ``n`` rows and its test rows: bands taken, coverage with "auto" and one."""
    rng = np.random.default_rng([n, seed])
    sd, sd_t = rng.uniform(1.0, 2.0, n), rng.uniform(1.0, 2.0, N_TEST)
    y, y_t = sd * rng.standard_normal(n), sd_t * rng.standard_normal(N_TEST)
    target = torch.as_tensor(y.reshape(-1, 1))
    auto = MondrianConformalCalibrator().calibrate_predictions(_moments(sd), target, LEVEL, Gaussian())
    one = MondrianConformalCalibrator(min_bins=1).calibrate_predictions(_moments(sd), target, LEVEL, Gaussian())
    return {"banded": len(auto.edges_[0]) > len(one.edges_[0]), "pvalue": float(auto.band_pvalue_[0]),
            "auto": _coverage(auto, sd_t, y_t), "one": _coverage(one, sd_t, y_t)}


def run(sizes, studies: int) -> dict:
    out = {}
    for n in sizes:
        rows = [study(n, s) for s in range(studies)]
        out[str(n)] = {k: [r[k] for r in rows] for k in rows[0]}
    return out


def _mean_se(x) -> tuple[float, float]:
    x = np.asarray(x, dtype=np.float64)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def render(results) -> str:
    lines = ["# The cost of choosing σ̂ bands by a test, where the scores are alike", "",
             f"`{results['command']}`", "", _common.machine_line(results.get("machine", {})), "",
             f"Per calibration size n: {results['config']['studies']} simulated studies, σ̂ uniform on [1, 2] and "
             "targets N(0, σ̂²) (no dependence of the scores on σ̂), 90 %, coverage of 20,000 test rows each. "
             "`min_bins=\"auto\"` takes five bands where the Kruskal–Wallis p-value is below 0.1 (the test runs from "
             "18 rows, where five bands of ⌈1/γ⌉ − 1 = 9 rows are more than the row count alone gives); "
             "`min_bins=1` on the same rows, without the test (one pooled quantile below 400 rows, ⌊n/200⌋ bands "
             "from 400: 3 at 600), is the reference. Coverage in % ± one standard error "
             "over studies.", ""]
    rows = []
    for n, r in results["runs"].items():
        banded = np.asarray(r["banded"], dtype=bool)
        auto, one = np.asarray(r["auto"]), np.asarray(r["one"])

        def cell(x):
            if len(x) == 0:
                return "–"
            m, se = _mean_se(x)
            return f"{100 * m:.2f} ± {100 * se:.2f}"

        rows.append([n, f"{100 * banded.mean():.1f} %", cell(auto), cell(one), cell(auto[banded]),
                     cell(one[banded]), cell(auto[~banded])])
    header = ["n", "bands taken", "auto, all", "min_bins=1, all", "auto, where bands taken",
              "min_bins=1, same studies", "auto, where not"]
    lines += _common.markdown_table(header, rows, "rrrrrrr")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p)
    p.add_argument("--sizes", type=int, nargs="+", default=[45, 100, 150, 300, 600])
    p.add_argument("--studies", type=int, default=2000)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.quick:
        a.studies = min(a.studies, 50)
    json_path, md_path = _common.output_paths(a, STEM)
    if a.report_only:
        print(_common.report_from_results(json_path, md_path, render)[1])
        return
    results = {**_common.new_results(a), "runs": run(a.sizes, a.studies)}
    print(_common.write_results_and_report(json_path, md_path, results, render,
                                           command=_common.command_line(__file__, argv))[1])


if __name__ == "__main__":
    main()
