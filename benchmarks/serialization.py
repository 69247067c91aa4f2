"""Model files against pickle: the size of a fitted estimator written by ``glas_sklearn.save`` and by
``pickle.dumps`` / ``joblib.dump``, and the time to load it back (``glas_sklearn.load`` against ``pickle.loads``
and ``joblib.load``).

For the default regressor, the default classifier (both at their default settings, trained for 100 epochs: the
file does not depend on how long the network trained) and a regressor with a wider 8-256-256-1 network (72,000
weights, where tensors make up nearly all of the file), fitted on 1,000 rows of 8 features: the bytes of each file,
and the load time from bytes in memory (no disk), as the median over ``--rounds`` rounds of ``--repeats`` loads,
the three loaders alternating within each round so that each ratio compares runs seconds apart on a shared
machine. Every loaded copy is checked to predict as the estimator saved, bit for bit. Targets (issue 44): the model
file at most 1.2× the pickle's size, its load at most 2× the pickle's time.

Usage::

    python benchmarks/serialization.py                 # torch intra-op threads: 1 (--threads)
    python benchmarks/serialization.py --quick         # 2 rounds of 5 loads
    python benchmarks/serialization.py --report-only   # re-render the report from the JSON

Writes ``benchmarks/results/serialization.json`` and the report ``serialization.md`` rendered from it.
"""

from __future__ import annotations

import argparse
import io
import pickle
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import _common
import joblib
import numpy as np
import torch

STEM = "serialization"
CASES = {
    "regressor (default)": ("regressor", dict()),
    "classifier (default)": ("classifier", dict()),
    "regressor, 8-256-256-1": ("regressor", dict(module_kwargs=dict(hidden_layer_sizes=(256, 256)))),
}
FIT = dict(max_epochs=100, random_state=0)
TARGET_SIZE, TARGET_LOAD = 1.2, 2.0


def _predictions(est, kind: str, X):
    return [est.predict_proba(X)] if kind == "classifier" else list(est.predict_interval(X))


def measure(name: str, rounds: int, repeats: int) -> dict:
    import glas_sklearn
    from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor

    kind, params = CASES[name]
    cls = LaplaceActiveSubspaceClassifier if kind == "classifier" else LaplaceActiveSubspaceRegressor
    X, y = _common.synthetic_rows(kind, 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = cls(**_common.grouped(**FIT, **params)).fit(X, y)
    buffer = io.BytesIO()
    t0 = time.perf_counter()
    glas_sklearn.save(est, buffer)
    save_s = time.perf_counter() - t0
    model_file = buffer.getvalue()
    t0 = time.perf_counter()
    pickled = pickle.dumps(est)
    pickle_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "est.joblib"
        joblib.dump(est, path)
        joblib_file = path.read_bytes()
    loaders = {"glas_sklearn.load": lambda: glas_sklearn.load(io.BytesIO(model_file)),
               "pickle.loads": lambda: pickle.loads(pickled),
               "joblib.load": lambda: joblib.load(io.BytesIO(joblib_file))}
    Xt = _common.synthetic_rows(kind, 200, seed=1)[0]
    want = _predictions(est, kind, Xt)
    same = {}
    for loader, load in loaders.items():
        got = _predictions(load(), kind, Xt)
        same[loader] = all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
    times = {loader: [] for loader in loaders}
    for _ in range(rounds):
        for loader, load in loaders.items():
            t0 = time.perf_counter()
            for _ in range(repeats):
                load()
            times[loader].append((time.perf_counter() - t0) / repeats)
    load_ms = {loader: 1e3 * statistics.median(ts) for loader, ts in times.items()}
    ratios = [a / b for a, b in zip(times["glas_sklearn.load"], times["pickle.loads"], strict=True)]
    return {"name": name, "n_weights": est.n_weights_, "n_components": est.posterior_.max_components,
            "bytes": {"glas_sklearn.save": len(model_file), "pickle.dumps": len(pickled),
                      "joblib.dump": len(joblib_file)},
            "save_ms": {"glas_sklearn.save": 1e3 * save_s, "pickle.dumps": 1e3 * pickle_s},
            "load_ms": load_ms, "load_ratio_per_round": ratios, "predicts_bit_for_bit": same}


def render(payload: dict) -> str:
    cfg = payload["config"]
    lines = [
        "# Model files against pickle: size and load time",
        "",
        f"Command: `{payload['command']}`. Machine: {_common.machine_line(payload['machine'])}. {payload['date']}.",
        "",
        "Each estimator fitted on 1,000 rows of 8 features (default settings, 100 epochs). Bytes of the file each "
        "writer makes; load time from bytes in memory, the median over "
        f"{cfg['rounds']} rounds of {cfg['repeats']} loads, the loaders alternating within each round. Targets "
        f"(issue 44): size ≤ {TARGET_SIZE}× the pickle's, load time ≤ {TARGET_LOAD}× the pickle's.",
        "",
    ]
    rows = []
    for case in payload["cases"]:
        b, t = case["bytes"], case["load_ms"]
        size_ratio = b["glas_sklearn.save"] / b["pickle.dumps"]
        load_ratio = t["glas_sklearn.load"] / t["pickle.loads"]
        ratios = case["load_ratio_per_round"]
        met = "yes" if size_ratio <= TARGET_SIZE and load_ratio <= TARGET_LOAD else "no"
        same = "yes" if all(case["predicts_bit_for_bit"].values()) else "NO"
        rows.append([case["name"], f"{case['n_weights']:,}", f"{b['glas_sklearn.save'] / 1e3:,.1f}",
                     f"{b['pickle.dumps'] / 1e3:,.1f}", f"{b['joblib.dump'] / 1e3:,.1f}", f"{size_ratio:.3f}",
                     f"{t['glas_sklearn.load']:.2f}", f"{t['pickle.loads']:.2f}", f"{t['joblib.load']:.2f}",
                     f"{load_ratio:.2f} ({min(ratios):.2f}–{max(ratios):.2f})", same, met])
    lines += _common.markdown_table(
        ["estimator", "weights", "model file kB", "pickle kB", "joblib kB", "size ÷ pickle", "load ms",
         "pickle.loads ms", "joblib.load ms", "load ÷ pickle (per-round range)", "bit for bit", "targets met"],
        rows, "lrrrrrrrrrll")
    lines += ["", "Save times (one call, ms): " + "; ".join(
        f"{c['name']}: {c['save_ms']['glas_sklearn.save']:.1f} (pickle {c['save_ms']['pickle.dumps']:.1f})"
        for c in payload["cases"]) + ".", ""]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="2 rounds of 5 loads")
    p.add_argument("--rounds", type=int, default=None, help="rounds of loads (default 7; quick 2)")
    p.add_argument("--repeats", type=int, default=None, help="loads per loader per round (default 20; quick 5)")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 7)
    args.repeats = args.repeats or (5 if args.quick else 20)
    json_path, md_path = _common.output_paths(args, STEM)
    if args.report_only:
        print(_common.report_from_results(json_path, md_path, render)[1])
        return
    torch.set_num_threads(args.threads)
    results = {**_common.new_results(args), "cases": [measure(name, args.rounds, args.repeats) for name in CASES]}
    _, text = _common.write_results_and_report(json_path, md_path, results, render,
                                               command=_common.command_line(__file__, argv))
    print(text)


if __name__ == "__main__":
    main()
