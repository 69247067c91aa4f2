"""Classification under dataset shift: a small CNN on rotated digits, GLAS against MAP, temperature scaling,
laplace-torch (Kron, marglik) and a deep ensemble.

Data: scikit-learn's 8×8 digits (bundled, 1797 rows, 10 classes) as images (n, 1, 8, 8), pixels / 16. Per seed,
a stratified split into 60 % training, 20 % calibration and 20 % test rows. The test images are rotated by each
of ``--angles`` degrees (``scipy.ndimage.rotate``, ``reshape=False``, bilinear, zeros outside, clipped to [0, 1]);
the training and calibration images are never rotated.

Per seed one CNN (two 3×3 convolutions with max-pooling, a linear head; 6 090 weights) is trained with Adam
(lr 2e-3, ``--epochs`` epochs of batches of 64, cross-entropy) on the training rows. Every method but the
ensemble uses that network:

- MAP: its softmax;
- temperature scaling: its logits divided by one temperature fitted by NLL on the calibration rows;
- GLAS default: ``LaplaceActiveSubspaceClassifier(module=cnn, prefit=True)``, fitted on the training rows with the
  calibration rows as ``X_cal`` (rows the CNN was not trained on): low-rank posterior, linearised probit,
  d = ``--max-components``, σ0 by the mean NLL of half of the calibration rows in [0, σ0_EB];
- GLAS ``sigma0="eb_full"``: the same with σ0 by full-space empirical Bayes (tr Σ = ‖θ0‖²);
- two σ0 choices measured here as candidate shift-robust rules, both on the default's posterior: "1-SE" (the
  largest σ0 of the sweep grid whose mean NLL on the default's σ0-tuning rows is within one standard error of
  the grid's lowest) and "tuned on rotated calibration rows" (``glas_sklearn.calibration.tune_sigma0`` on the
  same tuning rows rotated by ``--tune-angle`` degrees, over [0, σ0_EB]);
- laplace-torch: ``Laplace(cnn, "classification", subset_of_weights="all", hessian_structure="kron")``, prior
  precision by ``optimize_prior_precision(method="marglik")``, GLM predictive with probit link;
- deep ensemble: the mean softmax of ``--members`` CNNs (the MAP network and ``--members`` − 1 more, each with
  its own initialisation and batch order).

A σ0 sweep on the default's posterior (``posterior_.set_sigma0(r · σ0_EB)`` for a grid of ratios r, r = 0 the MAP
softmax and r = 1 ``sigma0="eb_full"``) gives the trade-off figure: NLL at 0° against NLL under rotation.

Metrics per angle: NLL (mean −log max(p_y, 1e-12)), ECE (15 equal-width bins of the top probability), accuracy.
"NLL accounting" records the MAP NLL three ways (exact log-softmax; scikit-learn's ``log_loss`` of the float32
softmax, which clips at float32's eps; ``log_loss`` of the default's float64 ``predict_proba``) to show how much of
a gap between "MAP" and the default comes from the clipping of the metric.

Usage
-----
    python benchmarks/digits_rotation.py                 # 3 seeds
    python benchmarks/digits_rotation.py --quick         # 1 seed, 15 epochs, small sizes, *_quick outputs
    python benchmarks/digits_rotation.py --report-only   # report and figures again from digits_rotation.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import sys
import time
import warnings

import _common
import numpy as np
import torch
from scipy import ndimage
from scipy.optimize import minimize_scalar
from sklearn.datasets import load_digits
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceClassifier
from glas_sklearn.calibration import class_probabilities, tune_sigma0
from glas_sklearn.likelihoods import Categorical

N_BINS = 15
NLL_FLOOR = 1e-12
#: The default's probabilities count as the MAP softmax when they differ from it by less than this everywhere.
SAME_AS_MAP = 1e-4
METHODS = [
    ("map", "MAP softmax"),
    ("temperature", "temperature scaling"),
    ("default", "GLAS default (σ0 by NLL)"),
    ("eb_full", "GLAS sigma0=\"eb_full\""),
    ("rule_1se", "GLAS σ0 by the 1-SE rule (candidate)"),
    ("tuned_rotated", "GLAS σ0 tuned on rotated calibration rows (candidate)"),
    ("laplace_kron", "laplace-torch Kron, marglik"),
    ("ensemble", "deep ensemble"),
]
METRICS = [("nll", "NLL", 3), ("ece", "ECE", 3), ("accuracy", "accuracy", 3)]


# ------------------------------------------------------------------------------------------------ network, data
class SmallCNN(nn.Module):
    """Conv(1→16, 3×3) – ReLU – max-pool – Conv(16→32, 3×3) – ReLU – max-pool – Linear(128 → classes)."""

    def __init__(self, n_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16 × 4 × 4
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 32 × 2 × 2
            nn.Flatten())
        self.head = nn.Linear(32 * 2 * 2, n_classes)

    def forward(self, x):
        return self.head(self.features(x))


def split(seed: int) -> dict:
    """Stratified 60 / 20 / 20 % training, calibration and test images (n, 1, 8, 8) in [0, 1], with labels."""
    digits = load_digits()
    X, y = (digits.images / 16.0)[:, None].astype(np.float32), digits.target
    Xtr, Xr, ytr, yr = train_test_split(X, y, train_size=0.6, stratify=y, random_state=seed)
    Xca, Xte, yca, yte = train_test_split(Xr, yr, train_size=0.5, stratify=yr, random_state=seed)
    return {"X_train": Xtr, "y_train": ytr, "X_cal": Xca, "y_cal": yca, "X_test": Xte, "y_test": yte}


def rotate(images: np.ndarray, angle: float) -> np.ndarray:
    """Images (n, 1, H, W) rotated by ``angle`` degrees about their centre (same size, zeros outside, bilinear,
    clipped to [0, 1])."""
    if angle == 0:
        return images
    out = ndimage.rotate(images, angle, axes=(2, 3), reshape=False, order=1, mode="constant", cval=0.0)
    return np.clip(out, 0.0, 1.0).astype(images.dtype)


def train_cnn(X: np.ndarray, y: np.ndarray, *, seed: int, epochs: int) -> SmallCNN:
    torch.manual_seed(seed)
    net = SmallCNN()
    _common.train_adam(net, torch.as_tensor(X), torch.as_tensor(y), lr=2e-3, epochs=epochs, batch_size=64, seed=seed,
                       loss=nn.functional.cross_entropy)
    return net


def logits_of(net: nn.Module, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(torch.as_tensor(X)).double().numpy()


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ------------------------------------------------------------------------------------------------------ metrics
def ece(probs: np.ndarray, labels: np.ndarray, bins: int = N_BINS) -> float:
    """Expected calibration error over equal-width bins of the top probability."""
    conf, hit = probs.max(1), probs.argmax(1) == labels
    index = np.minimum((conf * bins).astype(int), bins - 1)
    return float(sum(abs(hit[index == b].mean() - conf[index == b].mean()) * (index == b).mean()
                     for b in range(bins) if (index == b).any()))


def row_nll(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return -np.log(np.clip(probs[np.arange(len(labels)), labels], NLL_FLOOR, None))


def scores(probs: np.ndarray, labels: np.ndarray) -> dict:
    return {"nll": float(row_nll(probs, labels).mean()), "ece": ece(probs, labels),
            "accuracy": float((probs.argmax(1) == labels).mean())}


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature T minimising the NLL of softmax(logits / T) (bounded search in log T)."""
    def nll(log_t):
        z = logits / np.exp(log_t)
        z = z - z.max(1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(labels)), labels]))
    return float(np.exp(minimize_scalar(nll, bounds=(-4.0, 4.0), method="bounded").x))


# ------------------------------------------------------------------------------------------------------- peers
def _import_laplace():
    """laplace-torch's ``Laplace`` (in the benchmark venv; torchvision must not be installed next to it)."""
    try:
        from laplace import Laplace
    except ImportError as err:
        raise RuntimeError(f"laplace-torch is needed for the laplace-torch Kron row: {err}") from err
    return Laplace


def laplace_kron(net: nn.Module, X: np.ndarray, y: np.ndarray):
    """laplace-torch Kron-factored GGN Laplace of a copy of ``net``, prior precision by marginal likelihood; returns
    (probabilities(X) function, prior precision)."""
    from torch.utils.data import DataLoader, TensorDataset

    Laplace = _import_laplace()
    model = copy.deepcopy(net).eval()
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")
    la.fit(DataLoader(TensorDataset(torch.as_tensor(X), torch.as_tensor(y)), batch_size=128))
    la.optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")

    def probabilities(A: np.ndarray, chunk: int = 60) -> np.ndarray:
        # in chunks of rows: the GLM predictive holds the per-row Jacobians (rows × classes × weights)
        parts = []
        for i in range(0, len(A), chunk):
            with torch.no_grad():
                parts.append(la(torch.as_tensor(A[i:i + chunk]), pred_type="glm", link_approx="probit").double())
        p = torch.cat(parts).numpy()
        return p / p.sum(1, keepdims=True)

    return probabilities, float(torch.as_tensor(la.prior_precision).mean())


# ------------------------------------------------------------------------------------------------------ one seed
def glas(net: nn.Module, data: dict, cfg: argparse.Namespace, seed: int, **params) -> LaplaceActiveSubspaceClassifier:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = LaplaceActiveSubspaceClassifier(**_common.grouped(
            module=net, prefit=True, max_components=cfg.max_components, random_state=seed, device="cpu", **params))
        return clf.fit(data["X_train"], data["y_train"], X_cal=data["X_cal"], y_cal=data["y_cal"])


def sweep_probabilities(posterior, X: np.ndarray, d: int, sigma0s) -> list[np.ndarray]:
    """The linearised (probit) probabilities of ``X`` at each σ0, on one input tensor so that the posterior's
    Jacobian cache is reused; the posterior's σ0 setting is restored."""
    Xt = torch.as_tensor(X)
    original, out = posterior.sigma0, []
    try:
        for s in sigma0s:
            posterior.set_sigma0(float(s))
            p = class_probabilities(posterior, Xt, d, predictive="linearized").detach().double().numpy()
            out.append(p / p.sum(1, keepdims=True))
    finally:
        posterior.set_sigma0(original)
    return out


def run_seed(seed: int, cfg: argparse.Namespace) -> dict:
    data = split(seed)
    angles, yte = cfg.angles, data["y_test"]
    test = {a: rotate(data["X_test"], a) for a in angles}
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    net = train_cnn(data["X_train"], data["y_train"], seed=seed, epochs=cfg.epochs)
    timings["train_cnn"] = time.perf_counter() - t0
    probs: dict[str, dict[float, np.ndarray]] = {}

    logit = {a: logits_of(net, test[a]) for a in angles}
    probs["map"] = {a: softmax(logit[a]) for a in angles}
    temperature = fit_temperature(logits_of(net, data["X_cal"]), data["y_cal"])
    probs["temperature"] = {a: softmax(logit[a] / temperature) for a in angles}

    t0 = time.perf_counter()
    default = glas(net, data, cfg, seed)
    timings["glas_default_fit"] = time.perf_counter() - t0
    probs["default"] = {a: default.predict_proba(test[a]) for a in angles}
    t0 = time.perf_counter()
    eb_full = glas(net, data, cfg, seed, sigma0="eb_full")
    timings["glas_eb_full_fit"] = time.perf_counter() - t0
    probs["eb_full"] = {a: eb_full.predict_proba(test[a]) for a in angles}

    # σ0 sweep on the default's posterior (same eigenpairs as eb_full's: same rows, same seed)
    post, d = default.posterior_, default.n_components_
    original = post.sigma0
    post.set_sigma0("eb_full")
    sigma0_eb = float(post.fit_sigma0(d))
    post.set_sigma0(original)
    ratios = np.r_[0.0, np.logspace(cfg.sweep_low, cfg.sweep_high, cfg.sweep_points)]
    grid = ratios * sigma0_eb

    # candidate rules, on the default's σ0-tuning rows (calibration rows the conformal scores did not use)
    tune = default.sigma0_rows_
    X_tune, y_tune = data["X_cal"][tune], data["y_cal"][tune]
    tune_nll = np.array([row_nll(p, y_tune) for p in sweep_probabilities(post, X_tune, d, grid)])  # (grid, rows)
    mean, se = tune_nll.mean(1), tune_nll.std(1, ddof=1) / np.sqrt(tune_nll.shape[1])
    best = int(np.argmin(mean))
    sigma0_1se = float(grid[np.flatnonzero(mean <= mean[best] + se[best]).max()])
    t0 = time.perf_counter()
    post.set_sigma0("eb_full")
    try:
        rotated = tune_sigma0(post, torch.as_tensor(rotate(X_tune, cfg.tune_angle)), y_tune, d=d,
                              predictive="linearized", random_state=seed, likelihood=Categorical())
    finally:
        post.set_sigma0(original)
    sigma0_rot = float(rotated.sigma0)
    timings["tune_rotated"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    sweep = {"ratio": ratios.tolist(), "sigma0": grid.tolist(), "nll": {}, "ece": {}, "accuracy": {}}
    for a in angles:
        ps = sweep_probabilities(post, test[a], d, [*grid, sigma0_1se, sigma0_rot])
        res = [scores(p, yte) for p in ps]
        for m, _, _ in METRICS:
            sweep[m][str(a)] = [r[m] for r in res[:len(grid)]]
        probs.setdefault("rule_1se", {})[a] = ps[-2]
        probs.setdefault("tuned_rotated", {})[a] = ps[-1]
    timings["sweep"] = time.perf_counter() - t0
    sweep["tuning_nll_mean"], sweep["tuning_nll_se"] = mean.tolist(), se.tolist()

    prior_precision = float("nan")
    if cfg.laplace_torch:
        t0 = time.perf_counter()
        kron_probs, prior_precision = laplace_kron(net, data["X_train"], data["y_train"])
        probs["laplace_kron"] = {a: kron_probs(test[a]) for a in angles}
        timings["laplace_kron"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    members = [net] + [train_cnn(data["X_train"], data["y_train"], seed=1000 * (seed + 1) + e, epochs=cfg.epochs)
                       for e in range(1, cfg.members)]
    probs["ensemble"] = {a: np.mean([softmax(logits_of(m, test[a])) for m in members], axis=0) for a in angles}
    timings["ensemble_extra_members"] = time.perf_counter() - t0

    accounting = {}
    for a in angles:
        z = logit[a] - logit[a].max(1, keepdims=True)
        exact = float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(yte)), yte]))
        p32 = torch.softmax(torch.as_tensor(logit[a], dtype=torch.float32), -1).numpy()
        accounting[str(a)] = {
            "map_exact": exact,
            "map_log_loss_float32": float(log_loss(yte, p32, labels=range(10))),
            "default_log_loss_float64": float(log_loss(yte, probs["default"][a], labels=range(10))),
            "share_p_below_float32_eps": float((p32[np.arange(len(yte)), yte] < np.finfo(np.float32).eps).mean()),
            "max_abs_prob_default_minus_map": float(np.abs(probs["default"][a] - probs["map"][a]).max()),
        }

    search = default.sigma0_search_
    return {
        "seed": seed, "n_train": len(data["y_train"]), "n_cal": len(data["y_cal"]), "n_test": len(yte),
        "n_weights": _common.n_weights(net), "d": int(default.n_components_),
        "temperature": temperature, "laplace_prior_precision": prior_precision,
        "sigma0": {"default": float(default.sigma0_), "eb_full": float(eb_full.sigma0_), "eb_value": sigma0_eb,
                   "rule_1se": sigma0_1se, "tuned_rotated": sigma0_rot},
        "default_search": {"n_tuning_rows": int(default.n_sigma0_rows_),
                           "n_conformal_rows": int(default.n_calibration_rows_),
                           "nll": float(search.nll), "nll_at_zero": float(search.nll_at_zero),
                           "nll_at_upper": float(search.nll_at_upper)},
        "methods": {key: {str(a): scores(probs[key][a], yte) for a in angles} for key, _ in METHODS if key in probs},
        "sweep": sweep, "nll_accounting": accounting, "timings": timings,
    }


# ------------------------------------------------------------------------------------------------------ summary
def _mean_se(values) -> dict:
    v = np.asarray(values, dtype=float)
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
    return {"mean": float(v.mean()), "se": se}


def _methods(results_or_runs) -> list[tuple[str, str]]:
    """The (key, label) pairs of METHODS that were run (laplace-torch may be left out)."""
    present = results_or_runs[0]["methods"]
    return [(key, label) for key, label in METHODS if key in present]


def summarise(runs: list[dict]) -> dict:
    angles = list(runs[0]["methods"]["map"])
    methods = {key: {a: {m: _mean_se([r["methods"][key][a][m] for r in runs]) for m, _, _ in METRICS}
                     for a in angles} for key, _ in _methods(runs)}
    sweep = {m: {a: np.mean([r["sweep"][m][a] for r in runs], axis=0).tolist() for a in angles}
             for m, _, _ in METRICS}
    accounting = {a: {k: _mean_se([r["nll_accounting"][a][k] for r in runs]) for k in runs[0]["nll_accounting"][a]}
                  for a in angles}
    sigma0 = {k: _mean_se([r["sigma0"][k] for r in runs]) for k in runs[0]["sigma0"]}
    return {"methods": methods, "sweep": {"ratio": runs[0]["sweep"]["ratio"], **sweep},
            "nll_accounting": accounting, "sigma0": sigma0,
            "temperature": _mean_se([r["temperature"] for r in runs]),
            "laplace_prior_precision": _mean_se([r["laplace_prior_precision"] for r in runs])}


# ------------------------------------------------------------------------------------------------------- report
def _fmt(e: dict, digits: int) -> str:
    se = "" if not np.isfinite(e["se"]) else f" ± {e['se']:.{digits}f}"
    return f"{e['mean']:.{digits}f}{se}"


def render(results: dict) -> str:
    cfg, summ, runs = results["config"], results["summary"], results["runs"]
    angles = list(summ["methods"]["map"])
    n = len(runs)
    r0 = runs[0]
    s0 = summ["sigma0"]
    lines = [f"# Rotated digits: probabilities under dataset shift{' (quick mode)' if cfg['quick'] else ''}", "",
             f"Generated by `{results['command']}` on {results['date']} "
             f"({_common.machine_line(results['machine'])}); {results.get('seconds', float('nan')):.0f} s.", "",
             f"scikit-learn's digits as 1×8×8 images, stratified {r0['n_train']} training / {r0['n_cal']} calibration "
             f"/ {r0['n_test']} test rows per seed; the test images rotated by {', '.join(angles)}°. A CNN of "
             f"{r0['n_weights']} weights, Adam lr 2e-3, {cfg['epochs']} epochs of batches of 64. GLAS: prefit CNN, "
             f"calibration rows as `X_cal`, d = {r0['d']}, low-rank posterior, linearised probit. Deep ensemble: "
             f"{cfg['members']} CNNs. Mean ± standard error over {n} seed(s). NLL: mean −log max(p_y, "
             f"{NLL_FLOOR:g}); ECE: {N_BINS} equal-width bins.", "",
             "σ0 per seed: default " + ", ".join(f"{r['sigma0']['default']:.3g}" for r in runs) + "; mean over "
             f"seeds: full-space EB {s0['eb_full']['mean']:.3g}, "
             f"1-SE rule {s0['rule_1se']['mean']:.3g}, tuned on calibration rows rotated by {cfg['tune_angle']}° "
             f"{s0['tuned_rotated']['mean']:.3g}. Temperature T = {_fmt(summ['temperature'], 3)}; laplace-torch "
             f"prior precision {_fmt(summ['laplace_prior_precision'], 3)}.", ""]
    for m, title, digits in METRICS:
        lines += [f"## {title} per angle", ""]
        lines += _common.markdown_table(["method", *(f"{a}°" for a in angles)],
                                        [[label, *(_fmt(summ["methods"][key][a][m], digits) for a in angles)]
                                         for key, label in _methods(runs)], "l" + "r" * len(angles))
        lines.append("")

    ratios = summ["sweep"]["ratio"]
    show = [a for a in angles if a in ("0", "45", "90")] or angles
    lines += ["## σ0 sweep (the default's posterior, σ0 = r · σ0_EB; r = 0 is the MAP softmax, r = 1 "
              "`sigma0=\"eb_full\"`), mean over seeds", ""]
    header = ["r", *(f"NLL {a}°" for a in show), *(f"ECE {a}°" for a in show), *(f"acc {a}°" for a in show)]
    rows = [[f"{r:.3g}", *(f"{summ['sweep']['nll'][a][i]:.3f}" for a in show),
             *(f"{summ['sweep']['ece'][a][i]:.3f}" for a in show),
             *(f"{summ['sweep']['accuracy'][a][i]:.3f}" for a in show)] for i, r in enumerate(ratios)]
    lines += _common.markdown_table(header, rows, "r" * len(header)) + [""]

    def max_dp(r):
        return max(r["nll_accounting"][a]["max_abs_prob_default_minus_map"] for a in angles)

    same = [r for r in runs if max_dp(r) < SAME_AS_MAP]
    lines += ["## NLL accounting: the same MAP probabilities, three ways of computing the NLL", "",
              "`log_loss` clips probabilities to [eps, 1 − eps] with eps of their dtype: 1.2e-7 for float32 (at "
              "most 15.9 per row), 2.2e-16 for float64 (36.0). Over the seeds where the default's probabilities "
              f"are the MAP softmax (largest difference over all angles below {SAME_AS_MAP:g}: seed(s) "
              f"{', '.join(str(r['seed']) for r in same) or 'none'} of {n}); the default's come as float64 from "
              "`predict_proba`.", ""]
    if same:
        lines += _common.markdown_table(
            ["angle", "MAP, exact log-softmax", "log_loss(float32 MAP softmax)", "log_loss(default predict_proba)",
             "rows with p_y < 1.2e-7"],
            [[f"{a}°", *(_fmt(_mean_se([r["nll_accounting"][a][k] for r in same]), 3)
                         for k in ("map_exact", "map_log_loss_float32", "default_log_loss_float64",
                                   "share_p_below_float32_eps"))] for a in angles], "lrrrr")
        lines.append("")

    lines += ["## Per seed", ""]
    lines += _common.markdown_table(
        ["seed", "σ0 default", "σ0_EB", "σ0 1-SE", "σ0 rotated", "T", "default tuning NLL (σ0=0 / EB)",
         "tuning / conformal rows", "largest p_default − p_MAP gap", "seconds"],
        [[r["seed"], f"{r['sigma0']['default']:.3g}", f"{r['sigma0']['eb_value']:.3g}",
          f"{r['sigma0']['rule_1se']:.3g}", f"{r['sigma0']['tuned_rotated']:.3g}", f"{r['temperature']:.3f}",
          f"{r['default_search']['nll_at_zero']:.4f} / {r['default_search']['nll_at_upper']:.4f}",
          f"{r['default_search']['n_tuning_rows']} / {r['default_search']['n_conformal_rows']}",
          f"{max_dp(r):.1e}", f"{sum(r['timings'].values()):.0f}"] for r in runs], "rrrrrrrrrr") + [""]
    lines += ["Figures: `digits_rotation.png` (NLL at 0° against NLL at 45° and 90° as σ0 varies, named settings "
              "marked) and `digits_rotation_angles.png` (NLL, ECE, accuracy against the angle).", "",
              _common.DISCUSSION_MARK, ""]
    return "\n".join(lines)


def figures(results: dict, out_dir, stem: str) -> list[str]:
    plt = _common.pyplot()
    summ = results["summary"]
    angles = list(summ["methods"]["map"])
    ratios = np.asarray(summ["sweep"]["ratio"])
    sweep_nll = summ["sweep"]["nll"]
    shifted = [a for a in ("45", "90") if a in angles] or angles[-1:]
    named = {"map": ("MAP", "k", "o"), "temperature": ("temperature", "tab:gray", "s"),
             "default": ("default (σ0 by NLL)", "tab:blue", "D"), "eb_full": ('sigma0="eb_full"', "tab:orange", "^"),
             "rule_1se": ("1-SE rule", "tab:cyan", "v"),
             "tuned_rotated": (f"tuned at {results['config']['tune_angle']}°", "tab:purple", "P"),
             "laplace_kron": ("laplace-torch Kron", "tab:green", "X"), "ensemble": ("deep ensemble", "tab:red", "*")}
    fig, axes = plt.subplots(1, len(shifted), figsize=(6.0 * len(shifted), 4.8), squeeze=False)
    for ax, a in zip(axes[0], shifted, strict=True):
        x, y = np.asarray(sweep_nll["0"]), np.asarray(sweep_nll[a])
        ax.plot(x, y, "-", color="tab:blue", alpha=0.5, lw=1.5, label="σ0 sweep (GLAS low-rank)")
        sc = ax.scatter(x[1:], y[1:], c=np.log10(ratios[1:]), cmap="viridis", s=22, zorder=3)
        for key, (label, color, marker) in named.items():
            if key not in summ["methods"]:
                continue
            e = summ["methods"][key]
            style = (dict(mfc="none", mec=color, ms=14, mew=1.5) if key == "map"  # the default often sits on it
                     else dict(color=color, ms=11 if marker == "*" else 8, mec="k", mew=0.6))
            ax.plot(e["0"]["nll"]["mean"], e[a]["nll"]["mean"], marker, ls="none", label=label, zorder=4, **style)
        ax.set(xscale="log", xlabel="NLL at 0° (in distribution)", ylabel=f"NLL at {a}°",
               title=f"trade-off as σ0 varies: 0° vs {a}°")
        ax.grid(alpha=0.3)
        fig.colorbar(sc, ax=ax, label="log10(σ0 / σ0_EB)")
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    paths = [out_dir / f"{stem}.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    x = [float(a) for a in angles]
    for ax, (m, title, _) in zip(axes, METRICS, strict=True):
        for key, (label, color, marker) in named.items():
            if key not in summ["methods"]:
                continue
            e = summ["methods"][key]
            mean = np.array([e[a][m]["mean"] for a in angles])
            se = np.nan_to_num(np.array([e[a][m]["se"] for a in angles]))
            ax.errorbar(x, mean, yerr=se, marker=marker, color=color, ms=5, lw=1.2, capsize=2, label=label)
        ax.set(xlabel="rotation of the test images (degrees)", ylabel=title, title=f"{title} against the angle",
               xticks=x)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / f"{stem}_angles.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return [_common.repo_path(p) for p in paths]


# -------------------------------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="1 seed, 15 epochs, d = 10, 2 ensemble members, 7 sweep points")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--no-laplace-torch", dest="laplace_torch", action="store_false",
                   help="leave out the laplace-torch Kron row (its predictive is the slowest part)")
    p.add_argument("--epochs", type=int, default=None, help="CNN training epochs (default 60; quick 15)")
    p.add_argument("--max-components", type=int, default=None, help="d of the GLAS rows (default 50; quick 10)")
    p.add_argument("--members", type=int, default=None, help="deep-ensemble members (default 5; quick 2)")
    p.add_argument("--angles", type=lambda s: [int(a) for a in s.split(",")], default=[0, 15, 30, 45, 60, 75, 90],
                   help="test rotations in degrees, comma-separated (default 0,15,...,90)")
    p.add_argument("--tune-angle", type=int, default=30,
                   help="rotation of the calibration rows for the 'tuned on rotated rows' candidate (default 30)")
    p.add_argument("--sweep-low", type=float, default=-3.0, help="log10 of the smallest σ0 / σ0_EB (default -3)")
    p.add_argument("--sweep-high", type=float, default=1.0, help="log10 of the largest σ0 / σ0_EB (default 1)")
    p.add_argument("--sweep-points", type=int, default=None, help="σ0 values > 0 in the sweep (default 17; quick 7)")
    args = p.parse_args(argv)
    if 0 not in args.angles:
        p.error("--angles must include 0 (the in-distribution test rows).")
    quick = args.quick
    args.epochs = args.epochs if args.epochs is not None else (15 if quick else 60)
    args.max_components = args.max_components if args.max_components is not None else (10 if quick else 50)
    args.members = args.members if args.members is not None else (2 if quick else 5)
    args.sweep_points = args.sweep_points if args.sweep_points is not None else (7 if quick else 17)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    stem = "digits_rotation_quick" if args.quick else "digits_rotation"
    json_path, md_path = args.out_dir / f"{stem}.json", args.out_dir / f"{stem}.md"
    if args.report_only:
        R, text = _common.report_from_results(json_path, md_path, render)
        figures(R, args.out_dir, stem)
        print(text)
        return R
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    results = {"date": _dt.datetime.now().isoformat(timespec="seconds"),
               "config": {k: v if isinstance(v, (int, float, bool, list, type(None))) else str(v)
                          for k, v in vars(args).items()},
               "runs": []}
    for seed in range(1 if args.quick else args.seeds):
        run = run_seed(seed, args)
        results["runs"].append(run)
        m = run["methods"]
        print(f"[rotation] seed {seed} ({sum(run['timings'].values()):.0f} s): "
              + ", ".join(f"{k} NLL {m[k]['0']['nll']:.3f}/{m[k]['45']['nll'] if '45' in m[k] else float('nan'):.3f}/"
                          f"{m[k]['90']['nll'] if '90' in m[k] else float('nan'):.3f}" for k in m),
              flush=True)
    results["summary"] = summarise(results["runs"])
    results["seconds"] = time.perf_counter() - t_start
    results["figures"] = [_common.repo_path(args.out_dir / f"{stem}{tail}.png") for tail in ("", "_angles")]
    command = _common.command_line(__file__, argv)
    R, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    figures(R, args.out_dir, stem)
    print(text)
    return R


if __name__ == "__main__":
    sys.exit(main() and None)
