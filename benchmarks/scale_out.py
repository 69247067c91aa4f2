"""Predictions over a Dask DataFrame on a ``distributed.LocalCluster``: rows per second on 1 and 2 worker processes
against one process, the workers' memory, and the results against the in-process call.

The default regressor (fitted on 1,000 rows of 8 features) gives ``predict_interval`` on a frame of 1,000,000 rows
(``--quick``: 20,000) in 16 partitions. The frame is made on the workers (each partition drawn from its own seed,
then persisted), so the timing is the prediction and the gathering of its results, not the shipping of inputs; the
model travels once per worker inside the graph. One process: ``predict_interval`` on the same rows as one numpy
array. Each worker and the one process run one torch thread (``OMP_NUM_THREADS=1``, the Nanny's default).
Rounds alternate between the configurations (``--rounds``, default 2), each run preceded by a small warm-up
call; medians reported, with the load average around each run, since the machine may be shared. One worker is
measured twice: with the Nanny's default ``MALLOC_TRIM_THRESHOLD_=65536`` and with glibc's own threshold (the
2-worker cluster's setting).

Usage::

    python benchmarks/scale_out.py            # 1,000,000 rows
    python benchmarks/scale_out.py --quick    # 20,000 rows, 1 round
    python benchmarks/scale_out.py --report-only

Writes ``benchmarks/results/scale_out.json`` and the report ``scale_out.md`` rendered from it.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import _common
import numpy as np
import pandas as pd

STEM = "scale_out"
PARTITIONS = 16
FEATURES = [f"x{i}" for i in range(8)]


def _rows(seed: int, n: int) -> pd.DataFrame:
    """Partition ``seed``: ``n`` rows of 8 normal features (the same on a worker and here)."""
    return pd.DataFrame(np.random.default_rng(1000 + seed).normal(size=(n, 8)), columns=FEATURES)


def _fit():
    from glas_sklearn import LaplaceActiveSubspaceRegressor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        X, y = _common.synthetic_rows("regressor", 1000)
        return LaplaceActiveSubspaceRegressor(**_common.grouped(max_epochs=100, random_state=0)).fit(
            pd.DataFrame(X, columns=FEATURES), y)


def _peak_rss_mb() -> dict:
    """This process's resident set now and at its peak (MB)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def _load() -> float:
    return os.getloadavg()[0]


def _in_process(est, X: pd.DataFrame) -> tuple[float, np.ndarray, float, float]:
    est.predict_interval(X.iloc[:100])
    load0, t0 = _load(), time.perf_counter()
    _, y_pis = est.predict_interval(X)
    return time.perf_counter() - t0, y_pis, load0, _load()


def _on_cluster(client, est, n: int) -> tuple[float, np.ndarray, float, float]:
    import dask.dataframe as dd
    from distributed import wait

    per = n // PARTITIONS
    frame = dd.from_map(_rows, range(PARTITIONS), n=per, meta=_rows(0, 0)).persist()
    wait(frame)
    # warm-up: 10 rows of every partition, where it lives, so that every worker holding rows loads the model
    est.predict_interval(frame.map_partitions(lambda part: part.iloc[:10]))[1].compute()
    load0, t0 = _load(), time.perf_counter()
    _, y_pis = est.predict_interval(frame)
    got = y_pis.compute()
    seconds = time.perf_counter() - t0
    del frame
    return seconds, got, load0, _load()


#: The clusters measured: (name, workers, whether the Nanny sets Dask's MALLOC_TRIM_THRESHOLD_=65536).
CLUSTERS = [("1 worker, Dask's malloc trim", 1, True), ("1 worker", 1, False), ("2 workers", 2, False)]


def _cluster(workers: int, dask_trim: bool):
    """A LocalCluster of ``workers`` processes; without ``dask_trim`` the Nanny leaves glibc's own trim threshold
    (Dask's default, MALLOC_TRIM_THRESHOLD_=65536, returns freed memory to the system at every chunk: slower)."""
    import dask
    from distributed import LocalCluster

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    if not dask_trim:
        environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        return LocalCluster(n_workers=workers, processes=True, threads_per_worker=1, host="127.0.0.1",
                            dashboard_address=None)


def run(rows: int, rounds: int) -> dict:
    from distributed import Client

    est = _fit()
    X = pd.concat([_rows(i, rows // PARTITIONS) for i in range(PARTITIONS)], ignore_index=True)
    env = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env])
    runs = {"one process": [], **{name: [] for name, _, _ in CLUSTERS}}
    memory, max_diff = {}, 0.0
    clusters = {}
    try:
        for name, workers, dask_trim in CLUSTERS:
            cluster = _cluster(workers, dask_trim)
            clusters[name] = (cluster, Client(cluster, set_as_default=False))
        for _ in range(rounds):
            seconds, ref, l0, l1 = _in_process(est, X)
            runs["one process"].append({"seconds": seconds, "load_before": l0, "load_after": l1})
            for name, (_, client) in clusters.items():
                with client.as_current():
                    seconds, got, l0, l1 = _on_cluster(client, est, rows)
                max_diff = max(max_diff, float(np.abs(got - ref).max()))
                runs[name].append({"seconds": seconds, "load_before": l0, "load_after": l1})
                memory[name] = list(client.run(_peak_rss_mb).values())
    finally:
        for cluster, client in clusters.values():
            client.close()
            cluster.close()
    out = {"rows": rows, "partitions": PARTITIONS, "rounds": rounds, "max_abs_difference": max_diff,
           "configurations": {}, "worker_memory_mb": memory, "one_process_peak_mb": _peak_rss_mb()["VmHWM"]}
    for name, rs in runs.items():
        secs = [r["seconds"] for r in rs]
        out["configurations"][name] = {"seconds": secs, "rows_per_s": rows / float(np.median(secs)),
                                       "load": [(r["load_before"], r["load_after"]) for r in rs]}
    ones, twos = runs["1 worker"], runs["2 workers"]
    out["ratio_2_over_1"] = [a["seconds"] / b["seconds"] for a, b in zip(ones, twos, strict=True)]
    return out


def render(payload: dict) -> str:
    r = payload["results"] if "results" in payload else payload
    lines = ["# Predictions over a Dask DataFrame on a LocalCluster", "",
             f"`{payload['command']}`; {_common.machine_line(payload['machine'])}.", "",
             f"`predict_interval` of the default regressor (8 features) on {r['rows']:,} rows in {r['partitions']} "
             "partitions made and persisted on the workers; the time includes gathering the intervals into the "
             "calling process. One process: the same rows as one frame in this process. One torch thread per "
             f"worker and here; {r['rounds']} alternating round(s), medians; the load average "
             "(1 min) before and after each run is shown, since the machine's 2 cores are shared. \"Dask's malloc "
             "trim\": the Nanny's default `MALLOC_TRIM_THRESHOLD_=65536`, which returns freed memory to the system "
             "at every chunk of rows; the other clusters leave glibc's own threshold.", ""]
    rows = []
    for name, c in r["configurations"].items():
        load = "; ".join(f"{a:.1f}→{b:.1f}" for a, b in c["load"])
        rows.append([name, f"{c['rows_per_s']:,.0f}", ", ".join(f"{s:.1f}" for s in c["seconds"]), load])
    lines += _common.markdown_table(["configuration", "rows / s", "seconds (rounds)", "load average"], rows, "lrrl")
    ratios = r["ratio_2_over_1"]
    lines += ["", f"2 workers over 1 worker: {float(np.median(ratios)):.2f}× (rounds: "
              f"{', '.join(f'{v:.2f}' for v in ratios)}; target ≥ 1.7× for 1,000,000 rows). "
              f"Largest difference from the in-process intervals: {r['max_abs_difference']:.2g}.", "",
              "Resident memory of each worker after the runs (now / peak, MB): " + "; ".join(
                  f"{k}: " + ", ".join(f"{m['VmRSS']:.0f} / {m['VmHWM']:.0f}" for m in v)
                  for k, v in r["worker_memory_mb"].items())
              + f"; the one process's peak: {r['one_process_peak_mb']:.0f} MB (it also holds the whole frame "
              "and every gathered result)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_arguments(p, quick="20,000 rows, 1 round")
    p.add_argument("--rows", type=int, default=None, help="rows of the frame (default 1,000,000; 20,000 --quick)")
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 2; 1 with --quick)")
    args = p.parse_args(argv)
    json_path, md_path = _common.output_paths(args, STEM)
    if args.report_only:
        print(_common.report_from_results(json_path, md_path, render)[1])
        return
    import torch

    torch.set_num_threads(args.threads)
    rows = args.rows or (20_000 if args.quick else 1_000_000)
    results = run(rows - rows % PARTITIONS, args.rounds or (1 if args.quick else 2))
    command = _common.command_line(__file__, argv)
    print(_common.write_results_and_report(json_path, md_path, results, render, command=command)[1])


if __name__ == "__main__":
    main()
