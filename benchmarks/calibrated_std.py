"""Is ``predict(return_std=True)`` a calibrated Gaussian std? Held-out Gaussian NLL on scikit-learn's diabetes data.

Per random 80/20 split (``--splits``), the regressor with its defaults (``likelihood="gaussian"``, conformal) and with
``likelihood="heteroscedastic"``; on the test rows the mean Gaussian NLL of N(ŷ, s²) for

- ``calibrated``: s = ``predict(return_std=True)``, σ̂ times ``std_scale_`` (the RMS calibration score);
- ``raw``: s = σ̂ = std / ``std_scale_``, the conformal normalisation (what ``return_std`` returned before);
- ``interval``: s = q σ̂ / z, the std the 90 % conformal interval implies (z = 1.645);
- ``raw_with_noise`` (homoscedastic only): s = sqrt(σ_f² + σ²), the posterior's own predictive of y.

Usage: ``python benchmarks/calibrated_std.py [--splits 5]``; ``--report-only`` re-renders from the JSON.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import warnings

import _common
import numpy as np
import torch
from sklearn.datasets import load_diabetes
from sklearn.model_selection import train_test_split

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, Training

Z = 1.6448536269514722
STEM = "calibrated_std"


def _nll(y, mu, s):
    return float(np.mean(0.5 * np.log(2 * np.pi * s**2) + 0.5 * (y - mu) ** 2 / s**2))


def run(split: int, epochs: int) -> dict:
    X, y = load_diabetes(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.2, random_state=split)
    out = {}
    for lik in ("gaussian", "heteroscedastic"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = LaplaceActiveSubspaceRegressor(likelihood=lik, random_state=split,
                                                 training=Training(max_epochs=epochs),
                                                 compute=Compute(device="cpu")).fit(X_tr, y_tr)
        mu, std = est.predict(X_te, return_std=True)
        raw = std / est.std_scale_[0]
        q = float(est.calibration_["quantile"].iloc[0])
        row = {"calibrated": _nll(y_te, mu, std), "raw": _nll(y_te, mu, raw), "interval": _nll(y_te, mu, q * raw / Z),
               "std_scale": float(est.std_scale_[0]), "rmse": float(np.sqrt(np.mean((y_te - mu) ** 2)))}
        if lik == "gaussian":
            row["raw_with_noise"] = _nll(y_te, mu, np.sqrt(raw**2 + est.noise_std_**2))
        out[lik] = row
    return out


def render(results) -> str:
    runs = results["runs"]
    lines = ["# Calibrated `predict(return_std=True)`: held-out Gaussian NLL (scikit-learn diabetes)", "",
             f"`{results['command']}`", "", _common.machine_line(results["machine"]), "",
             f"Date {results['date']}. {len(runs)} random 80/20 splits, the regressor's defaults "
             f"({results['config']['epochs']} epochs); mean ± s.e. over splits (lower is better).", ""]
    cols = ["calibrated", "raw", "interval", "raw_with_noise", "std_scale", "rmse"]
    rows = []
    for lik in ("gaussian", "heteroscedastic"):
        cells = [f"`{lik}`"]
        for c in cols:
            v = [r[lik][c] for r in runs if c in r[lik]]
            se = np.std(v, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
            cells.append("–" if not v else f"{np.mean(v):.3f} ± {se:.3f}")
        rows.append(cells)
    lines += _common.markdown_table(["likelihood", "NLL calibrated (return_std)", "NLL raw σ̂", "NLL interval-implied",
                                     "NLL σ_f ⊕ σ", "std_scale_", "RMSE"], rows, "lrrrrrr")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _common.add_common_arguments(p, quick="1 split, 100 epochs")
    p.add_argument("--splits", type=int, default=5)
    p.add_argument("--epochs", type=int, default=None, help="default 500, the regressor's (quick 100)")
    args = p.parse_args(argv)
    args.epochs = args.epochs or (100 if args.quick else 500)
    json_path, md_path = _common.output_paths(args, STEM)
    if args.report_only:
        print(_common.report_from_results(json_path, md_path, render)[1])
        return
    torch.set_num_threads(args.threads)
    command = _common.command_line(__file__, argv)
    results = {"date": _dt.datetime.now().isoformat(timespec="seconds"),
               "config": {k: (str(v) if hasattr(v, "is_dir") else v) for k, v in vars(args).items()}, "runs": []}
    for split in range(1 if args.quick else args.splits):
        results["runs"].append(run(split, args.epochs))
        _, text = _common.write_results_and_report(json_path, md_path, results, render, command=command)
    print(text)


if __name__ == "__main__":
    main()
