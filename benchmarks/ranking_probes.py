"""Four more attempts at the dev sets' σ̂ fifths: a residual scale from held-out rows, finite-sized Mondrian bins,
the homoscedastic network's epistemic part, and the two networks' disagreement.

Issue target: on the four UCI dev sets every σ̂ quintile of the default's 90 % intervals covers 85–95 % (pooled over
the 20 splits). ``quintile_sampling.py`` showed that energy's 82 % middle fifth is not chance but σ̂ ranking the
errors badly, and ``regional_calibration.py --ranking-variants`` that no shape of σ̂ built from σ_ale and σ_epi
fixes it. This script measures three more candidates on the same cached moments (``regional_calibration.py --stage
fit --study uci`` / ``--study shift``; the heteroscedastic estimator with its fitted epistemic weight λ is the
reference ``het_fit``, the regressor's default on these sets) and four more:

- ``honest_scale``: the noise scale learnt from residuals no network was trained on. Per split a second
  heteroscedastic estimator is trained on 80 % of the fitting rows; on the other 20 % its residuals r give a
  log-linear variance model log σ_r²(x) = a + wᵀ[x standardised, log σ_ale²(x)] (Gaussian NLL, ridge 0.1 on w), and
  the intervals are split conformal normalised by σ_r(x) (σ_ale of the reference fit) around the reference mean.
  ``honest_scale_excess``: the same plus the epistemic variance above its 90 % quantile on the calibration rows,
  σ̂² = σ_r² + (σ_epi² − m)₊, so that rows off the data keep their widening. In distribution only (``uci``).
- ``mondrian_finite``: Mondrian conformal over σ̂ bins as small as keeps each bin's quantile finite: B = min(5,
  ⌊n / (⌈1/γ⌉ − 1)⌋) equal-count bins of the reference σ̂ (9 rows a bin at 90 %; the regressor's default needs 200),
  the exact conformal rank within each (:class:`~glas_sklearn.calibration.MondrianConformalCalibrator`).
- ``gauss_epi``: the reference mean and σ_ale with the epistemic variance of the homoscedastic fit (its GGN weighs
  every row alike, the heteroscedastic one by 1/σ_ale²(x)), λ fitted as for the reference.
- ``disagreement``: the reference σ̂² plus κ (μ_h(x) − μ_g(x))², the squared gap between the heteroscedastic and
  the homoscedastic network's means (both trained on the same rows, as ``likelihood="auto"`` does: a two-member
  ensemble's spread), κ ∈ {0} ∪ [0.01, 100] fitted by the profile NLL of the calibration residuals.

Quintiles are those of each method's own σ̂ on the test rows of a split (``mondrian_finite``: the reference σ̂, the
one its bins are built on), pooled over the splits; interval score against split conformal around the
homoscedastic network (``split_nn``), geometric mean over the splits. Writes ``results/ranking_probes.{json,md}``.
Run from the repository root (needs the ``uci`` and ``shift`` caches of ``regional_calibration.py``; the 80 %
networks are cached in ``results/cache_ranking_probes/``): ``python benchmarks/ranking_probes.py`` (a few minutes,
one torch thread).
"""
from __future__ import annotations

import argparse
import pickle
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize

from glas_sklearn import Compute

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import regional_calibration as rcal  # noqa: E402

from glas_sklearn import LaplaceActiveSubspaceRegressor  # noqa: E402
from glas_sklearn.calibration import (  # noqa: E402
    MondrianConformalCalibrator,
    conformal_quantile,
    epistemic_cap,
    fit_epistemic_weight,
    weighted_moments,
)
from glas_sklearn.calibration.conformal import _profile_nll  # noqa: E402
from glas_sklearn.predictive import RegressionMoments  # noqa: E402

LEVEL = 0.9
BAND = (0.85, 0.95)
CACHE = _common.RESULTS / "cache_ranking_probes"
HELD_SHARE = 0.2
RIDGE = 0.1
EXCESS_QUANTILE = 0.9
KAPPAS = np.r_[0.0, np.exp(np.linspace(np.log(1e-2), np.log(1e2), 41))]
METHODS = [
    ("het_fit", "the reference: the heteroscedastic fit, λ fitted with the median cap, one conformal quantile"),
    ("honest_scale", "split conformal normalised by σ_r(x), a log-linear variance model of held-out residuals"),
    ("honest_scale_excess", f"σ̂² = σ_r² + (σ_epi² − m)₊, m the {EXCESS_QUANTILE:g} quantile of the calibration "
                            "rows' σ_epi²"),
    ("mondrian_finite", "Mondrian over min(5, ⌊n/9⌋) equal-count bins of the reference σ̂, exact ranks"),
    ("gauss_epi", "the reference's mean and σ_ale, the homoscedastic fit's σ_epi², λ fitted"),
    ("disagreement", "the reference σ̂² + κ (μ_h − μ_g)², κ fitted by the profile NLL"),
    ("split_nn", "split conformal around the homoscedastic network (the IS reference)"),
]


def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64).reshape(len(a), -1))


def held_out_fit(name: str, split: int, data_dir: Path) -> dict:
    """The second heteroscedastic estimator of one split (80 % of the fitting rows) and what the probes need."""
    path = CACHE / f"{name}_{split}.pkl"
    if path.exists():
        with open(path, "rb") as f:
            return pickle.load(f)
    X, y, train, _ = _common.load_uci(data_dir / name, split)
    perm = np.random.default_rng(1000 + split).permutation(train)  # regional_calibration's fitting/calibration rows
    n_cal = int(round(0.1 * len(train)))
    cal, fit = perm[:n_cal], perm[n_cal:]
    order = np.random.default_rng(7919 + split).permutation(fit)
    n_held = int(np.ceil(HELD_SHARE * len(fit)))
    held, part = order[:n_held], order[n_held:]
    est = LaplaceActiveSubspaceRegressor(likelihood="heteroscedastic", confidence_level=LEVEL, random_state=split,
                                         verbose=0, compute=Compute(device="cpu"))
    est.fit(X[part], y[part], X_cal=X[cal], y_cal=y[cal])
    out = {"X_cal": X[cal], "X_held": X[held], "r_held": y[held] - est.predict(X[held]),
           "ale_held": est.predict_noise_std(X[held]) * np.ones(len(held)),
           "x_mean": X[fit].mean(0), "x_std": np.where(X[fit].std(0) > 0, X[fit].std(0), 1.0)}
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(out, f)
    return out


def log_linear_variance(r, Z, ridge=RIDGE):
    """(a, w) minimising mean(r² e^{−η} + η) + ridge ‖w‖², η = a + Z w (the Gaussian NLL of r, up to constants)."""
    r2, (n, p) = np.asarray(r, dtype=np.float64) ** 2, Z.shape

    def f(v):
        eta = v[0] + Z @ v[1:]
        e = r2 * np.exp(-eta)
        g = 1.0 - e
        return float(np.mean(e + eta) + ridge * v[1:] @ v[1:]), np.r_[g.mean(), Z.T @ g / n + 2 * ridge * v[1:]]

    v0 = np.r_[np.log(max(float(r2.mean()), 1e-300)), np.zeros(p)]
    return minimize(f, v0, jac=True, method="L-BFGS-B").x


def _normalised(y_cal, mu_cal, sd_cal, mu_te, sd_te):
    q = conformal_quantile(np.abs(y_cal - mu_cal) / sd_cal, LEVEL)[0]
    return mu_te - q * sd_te, mu_te + q * sd_te


def probe_intervals(d: dict, held: dict | None) -> dict:
    """(lower, upper, σ̂ on the test rows) per method of one cached run."""
    y_cal, mc, mt = d["y_cal"], d["het_mu_cal"], d["het_mu_te"]
    out = {}
    mu_c, sd_c, mu_t, sd_t, _ = rcal._het_fit_moments(d)
    out["het_fit"] = (*_normalised(y_cal, mu_c, sd_c, mu_t, sd_t), sd_t)
    n_bins = MondrianConformalCalibrator(min_bin_size=1, max_bins=5, min_bins=1).bins_for(len(y_cal), LEVEL)  # ⌊n/9⌋
    cal = MondrianConformalCalibrator(n_bins=n_bins, quantile_method="higher")  # as the report measured it
    cal.calibrate_predictions(RegressionMoments(_t(mu_c), _t(sd_c)), _t(y_cal), LEVEL)
    b = cal.region(RegressionMoments(_t(mu_t), _t(sd_t)), LEVEL)[:, 0, :, 0].numpy()
    out["mondrian_finite"] = (b[:, 0], b[:, 1], sd_t)
    ale = {p: d[f"het_ale_{p}"] ** 2 for p in ("cal", "te")}
    epi = {p: np.maximum(d[f"het_sdn_{p}"] ** 2 - ale[p], 0.0) for p in ("cal", "te")}
    epi_g = {p: np.maximum(d[f"default_sdn_{p}"] ** 2 - d[f"default_ale_{p}"] ** 2, 0.0) for p in ("cal", "te")}
    cap = epistemic_cap(epi_g["cal"])
    lam = fit_epistemic_weight(y_cal - mc, ale["cal"], epi_g["cal"], cap)
    sg = {p: weighted_moments((_t(d[f"het_mu_{p}"]), _t(ale[p]), _t(epi_g[p])), 0.0, lam, cap).std.numpy()[:, 0]
          for p in ("cal", "te")}
    out["gauss_epi"] = (*_normalised(y_cal, mc, sg["cal"], mt, sg["te"]), sg["te"])
    gap = {p: (d[f"het_mu_{p}"] - d[f"default_mu_{p}"]) ** 2 for p in ("cal", "te")}
    nll = [_profile_nll(y_cal - mc, sd_c**2 + k * gap["cal"]) for k in KAPPAS]
    kappa = float(KAPPAS[int(np.argmin(nll))])  # the first of equal minima: κ = 0 unless the gap helps
    s = {"cal": np.sqrt(sd_c**2 + kappa * gap["cal"]), "te": np.sqrt(sd_t**2 + kappa * gap["te"])}
    out["disagreement"] = (*_normalised(y_cal, mc, s["cal"], mt, s["te"]), s["te"])
    if held is not None:
        def features(X, s2):
            return np.c_[(X - held["x_mean"]) / held["x_std"], np.log(s2)]
        v = log_linear_variance(held["r_held"], features(held["X_held"], held["ale_held"] ** 2))
        var = {"cal": np.exp(v[0] + features(held["X_cal"], ale["cal"]) @ v[1:]),
               "te": np.exp(v[0] + features(d["X_te"], ale["te"]) @ v[1:])}
        s = {p: np.sqrt(var[p]) for p in var}
        out["honest_scale"] = (*_normalised(y_cal, mc, s["cal"], mt, s["te"]), s["te"])
        m = np.quantile(epi["cal"], EXCESS_QUANTILE)
        s = {p: np.sqrt(var[p] + np.maximum(epi[p] - m, 0.0)) for p in var}
        out["honest_scale_excess"] = (*_normalised(y_cal, mc, s["cal"], mt, s["te"]), s["te"])
    out["split_nn"] = (*rcal.intervals("split_nn", d), np.ones_like(mt))
    return out


def score(lo, hi, sd, y) -> dict:
    """Coverage, interval score and per-quintile (of ``sd``) counts of one method on one run."""
    cov = (lo <= y) & (y <= hi)
    covered, n = rcal._quintile_counts(sd, cov)
    return {"coverage": float(cov.mean()),
            "interval_score": float(np.mean(hi - lo + 2 / (1 - LEVEL) * ((lo - y) * (y < lo) + (y - hi) * (y > hi)))),
            "covered": covered, "n": n}


def run(args) -> dict:
    results = {}
    for study in args.studies:
        runs = []
        for group, index, path in rcal._cached_runs(study):
            if group not in args.datasets or (study == "uci" and index >= args.splits):
                continue
            d = dict(np.load(path))
            held = held_out_fit(group, index, args.data_dir) if study == "uci" else None
            ints = probe_intervals(d, held)
            runs.append({"group": group, "index": index, "n_cal": int(len(d["y_cal"])),
                         "methods": {m: score(lo, hi, sd, d["y_te"]) for m, (lo, hi, sd) in ints.items()}})
            print(f"[{study}] {group} {index}", flush=True)
        results[study] = runs
    return results


def _pooled(runs, m):
    c = np.sum([r["methods"][m]["covered"] for r in runs], axis=0)
    n = np.sum([r["methods"][m]["n"] for r in runs], axis=0)
    return c / np.maximum(n, 1)


def _ratio(runs, m):
    return float(np.exp(np.mean([np.log(r["methods"][m]["interval_score"] / r["methods"]["split_nn"]["interval_score"])
                                 for r in runs])))


def render(p: dict) -> str:
    lines = ["# Four more attempts at the dev sets' σ̂ fifths: held-out residual scale, finite Mondrian bins, the "
             "homoscedastic epistemic part, two networks' disagreement", "", f"`{p['command']}`", "",
             _common.machine_line(p["machine"]), "",
             "Per method, per set: interval score / split conformal around the homoscedastic network (geometric "
             "mean over the runs), mean coverage, and coverage per quintile of the method's own σ̂ pooled over the "
             "runs (target in distribution: every quintile 85–95 %).", ""]
    for m, text in METHODS:
        lines.append(f"- `{m}`: {text}")
    titles = {"uci": "UCI dev sets, standard splits, in distribution",
              "shift": "UCI dev sets, top-third extrapolation (feature f = 0..3 held out above its 2/3 quantile)"}
    for study in ("uci", "shift"):
        runs = p.get(study)
        if not runs:
            continue
        groups = list(dict.fromkeys(r["group"] for r in runs))
        lines += ["", f"## {titles[study]}", "",
                  "| method | geo. mean IS ratio | " + " | ".join(groups) + " | sets with every quintile in 85–95 % |",
                  "|---|---:|" + "---|" * len(groups) + "---:|"]
        for m, _ in METHODS:
            if m == "split_nn" or m not in runs[0]["methods"]:
                continue
            cells, ratios, ok = [], [], 0
            for g in groups:
                rs = [r for r in runs if r["group"] == g]
                ratio, q = _ratio(rs, m), _pooled(rs, m)
                cov = 100 * np.mean([r["methods"][m]["coverage"] for r in rs])
                ratios.append(ratio)
                ok += bool(q.min() >= BAND[0] and q.max() <= BAND[1])
                cells.append(f"{ratio:.3f}, {cov:.1f} %, " + " / ".join(f"{100 * v:.0f}" for v in q))
            lines.append(f"| `{m}` | {np.exp(np.mean(np.log(ratios))):.3f} | " + " | ".join(cells)
                         + f" | {ok} of {len(groups)} |")
    lines += ["", _common.DISCUSSION_MARK, ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_arguments(parser, quick="energy, 2 splits")
    parser.add_argument("--studies", nargs="+", default=["uci", "shift"], choices=["uci", "shift"])
    parser.add_argument("--datasets", nargs="+", default=["concrete", "energy", "wine-quality-red", "yacht"])
    parser.add_argument("--splits", type=int, default=20)
    parser.add_argument("--data-dir", type=Path, default=_common.data_dir("uci"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    if args.quick:
        args.datasets, args.splits = ["energy"], 2
    json_path, md_path = _common.output_paths(args, "ranking_probes")
    if args.report_only:
        print(_common.report_from_results(json_path, md_path, render)[1])
        return
    print(_common.write_results_and_report(json_path, md_path, run(args), render,
                                           command=_common.command_line(__file__, argv))[1])


if __name__ == "__main__":
    main()
