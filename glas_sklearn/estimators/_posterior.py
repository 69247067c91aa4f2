"""The posterior component of the estimators: a posterior kind with its hyperparameters (:class:`LowRank`,
:class:`LowRankDiag`, :class:`Subspace`, or :class:`Posterior` around a kind of one's own), whose
:meth:`Posterior.fit` computes the curvature's top eigenpairs at θ0 and returns the fitted posterior on them
(:func:`~glas_sklearn.laplace.fit_laplace_subspace`)."""

from __future__ import annotations

import logging
import numbers
import time

from sklearn.base import BaseEstimator, clone
from torch import nn

from .._constraints import BOOLEAN, Interval, Options, Satisfies, check_settings
from ..laplace import LaplaceSubspace, fit_laplace_subspace
from ..posterior import (
    POSTERIOR_KINDS,
    ActiveSubspacePosterior,
    LowRankDiagPosterior,
    LowRankPosterior,
    SubspacePosterior,
    resolve_posterior,
)
from ..predictive import PredictiveMode, resolve_predictive

__all__ = ["AUTO_SUBSAMPLE_ROWS", "LowRank", "LowRankDiag", "Posterior", "Subspace", "auto_subsample",
           "posterior_attributes",
           "posterior_line", "resolve_posterior_settings"]

logger = logging.getLogger("glas_sklearn.estimators")

#: ``subsample="auto"``: the curvature is built on this many of the training rows when there are more.
AUTO_SUBSAMPLE_ROWS = 10_000


def auto_subsample(n: int) -> int | None:
    """The rows the curvature of ``subsample="auto"`` is built on, of n training rows: ``AUTO_SUBSAMPLE_ROWS``
    when there are more, else None (all of them)."""
    return AUTO_SUBSAMPLE_ROWS if n > AUTO_SUBSAMPLE_ROWS else None


def _is_kind(value) -> bool:
    return isinstance(value, str) and value in POSTERIOR_KINDS or (
        isinstance(value, type) and issubclass(value, ActiveSubspacePosterior))


class Posterior(BaseEstimator):
    """A posterior kind and its hyperparameters, for the estimators' ``posterior=``.

    ``LowRank()``, ``LowRankDiag()`` and ``Subspace()`` are the built-in kinds; ``Posterior(kind=MyKind)`` takes
    a subclass of :class:`~glas_sklearn.posterior.ActiveSubspacePosterior` of one's own. Its parameters are
    reached as ``posterior__max_components`` in ``set_params`` and ``GridSearchCV``.

    Parameters
    ----------
    kind : str or ActiveSubspacePosterior subclass
        The kind's name (a key of :data:`~glas_sklearn.posterior.POSTERIOR_KINDS`) or class.
    max_components : int, default=50
        K, the eigenpairs of the curvature computed (at most D − 1 for D trainable weights): the largest subspace
        dimension d available, and d itself under ``n_components="auto"`` with a conformal calibration.
    eigen_method : {"lanczos", "eigsh"}, default="lanczos"
        The eigen-solver: thick-restart Lanczos in torch, or scipy's ARPACK.
    subsample : "auto", int or None, default="auto"
        Build the curvature on a random subsample of that many training rows (paper §2.4); None: on all of them.
        "auto": 10,000 rows when there are more, else all.
    predictive : {"auto", "sampled", "linearized"}, default="auto"
        Push posterior samples through the network, or use the linearised network's Gaussian. "auto": the kind's
        own (linearised for the low-rank kinds, sampled for the subspace).
    n_samples : int, default=1000
        Posterior samples (at least 2) for the sampled predictive.
    include_noise : bool, default=False
        Regression with a constant noise: False (the paper) describes the network output f(x; θ) under the weight
        posterior; True describes y = f(x; θ) + ε, ε ~ N(0, σ²) (``noise_std_``), in the intervals,
        ``predict(return_std=True)`` and ``sample_y`` (with a conformal calibration it sets the scale the scores
        are normalised by, σ̂² = σ_f² or σ_f² + σ²).
    """

    _parameter_constraints: dict = {
        "kind": [Satisfies(_is_kind, f"one of {sorted(POSTERIOR_KINDS)} or a subclass of ActiveSubspacePosterior")],
        "max_components": [Interval(numbers.Integral, 1, None)],
        "eigen_method": [Options("lanczos", "eigsh")],
        "subsample": [None, Options("auto"), Interval(numbers.Integral, 1, None)],
        "predictive": [Options("auto", "sampled", "linearized")],
        "n_samples": [Interval(numbers.Integral, 2, None)],
        "include_noise": [BOOLEAN],
    }

    def __init__(self, kind="low_rank", max_components=50, eigen_method="lanczos", subsample="auto",
                 predictive="auto", n_samples=1000, include_noise=False):
        self.kind = kind
        self.max_components = max_components
        self.eigen_method = eigen_method
        self.subsample = subsample
        self.predictive = predictive
        self.n_samples = n_samples
        self.include_noise = include_noise

    @property
    def kind_class(self) -> type[ActiveSubspacePosterior]:
        """The posterior class this kind builds."""
        return resolve_posterior(self.kind)

    @property
    def name(self) -> str:
        """The kind's name ("low_rank", ..., or a user kind's class name)."""
        return self.kind_class.name

    def check(self, owner: str) -> Posterior:
        """The settings checked (a ValueError naming the parameter as ``posterior__name``); returns self."""
        check_settings(self, owner, prefix="posterior__")
        resolve_posterior(self.kind)  # an abstract kind is refused here, naming what it lacks
        return self

    def predictive_mode(self) -> PredictiveMode:
        """``predictive`` with "auto" resolved to the kind's ``default_predictive``."""
        return resolve_predictive(self.kind_class.default_predictive if self.predictive == "auto" else self.predictive)

    def n_eigenpairs(self, n_components, module: nn.Module) -> int:
        """K: a given n_components, or for "auto" max_components capped at D − 1 (fit_laplace_subspace refuses
        K ≥ D, naming D)."""
        if n_components != "auto":
            return n_components
        D = sum(p.numel() for p in module.parameters() if p.requires_grad)
        K = max(1, min(self.max_components, D - 1))
        if K < self.max_components:
            logger.info("max_components=%d capped at D - 1 = %d (the network has D=%d weights)",
                        self.max_components, K, D)
        return K

    def fit(self, module: nn.Module, Xt, yt, likelihood, *, scaling, noise_var, n_components, sigma0, seed: int,
            verbose: int = 0, sample_weight=None) -> LaplaceSubspace:
        """The curvature's top eigenpairs at θ0 (``module``) on the training rows and the posterior of this kind
        on them (β from σ² ``noise_var`` for regression), with the rows' weights in G and β; ``timings["total"]``
        holds its wall time."""
        t0 = time.perf_counter()
        subsample = auto_subsample(Xt.shape[0]) if self.subsample == "auto" else self.subsample
        fitted = fit_laplace_subspace(
            module, Xt, yt, loss=likelihood, scaling=scaling, noise_var=noise_var,
            n_components=self.n_eigenpairs(n_components, module), sigma0=sigma0, subsample=subsample,
            eigen_method=self.eigen_method, random_state=seed, verbose=verbose, posterior=self.kind_class,
            sample_weight=sample_weight)
        fitted.timings["total"] = time.perf_counter() - t0
        return fitted


class _BuiltinKind(Posterior):
    """A built-in kind's settings: the class names its kind (``_kind``, a posterior class); the parameters are
    :class:`Posterior`'s but ``kind``."""

    _kind: type[ActiveSubspacePosterior]

    def __init__(self, max_components=50, eigen_method="lanczos", subsample="auto", predictive="auto",
                 n_samples=1000, include_noise=False):
        super().__init__(self._kind.name, max_components, eigen_method, subsample, predictive, n_samples,
                         include_noise)


class LowRank(_BuiltinKind):
    """The low-rank Laplace posterior (:class:`~glas_sklearn.posterior.LowRankPosterior`):
    Σ = P diag(σ_j²) Pᵀ + σ0² (I − P Pᵀ), the directions the data do not constrain keeping the prior's variance,
    so intervals widen where the network extrapolates. Parameters: those of :class:`Posterior` but ``kind``.

    Examples
    --------
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank
    >>> reg = LaplaceActiveSubspaceRegressor(posterior=LowRank(max_components=20))
    >>> reg.get_params()["posterior__max_components"]
    20
    """

    _kind = LowRankPosterior


class LowRankDiag(_BuiltinKind):
    """The low-rank plus diagonal posterior (:class:`~glas_sklearn.posterior.LowRankDiagPosterior`): the
    curvature P Λ Pᵀ plus the GGN's residual diagonal max(diag(G) − Σ_j λ_j p_j², 0), Σ by Woodbury.
    Parameters: those of :class:`Posterior` but ``kind``."""

    _kind = LowRankDiagPosterior


class Subspace(_BuiltinKind):
    """The paper's subspace posterior (:class:`~glas_sklearn.posterior.SubspacePosterior`): θ = θ0 + P z, no
    variance off the top-d eigenvectors. Parameters: those of :class:`Posterior` but ``kind``."""

    _kind = SubspacePosterior


#: The settings class of each built-in kind's name (the names are the posterior kinds' own).
_SETTINGS = {cls._kind.name: cls for cls in (LowRank, LowRankDiag, Subspace)}
assert set(_SETTINGS) == set(POSTERIOR_KINDS), "every built-in kind has its settings class"


def resolve_posterior_settings(posterior) -> Posterior:
    """The estimator's ``posterior`` as a settings object: a name (its kind with default hyperparameters), a
    :class:`Posterior` (cloned: the user's object is never changed) or a kind's class (``Posterior(kind=cls)``)."""
    if isinstance(posterior, Posterior):
        return clone(posterior)
    if isinstance(posterior, str) and posterior in _SETTINGS:
        return _SETTINGS[posterior]()
    if isinstance(posterior, type) and issubclass(posterior, ActiveSubspacePosterior):
        return Posterior(kind=posterior)
    raise ValueError(f"posterior must be one of {sorted(_SETTINGS)}, a Posterior settings object (e.g. "
                     f"LowRank(max_components=20)) or a subclass of ActiveSubspacePosterior, got {posterior!r}.")


def posterior_line(name: str, fitted: LaplaceSubspace, sigma0_setting) -> str:
    """E.g. "posterior: low_rank on the top 50 eigendirections of 2,951 weights, sigma0 = 0.412 at d = 50
    (eb_subspace), beta = 12.3, 1.6 s (curvature and eigenpairs)"."""
    post, K = fitted.posterior, len(fitted.eigen.eigenvalues)
    how = "given" if isinstance(sigma0_setting, numbers.Real) else sigma0_setting
    return (f"posterior: {name} on the top {K} eigendirections of {post.n_weights:,} weights, sigma0 = "
            f"{float(post.fit_sigma0(K)):.4g} at d = {K} ({how}), beta = {fitted.beta:.4g}, "
            f"{fitted.timings['total']:.1f} s (curvature and eigenpairs)")


def posterior_attributes(fitted: LaplaceSubspace) -> dict:
    """The estimators' fitted attributes of the posterior step: the posterior and its weights, β, N, the
    eigenvalues and the eigensolver's record."""
    post, eigen = fitted.posterior, fitted.eigen
    return {
        "posterior_": post, "n_weights_": int(post.n_weights), "beta_": float(fitted.beta),
        "n_records_": int(fitted.n_records),
        "trainable_parameters_": {name: tuple(shape)
                                  for name, shape in zip(post.layout.names, post.layout.shapes, strict=True)},
        "eigenvalues_": eigen.eigenvalues.detach().cpu().numpy(),
        "eigen_info_": {"method": eigen.method, "n_matvecs": eigen.n_matvecs, "converged": eigen.converged,
                        "residual_norms": eigen.residual_norms.detach().cpu().numpy(),
                        "relative_residuals": eigen.relative_residuals.detach().cpu().numpy()},
    }
