"""The default regressor's fit time and accuracy: the old default training (500 epochs of 64 rows, no stopping)
against the Gaussian default of early stopping on held-out loss and against today's default (``likelihood="auto"``,
``calibration="mondrian"``), beside MAPIE around HistGradientBoosting.

Data sets
---------
- the four UCI dev sets (concrete, energy, yacht, wine-quality-red) with their standard train/test splits
  (``_common.load_uci``, as ``benchmarks/uci.py``);
- ``concrete_shipped``: ``glas_sklearn.load_concrete()``, split as the README's example
  (``train_test_split(X, y, random_state=split)``, a quarter for testing);
- ``friedman_50k``: ``sklearn.datasets.make_friedman1(n_samples=50_000, noise=1.0, random_state=split)``
  (10 inputs, 5 of them irrelevant), 40,000 training and 10,000 test rows;
- ``friedman16_14k``: ``make_friedman1(n_samples=13_750, n_features=16, noise=1.0, random_state=split)`` (16
  inputs, 11 of them irrelevant), 11,000 training and 2,750 test rows (the size of the held-out table of issue 28);
- ``friedman8_8k``: ``make_friedman1(n_samples=10_192, n_features=8, noise=0.5, random_state=split)``, 8,192
  training and 2,000 test rows (kin8nm's size and width, the table of issue 42's fit-time target);
- ``diabetes``: ``sklearn.datasets.load_diabetes`` (442 rows), and ``friedman1_1500``: ``make_friedman1(n_samples=
  1_500, noise=1.0, random_state=split)``, both split as ``concrete_shipped`` (the small tables of issue 62).

Methods (all at the 90 % level, fitted on the training rows of a split, scored on its test rows)
-------------------------------------------------------------------------------------------------
- ``old_default``: ``LaplaceActiveSubspaceRegressor(max_epochs=500, batch_size=64, early_stopping=False,
  random_state=split)``, the default before early stopping, passed explicitly;
- ``gaussian_default``: ``LaplaceActiveSubspaceRegressor(likelihood="gaussian", calibration="conformal",
  random_state=split)``: the default of the early-stopping rounds, before ``likelihood="auto"`` and
  ``calibration="mondrian"`` (one Gaussian network, one conformal quantile). Its committed rows were measured as
  ``new_default`` while that was the default (plain ``LaplaceActiveSubspaceRegressor(random_state=split)``) and
  renamed when the default changed;
- ``new_default``: ``LaplaceActiveSubspaceRegressor(random_state=split)``, today's default: ``likelihood="auto"``
  trains a network with and one without a variance head and keeps the better by held-out NLL (below 2,000
  training rows both on 80 % of them, then the chosen one again on all: 2–3× the Gaussian's training; from 2,000
  rows on, 2×), ``calibration="mondrian"`` (the conformal quantile within bands of σ̂ from 400 calibration rows,
  one quantile below);
- ``previous_default``: the default of the first early-stopping round, before ``subsample="auto"`` and the fused
  Adam on large data: ``subsample=None`` (its friedman_50k rows come from that round's run, plain Adam; where rerun,
  the fused Adam, which changes nothing but the time, runs);
- ``second_default``: the default of the second round, before ``batch_size="auto"`` / ``lr="auto"`` grew to 1,024
  rows and 3e-3 from 8,192 rows trained on: ``batch_size=200, lr=1e-3`` (what "auto" gave on the two large sets);
- ``full_batch``: the candidate of issue 62 for small tables, ``Training(batch_size=None, lr=1e-2)``: full-batch
  Adam steps at a larger rate (one step an epoch), today's stopping rule otherwise; compared paired with
  ``new_default`` (today's recipe) on the same splits;
- ``short_trial``, ``warm_start``, ``short_warm``, ``batch_128``, ``batch_256``: the step candidates of issue 62,
  each paired with ``new_default``: the trial run (shadow copy) stopped at its best epoch + patience instead of no
  sooner than twice its best; the network started from the trial's best weights and trained on all rows for a
  quarter of the epochs it chose (both patched into ``glas_sklearn.training.fitting`` for the measurement,
  :func:`trial_variant`); both; 128- or 256-row steps at lr 1e-3 × √(rows / 64);
- ``mapie_split_hgb``: MAPIE ``SplitConformalRegressor(HistGradientBoostingRegressor(), prefit=False)``, fitted
  on 90 % of the training rows and conformalised on the other 10 % (the estimator's own ``calibration_size``);
- ``mapie_cqr_hgb``: MAPIE ``ConformalizedQuantileRegressor`` around three HistGradientBoosting quantile
  regressors (0.05, 0.95, 0.5) on the same 90 / 10 rows.

Every method of ours but ``new_default`` is a Gaussian one: it passes ``likelihood="gaussian",
calibration="conformal"`` (what the default was when it was measured; a version without those parameters gets
none).

For each: the wall time of the whole fit and its ratio to ``mapie_split_hgb``'s in the same run (the tabular
alternative; means over the splits both ran), for ours also the optimizer steps of every training of the fit (shadow
copies and cross-validations included) and the time per step (the training loop's seconds ÷ its steps), ``timings_``
(training of the network kept, the other trainings of ``likelihood="auto"``'s choice, curvature, calibration; and
how often the variance head was kept), the epochs run (``n_iter_``), coverage, mean width and interval (Winkler)
score of the test rows. Timed with one torch thread (``--threads 1``; HistGradientBoosting's OpenMP threads are
limited to the same number through threadpoolctl). Results are merged into the JSON by (data set, split, method), so
runs of parts accumulate.

Usage
-----
    python benchmarks/default_fit.py --threads 1                                  # everything (long)
    python benchmarks/default_fit.py --datasets yacht energy --splits 20 --methods new_default
    python benchmarks/default_fit.py --datasets friedman_50k concrete_shipped --splits 1
    python benchmarks/default_fit.py --quick                                      # smoke run, *_quick outputs
    python benchmarks/default_fit.py --report-only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings

import _common
import numpy as np
import torch
from sklearn.datasets import make_friedman1
from sklearn.model_selection import train_test_split

from glas_sklearn import LaplaceActiveSubspaceRegressor, load_concrete
from glas_sklearn.metrics import coverage_score, interval_score, mean_width_score

LEVEL = 0.9
UCI = ["concrete", "energy", "yacht", "wine-quality-red"]
DATASETS = [*UCI, "concrete_shipped", "friedman_50k", "friedman16_14k", "friedman8_8k", "diabetes", "friedman1_1500"]
METHODS = {
    "old_default": "ours, old default (500 epochs of 64 rows, no early stopping)",
    "gaussian_default": "ours, the Gaussian default before likelihood='auto' and calibration='mondrian' (early "
                        "stopping; on large data the curvature on 10,000 rows, fused Adam, 1,024-row steps at lr 3e-3)",
    "new_default": "ours, today's default (as gaussian_default, with likelihood='auto' and calibration='mondrian')",
    "previous_default": "ours, the first early-stopping default (subsample=None)",
    "second_default": "ours, the second-round default (batch_size=200, lr=1e-3 on large data)",
    "early_stopping_on": "ours, early_stopping=True on every set (the first candidate default; small sets too)",
    "full_batch": "ours, today's default with full-batch steps at lr 1e-2 (the candidate of issue 62)",
    "short_trial": "ours, today's default with the trial run (shadow copy) stopped at its best epoch + patience "
                   "(no 2x-best floor)",
    "warm_start": "ours, today's default with the network started from the trial run's best weights and trained "
                  "on all rows for a quarter of the chosen epochs",
    "short_warm": "ours, short_trial and warm_start together",
    "batch_128": "ours, today's default with 128-row steps at lr 1e-3 x sqrt(2)",
    "batch_256": "ours, today's default with 256-row steps at lr 2e-3 (1e-3 x sqrt(4))",
    "mapie_split_hgb": "MAPIE split conformal, HistGradientBoosting",
    "mapie_cqr_hgb": "MAPIE CQR, HistGradientBoosting quantiles",
}
OLD_SETTINGS = {"max_epochs": 500, "batch_size": 64, "early_stopping": False}
GAUSSIAN_SETTINGS = {"likelihood": "gaussian", "calibration": "conformal"}
OURS = ("old_default", "gaussian_default", "new_default", "previous_default", "second_default", "early_stopping_on",
        "full_batch", "short_trial", "warm_start", "short_warm", "batch_128", "batch_256")
#: the issue-62 candidates of fewer steps, each paired with new_default (today's default) on the same splits
STEP_CANDIDATES = ("full_batch", "short_trial", "warm_start", "short_warm", "batch_128", "batch_256")
#: warm_start: the share of the chosen epochs the network trains from the trial run's best weights
WARM_FRACTION = 0.25
#: issue 62: the default's whole fit within this many times the tabular alternative's (MAPIE split conformal)
MAX_RATIO_TO_TABULAR = 10.0
# the targets of issue 28
MAX_RATIO_TO_SPLIT_CONFORMAL, MIN_ROWS_FOR_RATIO = 15.0, 5000
MAX_TRAINING_TO_LAPLACE = 3.0
MAX_SCORE_LOSS, COVERAGE_RANGE = 0.02, (0.89, 0.91)


# ------------------------------------------------------------------------------------------------------- data
def load(name: str, split: int):
    """``X_train, y_train, X_test, y_test`` of split ``split`` of data set ``name``."""
    if name in UCI:
        X, y, train, test = _common.load_uci(_common.data_dir("uci") / name, split)
        return X[train], y[train], X[test], y[test]
    if name == "concrete_shipped":
        X, y = load_concrete()
        return _tts(X, y, split)
    if name == "friedman_50k":
        X, y = make_friedman1(n_samples=50_000, n_features=10, noise=1.0, random_state=split)
        return _tts(X, y, split, test_size=10_000)
    if name == "friedman16_14k":
        X, y = make_friedman1(n_samples=13_750, n_features=16, noise=1.0, random_state=split)
        return _tts(X, y, split, test_size=2_750)
    if name == "diabetes":
        from sklearn.datasets import load_diabetes
        return _tts(*load_diabetes(return_X_y=True), split)
    if name == "friedman1_1500":
        X, y = make_friedman1(n_samples=1_500, noise=1.0, random_state=split)
        return _tts(X, y, split)
    if name == "friedman8_8k":
        X, y = make_friedman1(n_samples=10_192, n_features=8, noise=0.5, random_state=split)
        return _tts(X, y, split, test_size=2_000)
    raise ValueError(f"unknown data set {name!r}; one of {DATASETS}")


def _tts(X, y, seed, test_size=None):
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, random_state=seed, test_size=test_size)
    return X_tr, y_tr, X_te, y_te


def n_splits_of(name: str) -> int:
    return 20 if name in UCI else 3


# ---------------------------------------------------------------------------------------------------- methods
def scores(y, lower, upper) -> dict:
    pis = np.stack([lower, upper], axis=1)
    return {"coverage": float(coverage_score(y, pis)), "width": float(mean_width_score(pis)),
            "interval_score": float(interval_score(y, pis, confidence_level=LEVEL))}


def run_ours(method: str, X, y, X_te, y_te, seed: int) -> dict:
    settings = {**OLD_SETTINGS, **GAUSSIAN_SETTINGS} if method == "old_default" else {}
    if method == "gaussian_default":
        settings = dict(GAUSSIAN_SETTINGS)
    if method == "early_stopping_on":
        settings = {"early_stopping": True, **GAUSSIAN_SETTINGS}
    if method == "previous_default":
        settings = {"subsample": None, **GAUSSIAN_SETTINGS}
    if method == "second_default":  # before batch_size / lr "auto" grew to 1,024 rows / 3e-3 on large data
        settings = {"batch_size": 200, "lr": 1e-3, **GAUSSIAN_SETTINGS}
    if method == "full_batch":
        settings = {"batch_size": None, "lr": 1e-2}
    if method == "batch_128":
        settings = {"batch_size": 128, "lr": 1e-3 * np.sqrt(2.0)}
    if method == "batch_256":
        settings = {"batch_size": 256, "lr": 2e-3}
    if method in ("gaussian_default", "previous_default", "second_default", "early_stopping_on"):
        # the training of their time (the estimator keeps a tenth of X for calibration)
        settings = {**_common.training_before_shadow(len(X) - int(np.ceil(0.1 * len(X)))), **settings}
    est = LaplaceActiveSubspaceRegressor(**_common.grouped(confidence_level=LEVEL, random_state=seed, **settings))
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(), counted_steps() as loop_runs, trial_variant(method):
        warnings.simplefilter("ignore")
        est.fit(X, y)
    fit_s, fit_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    _, pis = est.predict_interval(X_te)
    t = est.timings_
    steps = sum(n for n, _ in loop_runs)
    out = {"fit_s": fit_s, "fit_cpu_s": fit_cpu_s, "steps": steps,
           "ms_per_step": 1e3 * sum(s for _, s in loop_runs) / max(steps, 1),
           "training_s": t.get("training", 0.0), "curvature_s": t["curvature"],
           "calibration_s": t["calibration"],
           "epochs": int(getattr(est, "n_iter_", len(est.training_loss_))),
           **scores(y_te, pis[:, 0, 0], pis[:, 1, 0])}
    if hasattr(est, "best_validation_score_"):
        out["best_validation_score"] = est.best_validation_score_
    support = getattr(est, "likelihood_support_", None)  # likelihood="auto": the choice and its evidence
    if support:
        out["likelihood"] = support["chosen"]
        out["support"] = {k: support[k] for k in ("nll_gain", "nll_gain_se", "n_rows", "rows", "seconds", "folds")
                          if k in support}
    return out


@contextlib.contextmanager
def counted_steps():
    """Inside the block every run of the training loop (``glas_sklearn.training.loop.run``) is recorded in the list
    yielded as (optimizer steps, seconds): the steps of its longest-running network (networks trained together
    take theirs in the same steps)."""
    from glas_sklearn.training import loop
    runs, real = [], loop.run

    def recorded(nets, **kw):
        t0 = time.perf_counter()
        out = real(nets, **kw)
        runs.append((max(r.n_steps for r in out[1]), time.perf_counter() - t0))
        return out

    loop.run = recorded
    try:
        yield runs
    finally:
        loop.run = real


@contextlib.contextmanager
def trial_variant(method: str):
    """Inside the block the shadow copy (the trial run) and the training after it run as ``method`` asks, patched
    into ``glas_sklearn.training.fitting`` for the measurement: ``short_trial`` stops the trial run at its best
    epoch + patience (``SHADOW_PATIENCE_RATIO`` 0 instead of 2); ``warm_start`` starts the network from the trial
    run's best weights (trained on 80 % of the rows) and trains it on all rows for ``WARM_FRACTION`` of the epochs
    the trial chose (at least one); ``short_warm`` both. Other methods: nothing patched."""
    from glas_sklearn.training import fitting
    short, warm = method in ("short_trial", "short_warm"), method in ("warm_start", "short_warm")
    ratio, real = fitting.SHADOW_PATIENCE_RATIO, fitting._train
    trials = []

    def patched(settings, modules, row_sets, decays, *args, **kw):
        if "shadow" in (kw.get("desc") or ""):  # the trial run: its networks (copies) end at their best weights
            trials[:] = [modules]
        elif kw.get("planned") is not None and trials:  # the network trained for the epochs the trial chose
            with torch.no_grad():
                for module, trial in zip(modules, trials.pop(), strict=True):
                    for p, q in zip(module.parameters(), trial.parameters(), strict=True):
                        p.copy_(q)
                    for b, c in zip(module.buffers(), trial.buffers(), strict=True):
                        b.copy_(c)
            kw["max_epochs"] = [max(1, int(np.ceil(WARM_FRACTION * e))) for e in kw["max_epochs"]]
        return real(settings, modules, row_sets, decays, *args, **kw)

    if short:
        fitting.SHADOW_PATIENCE_RATIO = 0.0
    if warm:
        fitting._train = patched
    try:
        yield
    finally:
        fitting.SHADOW_PATIENCE_RATIO, fitting._train = ratio, real


def _calibration_split(X, y, seed):
    """90 % to fit, 10 % to conformalise (the estimator's default calibration_size)."""
    return train_test_split(X, y, test_size=0.1, random_state=seed)


def run_mapie_split(X, y, X_te, y_te, seed: int) -> dict:
    from mapie.regression import SplitConformalRegressor
    from sklearn.ensemble import HistGradientBoostingRegressor
    t0, c0 = time.perf_counter(), time.process_time()
    X_fit, X_cal, y_fit, y_cal = _calibration_split(X, y, seed)
    scr = SplitConformalRegressor(HistGradientBoostingRegressor(random_state=seed), confidence_level=LEVEL,
                                  prefit=False)
    scr.fit(X_fit, y_fit)
    scr.conformalize(X_cal, y_cal)
    fit_s, fit_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    _, pis = scr.predict_interval(X_te)
    return {"fit_s": fit_s, "fit_cpu_s": fit_cpu_s, **scores(y_te, pis[:, 0, 0], pis[:, 1, 0])}


def run_mapie_cqr(X, y, X_te, y_te, seed: int) -> dict:
    from mapie.regression import ConformalizedQuantileRegressor
    from sklearn.ensemble import HistGradientBoostingRegressor
    t0, c0 = time.perf_counter(), time.process_time()
    X_fit, X_cal, y_fit, y_cal = _calibration_split(X, y, seed)
    ests = [HistGradientBoostingRegressor(loss="quantile", quantile=q, random_state=seed).fit(X_fit, y_fit)
            for q in (0.05, 0.95, 0.5)]
    cqr = ConformalizedQuantileRegressor(ests, confidence_level=LEVEL, prefit=True)
    cqr.conformalize(X_cal, y_cal)
    fit_s, fit_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    _, pis = cqr.predict_interval(X_te)
    lo, hi = np.minimum(pis[:, 0, 0], pis[:, 1, 0]), np.maximum(pis[:, 0, 0], pis[:, 1, 0])
    return {"fit_s": fit_s, "fit_cpu_s": fit_cpu_s, **scores(y_te, lo, hi)}


def run(method: str, X, y, X_te, y_te, seed: int) -> dict:
    if method in OURS:
        return run_ours(method, X, y, X_te, y_te, seed)
    if method == "mapie_split_hgb":
        return run_mapie_split(X, y, X_te, y_te, seed)
    return run_mapie_cqr(X, y, X_te, y_te, seed)


# ----------------------------------------------------------------------------------------------------- report
def _mean(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else float("nan")


def _row_values(row: dict) -> dict:
    """The numbers of one fit, with ``choice_s`` and ``variance_head`` (1 when σ(x) was kept) where the fit chose a
    likelihood. ``choice_s``: the noise stage's model and cross-fitted test (its ``likelihood_support_["seconds"]``,
    rows with ``folds``), or, for the two-network choice measured before it, the trainings beyond the network
    kept (those seconds less ``timings_["training"]``)."""
    out = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "support" in row:
        stage = "folds" in row["support"]
        out["choice_s"] = row["support"]["seconds"] - (0.0 if stage else row.get("training_s", 0.0))
        out["variance_head"] = float(row.get("likelihood") == "heteroscedastic")
    return out


# (key, method, reference): paired interval-score comparisons on the splits both were run on
PAIRS = [("paired_gaussian_default", "gaussian_default", "old_default"),
         ("paired_early_stopping_on", "early_stopping_on", "old_default"),
         ("paired_new_vs_gaussian", "new_default", "gaussian_default"),
         ("paired_previous", "gaussian_default", "previous_default"),
         ("paired_second", "gaussian_default", "second_default"),
         *[(f"paired_{m}", m, "new_default") for m in STEP_CANDIDATES]]


def summarise(results: dict) -> dict:
    """Per data set and method: means over the splits run, and the paired comparisons of :data:`PAIRS`."""
    out = {}
    for name, per_split in results.items():
        entry = {}
        for method in METHODS:
            rows = [_row_values(s[method]) for s in per_split.values() if method in s]
            if rows:
                entry[method] = {k: _mean(rows, k) for k in rows[0] if all(k in r for r in rows)}  # in every split
                entry[method]["n_splits"] = len(rows)
                both = [s for s in per_split.values() if method in s and "mapie_split_hgb" in s]
                if method in OURS and both:  # the tabular alternative fitted in the same run, on the same splits
                    for key in ("fit_s", "fit_cpu_s"):
                        if all(key in s[m] for s in both for m in (method, "mapie_split_hgb")):
                            entry[method][f"{key}_ratio"] = float(np.mean([s[method][key] for s in both])
                                                                  / np.mean([s["mapie_split_hgb"][key] for s in both]))
        for key, method, ref in PAIRS:
            both = [s for s in per_split.values() if ref in s and method in s]
            if both:
                new_scores = [s[method]["interval_score"] for s in both]
                ref_scores = [s[ref]["interval_score"] for s in both]
                entry[key] = {
                    "method": method, "reference": ref, "n_splits": len(both),
                    "interval_score_ratio": float(np.mean(new_scores) / np.mean(ref_scores)),
                    "per_split_ratio_median": float(np.median(np.divide(new_scores, ref_scores))),
                    "identical_splits": int(sum(a == b for a, b in zip(new_scores, ref_scores, strict=True)))}
        out[name] = entry
    return out


def render(payload: dict) -> str:
    summary = summarise(payload["results"])
    lines = ["# Default fit: early stopping against 500 fixed epochs, and today's default (likelihood=\"auto\", "
             "calibration=\"mondrian\"), beside MAPIE around HistGradientBoosting", "",
             f"Command: `{payload['command']}` (and the commands listed under *runs*); "
             f"{_common.machine_line(payload['machine'])}. All timings with one torch thread "
             "(HistGradientBoosting limited to one OpenMP thread too): wall seconds of `fit`, and the CPU seconds of "
             "the process during it (`time.process_time`; with one thread, the wall time an idle core would take: "
             "the machine was shared with other jobs, which inflate wall times, not CPU times).", "",
             "Interval score (Winkler, lower is better) and coverage of 90 % intervals on the test rows, means over "
             "the splits run. Our fit time is split into training / choice (`likelihood=\"auto\"`: the noise model "
             "and its cross-fitted test; in rows measured before the noise stage, the other network's training) / "
             "curvature / calibration (`timings_`); *head*: the share of the splits on which `likelihood=\"auto\"` "
             "kept σ(x). `new_default` is today's default (one mean network, then the noise stage); "
             "`gaussian_default` the Gaussian default before it (rows measured as `new_default` then).", ""]
    header = ["data set", "method", "splits", "fit (s)", "fit CPU (s)", "÷ tabular", "÷ tabular CPU", "steps",
              "ms / step", "training",
              "choice", "curvature", "calibration", "epochs", "head", "coverage (%)", "interval score", "width"]
    rows = []
    for name, entry in summary.items():
        for method in METHODS:
            if method not in entry:
                continue
            e = entry[method]

            def f(k, d=2, e=e):
                return "–" if k not in e or not np.isfinite(e[k]) else f"{e[k]:.{d}f}"
            head = "–" if "variance_head" not in e else f"{100 * e['variance_head']:.0f} %"
            ratio, ratio_cpu = ("–" if f"{k}_ratio" not in e else f"{e[f'{k}_ratio']:.1f}×" for k in ("fit_s",
                                                                                                     "fit_cpu_s"))
            rows.append([name, method, int(e["n_splits"]), f("fit_s"), f("fit_cpu_s"), ratio, ratio_cpu, f("steps", 0),
                         f("ms_per_step", 3), f("training_s"),
                         f("choice_s"), f("curvature_s"), f("calibration_s"), f("epochs", 0), head,
                         f"{100 * e['coverage']:.1f}", f("interval_score", 3), f("width", 3)])
    lines += _common.markdown_table(header, rows, "llrrrrrrrrrrrrrrrr")
    lines += ["", "## Targets", "",
              "The fit-time ratios are those of today's default against the MAPIE rows of the same runs; the "
              "paired ratios compare interval scores on the splits both methods were run on.", ""]
    checks = []
    for name, entry in summary.items():
        new, split_c = entry.get("new_default"), entry.get("mapie_split_hgb")
        n_rows = payload.get("n_rows", {}).get(name, 0)
        if new and split_c and n_rows >= MIN_ROWS_FOR_RATIO:
            for key, what in (("fit_s", "wall"), ("fit_cpu_s", "CPU")):
                if np.isfinite(new.get(key, np.nan)) and np.isfinite(split_c.get(key, np.nan)):
                    r = new[key] / split_c[key]
                    target = f"new_default fit time / MAPIE split conformal ≤ {MAX_RATIO_TO_SPLIT_CONFORMAL:g} ({what})"
                    checks.append([name, target,
                                   f"{r:.1f}", "met" if r <= MAX_RATIO_TO_SPLIT_CONFORMAL else "missed"])
        for method in ("new_default", *STEP_CANDIDATES):
            e = entry.get(method)
            for key, what in (("fit_s_ratio", "wall"), ("fit_cpu_s_ratio", "CPU")):
                if e and key in e:
                    r = e[key]
                    checks.append([name, f"{method} fit time / MAPIE split conformal ≤ {MAX_RATIO_TO_TABULAR:g} "
                                         f"({what}, same run, {int(e['n_splits'])} splits)", f"{r:.1f}",
                                   "met" if r <= MAX_RATIO_TO_TABULAR else "missed"])
        for method in ("gaussian_default", "new_default"):
            e = entry.get(method)
            if e and n_rows >= 40_000:
                laplace = e["curvature_s"] + e["calibration_s"]
                training = e["training_s"] + (e.get("choice_s", 0.0) if np.isfinite(e.get("choice_s", 0.0)) else 0.0)
                r = training / laplace
                what = " and noise stage" if "choice_s" in e else ""
                checks.append([name, f"{method} training{what} / (curvature + calibration) ≤ "
                                     f"{MAX_TRAINING_TO_LAPLACE:g}",
                               f"{r:.2f}", "met" if r <= MAX_TRAINING_TO_LAPLACE else "missed"])
        for key, method, ref in PAIRS:
            p = entry.get(key)
            if not p or (ref == "old_default" and name not in UCI):
                continue
            what = f"{method} (the rejected candidate)" if method == "early_stopping_on" else method
            identical = f", {p['identical_splits']} identical" if p["identical_splits"] else ""
            r = p["interval_score_ratio"]
            checks.append([name, f"interval score {what} / {ref} ≤ {1 + MAX_SCORE_LOSS:g} ({p['n_splits']} paired "
                                 f"splits{identical})",
                           f"{r:.3f} (median per split {p['per_split_ratio_median']:.3f})",
                           "met" if r <= 1 + MAX_SCORE_LOSS else "missed"])
        for method in ("gaussian_default", "new_default", *STEP_CANDIDATES):
            e = entry.get(method)
            if e and name in UCI:
                c = e["coverage"]
                checks.append([name, f"{method} coverage in {COVERAGE_RANGE[0]:.0%}–{COVERAGE_RANGE[1]:.0%} "
                                     f"({int(e['n_splits'])} splits)", f"{100 * c:.1f} %",
                               "met" if COVERAGE_RANGE[0] <= c <= COVERAGE_RANGE[1] else "missed"])
    lines += _common.markdown_table(["data set", "target", "measured", ""], checks)
    lines += ["", "Rows per data set (training + test): "
              + ", ".join(f"{k} {v}" for k, v in payload.get("n_rows", {}).items()) + ".", "",
              "## Runs", ""] + [f"- `{c}`" for c in payload.get("runs", [])] + ["", _common.DISCUSSION_MARK, ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- main
def merge(json_path, md_path, parts) -> None:
    """The results of the runs in ``parts`` (JSON files of tagged runs, run in parallel) merged into ``json_path``
    (a later part wins for the same data set, split and method); the machine recorded is the first part's."""
    base = json.loads(json_path.read_text()) if json_path.exists() else {}
    results, n_rows, runs = base.get("results", {}), base.get("n_rows", {}), base.get("runs", [])
    machine, command = base.get("machine"), base.get("command")
    for part in parts:
        data = json.loads(part.read_text())
        for name, per_split in data["results"].items():
            for split, methods in per_split.items():
                results.setdefault(name, {}).setdefault(split, {}).update(methods)
        n_rows.update(data["n_rows"])
        runs += [r for r in data["runs"] if r not in runs]
        machine, command = machine or data["machine"], command or data["command"]
    payload = {"command": command, "machine": machine, "results": results, "n_rows": n_rows, "runs": runs}
    json_path.write_text(json.dumps(payload, indent=1) + "\n")
    _common.write_report(md_path, render(payload))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_arguments(parser, threads=1)
    parser.add_argument("--datasets", nargs="+", default=DATASETS, choices=DATASETS)
    parser.add_argument("--splits", type=int, nargs="+", default=None,
                        help="one number k: splits 0..k-1; several: those splits (default: 20 UCI, 3 others)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--tag", default="", help="write default_fit_TAG.json/.md instead")
    parser.add_argument("--merge", nargs="+", default=None, metavar="TAG",
                        help="no computation: merge the results of default_fit_TAG.json into default_fit.json")
    cfg = parser.parse_args(argv)
    stem = "default_fit" + ("_quick" if cfg.quick else "") + (f"_{cfg.tag}" if cfg.tag else "")
    json_path, md_path = cfg.out_dir / f"{stem}.json", cfg.out_dir / f"{stem}.md"
    if cfg.report_only:
        _common.report_from_results(json_path, md_path, render)
        return
    if cfg.merge:
        merge(json_path, md_path, [cfg.out_dir / f"default_fit_{t}.json" for t in cfg.merge])
        return
    torch.set_num_threads(cfg.threads)
    from threadpoolctl import threadpool_limits
    threadpool_limits(cfg.threads)
    previous = json.loads(json_path.read_text()) if json_path.exists() else {}
    results, n_rows = previous.get("results", {}), previous.get("n_rows", {})
    runs = previous.get("runs", [])
    command = _common.command_line(__file__, argv)
    runs.append(command)
    datasets = ["yacht"] if cfg.quick else cfg.datasets
    for name in datasets:
        if cfg.splits is None:
            splits = range(1 if cfg.quick else n_splits_of(name))
        elif len(cfg.splits) == 1:
            splits = range(cfg.splits[0])
        else:
            splits = cfg.splits
        for split in splits:
            X, y, X_te, y_te = load(name, split)
            n_rows[name] = len(X) + len(X_te)
            for method in cfg.methods:
                res = run(method, X, y, X_te, y_te, split)
                results.setdefault(name, {}).setdefault(str(split), {})[method] = res
                print(f"[default_fit] {name} split {split} {method}: fit {res['fit_s']:.2f} s"
                      + (f" (training {res['training_s']:.2f}, epochs {res['epochs']})" if "epochs" in res else "")
                      + f", coverage {res['coverage']:.3f}, interval score {res['interval_score']:.4f}"
                      + (f", likelihood {res['likelihood']} ({res['support']})" if "likelihood" in res else ""),
                      flush=True)
                _common.write_results_and_report(json_path, md_path, {"results": results, "n_rows": n_rows,
                                                                      "runs": runs}, render, command=command)
    print(render(json.loads(json_path.read_text())))


if __name__ == "__main__":
    main()
