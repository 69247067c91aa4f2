"""The paper's UCI concrete study (§2.3, Fig. 6-8), with training-residual and held-out noise estimates.

Setup (as in the paper, details the paper leaves open marked *):
- UCI concrete (1030 rows, 8 inputs, embedded in the package), a random 90 % / 10 % train / calibration split
  (fixed seed*), inputs and target standardized with the training part's mean and std*.
- tanh MLP 8-1000-1000-1 (D = 1,011,001 weights), Adam lr 1e-3, 3000 full-batch steps* on the mean ½-squared loss.
- Noise σ² from the training residuals (the paper's choice) and, as a second run, from the calibration residuals.
- K = 50 eigenpairs of the GGN, computed ONCE; all (noise × scaling × predictive) posteriors reuse them:
  only β changes (mean scaling β = 1/σ², standard β = N/σ²), and σ0 is refitted by empirical Bayes per d.
- Coverage of the calibration data for d = 1..50: sampled Laplace (1000 samples, 90 % central intervals) and
  linearised Laplace (f ± 2σ_f, i.e. a 95.45 % Gaussian interval); the chosen d is the smallest reaching the level.
- Parity plots with 90 % sampled intervals (Fig. 7), cumulative activity (Fig. 8) and the activity share of the
  top 1000 weights (0.1 %), spectrum / contraction ratios.

The first stage runs the public estimator (``LaplaceActiveSubspaceRegressor(prefit=True)`` on the trained
network, mean scaling, training-residual noise, sampled, ``n_components="auto"``): it computes the eigenpairs and
chooses d exactly as a user would; its calibration table is checked against the lower-level curve.

Usage::

    python benchmarks/paper_concrete.py [--threads 1] [--cache-dir DIR] [--n-samples 1000] [--sampled-budget 3600]
    python benchmarks/paper_concrete.py --report-only     # markdown + Fig. 6/7 again from the JSON
    python benchmarks/paper_concrete.py --quick           # a small smoke run (≈ 20 s)

Writes ``benchmarks/results/paper_concrete.json``, the report ``paper_concrete.md`` rendered from it and
``paper_concrete_*.png`` (``--quick``: a small smoke run written to ``paper_concrete_quick*``; ``--out-dir``:
another folder). Text after the line ``<!-- discussion -->`` in an existing report is kept when it is rewritten.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

import _common
import numpy as np
import pandas as pd
import torch

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Subspace, coverage_score
from glas_sklearn.calibration import CalibrationResult, CalibrationWarning, choose_dimension
from glas_sklearn.datasets import load_concrete
from glas_sklearn.likelihoods import Gaussian
from glas_sklearn.plotting import plot_activity, plot_calibration, plot_spectrum
from glas_sklearn.posterior import ActiveSubspacePosterior, estimate_noise_variance
from glas_sklearn.predictive import sampled_interval

SAMPLED_LEVEL = 0.9
LINEAR_LEVEL = float(math.erf(2 / math.sqrt(2)))  # ±2σ_f, the paper's "95 %" = 0.9545
TOP_WEIGHTS = 1000
PAPER = {  # §2.3
    ("mean", "sampled"): "d = 3 (90 %)",
    ("mean", "linearized"): "d = 4 (95 %)",
    ("standard", "sampled"): "not reached, ≈60 % at d = 50",
    ("standard", "linearized"): "not reached (stagnates)",
}


# ----------------------------------------------------------------------------- stages


def split_data(seed: int, cal_fraction: float = 0.1):
    X, y = load_concrete()
    perm = np.random.default_rng(seed).permutation(len(X))
    n_cal = int(round(cal_fraction * len(X)))
    cal, train = perm[:n_cal], perm[n_cal:]
    x_mean, x_std = X[train].mean(0), X[train].std(0)
    y_mean, y_std = float(y[train].mean()), float(y[train].std())
    std = {"x_mean": x_mean, "x_std": x_std, "y_mean": y_mean, "y_std": y_std}
    Xs, ys = (X - x_mean) / x_std, (y - y_mean) / y_std
    return (Xs[train], ys[train]), (Xs[cal], ys[cal]), std


def curve_rows(table: pd.DataFrame, y_std: float) -> list[dict]:
    """A calibration table (d, coverage, mean_width, sigma0) as JSON rows, widths in MPa."""
    return [{"d": int(r.d), "coverage": float(r.coverage), "mean_width_mpa": float(r.mean_width) * y_std,
             "sigma0": float(r.sigma0)} for r in table.itertuples()]


def sampled_parity(post: ActiveSubspacePosterior, Xc: torch.Tensor, yc: np.ndarray, d: int, n_samples: int,
                   seed: int, std: dict) -> dict:
    """Sampled predictive mean and 90 % interval on the calibration data, in MPa."""
    samples = post.predict_samples(Xc, d, n_samples=n_samples, random_state=seed)
    mean, bounds = sampled_interval(samples, SAMPLED_LEVEL)
    y = torch.as_tensor(yc, dtype=samples.dtype)  # compared in the samples' precision
    cov = coverage_score(y.numpy(), bounds[:, 0, :, 0].detach().numpy())
    to_mpa = lambda t: t.detach().double().numpy().reshape(-1) * std["y_std"] + std["y_mean"]  # noqa: E731
    return {"d": d, "pred": to_mpa(mean[:, 0]), "lo": to_mpa(bounds[:, 0, 0, 0]), "hi": to_mpa(bounds[:, 0, 1, 0]),
            "y": yc * std["y_std"] + std["y_mean"], "coverage": cov}


def draw_parity(ax, p: dict, title: str) -> None:
    """Parity plot in the style of glas_sklearn.plotting.plot_intervals, from precomputed intervals."""
    ax.vlines(p["pred"], p["lo"], p["hi"], color="tab:blue", alpha=0.45, lw=1.2, label="90 % interval")
    ax.scatter(p["pred"], p["y"], s=10, color="k", zorder=3, label="calibration data")
    both = np.concatenate([p["pred"], p["y"], p["lo"], p["hi"]])
    lims = (float(both.min()), float(both.max()))
    ax.plot(lims, lims, color="0.5", ls="--", lw=1.0, label="y = prediction")
    ax.set_xlabel("predicted mean strength (MPa)")
    ax.set_ylabel("observed strength (MPa)")
    ax.set_title(f"{title}\nd = {p['d']}: {p['coverage']:.1%} of {len(p['y'])} inside", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")


def as_result(part: dict, y_std: float) -> CalibrationResult:
    """A CalibrationResult rebuilt from a curve stored in the JSON (for plot_calibration)."""
    table = pd.DataFrame({"d": [r["d"] for r in part["curve"]], "coverage": [r["coverage"] for r in part["curve"]],
                          "mean_width": [r["mean_width_mpa"] / y_std for r in part["curve"]],
                          "sigma0": [r["sigma0"] for r in part["curve"]]})
    return CalibrationResult(n_components=part["d"], sigma0=part["sigma0"], reached=part["reached"], table=table,
                             coverage=part["coverage"], confidence_level=part["level"])


def coverage_figure(R: dict, path: Path) -> None:
    """Paper Fig. 6: coverage vs d, both scalings per panel; rows = noise estimate, columns = predictive."""
    plt = _common.pyplot()
    y_std = R["config"]["y_std_mpa"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.8), layout="constrained", sharex=True)
    for i, noise_name in enumerate(("training residuals", "calibration residuals")):
        for j, (pred, title) in enumerate((("sampled", "sampled, 90 % intervals"),
                                           ("linearized", "linearised, f ± 2σ_f"))):
            ax = axes[i, j]
            for run in R["runs"]:
                if run["noise"] == noise_name:
                    plot_calibration(as_result(run[pred], y_std), ax=ax, label=f"{run['scaling']} scaling")
            est = R["estimator"]
            if pred == "sampled" and noise_name == est["noise"] and est["n_samples"] != R["config"]["n_samples"]:
                plot_calibration(as_result(est, y_std), ax=ax,
                                 label=f"mean scaling, estimator ({est['n_samples']} samples)")
                ax.lines[-2].set_linestyle("--")
            ax.set_title(f"{title}; σ² from {noise_name} ({R['noise'][noise_name]['var']:.4f})",
                         fontsize="medium")
            ax.set_ylim(0, 1.02)
            ax.legend(loc="center right" if i == 0 else "lower right", fontsize="small")
    fig.suptitle("Concrete: coverage of the calibration data vs subspace dimension (paper Fig. 6)")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parity_figure(R: dict, path: Path) -> None:
    """Paper Fig. 7: parity plots with 90 % sampled intervals; rows = noise estimate, columns = scaling."""
    plt = _common.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 9.5), layout="constrained")
    for ax, p in zip(axes.reshape(-1), R["parity"], strict=True):
        p = {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in p.items()}
        draw_parity(ax, p, f"{p['scaling']} scaling, σ² from {p['noise']}")
    fig.suptitle("Concrete: parity plots with 90 % sampled intervals (paper Fig. 7)")
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- report


def fmt_cov(x):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def render(R: dict, prefix: str) -> str:
    """The markdown report from the results JSON alone (its hand-written discussion is kept by write_report)."""
    c, t = R["config"], R["timings_s"]
    L = []
    L.append(f"# The paper's concrete study (§2.3) with glas-sklearn{' — QUICK smoke run' if c['quick'] else ''}\n")
    L.append(f"Command: `{R['command']}` — {_common.machine_line(R['machine'])}; total wall time {t['total']:.0f} s.\n")
    L.append("Setup: UCI concrete (embedded), random 90 % / 10 % split (seed "
             f"{c['seed']}): N = {c['n_train']} training, N_cal = {c['n_cal']} calibration rows; inputs and target "
             f"standardized with the training part's statistics. tanh MLP 8-{c['width']}-{c['width']}-1, "
             f"D = {c['D']:,} weights, Adam lr {c['lr']}, {c['steps']} full-batch steps. K = {c['K']} GGN "
             f"eigenpairs computed once and reused for every posterior below. Sampled Laplace: {c['n_samples']} "
             f"samples, 90 % central intervals; linearised: f ± 2σ_f (a {100 * LINEAR_LEVEL:.2f} % Gaussian "
             "interval). Intervals are for f (parameter uncertainty), as in the paper.\n")
    if R["notes"]:
        L.append("**Notes:** " + " ".join(R["notes"]) + "\n")

    tr = R["training"]
    L.append("## Training and noise\n")
    L.append("| quantity | standardized units | MPa |\n|---|---|---|")
    ys = c["y_std_mpa"]
    L.append(f"| training MSE | {tr['train_mse']:.4f} | RMSE {math.sqrt(tr['train_mse']) * ys:.2f} |")
    L.append(f"| calibration MSE | {tr['cal_mse']:.4f} | RMSE {math.sqrt(tr['cal_mse']) * ys:.2f} |")
    for name, nv in R["noise"].items():
        L.append(f"| noise σ² ({name}) | {nv['var']:.4f} (σ = {math.sqrt(nv['var']):.3f}) | σ = "
                 f"{math.sqrt(nv['var']) * ys:.2f} |")
    L.append(f"\nTraining time {t['training']:.0f} s. Target std {ys:.2f} MPa. Paper: σ² (or σ) ≈ 0.07.\n")

    e = R["eigen"]
    L.append("## Eigenpairs (once)\n")
    L.append(f"Lanczos, K = {c['K']}: {e['n_matvecs']} G v products, converged = {e['converged']}, largest "
             f"relative residual {e['max_rel_residual']:.1e}, λ1 = {e['eigenvalues'][0]:.4g}, "
             f"λ10 = {e['eigenvalues'][min(9, c['K'] - 1)]:.3g}, λ{c['K']} = {e['eigenvalues'][-1]:.3g} "
             f"(standardized units). Wall time {t['eigen']:.0f} s (inside the estimator's fit).\n")

    L.append("## Chosen d and coverage (Fig. 6)\n")
    L.append("| noise σ² | scaling | β | sampled 90 %: d | coverage at d | coverage at d = "
             f"{c['d_max']} | linearised ±2σ_f: d | coverage at d | coverage at d = {c['d_max']} | paper |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for run in R["runs"]:
        s, li = run["sampled"], run["linearized"]
        paper = f"{PAPER[(run['scaling'], 'sampled')]}; lin. {PAPER[(run['scaling'], 'linearized')]}" \
            if run["noise"] == "training residuals" else ""
        L.append(f"| {run['noise']} ({run['noise_var']:.4f}) | {run['scaling']} | {run['beta']:.4g} | "
                 f"{s['d']}{'' if s['reached'] else ' (not reached)'} | {fmt_cov(s['coverage'])} | "
                 f"{fmt_cov(s['curve'][-1]['coverage'])} | {li['d']}{'' if li['reached'] else ' (not reached)'} | "
                 f"{fmt_cov(li['coverage'])} | {fmt_cov(li['curve'][-1]['coverage'])} | {paper} |")
    L.append("")
    L.append("Coverage vs d (every d is in the JSON):\n")
    ds = [d for d in (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 40, 50) if d <= c["d_max"]]
    L.append("| noise | scaling | predictive | " + " | ".join(f"d={d}" for d in ds) + " |")
    L.append("|---|---|---|" + "---|" * len(ds))
    for run in R["runs"]:
        for pred in ("sampled", "linearized"):
            cov = {r["d"]: r["coverage"] for r in run[pred]["curve"]}
            L.append(f"| {run['noise']} | {run['scaling']} | {pred} | "
                     + " | ".join(f"{100 * cov[d]:.0f}" for d in ds) + " |")
    est = R["estimator"]
    if est["n_samples"] != c["n_samples"]:
        cov = {r["d"]: r["coverage"] for r in est["curve"]}
        L.append(f"| {est['noise']} | {est['scaling']} | sampled, estimator with {est['n_samples']} samples "
                 "(the d it evaluated) | "
                 + " | ".join(f"{100 * cov[d]:.0f}" if d in cov else "" for d in ds) + " |")
    L.append("")
    L.append("Mean 90 % interval width (MPa) at the chosen d, sampled: " + "; ".join(
        f"{r['noise']}/{r['scaling']} {r['sampled']['mean_width_mpa']:.2f}" for r in R["runs"]) + ".\n")
    L.append(f"![coverage]({prefix}_coverage.png)\n")

    L.append("## Linearised chosen d for other noise values (cheap sweep, eigenpairs reused)\n")
    L.append("| σ² used in β | meaning | mean: d | coverage | standard: d | coverage |\n|---|---|---|---|---|---|")
    for row in R["noise_sweep"]:
        L.append(f"| {row['noise_var']:.4f} | {row['label']} | {row['mean']['d']}"
                 f"{'' if row['mean']['reached'] else ' (not reached)'} | {fmt_cov(row['mean']['coverage'])} | "
                 f"{row['standard']['d']}{'' if row['standard']['reached'] else ' (not reached)'} | "
                 f"{fmt_cov(row['standard']['coverage'])} |")
    L.append("")

    L.append("## Parity plots, 90 % sampled intervals on the calibration data (Fig. 7)\n")
    L.append("| noise | scaling | d | coverage | RMSE of sampled mean (MPa) | RMSE of f(x; θ0) (MPa) |\n"
             "|---|---|---|---|---|---|")
    for p in R["parity"]:
        L.append(f"| {p['noise']} | {p['scaling']} | {p['d']} | {fmt_cov(p['coverage'])} | {p['rmse_mean']:.2f} | "
                 f"{p['rmse_theta0']:.2f} |")
    L.append(f"\n![parity]({prefix}_parity.png)\n")

    L.append(f"## Activity scores (Fig. 8): share of the top {TOP_WEIGHTS} weights "
             f"({100 * TOP_WEIGHTS / c['D']:.2g} % of D)\n")
    L.append("Activity scores depend on λ and P only (not on β or σ), so they are the same for every run.\n")
    L.append("| d | " + " | ".join(str(k) for k in R["activity"]) + " |")
    L.append("|---|" + "---|" * len(R["activity"]))
    L.append(f"| top-{TOP_WEIGHTS} share | " + " | ".join(fmt_cov(v) for v in R["activity"].values()) + " |")
    L.append("\nPaper: ≈95 % at d = 3.\n")
    L.append(f"![activity]({prefix}_activity.png)\n")
    L.append(f"![spectrum]({prefix}_spectrum.png)\n")

    L.append("## Consistency check: estimator vs lower-level API\n")
    L.append(R["consistency"] + "\n")

    L.append("## Wall time per stage\n")
    L.append("| stage | s |\n|---|---|")
    for k, v in t.items():
        L.append(f"| {k} | {v:.1f} |")
    L.append("")
    L.append(_common.DISCUSSION_MARK + "\n")
    return "\n".join(L)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(ap, quick="small network and sizes: a smoke test of the script")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--n-samples", type=int, default=1000)
    ap.add_argument("--sampled-budget", type=float, default=3600.0,
                    help="seconds allowed for all sampled calibration curves; n_samples is reduced (not below 300) "
                         "when one measured d projects beyond it")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="keep the trained network here and reuse it on the next run")
    args = ap.parse_args(argv)
    prefix = "paper_concrete_quick" if args.quick else "paper_concrete"
    out = args.out_dir
    if args.report_only:  # the report and the figures drawn from the JSON alone (Fig. 6, 7)
        R = _common.read_results(out / f"{prefix}.json")
        coverage_figure(R, out / f"{prefix}_coverage.png")
        parity_figure(R, out / f"{prefix}_parity.png")
    else:
        R = compute(args, argv, out, prefix)
    _common.write_report(out / f"{prefix}.md", render(R, prefix))
    print(f"wrote {out / prefix}.md" if args.report_only else
          f"wrote {out / prefix}.md/.json/_*.png in {R['timings_s']['total']:.0f} s", flush=True)
    return 0


def compute(args, argv, out: Path, prefix: str) -> dict:
    """Train (or load) the network, all posteriors and curves, the figures; writes and returns the results."""
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", CalibrationWarning)  # non-reached levels are reported in the tables
    t_all = time.perf_counter()
    timings, notes = {}, []
    width, steps, K, n_samples = (1000, args.steps, 50, args.n_samples)
    if args.quick:
        width, steps, K, n_samples = 64, min(args.steps, 300), 10, min(args.n_samples, 100)
    d_max = K
    seed = args.seed

    # -- data
    t0 = time.perf_counter()
    (Xtr, ytr), (Xcal, ycal), std = split_data(seed)
    Xt = torch.tensor(Xtr, dtype=torch.float32)
    yt = torch.tensor(ytr[:, None], dtype=torch.float32)
    Xc = torch.tensor(Xcal, dtype=torch.float32)
    yc = torch.tensor(ycal[:, None], dtype=torch.float32)
    timings["data"] = time.perf_counter() - t0

    # -- training
    net = _common.mlp(8, (width, width), seed=seed)
    D = _common.n_weights(net)
    cache = args.cache_dir / f"{prefix}_w{width}_s{steps}_seed{seed}.pt" if args.cache_dir else None
    t0 = time.perf_counter()
    if cache is not None and cache.exists():
        saved = torch.load(cache)
        net.load_state_dict(saved["state"])
        net.eval()
        train_time = saved["train_time"]
        notes.append(f"The trained network was loaded from a cache; its training time ({train_time:.0f} s) is "
                     "the one measured when it was trained.")
        print(f"loaded network from {cache}", flush=True)
    else:
        print(f"training 8-{width}-{width}-1 (D = {D:,}) for {steps} full-batch Adam steps", flush=True)
        _common.train_adam(net, Xt, yt, steps=steps, lr=1e-3, loss=_common.half_mse, log=print,
                           log_every=max(1, steps // 10))
        train_time = time.perf_counter() - t0
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"state": net.state_dict(), "train_time": train_time}, cache)
    timings["training"] = train_time
    with torch.no_grad():
        res_train, res_cal = yt - net(Xt), yc - net(Xc)
    noise = {"training residuals": {"var": estimate_noise_variance(res_train)},
             "calibration residuals": {"var": estimate_noise_variance(res_cal)}}
    training = {"train_mse": noise["training residuals"]["var"], "cal_mse": noise["calibration residuals"]["var"],
                "time_s": train_time}
    print(f"train MSE {training['train_mse']:.4f}, calibration MSE {training['cal_mse']:.4f}", flush=True)

    # -- stage 1: the public estimator (eigenpairs once, mean scaling, training noise, sampled, d = auto)
    t0 = time.perf_counter()
    est = LaplaceActiveSubspaceRegressor(net, prefit=True, scaling="mean", n_components="auto", calibration="coverage",
                                         confidence_level=SAMPLED_LEVEL, noise_std="training", random_state=seed,
                                         posterior=Subspace(max_components=K, predictive="sampled",
                                                            n_samples=n_samples), compute=Compute(device="cpu"))
    est.fit(Xtr, ytr, X_cal=Xcal, y_cal=ycal)
    timings["estimator fit (total)"] = time.perf_counter() - t0
    timings["eigen"] = est.timings_["curvature"]
    timings["estimator calibration (sampled, search)"] = est.timings_["calibration"]
    print(f"estimator: d = {est.n_components_}, eigen {est.timings_['curvature']:.0f} s, "
          f"calibration {est.timings_['calibration']:.0f} s", flush=True)
    lam = torch.as_tensor(est.eigenvalues_, dtype=torch.float64)
    P = est.posterior_.eigenvectors
    N = est.n_records_
    eigen = {"eigenvalues": est.eigenvalues_.tolist(), "n_matvecs": int(est.eigen_info_["n_matvecs"]),
             "converged": bool(est.eigen_info_["converged"]),
             "max_rel_residual": float(np.max(est.eigen_info_["relative_residuals"]))}
    # The seed the estimator handed to choose_dimension, so that the curves below use the same posterior draws and
    # can be compared with its calibration table row by row.
    fit_seed = est.calibration_seed_

    def posterior(scaling: str, noise_var: float) -> ActiveSubspacePosterior:
        return ActiveSubspacePosterior(net, lam, P, beta=Gaussian().beta(scaling, N, noise_var))

    # -- measure one sampled d, reduce the sample count if the full curves would not fit the budget
    probe = posterior("standard", noise["training residuals"]["var"])
    t0 = time.perf_counter()
    probe.predict_samples(Xc, d_max, n_samples=n_samples, random_state=fit_seed)  # timed only
    t_one = time.perf_counter() - t0
    timings["one sampled d (probe)"] = t_one
    n_curves = 4
    projected = t_one * d_max * n_curves
    print(f"one sampled d: {t_one:.1f} s → {projected / 60:.0f} min for {n_curves} curves of {d_max} d", flush=True)
    if projected > args.sampled_budget:
        reduced = max(300, int(n_samples * args.sampled_budget / projected))
        notes.append(f"Sampled calibration was reduced from {n_samples} to {reduced} samples per d: one d took "
                     f"{t_one:.1f} s, so {n_curves} full curves would have taken {projected / 60:.0f} min.")
        n_samples = reduced
    del probe

    # -- the four (noise) × (scaling) posteriors, both predictives, full curves
    runs, posts = [], {}
    for noise_name in ("training residuals", "calibration residuals"):
        nv = noise[noise_name]["var"]
        for scaling in ("mean", "standard"):
            post = posts[(noise_name, scaling)] = posterior(scaling, nv)
            run = {"noise": noise_name, "noise_var": nv, "scaling": scaling, "beta": post.beta}
            for pred, level in (("sampled", SAMPLED_LEVEL), ("linearized", LINEAR_LEVEL)):
                t0 = time.perf_counter()
                res = choose_dimension(post, Xc, yc, confidence_level=level, d_max=d_max, predictive=pred,
                                       n_samples=n_samples, random_state=fit_seed, full_curve=True)
                dt = time.perf_counter() - t0
                timings[f"curve: {noise_name}, {scaling}, {pred}"] = dt
                curve = curve_rows(res.table, std["y_std"])
                run[pred] = {"level": level, "d": res.n_components, "reached": res.reached,
                             "coverage": res.coverage, "sigma0": res.sigma0, "result": res, "curve": curve,
                             "mean_width_mpa": curve[res.n_components - 1]["mean_width_mpa"], "time_s": dt}
                print(f"{noise_name:22s} {scaling:8s} {pred:10s}: d = {res.n_components} "
                      f"({'reached' if res.reached else 'not reached'}), coverage {res.coverage:.3f}, "
                      f"at d_max {curve[-1]['coverage']:.3f}  [{dt:.0f} s]", flush=True)
            runs.append(run)

    # -- consistency with the estimator (same eigenpairs, β and sample seed → the same rows)
    mine = runs[0]["sampled"]["curve"]
    est_d = est.calibration_["d"].tolist()
    est_cov = est.calibration_["coverage"].to_numpy()
    mine_by_d = {r["d"]: r["coverage"] for r in mine}
    same = np.allclose(est_cov, [mine_by_d[d] for d in est_d])
    est_at_d = float(est.calibration_.set_index("d").loc[est.n_components_, "coverage"])
    consistency = (f"The estimator (prefit, mean scaling, training-residual noise, sampled, d = \"auto\") chose "
                   f"d = {est.n_components_} with coverage {est_at_d:.3f} (β = {est.beta_:.4g}) after "
                   f"{len(est_d)} sampled evaluations (d = {', '.join(map(str, est_d))}); the lower-level full scan "
                   f"on its eigenpairs gives d = {runs[0]['sampled']['d']} and "
                   f"{'identical' if same else 'DIFFERENT'} coverage at those d.")
    if n_samples != est.posterior.n_samples:
        consistency += " (The sample count was reduced after the estimator ran, so the rows need not agree.)"
    print(consistency, flush=True)

    # -- parity (Fig. 7): mean scaling at its sampled d, standard at d_max, with the calibration's posterior draws
    draw_seed = runs[0]["sampled"]["result"].sample_seed
    t0 = time.perf_counter()
    parity = []
    for run in runs:
        d = run["sampled"]["d"] if run["scaling"] == "mean" else d_max
        p = sampled_parity(posts[(run["noise"], run["scaling"])], Xc, ycal, d, n_samples, draw_seed, std)
        with torch.no_grad():
            f0 = net(Xc).double().numpy().reshape(-1) * std["y_std"] + std["y_mean"]
        p.update(noise=run["noise"], scaling=run["scaling"],
                 rmse_mean=float(np.sqrt(np.mean((p["pred"] - p["y"]) ** 2))),
                 rmse_theta0=float(np.sqrt(np.mean((f0 - p["y"]) ** 2))))
        parity.append(p)
    timings["parity intervals"] = time.perf_counter() - t0

    # -- activity (Fig. 8): independent of β
    t0 = time.perf_counter()
    act_post = posts[("training residuals", "mean")]
    chosen = sorted({r["sampled"]["d"] for r in runs if r["scaling"] == "mean"}
                    | {r["linearized"]["d"] for r in runs if r["scaling"] == "mean"})
    act_ds = sorted({1, 3, d_max, *chosen} & set(range(1, d_max + 1)))
    k_top = min(TOP_WEIGHTS, D)
    activity = {d: float(act_post.cumulative_activity(d)[k_top - 1]) for d in act_ds}
    timings["activity"] = time.perf_counter() - t0

    # -- linearised noise sweep (cheap)
    t0 = time.perf_counter()
    sweep = []
    nv_train, nv_cal = noise["training residuals"]["var"], noise["calibration residuals"]["var"]
    for nv, label in ((nv_train, "training residuals"), (nv_cal, "calibration residuals"),
                      (0.07**2, "paper's 0.07 read as σ"), (0.07, "paper's 0.07 read as σ²"),
                      (1.0, "σ = target std (β = 1 in mean scaling)")):
        row = {"noise_var": nv, "label": label}
        for scaling in ("mean", "standard"):
            res = choose_dimension(posterior(scaling, nv), Xc, yc, confidence_level=LINEAR_LEVEL, d_max=d_max,
                                   predictive="linearized", full_curve=False)
            row[scaling] = {"d": res.n_components, "reached": res.reached, "coverage": res.coverage}
        sweep.append(row)
    timings["linearised noise sweep"] = time.perf_counter() - t0

    # -- results
    for run in runs:
        for pred in ("sampled", "linearized"):
            run[pred].pop("result")
    R = {
        "config": {"seed": seed, "n_train": len(ytr), "n_cal": len(ycal), "width": width, "D": D, "steps": steps,
                   "lr": 1e-3, "K": K, "d_max": d_max, "n_samples": n_samples, "quick": args.quick,
                   "sampled_level": SAMPLED_LEVEL, "linearized_level": LINEAR_LEVEL, "y_std_mpa": std["y_std"],
                   "y_mean_mpa": std["y_mean"], "N": N},
        "notes": notes, "training": training, "noise": noise, "eigen": eigen, "runs": runs,
        "noise_sweep": sweep, "activity": {str(k): v for k, v in activity.items()},
        "parity": [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in p.items()} for p in parity],
        "consistency": consistency,
        "estimator": {"noise": "training residuals", "scaling": "mean", "n_samples": est.posterior.n_samples,
                      "level": SAMPLED_LEVEL, "d": est.n_components_, "reached": bool(est.calibration_reached_),
                      "coverage": est_at_d, "sigma0": est.sigma0_,
                      "curve": curve_rows(est.calibration_, std["y_std"])},
        "timings_s": timings,
    }
    # -- figures
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    coverage_figure(R, out / f"{prefix}_coverage.png")
    parity_figure(R, out / f"{prefix}_parity.png")
    plt = _common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.8), layout="constrained")
    for d in act_ds:
        plot_activity(act_post, ax=ax, d=d, top_fraction=TOP_WEIGHTS / D if D > TOP_WEIGHTS else None)
    ax.set_title("Concrete: cumulative activity share (paper Fig. 8)", fontsize="medium")
    fig.savefig(out / f"{prefix}_activity.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5), layout="constrained")
    for row, scaling in zip(axes, ("mean", "standard"), strict=True):
        run = next(r for r in runs if r["noise"] == "training residuals" and r["scaling"] == scaling)
        plot_spectrum(posts[("training residuals", scaling)], ax=row, d=run["sampled"]["d"])
        row[0].set_ylabel(f"{scaling} scaling\nGGN eigenvalue λ_j")
    fig.suptitle("Concrete: spectrum, posterior variances and contraction at the sampled chosen d "
                 "(training-residual noise)")
    fig.savefig(out / f"{prefix}_spectrum.png", dpi=110)
    plt.close(fig)
    timings["figures"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_all
    R["timings_s"] = timings

    return _common.write_results(out / f"{prefix}.json", R, command=_common.command_line(__file__, argv))


if __name__ == "__main__":
    raise SystemExit(main())
