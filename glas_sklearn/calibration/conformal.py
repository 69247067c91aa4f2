"""Split-conformal calibration at a fixed subspace dimension d, with conformity scores as objects.

Beyond the paper (see the user guide): at a d fixed before looking at the calibration rows, the split-conformal quantile
of the calibration rows' conformity scores gives intervals or sets with coverage ≥ 1 − γ for exchangeable
data at any number of rows (:func:`conformal_calibrate`, :class:`ConformalCalibrator`).

The conformity scores themselves (``score(y, prediction)`` and its inverse ``region``) live one floor below, in
:mod:`glas_sklearn.conformity_scores`; their names stay importable from here and from
:mod:`glas_sklearn.calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .._checks import check_confidence_levels, numpy_rng
from .._silenced import is_silenced
from .._warnings import warn
from ..conformity_scores import LAC, ClassificationScore, ConformityScore, RegressionScore, StdNormalizedResidual
from ..likelihoods import Likelihood
from ..posterior import ActiveSubspacePosterior
from ..predictive import RegressionMoments, resolve_predictive
from ..predictive.modes import add_noise_variance
from ._base import Calibrator, check_targets, percent, resolve_calibration_likelihood
from ._epistemic import (
    _check_epistemic_weight,
    epistemic_cap,
    fit_epistemic_weight,
    weighted_moments,
)

# The score names are re-exported from glas_sklearn.conformity_scores, where they are defined.
__all__ = [
    "LAC",
    "ClassificationScore",
    "ConformalCalibrator",
    "ConformalResult",
    "ConformalWarning",
    "ConformityScore",
    "RegressionScore",
    "StdNormalizedResidual",
    "conformal_calibrate",
    "conformal_quantile",
    "conformal_rank",
    "epistemic_cap",
    "fit_epistemic_weight",
    "resolve_conformity_score",
    "weighted_moments",
]


class ConformalWarning(UserWarning):
    """Too few calibration rows for a finite conformal quantile at the requested level."""


def resolve_conformity_score(conformity_score, likelihood: Likelihood | None = None) -> ConformityScore:
    """The score to use: the given one, checked by type against the likelihood's default score (a
    :class:`RegressionScore` where the default is one, a :class:`ClassificationScore` likewise, as MAPIE's
    ``check_and_select_conformity_score``), or for None the likelihood's
    :meth:`~glas_sklearn.likelihoods.Likelihood.default_conformity_score` (:class:`StdNormalizedResidual` for the
    regression likelihoods, ``LAC(never_empty=True)`` for :class:`~glas_sklearn.likelihoods.Categorical`: the
    smallest sets without an empty one of the scores measured in docs/benchmarks/studies.md#classifier-sets).
    ``likelihood`` None is the Gaussian."""
    default = resolve_calibration_likelihood(likelihood).default_conformity_score()
    if conformity_score is None:
        return default
    if not isinstance(conformity_score, ConformityScore):
        raise TypeError(f"conformity_score must be None or a ConformityScore (a RegressionScore or "
                        f"ClassificationScore subclass instance, e.g. StdNormalizedResidual()), got "
                        f"{type(conformity_score).__name__}.")
    family = ClassificationScore if isinstance(default, ClassificationScore) else RegressionScore
    if not isinstance(conformity_score, family):
        raise ValueError(f"conformity_score={conformity_score!r} is not a {family.__name__}, but the likelihood "
                         f"calibrated ({resolve_calibration_likelihood(likelihood)!r}) takes one; use a "
                         f"{family.__name__} (e.g. {default!r}).")
    return conformity_score


def _score_array(raw, n: int, conformity_score) -> np.ndarray:
    """A score's output as a float64 array of shape (n,) or (n, M), checked."""
    s = np.asarray(raw.detach().cpu() if isinstance(raw, torch.Tensor) else raw, dtype=np.float64)
    if s.ndim not in (1, 2) or s.shape[0] != n:
        raise ValueError(f"{conformity_score!r}.score returned shape {s.shape} for {n} calibration rows; it must "
                         f"return one score per row, shape ({n},) or ({n}, M).")
    return s


# ------------------------------------------------------------------------------------------ quantiles


def conformal_rank(n: int, confidence_levels) -> np.ndarray:
    """⌈(n + 1)(1 − γ)⌉ per level: the rank, among n calibration scores, of the split-conformal quantile (above n:
    too few rows for a finite one), with the round-off of e.g. 100 · 0.9 = 90.00000000000001 absorbed.

    Examples
    --------
    >>> conformal_rank(28, 0.9).tolist()  # the 27th of 28: coverage 27/29 = 93.1 % on average
    [27]
    """
    levels = check_confidence_levels(confidence_levels)
    return np.ceil((n + 1) * levels - 1e-9 * (n + 1)).astype(np.int64)


def expected_coverage_note(n: int, level: float) -> str:
    """With few calibration rows a conformal interval covers ⌈(n + 1)(1 − γ)⌉ / (n + 1) on average, above the level:
    said when that is a point or more (e.g. 93.1 % from 28 rows at 90 %), so that the overshoot is not a surprise."""
    if n < 1:
        return ""
    k = int(conformal_rank(n, level)[0])
    expected = k / (n + 1)
    if k > n or expected - level < 0.01:
        return ""
    return (f"; with {n} rows conformal intervals cover {100 * expected:.1f} % on average (⌈(n + 1)(1 − γ)⌉/(n + 1); "
            "more calibration rows bring it to the level)")


def _rows_for_finite_quantile(confidence_levels) -> int:
    """⌈1/γ⌉ − 1 at the highest level: the fewest calibration rows whose conformal quantile is finite
    (⌈(n + 1)(1 − γ)⌉ ≤ n), with the round-off of 1/γ absorbed (1/(1 − 0.9) is 10.000000000000002: 9 rows).

    Examples
    --------
    >>> _rows_for_finite_quantile([0.9, 0.95])
    19
    """
    top = float(np.max(check_confidence_levels(confidence_levels)))
    return int(np.ceil(1.0 / (1.0 - top) - 1e-9)) - 1


def conformal_quantile(scores, confidence_levels, method: str = "higher") -> np.ndarray:
    """Split-conformal quantiles: the ⌈(n + 1)(1 − γ)⌉-th smallest of the n calibration scores, per level.

    For exchangeable calibration and test scores (continuous or not), P(s_test ≤ q) ≥ 1 − γ; with
    distinct scores it is exactly ⌈(n + 1)(1 − γ)⌉ / (n + 1). That rounding up costs up to 1/(n + 1) of extra
    coverage (27/29 = 93.1 % at 90 % with 28 rows); ``method="interpolated"`` removes it: with r = (n + 1)(1 − γ),
    q = s_(⌊r⌋) + (r − ⌊r⌋)(s_(⌊r⌋+1) − s_(⌊r⌋)), between the two order statistics whose average coverages
    ⌊r⌋/(n + 1) and (⌊r⌋ + 1)/(n + 1) bracket 1 − γ. Its coverage is then at least 1 − γ − 1/(n + 1), and on
    average at least 1 − γ wherever the scores' distribution function is concave between the two (a density
    falling in its upper tail, as for absolute residuals), by Jensen's inequality; finite for the same n.

    Parameters
    ----------
    scores : array-like of shape (n,) or (n, M)
        Calibration scores along axis 0 (one column per output: one quantile per output).
    confidence_levels : float or sequence of float
        Levels 1 − γ in (0, 1).
    method : {"higher", "interpolated"}, default="higher"
        The order statistic of rank ⌈(n + 1)(1 − γ)⌉ (the finite-sample guarantee), or the interpolation between
        ranks ⌊(n + 1)(1 − γ)⌋ and the next (average coverage 1 − γ instead of up to 1/(n + 1) above it).

    Returns
    -------
    ndarray of shape (k,) or (k, M), float64
        +inf where the rank exceeds n (too few rows for that level: n < 1/γ − 1), with a
        :class:`ConformalWarning`.

    Examples
    --------
    >>> conformal_quantile([0.3, 0.1, 0.4, 0.2], 0.6)  # ⌈5 · 0.6⌉ = 3rd smallest
    array([0.3])
    >>> conformal_quantile([0.3, 0.1, 0.4, 0.2], 0.7, method="interpolated")  # rank 3.5: half-way 0.3 to 0.4
    array([0.35])
    """
    if method not in ("higher", "interpolated"):
        raise ValueError(f"method must be 'higher' or 'interpolated', got {method!r}.")
    levels = check_confidence_levels(confidence_levels)
    s = np.asarray(scores.detach().cpu() if isinstance(scores, torch.Tensor) else scores, dtype=np.float64)
    if s.ndim not in (1, 2) or s.shape[0] == 0:
        raise ValueError(f"scores must have shape (n,) or (n, M) with n >= 1, got {s.shape}.")
    if np.isnan(s).any():
        raise ValueError("scores contains NaN values.")
    n = s.shape[0]
    s = np.sort(s, axis=0)
    ranks = conformal_rank(n, levels)
    out = np.full((len(levels),) + s.shape[1:], np.inf)
    finite = ranks <= n
    if not finite.all() and not is_silenced("few_calibration_rows"):
        bad = levels[~finite]
        warn(f"{n} calibration rows are too few for a conformal quantile at level(s) {bad.tolist()} "
             f"(⌈(n+1)(1−γ)⌉ ≤ n needs n ≥ {_rows_for_finite_quantile(bad)}); the intervals or sets are "
             "infinite (every class) there. Use more calibration rows (the estimators' calibration_size, or X_cal "
             "and y_cal in fit) or a lower confidence_level.", ConformalWarning)
    if method == "higher":
        out[finite] = s[np.maximum(ranks[finite], 1) - 1]
        return out
    r = (n + 1) * levels[finite]
    low = np.floor(r + 1e-9 * (n + 1)).astype(np.int64)  # an integer r up to round-off is that rank itself
    frac = np.clip(r - low, 0.0, 1.0)
    below = s[np.clip(low, 1, n) - 1]
    above = s[np.clip(low + 1, 1, n) - 1]
    frac = np.where(low < 1, 0.0, frac).reshape((-1,) + (1,) * (s.ndim - 1))
    out[finite] = below + frac * (above - below)
    return out


@dataclass(frozen=True)
class ConformalResult:
    """Outcome of :func:`conformal_calibrate`.

    Attributes
    ----------
    n_components : int
        The subspace dimension d the scores were computed at.
    sigma0 : float
        The prior standard deviation at d.
    scores : ndarray
        The calibration scores, sorted along axis 0: by default ``|y − ŷ|`` / σ̂ of shape (n, M) (regression,
        one column per output) or 1 − p_y of shape (n,) (classification, the LAC score).
    confidence_levels : ndarray of shape (k,)
    quantiles : ndarray of shape (k, M) (regression) or (k,) (classification)
        :func:`conformal_quantile` of ``scores`` at each level.
    table : pandas.DataFrame
        One row per level: ``level``, ``d``, ``quantile`` (the first output's for regression), ``coverage``
        (the share of calibration scores ≤ the quantile) and ``mean_width`` / ``mean_set_size`` of the
        conformal intervals or sets on the calibration rows, ``sigma0``.
    sample_seed : int
        The seed of the posterior samples behind the scores (``random_state=sample_seed`` in
        :func:`~glas_sklearn.predictive.regression_moments` / :func:`~glas_sklearn.predictive.class_probabilities`
        reproduces them): new rows must be predicted with it for the scores to be exchangeable with theirs.
    conformity_score : ConformityScore or None
        The score the ``scores`` are of (:class:`StdNormalizedResidual` or ``LAC(never_empty=True)`` unless one was
        given);
        its ``region`` turns ``quantiles`` into intervals or sets.
    epistemic_weight : ndarray of shape (M,) or None
        Regression: the weight λ of the epistemic variance in σ̂² = σ_ale² + σ² + λ σ_epi² the scores were
        normalised with (fitted, or as given); None: the likelihood's predictive as it is (λ = 1).
    epistemic_cap : ndarray of shape (M,) or None
        With ``epistemic_weight``: the median σ_epi² of the calibration rows (:func:`epistemic_cap`), beyond which
        the excess counts at least in full (:func:`weighted_moments`).
    """

    n_components: int
    sigma0: float
    scores: np.ndarray
    confidence_levels: np.ndarray
    quantiles: np.ndarray
    table: pd.DataFrame
    sample_seed: int
    conformity_score: ConformityScore | None = None
    epistemic_weight: np.ndarray | None = None
    epistemic_cap: np.ndarray | None = None

    def quantile(self, confidence_levels) -> np.ndarray:
        """Conformal quantiles of the stored scores at other levels; shape (k,) or (k, M)."""
        return conformal_quantile(self.scores, confidence_levels)


def conformal_calibrate(posterior: ActiveSubspacePosterior, X_cal: torch.Tensor, y_cal, *, d: int,
                        confidence_level=0.9, predictive="linearized",
                        n_samples: int = 1000, noise_var=0.0, random_state=None, linearized_method: str = "probit",
                        batch_size: int | None = None, conformity_score: ConformityScore | None = None,
                        likelihood: Likelihood | None = None, epistemic_weight=1.0) -> ConformalResult:
    """Split-conformal calibration of the posterior's predictive at a given d.

    The scores s_i = ``conformity_score.score(y_i, prediction_i)``, by default: regression
    s_i = ``|y_i − ŷ_i|`` / σ̂_i per output, with ŷ, σ̂ from :func:`~glas_sklearn.predictive.regression_moments`
    (σ̂² = σ_f² + σ² with ``noise_var``), the interval at level 1 − γ being ŷ ± q σ̂, q the
    ⌈(n + 1)(1 − γ)⌉-th smallest score (:func:`~glas_sklearn.predictive.conformal_interval`); classification:
    the LAC score s_i = 1 − p̂_{y_i} and the sets {c : 1 − p̂_c ≤ q}
    (:func:`~glas_sklearn.predictive.conformal_sets`).

    The guarantee (coverage ≥ 1 − γ on a new exchangeable row) holds when nothing about the predictor —
    the network, σ0, β, σ², d, the sample seed — depends on the calibration rows: fit the posterior on other
    data and fix d beforehand.

    Parameters
    ----------
    posterior : ActiveSubspacePosterior
    X_cal : torch.Tensor of shape (n, ...)
    y_cal : tensor or array
        Regression targets (n,) or (n, M), or integer labels (n,).
    d : int
        Subspace dimension.
    confidence_level : float or sequence of float, default=0.9
    predictive : {"sampled", "linearized"}, default="linearized"
    n_samples : int, default=1000
    noise_var : float or array of shape (M,), default=0.0
        Regression only: σ² added to σ̂².
    random_state : int, numpy Generator or None
        Seeds the posterior samples: one seed is drawn from it (``sample_seed`` of the result), to be used
        when predicting on new rows.
    linearized_method : {"probit", "mc"}, default="probit"
    batch_size : int, optional
    conformity_score : ConformityScore, optional
        None: the likelihood's default (:func:`resolve_conformity_score`).
    likelihood : Likelihood, optional
        The likelihood whose predictive the scores take
        (:meth:`~glas_sklearn.likelihoods.Likelihood.calibration_prediction`: the predictive moments of y for
        regression, the class probabilities for :class:`~glas_sklearn.likelihoods.Categorical`); None: the
        Gaussian's, the moments of f with ``noise_var`` added.
    epistemic_weight : float or "fit", default=1.0
        Regression: σ̂² = σ_ale² + σ² + λ σ_epi² normalises the scores (the likelihood's
        :meth:`~glas_sklearn.likelihoods.Likelihood.predictive_parts`); 1 is the predictive as it is, "fit" chooses
        λ per output on these rows (:func:`fit_epistemic_weight`). Ignored for classification.

    Returns
    -------
    ConformalResult
    """
    return _conformal_scores(posterior, X_cal, y_cal, d=d, confidence_level=confidence_level, predictive=predictive,
                             n_samples=n_samples, noise_var=noise_var, random_state=random_state,
                             linearized_method=linearized_method, batch_size=batch_size,
                             conformity_score=conformity_score, likelihood=likelihood,
                             epistemic_weight=epistemic_weight)[0]


def _conformal_scores(posterior, X_cal, y_cal, *, d, confidence_level, predictive, n_samples, noise_var,
                      random_state, linearized_method, batch_size, conformity_score, likelihood, epistemic_weight):
    """:func:`conformal_calibrate`, returning also the prediction on the calibration rows (weighted as the scores)
    and the matched targets, which the Mondrian calibrator bins (so the predictive is computed once)."""
    if not isinstance(posterior, ActiveSubspacePosterior):
        raise TypeError(f"posterior must be an ActiveSubspacePosterior, got {type(posterior).__name__}.")
    likelihood = resolve_calibration_likelihood(likelihood)
    score_fn = resolve_conformity_score(conformity_score, likelihood)
    levels = check_confidence_levels(confidence_level)
    d = posterior._check_d(d)
    likelihood.check_noise_var(noise_var)
    _check_epistemic_weight(epistemic_weight)
    X_cal = posterior.functional_model.check_inputs(X_cal)
    n = X_cal.shape[0]
    y = check_targets(y_cal, likelihood, n, posterior.device)
    seed = int(numpy_rng(random_state).integers(0, 2**62))  # as choose_dimension draws its sample seed
    sigma0 = float(posterior.fit_sigma0(d))
    weight = cap = None
    if score_fn.classification or (not isinstance(epistemic_weight, str) and float(epistemic_weight) == 1.0):
        prediction = likelihood.calibration_prediction(posterior, X_cal, d, predictive=predictive,
                                                       n_samples=n_samples, noise_var=noise_var, random_state=seed,
                                                       linearized_method=linearized_method, batch_size=batch_size)
    else:  # the predictive's parts, the epistemic one weighed by λ (given, or fitted on these rows)
        parts = likelihood.predictive_parts(posterior, X_cal, d, predictive=predictive, n_samples=n_samples,
                                            random_state=seed, batch_size=batch_size)
        M = parts[0].reshape(n, -1).shape[1]
        cap = epistemic_cap(parts[2].detach().reshape(n, -1).cpu().numpy()) if n else np.zeros(M)
        if isinstance(epistemic_weight, str):
            residual = (likelihood.calibration_targets(y, RegressionMoments(parts[0], parts[0])) - parts[0])
            weight = fit_epistemic_weight(residual.detach().cpu().numpy().reshape(n, -1),
                                          add_noise_variance(parts[1], noise_var).detach().cpu().numpy()
                                          .reshape(n, -1), parts[2].detach().cpu().numpy().reshape(n, -1), cap)
        else:
            weight = np.full(M, float(epistemic_weight))
        prediction = weighted_moments(parts, noise_var, weight, cap)
    target = likelihood.calibration_targets(y, prediction)
    size_col = likelihood.region_size_name
    raw = _score_array(score_fn.score(target, prediction), n, score_fn)
    scores = np.sort(raw, axis=0)
    quantiles = conformal_quantile(scores, levels)
    sizes = np.asarray(score_fn.mean_size(prediction, quantiles), dtype=np.float64).reshape(-1)
    # a calibration row is inside its region ⇔ its score ≤ q
    rows = [{"level": float(lev), "d": d, "quantile": float(np.ravel(quantiles[i])[0]), "sigma0": sigma0,
             "coverage": float(np.mean(raw <= quantiles[i])), size_col: float(sizes[i])}
            for i, lev in enumerate(levels)]
    table = pd.DataFrame(rows, columns=["level", "d", "quantile", "coverage", size_col, "sigma0"])
    result = ConformalResult(n_components=d, sigma0=sigma0, scores=scores, confidence_levels=levels,
                             quantiles=quantiles, table=table, sample_seed=seed, conformity_score=score_fn,
                             epistemic_weight=weight, epistemic_cap=cap)
    return result, prediction, target


# ----------------------------------------------------------------------------------------- calibrator


class ConformalCalibrator(Calibrator):
    """Split-conformal calibration at a fixed d (``calibration="conformal"`` of the estimators).

    :meth:`fit` computes the calibration rows' conformity scores (:func:`conformal_calibrate`); predictions
    are the score's regions at the conformal quantile of the stored scores, for any level
    (:meth:`quantile`). With ``n_components="auto"`` the estimators fix d at every eigenpair computed, before
    the calibration rows are seen, so that the guarantee holds.

    Regression scores are normalised by σ̂(x), σ̂² = σ_ale² + σ² + λ min(σ_epi², m) + max(λ, 1) (σ_epi² − m)₊ (the
    likelihood's aleatoric variance, the added noise variance, the posterior's epistemic variance weighted by λ up to m,
    the median σ_epi² of the calibration rows; :func:`weighted_moments`, :func:`epistemic_cap`).
    ``epistemic_weight="fit"`` chooses λ per output on the calibration rows (:func:`fit_epistemic_weight`, by the
    Gaussian likelihood of the residuals): in distribution the Laplace σ_epi is often several times the mean's actual
    error (on the synthetic shapes of ``docs/benchmarks/studies.md#regional-calibration`` 2.7–3.7× the noise σ in the
    quietest fifth), which makes σ̂(x) flat, so the intervals over-cover where the noise is small and under-cover where
    it is large. Beyond m (above the typical calibration row) the excess counts at least in full, and λ is fitted in
    that same form: intervals keep widening off the data. λ is chosen from the calibration rows' targets, so their
    scores are no longer exactly exchangeable with a new row's: the marginal level holds up to a small deficit, measured
    by simulation in ``tests/test_conformal_epistemic.py`` (0.5 ± 0.2 point at 19 rows, none measurable at 100); a
    number (e.g. 1.0, the predictive as it is) keeps the exact guarantee.

    Parameters
    ----------
    conformity_score : ConformityScore, optional
        None: :class:`StdNormalizedResidual` for regression, ``LAC(never_empty=True)`` for classification.
    epistemic_weight : float or "fit", default="fit"
        λ ≥ 0, or "fit" (above). Regression only (classification ignores it). With λ ≠ 1 the predictive is asked
        for its parts (:meth:`~glas_sklearn.likelihoods.Likelihood.predictive_parts`); a likelihood with one part
        only (the homoscedastic Gaussian without ``include_noise``) keeps λ = 1 under "fit".

    Attributes
    ----------
    conformity_score_ : ConformityScore
        The score used.
    scores_ : ndarray
        The sorted calibration scores, (n,) or (n, M).
    epistemic_weight_ : ndarray of shape (M,) or None
        The λ per output the scores and intervals use; None: the predictive as it is (λ = 1, or classification).
    epistemic_cap_ : ndarray of shape (M,) or None
        The median σ_epi² of the calibration rows (internal units): beyond it the epistemic variance's excess
        counts with weight max(λ, 1) (:func:`weighted_moments`), so intervals keep widening off the data.
    (and those of :class:`~glas_sklearn.calibration.Calibrator`)

    Examples
    --------
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor
    >>> from glas_sklearn.calibration import ConformalCalibrator, StdNormalizedResidual
    >>> reg = LaplaceActiveSubspaceRegressor(calibration=ConformalCalibrator(StdNormalizedResidual()))
    >>> reg.get_params()["calibration__conformity_score"]
    StdNormalizedResidual()
    """

    chooses_dimension = False
    requires_fixed_predictor = True

    def __init__(self, conformity_score: ConformityScore | None = None, epistemic_weight="fit") -> None:
        self.conformity_score = conformity_score
        self.epistemic_weight = epistemic_weight

    def check_settings(self, likelihood: Likelihood | None = None) -> None:
        resolve_conformity_score(self.conformity_score, likelihood)
        _check_epistemic_weight(self.epistemic_weight)

    def rows_needed(self, confidence_levels) -> int:
        """⌈1/γ⌉ − 1: the calibration rows a finite conformal quantile needs at the highest level."""
        return _rows_for_finite_quantile(confidence_levels)

    def fit(self, posterior, X_cal, y_cal, *, n_components="auto", confidence_levels=0.9,
            predictive="linearized", n_samples=1000, noise_var=0.0, random_state=None,
            verbose=0, likelihood=None) -> ConformalCalibrator:
        d = posterior.max_components if isinstance(n_components, str) and n_components == "auto" else n_components
        result, prediction, target = _conformal_scores(
            posterior, X_cal, y_cal, d=d, confidence_level=confidence_levels,
            predictive=resolve_predictive(predictive), n_samples=n_samples, noise_var=noise_var,
            random_state=random_state, linearized_method="probit", batch_size=None,
            conformity_score=self.conformity_score, likelihood=likelihood, epistemic_weight=self.epistemic_weight)
        self.conformity_score_, self.scores_ = result.conformity_score, result.scores
        self.epistemic_weight_, self.epistemic_cap_ = result.epistemic_weight, result.epistemic_cap
        self.likelihood_ = resolve_calibration_likelihood(likelihood)
        self._store(result, n_components=result.n_components, sigma0=result.sigma0, table=result.table,
                    sample_seed=result.sample_seed, reached=None, predictive=resolve_predictive(predictive),
                    n_samples=n_samples,
                    noise_var=noise_var)
        self.table_ = self._fit_groups(prediction, target, confidence_levels, self.table_)
        return self

    def _resolve_score(self, likelihood: Likelihood | None) -> None:
        """``conformity_score_``: the one fitted, else ``conformity_score`` or ``likelihood``'s default."""
        if getattr(self, "conformity_score_", None) is None:
            self.conformity_score_ = resolve_conformity_score(self.conformity_score, likelihood)

    def _fit_groups(self, prediction, target, confidence_levels, table):
        """After the pooled scores: a subclass's use of the calibration rows' prediction and targets, returning the
        calibration's table (here: ``table`` as it is)."""
        return table

    def quantile(self, confidence_levels) -> np.ndarray:
        """Conformal quantiles of the stored scores at ``confidence_levels``; shape (k,) or (k, M)."""
        return conformal_quantile(self.scores_, confidence_levels)

    def std_scale(self, n_outputs: int) -> np.ndarray:
        """The root mean square of the calibration scores per output: regression scores are residuals over σ̂, so
        this is the Gaussian maximum-likelihood scale that turns σ̂ into a calibrated std (ones without scores)."""
        if self.scores_ is None:
            return super().std_scale(n_outputs)
        sc = np.asarray(self.scores_, dtype=np.float64).reshape(len(self.scores_), -1)
        return np.sqrt(np.mean(sc**2, axis=0))

    def report(self, n_rows: int, confidence_levels) -> str:
        """E.g. ": quantile 1.64 at 90 %", with the groups' own quantiles (:meth:`_groups_report`) and, where the
        rank is rounded up in one group, the coverage few rows give on average."""
        table = self.table_
        if "quantile" not in table or "level" not in table:
            return ""
        text = ": " + ", ".join(f"quantile {row.quantile:.3g} at {percent(row.level)}" for row in table.itertuples())
        groups, n_groups = self._groups_report(n_rows)
        text += groups
        if not self._interpolates() and n_groups == 1:  # interpolated: the level on average
            text += expected_coverage_note(n_rows, float(table["level"].iloc[0]))
        return text

    def _groups_report(self, n_rows: int) -> tuple[str, int]:
        """What the report says of the calibration's groups, and their number: one pooled group here."""
        return "", 1

    def _interpolates(self) -> bool:
        """Whether the quantiles interpolate between ranks (False: the rank rounded up, ≥ the level)."""
        return False

    def predictive_moments(self, posterior, X, *, batch_size=None) -> RegressionMoments:
        """ŷ and the σ̂ the scores were normalised by, on the rows ``X`` (the calibration's samples and weights)."""
        if self.epistemic_weight_ is None:
            return self.likelihood_.predictive_moments(posterior, X, self.n_components_, predictive=self.predictive_,
                                                       n_samples=self.n_samples_, noise_var=self.noise_var_,
                                                       random_state=self.sample_seed_, batch_size=batch_size)
        parts = self.likelihood_.predictive_parts(posterior, X, self.n_components_, predictive=self.predictive_,
                                                  n_samples=self.n_samples_, random_state=self.sample_seed_,
                                                  batch_size=batch_size)
        return weighted_moments(parts, self.noise_var_, self.epistemic_weight_, self.epistemic_cap_)

    def predict_interval(self, posterior, X, confidence_levels=None, *, batch_size=None):
        # the moments the calibration scores were computed from, on the calibration's samples
        moments = self.predictive_moments(posterior, X, batch_size=batch_size)
        bounds = None
        if confidence_levels is not None:
            bounds = self.conformity_score_.region(moments, self.quantile(confidence_levels))
        return moments.mean, moments.std, bounds

    def predict_set(self, probs, confidence_levels):
        return self.conformity_score_.region(probs, self.quantile(confidence_levels))
