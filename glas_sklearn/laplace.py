"""One call from a trained model and its data to the GLAS posterior: GGN → eigenpairs → β → posterior.

This is the lower-level API for models that are not tabular estimators (sequence models, custom
training loops), and the path the estimators take themselves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ._checks import check_positive_int, check_sample_weight
from ._functional import model_outputs
from .eigen import EigenResult, top_eigenpairs
from .ggn import GGNOperator
from .likelihoods import Likelihood, resolve_likelihood
from .posterior import ActiveSubspacePosterior, estimate_noise_variance, resolve_posterior

__all__ = ["LaplaceSubspace", "fit_laplace_subspace", "residual_noise_variance"]

logger = logging.getLogger(__name__)


@dataclass
class LaplaceSubspace:
    """What :func:`fit_laplace_subspace` built.

    Attributes
    ----------
    posterior : ActiveSubspacePosterior
        The posterior in the span of the top K eigenvectors (any d ≤ K can be used).
    eigen : EigenResult
        Eigenvalues, eigenvectors, residuals, number of products, convergence flag.
    beta : float
        The posterior scaling used.
    n_records : int
        N, the number of records G averages over (tokens for masked sequence data; with ``sample_weight``
        those of positive weight).
    noise_var : float or None
        σ² used for β (regression), given or estimated from the residuals.
    timings : dict
        Wall seconds of each stage ("ggn_setup", "eigen").
    total_weight : float or None
        Σ w, the total record weight that G is normalised by and that N is in β for ``scaling="standard"``
        (``n_records`` without ``sample_weight``).
    """

    posterior: ActiveSubspacePosterior
    eigen: EigenResult
    beta: float
    n_records: int
    noise_var: float | None
    timings: dict = field(default_factory=dict)
    total_weight: float | None = None


def residual_noise_variance(model: nn.Module, X: torch.Tensor, y: torch.Tensor,
                            batch_size: int | None = None, per_output: bool = False,
                            sample_weight: torch.Tensor | np.ndarray | None = None) -> float | np.ndarray:
    """σ² = mean squared residual of the model (in eval mode, at its own weights) on ``(X, y)``.

    Over all N·M entries (a float), or with ``per_output=True`` one mean per output column of an (N, M)
    prediction (a float64 array of shape (M,); its mean is the pooled value). With ``sample_weight`` (one
    non-negative weight per row) the means are weighted over the rows: Σ_i w_i r_im² / Σ_i w_i per output,
    so integer weights equal repeated rows.
    """
    weight = check_sample_weight(sample_weight, X.shape[0])
    preds = model_outputs(model, X, batch_size)
    residuals = y.reshape(preds.shape) - preds
    if weight is not None:
        squares = residuals.detach().to("cpu", torch.float64).reshape(residuals.shape[0], -1) ** 2
        if not bool(torch.isfinite(squares).all()):
            raise ValueError("residuals contains NaN or infinite values; clean the predictions or targets first.")
        per_column = (weight[:, None] * squares).sum(0) / weight.sum()
        return per_column.numpy() if per_output else float(per_column.mean())
    if not per_output:
        return estimate_noise_variance(residuals)
    res = residuals.reshape(residuals.shape[0], -1)
    return np.array([estimate_noise_variance(res[:, m]) for m in range(res.shape[1])])


def fit_laplace_subspace(model: nn.Module, X: torch.Tensor, y: torch.Tensor | None = None, *,
                         loss: str | Likelihood = "mse", mask: torch.Tensor | None = None, scaling="mean",
                         noise_var: float | None = None, n_components: int = 50, sigma0="auto",
                         batch_size: int | None = None, subsample: int | None = None,
                         eigen_method: str = "lanczos", tol: float = 1e-5, random_state=None,
                         reuse_linearization="auto", trim_padding: bool = False, max_matvecs: int | None = None,
                         ncv: int | None = None, distributed: bool = False, process_group=None,
                         verbose: int = 0, posterior: str | type = "subspace",
                         sample_weight: torch.Tensor | np.ndarray | None = None) -> LaplaceSubspace:
    """Build the generalized Laplace active-subspace posterior of a trained model.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network (θ0). Never modified.
    X : torch.Tensor
        Training inputs on the model's device (token ids for sequence models).
    y : torch.Tensor, optional
        Regression targets, needed when ``loss="mse"`` and ``noise_var`` is None (σ² from residuals).
    loss : {"mse", "cross_entropy"} or Likelihood, default="mse"
        The likelihood (:func:`~glas_sklearn.likelihoods.resolve_likelihood`): its output Hessian enters the GGN
        and it sets β for a named ``scaling``; a likelihood with ``needs_noise_variance`` (the Gaussian) takes σ².
    mask : torch.Tensor of bool, optional
        Padding mask (n, T) for sequence outputs; records are unmasked tokens.
    scaling : {"mean", "standard"} or float, default="mean"
        The posterior scaling β of the generalized posterior (paper eq. 1, §4.1.1): mean β = 1/σ² (regression)
        or 1 (classification); standard β = N/σ² or N; a float is used as β.
    noise_var : float, optional
        σ² for regression; estimated from the training residuals when None.
    n_components : int, default=50
        K, the number of eigenpairs computed (the largest d available afterwards); K < D, the number of
        weights (checked by :func:`~glas_sklearn.eigen.top_eigenpairs`).
    sigma0 : {"auto", "eb_subspace", "eb_full"} or float, default="auto"
        Prior standard deviation; "auto" = empirical Bayes at each d as the kind's ``default_sigma0`` says: in the
        subspace (the paper) for ``posterior="subspace"``, over all D weights for the two low-rank posteriors
        (:class:`~glas_sklearn.posterior.ActiveSubspacePosterior`).
    batch_size, subsample, random_state, reuse_linearization, trim_padding
        Passed to :class:`~glas_sklearn.ggn.GGNOperator` (``random_state`` also seeds Lanczos;
        ``trim_padding=True`` cuts length-sorted mini-batches after their last real token, for causal
        sequence models only).
    eigen_method : {"lanczos", "eigsh"}, default="lanczos"
    tol : float, default=1e-5
        Eigen-solver tolerance, relative to λ1.
    max_matvecs, ncv : int, optional
        Passed to :func:`~glas_sklearn.eigen.top_eigenpairs` (e.g. ``ncv=13, max_matvecs=13`` for the paper's
        13 Lanczos steps with d = 3).
    distributed : bool, default=False
        ``X`` (and ``y``, ``mask``) are this process's shard of data spread over a ``torch.distributed``
        group: G is :class:`~glas_sklearn.distributed.DistributedGGNOperator` (N counts all processes' records)
        and σ² pools all processes' residuals. Call it in every process with the same model and
        ``random_state``; all of them get the same posterior. ``subsample`` is not available then.
    process_group : ProcessGroup, optional
        The group for ``distributed=True`` (default: the world).
    verbose : int, default=0
        ≥ 1 shows a progress bar over the eigen-solver's products.
    posterior : {"subspace", "low_rank", "low_rank_diag"} or ActiveSubspacePosterior subclass, default="subspace"
        The posterior kind (:func:`~glas_sklearn.posterior.resolve_posterior`). "subspace": the paper's θ0 + P z.
        "low_rank": adds the prior's variance σ0² (I − P Pᵀ) off span(P). "low_rank_diag": the curvature is
        P Λ Pᵀ plus G's residual diagonal (computed exactly from per-record Jacobians of the same rows,
        :meth:`~glas_sklearn.ggn.GGNOperator.diagonal`, timed as "ggn_diagonal"), as for every kind with
        ``needs_ggn_diagonal``. A class is built as ``kind(model, eigenvalues, eigenvectors, beta=..., sigma0=...,
        ggn_diagonal=...)``.
    sample_weight : torch.Tensor or array-like of shape (n,), optional
        Non-negative frequency weights of the rows of ``X``: the GGN becomes Σ_n w_n J_nᵀ H_n J_n / Σ_n w_n, σ²
        the weighted mean squared residual, and N in β for ``scaling="standard"`` the total weight Σ w; so
        integer weights give the posterior of the repeated rows, and zero weights that of the rows dropped.
        Not available with ``distributed=True``.

    Returns
    -------
    LaplaceSubspace
    """
    likelihood = resolve_likelihood(loss, "loss")
    kind = resolve_posterior(posterior)
    n_components = check_positive_int("n_components", n_components)
    t0 = time.perf_counter()
    if distributed:
        if subsample is not None:
            raise ValueError("subsample is not available with distributed=True; subsample each shard yourself.")
        if sample_weight is not None:
            raise ValueError("sample_weight is not available with distributed=True; repeat or drop rows in the "
                             "shards instead, or fit without distributed.")
        from .distributed import DistributedGGNOperator, shared_seed

        random_state = shared_seed(random_state, process_group)  # the eigen-solvers must start alike

        op = DistributedGGNOperator(model, X, y, loss=likelihood, batch_size=batch_size, mask=mask,
                                    trim_padding=trim_padding, reuse_linearization=reuse_linearization,
                                    group=process_group)
    else:
        op = GGNOperator(model, X, y, loss=likelihood, batch_size=batch_size, mask=mask, subsample=subsample,
                         random_state=random_state, trim_padding=trim_padding,
                         reuse_linearization=reuse_linearization, sample_weight=sample_weight)
    if likelihood.needs_noise_variance and not isinstance(scaling, (int, float)):
        if noise_var is None:
            if y is None:
                raise ValueError("Regression needs y (or noise_var) to set the noise variance σ² in β.")
            if distributed:
                from .distributed import distributed_noise_variance

                noise_var = distributed_noise_variance(model, X, y, batch_size=batch_size, group=process_group)
            else:
                noise_var = residual_noise_variance(model, X, y, batch_size, sample_weight=sample_weight)
        if not noise_var > 0:
            raise ValueError(f"The noise variance must be positive, got {noise_var!r} (a perfect fit to the "
                             "training data leaves β undefined); pass noise_var explicitly.")
    beta = likelihood.beta(scaling, op.n_records, noise_var)
    if scaling == "standard" and op.total_weight != op.n_records:  # N/σ² with N = Σ w, the total record weight
        beta *= op.total_weight / op.n_records
    t1 = time.perf_counter()
    eig = top_eigenpairs(op, n_components, method=eigen_method, tol=tol, random_state=random_state,
                         max_matvecs=max_matvecs, ncv=ncv, verbose=verbose)
    t2 = time.perf_counter()
    op.release()
    timings = {"ggn_setup": t1 - t0, "eigen": t2 - t1}
    diagonal = None
    if kind.needs_ggn_diagonal:
        diagonal = op.diagonal()
        timings["ggn_diagonal"] = time.perf_counter() - t2
    post = kind(model, eig.eigenvalues, eig.eigenvectors, beta=beta, sigma0=sigma0, ggn_diagonal=diagonal)
    return LaplaceSubspace(posterior=post, eigen=eig, beta=beta, n_records=op.n_records,
                           noise_var=noise_var, timings=timings, total_weight=op.total_weight)
