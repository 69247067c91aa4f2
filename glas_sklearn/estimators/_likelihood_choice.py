"""The regressor's noise stage, after the mean network is trained: σ(x) fitted on its residuals, and for
``likelihood="auto"`` the choice between one constant σ and σ(x).

One network is trained, the Gaussian's (same seed, same rows, same loss: its mean is ``likelihood="gaussian"``'s).
Then :func:`~glas_sklearn.likelihoods.noise_support` compares, by cross-fitting on the training rows' residuals,
a constant σ with a noise model σ(x) (:func:`~glas_sklearn.likelihoods.fit_noise_model`); when σ(x) is supported
(or always, for ``likelihood="heteroscedastic"``) the noise model is fitted on all the training rows and the
fit's likelihood is :class:`~glas_sklearn.likelihoods.FittedNoiseGaussian`, else the
:class:`~glas_sklearn.likelihoods.Gaussian`. The calibration rows are never looked at, so the conformal
guarantee holds whichever is chosen; the curvature, the posterior and the calibration are built once, after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from .._functional import model_outputs
from ..likelihoods import FittedNoiseGaussian, Gaussian, Likelihood, fit_noise_model, noise_support

__all__ = ["FittedNoise", "NoiseStage", "support_line"]


@dataclass(frozen=True)
class FittedNoise:
    """What the noise stage returns: the fit's ``likelihood`` (a :class:`~glas_sklearn.likelihoods.Gaussian`, or a
    :class:`~glas_sklearn.likelihoods.FittedNoiseGaussian` holding its noise model), the evidence of the test
    (``support``, None without one), the stage's ``seconds`` and its log ``line``."""

    likelihood: Likelihood
    support: dict | None
    seconds: float
    line: str


@dataclass(frozen=True)
class NoiseStage:
    """The noise model fitted after the mean network; ``test``: kept only where the residuals support σ(x) over
    one constant σ (``likelihood="auto"``), else always (``likelihood="heteroscedastic"``)."""

    test: bool

    def fit(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, *, seed: int,
            sample_weight: torch.Tensor | None = None) -> FittedNoise:
        """The stage on the trained mean network ``module`` and the training rows (Xt, yt), in the network's units.

        Parameters
        ----------
        module : nn.Module
            The trained mean network (the Gaussian's, k outputs).
        Xt, yt : torch.Tensor
            The training rows and their targets, (n, ...) and (n, k).
        seed : int
            Seeds the cross-fitting split and the trees.
        sample_weight : torch.Tensor of shape (n,), optional
            Row weights of the noise model and of the test.

        Returns
        -------
        FittedNoise
        """
        t0 = time.perf_counter()
        mean = model_outputs(module, Xt)
        support = noise_support(Xt, yt, mean, sample_weight=sample_weight, seed=seed) if self.test else None
        likelihood: Likelihood = Gaussian()
        if support is None or support["supported"]:
            model = fit_noise_model(Xt, yt, mean, sample_weight=sample_weight, seed=seed)
            likelihood = FittedNoiseGaussian().with_noise_model(model)
        seconds = time.perf_counter() - t0
        if support is None:
            line = (f"likelihood: heteroscedastic: noise model σ(x) fitted on the residuals of {len(yt):,} training "
                    f"rows, {seconds:.1f} s")
        else:
            support = {**support, "rows": "training", "chosen": likelihood.name, "seconds": seconds}
            line = support_line(support)
        return FittedNoise(likelihood, support, seconds, line)


def support_line(support: dict) -> str:
    """The fit's line on the choice, in words a user reads without the internals, e.g. "likelihood: auto chose
    heteroscedastic (a noise level that varies with x): on 2,000 training rows, a noise level σ(x) fitted on one
    half and scored on the other (both ways) fits the residuals 0.31 ± 0.04 nats a row better than one constant
    level (kept when more than 2 standard errors and 0.02 nats better), 0.3 s (noise model and test)"."""
    plain = _PLAIN.get(support["chosen"], "")
    if support["nll_gain"] != support["nll_gain"]:  # NaN: no test
        return (f"likelihood: auto chose {support['chosen']}{plain}: no test on {support['n_rows']:,} training rows "
                "(too few to tell)")
    sign = "better" if support["nll_gain"] >= 0 else "worse"
    scored = ("fitted on one half and scored on the other (both ways)" if support["folds"] == 2 else
              f"fitted and scored across {support['folds']} folds")
    return (f"likelihood: auto chose {support['chosen']}{plain}: on {support['n_rows']:,} {support['rows']} rows, "
            f"a noise level σ(x) {scored} fits the residuals {abs(support['nll_gain']):.3g} ± "
            f"{support['nll_gain_se']:.2g} nats a row {sign} than one constant level (kept when more than "
            f"{support['z']:g} standard errors and {support['min_gain']:g} nats better), "
            f"{support['seconds']:.1f} s (noise model and test)")


_PLAIN = {"gaussian": " (one noise level for every x)", "heteroscedastic": " (a noise level that varies with x)"}
