"""UCI benchmark of the heteroscedastic likelihood: GLAS with a variance head against CQR, mean-variance networks
and the homoscedastic default, in distribution (the standard random splits) and under covariate shift.

Per partition (the protocol of ``benchmarks/uci.py``): the training rows are split 90/10 into fitting and
calibration rows at random (seeded by the split number), inputs and target standardised on the fitting rows; every
network has one hidden layer of 50 tanh units and is trained with Adam for ``--epochs`` epochs of mini-batches of
``--batch-size`` at ``--lr``. At the 90 % level, on the test rows:

- ``glas_default``: the homoscedastic default, ``LaplaceActiveSubspaceRegressor(module=mse_net, prefit=True)``
  (low-rank posterior, conformal, σ0 by subspace EB) on a network trained on the squared error;
- ``glas_het``: ``LaplaceActiveSubspaceRegressor(likelihood="heteroscedastic", ...)`` trained by the estimator
  itself (β-NLL, b = ``--beta-nll``) with its defaults: standard scaling (β = N), σ0 by subspace empirical Bayes,
  conformal on σ̂ = sqrt(σ_ale² + σ_epi²); ``glas_het_<scaling>_<sigma0>`` (``--het-variants``): the same network
  (prefit) with another posterior scale, for the scale study;
- ``mvn_conformal``: the same mean-variance network without Laplace: split conformal normalised by its σ(x);
- ``cqr_nn``: CQR (MAPIE ``ConformalizedQuantileRegressor``, prefit) with a quantile network of the same size
  (outputs q_0.05, q_0.95, q_0.5, pinball loss); ``cqr_hgb``: the same with HistGradientBoosting quantiles;
- ``split_conformal``: MAPIE's absolute-residual split conformal on the squared-error network;
- ``laplace_torch``: laplace-torch's full Kronecker GGN Laplace on the squared-error network (marglik prior);
- ``deep_ensemble_mvn``: 5 mean-variance networks trained with the NLL (Lakshminarayanan et al. 2017, without
  adversarial training), predictive mixture N(mean of μ_e, mean of (σ_e² + μ_e²) − mean²), intervals μ ± z σ.

Gaussian NLL is that of each method's predictive (``predict(return_std=True)`` for GLAS: calibrated), '–' for
CQR and split conformal. Usage::

    python benchmarks/uci_heteroscedastic.py --splits 3            # random splits 0..2
    python benchmarks/uci_heteroscedastic.py --protocol shift      # extrapolation / gap along features 0..3
    python benchmarks/uci_heteroscedastic.py --report-only [--protocol shift]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time
import warnings

import _common
import numpy as np
import torch
import uci

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Training
from glas_sklearn.calibration import conformal_quantile
from glas_sklearn.likelihoods import HeteroscedasticGaussian

LEVEL, Z = uci.LEVEL, uci.Z
QUANTILES = ((1 - LEVEL) / 2, (1 + LEVEL) / 2, 0.5)

METHODS = [
    ("glas_het", "GLAS heteroscedastic (the estimator's defaults: β-NLL training, standard scaling β = N, σ0 by "
                 "subspace EB, conformal on σ_ale ⊕ σ_epi)"),
    ("glas_default", "GLAS homoscedastic default (conformal, σ0 subspace EB)"),
    ("mvn_conformal", "Mean-variance network, normalised split conformal (no Laplace)"),
    ("cqr_nn", "CQR, quantile network of the same size (MAPIE)"),
    ("cqr_hgb", "CQR, HistGradientBoosting quantiles (MAPIE)"),
    ("split_conformal", "Split conformal (MAPIE, absolute)"),
    ("laplace_torch", "laplace-torch (full Kron GGN, GLM, marglik)"),
    ("deep_ensemble_mvn", "Deep ensemble of 5 mean-variance networks (NLL)"),
]
# Published figures (test NLL and RMSE on the 20 standard splits, mean ± s.e.), Lakshminarayanan et al. 2017,
# Table 1 (5 networks of 50 ReLU units, 40 epochs, adversarial training), with the MC-dropout numbers of Gal &
# Ghahramani 2016 quoted there (the same as the DropoutUncertaintyExps README's "original" column).
PUBLISHED = {
    "concrete": {"de_nll": (3.06, 0.18), "de_rmse": (6.03, 0.58), "mcd_nll": (3.04, 0.09), "mcd_rmse": (5.23, 0.53)},
    "energy": {"de_nll": (1.38, 0.22), "de_rmse": (2.09, 0.29), "mcd_nll": (1.99, 0.09), "mcd_rmse": (1.66, 0.19)},
    "yacht": {"de_nll": (1.18, 0.21), "de_rmse": (1.58, 0.48), "mcd_nll": (1.55, 0.12), "mcd_rmse": (1.11, 0.38)},
    "wine-quality-red": {"de_nll": (0.94, 0.12), "de_rmse": (0.64, 0.04), "mcd_nll": (0.93, 0.06),
                         "mcd_rmse": (0.62, 0.04)},
}


# ------------------------------------------------------------------------------------------------- networks
def _train(X, y, n_members, n_out, loss, cfg, seed):
    t0 = time.perf_counter()
    model = uci.BatchedMLP(n_members, X.shape[1], cfg.hidden, seed, n_out=n_out)
    Xt = torch.as_tensor(X, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.float32)[:, None]
    _common.train_adam(model, Xt, yt, lr=cfg.lr, epochs=cfg.epochs, batch_size=cfg.batch_size, members=n_members,
                       seed=seed + 1, loss=loss)
    return [model.member(e) for e in range(n_members)], time.perf_counter() - t0


het_members_loss = _common.het_members_loss
pinball_loss = _common.pinball_loss(QUANTILES)
HetInOriginalUnits = _common.HetInOriginalUnits
OutputColumn = _common.OutputColumn
_het_outputs = _common.het_outputs


# ------------------------------------------------------------------------------------------------------ methods
def _glas_metrics(est, X_te, y_te, dist, seconds):
    t0 = time.perf_counter()
    y_pred, pis = est.predict_interval(X_te)
    _, std = est.predict(X_te, return_std=True)
    out = uci.metrics(y_te, y_pred, pis[:, 0, 0], pis[:, 1, 0], std**2, seconds + time.perf_counter() - t0, dist)
    raw = std / float(np.atleast_1d(est.std_scale_)[0])
    out["nll_raw"] = float(np.mean(0.5 * np.log(2 * np.pi * raw**2) + 0.5 * (y_te - y_pred) ** 2 / raw**2))
    out.update({"sigma0": float(est.sigma0_), "std_scale": float(np.atleast_1d(est.std_scale_)[0]),
                "d": int(est.n_components_)})
    return out


def run_glas_prefit(net, rows, dist, seed, **kwargs):
    X_fit, y_fit, X_cal, y_cal, X_te, y_te = rows
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(**_common.grouped(module=net, prefit=True, confidence_level=LEVEL,
                                                       random_state=seed, device="cpu",
                                                       **kwargs)).fit(X_fit, y_fit, X_cal=X_cal, y_cal=y_cal)
    return _glas_metrics(est, X_te, y_te, dist, time.perf_counter() - t0), est


def run_glas_het_own(rows, dist, seed, cfg):
    X_fit, y_fit, X_cal, y_cal, X_te, y_te = rows
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(likelihood=HeteroscedasticGaussian(beta_nll=cfg.beta_nll),
                                             confidence_level=LEVEL, random_state=seed,
                                             training=Training(module_kwargs={"hidden_layer_sizes": (cfg.hidden,)},
                                                               max_epochs=cfg.epochs, lr=cfg.lr,
                                                               batch_size=cfg.batch_size),
                                             compute=Compute(device="cpu")).fit(X_fit, y_fit, X_cal=X_cal, y_cal=y_cal)
    return _glas_metrics(est, X_te, y_te, dist, time.perf_counter() - t0), est


def run_mvn_conformal(net, X_cal, y_cal, X_te, y_te, dist):
    t0 = time.perf_counter()
    mu_c, var_c = _het_outputs(net, X_cal)
    q = float(conformal_quantile(np.abs(y_cal - mu_c) / np.sqrt(var_c), LEVEL)[0])
    mu, var = _het_outputs(net, X_te)
    half = q * np.sqrt(var)
    out = uci.metrics(y_te, mu, mu - half, mu + half, var, time.perf_counter() - t0, dist)
    out["quantile"] = q
    return out


def run_cqr(estimators, X_cal, y_cal, X_te, y_te, dist, seconds):
    from mapie.regression import ConformalizedQuantileRegressor
    t0 = time.perf_counter()
    cqr = ConformalizedQuantileRegressor(estimators, confidence_level=LEVEL, prefit=True)
    cqr.conformalize(X_cal, y_cal)
    y_pred, pis = cqr.predict_interval(X_te)
    # crossing quantile estimates can leave lower > upper after the correction: take the interval between them
    lo, hi = np.minimum(pis[:, 0, 0], pis[:, 1, 0]), np.maximum(pis[:, 0, 0], pis[:, 1, 0])
    return uci.metrics(y_te, y_pred, lo, hi, None, seconds + time.perf_counter() - t0, dist)


def run_hgb_cqr(X_fit, y_fit, X_cal, y_cal, X_te, y_te, dist, seed):
    from sklearn.ensemble import HistGradientBoostingRegressor
    t0 = time.perf_counter()
    ests = [HistGradientBoostingRegressor(loss="quantile", quantile=q, random_state=seed).fit(X_fit, y_fit)
            for q in QUANTILES]
    return run_cqr(ests, X_cal, y_cal, X_te, y_te, dist, time.perf_counter() - t0)


def run_mvn_ensemble(nets, X_te, y_te, dist, seconds):
    t0 = time.perf_counter()
    mu, var = _common.mixture_moments(nets, X_te)
    half = Z * np.sqrt(var)
    return uci.metrics(y_te, mu, mu - half, mu + half, var, seconds + time.perf_counter() - t0, dist)


# ---------------------------------------------------------------------------------------------------- partition
def run_rows(X, y, train, test, split: int, cfg, Laplace) -> dict:
    rng = np.random.default_rng(1000 + split)
    perm = rng.permutation(train)
    n_cal = int(round(0.1 * len(train)))
    cal, fit = perm[:n_cal], perm[n_cal:]
    rows = (X[fit], y[fit], X[cal], y[cal], X[test], y[test])
    X_fit, y_fit, X_cal, y_cal, X_te, y_te = rows
    mx, sx = X_fit.mean(0), X_fit.std(0)
    sx[~(sx > 0)] = 1.0
    my, sy = y_fit.mean(), y_fit.std()
    Xs, ys = (X_fit - mx) / sx, (y_fit - my) / sy
    A, B = (X_te - mx) / sx, Xs
    dist = np.sqrt(np.maximum((A**2).sum(1)[:, None] + (B**2).sum(1)[None] - 2 * A @ B.T, 0.0)).min(1)
    seed = 10_000 * split + 7
    res = {"split": split, "n_fit": len(fit), "n_cal": len(cal), "n_test": len(test), "methods": {}}
    m = res["methods"]

    mse_nets, t_mse = _train(Xs, ys, 1, 1, uci.members_loss, cfg, seed)
    mse_net = uci.InOriginalUnits(mse_nets[0], mx, sx, my, sy).eval()
    m["glas_default"], _ = run_glas_prefit(mse_net, rows, dist, split)
    m["split_conformal"] = uci.run_split_conformal(mse_net, X_cal, y_cal, X_te, y_te, dist)
    if Laplace is not None and "laplace" not in cfg.skip:
        try:
            noise = float(np.sqrt(np.mean((y_fit - uci._predict(mse_net, X_fit)) ** 2)))
            m["laplace_torch"] = uci.run_laplace_torch(Laplace, mse_net, X_fit, y_fit, X_te, y_te, noise, dist)
        except Exception as err:  # noqa: BLE001 - a peer failing must not stop the benchmark
            res["laplace_torch_error"] = f"{type(err).__name__}: {err}"

    m["glas_het"], het = run_glas_het_own(rows, dist, split, cfg)
    het_net = het.module_  # standardised units inside the estimator: wrap to the original ones
    het_orig = HetInOriginalUnits(het_net, het.x_mean_, het.x_scale_, float(het.y_mean_[0]),
                                  float(het.y_scale_[0])).eval()
    m["mvn_conformal"] = run_mvn_conformal(het_orig, X_cal, y_cal, X_te, y_te, dist)
    for spec in cfg.het_variants:  # "scaling:sigma0", the same network with another posterior scale
        scaling, s0 = spec.split(":")
        sigma0 = float(s0) if s0[0].isdigit() else s0
        m[f"glas_het_{scaling}_{s0}"], _ = run_glas_prefit(het_orig, rows, dist, split, likelihood="heteroscedastic",
                                                           scaling=scaling, sigma0=sigma0)

    if "cqr" not in cfg.skip:
        qnets, t_q = _train(Xs, ys, 1, 3, pinball_loss, cfg, seed + 3)
        cols = [OutputColumn(qnets[0], j, mx, sx, my, sy) for j in range(3)]
        m["cqr_nn"] = run_cqr(cols, X_cal, y_cal, X_te, y_te, dist, t_q)
        m["cqr_hgb"] = run_hgb_cqr(X_fit, y_fit, X_cal, y_cal, X_te, y_te, dist, split)

    if cfg.ensemble and "ensemble" not in cfg.skip:
        ens, t_e = _train(Xs, ys, cfg.ensemble, 2, het_members_loss(HeteroscedasticGaussian(beta_nll=0.0)), cfg,
                          seed + 5)
        ens_orig = [HetInOriginalUnits(n, mx, sx, my, sy).eval() for n in ens]
        m["deep_ensemble_mvn"] = run_mvn_ensemble(ens_orig, X_te, y_te, dist, t_e)
    res["train_seconds_mse"] = t_mse
    return res


# ------------------------------------------------------------------------------------------------------- report
def _mean_se(v):
    v = np.asarray([x for x in v if x is not None], dtype=float)
    if v.size == 0:
        return None, None
    return float(v.mean()), (float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan"))


def summarise(runs: list[dict]) -> dict:
    keys = sorted({k for r in runs for k in r["methods"]})
    out = {}
    for k in keys:
        rs = [r["methods"][k] for r in runs if k in r["methods"]]
        out[k] = {metric: _mean_se([r.get(metric) for r in rs])
                  for metric in ("coverage", "width", "interval_score", "nll", "nll_raw", "rmse", "time", "sigma0")}
        out[k]["n"] = len(rs)
    return out


def _ratio(summary, a, b):
    if a not in summary or b not in summary:
        return None
    return summary[a]["interval_score"][0] / summary[b]["interval_score"][0]


def _f(entry, metric, digits=3):
    if entry is None or entry.get(metric, (None,))[0] is None:
        return "–"
    m, se = entry[metric]
    return f"{m:.{digits}f}" + ("" if se is None or not np.isfinite(se) else f" ± {se:.{digits}f}")


def _labels(keys):
    names = dict(METHODS)
    return [(k, names.get(k, f"GLAS heteroscedastic, same network, scaling_sigma0={k[len('glas_het_'):]}"
                           if k.startswith("glas_het_") else k)) for k in keys]


def _method_order(summaries):
    keys = {k for s in summaries.values() for k in s}
    order = [k for k, _ in METHODS if k in keys] + sorted(k for k in keys if k not in dict(METHODS))
    return order


def render(results: dict) -> str:
    shift = results["config"]["protocol"] == "shift"
    ds = results["datasets"]
    summaries = {name: summarise(d["runs"]) for name, d in ds.items() if d["runs"]}
    where = (f"covariate shift ({' and '.join(results['config']['shift_protocols'])})" if shift
             else "random splits")
    lines = [f"# UCI, heteroscedastic likelihood: {where}", "",
             f"`{results['command']}`", "", _common.machine_line(results["machine"]), "",
             f"Date {results['date']}. Level {LEVEL}. " + ", ".join(f"{n}: {len(d['runs'])} "
                                                                    f"{'runs' if shift else 'splits'}"
                                                                    for n, d in ds.items()), ""]
    order = _method_order(summaries)
    header = ["method"] + [f"{n} IS / SC" for n in summaries] + ["geo. mean"]
    rows = []
    for k, label in _labels(order):
        r = [_ratio(summaries[n], k, "split_conformal") for n in summaries]
        good = [x for x in r if x is not None]
        geo = float(np.exp(np.mean(np.log(good)))) if len(good) == len(r) else None
        rows.append([f"{label} (`{k}`)"] + ["–" if x is None else f"{x:.3f}" for x in r]
                    + ["–" if geo is None else f"{geo:.3f}"])
    lines += ["## Interval score relative to split conformal (ratio of the mean interval scores; lower is better)",
              ""] + _common.markdown_table(header, rows, "l" + "r" * (len(header) - 1)) + [""]
    header = ["method"] + [f"{n} IS / default" for n in summaries]
    rows = [[f"`{k}`"] + ["–" if _ratio(summaries[n], k, "glas_default") is None
                          else f"{_ratio(summaries[n], k, 'glas_default'):.3f}" for n in summaries]
            for k in order]
    lines += ["## Interval score relative to the homoscedastic default (`glas_default`)", ""] \
        + _common.markdown_table(header, rows, "l" + "r" * (len(header) - 1)) + [""]
    for name, s in summaries.items():
        lines += [f"## {name}", ""]
        rows = [[f"`{k}`", _f(s[k], "coverage"), _f(s[k], "width"), _f(s[k], "interval_score"), _f(s[k], "nll"),
                 _f(s[k], "nll_raw"), _f(s[k], "rmse"), _f(s[k], "time", 1), _f(s[k], "sigma0", 4)]
                for k in order if k in s]
        lines += _common.markdown_table(["method", "coverage", "width", "interval score", "NLL",
                                         "NLL (raw σ̂)", "RMSE", "seconds", "σ0"], rows, "lrrrrrrrr") + [""]
    if not shift:
        lines += ["## Gaussian NLL and RMSE next to the published numbers", "",
                  "Published: Lakshminarayanan et al. 2017, Table 1 (deep ensembles of 5, and MC-dropout as quoted "
                  "there from Gal & Ghahramani 2016), mean ± s.e. over the 20 standard splits, networks trained on "
                  "all training rows. Ours: the same splits, the networks trained on 90 % of the training rows "
                  "(10 % held out for calibration), NLL of `predict(return_std=True)`.", ""]
        rows = []
        for name, s in summaries.items():
            p = PUBLISHED.get(name, {})

            def pub(key, p=p):
                return "–" if key not in p else f"{p[key][0]:.2f} ± {p[key][1]:.2f}"
            rows.append([name, _f(s.get("glas_het"), "nll", 2), _f(s.get("deep_ensemble_mvn"), "nll", 2),
                         pub("de_nll"), pub("mcd_nll"), _f(s.get("glas_het"), "rmse", 2),
                         _f(s.get("deep_ensemble_mvn"), "rmse", 2), pub("de_rmse"), pub("mcd_rmse")])
        lines += _common.markdown_table(["data set", "NLL glas_het (1 net)", "NLL our DE (5)", "NLL DE published",
                                         "NLL MC-dropout published", "RMSE glas_het", "RMSE our DE",
                                         "RMSE DE published", "RMSE MC-dropout published"], rows,
                                        "lrrrrrrrr") + [""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="smoke test: 1 split, 20 epochs")
    p.add_argument("--data-dir", type=_common.Path, default=_common.data_dir("uci"))
    p.add_argument("--datasets", nargs="+", default=None)
    p.add_argument("--splits", nargs="+", type=int, default=None, help="N: splits 0..N-1; several: those")
    p.add_argument("--protocol", choices=("random", "shift"), default="random")
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--shift-protocols", nargs="+", default=["extrapolation", "gap"])
    p.add_argument("--epochs", type=int, default=None, help="default 200 (quick 20)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=50)
    p.add_argument("--ensemble", type=int, default=5, help="members of the mean-variance deep ensemble (0: none)")
    p.add_argument("--beta-nll", type=float, default=0.5)
    p.add_argument("--het-variants", nargs="*", default=[],
                   help="extra posterior scales on the same heteroscedastic network, as scaling:sigma0 "
                        "(e.g. mean:nll standard:eb_full)")
    p.add_argument("--skip", nargs="*", default=[], choices=("laplace", "cqr", "ensemble"),
                   help="leave out these peers (development runs)")
    p.add_argument("--no-laplace-torch", action="store_true")
    p.add_argument("--tag", default=None)
    p.add_argument("--merge-tags", nargs="*", default=[],
                   help="no computation: add the runs of uci_heteroscedastic[_shift]_TAG.json (parallel processes) "
                        "to this protocol's results and re-render")
    args = p.parse_args(argv)
    args.epochs = args.epochs if args.epochs is not None else (20 if args.quick else 200)
    return args


def main(argv=None):
    args = parse_args(argv)
    stem = "uci_heteroscedastic" + ("_shift" if args.protocol == "shift" else "") + ("_quick" if args.quick else "") \
        + (f"_{args.tag}" if args.tag else "")
    json_path, md_path = args.out_dir / f"{stem}.json", args.out_dir / f"{stem}.md"
    if args.report_only:
        _, text = _common.report_from_results(json_path, md_path, render)
        print(text)
        return
    torch.set_num_threads(args.threads)  # (recorded with the machine, also when merging)
    if args.merge_tags:  # runs of the same protocol computed by parallel processes (other --tag), into this file
        merged = _common.read_results(json_path)
        commands = [merged["command"]]
        for tag in args.merge_tags:
            other = _common.read_results(json_path.with_name(f"{json_path.stem}_{tag}.json"))
            commands.append(other["command"])
            for name, d in other["datasets"].items():
                runs = merged["datasets"].setdefault(name, {"runs": []})["runs"]
                seen = {(r["split"], r.get("protocol")) for r in runs}
                runs += [r for r in d["runs"] if (r["split"], r.get("protocol")) not in seen]
                runs.sort(key=lambda r: (r["split"], r.get("protocol") or ""))
        results = {k: merged[k] for k in ("date", "config", "datasets")}
        results["config"]["merged_from"] = commands
        _, text = _common.write_results_and_report(json_path, md_path, results, render,
                                                   command=" ; ".join(commands))
        print(text)
        return
    torch.set_num_threads(args.threads)
    data_dir = args.data_dir.resolve()
    names = args.datasets or [n for n in uci.DEFAULT_DATASETS if (data_dir / n).is_dir()]
    Laplace = None if args.no_laplace_torch else uci._import_laplace_torch()
    command = _common.command_line(__file__, argv)
    results = {"date": _dt.datetime.now().isoformat(timespec="seconds"),
               "config": {k: (str(v) if isinstance(v, _common.Path) else v) for k, v in vars(args).items()},
               "datasets": {n: {"runs": []} for n in names}}
    if args.protocol == "shift":
        jobs = [(f, proto, n) for f in range(1 if args.quick else args.features) for proto in args.shift_protocols
                for n in names]
    else:
        if args.splits is None:
            splits = [0] if args.quick else list(range(20))
        elif len(args.splits) == 1:
            splits = list(range(args.splits[0]))
        else:
            splits = args.splits
        jobs = [(s, None, n) for s in splits for n in names]
    for key, proto, name in jobs:
        t0 = time.perf_counter()
        if proto is None:
            X, y, train, test = _common.load_uci(data_dir / name, key)
        else:
            X, y = _common.load_uci(data_dir / name)
            if key >= X.shape[1]:
                continue
            train, test = uci.shift_indices(X, key, proto)
        r = run_rows(X, y, train, test, key, args, Laplace)
        if proto is not None:
            r.update({"feature": key, "protocol": proto})
        r["seconds"] = time.perf_counter() - t0
        results["datasets"][name]["runs"].append(r)
        print(f"[uci-het] {name} {key} {proto or 'random'}: {r['seconds']:.0f}s; "
              + ", ".join(f"{k}: cov {v['coverage']:.2f} IS {v['interval_score']:.3g}"
                          for k, v in r["methods"].items()),
              flush=True)
        _common.write_results_and_report(json_path, md_path, results, render, command=command)
    _, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)


if __name__ == "__main__":
    main()
