"""Weighing the regression predictive's parts for the conformal scores: σ̂² = σ_ale² + σ² + λ min(σ_epi², m)
+ max(λ, 1) (σ_epi² − m)₊, with the epistemic weight λ fitted per output by the Gaussian likelihood of the
calibration residuals (:class:`~glas_sklearn.calibration.ConformalCalibrator` says why)."""

from __future__ import annotations

import numpy as np
import torch

from ..predictive import RegressionMoments
from ..predictive.modes import add_noise_variance

__all__ = ["EPISTEMIC_WEIGHTS", "epistemic_cap", "fit_epistemic_weight", "weighted_moments"]

#: The epistemic weights λ searched by :func:`fit_epistemic_weight`: 0 and 161 values log-spaced over [1e-4, 1e4].
EPISTEMIC_WEIGHTS = np.r_[0.0, np.exp(np.linspace(np.log(1e-4), np.log(1e4), 161))]


def fit_epistemic_weight(residuals, noise_var, epistemic_var, cap=None) -> np.ndarray:
    """The weight λ ≥ 0 of the epistemic variance, per output, that makes N(0, c (σ_n² + λ σ_epi²)) fit residuals best.

    The Gaussian negative log-likelihood of the residuals r_i under variances c v_i(λ), v_i = σ_n,i² + λ σ_epi,i²
    (with a cap m: v_i = σ_n,i² + λ min(σ_epi,i², m) + max(λ, 1) (σ_epi,i² − m)₊, the form :func:`weighted_moments`
    applies it in), minimised over the scale c in closed form (ĉ = mean r²/v) is, up to constants,
    ½ mean log v_i(λ) + ½ log mean(r_i²/v_i(λ)); λ is its minimiser over :data:`EPISTEMIC_WEIGHTS`. The overall
    scale c is left to the conformal quantile: only λ, the shape of σ̂(x), is chosen here. λ = 1 (the predictive as
    it is) is kept unless another weight fits strictly better; it is kept when one part is zero on every row (no
    weight between parts to choose).

    Parameters
    ----------
    residuals : array-like of shape (n,) or (n, M)
        y − ŷ on the calibration rows.
    noise_var, epistemic_var : array-like, same shape
        σ_n² (the aleatoric variance, plus any added noise variance) and σ_epi² per row and output.
    cap : array-like of shape (M,), optional
        The cap m per output (:func:`epistemic_cap`); None: no cap.

    Returns
    -------
    ndarray of shape (M,)

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> epi = rng.uniform(0.5, 2.0, 4000)
    >>> r = np.sqrt(1.0 + 0.1 * epi) * rng.standard_normal(4000)
    >>> float(fit_epistemic_weight(r, np.ones(4000), epi)[0]) < 0.5  # the epistemic part was over-stated
    True
    """
    r, vn, ve = (np.asarray(a, dtype=np.float64) for a in (residuals, noise_var, epistemic_var))
    r, vn, ve = (a.reshape(a.shape[0], -1) for a in (r, vn, ve))
    m = np.full(r.shape[1], np.inf) if cap is None else np.broadcast_to(np.asarray(cap, np.float64), r.shape[1:])
    out = np.ones(r.shape[1])
    for j in range(r.shape[1]):
        if not bool(np.any(vn[:, j] > 0)):  # one part only: no weight between parts to choose (with a cap, λ
            continue  # would still bend σ̂ at m; the predictive is kept as it is)
        below, excess = np.minimum(ve[:, j], m[j]), np.maximum(ve[:, j] - m[j], 0.0)
        best = _profile_nll(r[:, j], vn[:, j] + ve[:, j])
        for lam in EPISTEMIC_WEIGHTS:
            v = vn[:, j] + lam * below + max(lam, 1.0) * excess
            if not bool(np.all(v > 0)):
                continue
            nll = _profile_nll(r[:, j], v)
            if nll < best - 1e-9 * abs(best) - 1e-12:
                best, out[j] = nll, float(lam)
    return out


def epistemic_cap(epistemic_var) -> np.ndarray:
    """The cap m of the epistemic variance per output: the median σ_epi² of the calibration rows, (n,) or (n, M).

    Up to m the epistemic variance counts with the fitted weight λ, beyond it its excess counts at least in full
    (:func:`weighted_moments`): a row whose σ_epi² is above that of the typical calibration row keeps its widening.
    The median rather than the largest: under extrapolation the largest calibration σ_epi² is often an outlier, and
    below it λ ≪ 1 shrinks σ̂ on the new rows (concrete, top third of feature 2: interval score 66.6 against 44.0
    at λ = 1; 46.1 with the median; ``docs/benchmarks/studies.md#regional-calibration``).
    """
    ve = np.asarray(epistemic_var, dtype=np.float64)
    ve = ve.reshape(ve.shape[0], -1)
    return np.median(ve, axis=0) if ve.shape[0] else np.zeros(ve.shape[1])


def _profile_nll(r: np.ndarray, v: np.ndarray) -> float:
    if not bool(np.all(v > 0)):
        return np.inf
    return float(0.5 * np.mean(np.log(v)) + 0.5 * np.log(max(float(np.mean(r**2 / v)), 1e-300)))


def weighted_moments(parts, noise_var, weight, cap=None) -> RegressionMoments:
    """ŷ and σ̂ from the likelihood's parts (mean, aleatoric and epistemic variance, (n, M) each), the added noise
    variance σ² (a number or one per output), the weights λ (M,) and the caps m (M,) of the epistemic variance:

    σ̂² = σ_ale² + σ² + λ min(σ_epi², m) + max(λ, 1) (σ_epi² − m)₊.

    Up to the cap (the median σ_epi² of the calibration rows, :func:`epistemic_cap`) the epistemic variance counts
    with the weight λ chosen on those rows (in this same form, :func:`fit_epistemic_weight`); beyond it, above the
    typical calibration row, its excess counts at least in full, so that the intervals keep widening off the data.
    λ = 1 (or no cap) is σ_ale² + σ² + λ σ_epi²."""
    mean, ale, epi = parts
    like = dict(dtype=epi.dtype, device=epi.device)
    lam = torch.as_tensor(np.asarray(weight, dtype=np.float64), **like)
    var = add_noise_variance(ale, noise_var)
    if cap is None:
        var = var + lam * epi
    else:
        m = torch.as_tensor(np.asarray(cap, dtype=np.float64), **like)
        var = var + lam * torch.minimum(epi, m) + torch.clamp_min(lam, 1.0) * (epi - m).clamp_min(0)
    return RegressionMoments(mean, var.clamp_min(0).sqrt())


def _check_epistemic_weight(weight) -> None:
    if isinstance(weight, str):
        if weight != "fit":
            raise ValueError(f"epistemic_weight must be 'fit' or a number >= 0, got {weight!r}.")
        return
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)) \
            or not np.isfinite(weight) or weight < 0:
        raise ValueError(f"epistemic_weight must be 'fit' or a finite number >= 0 (1: the predictive as it is), "
                         f"got {weight!r}.")
