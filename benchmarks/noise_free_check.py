"""Near noise-free check: Friedman #1 with noise sd 1e-3 (500 and 2,500 rows, 2 seeds, 10 % calibration rows, 5,000
test rows): the homoscedastic default against likelihood="heteroscedastic", estimator defaults, conformal; mean
interval score (is), coverage, RMSE. Writes results/variance_head_noisefree.json. Run from the repository root:
``python benchmarks/noise_free_check.py``."""
import json
import warnings

import numpy as np
import torch
from sklearn.datasets import make_friedman1

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor

torch.set_num_threads(1)

out = []
for n in (500, 2500):
    for seed in range(2):
        X, y = make_friedman1(n + 5000, noise=0.0, random_state=seed)
        y = y + 1e-3 * np.random.default_rng(seed).standard_normal(len(y))
        Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
        nc = n // 10
        r = {"n": n, "seed": seed}
        for lik in ("gaussian", "heteroscedastic"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = LaplaceActiveSubspaceRegressor(likelihood=lik, confidence_level=0.9, random_state=seed,
                                                     compute=Compute(device="cpu", n_threads=1))
                est.fit(Xtr[nc:], ytr[nc:], X_cal=Xtr[:nc], y_cal=ytr[:nc])
            _, pis = est.predict_interval(Xte)
            lo, hi = pis[:, 0, 0], pis[:, 1, 0]
            isc = (hi - lo) + 20 * (lo - yte) * (yte < lo) + 20 * (yte - hi) * (yte > hi)
            r[lik] = {"is": float(isc.mean()), "cov": float(((yte >= lo) & (yte <= hi)).mean()),
                      "rmse": float(np.sqrt(np.mean((est.predict(Xte) - yte) ** 2))),
                      "val": getattr(est, "best_validation_score_", None)}
        print(r, flush=True)
        out.append(r)
json.dump({"command": "python benchmarks/noise_free_check.py", "runs": out,
           "machine": {"threads": torch.get_num_threads()}},
          open('benchmarks/results/variance_head_noisefree.json', 'w'))
