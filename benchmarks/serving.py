"""Serving a fitted estimator: 4 threads sharing one fitted estimator against 1 thread, and the peak memory of
predicting 200,000 rows.

For each of the regressor (default: low-rank, linearised, conformal), the regressor with the paper's sampled
predictive (``calibration="coverage", posterior="subspace"``), the heteroscedastic regressor and the classifier:
50 calls of ``predict_interval`` (``predict_proba`` for the classifier) on 200 rows from 1 thread, then 50 calls
from each of 4 threads at once on the same fitted estimator, in 3 alternating rounds; every result is compared with
the single-threaded one, exceptions are counted, and the estimator is called once more afterwards. Throughput is
calls per second (medians over the rounds). Peak memory: ``predict_interval`` on 200,000 rows of 8 features
(20,000 for the sampled predictive, whose 1000 weight samples per row make it slow) in fresh subprocesses loading
the pickled fit, its peak resident set (``VmHWM`` of /proc, reset before the call, after a garbage collection and
``malloc_trim``) minus the resident set before it, against the bytes of the inputs and outputs; the worst of 3.

Usage::

    python benchmarks/serving.py                 # torch intra-op threads: 1 (--threads)
    python benchmarks/serving.py --quick         # 10 calls per thread, 20,000 rows for the memory
    python benchmarks/serving.py --report-only   # re-render the report from the JSON

Writes ``benchmarks/results/serving.json`` and the report ``serving.md`` rendered from it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import warnings

import _common
import numpy as np
import torch

STEM = "serving"
CASES = {
    "regressor, linearised (default)": ("regressor", dict()),
    "regressor, sampled (paper)": ("regressor", dict(calibration="coverage", posterior="subspace")),
    "heteroscedastic regressor": ("regressor", dict(likelihood="heteroscedastic")),
    "classifier (default)": ("classifier", dict()),
}
FIT = dict(max_epochs=100, random_state=0)
ROWS_PER_CALL = 200


def _fit(kind: str, params: dict, n: int = 1000):
    from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor

    cls = LaplaceActiveSubspaceClassifier if kind == "classifier" else LaplaceActiveSubspaceRegressor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**_common.grouped(**FIT, **params)).fit(*_common.synthetic_rows(kind, n))


def _call(est, kind: str):
    return est.predict_proba if kind == "classifier" else (lambda X: est.predict_interval(X)[1])


def throughput(name: str, calls: int, rounds: int = 3) -> dict:
    """Calls per second from 1 thread and from 4 threads sharing the estimator, in ``rounds`` alternating rounds
    (the load of a shared machine drifts: each round's ratio compares runs a few seconds apart); medians reported."""
    kind, params = CASES[name]
    est = _fit(kind, params)
    predict = _call(est, kind)
    X = _common.synthetic_rows(kind, ROWS_PER_CALL, seed=1)[0]
    ref = predict(X)
    errors, wrong = [], [0]

    def work(barrier):
        barrier.wait()
        for _ in range(calls):
            try:
                got = predict(X)
                if not np.allclose(got, ref, rtol=1e-10, atol=1e-12):
                    wrong[0] += 1
            except Exception as err:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(err).__name__}: {err}"[:200])

    def timed(n_threads: int) -> float:
        barrier = threading.Barrier(n_threads)
        threads = [threading.Thread(target=work, args=(barrier,)) for _ in range(n_threads)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return n_threads * calls / (time.perf_counter() - t0)

    one, four = [], []
    for _ in range(rounds):
        one.append(timed(1))
        four.append(timed(4))
    try:
        after_ok = bool(np.allclose(predict(X), ref, rtol=1e-10, atol=1e-12))
    except Exception:  # noqa: BLE001 - an estimator left broken
        after_ok = False
    ratios = [f / o for f, o in zip(four, one, strict=True)]
    return {"case": name, "calls_per_thread": calls, "rows_per_call": ROWS_PER_CALL, "rounds": rounds,
            "one_thread_calls_per_s": float(np.median(one)), "four_threads_calls_per_s": float(np.median(four)),
            "ratio": float(np.median(ratios)), "ratios": ratios, "exceptions": len(errors),
            "different_results": wrong[0], "calls_checked": rounds * 5 * calls, "usable_afterwards": after_ok,
            "first_errors": sorted(set(errors))[:3]}


def _release_free_memory() -> None:
    """Garbage collected and the C heap's free memory returned to the system (glibc's ``malloc_trim``), so that the
    resident set before the call is what is live, and memory freed earlier does not hide the call's own."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _peak_child(name: str, rows: int, threads: int, model_path: str) -> None:
    """In the subprocess: load the fitted estimator, then the peak resident memory of predict_interval on ``rows``
    rows (JSON on stdout)."""
    import pickle

    torch.set_num_threads(threads)
    kind, _ = CASES[name]
    with open(model_path, "rb") as f:
        est = pickle.load(f)

    def hwm_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024

    X = _common.synthetic_rows(kind, rows, seed=2)[0]
    est.predict_interval(X[:10])  # one small call first: lazily loaded code and per-thread copies
    _release_free_memory()
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak to the current resident set
        f.write("5")
    before = hwm_mb()
    t0 = time.perf_counter()
    y_pred, y_pis = est.predict_interval(X)
    seconds = time.perf_counter() - t0
    peak = hwm_mb()
    io = (X.nbytes + y_pred.nbytes + y_pis.nbytes) / 2**20
    print(json.dumps({"case": name, "rows": rows, "peak_above_before_mb": peak - before, "inputs_outputs_mb": io,
                      "excess_mb": peak - before - io, "seconds": seconds,
                      "working_memory_mib": getattr(est.compute, "working_memory", 64)}))


def peak_memory(name: str, rows: int, threads: int, repeats: int = 3) -> dict:
    """The largest of ``repeats`` measurements, each in a fresh process (the C heap's reuse of freed memory varies
    between processes)."""
    import pickle
    import tempfile

    kind, params = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/model.pkl"
        with open(path, "wb") as f:
            pickle.dump(_fit(kind, params), f)
        runs = []
        for _ in range(repeats):
            out = subprocess.run([sys.executable, __file__, "--memory-child", name, "--rows", str(rows), "--threads",
                                  str(threads), "--model", path], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    worst = max(runs, key=lambda r: r["excess_mb"])
    return {**worst, "excess_mb_runs": [r["excess_mb"] for r in runs]}


def render(payload: dict) -> str:
    lines = ["# Serving a fitted estimator: threads and memory", "",
             f"`{payload['command']}`; {_common.machine_line(payload['machine'])}.", "",
             f"Throughput: calls per second of `predict_interval` (`predict_proba` for the classifier) on "
             f"{ROWS_PER_CALL} rows, {payload['throughput'][0]['calls_per_thread']} calls from 1 thread, then as many "
             "from each of 4 threads at once on the same fitted estimator, in "
             f"{payload['throughput'][0]['rounds']} alternating rounds (medians; the ratio is 4-thread over 1-thread "
             "throughput per round, target ≥ 1; on a machine shared with other jobs it is noisy). Every result of "
             "every call is compared with the single-threaded one.", ""]
    rows = [[r["case"], f"{r['one_thread_calls_per_s']:.1f}", f"{r['four_threads_calls_per_s']:.1f}",
             f"{r['ratio']:.2f} ({', '.join(f'{v:.2f}' for v in r['ratios'])})", r["calls_checked"], r["exceptions"],
             r["different_results"], "yes" if r["usable_afterwards"] else "NO"] for r in payload["throughput"]]
    lines += _common.markdown_table(["case", "1 thread (calls/s)", "4 threads (calls/s)", "ratio (rounds)",
                                     "calls checked", "exceptions", "different results", "usable afterwards"], rows,
                                    "lrrrrrrl")
    lines += ["", "Peak memory of `predict_interval` in fresh processes loading the pickled fit (garbage collected and "
              "the C heap trimmed first; VmHWM reset before the call, minus the resident set before it), the worst of "
              "3 processes, against the inputs and outputs (target: excess ≤ 100 MB; default `working_memory`, "
              "64 MiB):", ""]
    rows = [[m["case"], f"{m['rows']:,}", f"{m['peak_above_before_mb']:.0f}", f"{m['inputs_outputs_mb']:.1f}",
             f"{m['excess_mb']:.0f}", f"{m['seconds']:.1f}"] for m in payload["memory"]]
    lines += _common.markdown_table(["case", "rows", "peak above before (MB)", "inputs + outputs (MB)",
                                     "excess (MB)", "seconds"], rows, "lrrrrr")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_arguments(p, quick="10 calls per thread, 20,000 rows for the memory")
    p.add_argument("--calls", type=int, default=None, help="calls per thread (default 50; 10 with --quick)")
    p.add_argument("--rows", type=int, default=None, help="rows of the memory measurement (default 200,000)")
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        _peak_child(args.memory_child, args.rows, args.threads, args.model)
        return
    json_path, md_path = _common.output_paths(args, STEM)
    if args.report_only:
        print(_common.report_from_results(json_path, md_path, render)[1])
        return
    torch.set_num_threads(args.threads)
    calls = args.calls or (10 if args.quick else 50)
    rows = args.rows or (20_000 if args.quick else 200_000)
    results = {"throughput": [throughput(name, calls) for name in CASES]}
    # the sampled predictive pushes every row through 1000 weight samples (about 1 s per 200 rows here): its
    # memory, bounded per chunk of rows, is measured on a tenth of the rows
    results["memory"] = [peak_memory("regressor, linearised (default)", rows, args.threads),
                         peak_memory("regressor, sampled (paper)", rows // 10, args.threads)]
    command = _common.command_line(__file__, argv)
    print(_common.write_results_and_report(json_path, md_path, results, render, command=command)[1])


if __name__ == "__main__":
    main()
