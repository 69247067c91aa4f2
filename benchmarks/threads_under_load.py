"""torch's intra-op threads on a busy machine: the README example, and where a second thread starts to pay (issue 29).

Two parts, each run with and without a load of our own (two busy-loop worker processes, one per core of a
2-core machine, bounded in time and stopped by their PIDs):

- **README example**: ``load_concrete``, ``train_test_split(random_state=0)``, the default
  ``LaplaceActiveSubspaceRegressor(confidence_level=0.9, random_state=0)``, ``fit`` and
  ``predict_interval(X_test, confidence_level=[0.5, 0.9])``, each in a fresh process, timed with the default
  settings (``n_threads="auto"``), with ``n_threads=1``, and (``--torch-default``) with ``n_threads=None``
  (torch's own count, the behaviour before ``n_threads``). Reported: wall seconds, the thread count torch had
  during ``fit`` and its default count, the test coverage (the same results whatever the thread count).
- **Sweep** (the rule of ``n_threads="auto"``): Adam steps of a two-hidden-layer tanh MLP (8 inputs, widths
  50 … 1600) on batches of 64 rows, at 1 and 2 threads in one process: seconds per step, and the work
  weights × rows per batch, which ``auto_threads`` divides by ``AUTO_WORK_PER_THREAD``.

Usage::

    python benchmarks/threads_under_load.py                     # both parts, with and without load
    python benchmarks/threads_under_load.py --torch-default     # also n_threads=None under our load (slow)
    python benchmarks/threads_under_load.py --quick             # smoke run: 30 epochs, 3 widths
    python benchmarks/threads_under_load.py --report-only

Writes ``benchmarks/results/threads_under_load.json`` and ``threads_under_load.md`` (``_quick`` for smoke runs).
The machine is shared: the load averages (``/proc/loadavg``) before each measurement are recorded beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import _common

LOAD_WORKERS = 2
_BUSY = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"
_CHILD = r"""
import json, sys, time, warnings
import torch
from sklearn.model_selection import train_test_split
from glas_sklearn import LaplaceActiveSubspaceRegressor, coverage_score, load_concrete
setting, max_epochs = json.loads(sys.argv[1]), int(sys.argv[2])
default_threads = torch.get_num_threads()
t0 = time.perf_counter()
X, y = load_concrete(as_frame=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
reg = LaplaceActiveSubspaceRegressor(confidence_level=0.9, random_state=0, max_epochs=max_epochs, **setting)
reg.fit(X_train, y_train)
t_fit = time.perf_counter() - t0
y_pred, y_pis = reg.predict_interval(X_test, confidence_level=[0.5, 0.9])
total = time.perf_counter() - t0
cov = coverage_score(y_test, y_pis)
threads_in_fit = default_threads if reg.n_threads_ is None else reg.n_threads_
print(json.dumps({"seconds": total, "fit_seconds": t_fit, "torch_default_threads": default_threads,
                  "threads_in_fit": threads_in_fit, "threads_after": torch.get_num_threads(),
                  "coverage": [float(c) for c in cov], "timings": reg.timings_}))
"""
SETTINGS = {
    "default (n_threads='auto')": {},
    "n_threads=1": {"n_threads": 1},
    "n_threads=None (torch's own count)": {"n_threads": None},
}


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine."""
    with open("/proc/loadavg") as f:
        return [float(v) for v in f.read().split()[:3]]


@contextlib.contextmanager
def busy_load(on: bool, seconds: float):
    """``LOAD_WORKERS`` busy-loop processes, each ending by itself after ``seconds``, stopped by PID on exit."""
    procs = []
    if on:
        procs = [subprocess.Popen([sys.executable, "-c", _BUSY.format(seconds=seconds)]) for _ in range(LOAD_WORKERS)]
        time.sleep(1.0)
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def readme_run(setting: dict, max_epochs: int, timeout: float) -> dict:
    """The README example in a fresh process (torch's thread state as a user starts with it)."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # the user's machine: torch's own default count
    env["PYTHONPATH"] = str(_common.REPO) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(setting), str(max_epochs)], env=env,
                         capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def sweep(widths, steps: int, threads=(1, 2)) -> list[dict]:
    """Seconds per Adam step of a 8-w-w-1 tanh MLP on 64 rows, at each thread count."""
    import torch

    from glas_sklearn._threads import torch_threads

    rows = []
    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 8, generator=gen), torch.randn(64, 1, generator=gen)
    for w in widths:
        net = _common.mlp(8, [w, w], 1)
        opt = torch.optim.Adam(net.parameters(), lr=1e-4)
        n_w = _common.n_weights(net)
        row = {"width": w, "weights": n_w, "work": n_w * 64}
        for n in threads:
            with torch_threads(n):
                for _ in range(3):  # warm-up
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(net(X), y).backward()
                    opt.step()
                t0 = time.perf_counter()
                for _ in range(steps):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(net(X), y).backward()
                    opt.step()
                row[f"step_ms_{n}"] = 1e3 * (time.perf_counter() - t0) / steps
        rows.append(row)
    return rows


def run(args) -> dict:
    widths = [50, 200, 800] if args.quick else [50, 100, 200, 400, 800, 1600]
    max_epochs = 30 if args.quick else 500
    results = {"level": 0.9, "max_epochs": max_epochs, "load_workers": LOAD_WORKERS, "cpus": os.cpu_count(),
               "readme": [], "sweep": []}
    for loaded in (False, True):
        names = list(SETTINGS)[:2] + ([list(SETTINGS)[2]] if args.torch_default and loaded else [])
        for name in names:
            before = loadavg()
            with busy_load(loaded, seconds=args.timeout) as pids:
                t0 = time.perf_counter()
                try:
                    res = readme_run(SETTINGS[name], max_epochs, args.timeout)
                except subprocess.TimeoutExpired:  # recorded as a lower bound
                    res = {"seconds": float(args.timeout), "timed_out": True, "threads_in_fit": None,
                           "torch_default_threads": None, "coverage": []}
                res["wall_outside"] = time.perf_counter() - t0
            res.update(setting=name, loaded=loaded, loadavg_before=before, load_pids=pids)
            results["readme"].append(res)
            print(f"{'loaded' if loaded else 'own load off'} {name}: {res['seconds']:.1f} s "
                  f"(threads in fit {res['threads_in_fit']}, torch default {res['torch_default_threads']}, "
                  f"load {before})", flush=True)
        before = loadavg()
        with busy_load(loaded, seconds=args.timeout):
            steps = 10 if args.quick else 40
            for row in sweep(widths, steps):
                row.update(loaded=loaded, loadavg_before=before)
                results["sweep"].append(row)
                print(row, flush=True)
    return results


def render(results: dict) -> str:
    lines = ["# Threads on a busy machine: the README example and the rule of n_threads=\"auto\"", "",
             f"{_common.machine_line(results['machine'])} (the parent; the README runs are fresh processes with "
             f"torch's default count). Command: `{results['command']}`.", "",
             "The README example (concrete, default regressor, `fit` + `predict_interval` at 50 % and 90 %) in a "
             f"fresh process, {results['max_epochs']} epochs, with and without a load of our own: "
             f"{results['load_workers']} busy-loop processes (one per core of this "
             f"{results['cpus']}-core machine). The machine is shared with other work, so its load averages (1, 5, "
             "15 min) before each run are given.", ""]
    rows = []
    one = {r["loaded"]: r["seconds"] for r in results["readme"] if r["setting"] == "n_threads=1"}
    for r in results["readme"]:
        ratio = r["seconds"] / one[r["loaded"]] if r["loaded"] in one else float("nan")
        more = "> " if r.get("timed_out") else ""
        rows.append([r["setting"], "yes" if r["loaded"] else "no", f"{more}{r['seconds']:.1f}", f"{more}{ratio:.2f}",
                     str(r["threads_in_fit"]), str(r["torch_default_threads"]),
                     " / ".join(f"{c:.3f}" for c in r["coverage"]), " ".join(f"{v:.2f}" for v in r["loadavg_before"])])
    lines += _common.markdown_table(["setting", "busy load", "seconds", "× n_threads=1", "threads in fit",
                                     "torch default", "coverage 50 / 90 %", "load avg before"], rows)
    loads = [v for r in results["readme"] + results["sweep"] for v in r["loadavg_before"][:1]]
    lines += ["", f"The machine was never idle: 1-minute load averages of {min(loads):.1f}–{max(loads):.1f} on its "
              f"{results['cpus']} cores from other work through the run, so \"no\" means without our own busy "
              "processes, not an idle machine. The default and `n_threads=1` run the same single thread in `fit` "
              "(their difference is the machine's load); the results are the same whatever the thread count.", "",
              "Adam steps of an 8-w-w-1 tanh MLP on 64 rows (ms per step) at 1 and 2 threads; work = weights × "
              "rows per batch (`auto_threads` gives one thread per 2²⁶ of it):", ""]
    rows = [[str(r["width"]), f"{r['weights']:,}", f"{r['work']:.2e}", "yes" if r["loaded"] else "no",
             f"{r['step_ms_1']:.2f}", f"{r['step_ms_2']:.2f}", f"{r['step_ms_1'] / r['step_ms_2']:.2f}"]
            for r in results["sweep"]]
    lines += _common.markdown_table(["width", "weights", "work", "busy load", "1 thread", "2 threads",
                                     "speed-up of 2"], rows)
    paid = {loaded: [str(r["width"]) for r in results["sweep"] if r["loaded"] is loaded
                     and r["step_ms_1"] > r["step_ms_2"]] for loaded in (False, True)}
    where = "; ".join(f"{'under our load' if loaded else 'without our load'}: "
                      + (f"width {', '.join(widths)}" if widths else "at no width")
                      for loaded, widths in paid.items())
    lines += ["", f"A second thread paid (speed-up above 1) {where}. The rule keeps one thread below twice 2²⁶ of "
              "work (about two million weights at 64 rows per batch: width 800 above gets one thread, width 1600 "
              "two), beyond which a step is long enough to split when a core is free; on a machine shared with "
              "other work, as this one, even that can lose; `n_threads=` sets the count either way."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--torch-default", action="store_true", help="also time n_threads=None under load")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per README run")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    suffix = "_quick" if args.quick else ""
    json_path = _common.RESULTS / f"threads_under_load{suffix}.json"
    md_path = _common.RESULTS / f"threads_under_load{suffix}.md"
    if args.report_only:
        _common.report_from_results(json_path, md_path, render)
        return
    results = run(args)
    _common.write_results_and_report(json_path, md_path, results, render,
                                     command=_common.command_line(__file__, argv))


if __name__ == "__main__":
    main()
