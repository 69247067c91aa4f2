"""Digits out-of-distribution study: GLAS classifier posteriors against the MAP network.

Data: scikit-learn's 8×8 digits (bundled, 1797 rows). In-distribution (ID) = classes 0–4, out-of-distribution
(OOD) = classes 5–9. Per seed, the ID rows are split at random 60 / 10 / 30 % into training, calibration and
test rows; inputs are standardised with the training rows' statistics.

Per seed, one network (64-50-50-5 tanh MLP, ``_common.mlp``) is trained with Adam (lr 1e-3, ``--epochs`` epochs of
batches of 64, cross-entropy), and every method uses that network through
``LaplaceActiveSubspaceClassifier(module=net, prefit=True)`` with the calibration rows as ``X_cal``:

- MAP: the softmax of the trained network;
- the paper's settings (``calibration="coverage", posterior="subspace"``), sampled and linearised;
- the defaults (``posterior="low_rank", calibration="conformal"``: linearised probit, d = d_max, σ0 chosen by the
  mean NLL of half of the calibration rows between the full-space empirical Bayes value and 0, the conformal
  scores on the other half), and the low-rank posterior with the full-space EB σ0 (the previous default), the
  subspace EB σ0, the sampled predictive or d = 20;
- the low-rank-plus-diagonal posterior (``posterior="low_rank_diag"``: the GGN's residual diagonal added to the
  rank-d curvature) at d = d_max and d = 20.

Metrics on the ID test rows: NLL, ECE (15 equal-width confidence bins), accuracy, prediction-set coverage and mean
size at 90 %; OOD: AUROC of the maximum probability separating ID test rows (positive) from OOD rows.

Usage
-----
    python benchmarks/digits_ood.py                 # 3 seeds
    python benchmarks/digits_ood.py --quick         # 1 seed, 20 epochs, *_quick outputs
    python benchmarks/digits_ood.py --report-only   # the report again from digits_ood.json
"""

from __future__ import annotations

import argparse
import time
import warnings

import _common
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score
from torch import nn

from glas_sklearn import LaplaceActiveSubspaceClassifier

LEVEL = 0.9
METHODS = [
    ("map", "MAP network", None),
    ("paper_sampled", "paper: subspace, d by set coverage, sampled",
     dict(calibration="coverage", posterior="subspace", predictive="sampled")),
    ("paper_linearized", "paper: subspace, d by set coverage, linearised",
     dict(calibration="coverage", posterior="subspace", predictive="linearized")),
    ("default", "default: low-rank, conformal (σ0 by the NLL of half the calibration rows, linearised probit, "
     "d = d_max)", {}),
    ("low_rank_ebfull", "low-rank, conformal, σ0 by full-space EB (the previous default)", dict(sigma0="eb_full")),
    ("low_rank_ebsub", "low-rank, conformal, σ0 by subspace EB", dict(sigma0="eb_subspace")),
    ("low_rank_sampled", "low-rank, conformal, sampled through the network", dict(predictive="sampled")),
    ("low_rank_d20", "low-rank, conformal, d = 20", dict(n_components=20)),
    ("low_rank_diag", "low-rank + diagonal, conformal (σ0 by NLL, linearised probit, d = d_max)",
     dict(posterior="low_rank_diag")),
    ("low_rank_diag_d20", "low-rank + diagonal, conformal, d = 20", dict(posterior="low_rank_diag", n_components=20)),
]


def scores(probs: np.ndarray, labels: np.ndarray, probs_ood: np.ndarray) -> dict:
    s_id, s_ood = probs.max(1), probs_ood.max(1)
    auroc = roc_auc_score(np.r_[np.ones(len(s_id)), np.zeros(len(s_ood))], np.r_[s_id, s_ood])
    p_true = np.clip(probs[np.arange(len(labels)), labels], 1e-12, None)
    return {"nll": float(-np.mean(np.log(p_true))), "ece": _common.ece(probs, labels),
            "accuracy": float((probs.argmax(1) == labels).mean()), "auroc": float(auroc)}


def run_seed(seed: int, cfg: argparse.Namespace) -> dict:
    X, y = load_digits(return_X_y=True)
    ind = y < 5
    Xi, yi, Xo = X[ind], y[ind], X[~ind]
    perm = np.random.default_rng(seed).permutation(len(Xi))
    n = len(perm)
    tr, ca, te = perm[: int(0.6 * n)], perm[int(0.6 * n): int(0.7 * n)], perm[int(0.7 * n):]
    mx, sx = Xi[tr].mean(0), Xi[tr].std(0)
    sx[~(sx > 0)] = 1.0
    Z = {k: (A - mx) / sx for k, A in (("tr", Xi[tr]), ("ca", Xi[ca]), ("te", Xi[te]), ("ood", Xo))}
    net = _common.mlp(64, (50, 50), 5, seed=seed)
    t0 = time.perf_counter()
    _common.train_adam(net, torch.as_tensor(Z["tr"], dtype=torch.float32), torch.as_tensor(yi[tr]), lr=1e-3,
                       epochs=cfg.epochs, batch_size=64, seed=seed, loss=nn.functional.cross_entropy)
    out = {"seed": seed, "n_train": len(tr), "n_cal": len(ca), "n_test": len(te), "n_ood": len(Xo),
           "train_seconds": time.perf_counter() - t0, "methods": {}}
    with torch.no_grad():
        def softmax(A):
            return torch.softmax(net(torch.as_tensor(A, dtype=torch.float32)), -1).double().numpy()
        out["methods"]["map"] = scores(softmax(Z["te"]), yi[te], softmax(Z["ood"]))
    for key, _, params in METHODS[1:]:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = LaplaceActiveSubspaceClassifier(**_common.grouped(
                module=net, prefit=True, max_components=cfg.max_components, n_samples=cfg.n_samples,
                confidence_level=LEVEL, random_state=seed, device="cpu", **params))
            clf.fit(Z["tr"], yi[tr], X_cal=Z["ca"], y_cal=yi[ca])
        p_te, p_ood = clf.predict_proba(Z["te"]), clf.predict_proba(Z["ood"])
        _, sets = clf.predict_set(Z["te"])
        codes = np.searchsorted(clf.classes_, yi[te])
        r = scores(p_te, yi[te], p_ood)
        r.update({"set_coverage": float(sets[np.arange(len(te)), codes, 0].mean()),
                  "set_size": float(sets[..., 0].sum(1).mean()), "d": int(clf.n_components_),
                  "sigma0": float(clf.sigma0_), "seconds": time.perf_counter() - t0})
        out["methods"][key] = r
    return out


def summarise(runs: list[dict]) -> dict:
    summary = {}
    for key, _, _ in METHODS:
        rows = [r["methods"][key] for r in runs]
        summary[key] = {m: {"mean": float(np.mean([x[m] for x in rows])),
                            "se": float(np.std([x[m] for x in rows], ddof=1) / np.sqrt(len(rows)))
                            if len(rows) > 1 else float("nan")}
                        for m in rows[0]}
    return summary


def render(results: dict) -> str:
    cfg, summ = results["config"], results["summary"]
    n = len(results["runs"])

    def f(key, m, digits=4):
        e = summ[key].get(m)
        if e is None:
            return "–"
        se = "" if not np.isfinite(e["se"]) else f" ± {e['se']:.{digits}f}"
        return f"{e['mean']:.{digits}f}{se}"

    lines = [f"# Digits 0–4 against 5–9: probabilities, sets and out-of-distribution detection"
             f"{' (quick mode)' if cfg['quick'] else ''}", "",
             f"Generated by `{results['command']}` on {results['date']} "
             f"({_common.machine_line(results['machine'])}).", "",
             f"ID = digits 0–4 (60/10/30 % train/calibration/test), OOD = digits 5–9; 64-50-50-5 tanh MLP, Adam lr "
             f"1e-3, {cfg['epochs']} epochs of batches of 64; d_max = {cfg['max_components']}, "
             f"n_samples = {cfg['n_samples']}; mean ± standard error over {n} seed(s). AUROC: maximum probability, ID "
             "test rows vs OOD rows. Sets at 90 %.", "",
             "| method | NLL | ECE | accuracy | OOD AUROC | set coverage | set size | d | σ0 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, label, _ in METHODS:
        lines.append(f"| {label} | {f(key, 'nll')} | {f(key, 'ece')} | {f(key, 'accuracy', 3)} | {f(key, 'auroc')} | "
                     f"{f(key, 'set_coverage', 3)} | {f(key, 'set_size', 2)} | {f(key, 'd', 1)} | "
                     f"{f(key, 'sigma0', 3)} |")
    m = summ["map"]
    lines += ["", "## Against the target (AUROC ≥ MAP + 0.01 with NLL ≤ MAP), computed", ""]
    for key in ("default", "low_rank_ebfull", "low_rank_diag"):
        if key not in summ:
            continue
        dft = summ[key]
        gain = dft["auroc"]["mean"] - m["auroc"]["mean"]
        lines += [f"- {key}: AUROC {dft['auroc']['mean']:.4f} vs MAP {m['auroc']['mean']:.4f} ({gain:+.4f}; target "
                  f"{'met' if gain >= 0.01 else 'not met'}); NLL {dft['nll']['mean']:.4f} vs {m['nll']['mean']:.4f} "
                  f"({'≤' if dft['nll']['mean'] <= m['nll']['mean'] else '>'} MAP); per seed (AUROC − MAP): "
                  + ", ".join(f"{r['methods'][key]['auroc'] - r['methods']['map']['auroc']:+.4f}"
                              for r in results["runs"]) + "."]
    lines.append("")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="1 seed, 20 epochs")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 100; quick 20)")
    p.add_argument("--max-components", type=int, default=50)
    p.add_argument("--n-samples", type=int, default=500)
    args = p.parse_args(argv)
    args.epochs = args.epochs if args.epochs is not None else (20 if args.quick else 100)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    json_path, md_path = _common.output_paths(args, "digits_ood")
    if args.report_only:
        R, text = _common.report_from_results(json_path, md_path, render)
        print(text)
        return R
    torch.set_num_threads(args.threads)
    results = {**_common.new_results(args), "runs": []}
    for seed in range(1 if args.quick else args.seeds):
        results["runs"].append(run_seed(seed, args))
        results["summary"] = summarise(results["runs"])
        print(f"[digits] seed {seed}: " + ", ".join(f"{k} AUROC {v['auroc']:.4f} NLL {v['nll']:.4f}"
                                                     for k, v in results["runs"][-1]["methods"].items()), flush=True)
    command = _common.command_line(__file__, argv)
    R, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)
    return R


if __name__ == "__main__":
    main()
