"""The paper's calibration of the subspace dimension d by coverage (eq. 42, §4.1.7).

At a given d, refit σ0 by empirical Bayes, build (1 − γ) intervals (regression) or prediction sets
(classification) on the calibration inputs and measure their empirical coverage; the smallest d whose coverage
reaches 1 − γ is chosen (:func:`choose_dimension`, :class:`CoverageCalibrator`). The linearised predictive scans
d = 1, 2, … (cheap: K JVPs in all). The sampled one costs S forward passes per d, so it searches instead: d_max
first (below the level: no d reaches it), then bisection, a handful of sampled evaluations
(⌈log2 d_max⌉ + 1), or a short scan from d = 1 when the linearised curve says the answer is there; the answer
is the scan's whenever "coverage ≥ level" is monotone in d.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .._checks import (
    check_choice,
    check_confidence_levels,
    check_positive_int,
    numpy_rng,
)
from .._progress import progress
from .._silenced import is_silenced, silenced
from .._warnings import warn
from ..posterior import ActiveSubspacePosterior
from ..predictive import (
    Linearized,
    prediction_sets,
    resolve_predictive,
)
from ._base import Calibrator, check_targets, percent, resolve_calibration_likelihood

__all__ = ["CalibrationResult", "CalibrationWarning", "CoverageCalibrator", "choose_dimension"]

logger = logging.getLogger(__name__)

# Coverage is a ratio of counts; this absorbs the round-off of e.g. 9/10 against a level of 0.9.
_COVERAGE_TOL = 1e-12
# The sampled search scans upwards from d_min while the linearised guess puts the answer this close.
_SCAN_STEPS = 3


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
        One row per d evaluated, in increasing d, columns ``d``, ``coverage``, ``mean_width`` (regression)
        or ``mean_set_size`` (classification), ``sigma0``. Every d of the scan up to the chosen one for the
        linearised predictive and with ``full_curve``; only the d the search probed for the sampled one.
    coverage : float
        Coverage at ``n_components``.
    confidence_level : float
        The target level 1 − γ.
    sample_seed : int or None
        The seed of the posterior samples (``predict_samples(..., random_state=sample_seed)``), the same for
        every d: drawing with it reproduces the samples behind ``table``.
    n_evaluations : int
        How many d the predictive was evaluated at (the rows of ``table``); for the sampled predictive,
        each is S forward passes of the calibration rows.
    evaluation_order : tuple of int
        Those d in the order they were evaluated.
    """

    n_components: int
    sigma0: float
    reached: bool
    table: pd.DataFrame
    coverage: float = float("nan")
    confidence_level: float = float("nan")
    sample_seed: int | None = None
    n_evaluations: int = 0
    evaluation_order: tuple = ()

def choose_dimension(posterior: ActiveSubspacePosterior, X_cal: torch.Tensor, y_cal, *,
                     confidence_level: float = 0.9, d_max: int = 50,
                     predictive="sampled", n_samples: int = 1000, noise_var=0.0,
                     random_state=None, full_curve: bool = False, linearized_method: str = "probit",
                     batch_size: int | None = None, verbose: int = 0, d_min: int = 1,
                     likelihood=None) -> CalibrationResult:
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
    confidence_level : float, default=0.9
        The target 1 − γ.
    d_max : int, default=50
        Largest d tried; capped at the number K of eigenpairs of the posterior.
    predictive : {"sampled", "linearized"} or PredictiveMode, default="sampled"
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
        Evaluate every d up to d_max (the whole coverage curve) instead of stopping at the first that
        reaches the level (linearised) or searching for it (sampled).
    linearized_method : {"probit", "mc"}, default="probit"
        Classification with ``predictive="linearized"``: how the logit Gaussian is pushed through the softmax.
    batch_size : int, optional
        Input rows per forward pass / JVP.
    verbose : int, default=0
        0 is silent; ≥ 1 shows a progress bar over the evaluations.
    d_min : int, default=1
        Smallest d tried (``d_min = d_max`` evaluates a single, given d).
    likelihood : Likelihood, optional
        The likelihood whose own regions are judged (:meth:`~glas_sklearn.likelihoods.Likelihood.predictive_region`:
        intervals of y for regression, the smallest sets reaching the level for
        :class:`~glas_sklearn.likelihoods.Categorical`); None: the Gaussian's, the posterior's intervals of f with
        ``noise_var`` added.

    Returns
    -------
    CalibrationResult
        ``n_evaluations`` and ``evaluation_order`` say which d were evaluated.

    Notes
    -----
    The sampled search (``predictive="sampled"``, ``full_curve=False``): while the linearised coverage
    curve (one JVP per d, for the first six d), shifted by the sampled − linearised difference measured so
    far, puts the answer within three d of d_min, it scans upwards from d_min; otherwise it evaluates d_max
    and, if that reaches the level, bisects the bracket between the last d below the level and the first at
    or above it: at most 3 + 1 + ⌈log2(d_max − d_min + 1)⌉ sampled evaluations (7 for d_max = 50 without
    the scan). Every evaluation uses the same standard normals (common random numbers), scaled by that d's
    σ_j. If coverage is not monotone in d, the search returns a d at which the curve crosses the level
    (below at d − 1, at or above at d), not necessarily the first; ``full_curve=True`` shows the whole curve.

    Warns
    -----
    CalibrationWarning
        When no d up to d_max reaches the level; d_max is used and the best coverage is named.
    """
    if not isinstance(posterior, ActiveSubspacePosterior):
        raise TypeError(f"posterior must be an ActiveSubspacePosterior, got {type(posterior).__name__}.")
    predictive = resolve_predictive(predictive)
    likelihood = resolve_calibration_likelihood(likelihood)
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
    likelihood.check_noise_var(noise_var)
    verbose = check_positive_int("verbose", int(verbose) if isinstance(verbose, bool) else verbose, minimum=0)

    X_cal = posterior.functional_model.check_inputs(X_cal)
    n = X_cal.shape[0]
    y = check_targets(y_cal, likelihood, n, posterior.device)
    seed = int(numpy_rng(random_state).integers(0, 2**62))
    d_top = min(d_max, posterior.max_components)
    if d_top < d_max:
        logger.info("d_max=%d capped at the %d eigenpairs available", d_max, d_top)

    size_col = likelihood.region_size_name
    mean = posterior.predict_mean(X_cal, batch_size=batch_size)
    rows: dict[int, dict] = {}
    order: list[int] = []

    def coverage_and_size(d: int, pred, method: str) -> tuple[float, float]:
        """Coverage and mean width / set size of the likelihood's own (1 − γ) regions at d."""
        region = likelihood.predictive_region(posterior, X_cal, d, level, predictive=pred, n_samples=n_samples,
                                              noise_var=noise_var, random_state=seed, linearized_method=method,
                                              batch_size=batch_size, mean=mean)
        return float(likelihood.region_coverage(y, region)[0]), float(likelihood.region_size(region)[0])

    def evaluate(d: int) -> float:
        sigma0 = posterior.fit_sigma0(d)
        cov, size = coverage_and_size(d, predictive, linearized_method)
        rows[d] = {"d": d, "coverage": cov, size_col: size, "sigma0": sigma0}
        order.append(d)
        logger.debug("d=%d: coverage=%.4f, %s=%.4g, sigma0=%.4g", d, cov, size_col, size, sigma0)
        return cov

    if full_curve or predictive.scans_every_dimension or d_min == d_top:
        # every d in turn (linearised evaluations cost K JVPs in total, so the scan is cheap)
        chosen = None
        for d in progress(range(d_min, d_top + 1), desc="calibrating d", verbose=verbose):
            if evaluate(d) >= level - _COVERAGE_TOL and chosen is None:
                chosen = d
                if not full_curve:
                    break
    else:
        # the linearised curve says whether a short scan from d_min pays; only its first d are needed
        # (one JVP per d: 2 · _SCAN_STEPS of them rather than K)
        window = range(d_min, min(d_top, d_min + 2 * _SCAN_STEPS - 1) + 1)
        guess = _linearized_curve(posterior, X_cal, y, mean, level, noise_var, window, batch_size, likelihood)
        with progress(desc="calibrating d (search)", unit="evaluation", verbose=verbose) as bar:
            def probe(d: int) -> float:
                cov = evaluate(d)
                bar.update(1)
                bar.set_postfix(d=d, coverage=f"{cov:.3f}")
                return cov

            chosen = _search_dimension(probe, guess, level, d_min, d_top)

    table = pd.DataFrame([rows[d] for d in sorted(rows)], columns=["d", "coverage", size_col, "sigma0"])
    reached = chosen is not None
    if not reached:
        best = int(table["coverage"].idxmax())
        if not is_silenced("coverage_not_reached"):
            warn(
                f"No subspace dimension up to d_max={d_top} reached {level:.1%} coverage on the calibration data; "
                f"the best was {table['coverage'].iloc[best]:.1%} at d={int(table['d'].iloc[best])}. Using d={d_top}. "
                "Consider a larger d_max (more eigenpairs; the estimators' posterior=LowRank(max_components=...)), "
                "scaling='mean', or intervals for y (noise_var here; posterior=LowRank(include_noise=True) on "
                "LaplaceActiveSubspaceRegressor).",
                CalibrationWarning,
            )
        chosen = d_top
    row = table.loc[table["d"] == chosen].iloc[0]
    return CalibrationResult(n_components=int(chosen), sigma0=float(row["sigma0"]), reached=reached, table=table,
                             coverage=float(row["coverage"]), confidence_level=level, sample_seed=seed,
                             n_evaluations=len(order), evaluation_order=tuple(order))


def _linearized_curve(posterior: ActiveSubspacePosterior, X: torch.Tensor, y: torch.Tensor, mean: torch.Tensor,
                      level: float, noise_var, ds, batch_size: int | None, likelihood) -> dict[int, float]:
    """Coverage of the likelihood's linearised (1 − γ) regions (probit sets for classification) at every d in
    ``ds``."""
    mode = Linearized()
    cov = [float(likelihood.region_coverage(y, likelihood.predictive_region(
        posterior, X, d, level, predictive=mode, noise_var=noise_var, batch_size=batch_size, mean=mean))[0])
        for d in ds]
    return dict(zip(ds, cov, strict=True))


def _predicted_first(guess: dict, measured: dict, start: int, stop: int, level: float) -> int | None:
    """Smallest d in [start, stop] whose predicted coverage reaches ``level``, or None.

    The prediction is the linearised coverage ``guess[d]`` shifted by the sampled − linearised difference
    seen at the measured d, interpolated linearly in d between the nearest measured neighbours (and held
    constant beyond them).
    """
    known = sorted(measured)
    for d in range(start, stop + 1):
        i = int(np.searchsorted(known, d))
        left, right = (known[i - 1] if i > 0 else None), (known[i] if i < len(known) else None)
        if left is None and right is None:
            shift = 0.0
        elif left is None or right is None or left == right:
            e = right if left is None else left
            shift = measured[e] - guess[e]
        else:
            a, b = measured[left] - guess[left], measured[right] - guess[right]
            shift = a + (b - a) * (d - left) / (right - left)
        if guess[d] + shift >= level - _COVERAGE_TOL:
            return d
    return None


def _search_dimension(probe, guess: dict, level: float, d_min: int, d_max: int) -> int | None:
    """Smallest d in [d_min, d_max] whose coverage ``probe(d)`` reaches ``level``, or None if d_max does not.

    Exact (the full scan's answer) whenever "coverage ≥ level" is monotone in d, in at most
    ``_SCAN_STEPS + 1 + ⌈log2(d_max − d_min + 1)⌉`` probes:

    1. While the linearised ``guess`` (shifted by the sampled − linearised difference measured so far) puts
       the answer among the next ``_SCAN_STEPS`` d (it holds d_min … d_min + 2 ``_SCAN_STEPS`` − 1), scan
       upwards from d_min (at most ``_SCAN_STEPS`` probes; a scan from below is exact whatever the shape of
       the curve).
    2. Otherwise probe d_max: below the level, no d reaches it (under monotonicity) and the search stops.
    3. Bisect the bracket lo < d ≤ hi (lo below the level, hi at or above it) down to one d.

    (Letting the linearised curve pick the probes inside the bracket saved about 5 % of the probes on
    simulated curves and cost more when it was off, so the bracket is bisected.)
    """
    measured: dict[int, float] = {}

    def reaches(d: int) -> bool:
        measured[d] = probe(d)
        return measured[d] >= level - _COVERAGE_TOL

    lo, hi = d_min - 1, None
    scans = 0
    while hi is None:
        near = _predicted_first(guess, measured, lo + 1, min(d_max, lo + _SCAN_STEPS), level) is not None
        if scans < _SCAN_STEPS and (near or d_max - lo <= _SCAN_STEPS):
            d, scans = lo + 1, scans + 1
        else:
            d = d_max
        if reaches(d):
            hi = d
        elif d == d_max:
            return None
        else:
            lo = d
    while hi - lo > 1:
        d = (lo + hi) // 2
        if reaches(d):
            hi = d
        else:
            lo = d
    return hi


class CoverageCalibrator(Calibrator):
    """The paper's calibration: the smallest subspace dimension d whose (1 − γ) posterior intervals or sets
    cover the calibration rows (eq. 42); ``calibration="coverage"`` of the estimators.

    With ``n_components="auto"`` in :meth:`fit`, d is searched up to the K eigenpairs of the posterior
    (:func:`choose_dimension`; a :class:`CalibrationWarning` when no d reaches the level); with a given d, its
    coverage is recorded, not judged (``reached_`` is None). Predictions are the posterior's own intervals
    (:func:`~glas_sklearn.predictive.predictive_interval`) and smallest sets reaching the level
    (:func:`~glas_sklearn.predictive.prediction_sets`) at that d. No hyperparameters: the level and the
    predictive are the estimator's.

    Examples
    --------
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor
    >>> from glas_sklearn.calibration import CoverageCalibrator
    >>> paper = LaplaceActiveSubspaceRegressor(posterior="subspace", calibration=CoverageCalibrator())
    >>> paper.get_params()["calibration"]
    CoverageCalibrator()
    """

    chooses_dimension = True
    requires_fixed_predictor = False

    def fit(self, posterior, X_cal, y_cal, *, n_components="auto", confidence_levels=0.9,
            predictive="sampled", n_samples=1000, noise_var=0.0, random_state=None,
            verbose=0, likelihood=None) -> CoverageCalibrator:
        self.likelihood_ = resolve_calibration_likelihood(likelihood)
        common = dict(confidence_level=float(check_confidence_levels(confidence_levels)[0]),
                      predictive=predictive, n_samples=n_samples, noise_var=noise_var, random_state=random_state,
                      verbose=verbose, likelihood=self.likelihood_)
        if isinstance(n_components, str) and n_components == "auto":
            result = choose_dimension(posterior, X_cal, y_cal, d_max=posterior.max_components, full_curve=False,
                                      **common)
            reached = bool(result.reached)
        else:
            with silenced("coverage_not_reached"):  # a user-chosen d: its coverage is recorded, not judged
                result = choose_dimension(posterior, X_cal, y_cal, d_min=n_components, d_max=n_components,
                                          **common)
            reached = None
        self._store(result, n_components=result.n_components, sigma0=result.sigma0, table=result.table,
                    sample_seed=result.sample_seed, reached=reached, predictive=resolve_predictive(predictive),
                    n_samples=n_samples,
                    noise_var=noise_var)
        return self

    def report(self, n_rows: int, confidence_levels) -> str:
        """E.g. ": coverage 0.912 of the 90 % target (reached)": the coverage at the chosen d."""
        table, d = self.table_, self.n_components_
        if "coverage" not in table or not len(table):
            return ""
        row = table[table["d"] == d].iloc[-1] if (table["d"] == d).any() else table.iloc[-1]
        level = check_confidence_levels(confidence_levels)[0]
        text = f": coverage {row['coverage']:.3f} of the {percent(level)} target"
        return text + {True: " (reached)", False: " (not reached)", None: ""}[self.reached_]

    def predict_interval(self, posterior, X, confidence_levels=None, *, batch_size=None):
        return self.likelihood_.predictive_interval(posterior, X, self.n_components_, confidence_levels,
                                                    predictive=self.predictive_, n_samples=self.n_samples_,
                                                    noise_var=self.noise_var_, random_state=self.sample_seed_,
                                                    batch_size=batch_size)

    def predict_set(self, probs, confidence_levels):
        return prediction_sets(probs, confidence_levels)
