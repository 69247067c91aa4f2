"""Choosing the active-subspace dimension d by coverage on held-out data (paper eq. 42, §4.1.7).

For d = 1, 2, …: refit σ0 by empirical Bayes, build (1 − γ) intervals (regression) or prediction sets
(classification) on the calibration inputs, and keep the smallest d whose empirical coverage reaches 1 − γ.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ._checks import (
    check_choice,
    check_confidence_levels,
    check_positive_int,
    numpy_rng,
)
from ._progress import progress
from .posterior import ActiveSubspacePosterior
from .predictive import (
    interval_coverage,
    linearized_interval,
    linearized_probabilities,
    mean_interval_width,
    mean_set_size,
    prediction_sets,
    sampled_interval,
    sampled_probabilities,
    set_coverage,
)

__all__ = ["CalibrationResult", "CalibrationWarning", "choose_dimension"]

logger = logging.getLogger(__name__)

# Coverage is a ratio of counts; this absorbs the round-off of e.g. 9/10 against a level of 0.9.
_COVERAGE_TOL = 1e-12


class CalibrationWarning(UserWarning):
    """No subspace dimension up to d_max reached the requested coverage."""


@dataclass(frozen=True)
class CalibrationResult:
    """Outcome of :func:`choose_dimension`.

    Attributes
    ----------
    n_components : int
        The chosen d: the smallest d whose coverage reached the level, else the largest d tried.
    sigma0 : float
        The prior standard deviation at that d.
    reached : bool
        Whether the coverage reached the level at ``n_components``.
    table : pandas.DataFrame
        One row per d tried, columns ``d``, ``coverage``, ``mean_width`` (regression) or
        ``mean_set_size`` (classification), ``sigma0``.
    coverage : float
        Coverage at ``n_components``.
    confidence_level : float
        The target level 1 − γ.
    sample_seed : int or None
        The seed of the posterior samples (``predict_samples(..., random_state=sample_seed)``), the same for
        every d: drawing with it reproduces the samples behind ``table``.
    """

    n_components: int
    sigma0: float
    reached: bool
    table: pd.DataFrame
    coverage: float = float("nan")
    confidence_level: float = float("nan")
    sample_seed: int | None = None


def _check_targets(y, task: str, n: int, device: torch.device) -> torch.Tensor:
    if isinstance(y, torch.Tensor):
        t = y.detach().to(device)
    else:
        try:
            t = torch.as_tensor(np.asarray(y), device=device)
        except (TypeError, ValueError) as err:
            raise TypeError(f"y_cal must be a torch.Tensor or numeric array, got {type(y).__name__}.") from err
    if t.ndim < 1 or t.shape[0] != n:
        raise ValueError(f"X_cal has {n} rows but y_cal has shape {tuple(t.shape)}; they must match.")
    if task == "regression":
        if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"y_cal must be numeric for regression, got dtype {t.dtype}.")
        if not bool(torch.isfinite(t.to(torch.float64)).all()):
            raise ValueError("y_cal contains NaN or infinite values.")
    return t


def choose_dimension(posterior: ActiveSubspacePosterior, X_cal: torch.Tensor, y_cal, *,
                     task: str = "regression", confidence_level: float = 0.9, d_max: int = 50,
                     predictive: str = "sampled", n_samples: int = 1000, noise_var=0.0,
                     random_state=None, full_curve: bool = False, linearized_method: str = "probit",
                     batch_size: int | None = None, verbose: int = 0, d_min: int = 1) -> CalibrationResult:
    """Smallest subspace dimension d whose (1 − γ) intervals or sets cover the calibration data (eq. 42).

    Parameters
    ----------
    posterior : ActiveSubspacePosterior
        Its σ0 is refitted by empirical Bayes at every d (unless it was fixed).
    X_cal : torch.Tensor of shape (n, ...)
        Calibration inputs on the model's device.
    y_cal : tensor or array
        Regression: targets of shape (n,) or (n, M) (matching the model's output). Classification:
        integer labels 0 … C−1 of shape (n,) (or the leading shape of the logits).
    task : {"regression", "classification"}, default="regression"
    confidence_level : float, default=0.9
        The target 1 − γ.
    d_max : int, default=50
        Largest d tried; capped at the number K of eigenpairs of the posterior.
    predictive : {"sampled", "linearized"}, default="sampled"
        Sampled: S posterior samples through the network, with the same standard normals for every d
        (common random numbers). Linearised: Gaussian intervals from J Σ Jᵀ, with J P computed once (K JVPs).
    n_samples : int, default=1000
        S for the sampled predictive (and for ``linearized_method="mc"``).
    noise_var : float or array of shape (M,), default=0.0
        Regression only: σ² of the observation noise added to the intervals (intervals for y rather than
        for f; exact Gaussian-mixture quantiles for the sampled predictive). One value per output allowed.
    random_state : int, numpy Generator or None
        Seeds the samples; one seed is drawn from it and used for every d.
    full_curve : bool, default=False
        Try every d up to d_max instead of stopping at the first that reaches the level.
    linearized_method : {"probit", "mc"}, default="probit"
        Classification with ``predictive="linearized"``: how the logit Gaussian is pushed through the softmax.
    batch_size : int, optional
        Input rows per forward pass / JVP.
    verbose : int, default=0
        0 is silent; ≥ 1 shows a progress bar over d.
    d_min : int, default=1
        Smallest d tried (``d_min = d_max`` evaluates a single, given d).

    Returns
    -------
    CalibrationResult

    Warns
    -----
    CalibrationWarning
        When no d up to d_max reaches the level; d_max is used and the best coverage is named.
    """
    if not isinstance(posterior, ActiveSubspacePosterior):
        raise TypeError(f"posterior must be an ActiveSubspacePosterior, got {type(posterior).__name__}.")
    task = check_choice("task", task, ("regression", "classification"))
    predictive = check_choice("predictive", predictive, ("sampled", "linearized"))
    linearized_method = check_choice("linearized_method", linearized_method, ("probit", "mc"))
    if np.ndim(confidence_level) != 0:
        raise ValueError(f"confidence_level must be a single number in (0, 1), got {confidence_level!r}.")
    level = float(check_confidence_levels(confidence_level)[0])
    d_max = check_positive_int("d_max", d_max)
    d_min = check_positive_int("d_min", d_min)
    if d_min > min(d_max, posterior.max_components):
        raise ValueError(f"d_min={d_min} is larger than d_max={d_max} (or the {posterior.max_components} "
                         "eigenpairs available).")
    n_samples = check_positive_int("n_samples", n_samples)
    if task == "classification" and np.any(np.asarray(noise_var) != 0):
        raise ValueError("noise_var applies to regression intervals only; leave it at 0 for classification.")
    verbose = check_positive_int("verbose", int(verbose) if isinstance(verbose, bool) else verbose, minimum=0)

    X_cal = posterior._check_X(X_cal)
    n = X_cal.shape[0]
    y = _check_targets(y_cal, task, n, posterior.device)
    seed = int(numpy_rng(random_state).integers(0, 2**62))
    d_top = min(d_max, posterior.max_components)
    if d_top < d_max:
        logger.info("d_max=%d capped at the %d eigenpairs available", d_max, d_top)

    mean = posterior.predict_mean(X_cal, batch_size=batch_size) if predictive == "linearized" else None
    out_shape = tuple(mean.shape) if mean is not None else None
    size_col = "mean_width" if task == "regression" else "mean_set_size"
    rows = []
    chosen = None
    for d in progress(range(d_min, d_top + 1), desc="calibrating d", verbose=verbose):
        sigma0 = posterior.fit_sigma0(d)
        if predictive == "sampled":
            samples = posterior.predict_samples(X_cal, d, n_samples=n_samples, random_state=seed, batch_size=batch_size)
            out_shape = tuple(samples.shape[1:])
        if task == "regression":
            target = _match_regression(y, out_shape)
            if predictive == "sampled":
                _, bounds = sampled_interval(samples, level, noise_var=noise_var)
            else:
                var = posterior.linearized_variance(X_cal, d, batch_size=batch_size)
                bounds = linearized_interval(mean, var, level, noise_var=noise_var)
            cov = float(interval_coverage(target, bounds)[0])
            size = float(mean_interval_width(bounds)[0])
        else:
            if predictive == "sampled":
                probs = sampled_probabilities(samples)
            else:
                logit_cov = posterior.linearized_variance(X_cal, d, full_cov=linearized_method == "mc",
                                                          batch_size=batch_size)
                probs = linearized_probabilities(mean, logit_cov, method=linearized_method,
                                                 n_samples=n_samples, generator=seed + 1)
            sets = prediction_sets(probs, level)
            cov = float(set_coverage(y, sets)[0])
            size = float(mean_set_size(sets)[0])
        rows.append({"d": d, "coverage": cov, size_col: size, "sigma0": sigma0})
        logger.debug("d=%d: coverage=%.4f, %s=%.4g, sigma0=%.4g", d, cov, size_col, size, sigma0)
        if chosen is None and cov >= level - _COVERAGE_TOL:
            chosen = d
            if not full_curve:
                break

    table = pd.DataFrame(rows, columns=["d", "coverage", size_col, "sigma0"])
    reached = chosen is not None
    if not reached:
        best = int(table["coverage"].idxmax())
        warnings.warn(
            f"No subspace dimension up to d_max={d_top} reached {level:.1%} coverage on the calibration data; "
            f"the best was {table['coverage'].iloc[best]:.1%} at d={int(table['d'].iloc[best])}. Using d={d_top}. "
            "Consider a larger d_max (more eigenpairs), the 'mean' posterior scaling, or intervals for y "
            "(noise_var here; include_noise=True on LaplaceActiveSubspaceRegressor).",
            CalibrationWarning, stacklevel=2,
        )
        chosen = d_top
    row = table.loc[table["d"] == chosen].iloc[0]
    return CalibrationResult(n_components=int(chosen), sigma0=float(row["sigma0"]), reached=reached, table=table,
                             coverage=float(row["coverage"]), confidence_level=level, sample_seed=seed)


def _match_regression(y: torch.Tensor, out_shape: tuple) -> torch.Tensor:
    """Targets reshaped to the model's output shape (n, *out): (n,) is accepted for a single output."""
    if tuple(y.shape) == out_shape:
        return y
    if y.numel() == int(np.prod(out_shape)) and out_shape[-1:] == (1,) and tuple(y.shape) == out_shape[:-1]:
        return y.unsqueeze(-1)
    raise ValueError(f"y_cal has shape {tuple(y.shape)}, but the model's outputs on X_cal have shape {out_shape}; "
                     "they must match (a 1-D y_cal is accepted for a single output).")
