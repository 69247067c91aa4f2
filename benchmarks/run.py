"""The benchmark suite's one entry point: run, smoke-run or re-render the maintained benchmarks.

Usage::

    python benchmarks/run.py --list                 # what there is, and what each needs
    python benchmarks/run.py --quick                # every smoke run into /tmp/glas-bench-quick (CI runs this)
    python benchmarks/run.py --quick uci serving    # some of them
    python benchmarks/run.py default_fit            # a full run, writing benchmarks/results/ (hours for some)
    python benchmarks/run.py --report-only          # every committed report re-rendered from its JSON

Each benchmark is its own script, run here in a fresh process (``python benchmarks/<name>.py``), so a crash or a
leak in one does not reach the next, and any of them can also be run directly with more options (see its
``--help``). A benchmark whose optional package or data set is missing is skipped with the reason; any run that
fails makes the exit status 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA_ENV = "GLAS_DATA_DIR"


@dataclass(frozen=True)
class Benchmark:
    """A maintained benchmark: its script, what it measures, its smoke-run options and what it needs."""

    what: str
    quick: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()  # optional packages the script imports
    data: str | None = None  # a folder under the data directory ($GLAS_DATA_DIR, default ../shared/data)
    full: tuple[str, ...] = field(default=())  # options of the committed full run


BENCHMARKS = {
    "bench_ggn": Benchmark("speed of the curvature products and of the top eigenpairs, against curvlinops and "
                           "scipy's eigsh", quick=("--threads", "1"), full=("--threads", "2")),
    "default_fit": Benchmark("the default regressor's fit: time per step, epochs, interval score and coverage "
                             "against split conformal and CQR around gradient boosting", quick=("--threads", "1"),
                             modules=("mapie",), data="uci", full=("--threads", "1")),
    "paper_1d": Benchmark("the paper's 1-D sine study (§2.2)", full=("--seeds", "5")),
    "paper_concrete": Benchmark("the paper's concrete study with a 10⁶-weight network (§2.3)",
                                modules=("matplotlib",), full=("--threads", "2")),
    "paper_smiles": Benchmark("the paper's SMILES LSTM study (§2.4)", quick=("--threads", "1"),
                              modules=("rdkit", "matplotlib", "pandas"), data="smiles",
                              full=("--replicas", "3", "--threads", "1")),
    "uci": Benchmark("four UCI sets × 20 splits: the paper's method and the defaults against split conformal, "
                     "conformalised Laplace, laplace-torch and a deep ensemble; the default against the tabular "
                     "peers (quantile forest, crepes, NGBoost, MAPIE around gradient boosting)",
                     quick=("--datasets", "yacht", "--no-laplace-torch", "--threads", "1"), modules=("mapie",),
                     data="uci", full=("--threads", "1")),
    "regional_coverage": Benchmark("coverage per region (fifths of the noise, of the predicted std) on synthetic "
                                   "noise shapes, the UCI sets and their top-third extrapolation, against conformal "
                                   "and Bayesian anchors",
                                   quick=("--study", "synthetic", "--shapes", "interaction", "--no-check", "--methods",
                                          "default", "split_nn", "--threads", "1"),
                                   modules=("mapie",), full=("--study", "synthetic", "--seeds", "3")),
    "serving": Benchmark("a fitted estimator served from threads: throughput, identical results, memory",
                         quick=("--threads", "1")),
    "paper_scale": Benchmark("predict_interval time ÷ (d × one forward pass) and peak memory ÷ the eigenvectors' "
                             "size for 1M- and 4M-weight networks, 1 and 4 serving threads",
                             quick=("--threads", "1", "--serving", "1"), full=("--threads", "1")),
    "classifier_small_tables": Benchmark("the default classifier on four small scikit-learn tables × 20 splits: "
                                         "failed fits, NLL, accuracy, sets, against logistic regression and "
                                         "gradient boosting", quick=("--threads", "1"), full=("--threads", "1")),
    "serialization": Benchmark("glas_sklearn.save / load against pickle: file size and load time",
                               quick=("--threads", "1"), full=("--threads", "1")),
    "scale_out": Benchmark("predict_interval over a Dask DataFrame on a LocalCluster: rows per second on 1 and 2 "
                           "worker processes against one process, worker memory, results equal",
                           quick=("--threads", "1"), modules=("dask", "distributed"), full=("--threads", "1")),
    "ensemble_fit": Benchmark("an ensemble's networks trained together against one by one: fit time, and the two "
                              "fits' outputs compared", quick=("--threads", "1"), full=("--threads", "1")),
}
QUICK_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "glas-bench-quick"


def data_dir() -> Path:
    return Path(os.environ.get(DATA_ENV, HERE.parent.parent / "shared" / "data"))


def missing(bench: Benchmark) -> str | None:
    """Why ``bench`` cannot run here (a package or the data is missing), or None."""
    absent = [m for m in bench.modules if importlib.util.find_spec(m) is None]
    if absent:
        return f"needs {', '.join(absent)} (pip install -e \".[bench]\" with -c benchmarks/constraints.txt)"
    if bench.data is not None and not (data_dir() / bench.data).is_dir():
        return f"needs the {bench.data} data at {data_dir() / bench.data} (set ${DATA_ENV})"
    return None


def command(name: str, args: argparse.Namespace) -> list[str]:
    bench = BENCHMARKS[name]
    cmd = [sys.executable, str(HERE / f"{name}.py")]
    if args.report_only:
        return cmd + ["--report-only"]
    if args.quick:
        return cmd + ["--quick", "--out-dir", str(args.out_dir or QUICK_DIR), *bench.quick]
    return cmd + list(bench.full) + (["--out-dir", str(args.out_dir)] if args.out_dir else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default all: "
                                                                  f"{', '.join(BENCHMARKS)})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=f"smoke runs, outputs under {QUICK_DIR}")
    mode.add_argument("--report-only", action="store_true", help="re-render the committed reports, no computation")
    mode.add_argument("--list", action="store_true", help="list the benchmarks and what each needs")
    parser.add_argument("--out-dir", type=Path, default=None, help="where the outputs go")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    names = args.names or list(BENCHMARKS)
    if args.list:
        for name in names:
            why = missing(BENCHMARKS[name])
            print(f"{name:18s} {BENCHMARKS[name].what}" + (f" [{why}]" if why else ""))
        return 0
    failed = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": os.environ.get("MPLBACKEND", "Agg")}
    for name in names:
        why = missing(BENCHMARKS[name])
        if why and not args.report_only:
            print(f"[run] {name}: skipped, {why}", flush=True)
            continue
        cmd = command(name, args)
        print(f"[run] {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL if args.report_only else None).returncode
        print(f"[run] {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"[run] failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
