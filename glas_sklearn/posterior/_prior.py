"""Empirical Bayes for the prior precision α = σ0⁻² (paper eq. 39–41; the full-space conditions go beyond the
paper, see the user guide).

Every condition is one equation excess(log α) = 0 whose left side falls strictly in log α: the paper's
condition in the subspace (the same for every posterior kind), and a full-space condition tr Σ(α) = ‖θ0‖² that
each kind supplies with its own Σ (:meth:`~glas_sklearn.posterior.ActiveSubspacePosterior._trace_condition`).
:func:`solve_log_alpha` solves any of them the same way: a decade bracket search where no bracket is known, then
Brent's method in log α.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import brentq

__all__ = ["LogAlphaCondition", "low_rank_condition", "solve_log_alpha", "subspace_condition", "trace_condition",
           "weight_norms"]

logger = logging.getLogger(__name__)

# One step of the bracket search, in log α.
_DECADE = math.log(10.0)


@dataclass(frozen=True)
class LogAlphaCondition:
    """An empirical Bayes condition excess(log α) = 0, strictly decreasing in log α.

    Attributes
    ----------
    excess : callable
        log α ↦ left side minus right side of the condition; ≤ 0 at ``hi``.
    hi : float
        A log α where ``excess`` is ≤ 0.
    lo : float or None
        A log α where ``excess`` is > 0; None: searched for by stepping down from ``hi`` in decades.
    what : str
        The condition's name, for the log line.
    no_root : Exception
        Raised when the search finds no positive ``excess`` (the condition has no solution).
    """

    excess: Callable[[float], float]
    hi: float
    lo: float | None
    what: str
    no_root: Exception


def weight_norms(theta0: torch.Tensor, P: torch.Tensor) -> tuple[np.ndarray, float, float]:
    """The norms of θ0 that the conditions use, in float64: the cumulative ‖P_dᵀ θ0‖² for d = 1 … K, its
    round-off floor (at or below it "‖w0‖ = 0"), and ‖θ0‖².

    w0 = Pᵀθ0 is formed column by column, to bound memory.
    """
    theta64 = theta0.to(torch.float64)
    w0 = np.array([float(P[:, j].to(torch.float64) @ theta64) for j in range(P.shape[1])])
    floor = (10 * math.sqrt(theta0.numel()) * np.finfo(np.float64).eps * float(theta64.norm())) ** 2
    return np.cumsum(w0**2), floor, float(theta64 @ theta64)


def solve_log_alpha(condition: LogAlphaCondition, d: int) -> float:
    """σ0 = α^-½ at the root of ``condition`` (for subspace dimension ``d``, named in the log line).

    Without ``condition.lo`` the bracket is found by stepping down from ``hi`` by decades (700 at most, then
    ``condition.no_root`` is raised) to the first log α where ``excess`` is positive; Brent's method then refines
    the root in that decade to a relative tolerance of 1e-12.
    """
    excess, lo, hi = condition.excess, condition.lo, condition.hi
    if lo is None:
        lo = hi
        for _ in range(700):
            lo -= _DECADE
            if excess(lo) > 0:
                break
        else:
            raise condition.no_root
        hi = lo + _DECADE
    log_alpha = brentq(excess, lo, hi, xtol=1e-12, rtol=1e-12, maxiter=500)
    sigma0 = float(math.exp(-0.5 * log_alpha))
    logger.debug("%s: d=%d, sigma0=%.6g", condition.what, d, sigma0)
    return sigma0


def subspace_condition(beta_lam: np.ndarray, w0_sq: float, w0_floor: float, d: int) -> LogAlphaCondition:
    """The paper's condition ‖w0‖² = Σ_{i≤d} (1/α − 1/(βλ_i + α)), w0 = P_dᵀ θ0 (eq. 39–41).

    The right side falls strictly from +∞ to 0, so the root is unique; each term is < 1/α, so it lies below
    α = n₊/‖w0‖² (n₊ the number of βλ_i > 0): the search starts a factor 2 above that, clear of round-off.

    Parameters
    ----------
    beta_lam : ndarray of shape (d,)
        βλ_i, float64.
    w0_sq : float
        ‖P_dᵀ θ0‖².
    w0_floor : float
        The round-off floor of ``w0_sq``: at or below it the trained weights have no component in the subspace.
    d : int
    """
    n_pos = int(np.count_nonzero(beta_lam > 0))
    if n_pos == 0:
        raise ValueError(
            f"All of the leading {d} eigenvalues are 0: the data inform no direction, so empirical Bayes "
            "has no solution; pass a fixed sigma0 or use more eigenpairs."
        )
    if not w0_sq > w0_floor:
        raise ValueError(
            f"The trained weights have no component in the leading {d} eigenvectors (‖Pᵀθ0‖² = 0), so "
            "empirical Bayes has no solution; pass a fixed sigma0."
        )

    def excess(log_alpha: float) -> float:  # Σ (1/α − 1/(βλ+α)) − ‖w0‖², written without cancellation
        alpha = math.exp(log_alpha)
        return float(np.sum(beta_lam / (alpha * (beta_lam + alpha)))) - w0_sq

    hi = math.log(2.0 * n_pos / w0_sq)
    while excess(hi) > 0:  # not expected; kept so a bracket is always found
        hi += _DECADE
    return LogAlphaCondition(excess, hi, None, "empirical Bayes",
                             RuntimeError(f"Could not bracket the empirical Bayes root for d={d}."))


def _check_theta_sq(theta_sq: float) -> None:
    if not theta_sq > 0:
        raise ValueError("The trained weights are all 0 (‖θ0‖ = 0), so the full-space empirical Bayes "
                         "condition has no solution; pass a fixed sigma0.")


def low_rank_condition(beta_lam: np.ndarray, n_weights: int, theta_sq: float, d: int) -> LogAlphaCondition:
    """Full-space condition Σ_{j≤d} 1/(βλ_j + α) + (D − d)/α = ‖θ0‖² (tr Σ of the low-rank posterior).

    The left side falls strictly from +∞ to 0 and lies between (D − d)/α and D/α, so for d < D the root is
    bracketed by (D − d)/‖θ0‖² ≤ α ≤ D/‖θ0‖² (taken a factor 2 wider); for d = D the bracket is searched for.

    Parameters
    ----------
    beta_lam : ndarray of shape (d,)
        βλ_j, float64.
    n_weights : int
        D.
    theta_sq : float
        ‖θ0‖².
    d : int
    """
    _check_theta_sq(theta_sq)
    D, t = n_weights, theta_sq

    def excess(log_alpha: float) -> float:  # tr Σ(α) − ‖θ0‖², strictly decreasing in α
        alpha = math.exp(log_alpha)
        return float(np.sum(1.0 / (beta_lam + alpha))) + (D - d) / alpha - t

    hi = math.log(2.0 * D / t)  # excess ≤ D/α − t = −t/2 there
    # with a complement, excess ≥ (D − d)/α − t = t at lo; without one, Σ 1/(βλ_j + α) = ‖θ0‖² needs
    # Σ 1/(βλ_j) > ‖θ0‖², and the bracket is searched for
    lo = math.log(0.5 * (D - d) / t) if D > d else None
    return LogAlphaCondition(excess, hi, lo, "full-space empirical Bayes", ValueError(
        f"d = D = {D}: Σ 1/(βλ_j + α) stays below ‖θ0‖² for every α, so the full-space empirical Bayes "
        "condition has no solution; pass a fixed sigma0."))


def trace_condition(trace: Callable[[float], float], n_weights: int, theta_sq: float, d: int,
                    what: str = "full-space empirical Bayes") -> LogAlphaCondition:
    """Full-space condition tr Σ(α) = ‖θ0‖² for any posterior whose precision is at least α I.

    Then tr Σ(α) ≤ D/α, so the root lies below α = D/‖θ0‖²; it is bracketed by stepping down in decades from
    2D/‖θ0‖².

    Parameters
    ----------
    trace : callable
        α ↦ tr Σ(α), strictly decreasing.
    n_weights : int
        D.
    theta_sq : float
        ‖θ0‖².
    d : int
    what : str
        The condition's name, for the log line.
    """
    _check_theta_sq(theta_sq)

    def excess(log_alpha: float) -> float:
        return trace(math.exp(log_alpha)) - theta_sq

    hi = math.log(2.0 * n_weights / theta_sq)  # tr Σ ≤ D/α: excess ≤ −‖θ0‖²/2 there
    return LogAlphaCondition(excess, hi, None, what, ValueError(
        f"tr Σ(α) stays below ‖θ0‖² for every α at d = {d} (the curvature is positive in every direction), so "
        "the full-space empirical Bayes condition has no solution; pass a fixed sigma0."))
