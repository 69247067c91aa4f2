"""Issue 43: the default regressor at the paper's scale, prefit on concrete: predict_interval time ÷ (d × one forward
pass) and the peak memory of fit and predict ÷ P (P = D·K·4 bytes, the eigenvectors' size), at 1M and 4M weights,
from 1 and 4 threads sharing the fitted estimator.

A tanh MLP 8-w-w-1 (w = 1000: 1.01M weights; w = 2000: 4.02M) is trained briefly by full-batch Adam on the
standardised concrete rows (cached under ``--cache-dir``) and handed to ``LaplaceActiveSubspaceRegressor(prefit=True)``
with its defaults (low-rank posterior, K = 50 eigenpairs): 824 fit rows, 103 calibration rows and the other 103 rows
to predict. Each configuration (code, width, threads) runs in a fresh subprocess, so that its peak memory is its own:

- the resident set (``VmRSS`` after a garbage collection and ``malloc_trim``) is taken before fit (after a fit and
  prediction of a small network, so that the code they load is not counted); the peak (``VmHWM``, reset through
  ``/proc/self/clear_refs``) during fit and during the predictions, above that start;
- one forward pass of the 103 rows (``torch.no_grad``, best of 30) and ``predict_interval`` on them (best of 3;
  from 4 threads: every thread calls it 3 times at once, the wall time ÷ the calls), as the ratio
  predict ÷ (d × forward) with the d the estimator chose;
- 4 threads: every result equal to the single-threaded one (to the last bit: the same code on the same rows),
  exceptions counted.

``--code NAME=PATH`` runs the configurations against another checkout of the library (e.g. an earlier commit in a
git worktree: ``git worktree add ../before 2f6cef6``, then ``--code before=../before --code after=.``); the code's
configurations alternate, so that both see the same machine load.

Usage::

    python benchmarks/paper_scale.py --threads 1                 # 1M and 4M weights, 1 and 4 threads
    python benchmarks/paper_scale.py --quick                     # 8-200-200-1, fewer repeats
    python benchmarks/paper_scale.py --code before=../before --code after=.
    python benchmarks/paper_scale.py --report-only

Writes ``benchmarks/results/paper_scale.json`` and the report ``paper_scale.md`` rendered from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import _common
import numpy as np
import torch

STEM = "paper_scale"
WIDTHS = (1000, 2000)
QUICK_WIDTHS = (200,)
SERVING_THREADS = (1, 4)
TRAIN_STEPS = 100
N_PREDICT = 103
N_CAL = 103


# ------------------------------------------------------------------------------------------------- the child
def _release_free_memory() -> None:
    """Garbage collected and the C heap's free memory returned to the system (glibc's ``malloc_trim``)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # the peak resident set back to the current one
        f.write("5")


def _data():
    """Standardised concrete rows: (fit, calibration, predict) splits of a fixed permutation."""
    from glas_sklearn.datasets import load_concrete

    X, y = load_concrete()
    perm = np.random.default_rng(0).permutation(len(X))
    X, y = X[perm], y[perm]
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    n_fit = len(X) - N_CAL - N_PREDICT
    cut = (slice(0, n_fit), slice(n_fit, n_fit + N_CAL), slice(n_fit + N_CAL, None))
    return [(X[s].astype(np.float32), y[s].astype(np.float32)) for s in cut]


def _network(width: int, cache_dir: Path, fit_rows) -> torch.nn.Module:
    net = _common.mlp(8, [width, width], 1, seed=0)
    cache = cache_dir / f"paper_scale_w{width}_s{TRAIN_STEPS}.pt"
    X, y = (torch.as_tensor(a) for a in fit_rows)
    _common.train_or_load(net, X, y.reshape(-1, 1), steps=TRAIN_STEPS, cache=cache)
    return net.eval()


def _estimator(net, threads: int):
    import glas_sklearn
    from glas_sklearn import LaplaceActiveSubspaceRegressor

    if not hasattr(glas_sklearn, "Compute"):  # a checkout from before the grouped constructor (--code before=...)
        return LaplaceActiveSubspaceRegressor(net, prefit=True, random_state=0, n_threads=threads)
    return LaplaceActiveSubspaceRegressor(net, prefit=True, random_state=0,
                                          compute=glas_sklearn.Compute(n_threads=threads))


def _child(args) -> None:
    """One configuration, in its own process: JSON on the last line of stdout."""
    import glas_sklearn

    torch.set_num_threads(args.threads)
    fit_rows, cal_rows, (X, _) = _data()
    net = _network(args.width, args.cache_dir, fit_rows)
    D = _common.n_weights(net)
    X_t = torch.as_tensor(X)
    with torch.no_grad():
        net(X_t)
    with warnings.catch_warnings():  # a small fit and prediction first: the code they load is not counted
        warnings.simplefilter("ignore")
        small = _common.mlp(8, [16, 16], 1, seed=1).eval()
        _estimator(small, args.threads).fit(*fit_rows, X_cal=cal_rows[0], y_cal=cal_rows[1]).predict_interval(X)
        del small
    _release_free_memory()
    start = _status_mb("VmRSS")
    _reset_peak()
    est = _estimator(net, args.threads)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(*fit_rows, X_cal=cal_rows[0], y_cal=cal_rows[1])
    fit_s = time.perf_counter() - t0
    fit_peak = _status_mb("VmHWM") - start
    K = int(est.posterior_.max_components)
    d = int(est.n_components_)
    P_mb = D * K * 4 / 2**20

    forward = []
    with torch.no_grad():
        for _ in range(30):
            t0 = time.perf_counter()
            net(X_t)
            forward.append(time.perf_counter() - t0)
    forward_s = min(forward)

    _release_free_memory()
    held = _status_mb("VmRSS") - start
    _reset_peak()
    errors, wrong, times = [], 0, []
    ref = est.predict_interval(X)[1]
    calls = args.calls
    if args.serving_threads == 1:
        for _ in range(calls):
            t0 = time.perf_counter()
            out = est.predict_interval(X)[1]
            times.append(time.perf_counter() - t0)
            wrong += int(not np.array_equal(out, ref))
        predict_s = min(times)
    else:
        barrier = threading.Barrier(args.serving_threads + 1)
        results = []

        def work():
            barrier.wait()
            for _ in range(calls):
                try:
                    results.append(est.predict_interval(X)[1])
                except Exception as err:  # noqa: BLE001 - counted and reported
                    errors.append(repr(err))

        threads = [threading.Thread(target=work) for _ in range(args.serving_threads)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        wrong = sum(int(not np.array_equal(out, ref)) for out in results)
        predict_s = wall / (calls * args.serving_threads)
    predict_peak = _status_mb("VmHWM") - start
    print(json.dumps({
        "code": args.code_name, "library": str(Path(glas_sklearn.__file__).parent), "width": args.width,
        "n_weights": D, "K": K, "d": d, "serving_threads": args.serving_threads, "torch_threads": args.threads,
        "P_mb": P_mb, "fit_s": fit_s, "forward_s": forward_s, "predict_s": predict_s, "predict_times": times,
        "predict_over_d_forward": predict_s / (d * forward_s), "fit_peak_mb": fit_peak,
        "held_after_fit_mb": held, "predict_peak_mb": predict_peak, "fit_peak_over_P": fit_peak / P_mb,
        "predict_peak_over_P": predict_peak / P_mb, "peak_over_P": max(fit_peak, predict_peak) / P_mb,
        "calls": calls * args.serving_threads + 1, "different": wrong, "exceptions": len(errors),
        "first_error": errors[0] if errors else None, "load_average": os.getloadavg()[0]}))


# ------------------------------------------------------------------------------------------------ the parent
def _run_child(args, code: str, path: Path, width: int, serving_threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(path.resolve()), OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, "--child", "--code-name", code, "--width", str(width), "--threads",
           str(args.threads), "--serving-threads", str(serving_threads), "--calls", str(args.calls),
           "--cache-dir", str(args.cache_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{code} w={width} threads={serving_threads} failed:\n{out.stderr[-4000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{code:>8} D={row['n_weights']:>9,} threads={serving_threads}: predict {row['predict_s']:.3f} s = "
          f"{row['predict_over_d_forward']:.1f} x (d x forward), fit peak {row['fit_peak_over_P']:.2f} P, "
          f"predict peak {row['predict_peak_over_P']:.2f} P, {row['different']} different, "
          f"{row['exceptions']} exceptions", flush=True)
    return row


def render(payload: dict) -> str:
    rows = payload["rows"]
    lines = [f"# Paper scale: predict_interval cost and peak memory{_common.title_tag(payload['command'])}", "",
             f"`{payload['command']}`", "", _common.machine_line(payload["machine"]) + ".", "",
             "Prefit 8-w-w-1 tanh MLP on concrete, the default regressor (low-rank posterior, K = 50), "
             "`predict_interval` on 103 rows. predict ÷ (d × fwd): the call's time (best of "
             f"{payload['config']['calls']}; from 4 threads at once: the wall time ÷ the calls) over d forward "
             "passes of those rows (best of 30). Peaks: the resident set above the one before fit, "
             "÷ P = D·K·4 bytes. Fresh process per row.", ""]
    table = [[r["code"], f"{r['n_weights']:,}", r["serving_threads"], r["d"], f"{r['P_mb']:.0f}",
              f"{r['forward_s'] * 1e3:.2f}", f"{r['predict_s']:.3f}", f"{r['predict_over_d_forward']:.1f}",
              f"{r['fit_s']:.0f}", f"{r['fit_peak_over_P']:.2f}", f"{r['predict_peak_over_P']:.2f}",
              f"{r['different']}/{r['calls']}", r["exceptions"]] for r in rows]
    lines += _common.markdown_table(["code", "D", "threads", "d", "P (MB)", "fwd (ms)", "predict (s)",
                                     "predict ÷ (d × fwd)", "fit (s)", "fit peak ÷ P", "predict peak ÷ P",
                                     "different", "exceptions"], table, "llrrrrrrrrrrr")
    lines += ["", "Targets (issue 43): predict ÷ (d × fwd) ≤ 5 at 1M weights, one thread; peak ÷ P ≤ 3 for fit and "
              "predict at 1M and 4M weights; no differences or exceptions from 4 threads.", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = _common.add_common_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]),
                                      quick="8-200-200-1 only, 2 calls")
    ap.add_argument("--code", action="append", default=None, metavar="NAME=PATH",
                    help="a checkout of the library to measure (repeatable; default: this one, as 'after')")
    ap.add_argument("--widths", type=int, nargs="+", default=None, help="hidden widths (default 1000 2000)")
    ap.add_argument("--serving", type=int, nargs="+", default=list(SERVING_THREADS),
                    help="threads sharing the fitted estimator (default 1 4)")
    ap.add_argument("--calls", type=int, default=None, help="predict_interval calls per thread (default 3)")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/glas_paper_scale"),
                    help="trained networks cache")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--code-name", default="after", help=argparse.SUPPRESS)
    ap.add_argument("--width", type=int, default=1000, help=argparse.SUPPRESS)
    ap.add_argument("--serving-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.calls is None:
        args.calls = 2 if args.quick else 3
    if args.child:
        _child(args)
        return
    json_path, md_path = _common.output_paths(args, STEM)
    if args.report_only:
        print(_common.report_from_results(json_path, md_path, render)[1])
        return
    codes = [c.split("=", 1) for c in (args.code or [f"after={_common.REPO}"])]
    widths = args.widths or (QUICK_WIDTHS if args.quick else WIDTHS)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    rows = [_run_child(args, name, Path(path), width, threads)
            for width in widths for threads in args.serving for name, path in codes]
    results = {**_common.new_results(args), "rows": rows}
    print(_common.write_results_and_report(json_path, md_path, results, render,
                                           command=_common.command_line(__file__, argv))[1])


if __name__ == "__main__":
    main()
