"""UCI regression benchmark: GLAS against split conformal, conformalised Laplace, laplace-torch and a deep ensemble.

Data: folders in the standard UCI split format (``data.txt``, ``index_features.txt``, ``index_target.txt``,
``index_train_K.txt`` / ``index_test_K.txt``), by default ``$GLAS_DATA_DIR/uci``, else ``../shared/data/uci``
relative to the repository (concrete, energy, yacht, wine-quality-red with their 20 splits). Any other folder in
that format runs unchanged: ``--data-dir DIR --datasets NAME [NAME ...]``.

Per split
---------
1. The training rows are split at random (seeded by the split number) into a fitting part (90 %) and a
   calibration part (10 %). Inputs and target are standardised with the statistics of the fitting part.
2. Five networks (8-50-1 style: one hidden layer of 50 tanh units) are trained on the fitting part with Adam and a
   fixed budget (``--epochs`` epochs of mini-batches of ``--batch-size``, learning rate ``--lr``), each from its own
   initialisation and its own batch order. The five are trained together as one batched model (Adam is
   element-wise, so this is exactly five independent trainings, just cheaper in Python overhead).
   Member 0 is *the* network that every post-hoc method below uses; all five form the deep ensemble.
   The trained network is wrapped so that it takes inputs and returns outputs in the original units (the
   standardisation lives in buffers, not weights), so all methods see the same function and D.
3. On the test rows, at the 90 % level:
   - GLAS (ours), ``LaplaceActiveSubspaceRegressor(module=net, prefit=True)`` fitted on the fitting part with the
     calibration part passed as ``X_cal``/``y_cal``; scaling mean/standard × predictive sampled/linearised,
     ``n_components="auto"`` (d chosen on the calibration part, d_max = ``--max-components``), noise σ from the
     training residuals (``noise_std="training"``). The intervals are GLAS's own (parameter-uncertainty intervals
     whose d is calibrated to cover y, as in the paper); NLL uses the variance σ_f² + σ².
   - Split conformal: MAPIE ``SplitConformalRegressor`` (absolute score, prefit) on the same network and
     calibration part.
   - Conformalised Laplace: MAPIE ``SplitConformalRegressor`` with ``conformity_score="std_normalized"`` wrapping
     the fitted GLAS regressor (mean scaling, linearised), whose ``predict(X, return_std=True)`` gives σ_f;
     and the same with the standard deviation σ_f ⊕ σ = sqrt(σ_f² + σ²) (a thin wrapper adds the noise).
     Note: the calibration part has already been used by GLAS to choose d, so the conformal guarantee is
     only approximate here (the score's normalisation depends weakly on that choice).
   - laplace-torch (when importable): full-network Kronecker-factored GGN Laplace, GLM (linearised) predictive,
     prior precision by marginal likelihood, σ fixed to the training-residual std; intervals
     μ ± z·sqrt(f_var + σ²).
   - Deep ensemble of the five networks: μ = mean of the members, variance = variance of the members' means +
     mean of the members' noise variances, each member's noise variance being its mean squared training
     residual on the fitting part; intervals μ ± z·sqrt(variance), z = 1.645 at 90 %.
   - The default end to end (``default``: ``LaplaceActiveSubspaceRegressor(random_state=split)`` fitted on the
     fitting part with ``X_cal``/``y_cal`` the calibration part, raw features) and the tabular peers on the same
     rows (``_common.TABULAR_PEERS``: MAPIE split conformal and CQR around HistGradientBoosting, the quantile
     regression forest raw and with CQR, crepes normalised and Mondrian conformal around HistGradientBoosting,
     NGBoost raw and conformalised; a peer whose package is missing is skipped with a note), and the prototype
     ``hgb_residual`` (the default fitted to the boosted trees' out-of-fold residuals). ``--methods tabular``
     computes these alone, without training the networks; ``--merge TAG`` adds a tagged run's rows to uci.json
     (``--default-from`` takes the default's rows from regional_coverage's uci study, the same rows and seeds).
4. Metrics, in the original target units: coverage, mean width, interval (Winkler) score, Gaussian NLL
   (not defined for conformal methods, shown as '–'), RMSE, and the fit + predict wall time. Post-hoc methods'
   times exclude training the shared network; the ensemble's time includes training all five members.

Usage
-----
    python benchmarks/uci.py                         # all data sets, all 20 splits
    python benchmarks/uci.py --splits 5              # splits 0..4
    python benchmarks/uci.py --datasets yacht --splits 0 3 7
    python benchmarks/uci.py --quick                 # smoke test: 1 split, small budgets, *_quick outputs
    python benchmarks/uci.py --report-only [--tag epochs500]   # the report again from uci[_TAG].json
    python benchmarks/uci.py --methods tabular --tag peers    # the default and the tabular peers only
    python benchmarks/uci.py --merge peers                    # their rows into uci.json / uci.md

Writes ``benchmarks/results/uci.json`` and the report ``uci.md`` rendered from it (``uci_quick.*`` with
``--quick``), after every split, and prints the table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import time
import warnings
from pathlib import Path

import _common
import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from torch import nn

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Posterior
from glas_sklearn.metrics import coverage_score, interval_score, mean_width_score
from glas_sklearn.regional_coverage import worst_slab_coverage

LEVEL = 0.9
Z = 1.6448536269514722  # standard normal 95 % quantile: central 90 % interval
DEFAULT_DATASETS = ["concrete", "energy", "yacht", "wine-quality-red"]

METHODS = [
    ("glas_mean_sampled", "GLAS mean, sampled"),
    ("glas_mean_linearized", "GLAS mean, linearised"),
    ("glas_standard_sampled", "GLAS standard, sampled"),
    ("glas_standard_linearized", "GLAS standard, linearised"),
    ("glas_mean_linearized_calnoise", "GLAS mean, linearised, σ from calibration residuals"),
    ("glas_mean_sampled_y", "GLAS mean, sampled, intervals for y (include_noise)"),
    ("glas_mean_linearized_y", "GLAS mean, linearised, intervals for y (include_noise)"),
    ("glas_standard_linearized_y", "GLAS standard, linearised, intervals for y (include_noise)"),
    ("glas_conformal_ebsub", "GLAS default: low-rank posterior, conformal (d = d_max, σ0 by subspace EB)"),
    ("glas_conformal", "GLAS low-rank, conformal, σ0 by full-space EB"),
    ("glas_conformal_nll", "GLAS low-rank, conformal, σ0 by the NLL of half the calibration rows (sigma0='nll')"),
    ("glas_conformal_nll_y", "GLAS low-rank, conformal, σ0 by NLL, σ̂ = σ_f ⊕ σ (include_noise)"),
    ("glas_conformal_y", "GLAS low-rank, conformal, σ0 by full-space EB, σ̂ = σ_f ⊕ σ (include_noise)"),
    ("glas_conformal_subspace_y", "GLAS subspace posterior, conformal, σ̂ = σ_f ⊕ σ"),
    ("split_conformal", "Split conformal (MAPIE, absolute)"),
    ("conformal_laplace", "Conformalised Laplace (MAPIE std_normalized, σ_f)"),
    ("conformal_laplace_noise", "Conformalised Laplace (MAPIE std_normalized, σ_f ⊕ σ)"),
    ("laplace_torch", "laplace-torch (full Kron GGN, GLM, marglik)"),
    ("deep_ensemble", "Deep ensemble (5)"),
    ("default", "ours, the default end to end: `LaplaceActiveSubspaceRegressor(random_state=split)` fitted on the "
                "fitting rows, `X_cal`/`y_cal` the calibration rows (raw features)"),
    *((k, v[1]) for k, v in _common.TABULAR_PEERS.items()),
    ("hgb_residual", "prototype (issue 65): the default fitted to HistGradientBoosting's out-of-fold residuals, "
                     "intervals h(x) + the residual's (`_common.default_on_hgb_residuals`)"),
]
#: The rows that need the trained networks (everything but the default fitted end to end and the tabular peers).
NETWORK_METHODS = [k for k, _ in METHODS if k not in ("default", "hgb_residual") and k not in _common.TABULAR_PEERS]
#: The rows of the comparison with the tabular peers: the default and the peers, raw features.
TABULAR_METHODS = ["default", *_common.TABULAR_PEERS]


# ----------------------------------------------------------------------------------------------- peers, optional
_import_laplace_torch = _common.import_laplace_torch
_version = _common.package_version


# ----------------------------------------------------------------------------------------------------- networks
BatchedMLP = _common.BatchedMLP
members_loss = _common.members_loss


def train_members(X: np.ndarray, y: np.ndarray, *, n_members: int, n_hidden: int, epochs: int, lr: float,
                  batch_size: int, seed: int) -> tuple[list[nn.Sequential], float]:
    """Train n_members networks on standardised (X, y) with Adam (mean squared error), each with its own
    initialisation and batch order; returns the members and the wall time."""
    t0 = time.perf_counter()
    model = BatchedMLP(n_members, X.shape[1], n_hidden, seed)
    Xt = torch.as_tensor(X, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.float32)[:, None]
    _common.train_adam(model, Xt, yt, lr=lr, epochs=epochs, batch_size=batch_size, members=n_members, seed=seed + 1,
                       loss=members_loss)
    members = [model.member(e) for e in range(n_members)]
    for m in members:
        for p in m.parameters():
            p.requires_grad_(True)
    return members, time.perf_counter() - t0


InOriginalUnits = _common.InOriginalUnits
_predict = _common.predict_module
TorchPrefitRegressor = _common.TorchPrefitRegressor


class StdWithNoise(RegressorMixin, BaseEstimator):
    """A fitted GLAS regressor whose ``predict(X, return_std=True)`` returns sqrt(σ_f² + σ²)."""

    def __init__(self, estimator=None):
        self.estimator = estimator

    def fit(self, X, y):
        raise NotImplementedError("StdWithNoise wraps an already fitted regressor.")

    def predict(self, X, return_std=False):
        y_pred, y_std = self.estimator.predict(X, return_std=True)
        if not return_std:
            return y_pred
        return y_pred, np.sqrt(y_std ** 2 + self.estimator.noise_std_ ** 2)

    def __sklearn_is_fitted__(self):
        return True


# ------------------------------------------------------------------------------------------------------ metrics
N_BINS = 5


def _binned_coverage(inside: np.ndarray, key: np.ndarray) -> list:
    """Coverage within the quintiles of ``key`` (ties kept together by a stable sort): five numbers."""
    order = np.argsort(key, kind="stable")
    return [float(inside[b].mean()) for b in np.array_split(order, N_BINS)]


def metrics(y: np.ndarray, y_pred: np.ndarray, lower: np.ndarray, upper: np.ndarray, var: np.ndarray | None,
            seconds: float, dist: np.ndarray | None = None, X_slab: np.ndarray | None = None) -> dict:
    """Coverage, width, Winkler score, Gaussian NLL (when a predictive variance is given), RMSE, time, and the
    conditional coverage diagnostics: coverage by quintile of interval width (MAPIE's size-stratified coverage)
    and, when ``dist`` (each test row's distance to the nearest fitting row) is given, by quintile of distance."""
    pis = np.stack([lower, upper], axis=1)  # (n, 2)
    cov = coverage_score(y, pis)
    width = mean_width_score(pis)
    winkler = interval_score(y, pis, confidence_level=LEVEL)
    nll = None
    if var is not None:
        var = np.maximum(var, 1e-300)
        nll = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (y - y_pred) ** 2 / var))
    inside = (y >= lower) & (y <= upper)
    out = {"coverage": float(cov), "width": float(width), "interval_score": float(winkler), "nll": nll,
           "rmse": float(np.sqrt(np.mean((y - y_pred) ** 2))), "time": float(seconds),
           "coverage_by_width": _binned_coverage(inside, upper - lower)}
    if dist is not None:
        out["coverage_by_distance"] = _binned_coverage(inside, dist)
    if X_slab is not None:  # worst-slab coverage over the (standardised) test inputs, δ = 0.1, 100 directions
        out["worst_slab"] = float(worst_slab_coverage(X_slab, y, pis, delta=0.1, n_directions=100, random_state=0))
    return out


# ------------------------------------------------------------------------------------------------------ methods
def run_glas(net, X_fit, y_fit, X_cal, y_cal, X_te, y_te, *, scaling, predictive, n_samples, max_components, seed,
             noise_std="training", include_noise=False, calibration="coverage", posterior="subspace", sigma0="auto",
             dist=None, X_slab=None):
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = LaplaceActiveSubspaceRegressor(module=net, prefit=True, scaling=scaling, confidence_level=LEVEL,
                                             noise_std=noise_std, calibration=calibration, sigma0=sigma0,
                                             random_state=seed,
                                             posterior=Posterior(kind=posterior, predictive=predictive,
                                                                 n_samples=n_samples, max_components=max_components,
                                                                 include_noise=include_noise),
                                             compute=Compute(device="cpu"))
        est.fit(X_fit, y_fit, X_cal=X_cal, y_cal=y_cal)
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    y_pred, y_pis = est.predict_interval(X_te)
    _, std = est.predict(X_te, return_std=True)  # of y with include_noise, of f otherwise
    std = std / est.std_scale_[0]  # the conformal normalisation σ̂ (return_std is calibrated by std_scale_)
    t_pred = time.perf_counter() - t0
    var = std ** 2 if include_noise else std ** 2 + est.noise_std_ ** 2
    f_std = np.sqrt(np.maximum(var - est.noise_std_ ** 2, 0.0))
    out = metrics(y_te, y_pred, y_pis[:, 0, 0], y_pis[:, 1, 0], var, t_fit + t_pred, dist, X_slab)
    cal = est.calibration_
    if calibration == "conformal":  # the NLL of the Gaussian the conformal interval implies: N(ŷ, (q σ̂ / z)²)
        q = float(cal["quantile"].iloc[0])
        v = (q * np.sqrt(var if include_noise else np.maximum(var - est.noise_std_ ** 2, 0.0)) / Z) ** 2
        v = np.maximum(v, 1e-300)
        out["nll_interval"] = float(np.mean(0.5 * np.log(2 * np.pi * v) + 0.5 * (y_te - y_pred) ** 2 / v))
    out.update({"d": int(est.n_components_), "reached": est.calibration_reached_ is not False,
                "cal_coverage": float(cal.loc[cal["d"] == est.n_components_, "coverage"].iloc[0]),
                "noise_std": float(est.noise_std_), "sigma0": float(est.sigma0_),
                "mean_f_std": float(np.mean(f_std)), "eigen_converged": bool(est.eigen_info_["converged"]),
                # torch's own DeprecationWarnings (first forward-mode JVP) are not the library's
                "warnings": sorted({type(w.message).__name__ for w in caught
                                    if not (issubclass(w.category, DeprecationWarning)
                                            and "/torch/" in str(w.filename))})})
    return out, est


def run_split_conformal(net, X_cal, y_cal, X_te, y_te, dist=None, X_slab=None):
    from mapie.regression import SplitConformalRegressor
    t0 = time.perf_counter()
    wrapped = TorchPrefitRegressor(net)
    wrapped.n_features_in_ = X_cal.shape[1]  # marks it fitted for MAPIE's own check
    scr = SplitConformalRegressor(wrapped, confidence_level=LEVEL, conformity_score="absolute", prefit=True)
    scr.conformalize(X_cal, y_cal)
    y_pred, y_pis = scr.predict_interval(X_te)
    return metrics(y_te, y_pred, y_pis[:, 0, 0], y_pis[:, 1, 0], None, time.perf_counter() - t0, dist, X_slab)


def run_conformal_laplace(est, X_cal, y_cal, X_te, y_te, *, with_noise: bool, glas_seconds: float, dist=None,
                          X_slab=None):
    from mapie.regression import SplitConformalRegressor
    t0 = time.perf_counter()
    inner = est
    if with_noise:
        inner = StdWithNoise(est)
        inner.n_features_in_ = est.n_features_in_  # marks it fitted for MAPIE's own check
    scr = SplitConformalRegressor(inner, confidence_level=LEVEL, conformity_score="std_normalized", prefit=True)
    scr.conformalize(X_cal, y_cal)
    y_pred, y_pis = scr.predict_interval(X_te)
    return metrics(y_te, y_pred, y_pis[:, 0, 0], y_pis[:, 1, 0], None,
                   glas_seconds + time.perf_counter() - t0, dist, X_slab)  # includes fitting the wrapped GLAS regressor


def run_laplace_torch(Laplace, net, X_fit, y_fit, X_te, y_te, noise_std, dist=None, X_slab=None):
    t0 = time.perf_counter()
    predict, prior_precision = _common.laplace_kron(Laplace, net, X_fit, y_fit, noise_std)
    mu, f_var = predict(X_te)
    var = f_var + noise_std ** 2
    half = Z * np.sqrt(var)
    out = metrics(y_te, mu, mu - half, mu + half, var, time.perf_counter() - t0, dist, X_slab)
    out["prior_precision"] = prior_precision
    return out


def run_ensemble(members_orig, X_fit, y_fit, X_te, y_te, train_seconds, dist=None, X_slab=None):
    t0 = time.perf_counter()
    preds = np.stack([_predict(m, X_te) for m in members_orig])  # (E, n)
    noise = np.array([np.mean((y_fit - _predict(m, X_fit)) ** 2) for m in members_orig])
    mu = preds.mean(0)
    var = preds.var(0) + noise.mean()
    half = Z * np.sqrt(var)
    out = metrics(y_te, mu, mu - half, mu + half, var, train_seconds + time.perf_counter() - t0, dist, X_slab)
    out["noise_std"] = float(np.sqrt(noise.mean()))
    return out


def run_default(X_fit, y_fit, X_cal, y_cal, X_te, y_te, *, seed, dist=None, X_slab=None):
    """The default estimator end to end on the raw features: fitted on the fitting rows, calibrated on the
    calibration rows (``X_cal``/``y_cal``), as the shift study's ``default`` row."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(random_state=seed).fit(X_fit, y_fit, X_cal=X_cal, y_cal=y_cal)
    y_pred, pis = est.predict_interval(X_te)
    return metrics(y_te, y_pred, pis[:, 0, 0], pis[:, 1, 0], None, time.perf_counter() - t0, dist, X_slab)


def run_tabular_peer(name, X_fit, y_fit, X_cal, y_cal, X_te, y_te, *, seed, dist=None, X_slab=None, cache=None):
    """A tabular peer (:data:`_common.TABULAR_PEERS`) on the same rows as the default; its RMSE is that of the
    interval's midpoint. Its time is that of the call (a family's model fitted once: in the first of its rows)."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pis, _ = _common.tabular_peer(name, X_fit, y_fit, X_cal, y_cal, X_te, seed, level=LEVEL, cache=cache)
    return metrics(y_te, pis.mean(1), pis[:, 0], pis[:, 1], None, time.perf_counter() - t0, dist, X_slab)


# -------------------------------------------------------------------------------------------------------- a split
def run_split(folder: Path, split: int, cfg: argparse.Namespace, Laplace) -> dict:
    """One standard random split: every method."""
    X, y, train, test = _common.load_uci(folder, split)
    return run_rows(X, y, train, test, split, cfg, Laplace)


def run_rows(X, y, train, test, split: int, cfg: argparse.Namespace, Laplace) -> dict:
    """All methods on one train/test partition (the training rows split 90/10 into fitting/calibration at
    random, seeded by ``split``), on the same network."""
    rng = np.random.default_rng(1000 + split)
    perm = rng.permutation(train)
    n_cal = int(round(0.1 * len(train)))
    cal, fit = perm[:n_cal], perm[n_cal:]
    X_fit, y_fit, X_cal, y_cal, X_te, y_te = X[fit], y[fit], X[cal], y[cal], X[test], y[test]
    mx, sx = X_fit.mean(0), X_fit.std(0)
    sx[~(sx > 0)] = 1.0
    # each test row's Euclidean distance to the nearest fitting row, in standardised inputs
    A, B = (X_te - mx) / sx, (X_fit - mx) / sx
    dist = np.sqrt(np.maximum((A**2).sum(1)[:, None] + (B**2).sum(1)[None] - 2 * A @ B.T, 0.0)).min(1)
    wanted = set(getattr(cfg, "methods", None) or [k for k, _ in METHODS])
    res: dict = {"split": split, "n_fit": len(fit), "n_cal": len(cal), "n_test": len(test), "methods": {}}
    if wanted & set(NETWORK_METHODS):
        run_network_methods(res, X_fit, y_fit, X_cal, y_cal, X_te, y_te, (mx, sx), dist, A, split, cfg, Laplace)
    rows = (X_fit, y_fit, X_cal, y_cal, X_te, y_te)
    if "default" in wanted:
        res["methods"]["default"] = run_default(*rows, seed=split, dist=dist, X_slab=A)
    if "hgb_residual" in wanted:
        t0 = time.perf_counter()
        y_pred, pis = _common.default_on_hgb_residuals(X_fit, y_fit, X_cal, y_cal, X_te, split, LEVEL)
        res["methods"]["hgb_residual"] = metrics(y_te, y_pred, pis[:, 0], pis[:, 1], None, time.perf_counter() - t0,
                                                 dist, A)
    missing = _common.tabular_peers_missing(wanted & set(_common.TABULAR_PEERS))
    cache: dict = {}  # each family fitted once for its raw and its calibrated row
    for name in _common.TABULAR_PEERS:
        if name in wanted and name not in missing:
            res["methods"][name] = run_tabular_peer(name, *rows, seed=split, dist=dist, X_slab=A, cache=cache)
    if missing:
        res["skipped"] = missing
    return res


def run_network_methods(res, X_fit, y_fit, X_cal, y_cal, X_te, y_te, x_stats, dist, A, split, cfg, Laplace):
    """The rows around the trained networks (the paper's method, the defaults around a prefit network, the
    conformal and Bayesian peers, the deep ensemble), into ``res``."""
    mx, sx = x_stats
    my, sy = y_fit.mean(), y_fit.std()
    members, t_train = train_members((X_fit - mx) / sx, (y_fit - my) / sy, n_members=cfg.ensemble,
                                     n_hidden=cfg.hidden, epochs=cfg.epochs, lr=cfg.lr,
                                     batch_size=cfg.batch_size, seed=10_000 * split + 7)
    members_orig = [InOriginalUnits(m, mx, sx, my, sy).eval() for m in members]
    net = members_orig[0]
    res.update({"train_seconds_all_members": t_train, "D": sum(p.numel() for p in net.parameters())})
    seed = split
    common = dict(n_samples=cfg.n_samples, max_components=cfg.max_components, seed=seed, dist=dist, X_slab=A)
    rows = (X_fit, y_fit, X_cal, y_cal, X_te, y_te)

    ests = {}
    paper = [(a, b) for a in ("mean", "standard") for b in ("sampled", "linearized")]
    for scaling, predictive in paper:  # the paper's method, its settings passed explicitly
        key = f"glas_{scaling}_{predictive}"
        res["methods"][key], ests[key] = run_glas(net, *rows, scaling=scaling, predictive=predictive, **common)
    res["methods"]["glas_mean_linearized_calnoise"], _ = run_glas(
        net, *rows, scaling="mean", predictive="linearized", noise_std="calibration", **common)
    for scaling, predictive in (("mean", "sampled"), ("mean", "linearized"), ("standard", "linearized")):
        res["methods"][f"glas_{scaling}_{predictive}_y"], _ = run_glas(
            net, *rows, scaling=scaling, predictive=predictive, include_noise=True, **common)
    # the new settings: d = d_max, split-conformal calibration, σ from the training residuals
    conformal = dict(scaling="mean", predictive="auto", calibration="conformal", **common)
    res["methods"]["glas_conformal"], _ = run_glas(net, *rows, posterior="low_rank", sigma0="eb_full", **conformal)
    res["methods"]["glas_conformal_y"], _ = run_glas(net, *rows, posterior="low_rank", include_noise=True,
                                                     sigma0="eb_full", **conformal)
    res["methods"]["glas_conformal_ebsub"], _ = run_glas(net, *rows, posterior="low_rank", sigma0="eb_subspace",
                                                         **conformal)
    res["methods"]["glas_conformal_nll"], _ = run_glas(net, *rows, posterior="low_rank", sigma0="nll", **conformal)
    res["methods"]["glas_conformal_nll_y"], _ = run_glas(net, *rows, posterior="low_rank", sigma0="nll",
                                                         include_noise=True, **conformal)
    res["methods"]["glas_conformal_subspace_y"], _ = run_glas(net, *rows, posterior="subspace", include_noise=True,
                                                              **{**conformal, "predictive": "linearized"})
    res["methods"]["split_conformal"] = run_split_conformal(net, X_cal, y_cal, X_te, y_te, dist, A)
    base = ests["glas_mean_linearized"]
    t_base = res["methods"]["glas_mean_linearized"]["time"]
    res["methods"]["conformal_laplace"] = run_conformal_laplace(base, X_cal, y_cal, X_te, y_te, with_noise=False,
                                                                glas_seconds=t_base, dist=dist, X_slab=A)
    res["methods"]["conformal_laplace_noise"] = run_conformal_laplace(base, X_cal, y_cal, X_te, y_te,
                                                                      with_noise=True, glas_seconds=t_base, dist=dist,
                                                                      X_slab=A)
    if Laplace is not None:
        try:
            noise_std = float(np.sqrt(np.mean((y_fit - _predict(net, X_fit)) ** 2)))
            res["methods"]["laplace_torch"] = run_laplace_torch(Laplace, net, X_fit, y_fit, X_te, y_te, noise_std,
                                                                dist, A)
        except Exception as err:  # noqa: BLE001 - a peer failing must not stop the benchmark
            print(f"[uci] laplace-torch failed on split {split}: {type(err).__name__}: {err}", flush=True)
            res["laplace_torch_error"] = f"{type(err).__name__}: {err}"
    res["methods"]["deep_ensemble"] = run_ensemble(members_orig, X_fit, y_fit, X_te, y_te, t_train, dist, A)


# ------------------------------------------------------------------------------------------------------- report
def _mean_se(values):
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return None, None
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se


def summarise(splits: list[dict]) -> dict:
    summary = {}
    for key, _ in METHODS:
        rows = [s["methods"][key] for s in splits if key in s["methods"]]
        if not rows:
            continue
        entry = {"n_splits": len(rows)}
        for m in ("coverage", "width", "interval_score", "nll", "nll_interval", "rmse", "time", "d",
                  "cal_coverage", "worst_slab"):
            if m in rows[0]:
                mean, se = _mean_se([r.get(m) for r in rows])
                entry[m] = {"mean": mean, "se": se}
        for m in ("coverage_by_width", "coverage_by_distance"):
            if all(m in r for r in rows):
                entry[m] = np.mean([r[m] for r in rows], axis=0).tolist()
        if "reached" in rows[0]:
            entry["reached_share"] = float(np.mean([r["reached"] for r in rows]))
        summary[key] = entry
    return summary


def _fmt(entry, metric, digits, scale=1.0):
    v = entry.get(metric)
    if v is None or v["mean"] is None:
        return "–"
    se = "" if not np.isfinite(v["se"]) else f" ± {v['se'] * scale:.{digits}f}"
    return f"{v['mean'] * scale:.{digits}f}{se}"


def table_markdown(name: str, summary: dict, n_splits: int, train_seconds: tuple | None) -> str:
    regional = any("worst_slab" in e for e in summary.values())  # runs before the per-region columns lack them
    lines = [f"### {name} ({n_splits} split{'s' if n_splits != 1 else ''})", "",
             "| method | coverage (%) | width | interval score | NLL | RMSE | time (s) | d |"
             + (" coverage per width quintile (%), min–max | worst slab (%) |" if regional else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if regional else "")]
    for key, label in METHODS:
        if key not in summary:
            continue
        e = summary[key]
        d = "–"
        if "d" in e:
            d = _fmt(e, "d", 1) + (f" (reached {e['reached_share']:.0%})" if e.get("reached_share", 1) < 1 else "")
        if e["n_splits"] != n_splits:
            label += f" ({e['n_splits']} splits)"
        row = (f"| {label} | {_fmt(e, 'coverage', 1, 100)} | {_fmt(e, 'width', 3)} | "
               f"{_fmt(e, 'interval_score', 3)} | {_fmt(e, 'nll', 3)} | {_fmt(e, 'rmse', 3)} | "
               f"{_fmt(e, 'time', 2)} | {d} |")
        if regional:
            q = e.get("coverage_by_width", [])
            row += f" {100 * min(q):.0f}–{100 * max(q):.0f} |" if q else " – |"
            row += f" {_fmt(e, 'worst_slab', 0, 100)} |"
        lines.append(row)
    lines.append("")
    if regional:
        lines.append("Per-region columns: coverage in the quintiles of the interval width (the σ̂ quintiles for "
                     "intervals ŷ ± q σ̂; for a constant width, as split conformal's, they follow the row order and "
                     "say nothing), averaged over the splits, lowest and "
                     "highest; worst-slab coverage over the standardised test inputs (slabs of ≥ 10 % of the test "
                     "rows, 100 directions), mean over the splits.")
        lines.append("")
    if train_seconds is not None:
        lines.append(f"Training the five networks (batched, one pass) took {train_seconds[0]:.1f} ± "
                     f"{train_seconds[1]:.1f} s per split; it is in the ensemble's time and not in the post-hoc "
                     "methods' times.")
        lines.append("")
    return "\n".join(lines)


def findings(results: dict) -> list[str]:
    """Sentences computed from the results: the questions the benchmark was set up to answer."""
    lines = ["## Findings (computed from the results above)", ""]
    gaps, ours_wins, n_sets = {"glas_mean_sampled": [], "glas_mean_linearized": []}, 0, 0
    for name, ds in results["datasets"].items():
        splits = ds["splits"]
        if not splits or "split_conformal" not in splits[0]["methods"]:
            continue
        n_sets += 1
        summ = ds["summary"]
        sc = summ["split_conformal"]["interval_score"]["mean"]
        parts = []
        for key in gaps:
            cov = summ[key]["coverage"]["mean"]
            gaps[key].append(cov)
            is_ = summ[key]["interval_score"]["mean"]
            wins = sum(s["methods"][key]["interval_score"] < s["methods"]["split_conformal"]["interval_score"]
                       for s in splits)
            parts.append(f"{key.split('_')[-1]}: coverage {100 * cov:.1f} %, interval score {is_:.3g} vs split "
                         f"conformal {sc:.3g} ({100 * (is_ / sc - 1):+.0f} %; better on {wins}/{len(splits)} splits)")
        if summ["glas_mean_linearized"]["interval_score"]["mean"] < sc:
            ours_wins += 1
        std = [summ[k]["coverage"]["mean"] for k in ("glas_standard_sampled", "glas_standard_linearized")]
        d_std = summ["glas_standard_linearized"]["d"]["mean"]
        best = min((e["interval_score"]["mean"], k) for k, e in summ.items())
        label = dict(METHODS)[best[1]]
        lo, hi = f"{100 * min(std):.0f}", f"{100 * max(std):.0f}"
        lines.append(f"- **{name}**: GLAS mean scaling — " + "; ".join(parts) + ". Standard scaling covers "
                     f"{lo if lo == hi else lo + '–' + hi} % at d = {d_std:.0f}. Best interval score: "
                     f"{label} ({best[0]:.3g}).")
    if n_sets:
        for key, covs in gaps.items():
            lines.append(f"- GLAS mean, {key.split('_')[-1]}: coverage averaged over the {n_sets} sets "
                         f"{100 * np.mean(covs):.1f} % (target 90 %).")
        lines.append(f"- GLAS mean (linearised) has a better mean interval score than split conformal on "
                     f"{ours_wins} of {n_sets} sets.")
        for key in ("glas_mean_sampled_y", "glas_mean_linearized_y", "glas_standard_linearized_y"):
            per_set = []
            for name, ds in results["datasets"].items():
                summ = ds.get("summary", {})
                if key not in summ or "split_conformal" not in summ:
                    continue
                is_, sc = summ[key]["interval_score"]["mean"], summ["split_conformal"]["interval_score"]["mean"]
                per_set.append(f"{name} {is_:.3g} vs {sc:.3g} ({100 * (is_ / sc - 1):+.0f} %, coverage "
                               f"{100 * summ[key]['coverage']['mean']:.1f} %, d = {summ[key]['d']['mean']:.1f})")
            if per_set:
                wins = sum(" (-" in p for p in per_set)
                lines.append(f"- {dict(METHODS)[key]}: interval score vs split conformal — " + "; ".join(per_set)
                             + f"; better on {wins} of {len(per_set)} sets.")
    lines.append("")
    return lines


CONDITIONAL_METHODS = ("split_conformal", "glas_mean_linearized", "glas_mean_linearized_y", "glas_conformal_ebsub",
                       "glas_conformal", "laplace_torch", "deep_ensemble")


def conditional_markdown(summaries: dict, title: str) -> list[str]:
    """Coverage (%) by quintile of interval width and of distance to the fitting rows, averaged over the runs."""
    lines = [f"#### Conditional coverage, {title}", "",
             "Coverage (%) in the quintiles (Q1 = narrowest / closest) of interval width and of the distance from "
             "each test row to its nearest fitting row (standardised inputs); averaged over the runs.", "",
             "| data set | method | by width Q1…Q5 | by distance Q1…Q5 |", "|---|---|---|---|"]
    for name, summ in summaries.items():
        for key in CONDITIONAL_METHODS:
            e = summ.get(key)
            if not e or "coverage_by_width" not in e:
                continue
            w = " / ".join(f"{100 * v:.0f}" for v in e["coverage_by_width"])
            d = " / ".join(f"{100 * v:.0f}" for v in e.get("coverage_by_distance", [])) or "–"
            lines.append(f"| {name} | {dict(METHODS)[key]} | {w} | {d} |")
    lines.append("")
    return lines


def target_findings(summaries: dict) -> list[str]:
    """The issue's targets for the default (glas_conformal) against split conformal, computed."""
    keys = [k for k in ("glas_conformal_ebsub", "glas_conformal", "glas_conformal_y", "glas_mean_linearized",
                        "glas_mean_linearized_y") if any(k in s for s in summaries.values())]
    lines = []
    for key in keys:
        ratios, covs = {}, []
        for name, summ in summaries.items():
            if key not in summ or "split_conformal" not in summ:
                continue
            ratios[name] = summ[key]["interval_score"]["mean"] / summ["split_conformal"]["interval_score"]["mean"]
            covs.append(summ[key]["coverage"]["mean"])
        if not ratios:
            continue
        per = ", ".join(f"{n} {r:.3f}×" for n, r in ratios.items())
        ok = sum(r <= 1.02 for r in ratios.values())
        lines.append(f"- {dict(METHODS)[key]}: mean coverage {100 * np.mean(covs):.1f} % (lowest set "
                     f"{100 * min(covs):.1f} %); interval score / split conformal's: {per} (≤ 1.02× on {ok} of "
                     f"{len(ratios)} sets).")
    return lines


def _new_settings_section(summaries: dict) -> list[str]:
    parts = []
    parts.extend(["## The new settings against the issue's targets (computed)", "",
                  "Default: `posterior=\"low_rank\", calibration=\"conformal\"` (linearised, d = d_max, σ0 by "
                  "subspace EB, σ from the training residuals). NLL in the tables is that of the posterior "
                  "predictive N(ŷ, σ_f² + σ²); the interval-implied N(ŷ, (q σ̂ / 1.645)²) is given here.", ""]
                 + target_findings(summaries))
    for name, summ in summaries.items():
        e = summ.get("glas_conformal_ebsub", {})
        if "nll_interval" in e:
            parts.append(f"- {name}: default's interval-implied NLL {e['nll_interval']['mean']:.3f}"
                         f" (posterior predictive {e['nll']['mean']:.3f}; paper settings "
                         f"{summ['glas_mean_linearized']['nll']['mean']:.3f}).")
    parts.append("")
    parts.extend(conditional_markdown(summaries, "random splits"))
    return parts


def render(results: dict) -> str:
    """The markdown report, from the results JSON alone."""
    cfg = results["config"]
    methods = {k for ds in results["datasets"].values() for k in ds["summary"]}
    who = "the defaults, the paper's method" if "glas_conformal" in methods else "the paper's method"
    parts = [f"# UCI regression, random splits: {who} and peers ({cfg['epochs']} epochs)"
             f"{' (quick mode)' if cfg['quick'] else ''}", "",
             f"Generated by `{results['command']}` on {results['date']} "
             f"({_common.machine_line(results['machine'])})"
             + ("; rows merged in from " + " ; ".join(f"`{c}`" for c in results["merged"]) if results.get("merged")
                else "") + ".", "",
             "Setup: per split, a 90 %/10 % random fitting/calibration split of the training rows; inputs and "
             "target standardised with the fitting part's statistics; one-hidden-layer tanh MLP "
             f"({cfg['hidden']} units), Adam lr {cfg['lr']}, {cfg['epochs']} epochs of batches of {cfg['batch_size']} "
             f"(a fixed budget, no early stopping); {cfg['ensemble']} such networks trained from different "
             "initialisations, member 0 being the network all post-hoc methods use. All methods at the 90 % level, "
             "metrics on the test rows in the original target units, mean ± standard error over the splits run.",
             "",
             f"GLAS: `LaplaceActiveSubspaceRegressor(module=net, prefit=True)`, d = \"auto\" (calibration part, "
             f"d_max = {cfg['max_components']}), noise σ from the training residuals, sampled predictive with "
             f"n_samples = {cfg['n_samples']} (the library's default is 1000); one extra row uses "
             "`noise_std=\"calibration\"` (σ from the calibration residuals) instead. GLAS intervals are the paper's "
             "parameter-uncertainty intervals with d calibrated to cover y; its NLL uses σ_f² + σ². "
             + ("The rows 'intervals for y' use `include_noise=True`: intervals of f + N(0, σ²) (σ from the training "
                "residuals; exact mixture quantiles when sampled), with d calibrated for those intervals. "
                if "glas_mean_sampled_y" in methods else "")
             + "Conformalised "
             "Laplace wraps the GLAS mean-scaling linearised regressor (whose d was chosen on the same calibration "
             "part). laplace-torch: full Kron GGN, GLM predictive, prior precision by marginal likelihood, σ = "
             "training-residual std; intervals include σ. Deep ensemble: mean ± 1.645·sqrt(var of member means + "
             "mean member noise variance), each member's noise variance = its mean squared training residual. "
             "NLL is '–' for conformal methods (no predictive density). Time: fit + predict in seconds; post-hoc "
             "methods exclude the network's training; conformalised Laplace includes fitting the wrapped GLAS "
             "regressor; the ensemble includes training all members.", "",
             "Published MC-dropout test log-likelihoods on the same splits (NLL = −LL): concrete 2.93, energy 1.21, "
             "yacht 1.25, wine 0.93; RMSE 4.82, 0.54, 0.67, 0.62.", ""]
    for name, ds in results["datasets"].items():
        if not ds["splits"]:
            continue
        t = [s["train_seconds_all_members"] for s in ds["splits"] if "train_seconds_all_members" in s]
        tm, tse = _mean_se(t)
        train = None if tm is None else (tm, tse if np.isfinite(tse) else 0.0)
        parts.append(table_markdown(name, ds["summary"], len(ds["splits"]), train))
    parts.extend(findings(results))
    parts.extend(tabular_section(results))
    summaries = {n: ds["summary"] for n, ds in results["datasets"].items() if ds["splits"]}
    if any("glas_conformal" in summ for summ in summaries.values()):  # runs before the new settings lack them
        parts.extend(_new_settings_section(summaries))
    parts.append("Peers: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) + ".")
    parts.append("")
    return "\n".join(parts)


def tabular_comparison(results: dict) -> dict:
    """Per data set, on the splits where the default and every tabular peer present ran: each row's mean interval
    score and coverage, its interval score as a ratio to the default's (of the means) and to split conformal
    around HistGradientBoosting's, and on how many splits it beat the default; the best peer."""
    out = {}
    for name, ds in results["datasets"].items():
        splits = [s for s in ds["splits"] if "default" in s["methods"]]
        peers = [k for k in _common.TABULAR_PEERS if any(k in s["methods"] for s in splits)]
        splits = [s for s in splits if all(k in s["methods"] for k in peers)]
        if not splits or not peers:
            continue
        rows = {}
        for key in ["default", *peers]:
            scores = np.array([s["methods"][key]["interval_score"] for s in splits])
            rows[key] = {"interval_score": float(scores.mean()),
                         "coverage": float(np.mean([s["methods"][key]["coverage"] for s in splits])),
                         "wins": int(sum(s["methods"][key]["interval_score"] < s["methods"]["default"]
                                         ["interval_score"] for s in splits))}
        for e in rows.values():
            e["to_default"] = e["interval_score"] / rows["default"]["interval_score"]
            if "split_hgb" in rows:
                e["to_split_hgb"] = e["interval_score"] / rows["split_hgb"]["interval_score"]
        best = min(peers, key=lambda k: rows[k]["interval_score"])
        out[name] = {"n_splits": len(splits), "splits": [s["split"] for s in splits], "rows": rows, "best": best}
    return out


def _split_numbers(numbers: list[int]) -> str:
    """``"0–19"`` for a run of consecutive split numbers, else the numbers."""
    nums = sorted(numbers)
    if len(nums) > 2 and nums == list(range(nums[0], nums[-1] + 1)):
        return f"{nums[0]}–{nums[-1]}"
    return ", ".join(map(str, nums))


def tabular_section(results: dict) -> list[str]:
    """The default against the tabular peers, per data set and over the sets (computed)."""
    comp = tabular_comparison(results)
    if not comp:
        return []
    sets = list(comp)
    keys = [k for k in TABULAR_METHODS if all(k in c["rows"] for c in comp.values())]
    labels = {"default": "ours, default", **{k: k for k in _common.TABULAR_PEERS}}
    lines = ["## Where trees win: the default against the tabular peers (computed)", "",
             "The default fitted end to end and the tabular peers on the same fitting and calibration rows of each "
             "split (raw features; the peers' RMSE above is that of the interval's midpoint). Per set, on the splits "
             "all of them ran: mean interval score (IS) as a ratio to the default's, coverage, and on how many "
             "splits the row beat the default; then the geometric mean over the sets of IS / split conformal around "
             "HistGradientBoosting (`split_hgb`), as issue 65's table. Rows: "
             + "; ".join(f"`{k}` {dict(METHODS)[k]}" for k in keys if k != "default") + ".", ""]
    def count(n):
        return f"{comp[n]['n_splits']} split{'s' if comp[n]['n_splits'] != 1 else ''}"

    header = ["method", *[f"{n} ({count(n)}): IS / default, coverage %, wins" for n in sets]]
    rows = []
    for k in keys:
        cells = [f"`{labels[k]}`"]
        for n in sets:
            e = comp[n]["rows"][k]
            ratio = f"{e['interval_score']:.3g}" if k == "default" else f"{e['to_default']:.3f}×"
            ratio = f"**{ratio}**" if k == comp[n]["best"] else ratio
            cells.append(f"{ratio}, {100 * e['coverage']:.1f}" + ("" if k == "default" else
                                                                   f", {e['wins']}/{comp[n]['n_splits']}"))
        rows.append(cells)
    lines += _common.markdown_table(header, rows, "l" + "r" * len(sets))
    lines += ["", "The default's cells give its mean IS; bold: the best peer of the set. Splits: "
              + "; ".join(f"{n} {_split_numbers(comp[n]['splits'])}" for n in sets) + ".", ""]
    for n in sets:
        c = comp[n]
        d, b = c["rows"]["default"], c["rows"][c["best"]]
        gap = d["interval_score"] / b["interval_score"] - 1
        verdict = (f"the default is {100 * gap:.1f} % behind it" if gap > 0 else
                   f"the default is {100 * -gap:.1f} % ahead of it")
        lines.append(f"- **{n}** ({count(n)}): best peer `{c['best']}` IS {b['interval_score']:.3g} "
                     f"(coverage {100 * b['coverage']:.1f} %) against the default's {d['interval_score']:.3g} "
                     f"({100 * d['coverage']:.1f} %): {verdict} (the peer better on {b['wins']} of {c['n_splits']} "
                     "splits).")
    proto = []
    for n, ds in results["datasets"].items():
        both = [s for s in ds["splits"] if "hgb_residual" in s["methods"] and "default" in s["methods"]]
        if both:
            new = np.array([s["methods"]["hgb_residual"]["interval_score"] for s in both])
            ref = np.array([s["methods"]["default"]["interval_score"] for s in both])
            best = comp.get(n, {}).get("best")
            paired = [s for s in both if best in s["methods"]]
            vs_best = ""
            if paired:
                r = (np.mean([s["methods"]["hgb_residual"]["interval_score"] for s in paired])
                     / np.mean([s["methods"][best]["interval_score"] for s in paired]))
                vs_best = f"; against the best peer `{best}` on the {len(paired)} of these splits it ran, {r:.3f}×"
            proto.append(f"- **{n}** ({len(both)} split{'s' if len(both) != 1 else ''}, "
                         f"{_split_numbers([s['split'] for s in both])}): IS {new.mean():.3g} against the default's "
                         f"{ref.mean():.3g}, {new.mean() / ref.mean():.3f}× (median per split "
                         f"{np.median(new / ref):.3f}, better on {int((new < ref).sum())}), coverage "
                         f"{100 * np.mean([s['methods']['hgb_residual']['coverage'] for s in both]):.1f} %" + vs_best
                         + ".")
    if proto:
        lines += ["", "Prototype, paired with the default on the same splits: `hgb_residual`, "
                  + dict(METHODS)["hgb_residual"] + ".", ""] + proto
    if "split_hgb" in keys:
        lines += ["", "Over the sets, IS / `split_hgb`:", ""]
        geo = []
        for k in keys:
            v = [comp[n]["rows"][k]["to_split_hgb"] for n in sets]
            geo.append([f"`{labels[k]}`", f"{float(np.exp(np.mean(np.log(v)))):.3f}", f"{max(v):.3f}",
                        " / ".join(f"{x:.3f}" for x in v),
                        f"{100 * min(comp[n]['rows'][k]['coverage'] for n in sets):.1f}–"
                        f"{100 * max(comp[n]['rows'][k]['coverage'] for n in sets):.1f}"])
        lines += _common.markdown_table(["method", "geometric mean", "worst set", f"per set ({', '.join(sets)})",
                                         "coverage % range over the sets"], geo, "lrrll")
    lines.append("")
    return lines


def merge_rows(base: dict, parts: list[dict]) -> dict:
    """``base`` (a results dict) with the method rows of ``parts`` added to its splits: a part's split joins the
    base's split of the same number and data set, whose fitting, calibration and test sizes must match (the same
    rows, drawn by the same seed); a later part's row replaces an earlier one of the same method. Splits the base
    lacks are appended. The parts' commands are recorded (``merged``) and the summaries recomputed."""
    out = json.loads(json.dumps(base))
    out.setdefault("merged", [])
    for part in parts:
        for name, ds in part["datasets"].items():
            target = out["datasets"].setdefault(name, {**ds, "splits": [], "summary": {}})
            by_split = {s["split"]: s for s in target["splits"]}
            for s in ds["splits"]:
                old = by_split.get(s["split"])
                if old is None:
                    target["splits"].append(s)
                    continue
                sizes = [(k, old[k], s[k]) for k in ("n_fit", "n_cal", "n_test") if k in old and k in s
                         and old[k] != s[k]]
                if sizes:
                    raise ValueError(f"{name} split {s['split']}: the part's rows differ from the base's "
                                     f"({sizes}); merge only runs of the same protocol.")
                old["methods"].update(s["methods"])
                if "skipped" in s:
                    old["skipped"] = s["skipped"]
            target["splits"].sort(key=lambda s: s["split"])
            target["summary"] = summarise(target["splits"])
        out["versions"] = {**out.get("versions", {}), **{k: v for k, v in part.get("versions", {}).items() if v}}
        if part["command"] not in out["merged"]:
            out["merged"].append(part["command"])
    return out


def regional_default_part(regional: dict, path: str) -> dict:
    """The ``default`` rows of a regional_coverage results dict's ``uci`` study as a part for :func:`merge_rows`:
    that study fits the default on the same fitting and calibration rows of each standard split (the training rows
    shuffled by ``1000 + split``, a tenth for calibration) with ``random_state=split``, as ``--methods default``
    here; its rows carry coverage, width, interval score and worst slab."""
    datasets: dict = {}
    for r in regional.get("uci", []):
        if "default" not in r["methods"]:
            continue
        m = r["methods"]["default"]
        row = {k: m[k] for k in ("coverage", "width", "interval_score", "worst_slab") if k in m}
        datasets.setdefault(r["dataset"], {"splits": []})["splits"].append(
            {"split": r["split"], "n_cal": r["n_cal"], "methods": {"default": row}})
    return {"command": f"the default's rows of the uci study in {path}", "datasets": datasets}


# --------------------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="smoke test: 1 split, small budgets")
    p.add_argument("--data-dir", type=Path, default=_common.data_dir("uci"),
                   help="folder holding one sub-folder per data set (default: $GLAS_DATA_DIR/uci or "
                        "../shared/data/uci)")
    p.add_argument("--datasets", nargs="+", default=None,
                   help="data set folder names (default: concrete energy yacht wine-quality-red, those present)")
    p.add_argument("--splits", nargs="+", type=int, default=None,
                   help="one number N: splits 0..N-1; several numbers: those splits (default: all)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 200; quick 30)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=50)
    p.add_argument("--ensemble", type=int, default=5)
    p.add_argument("--n-samples", type=int, default=None, help="GLAS posterior samples (default 500; quick 100)")
    p.add_argument("--max-components", type=int, default=None, help="GLAS d_max (default 50; quick 20)")
    p.add_argument("--no-laplace-torch", action="store_true")
    p.add_argument("--tag", default=None, help="write uci_TAG.* instead of uci.* (e.g. for a sensitivity run)")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   choices=[k for k, _ in METHODS] + ["networks", "tabular"],
                   help="the rows to compute (default: all): 'tabular' for the default end to end and the tabular "
                        "peers (no network is trained), 'networks' for the rows around the trained networks (any "
                        "of those runs them all), or names of METHODS")
    p.add_argument("--merge", nargs="+", default=None, metavar="TAG",
                   help="no computation: add the rows of uci_TAG.json (same splits, e.g. a --methods tabular run) "
                        "to uci.json's splits and render uci.md")
    p.add_argument("--default-from", type=Path, default=None, metavar="JSON",
                   help="with --merge: add (last) the default's rows of the uci study of this regional_coverage "
                        "results file (the same rows and seeds as --methods default)")
    args = p.parse_args(argv)
    if args.methods:
        groups = {"networks": NETWORK_METHODS, "tabular": TABULAR_METHODS}  # (the prototype by its name only)
        args.methods = sorted({m for k in args.methods for m in groups.get(k, [k])})
    q = args.quick
    args.epochs = args.epochs if args.epochs is not None else (30 if q else 200)
    args.n_samples = args.n_samples if args.n_samples is not None else (100 if q else 500)
    args.max_components = args.max_components if args.max_components is not None else (20 if q else 50)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    stem = ("uci_quick" if args.quick else "uci") + (f"_{args.tag}" if args.tag else "")
    json_path, md_path = args.out_dir / f"{stem}.json", args.out_dir / f"{stem}.md"
    if args.report_only:
        R, text = _common.report_from_results(json_path, md_path, render)
        print(text)
        return R
    if args.merge:
        parts = [_common.read_results(args.out_dir / f"uci_{t}.json") for t in args.merge]
        if args.default_from is not None:
            parts.append(regional_default_part(_common.read_results(args.default_from),
                                                  _common.repo_path(args.default_from)))
        merged = merge_rows(_common.read_results(json_path), parts)
        R, text = _common.write_results_and_report(json_path, md_path, merged, render, command=merged["command"])
        print(text)
        return R
    torch.set_num_threads(args.threads)
    data_dir = args.data_dir.resolve()
    names = args.datasets or [n for n in DEFAULT_DATASETS if (data_dir / n).is_dir()]
    wanted = set(args.methods or [k for k, _ in METHODS])
    Laplace = None if args.no_laplace_torch or not wanted & set(NETWORK_METHODS) else _import_laplace_torch()
    for name, note in _common.tabular_peers_missing(wanted & set(_common.TABULAR_PEERS)).items():
        print(f"[uci] {name} skipped: {note}", flush=True)
    command = _common.command_line(__file__, argv)
    results = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "versions": {k: _version(k) for k in ("torch", "scikit-learn", "mapie", "laplace-torch", "quantile-forest",
                                              "crepes", "ngboost")},
        "datasets": {},
    }
    results["versions"]["glas-sklearn"] = _version("glas-sklearn")
    plan = {}
    for name in names:
        folder = data_dir / name
        n_avail = len(list(folder.glob("index_train_*.txt")))
        if args.splits is None:
            splits = [0] if args.quick else list(range(n_avail))
        elif len(args.splits) == 1:
            splits = list(range(min(args.splits[0], n_avail)))
        else:
            splits = [s for s in args.splits if s < n_avail]
        plan[name] = splits
        results["datasets"][name] = {"folder": str(folder), "n_splits_available": n_avail, "splits": [],
                                     "summary": {}}
    # split-major order: an interrupted run still has the same splits of every data set
    for split in sorted({s for v in plan.values() for s in v}):
        for name in names:
            if split not in plan[name]:
                continue
            ds = results["datasets"][name]
            t0 = time.perf_counter()
            r = run_split(data_dir / name, split, args, Laplace)
            r["seconds"] = time.perf_counter() - t0
            ds["splits"].append(r)
            ds["summary"] = summarise(ds["splits"])
            m = r["methods"]
            print(f"[uci] {name} split {split}: {r['seconds']:.0f}s (training "
                  f"{r.get('train_seconds_all_members', 0.0):.0f}s); "
                  + ", ".join(f"{k}: cov {v['coverage']:.2f} IS {v['interval_score']:.3g}"
                              + (f" d {v['d']}" if "d" in v else "") for k, v in m.items()),
                  flush=True)
            # partial results survive an interruption
            _common.write_results_and_report(json_path, md_path, results, render, command=command)
    R, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)
    return R


if __name__ == "__main__":
    main()
