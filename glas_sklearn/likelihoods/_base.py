"""The likelihood protocol: what training, the curvature and the posterior scaling β ask of an observation model.

A likelihood p(y | f) of a network output f gives the mean training loss (the negative log-likelihood up to
constants and scale), the Hessian H_n of the per-record loss with respect to the output, which the
generalized Gauss-Newton matrix G = (1/N) Σ_n J_nᵀ H_n J_n needs only through products H_n u, and the scaling β
that turns G into the posterior precision (paper eq. 1, §4.1.1). Strings name the built-in likelihoods only at the
boundary (:func:`~glas_sklearn.likelihoods.resolve_likelihood`); code downstream asks the object.
"""

from __future__ import annotations

import abc
import inspect
import math
import numbers

import numpy as np
import torch
from torch import nn

from .._checks import check_positive_float, check_positive_int
from ..conformity_scores import ConformityScore
from ..predictive import (
    RegressionMoments,
    interval_coverage,
    mean_interval_width,
    predictive_interval,
    regression_moments,
    resolve_predictive,
)

__all__ = ["SCALINGS", "Likelihood", "match_regression"]

SCALINGS = ("mean", "standard")


class Likelihood(abc.ABC):
    """An observation model p(y | f) of the network output f: loss, output Hessian and posterior scaling.

    A subclass implements :meth:`loss` and :meth:`output_hessian_product`, sets ``name`` and
    ``is_classification``, and overrides the other methods where its defaults do not hold. Constructor
    arguments are stored under their own names (as scikit-learn estimators do), so that
    :meth:`get_params`, ``repr`` and :func:`sklearn.base.clone` of an estimator holding the likelihood work.

    Attributes
    ----------
    name : str
        Short name ("gaussian", "categorical", ...), used in messages and reprs.
    is_classification : bool
        True when the targets are class labels and the outputs their logits.
    needs_noise_variance : bool
        True when β for a named scaling depends on the observation-noise variance σ² (to be estimated from
        residuals when not given).

    Examples
    --------
    A minimal subclass, the ½-squared loss written out:

    >>> import torch
    >>> class HalfSquared(Likelihood):
    ...     name = "half_squared"
    ...     def loss(self, output, target):
    ...         return 0.5 * ((output - target) ** 2).sum(-1).mean()
    ...     def output_hessian_product(self, output, u):
    ...         return u
    >>> lik = HalfSquared()
    >>> float(lik.loss(torch.zeros(2, 1), torch.ones(2, 1)))
    0.5
    >>> lik.beta("standard", 100)
    100.0
    """

    name: str = "custom"
    is_classification: bool = False
    needs_noise_variance: bool = False
    #: The regressors' ``scaling="auto"``.
    default_scaling: str = "mean"
    #: True when the network's outputs carry the noise variance σ²(x) (:meth:`noise_variance`): no σ² is
    #: estimated from residuals and the predictive of y needs no added noise.
    noise_in_outputs: bool = False
    #: True when the likelihood predicts a noise level per row, σ(x) (:meth:`row_noise_variance`: the network's
    #: outputs or a noise model fitted after it), rather than one constant σ.
    noise_per_row: bool = False
    #: How an ensemble of networks combines its members' outputs into this likelihood's
    #: (:class:`~glas_sklearn.ensemble.NetworkEnsemble`'s ``combine``); None: outputs that cannot be averaged (a
    #: variance head), no ensemble.
    ensemble_combine: str | None = "mean"
    #: The table column that :meth:`region_size` fills.
    region_size_name: str = "mean_width"
    #: What the targets are, in messages ("regression", "classification").
    problem: str = "regression"

    def n_outputs(self, n_targets: int) -> int:
        """Network outputs per row for ``n_targets`` targets (regression) or classes (classification)."""
        return int(n_targets)

    @abc.abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The scalar mean training loss of outputs (..., M) against their targets."""

    def held_out_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The scalar mean loss by which rows held out of training judge it (early stopping): by default the
        training loss itself."""
        return self.loss(output, target)

    @abc.abstractmethod
    def output_hessian_product(self, output: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """H_n(output) u for every record: ``output`` (detached) and ``u`` of the same shape (..., M), result too.

        H_n is the Hessian of one record's loss with respect to that record's output M-vector; it depends on the
        output only (not on the target), which is what makes G the generalized Gauss-Newton matrix.
        """

    def output_hessian_diagonal_terms(self, output: torch.Tensor, jacobian: torch.Tensor) -> torch.Tensor:
        """diag(J_nᵀ H_n J_n) per record: ``output`` (..., M), ``jacobian`` (..., M, D) → (..., D).

        The default applies :meth:`output_hessian_product` to every column of J_n; a subclass may override it
        with a closed form.
        """
        columns = jacobian.transpose(-1, -2)  # (..., D, M): one output-space vector per weight
        at = output.to(columns.dtype).unsqueeze(-2).expand_as(columns)
        return (columns * self.output_hessian_product(at, columns)).sum(-1)

    def beta(self, scaling, n_records: int, noise_var: float | None = None) -> float:
        """The posterior scaling β (paper eq. 1, §4.1.1) for ``scaling``: "mean" (the paper's proposal, the mean loss),
        "standard" (Bayes, the summed loss, N times "mean"), or a positive float, which is β itself.

        Parameters
        ----------
        scaling : {"mean", "standard"} or float
        n_records : int
            N, the number of training records the mean loss averages over.
        noise_var : float, optional
            σ², for likelihoods with ``needs_noise_variance``; ignored by the others.

        Returns
        -------
        float
            β > 0.
        """
        n_records = check_positive_int("n_records", n_records)
        if isinstance(scaling, numbers.Real) and not isinstance(scaling, bool):
            return check_positive_float("scaling (a float is used as β directly)", scaling)
        if not isinstance(scaling, str) or scaling not in SCALINGS:
            raise ValueError(
                f"scaling must be 'mean', 'standard' or a positive float (β itself), got {scaling!r}."
            )
        factor = float(n_records) if scaling == "standard" else 1.0
        return self._named_scaling_beta(factor, scaling, noise_var)

    def _named_scaling_beta(self, factor: float, scaling: str, noise_var: float | None) -> float:
        """β of a named scaling from its record factor (1 for "mean", N for "standard"); the factor by default."""
        return factor

    def mean_output(self, output: torch.Tensor) -> torch.Tensor:
        """The part of the output whose posterior uncertainty the predictive reports (all of it by default)."""
        return output

    def sampled_parts(self, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean, aleatoric variance, epistemic variance) of y from output samples ``(S, n, M)`` (the sampled
        predictive mode asks this). The default, for outputs that are the mean of y: the samples' mean, no
        aleatoric part (the noise variance is the caller's), their variance."""
        return samples.mean(0), torch.zeros_like(samples[0]), samples.var(0, unbiased=False)

    def linearized_parts(self, posterior, X: torch.Tensor, d: int, *,
                         batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean, aleatoric variance, epistemic variance) of y under the linearised posterior (the linearised
        predictive mode asks this). The default: f(x; θ0), no aleatoric part, J Σ Jᵀ's diagonal."""
        mean = posterior.predict_mean(X, batch_size=batch_size)
        return mean, torch.zeros_like(mean), posterior.linearized_variance(X, d, batch_size=batch_size).clamp_min(0)

    def predictive_parts(self, posterior, X: torch.Tensor, d: int, *, predictive="linearized",
                         n_samples: int = 1000, random_state=None,
                         batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean, aleatoric variance, epistemic variance) of y, (n, M) each, under the predictive mode
        (:meth:`linearized_parts` or :meth:`sampled_parts`; an added ``noise_var`` is the caller's). With the noise
        variance added to the aleatoric part they sum to :meth:`predictive_moments`' σ̂² for the built-in
        regression likelihoods; calibrations that weigh the two parts ask this
        (:class:`~glas_sklearn.calibration.ConformalCalibrator` with ``epistemic_weight``)."""
        return resolve_predictive(predictive).likelihood_parts(self, posterior, X, d, n_samples=n_samples,
                                                               random_state=random_state, batch_size=batch_size)

    def predictive_moments(self, posterior, X: torch.Tensor, d: int, *, predictive="linearized",
                           n_samples: int = 1000, noise_var=0.0, random_state=None,
                           batch_size: int | None = None) -> RegressionMoments:
        """The predictive mean ŷ and standard deviation σ̂ of y (regression) under ``posterior`` at dimension d:
        what the calibrators, σ0 tuning and the regressor's predictions ask of a likelihood.

        The default, for a likelihood whose network output is the mean of y: the posterior moments of f
        (:func:`~glas_sklearn.predictive.regression_moments`, linearised or sampled) with ``noise_var`` σ² added to
        the variance. A likelihood whose outputs are not the mean of y (a variance head, ...) overrides it.
        ``posterior`` is an :class:`~glas_sklearn.posterior.ActiveSubspacePosterior` (asked for ``predict_mean``,
        ``linearized_variance`` and ``predict_samples`` only).

        Returns
        -------
        RegressionMoments
            ``(mean, std)``, tensors of shape (n, M).
        """
        return regression_moments(posterior, X, d, predictive=predictive, n_samples=n_samples, noise_var=noise_var,
                                  random_state=random_state, batch_size=batch_size)

    def predictive_interval(self, posterior, X: torch.Tensor, d: int, confidence_levels=None, *,
                            predictive="linearized", n_samples: int = 1000, noise_var=0.0, random_state=None,
                            batch_size: int | None = None):
        """The posterior's own central intervals of y at d (the coverage calibration's, uncalibrated):
        ``(mean, std, bounds)`` of shapes (n, M), (n, M) and (n, M, 2, k), bounds None without levels.

        The default: :func:`~glas_sklearn.predictive.predictive_interval` (sampled quantiles, or the Gaussian
        intervals of the linearised moments), with ``noise_var`` σ² added.
        """
        return predictive_interval(posterior, X, d, confidence_levels, predictive=predictive, n_samples=n_samples,
                                   noise_var=noise_var, random_state=random_state, batch_size=batch_size)

    def default_conformity_score(self) -> ConformityScore:
        """The conformity score (:mod:`glas_sklearn.conformity_scores`) that split-conformal calibration uses for this
        likelihood by default; a subclass without one raises NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} names no default conformity score; pass one to "
                                  "ConformalCalibrator(conformity_score=...).")

    # ------------------------------------------------------- what calibration asks
    def check_noise_var(self, noise_var) -> None:
        """Raise a ValueError when an added noise variance σ² (``noise_var``) means nothing for this likelihood
        (any σ² is accepted by default)."""
        return None

    def check_targets(self, y: torch.Tensor) -> torch.Tensor:
        """Calibration targets checked before any work (numeric and finite by default); returns them."""
        if not (y.is_floating_point() or y.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"y_cal must be numeric for {self.problem}, got dtype {y.dtype}.")
        if not bool(torch.isfinite(y.to(torch.float64)).all()):
            raise ValueError("y_cal contains NaN or infinite values.")
        return y

    def calibration_prediction(self, posterior, X: torch.Tensor, d: int, *, predictive="linearized",
                               n_samples: int = 1000, noise_var=0.0, random_state=None,
                               linearized_method: str = "probit", batch_size: int | None = None):
        """What conformity scores and the predictive NLL take at d: the predictive moments of y by default
        (:meth:`predictive_moments`)."""
        return self.predictive_moments(posterior, X, d, predictive=predictive, n_samples=n_samples,
                                       noise_var=noise_var, random_state=random_state, batch_size=batch_size)

    def calibration_targets(self, y: torch.Tensor, prediction) -> torch.Tensor:
        """The targets matched to :meth:`calibration_prediction`: shaped as the predictive mean, in its dtype."""
        return match_regression(y, tuple(prediction.mean.shape)).to(prediction.mean.dtype)

    def predictive_region(self, posterior, X: torch.Tensor, d: int, confidence_levels, *, predictive="linearized",
                          n_samples: int = 1000, noise_var=0.0, random_state=None, linearized_method: str = "probit",
                          batch_size: int | None = None, mean: torch.Tensor | None = None):
        """The posterior's own (uncalibrated) regions at d, the coverage calibration's: central intervals of y
        (:meth:`predictive_interval`), shape (n, M, 2, k). ``mean`` (the network's outputs) may be passed when
        known."""
        return self.predictive_interval(posterior, X, d, confidence_levels, predictive=predictive,
                                        n_samples=n_samples, noise_var=noise_var, random_state=random_state,
                                        batch_size=batch_size)[2]

    def region_coverage(self, y: torch.Tensor, region) -> np.ndarray:
        """The fraction of targets inside their regions, per level (k,)."""
        return interval_coverage(match_regression(y, tuple(region.shape[:-2])), region)

    def region_size(self, region) -> np.ndarray:
        """The mean size of the regions per level (k,): the mean interval width."""
        return mean_interval_width(region)

    def predictive_nll(self, prediction, target: torch.Tensor) -> float:
        """Mean negative log predictive density of the targets (:meth:`calibration_targets`): the mean of
        :meth:`predictive_nll_rows` over rows; +inf where σ̂ = 0 (no density off the mean)."""
        return float(self.predictive_nll_rows(prediction, target).mean())

    def predictive_nll_rows(self, prediction, target: torch.Tensor) -> torch.Tensor:
        """Negative log predictive density per row (n,) in float64: −log N(y; ŷ, σ̂²) averaged over the outputs;
        +inf on a row where some σ̂ = 0."""
        var = prediction.std.to(torch.float64) ** 2
        res = target.to(torch.float64) - prediction.mean.to(torch.float64)
        terms = 0.5 * torch.log(2 * math.pi * var.clamp_min(torch.finfo(torch.float64).tiny)) + 0.5 * res**2 / var
        terms = torch.where(var > 0, terms, torch.full_like(terms, math.inf))
        return terms.reshape(terms.shape[0], -1).mean(dim=1)

    # -------------------------------------------------------- what the regressor asks
    def noise_variance(self, output: torch.Tensor) -> torch.Tensor:
        """σ²(x) from the network's outputs, for a likelihood with ``noise_in_outputs``."""
        raise NotImplementedError(f"{type(self).__name__}'s outputs carry no noise variance; the noise is "
                                  "estimated from residuals.")

    def row_noise_variance(self, module, X: torch.Tensor) -> torch.Tensor | None:
        """σ²(x) per row and target, (n, k), in the network's units, for a likelihood with ``noise_per_row``
        (``module`` the fitted network); None for a constant noise (the caller's σ²)."""
        return None

    def curvature_row_weights(self, X: torch.Tensor, noise_var) -> torch.Tensor | None:
        """Per-row factors (n,) of the curvature's record weights, for a likelihood whose noise σ²(x) is not in
        the network's outputs but varies by row: G and β are built with the constant σ² ``noise_var`` (one per
        output, or pooled), so row n's precision 1/σ²(x_n) enters as the factor σ²/σ²(x_n). None (the default):
        every row's precision is 1/σ², no factor."""
        return None

    def check_output(self, output: torch.Tensor, where: str = "the network") -> None:
        """Raise a ValueError naming the problem when the network's outputs (n, m) are not valid for this likelihood
        (any finite-or-not output is accepted by default; the estimators check shapes)."""
        return None

    def wrap_module(self, module: nn.Module) -> nn.Module:
        """The network the estimators build for this likelihood from their own MLP (the MLP itself by default)."""
        return module

    def check_module_output(self, output: torch.Tensor, n_outputs: int) -> None:
        """Raise a ValueError naming the problem when a user's module's outputs (n, m) cannot serve this
        likelihood (nothing beyond the estimators' shape check by default)."""
        return None

    def draw_y(self, samples: torch.Tensor, noise_var, generator: torch.Generator) -> torch.Tensor:
        """Draws of y from output samples ``(S, n, M)``: f plus N(0, ``noise_var``) noise (per output, or per row
        and output for an (n, M) tensor), or f itself for ``noise_var`` None."""
        if noise_var is None:
            return samples
        sd = torch.as_tensor(noise_var, dtype=samples.dtype, device=samples.device).sqrt()
        return samples + sd * torch.randn(samples.shape, generator=generator, dtype=samples.dtype,
                                          device=samples.device)

    # ------------------------------------------------------------ parameters
    @classmethod
    def _param_names(cls) -> list[str]:
        init = cls.__init__
        if init is object.__init__:
            return []
        params = inspect.signature(init).parameters.values()
        return sorted(p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))

    def get_params(self, deep: bool = True) -> dict:
        """The constructor arguments, as scikit-learn's ``get_params`` (``deep`` is accepted and ignored)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params) -> Likelihood:
        """Set constructor arguments by name (as scikit-learn's ``set_params``); returns self."""
        valid = self._param_names()
        for key, value in params.items():
            if key not in valid:
                raise ValueError(f"Invalid parameter {key!r} for {type(self).__name__}; valid ones: {valid}.")
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.get_params() == other.get_params()

    def __hash__(self) -> int:
        return hash((type(self), tuple(self.get_params().items())))


def match_regression(y: torch.Tensor, out_shape: tuple) -> torch.Tensor:
    """Targets reshaped to the model's output shape ``(n, *out)``: (n,) is accepted for a single output."""
    if tuple(y.shape) == out_shape:
        return y
    if y.numel() == int(np.prod(out_shape)) and out_shape[-1:] == (1,) and tuple(y.shape) == out_shape[:-1]:
        return y.unsqueeze(-1)
    raise ValueError(f"y_cal has shape {tuple(y.shape)}, but the model's outputs on X_cal have shape {out_shape}; "
                     "they must match (a 1-D y_cal is accepted for a single output).")
