"""The regressor's noise stage, after the mean network is trained: σ(x) fitted on its residuals, and for
``likelihood="auto"`` the choice between one constant σ and σ(x).

One network is trained, the Gaussian's (same seed, same rows, same loss: its mean is ``likelihood="gaussian"``'s).
Then :func:`~glas_sklearn.likelihoods.noise_support` compares, by cross-fitting on the training rows' residuals,
a constant σ with a noise model σ(x) (:func:`~glas_sklearn.likelihoods.fit_noise_model`); when σ(x) is supported
(or always, for ``likelihood="heteroscedastic"``) the noise model is fitted on all the training rows and the
fit's likelihood becomes :class:`~glas_sklearn.likelihoods.FittedNoiseGaussian`, else it stays the
:class:`~glas_sklearn.likelihoods.Gaussian`. The calibration rows are never looked at, so the conformal
guarantee holds whichever is chosen; the curvature, the posterior and the calibration are built once, after.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from .._functional import model_outputs
from ..likelihoods import Gaussian, fit_noise_model, noise_support

__all__ = ["fit_noise_stage", "support_line"]


def fit_noise_stage(est, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, seed: int,
                    sample_weight: torch.Tensor | None = None, *, choose: bool) -> None:
    """The noise stage on the trained mean network ``module`` and the training rows (Xt, yt): with ``choose``
    (``likelihood="auto"``) the test of :func:`~glas_sklearn.likelihoods.noise_support`, its evidence in
    ``est.likelihood_support_`` (with ``rows``, ``chosen`` and ``seconds`` added) and the fit's log line; then,
    unless a constant σ was chosen (``est.likelihood_`` the Gaussian), the noise model fitted on all the training
    rows and attached to ``est.likelihood_`` (a :class:`~glas_sklearn.likelihoods.FittedNoiseGaussian`).
    ``est.timings_["noise"]`` is its time."""
    t0 = time.perf_counter()
    mean = model_outputs(module, Xt)
    if choose:
        support = noise_support(Xt, yt, mean, sample_weight=sample_weight, seed=seed)
        if not support["supported"]:
            est.likelihood_ = Gaussian()
    if est.likelihood_.noise_per_row:
        model = fit_noise_model(Xt, yt, mean, sample_weight=sample_weight, seed=seed)
        est.likelihood_ = est.likelihood_.with_noise_model(model)
    seconds = time.perf_counter() - t0
    est.timings_["noise"] = seconds
    if choose:
        support.update(rows="training", chosen=est.likelihood_.name, seconds=seconds)
        est.likelihood_support_ = support
        est._report(support_line(support))
    else:
        est._report(f"likelihood: heteroscedastic: noise model σ(x) fitted on the residuals of {len(yt):,} training "
                    f"rows, {seconds:.1f} s")


def support_line(support: dict) -> str:
    """The fit's line on the choice, e.g. "likelihood: auto chose heteroscedastic: on 2,000 training rows
    (2-fold cross-fitted) the noise model σ(x)'s NLL of the residuals is 0.31 ± 0.04 nats per row below a constant
    σ's (σ(x) when more than 2 standard errors and 0.02 nats below), 0.3 s (noise model and test)"."""
    if support["nll_gain"] != support["nll_gain"]:  # NaN: no test
        return (f"likelihood: auto chose {support['chosen']}: no test on {support['n_rows']:,} training rows (too "
                "few to tell)")
    sign = "below" if support["nll_gain"] >= 0 else "above"
    return (f"likelihood: auto chose {support['chosen']}: on {support['n_rows']:,} {support['rows']} rows "
            f"({support['folds']}-fold cross-fitted) the noise model σ(x)'s NLL of the residuals is "
            f"{abs(support['nll_gain']):.3g} ± {support['nll_gain_se']:.2g} nats per row {sign} a constant σ's "
            f"(σ(x) when more than {support['z']:g} standard errors and {support['min_gain']:g} nats below), "
            f"{support['seconds']:.1f} s (noise model and test)")
