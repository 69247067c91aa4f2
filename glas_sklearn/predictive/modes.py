"""The predictive modes as objects, each written once: :class:`Linearized` and :class:`Sampled`.

A mode answers, for a posterior (asked only for ``predict_mean``, ``linearized_variance``, ``predict_samples`` and
``linearized_samples``), the moments of the network output f at a subspace dimension d, its central intervals,
class probabilities, draws of f, and the likelihood's moments of y (through the likelihood's
``sampled_parts`` / ``linearized_parts`` hooks). :func:`resolve_predictive` is the one place where the names
``"linearized"`` and ``"sampled"`` become objects; code downstream asks the object.

The functions at the end (:func:`regression_moments`, :func:`predictive_interval`, :func:`class_probabilities`)
are the public entry points that take a name or a mode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from .._checks import check_choice, numpy_rng
from .classification import linearized_probabilities, sampled_probabilities
from .regression import linearized_interval, sampled_interval

__all__ = ["Linearized", "OutputMoments", "PredictiveMode", "PosteriorProtocol", "RegressionMoments", "Sampled",
           "class_probabilities", "predictive_interval", "regression_moments", "resolve_predictive"]


@runtime_checkable
class PosteriorProtocol(Protocol):
    """What a predictive mode asks of a posterior (every kind of ``glas_sklearn.posterior`` provides it): the
    network output at the trained weights, its linearised variance at dimension d, and draws of f through the
    network or its linearisation, each ``(n, *out)`` or ``(S, n, *out)``; ``off_subspace``: whether the posterior
    also perturbs the weights off its subspace (then the sampled mode draws the linearised network)."""

    off_subspace: bool

    def predict_mean(self, X: torch.Tensor, batch_size: int | None = None) -> torch.Tensor: ...

    def linearized_variance(self, X: torch.Tensor, d: int, full_cov: bool = False,
                            batch_size: int | None = None) -> torch.Tensor: ...

    def predict_samples(self, X: torch.Tensor, d: int, n_samples: int = 1000, random_state=None,
                        batch_size: int | None = None) -> torch.Tensor: ...

    def linearized_samples(self, X: torch.Tensor, d: int, n_samples: int = 1000, random_state=None,
                           batch_size: int | None = None) -> torch.Tensor: ...


class RegressionMoments(NamedTuple):
    """Predictive mean ŷ and standard deviation σ̂ of a regression posterior, each of shape ``(n, *out)``."""

    mean: torch.Tensor
    std: torch.Tensor


class OutputMoments(NamedTuple):
    """Mean and variance of the network output f under a posterior at d, shape ``(n, *out)`` each, and the
    output samples ``(S, n, *out)`` behind them (None for a mode that draws none)."""

    mean: torch.Tensor
    variance: torch.Tensor
    samples: torch.Tensor | None


def add_noise_variance(variance: torch.Tensor, noise_var) -> torch.Tensor:
    """``variance`` plus the noise variance σ² (a number or one per output, the last axis); unchanged for σ² = 0."""
    noise = np.asarray(noise_var, dtype=np.float64)
    if np.any(noise != 0):
        return variance + torch.as_tensor(noise, dtype=variance.dtype, device=variance.device)
    return variance


class PredictiveMode(ABC):
    """How the posterior over weights becomes a predictive of the network output f.

    Attributes
    ----------
    name : str
        The mode's name (``"linearized"``, ``"sampled"``).
    scans_every_dimension : bool
        True when evaluating one more subspace dimension d is cheap (one JVP), so that calibration evaluates
        every d in turn rather than searching.
    """

    name: str = "custom"
    scans_every_dimension: bool = False

    @abstractmethod
    def values_per_output(self, n_samples: int, n_components: int) -> int:
        """The numbers a prediction holds at once per row and output (its memory budget): S output samples, or the
        K Jacobian projections and two more."""

    @abstractmethod
    def output_moments(self, posterior: PosteriorProtocol, X: torch.Tensor, d: int, *, n_samples: int = 1000,
                       random_state=None, batch_size: int | None = None) -> OutputMoments:
        """Mean and variance of f at d (and the samples drawn, if any)."""

    @abstractmethod
    def interval(self, moments: OutputMoments, confidence_levels, noise_var=0.0) -> torch.Tensor:
        """Central intervals ``(n, *out, 2, k)`` of f + ε, ε ~ N(0, ``noise_var``), from :meth:`output_moments`."""

    @abstractmethod
    def probabilities(self, posterior: PosteriorProtocol, X: torch.Tensor, d: int, *, n_samples: int = 1000,
                      random_state=None, linearized_method: str = "probit", generator=None,
                      batch_size: int | None = None, mean: torch.Tensor | None = None) -> torch.Tensor:
        """Class probabilities (n, C) at d; ``mean`` (the posterior mean's logits) may be passed when known."""

    @abstractmethod
    def draw_outputs(self, posterior: PosteriorProtocol, X: torch.Tensor, d: int, n_samples: int,
                     random_state=None) -> torch.Tensor:
        """Draws of the network output ``(S, n, *out)`` whose law is this mode's predictive of f."""

    @abstractmethod
    def likelihood_parts(self, likelihood, posterior: PosteriorProtocol, X: torch.Tensor, d: int, *,
                         n_samples: int = 1000, random_state=None, batch_size: int | None = None):
        """The likelihood's (mean, aleatoric variance, epistemic variance) of y under this mode."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


class Linearized(PredictiveMode):
    """The linearised predictive (paper eq. 45–46): f ~ N(f(x; θ0), J Σ Jᵀ); Gaussian intervals, probit (or Monte
    Carlo) class probabilities, the likelihood's linearised moments."""

    name = "linearized"
    scans_every_dimension = True

    def values_per_output(self, n_samples: int, n_components: int) -> int:
        return int(n_components) + 2

    def output_moments(self, posterior, X, d, *, n_samples=1000, random_state=None, batch_size=None):
        mean = posterior.predict_mean(X, batch_size=batch_size)
        var = posterior.linearized_variance(X, d, batch_size=batch_size).clamp_min(0)
        return OutputMoments(mean, var, None)

    def interval(self, moments, confidence_levels, noise_var=0.0):
        return linearized_interval(moments.mean, moments.variance, confidence_levels, noise_var=noise_var)

    def probabilities(self, posterior, X, d, *, n_samples=1000, random_state=None, linearized_method="probit",
                      generator=None, batch_size=None, mean=None):
        linearized_method = check_choice("linearized_method", linearized_method, ("probit", "mc"))
        full_cov = linearized_method == "mc"
        if mean is None:
            mean = posterior.predict_mean(X, batch_size=batch_size)
        cov = posterior.linearized_variance(X, d, full_cov=full_cov, batch_size=batch_size)
        return linearized_probabilities(mean, cov, method=linearized_method, n_samples=n_samples, generator=generator)

    def draw_outputs(self, posterior, X, d, n_samples, random_state=None):
        if posterior.off_subspace:  # the complement perturbs every weight: draw the linearised network
            return posterior.linearized_samples(X, d, n_samples, random_state=random_state)
        return posterior.predict_samples(X, d, n_samples, random_state=random_state)

    def likelihood_parts(self, likelihood, posterior, X, d, *, n_samples=1000, random_state=None, batch_size=None):
        return likelihood.linearized_parts(posterior, X, d, batch_size=batch_size)


class Sampled(PredictiveMode):
    """The sampled predictive (paper eq. 43–44): the network at S posterior weight samples; sample (or
    mixture) quantiles, the averaged softmax, the likelihood's moments by the law of total variance."""

    name = "sampled"

    def values_per_output(self, n_samples: int, n_components: int) -> int:
        return int(n_samples)

    def output_moments(self, posterior, X, d, *, n_samples=1000, random_state=None, batch_size=None):
        samples = posterior.predict_samples(X, d, n_samples=n_samples, random_state=random_state,
                                            batch_size=batch_size)
        return OutputMoments(samples.mean(0), samples.var(0, unbiased=False), samples)

    def interval(self, moments, confidence_levels, noise_var=0.0):
        """The central sample (or mixture) quantile intervals, each widened to hold the point prediction (the
        sample mean): a central interval is built around the median, so at low levels (0.05, 1e-12: nearly the
        median alone) it would miss a mean that a skewed sample puts beside it."""
        bounds = sampled_interval(moments.samples, confidence_levels, noise_var=noise_var)[1]
        mean = moments.mean
        if isinstance(bounds, torch.Tensor):
            point = torch.as_tensor(mean, dtype=bounds.dtype, device=bounds.device).unsqueeze(-1)
            return torch.stack([torch.minimum(bounds[..., 0, :], point), torch.maximum(bounds[..., 1, :], point)],
                               -2)
        point = np.asarray(mean, dtype=bounds.dtype)[..., None]
        return np.stack([np.minimum(bounds[..., 0, :], point), np.maximum(bounds[..., 1, :], point)], -2)

    def probabilities(self, posterior, X, d, *, n_samples=1000, random_state=None, linearized_method="probit",
                      generator=None, batch_size=None, mean=None):
        return sampled_probabilities(posterior.predict_samples(X, d, n_samples=n_samples, random_state=random_state,
                                                               batch_size=batch_size))

    def draw_outputs(self, posterior, X, d, n_samples, random_state=None):
        return posterior.predict_samples(X, d, n_samples, random_state=random_state)

    def likelihood_parts(self, likelihood, posterior, X, d, *, n_samples=1000, random_state=None, batch_size=None):
        samples = posterior.predict_samples(X, d, n_samples=n_samples, random_state=random_state,
                                            batch_size=batch_size)
        return likelihood.sampled_parts(samples)


_MODES = {"linearized": Linearized, "sampled": Sampled}


def resolve_predictive(predictive: str | PredictiveMode, name: str = "predictive") -> PredictiveMode:
    """A :class:`PredictiveMode` from its name (``"linearized"``, ``"sampled"``) or an instance (returned as is).

    Examples
    --------
    >>> resolve_predictive("sampled")
    Sampled()
    """
    if isinstance(predictive, PredictiveMode):
        return predictive
    return _MODES[check_choice(name, predictive, tuple(_MODES))]()


# ------------------------------------------------------------------ a posterior's predictive at d


def regression_moments(posterior: PosteriorProtocol, X: torch.Tensor, d: int, *,
                       predictive: str | PredictiveMode = "linearized", n_samples: int = 1000, noise_var=0.0,
                       random_state=None, batch_size: int | None = None) -> RegressionMoments:
    """Predictive mean ŷ and standard deviation σ̂ = sqrt(σ_f² + σ²) of a regression posterior at dimension d.

    Sampled: the mean and (population) variance of the S network outputs at the posterior samples (common
    to all rows: seeded by ``random_state``). Linearised: f(x; θ0) and J Σ Jᵀ's diagonal. ``noise_var`` σ²
    (one value or one per output) is added to the variance: the σ̂ of intervals for y.

    Returns
    -------
    RegressionMoments
        ``(mean, std)``, torch tensors of shape ``(n, *out)``.
    """
    m = resolve_predictive(predictive).output_moments(posterior, X, d, n_samples=n_samples,
                                                      random_state=random_state, batch_size=batch_size)
    return RegressionMoments(m.mean, add_noise_variance(m.variance, noise_var).sqrt())


def predictive_interval(posterior: PosteriorProtocol, X: torch.Tensor, d: int, confidence_levels=None, *,
                        predictive: str | PredictiveMode = "linearized", n_samples: int = 1000, noise_var=0.0,
                        random_state=None, batch_size: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The posterior's own predictive at d: :func:`regression_moments` and, for ``confidence_levels``, its
    central intervals (:func:`~glas_sklearn.predictive.sampled_interval` of the samples, or
    :func:`~glas_sklearn.predictive.linearized_interval`).

    Returns
    -------
    mean, std : torch.Tensor of shape ``(n, *out)``
    bounds : torch.Tensor of shape ``(n, *out, 2, k)``, or None without ``confidence_levels``
    """
    mode = resolve_predictive(predictive)
    m = mode.output_moments(posterior, X, d, n_samples=n_samples, random_state=random_state, batch_size=batch_size)
    bounds = None if confidence_levels is None else mode.interval(m, confidence_levels, noise_var)
    return m.mean, add_noise_variance(m.variance, noise_var).sqrt(), bounds


def class_probabilities(posterior: PosteriorProtocol, X: torch.Tensor, d: int, *,
                        predictive: str | PredictiveMode = "sampled", n_samples: int = 1000, random_state=None,
                        linearized_method: str = "probit", batch_size: int | None = None) -> torch.Tensor:
    """Class probabilities (n, C) of a classification posterior at dimension d: the softmax averaged over
    posterior samples (seeded by ``random_state``), or the linearised logit Gaussian pushed through the
    softmax (probit, or Monte Carlo with the full C × C logit covariance)."""
    mode = resolve_predictive(predictive)
    linearized_method = check_choice("linearized_method", linearized_method, ("probit", "mc"))
    gen = None if random_state is None else int(numpy_rng(random_state).integers(0, 2**62)) + 1
    return mode.probabilities(posterior, X, d, n_samples=n_samples, random_state=random_state,
                              linearized_method=linearized_method, generator=gen, batch_size=batch_size)
