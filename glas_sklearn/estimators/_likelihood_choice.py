"""The noise step of ``fit``, after the network is trained: the regressor's noise stage (σ(x) fitted on the mean
network's residuals, and for ``likelihood="auto"`` the choice between one constant σ and σ(x)) and the σ² that enters
β and the intervals (:class:`RegressionNoise`); the classifier has none (:class:`NoNoise`).

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
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .._functional import model_outputs
from ..laplace import residual_noise_variance
from ..likelihoods import FittedNoiseGaussian, Gaussian, Likelihood, fit_noise_model, noise_support
from ._prefit import user_stacklevel

__all__ = ["FittedNoise", "NoNoise", "NoiseStage", "NoiseStep", "RegressionNoise", "support_line"]

# Below this many held-out rows the residual variance is too noisy to prefer it over the training residuals.
_MIN_CALIBRATION_ROWS_FOR_NOISE = 30


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


# ------------------------------------------------------------------------------------------- the noise step
@dataclass
class NoiseStep:
    """What the noise step of ``fit`` returns.

    Attributes
    ----------
    likelihood : Likelihood
        The fit's likelihood from here on (the noise stage's choice, or the one resolved from the settings).
    beta_noise_var : float or None
        σ² that enters β (pooled over outputs, internal units); None where no σ² enters it.
    noise_var : ndarray of shape (M,) or None
        σ² per output (internal units), for the intervals and draws of y; None without a noise step.
    include_noise : bool
        Whether the epistemic intervals include σ² (``posterior__include_noise``).
    attributes : dict
        The estimator's fitted attributes of the step (``noise_source_``, ``noise_std_``, ``likelihood_support_``).
    timings, lines
        The stage's seconds by name and its log lines.
    """

    likelihood: Likelihood
    beta_noise_var: float | None = None
    noise_var: np.ndarray | None = None
    include_noise: bool = False
    attributes: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)

    def curvature_weight(self, Xt: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor | None:
        """The training rows' weights in the curvature: the user's ``weight`` times the likelihood's per-row precision
        factors σ²/σ²(x) where a noise model was kept (the curvature of N(f, σ²(x))), else ``weight``."""
        factors = None if self.noise_var is None else self.likelihood.curvature_row_weights(Xt, self.noise_var)
        if factors is None:
            return weight
        return factors if weight is None else weight * factors.to(weight.dtype)

    @property
    def interval_noise_var(self):
        """σ² added to the calibrated intervals' predictive: the per-output σ² under ``include_noise``, else 0."""
        return self.noise_var if self.include_noise else 0.0


@dataclass(frozen=True)
class NoNoise:
    """The classifier's noise step: none (the likelihood is the one resolved from the settings)."""

    def fit(self, module: nn.Module, likelihood: Likelihood, data, *, seed: int, fixed_predictor: bool) -> NoiseStep:
        return NoiseStep(likelihood)


@dataclass(frozen=True)
class RegressionNoise:
    """The regressor's noise step: the noise stage where the likelihood names one, then σ² for β and the intervals.

    Parameters
    ----------
    noise_std : "auto", "calibration", "training" or float
        The regressor's ``noise_std``.
    include_noise : bool
        ``posterior__include_noise``.
    stage : NoiseStage or None
        The noise model fitted after the mean network (``likelihood="auto"`` / ``"heteroscedastic"`` on a network
        built here, or a :class:`~glas_sklearn.likelihoods.FittedNoiseGaussian`); None: the likelihood as resolved.
    owner : str
        The estimator's name in messages.
    """

    noise_std: object
    include_noise: bool
    stage: NoiseStage | None
    owner: str

    def fit(self, module: nn.Module, likelihood: Likelihood, data, *, seed: int, fixed_predictor: bool) -> NoiseStep:
        """The step on the trained ``module`` and the prepared ``data`` (training and calibration rows, the target
        scaler); ``fixed_predictor``: the calibrator needs everything fixed before its rows (σ not estimated there
        by "auto")."""
        step = NoiseStep(likelihood, include_noise=self.include_noise, attributes={"likelihood_support_": None})
        if self.stage is not None:
            noise = self.stage.fit(module, data.Xt, data.yt, seed=seed, sample_weight=data.weight)
            step.likelihood, step.timings["noise"] = noise.likelihood, noise.seconds
            step.lines.append(noise.line)
            step.attributes["likelihood_support_"] = noise.support
        self._noise_variance(step, module, data, fixed_predictor)
        return step

    def _noise_variance(self, step: NoiseStep, module: nn.Module, data, fixed: bool) -> None:
        """σ² for β (pooled over outputs, internal units; training residuals weighted, calibration residuals
        unweighted); the per-output values are kept for intervals. With the noise in the network's outputs no σ²
        enters β, and the mean of σ²(x) over the training rows is kept for ``noise_std_``."""
        likelihood, Xt, yt, Xc, yc = step.likelihood, data.Xt, data.yt, data.Xc, data.yc
        if likelihood.noise_in_outputs:
            out = model_outputs(module, Xt)
            likelihood.check_output(out, "the module")
            source = likelihood.name
            per_output = likelihood.noise_variance(out).to(torch.float64).reshape(len(out), -1).mean(0).cpu().numpy()
        else:
            source = self.noise_std
            if source == "auto":
                source = "calibration" if len(Xc) >= _MIN_CALIBRATION_ROWS_FOR_NOISE and not fixed else "training"
            elif source == "calibration" and fixed:
                warnings.warn("LaplaceActiveSubspaceRegressor: noise_std='calibration' with calibration='conformal' "
                              "estimates σ from the calibration rows, so the conformal scores depend on those rows "
                              "and the coverage guarantee is only approximate; use noise_std='training' or a given "
                              "σ for the exact guarantee.", UserWarning, stacklevel=user_stacklevel())
            if source == "training":
                per_output = residual_noise_variance(module, Xt, yt, per_output=True, sample_weight=data.weight)
            elif source == "calibration":
                if len(Xc) < 2:
                    raise ValueError(f"noise_std='calibration' needs at least 2 calibration rows, got {len(Xc)}.")
                per_output = residual_noise_variance(module, Xc, yc, per_output=True)
            else:
                per_output = (float(self.noise_std) / data.targets.y_scale) ** 2
            source = source if isinstance(source, str) else "given"
        step.noise_var = np.asarray(per_output, dtype=np.float64)
        if not likelihood.noise_in_outputs:
            step.beta_noise_var = float(np.mean(step.noise_var))
        std = np.sqrt(step.noise_var) * data.targets.y_scale
        if not isinstance(self.noise_std, str):
            std = np.full_like(std, float(self.noise_std))  # a given σ is reported exactly as given
        step.attributes["noise_source_"] = source
        step.attributes["noise_std_"] = float(std[0]) if data.targets.y_1d else std
