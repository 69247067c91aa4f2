"""The prior scale σ0 by held-out likelihood.

:func:`tune_sigma0`: σ0 between 0 (the trained network's own predictive) and the posterior's empirical Bayes
value, by the mean predictive NLL (:func:`predictive_nll`) of held-out rows: the lowest, or the smallest σ0
within one standard error of it; under conformal calibration those rows must be others than the conformal ones.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import pandas as pd
import torch
from scipy.optimize import minimize_scalar

from .._checks import numpy_rng
from ..posterior import ActiveSubspacePosterior
from ._base import check_targets, resolve_calibration_likelihood

__all__ = ["Sigma0Result", "predictive_nll", "tune_sigma0"]

logger = logging.getLogger(__name__)

# tune_sigma0: bounded Brent in log σ0 over [σ0_EB · _SIGMA0_LOWEST, σ0_EB], to _SIGMA0_XTOL in log σ0 (0.1 %).
_SIGMA0_LOWEST = 1e-4
_SIGMA0_XTOL = 1e-3
_RULES = ("lowest", "one_se")


def predictive_nll(posterior: ActiveSubspacePosterior, X: torch.Tensor, y, d: int, *, predictive="linearized",
                   n_samples: int = 1000, noise_var=0.0, random_state=None, linearized_method: str = "probit",
                   batch_size: int | None = None, likelihood=None) -> float:
    """Mean negative log predictive density of the rows ``(X, y)`` under the posterior at d (at its current σ0).

    The ``likelihood`` answers (None: the Gaussian): its predictive at d
    (:meth:`~glas_sklearn.likelihoods.Likelihood.calibration_prediction`) and the NLL of the targets under it
    (:meth:`~glas_sklearn.likelihoods.Likelihood.predictive_nll`): for regression −log N(y; ŷ, σ̂²) with ŷ, σ̂ the
    predictive moments of y (the Gaussian's: :func:`~glas_sklearn.predictive.regression_moments` with
    σ̂² = σ_f² + ``noise_var``), averaged over rows and outputs, +inf where σ̂ = 0 (a zero-variance Gaussian has no
    density off its mean); for :class:`~glas_sklearn.likelihoods.Categorical` −log p̂_y with p̂ from
    :func:`~glas_sklearn.predictive.class_probabilities`. The sampled predictive draws its samples from
    ``random_state``: a fixed int gives the same draws at every σ0 (common random numbers).

    Returns
    -------
    float
    """
    return _nll(posterior, X, y, d, predictive=predictive, n_samples=n_samples, noise_var=noise_var,
                random_state=random_state, linearized_method=linearized_method, batch_size=batch_size,
                likelihood=likelihood)[0]


def _nll(posterior, X, y, d, *, predictive, n_samples, noise_var, random_state, linearized_method, batch_size,
         likelihood) -> tuple[float, torch.Tensor | None]:
    """The mean NLL of :func:`predictive_nll` and its values per row (n,), float64; None per row for a likelihood
    that defines only the mean (:meth:`~glas_sklearn.likelihoods.Likelihood.predictive_nll` overridden, not
    ``predictive_nll_rows``)."""
    likelihood = resolve_calibration_likelihood(likelihood)
    X = posterior.functional_model.check_inputs(X)
    t = check_targets(y, likelihood, X.shape[0], posterior.device)
    prediction = likelihood.calibration_prediction(posterior, X, d, predictive=predictive, n_samples=n_samples,
                                                   noise_var=noise_var, random_state=random_state,
                                                   linearized_method=linearized_method, batch_size=batch_size)
    target = likelihood.calibration_targets(t, prediction)
    mean_at, rows_at = (_defined_in(type(likelihood), name) for name in ("predictive_nll", "predictive_nll_rows"))
    if mean_at is not rows_at and issubclass(mean_at, rows_at):  # the mean redefined below the rows: its own
        return float(likelihood.predictive_nll(prediction, target)), None
    rows = likelihood.predictive_nll_rows(prediction, target).to(torch.float64)
    rows = torch.where(torch.isnan(rows), torch.full_like(rows, math.inf), rows)
    return float(rows.mean()), rows


@dataclass(frozen=True)
class Sigma0Result:
    """Outcome of :func:`tune_sigma0`.

    Attributes
    ----------
    sigma0 : float
        The chosen prior standard deviation, an evaluated σ0 (0: the trained network's own predictive, e.g. the
        MAP probabilities): the one of the lowest NLL (``rule="lowest"``), or the smallest within one standard
        error of it (``rule="one_se"``; a likelihood without per-row values, ``predictive_nll_rows``, gets
        the lowest).
    sigma0_upper : float
        The top of the range searched, the posterior's σ0 at d when called (its empirical Bayes value).
    nll : float
        Mean NLL of the rows at ``sigma0``.
    sigma0_lowest : float
        The evaluated σ0 of the lowest mean NLL (``sigma0`` under ``rule="lowest"``).
    nll_at_zero, nll_at_upper : float
        Mean NLL at σ0 = 0 and at ``sigma0_upper``.
    table : pandas.DataFrame
        Every evaluation in order: ``sigma0``, ``nll`` and ``se``, the standard error of the mean of the per-row
        differences of its NLL from those at ``sigma0_lowest`` (NaN where it cannot be computed: one row, or an
        infinite NLL).
    xtol : float
        The search's tolerance in log σ0.
    n_rows : int
        The rows the NLL was averaged over.
    rule : {"lowest", "one_se"}
        How ``sigma0`` was chosen from the evaluations.
    """

    sigma0: float
    sigma0_upper: float
    nll: float
    nll_at_zero: float
    nll_at_upper: float
    table: pd.DataFrame
    xtol: float
    n_rows: int
    sigma0_lowest: float = math.nan  # defaults: results saved before these fields
    rule: str = "lowest"


def tune_sigma0(posterior: ActiveSubspacePosterior, X: torch.Tensor, y, *, d: int,
                predictive="linearized", n_samples: int = 1000, noise_var=0.0, random_state=None,
                linearized_method: str = "probit", batch_size: int | None = None,
                xtol: float = _SIGMA0_XTOL, likelihood=None, rule: str = "lowest") -> Sigma0Result:
    """The prior scale σ0 ∈ [0, σ0_EB] of the lowest mean predictive NLL (:func:`predictive_nll`) of ``(X, y)``,
    or the smallest σ0 within one standard error of it.

    σ0_EB is the posterior's σ0 at d when called (its empirical Bayes value; the estimators use the full-space
    one, ``sigma0="eb_full"``). The search is bounded Brent in log σ0 over [σ0_EB · 10⁻⁴, σ0_EB] to ``xtol``,
    with both ends evaluated explicitly: σ0_EB itself and σ0 = 0 (no weight variance: the trained network's
    predictive, the MAP probabilities for classification).

    ``rule="lowest"`` returns the evaluated σ0 of the lowest NLL. ``rule="one_se"`` (the estimators'
    ``sigma0="nll"``) returns the smallest evaluated σ0 whose per-row NLL differences from the lowest have a mean
    of at most their standard error (plus the round-off of the means): a larger σ0 has to beat a smaller one by
    more than the rows' noise. With a few dozen rows of which one is misclassified, the lowest NLL can sit at σ0_EB
    only because it softens that one row; such a gain, carried by one row, is within one standard error, and the
    rule keeps the smaller σ0.

    For the linearised predictive the Jacobian quantities of ``X`` (J P, J Jᵀ) are computed at the first
    evaluation and cached by the posterior, so each further σ0 costs O(n C² d) (the low-rank posterior; the
    low-rank-plus-diagonal one also rebuilds its d × d factors). The sampled predictive costs S forward passes
    per σ0, with the same draws at every σ0 (a seed is drawn once from ``random_state``), so the NLL is a
    smooth function of σ0 and the search is the same.

    The posterior is left as it was (its σ0 setting restored); fix the result with
    ``posterior.set_sigma0(result.sigma0)``. Split-conformal scores computed afterwards keep their
    finite-sample guarantee only on rows other than ``X``.

    Parameters
    ----------
    posterior : ActiveSubspacePosterior
    X : torch.Tensor of shape (n, ...)
        The held-out rows σ0 is tuned on.
    y : tensor or array
        Integer labels (n,) or regression targets (n,) / (n, M).
    d : int
    predictive : {"linearized", "sampled"}, default="linearized"
    n_samples : int, default=1000
    noise_var : float or array of shape (M,), default=0.0
        Regression: σ² added to σ̂² (the estimator's interval noise).
    random_state : int, numpy Generator or None
        Seeds the sampled predictive's draws (and ``linearized_method="mc"``).
    linearized_method : {"probit", "mc"}, default="probit"
    batch_size : int, optional
    xtol : float, default=1e-3
        Tolerance of the search in log σ0.
    likelihood : Likelihood, optional
        Whose predictive the NLL takes (:func:`predictive_nll`); None: the Gaussian's.
    rule : {"lowest", "one_se"}, default="lowest"
        The evaluated σ0 of the lowest NLL, or the smallest within one standard error of it.

    Returns
    -------
    Sigma0Result
    """
    if not isinstance(posterior, ActiveSubspacePosterior):
        raise TypeError(f"posterior must be an ActiveSubspacePosterior, got {type(posterior).__name__}.")
    if rule not in _RULES:
        raise ValueError(f"rule must be one of {_RULES}, got {rule!r}.")
    d = posterior._check_d(d)
    X = posterior.functional_model.check_inputs(X)
    seed = int(numpy_rng(random_state).integers(0, 2**62))
    original = posterior.sigma0
    upper = float(posterior.fit_sigma0(d))
    evals: list[tuple[float, float, torch.Tensor | None]] = []

    def nll_at(sigma0: float) -> float:
        posterior.set_sigma0(sigma0)
        mean, rows = _nll(posterior, X, y, d, predictive=predictive, n_samples=n_samples, noise_var=noise_var,
                          random_state=seed, linearized_method=linearized_method, batch_size=batch_size,
                          likelihood=likelihood)
        mean = math.inf if math.isnan(mean) else mean
        evals.append((float(sigma0), mean, rows))
        return mean

    try:
        nll_upper, nll_zero = nll_at(upper), nll_at(0.0)
        if upper > 0:
            lo, hi = math.log(upper * _SIGMA0_LOWEST), math.log(upper)
            minimize_scalar(lambda u: min(nll_at(math.exp(u)), 1e300), bounds=(lo, hi), method="bounded",
                            options={"xatol": xtol})
    finally:
        posterior.set_sigma0(original)
    sigmas, means = [s for s, _, _ in evals], [mean for _, mean, _ in evals]
    lowest = min(range(len(evals)), key=lambda i: (means[i], i))
    se = [_paired_se(rows, evals[lowest][2]) for _, _, rows in evals]
    chosen = lowest
    if rule == "one_se":
        dtype = evals[lowest][2].dtype if evals[lowest][2] is not None else torch.float64
        chosen = _one_se_choice(sigmas, means, se, eps=torch.finfo(dtype).eps)
    table = pd.DataFrame({"sigma0": sigmas, "nll": means, "se": se})
    logger.debug("tune_sigma0: d=%d, sigma0=%.6g (lowest NLL at %.6g, EB %.6g), nll=%.6g (at 0: %.6g, at EB: %.6g), "
                 "%d evaluations", d, evals[chosen][0], evals[lowest][0], upper, means[chosen], nll_zero, nll_upper,
                 len(evals))
    return Sigma0Result(sigma0=evals[chosen][0], sigma0_upper=upper, nll=means[chosen], nll_at_zero=nll_zero,
                        nll_at_upper=nll_upper, table=table, xtol=float(xtol), n_rows=int(X.shape[0]),
                        sigma0_lowest=evals[lowest][0], rule=rule)


def _one_se_choice(sigma0s, means, ses, eps: float = torch.finfo(torch.float64).eps) -> int:
    """The index of the smallest σ0 whose mean NLL exceeds the lowest by at most its standard error (``ses``, of
    the per-row differences from the lowest; NaN counts as 0) plus the round-off of the means: a larger σ0 must
    beat a smaller one by more than the rows' noise, and a difference within 64 · ``eps`` · max(1, |lowest|)
    (``eps``: the machine epsilon of the per-row NLLs' dtype) is round-off, no difference. Ties of σ0 go to the
    first.

    Examples
    --------
    >>> _one_se_choice([1.0, 0.0, 0.5], [0.30, 0.31, 0.305], [0.0, 0.02, 0.0])  # 0.31 is within 0.02 of 0.30
    1
    >>> _one_se_choice([1.0, 0.0], [0.3, 0.3 + 1e-16], [0.0, 0.0])  # round-off, not a gain: σ0 = 0
    1
    """
    lowest = min(range(len(means)), key=lambda i: (means[i], i))
    tol = 64 * eps * max(1.0, abs(means[lowest]))
    within = [i for i in range(len(means))
              if i == lowest or means[i] - means[lowest] <= (ses[i] if math.isfinite(ses[i]) else 0.0) + tol]
    return min(within, key=lambda i: (sigma0s[i], i))


def _defined_in(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO that defines the attribute ``name``."""
    return next(k for k in cls.__mro__ if name in vars(k))


def _paired_se(rows: torch.Tensor | None, reference: torch.Tensor | None) -> float:
    """Standard error of the mean of the per-row differences ``rows − reference``; NaN for fewer than two rows, a
    non-finite difference or no per-row values."""
    if rows is None or reference is None:
        return math.nan
    diff = rows - reference
    if diff.numel() < 2 or not bool(torch.isfinite(diff).all()):
        return math.nan
    return float(diff.std(unbiased=True) / math.sqrt(diff.numel()))
