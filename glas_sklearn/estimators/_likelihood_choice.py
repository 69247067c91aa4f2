"""``likelihood="auto"``: the heteroscedastic Gaussian when held-out rows support it, the Gaussian otherwise.

*Support* is measured, not assumed. With ``likelihood="auto"`` on a network the estimator builds, ``fit`` trains
two networks on the same rows (same seed, same early-stopping split): one with a variance head (mean μ_h(x) and
noise σ_h²(x), the :class:`~glas_sklearn.likelihoods.HeteroscedasticGaussian`) and one homoscedastic (mean μ_g(x),
the :class:`~glas_sklearn.likelihoods.Gaussian`). On rows neither was trained on it compares, per row i, the
negative log-likelihood of

- N(μ_h(x_i), c σ_h²(x_i)), c = mean of r_h²/σ_h² (the one scale that maximises the likelihood on these rows), and
- N(μ_g(x_i), s²), s² = mean of r_g² (the same: one fitted constant),

so that each model has one parameter fitted on the rows it is judged on. The data *support* the heteroscedastic
model when the mean per-row gain d̄ = mean(NLL_g − NLL_h) exceeds ``SUPPORT_Z`` = 1 standard error (a paired
test, one-sided at about 16 %) and ``MIN_SUPPORT_GAIN`` = 0.02 nats: σ(x) must explain the held-out residuals
better than a constant noise around the homoscedastic network's mean, and by enough to be worth a second model.
The floor matters on large tables only, where the standard error is small: with the true σ(x) and the same mean
the gain is ½ log E σ² − E log σ, about Var(log σ(x)) for log-normal σ, so 0.02 nats asks for a noise level that
varies by about ±14 % (a standard deviation of 0.14 in log σ). Measured: constant-noise Friedman data on 9,900 and
36,000 training rows passed the z test with gains of 0.0096 ± 0.0093 and 0.0069 ± 0.0040 (the variance head then
cost 2–3× the Gaussian's training and 4 % interval score: ``docs/benchmarks/studies.md#likelihood-test-cost``),
while every varying-noise case measured gained 0.10 nats or more (``docs/benchmarks/studies.md#likelihood-auto``).
z = 1 rather than 1.645 (5 %) because the two errors cost differently: on the dev sets
(20 % held out, 37–259 rows) z = 1.645 fell back to the Gaussian on splits where the heteroscedastic intervals were
much better (yacht under extrapolation: 0.41× against 0.30× the default's), while z = 1 kept it and still chose the
Gaussian on every near noise-free and constant-noise case measured (docs/benchmarks/studies.md#likelihood-auto). The
test judges both the noise model and the mean, because a variance head can cost the mean
(near noise-free targets: the residuals are approximation error, docs/benchmarks/studies.md#naval-like).

The rows are the early-stopping validation rows when training holds some out (from 2,000 training rows under
``early_stopping="auto"``). Below that, ``SUPPORT_FRACTION`` (20 %) of the training rows is held out, both networks
are trained on the rest and compared there, and the chosen one is trained again on all the training rows. Under
``early_stopping="auto"`` (off for the network itself below 2,000 rows) the two test networks stop on their loss
on those held-out rows, as the large-data path does on its validation rows, with ``TEST_PATIENCE`` (4) times its
patience (4 × ``n_iter_no_change`` epochs of at least 50 steps; the weights of the lowest held-out loss are the
ones compared), and the chosen one is trained again for the epoch e of its lowest held-out loss when e ≤
``max_epochs`` / 4, else for ``max_epochs`` (``RETRAIN_RULE``). Measured on the four UCI dev sets
(``docs/benchmarks/studies.md#auto-epochs``): with 500 epochs the optimum of both networks lies at epochs 253–500 on
yacht and energy, where the curve is flat (4 splits), and retraining for e rather than 500 cost yacht 1.12×
interval score (8 splits: more rows move the optimum later); on concrete and wine the variance head's optimum lies
at epochs 8–242 and the Gaussian's at 54–492, and the 500-epoch networks are far past it (the variance head's
held-out NLL 2.7 and 24 nats per row above its optimum). With the large-data patience and retraining short for
e ≤ 250 the variance head stopped at passing bumps of its curve on energy (choice flipped, one split 1.46×) and
short retrainings cost yacht 1.39× on one split. With ``early_stopping=False`` the three networks run all
``max_epochs`` epochs, as before. The calibration rows are never looked at, so the conformal guarantee is exact
whichever likelihood is chosen.

The test runs only where the choice is the estimator's to make: a network it builds, intervals from the conformal
calibrator (which normalises by σ̂(x)). A module of the user's, ``include_noise=True`` (intervals with one noise
level) and the paper's ``calibration="coverage"`` take the Gaussian; so do fewer than 100 training rows (fewer than
``MIN_SUPPORT_ROWS`` held-out rows: too few to tell).

Cost: a second training from 2,000 rows (2× the training time), three trainings below (two on 80 % of the rows,
stopped early: against three of 500 epochs, fit CPU 1.05× on yacht, 1.03× energy, 0.87× concrete, 0.32× wine
and interval score 1.000×, 0.999×, 1.000×, 0.837×, 20 splits each, one torch thread; the variance head kept on
20, 18, 7 and 11 splits against 20, 18, 4 and 0);
the curvature, the posterior and the calibration are built once, for the chosen likelihood.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from .._checks import numpy_rng
from .._functional import model_outputs
from ..likelihoods import Gaussian, Likelihood
from ._training import batch_slices

__all__ = ["MIN_SUPPORT_GAIN", "MIN_SUPPORT_ROWS", "SUPPORT_FRACTION", "SUPPORT_Z", "choose_auto_likelihood",
           "likelihood_support"]

#: Standard errors by which the heteroscedastic model's mean held-out NLL gain must exceed zero.
SUPPORT_Z = 1.0
#: The smallest mean held-out NLL gain per row (nats) that counts as support, whatever its standard error.
MIN_SUPPORT_GAIN = 0.02
#: Share of the training rows held out for the test when training holds no validation rows out (below 2,000 rows).
SUPPORT_FRACTION = 0.2
#: Fewer held-out rows than this (fewer than 100 training rows): no test, the Gaussian.
MIN_SUPPORT_ROWS = 20
#: Below 2,000 rows under ``early_stopping="auto"``: the epochs the chosen network is trained again for on all rows,
#: from the epoch e of its lowest held-out loss: "epochs" e, "steps" the same optimizer steps as e epochs on 80 %,
#: "max" max_epochs, "half" / "quarter" e when e ≤ max_epochs / 2 (/ 4: an early optimum), else max_epochs.
RETRAIN_RULE = "quarter"
#: ... and the patience of the two test networks, in multiples of ``n_iter_no_change`` (their held-out curves on
#: a few hundred rows are noisy: with 1, the variance head stopped at a passing bump on energy and lost the test).
TEST_PATIENCE = 4
# Offset of the seed of that split (within the training rows).
_SUPPORT_SPLIT = 7919


def likelihood_support(heteroscedastic: Likelihood, heteroscedastic_outputs: torch.Tensor,
                       gaussian_outputs: torch.Tensor, y: torch.Tensor, z: float = SUPPORT_Z,
                       min_gain: float = MIN_SUPPORT_GAIN) -> dict:
    """Whether held-out rows support a noise level that varies with x (see the module docstring).

    Parameters
    ----------
    heteroscedastic : Likelihood
        A likelihood with ``noise_in_outputs`` (it reads μ_h and σ_h² from ``heteroscedastic_outputs``).
    heteroscedastic_outputs : torch.Tensor of shape (m, 2k)
        The heteroscedastic network's outputs on the held-out rows.
    gaussian_outputs : torch.Tensor of shape (m, k)
        The homoscedastic network's outputs (means) on the same rows.
    y : torch.Tensor of shape (m, k)
        The targets of those rows, in the networks' units.
    z : float, default=SUPPORT_Z
        The one-sided threshold in standard errors of the mean gain.
    min_gain : float, default=MIN_SUPPORT_GAIN
        The smallest mean gain per row (nats) that counts, however small its standard error.

    Returns
    -------
    dict
        ``supported`` (bool), ``nll_gain`` (mean NLL_g − NLL_h per row, nats; > 0 favours the heteroscedastic
        model), ``nll_gain_se`` (its standard error), ``z``, ``min_gain``, ``n_rows``, ``heteroscedastic_scale``
        (c per target) and ``gaussian_std`` (s per target, in the networks' units).
    """
    y = y.detach().to(torch.float64).reshape(len(y), -1)
    mu_h = heteroscedastic.mean_output(heteroscedastic_outputs).detach().to(torch.float64).reshape(y.shape)
    var_h = heteroscedastic.noise_variance(heteroscedastic_outputs).detach().to(torch.float64).reshape(y.shape)
    mu_g = gaussian_outputs.detach().to(torch.float64).reshape(y.shape)
    tiny = torch.finfo(torch.float64).tiny
    var_h = var_h.clamp_min(tiny)
    r_h2, r_g2 = (y - mu_h) ** 2, (y - mu_g) ** 2
    c = (r_h2 / var_h).mean(0).clamp_min(tiny)
    s2 = r_g2.mean(0).clamp_min(tiny)
    nll_h = 0.5 * (r_h2 / (c * var_h) + torch.log(c * var_h)).sum(-1)
    nll_g = 0.5 * (r_g2 / s2 + torch.log(s2)).sum(-1)
    d = (nll_g - nll_h).cpu().numpy()
    m = len(d)
    gain = float(d.mean()) if m else 0.0
    se = float(d.std(ddof=1) / np.sqrt(m)) if m > 1 else float("inf")
    return {"supported": bool(m > 1 and gain - z * se > 0 and gain > min_gain), "nll_gain": gain, "nll_gain_se": se,
            "z": float(z), "min_gain": float(min_gain), "n_rows": int(m), "heteroscedastic_scale": c.cpu().numpy(),
            "gaussian_std": s2.sqrt().cpu().numpy()}


def choose_auto_likelihood(train: Callable, training, Xt: torch.Tensor, yt: torch.Tensor, seed: int,
                           heteroscedastic: Likelihood, report: Callable) -> tuple:
    """θ0 for ``likelihood="auto"``: the heteroscedastic and the homoscedastic network trained on the same rows,
    the support tested on rows neither was trained on: ``(module, likelihood, history, support)`` of the chosen
    network, ``support`` being :func:`likelihood_support`'s dict with ``rows``, ``chosen`` and ``seconds`` added.
    ``train(likelihood, **options)`` trains one network for ``likelihood`` and returns ``(module, history)``
    (options: ``held_out``, ``epochs`` and ``n_iter_no_change`` of :meth:`Training.fit`, ``rows``: train on these
    training rows only); ``training`` is the fit's :class:`~glas_sklearn.Training`; ``report`` writes the line.

    With early-stopping validation rows (from 2,000 training rows under ``early_stopping="auto"``) both networks
    are trained once and compared there. Without, ``SUPPORT_FRACTION`` of the training rows is held out, both
    networks are trained on the rest and compared on it, and the chosen one is trained again on all the rows.
    The calibration rows are never used, so the conformal guarantee is untouched."""
    t0 = time.perf_counter()
    het, gaussian = heteroscedastic, Gaussian()
    if training.validation_rows(yt, seed, False, "")[1] is not None:  # training will hold validation rows out
        het_module, het_history = train(het)
        module, history = train(gaussian)
        index = torch.as_tensor(history.validation_indices, device=Xt.device)
        support = likelihood_support(het, model_outputs(het_module, Xt[index]), model_outputs(module, Xt[index]),
                                     yt[index])
        support["rows"] = "validation"
        likelihood = gaussian
        if support["supported"]:
            likelihood, module, history = het, het_module, het_history
    elif int(np.ceil(SUPPORT_FRACTION * len(yt))) < MIN_SUPPORT_ROWS:  # too few rows to tell: the Gaussian
        likelihood = gaussian
        module, history = train(gaussian)
        support = {"supported": False, "nll_gain": float("nan"), "nll_gain_se": float("nan"), "z": SUPPORT_Z,
                   "n_rows": 0, "rows": f"none (fewer than {MIN_SUPPORT_ROWS / SUPPORT_FRACTION:.0f} training rows)"}
    else:
        n = len(yt)
        n_held = int(np.ceil(SUPPORT_FRACTION * n))
        perm = numpy_rng((seed + _SUPPORT_SPLIT) % 2**31).permutation(n)
        fit_rows, held_rows = np.sort(perm[n_held:]), np.sort(perm[:n_held])
        held = torch.as_tensor(held_rows, device=Xt.device)
        stop = isinstance(training.early_stopping, str)  # "auto": stopped on the held-out rows, retrained
        if stop:
            patience = TEST_PATIENCE * training.n_iter_no_change
            het_part, het_history = train(het, held_out=held_rows, n_iter_no_change=patience)
            gaussian_part, gaussian_history = train(gaussian, held_out=held_rows, n_iter_no_change=patience)
            best = {het.name: _best_epoch(het_history), gaussian.name: _best_epoch(gaussian_history)}
        else:  # early_stopping=False: every one of the max_epochs epochs, three times
            het_part, _ = train(het, rows=fit_rows)
            gaussian_part, _ = train(gaussian, rows=fit_rows)
        support = likelihood_support(het, model_outputs(het_part, Xt[held]), model_outputs(gaussian_part, Xt[held]),
                                     yt[held])
        support["rows"] = "held-out training"
        likelihood = het if support["supported"] else gaussian
        epochs = None
        if stop:
            epochs = retraining_epochs(best[likelihood.name], len(fit_rows), n, training.batch_rows,
                                       training.max_epochs)
            support.update(best_epochs=best, retraining_epochs=epochs)
        module, history = train(likelihood, epochs=epochs)
    support.update(chosen=likelihood.name, seconds=time.perf_counter() - t0)
    report(support_line(support))
    return module, likelihood, history, support


def _best_epoch(history) -> int:
    """The epoch (1-based) of the lowest held-out loss of a training (the one kept)."""
    return int(np.argmin(history.validation_scores)) + 1


def retraining_epochs(best_epoch: int, n_fit: int, n: int, batch_size: Callable, max_epochs: int) -> int:
    """Epochs on all n training rows for the chosen network, from the epoch ``best_epoch`` its held-out loss
    picked when it was trained on ``n_fit`` of them, by ``RETRAIN_RULE`` (``batch_size(rows)``: rows a step,
    None: all); at least 1 and at most ``max_epochs``."""
    if RETRAIN_RULE == "max" or best_epoch > max_epochs / {"half": 2, "quarter": 4}.get(RETRAIN_RULE, 1):
        return int(max_epochs)
    if RETRAIN_RULE == "steps":
        def steps(rows):
            return len(batch_slices(rows, batch_size(rows) or rows))
        best_epoch = round(best_epoch * steps(n_fit) / steps(n))
    return int(min(max_epochs, max(1, best_epoch)))


def support_line(support: dict) -> str:
    """The fit's line on the choice, e.g. "likelihood: auto chose heteroscedastic: on 716 validation rows the
    heteroscedastic network's held-out NLL is 0.31 ± 0.04 nats per row below the Gaussian network's
    (heteroscedastic when more than 1 standard errors and 0.02 nats below), 5.1 s (second network and test)"."""
    if not support["n_rows"]:
        return f"likelihood: auto chose {support['chosen']}: no test on {support['rows']}"
    sign = "below" if support["nll_gain"] >= 0 else "above"
    return (f"likelihood: auto chose {support['chosen']}: on {support['n_rows']} {support['rows']} rows the "
            f"heteroscedastic network's held-out NLL is {abs(support['nll_gain']):.3g} ± {support['nll_gain_se']:.2g} "
            f"nats per row {sign} the Gaussian network's (heteroscedastic when more than {support['z']:g} standard "
            f"errors and {support['min_gain']:g} nats below), {support['seconds']:.1f} s "
            "(second network and test)")
