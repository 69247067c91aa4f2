"""Command-line interface: ``glas-sklearn demo`` (the default regressor on the shipped data) and
``glas-sklearn demo --paper`` (the paper's two-scaling study)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import warnings
from pathlib import Path

__all__ = ["main"]


def _pyplot_and_output_dir(args):
    """matplotlib's pyplot on the Agg backend and the created ``--output-dir``; (None, None) with a note when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib is not installed, so no plot: pip install 'glas-sklearn[plot]')")
        return None, None
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return plt, out


def _noise_model(reg) -> str:
    """Which noise model ``likelihood="auto"`` kept, and the cross-fitted evidence, in words."""
    support = getattr(reg, "likelihood_support_", None)
    varying = reg.likelihood_.noise_per_row
    kind = "a noise level that varies with the input" if varying else "one noise level for every input"
    if not support or not math.isfinite(support.get("nll_gain", math.nan)):
        return kind
    verdict = "support" if varying else "did not support"
    gain, se = support["nll_gain"], support["nll_gain_se"]
    return (f"{kind} (the training residuals {verdict} a varying one: with it, cross-fitted, their negative "
            f"log-likelihood is {'lower' if gain > 0 else 'higher'} by {abs(gain):.3f} ± {se:.3f} per row)")


def _interval_kind(reg) -> str:
    """How the fitted calibrator makes the intervals, in words."""
    edges = getattr(reg.calibrator_, "edges_", None)
    if edges is not None:
        bands = max(len(e) + 1 for e in edges)
        per = f"one quantile for each of {bands} bands of the predicted std" if bands > 1 else "one quantile"
        return f"conformal intervals ({per}, calibration={reg.calibration!r})"
    return f"intervals calibrated by calibration={reg.calibration!r}"


def _demo(args) -> int:
    """The main job: the default regressor on the shipped concrete data, its intervals, their coverage on
    held-out rows, and a plot."""
    import numpy as np
    import pandas as pd
    from sklearn.model_selection import train_test_split

    from . import LaplaceActiveSubspaceRegressor, LowRank, Training, load_concrete
    from .metrics import coverage_score, mean_width_score

    X, y = load_concrete(as_frame=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=args.seed)
    levels = sorted({0.5, args.level})
    size = dict(training=Training(max_epochs=30), posterior=LowRank(max_components=10)) if args.quick else {}
    print(f"UCI concrete: {len(X)} rows, {X.shape[1]} features, target {y.name} in MPa; "
          f"{len(X_train)} rows to fit, {len(X_test)} held out to test.")
    settings = "".join(f"{k}={v!r}, " for k, v in size.items())
    print(f"Fitting LaplaceActiveSubspaceRegressor({settings}y_bounds=(0, None), random_state={args.seed}): a strength "
          "is never negative, so the intervals stop at 0.")
    if not args.quiet:
        print("The fit trains a small network for the mean strength, then models how the noise around it varies "
              "with the mix and keeps that model only where the training rows support it over one noise level; then "
              "it measures how uncertain the network's weights are and calibrates the intervals on rows it never "
              "trained on. Each step logs a line:", flush=True)
    t0 = time.perf_counter()
    reg = LaplaceActiveSubspaceRegressor(confidence_level=args.level, random_state=args.seed, y_bounds=(0, None),
                                         verbose=0 if args.quiet else 1, **size)
    reg.fit(X_train, y_train)
    wall = time.perf_counter() - t0
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in reg.timings_.items() if k != "total")
    cal = reg.calibration_.iloc[0]
    print(f"\nfitted in {wall:.1f} s ({stages}):\n"
          f"  a tanh MLP with {reg.n_weights_} weights, trained on {len(reg.train_indices_)} rows, "
          f"{_noise_model(reg)};\n"
          f"  the Laplace posterior on its top d = {reg.n_components_} curvature directions, "
          f"prior scale sigma0 = {reg.sigma0_:.3g};\n"
          f"  {_interval_kind(reg)}, calibrated on the other {len(reg.calibration_indices_)} rows "
          f"(coverage there {cal['coverage']:.1%} at {cal['level']:.0%}).")

    y_pred, y_pis = reg.predict_interval(X_test, confidence_level=levels)
    top = levels.index(args.level)
    rows = pd.DataFrame({"y (MPa)": y_test.to_numpy(), "prediction": y_pred,
                         "lower": y_pis[:, 0, top], "upper": y_pis[:, 1, top]})
    rows["inside"] = (rows["lower"] <= rows["y (MPa)"]) & (rows["y (MPa)"] <= rows["upper"])
    print(f"\n{args.level:.0%} intervals on the first {args.rows} held-out rows:")
    with pd.option_context("display.float_format", "{:.1f}".format, "display.width", 100):
        print(rows.head(args.rows).to_string(index=False))
    coverage, width = coverage_score(y_test, y_pis), mean_width_score(y_pis)
    rmse = float(np.sqrt(np.mean((y_pred - y_test.to_numpy()) ** 2)))
    print(f"\nOn all {len(X_test)} held-out rows (RMSE of the predictions {rmse:.2f} MPa):")
    for k, level in enumerate(levels):
        print(f"  {level:.0%} intervals: coverage {coverage[k]:.1%}, mean width {width[k]:.1f} MPa")

    plt, out = _pyplot_and_output_dir(args)
    if plt is None:
        return 0
    from .plotting import plot_intervals

    fig, ax = plt.subplots(figsize=(6, 5))
    plot_intervals(reg, X_test, y_test, ax=ax, confidence_level=args.level)
    ax.set_xlabel("predicted compressive strength (MPa)")
    ax.set_ylabel("observed compressive strength (MPa)")
    ax.set_title(f"concrete, {len(X_test)} held-out rows: {coverage[top]:.1%} inside their {args.level:.0%} "
                 "intervals", fontsize="medium")
    fig.tight_layout()
    path = out / "intervals.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"\nplot: {path.resolve()}")
    print("The paper's study (its method at both posterior scalings): glas-sklearn demo --paper (make paper-demo).")
    return 0


def _paper_demo(args) -> int:
    """The paper's study on the shipped concrete data: both posterior scalings under the paper's method
    (``calibration="coverage", posterior="subspace"``), compared in a table and two figures."""
    import numpy as np
    import pandas as pd
    from sklearn.model_selection import train_test_split

    from . import LaplaceActiveSubspaceRegressor, Subspace, Training, load_concrete
    from .calibration import CalibrationWarning
    from .metrics import coverage_score, mean_width_score

    X, y = load_concrete(as_frame=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=args.seed)
    print(f"UCI concrete: {len(X_train)} training rows (10 % of them held out to choose d), "
          f"{len(X_test)} test rows, target in MPa.")
    rows, fitted = [], {}
    for scaling in ("mean", "standard"):
        t0 = time.perf_counter()
        size = dict(training=Training(max_epochs=30)) if args.quick else {}
        # the paper's method (d chosen by coverage); the estimator's defaults are low-rank + Mondrian conformal
        posterior = Subspace(max_components=10 if args.quick else 50, n_samples=args.n_samples)
        reg = LaplaceActiveSubspaceRegressor(scaling=scaling, confidence_level=args.level,
                                             calibration="coverage", posterior=posterior, random_state=args.seed,
                                             verbose=0 if args.quiet else 1, **size)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CalibrationWarning)
            reg.fit(X_train, y_train)
        y_pred, y_pis = reg.predict_interval(X_test)
        wall = time.perf_counter() - t0
        cal = reg.calibration_.set_index("d").loc[reg.n_components_]
        rows.append({
            "scaling": scaling,
            "d": reg.n_components_,
            "sigma0": reg.sigma0_,
            "cal. coverage": cal["coverage"],
            "test coverage": coverage_score(y_test, y_pis)[0],
            "mean width (MPa)": mean_width_score(y_pis)[0],
            "RMSE (MPa)": float(np.sqrt(np.mean((y_pred - y_test.to_numpy()) ** 2))),
            "wall s": wall,
            "reached": bool(reg.calibration_reached_) and not any(
                issubclass(w.category, CalibrationWarning) for w in caught),
        })
        fitted[scaling] = reg
    table = pd.DataFrame(rows).set_index("scaling")
    print(f"\n{100 * args.level:.0f} % intervals (noise σ from the {fitted['mean'].noise_source_} residuals: "
          f"{fitted['mean'].noise_std_:.2f} MPa)")
    with pd.option_context("display.float_format", "{:.3f}".format, "display.width", 120):
        print(table.to_string())
    std = fitted["standard"]
    if not table.loc["standard", "reached"]:
        print(f"\nstandard scaling (β = N/σ²) contracts the posterior: even d = {std.n_components_} covers only "
              f"{table.loc['standard', 'cal. coverage']:.0%} of the calibration rows; mean scaling (β = 1/σ²) "
              f"needs d = {table.loc['mean', 'd']}.")
    plt, out = _pyplot_and_output_dir(args)
    if plt is None:
        return 0
    from .plotting import plot_calibration, plot_intervals

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, scaling in zip(axes, ("mean", "standard"), strict=True):
        plot_calibration(fitted[scaling], ax=ax)
        ax.set_title(f"{scaling} scaling")
    fig.tight_layout()
    fig.savefig(out / "coverage_vs_d.png", dpi=120)
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, scaling in zip(axes, ("mean", "standard"), strict=True):
        plot_intervals(fitted[scaling], X_test, y_test, ax=ax)
        ax.set_title(f"{scaling} scaling, test rows")
    fig.tight_layout()
    fig.savefig(out / "parity_intervals.png", dpi=120)
    print(f"\nplots: {out / 'coverage_vs_d.png'}, {out / 'parity_intervals.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``glas-sklearn`` command."""
    parser = argparse.ArgumentParser(prog="glas-sklearn", description="Generalized Laplace active subspaces.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the default regressor on the shipped concrete data: intervals, coverage, "
                                       "a plot; --paper: the paper's study of both posterior scalings")
    demo.add_argument("--paper", action="store_true",
                      help="the paper's method (d chosen by coverage) at both posterior scalings, compared")
    demo.add_argument("--level", type=float, default=0.9, help="interval confidence level (default 0.9)")
    demo.add_argument("--n-samples", type=int, default=1000, help="posterior samples of --paper (default 1000)")
    demo.add_argument("--seed", type=int, default=0, help="random_state (default 0)")
    demo.add_argument("--output-dir", default="demo_output", help="where plots go (default demo_output/)")
    demo.add_argument("--rows", type=int, default=8, help="held-out rows whose intervals are printed (default 8)")
    demo.add_argument("--quiet", action="store_true", help="no progress output from the fit")
    demo.add_argument("--quick", action="store_true", help="a smoke run: short training, at most 10 directions")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.command == "demo":
        return _paper_demo(args) if args.paper else _demo(args)
    return 1  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
