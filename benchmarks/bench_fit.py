"""The whole post-hoc fit + predict, ours against laplace-torch, on the concrete networks (issue 13).

On UCI concrete (a fixed 80 % / 20 % train / test split, 10 % of the training part held out for calibration,
inputs and target standardized with the fitting rows) with the tanh MLPs 8-50-50-1 (the small UCI net) and
8-1000-1000-1 (the paper's ≈1M weights), both trained with full-batch Adam and then used ``prefit``:

- ours: ``LaplaceActiveSubspaceRegressor(prefit=True)``, mean scaling, training-residual noise, K = 50:
  the paper's subspace posterior with both predictives (sampled, 1000 samples; linearised) under both
  calibrations (``"coverage"``: d chosen on the calibration rows; ``"conformal"``: split conformal at d = K),
  and the estimator's default (low-rank posterior, conformal, linearised);
- laplace-torch: full-network Laplace with the Kronecker-factored and with the diagonal GGN, prior precision
  by marginal likelihood (``optimize_prior_precision(method="marglik")``), GLM (linearised) predictive, σ from
  the training residuals (as ours).

Each method's wall time is split into fit (everything up to a usable predictive: curvature, calibration or
prior optimisation) and predict (90 % intervals on the 206 test rows), next to the test coverage of y and the
mean width in standardized units. All rows come from one run, one method after the other, so their ratios are
comparable on a shared machine.

Usage::

    python benchmarks/bench_fit.py [--threads 2] [--device cpu|cuda] [--steps 1000] [--cache-dir DIR]
    python benchmarks/bench_fit.py --quick          # smoke run: small nets, few steps and samples
    python benchmarks/bench_fit.py --report-only    # re-render the report from the JSON

Writes ``benchmarks/results/bench_fit.json`` and the report ``bench_fit.md`` rendered from it
(``_cuda`` / ``_quick`` in the names for CUDA and smoke runs).
"""

from __future__ import annotations

import argparse
import copy
import math
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import _common
import numpy as np
import torch

from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.calibration import CalibrationWarning
from glas_sklearn.datasets import load_concrete

LEVEL = 0.9
Z = math.sqrt(2) * float(torch.erfinv(torch.tensor(LEVEL, dtype=torch.float64)))  # ±1.645σ: central 90 %
OURS = {  # name: estimator settings on top of the common ones
    "ours: subspace, coverage, sampled (the paper)": dict(posterior="subspace", calibration="coverage",
                                                          predictive="sampled"),
    "ours: subspace, coverage, linearised": dict(posterior="subspace", calibration="coverage",
                                                 predictive="linearized"),
    "ours: subspace, conformal, sampled": dict(posterior="subspace", calibration="conformal", predictive="sampled"),
    "ours: subspace, conformal, linearised": dict(posterior="subspace", calibration="conformal",
                                                  predictive="linearized"),
    "ours: low-rank, conformal, linearised (default)": dict(posterior="low_rank", calibration="conformal",
                                                            predictive="linearized"),
}
REFERENCE = "ours: subspace, coverage, sampled (the paper)"


def split(seed: int = 0) -> dict:
    X, y = load_concrete()
    perm = np.random.default_rng(seed).permutation(len(X))
    n_test = int(round(0.2 * len(X)))
    test, rest = perm[:n_test], perm[n_test:]
    n_cal = int(round(0.1 * len(rest)))
    cal, fit = rest[:n_cal], rest[n_cal:]
    mx, sx = X[fit].mean(0), X[fit].std(0)
    my, sy = y[fit].mean(), y[fit].std()
    Xs, ys = (X - mx) / sx, (y - my) / sy
    return {name: (Xs[idx].astype(np.float32), ys[idx].astype(np.float32))
            for name, idx in (("fit", fit), ("cal", cal), ("test", test))}


def interval_stats(y, lo, hi) -> dict:
    y, lo, hi = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (y, lo, hi))
    return {"coverage": float(np.mean((y >= lo) & (y <= hi))), "mean_width": float(np.mean(hi - lo))}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_ours(net, data, device, settings: dict, *, n_samples: int, K: int, seed: int) -> dict:
    (Xf, yf), (Xc, yc), (Xt, yt) = data["fit"], data["cal"], data["test"]
    est = LaplaceActiveSubspaceRegressor(net, **_common.grouped(
        prefit=True, scaling="mean", n_components="auto", max_components=K, n_samples=n_samples,
        confidence_level=LEVEL, noise_std="training", device=str(device), random_state=seed, **settings))
    _sync(device)
    t0 = time.perf_counter()
    est.fit(Xf, yf, X_cal=Xc, y_cal=yc)
    _sync(device)
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, pis = est.predict_interval(Xt)
    _sync(device)
    t_pred = time.perf_counter() - t0
    return {"fit_s": t_fit, "predict_s": t_pred, "d": int(est.n_components_),
            "eigen_s": est.timings_.get("curvature"), "calibration_s": est.timings_.get("calibration"),
            "products": int(est.eigen_info_["n_matvecs"]), **interval_stats(yt, pis[:, 0, 0], pis[:, 1, 0])}


def run_laplace_torch(Laplace, net, data, device, *, structure: str, noise_std: float) -> dict:
    from torch.utils.data import DataLoader, TensorDataset

    (Xf, yf), (Xt, yt) = data["fit"], data["test"]
    model = copy.deepcopy(net).to(device)  # laplace-torch may hook into the model; ours stays untouched
    rows = TensorDataset(torch.as_tensor(Xf, device=device), torch.as_tensor(yf[:, None], device=device))
    _sync(device)
    t0 = time.perf_counter()
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure=structure, sigma_noise=noise_std)
    la.fit(DataLoader(rows, batch_size=128))
    t_curv = time.perf_counter() - t0
    la.optimize_prior_precision(method="marglik", pred_type="glm")
    _sync(device)
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    f_mu, f_var = la(torch.as_tensor(Xt, device=device), pred_type="glm")
    _sync(device)
    t_pred = time.perf_counter() - t0
    mu = f_mu.detach().reshape(-1).double().cpu().numpy()
    var = f_var.detach().reshape(-1).double().cpu().clamp_min(0).numpy()
    sd, sd_y = np.sqrt(var), np.sqrt(var + noise_std**2)
    return {"fit_s": t_fit, "curvature_s": t_curv, "predict_s": t_pred,
            "prior_precision": float(torch.as_tensor(la.prior_precision).mean()),
            "coverage_y_interval": interval_stats(yt, mu - Z * sd_y, mu + Z * sd_y)["coverage"],
            **interval_stats(yt, mu - Z * sd, mu + Z * sd)}


def import_laplace():
    try:
        from laplace import Laplace
    except Exception as err:  # noqa: BLE001 - a missing or broken peer is reported, not fatal
        print(f"[bench_fit] laplace-torch not available ({type(err).__name__}: {err}); skipping it", flush=True)
        return None, f"{type(err).__name__}: {err}"
    return Laplace, None


def versions() -> dict:
    out = {}
    for pkg in ("torch", "laplace-torch", "curvlinops-for-pytorch", "asdfghjkl", "backpack-for-pytorch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def trained_net(width: int, X: torch.Tensor, y: torch.Tensor, steps: int, cache: Path | None) -> tuple:
    net = _common.mlp(8, (width, width), seed=0).to(X.device)
    announce = f"[bench_fit] training 8-{width}-{width}-1 ({_common.n_weights(net):,} weights), {steps} Adam steps"
    train_s, loaded = _common.train_or_load(net, X, y, steps=steps, cache=cache, time_key="train_s",
                                            map_location=X.device, announce=announce)
    if loaded:
        print(f"[bench_fit] 8-{width}-{width}-1 loaded from {cache}", flush=True)
    return net, train_s


def run(args, device) -> dict:
    warnings.simplefilter("ignore", CalibrationWarning)  # a level not reached shows in the table (d = K)
    widths, steps, n_samples, K = args.widths, args.steps, args.n_samples, 50
    if args.quick:
        widths, steps, n_samples, K = [16, 64], min(steps, 100), min(n_samples, 100), 10
    Laplace, laplace_error = (None, "disabled (--no-laplace-torch)") if args.no_laplace_torch else import_laplace()
    data = split(0)
    Xf = torch.as_tensor(data["fit"][0], device=device)
    yf = torch.as_tensor(data["fit"][1][:, None], device=device)
    runs = []
    t_all = time.perf_counter()
    for width in widths:
        cache = args.cache_dir / f"bench_fit_w{width}_s{steps}.pt" if args.cache_dir else None
        net, train_s = trained_net(width, Xf, yf, steps, cache)
        with torch.no_grad():
            noise_std = float((net(Xf) - yf).pow(2).mean().sqrt())
        row = {"network": f"8-{width}-{width}-1", "D": _common.n_weights(net), "train_rmse": noise_std,
               "train_s": train_s, "methods": {}}
        for name, settings in OURS.items():
            print(f"[bench_fit]   {name}", flush=True)
            try:
                row["methods"][name] = run_ours(net, data, device, settings, n_samples=n_samples, K=K, seed=0)
            except Exception as err:  # noqa: BLE001 - reported in the table
                row["methods"][name] = {"error": f"{type(err).__name__}: {err}"}
        if Laplace is not None:
            for structure in ("kron", "diag"):
                name = f"laplace-torch: {structure} GGN, GLM, marglik"
                print(f"[bench_fit]   {name}", flush=True)
                try:
                    row["methods"][name] = run_laplace_torch(Laplace, net, data, device, structure=structure,
                                                             noise_std=noise_std)
                except Exception as err:  # noqa: BLE001 - a peer failing must not stop the benchmark
                    row["methods"][name] = {"error": f"{type(err).__name__}: {err}"}
        for name, r in row["methods"].items():
            print(f"[bench_fit]   {name}: {r}", flush=True)
        runs.append(row)
    return {"runs": runs, "total_s": time.perf_counter() - t_all, "n_samples": n_samples, "K": K, "steps": steps,
            "laplace_torch_error": laplace_error, "versions": versions()}


def render(R: dict) -> str:
    """The markdown report, from the results JSON alone."""
    lines = ["# Time of a post-hoc fit and prediction, against laplace-torch", "",
             f"Command: `{R['command']}` ({_common.machine_line(R['machine'])}); every row below comes from this "
             f"one run ({R['total_s']:.0f} s). UCI "
             "concrete, 80/20 split (206 test rows), 10 % of the training part for calibration, standardized "
             f"units, networks trained {R['steps']} full-batch Adam steps and used prefit; ours with K = {R['K']} "
             f"eigenpairs and {R['n_samples']} samples for the sampled predictive. Fit = everything up to a usable "
             "predictive (ours: eigenpairs + calibration; laplace-torch: curvature + marglik prior precision); "
             "predict = 90 % intervals on the test rows. Coverage is of y: ours with calibration='coverage' by the "
             "interval for f (what d is chosen for), with 'conformal' by its interval for y; laplace-torch by its "
             "GLM interval for f, and (in brackets) for y = f + ε with σ from the training residuals.", ""]
    for row in R["runs"]:
        lines += [f"## {row['network']} (D = {row['D']:,}, training RMSE {row['train_rmse']:.3f}, trained in "
                  f"{row['train_s']:.0f} s)", ""]
        ref = row["methods"].get(REFERENCE, {}).get("fit_s")
        table = []
        for name, r in row["methods"].items():
            if "error" in r:
                table.append([name, "failed: " + r["error"][:100], "", "", "", "", "", ""])
                continue
            if r.get("eigen_s") is not None:
                parts = f" (eigen {r['eigen_s']:.1f} + calibration {r['calibration_s']:.1f})"
            else:
                parts = f" (curvature {r['curvature_s']:.1f})" if "curvature_s" in r else ""
            cov = f"{r['coverage']:.3f}"
            if "coverage_y_interval" in r:
                cov += f" ({r['coverage_y_interval']:.3f})"
            table.append([name, f"{r['fit_s']:.2f}{parts}", f"{r['predict_s']:.3f}",
                          f"{r['fit_s'] / ref:.2f}" if ref else "—", r.get("d", "—"), r.get("products", "—"),
                          cov, f"{r['mean_width']:.3f}"])
        lines += _common.markdown_table(["method", "fit s", "predict s", "fit ÷ paper's fit", "d", "G products",
                                         "test coverage (90 %)", "mean width"], table)
        lines.append("")
    if R.get("laplace_torch_error"):
        lines += [f"laplace-torch rows missing: {R['laplace_torch_error']}.", ""]
    lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in R["versions"].items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_arguments(parser, threads=2, quick="widths 16 and 64, 100 steps, 100 samples, K = 10")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=1000, help="full-batch Adam steps for each network")
    parser.add_argument("--n-samples", type=int, default=1000)
    parser.add_argument("--widths", type=int, nargs="+", default=[50, 1000])
    parser.add_argument("--cache-dir", type=Path, default=None, help="keep the trained networks here and reuse them")
    parser.add_argument("--no-laplace-torch", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    stem = "bench_fit" + ("" if device.type == "cpu" else f"_{device.type}") + ("_quick" if args.quick else "")
    path, md_path = args.out_dir / f"{stem}.json", args.out_dir / f"{stem}.md"
    if args.report_only:
        _, text = _common.report_from_results(path, md_path, render)
    else:
        if device.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda given, but torch.cuda.is_available() is False on this machine.")
        torch.set_num_threads(args.threads)
        _, text = _common.write_results_and_report(path, md_path, run(args, device), render,
                                                   command=_common.command_line(__file__, argv), device=device)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
