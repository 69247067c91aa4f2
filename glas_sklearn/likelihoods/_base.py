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
import numbers

import torch

from .._checks import check_positive_float, check_positive_int
from ..conformity_scores import ConformityScore
from ..predictive import RegressionMoments, predictive_interval, regression_moments

__all__ = ["SCALINGS", "Likelihood"]

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

    def predictive_moments(self, posterior, X: torch.Tensor, d: int, *, predictive: str = "linearized",
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
                            predictive: str = "linearized", n_samples: int = 1000, noise_var=0.0, random_state=None,
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
