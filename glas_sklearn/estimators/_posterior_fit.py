"""The posterior in fit: the curvature's top eigenpairs at θ0 and the posterior on them
(:func:`~glas_sklearn.laplace.fit_laplace_subspace`), with the number of eigenpairs, the scaling and the curvature's
subsample resolved, and the fitted attributes it leaves (``posterior_``, ``eigenvalues_``, ``beta_``...)."""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from ..laplace import fit_laplace_subspace
from ._report import posterior_line
from ._training import auto_subsample

__all__ = ["PosteriorFitMixin"]

logger = logging.getLogger("glas_sklearn.estimators._base")


class PosteriorFitMixin:
    """The posterior built at θ0, for ``LaplaceActiveSubspaceBase`` (which provides the parameters, ``module_``,
    ``likelihood_``, ``timings_`` and the noise hooks ``_noise_var`` / ``_set_noise``)."""

    def _fit_posterior(self, Xt, yt, Xc, yc, seed: int, sample_weight: torch.Tensor | None = None) -> None:
        """The curvature's top eigenpairs at θ0 and the posterior on them (β from σ² for regression), with the
        training rows' weights in G, σ² and β."""
        t0 = time.perf_counter()
        fitted = fit_laplace_subspace(
            self.module_, Xt, yt, loss=self.likelihood_,
            scaling=self._resolved_scaling(), noise_var=self._noise_var(self.module_, Xt, yt, Xc, yc, sample_weight),
            n_components=self._n_eigenpairs(self.module_), sigma0=self._resolved_sigma0(),
            subsample=self._subsample(Xt.shape[0]),
            eigen_method=self.eigen_method, random_state=seed, verbose=self.verbose, posterior=self.posterior,
            sample_weight=sample_weight)
        self.timings_["curvature"] = time.perf_counter() - t0
        self.posterior_ = fitted.posterior
        self.trainable_parameters_ = {name: tuple(shape) for name, shape in
                                      zip(fitted.posterior.layout.names, fitted.posterior.layout.shapes, strict=True)}
        self.n_weights_ = int(fitted.posterior.n_weights)
        self.beta_ = float(fitted.beta)
        self.n_records_ = int(fitted.n_records)
        self.eigenvalues_ = fitted.eigen.eigenvalues.detach().cpu().numpy()
        self.eigen_info_ = {
            "method": fitted.eigen.method, "n_matvecs": fitted.eigen.n_matvecs, "converged": fitted.eigen.converged,
            "residual_norms": fitted.eigen.residual_norms.detach().cpu().numpy(),
            "relative_residuals": fitted.eigen.relative_residuals.detach().cpu().numpy(),
        }
        self._set_noise()
        self._report(posterior_line(self, self.timings_["curvature"]))

    def _subsample(self, n_rows: int) -> int | None:
        """The rows the curvature is built on, of ``n_rows`` training rows: ``subsample``, with "auto" resolved
        (None: all rows)."""
        return auto_subsample(n_rows) if self.subsample == "auto" else self.subsample

    def _resolved_scaling(self):
        """``scaling`` with "auto" resolved: "mean" (each estimator may override it per likelihood)."""
        return "mean" if self.scaling == "auto" else self.scaling

    def _n_eigenpairs(self, module: nn.Module) -> int:
        """K: the given n_components, or for "auto" max_components capped at D − 1 (fit_laplace_subspace
        refuses K ≥ D, naming D)."""
        if self.n_components != "auto":
            return self.n_components
        D = sum(p.numel() for p in module.parameters() if p.requires_grad)
        K = max(1, min(self.max_components, D - 1))
        if K < self.max_components:
            logger.info("max_components=%d capped at D - 1 = %d (the network has D=%d weights)",
                        self.max_components, K, D)
        return K
