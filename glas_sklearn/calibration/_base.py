"""What every calibration method shares: the :class:`Calibrator` protocol and the checks of calibration targets."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
from sklearn.base import BaseEstimator

from ..likelihoods import Gaussian, Likelihood, match_regression

__all__ = ["Calibrator", "check_targets", "match_regression", "percent", "resolve_calibration_likelihood"]


class Calibrator(BaseEstimator, ABC):
    """A way to calibrate a posterior's intervals or sets on held-out rows (the estimators' ``calibration=``).

    Its constructor only stores hyperparameters (``get_params`` / ``clone`` work as for any scikit-learn
    estimator); :meth:`fit` calibrates a fitted posterior on calibration rows and sets the fitted attributes
    below; the predict methods then turn the posterior's predictive into intervals or sets.

    Class attributes (what the estimators ask instead of comparing names):

    - ``chooses_dimension``: the calibration evaluates coverage over the subspace dimension d and picks d
      (``n_components="auto"`` searches; its table has one row per d evaluated, the curve
      :class:`~glas_sklearn.plotting.CoverageDisplay` draws). False: d is fixed before the calibration rows
      are seen (``n_components="auto"`` means every eigenpair computed).
    - ``requires_fixed_predictor``: the calibration's guarantee needs everything about the predictor (network,
      σ0, β, σ², d, sample seed) fixed before the calibration rows are seen: σ is then not estimated from
      those rows, and σ0 may be tuned only on a disjoint part of them (``sigma0="nll"``).

    Attributes
    ----------
    n_components_ : int
        The subspace dimension d the calibration settled on.
    sigma0_ : float
        The prior standard deviation at d during calibration.
    table_ : pandas.DataFrame
        The calibration's table (internal units).
    sample_seed_ : int
        The seed of the posterior samples behind the calibration; predictions reuse it.
    reached_ : bool or None
        Whether the target coverage was reached (None where it is not judged).
    result_ : object
        The full result of the calibration function.
    scores_ : ndarray or None
        The sorted calibration scores of a conformal calibration; None otherwise.
    predictive_, n_samples_, noise_var_ :
        The predictive settings calibrated with (and predicted with).
    likelihood_ : Likelihood
        The likelihood whose predictive of y was calibrated (the Gaussian's when none was given).
    """

    chooses_dimension: bool = False
    requires_fixed_predictor: bool = False
    scores_ = None

    def rows_needed(self, confidence_levels) -> int:
        """The fewest calibration rows the calibration needs at ``confidence_levels``."""
        return 1

    def class_rows_needed(self, confidence_levels) -> int:
        """The fewest calibration rows of each class a classification calibration needs at ``confidence_levels``
        (0: none, the rows are pooled; a class-conditional calibration needs its quantile's rows in every class)."""
        return 0

    def check_settings(self, likelihood: Likelihood | None = None) -> None:
        """Raise a ValueError for a hyperparameter out of range (or one that does not suit ``likelihood``); the
        estimators call it before they train anything."""

    @abstractmethod
    def fit(self, posterior, X_cal: torch.Tensor, y_cal, *, n_components="auto",
            confidence_levels=0.9, predictive="sampled", n_samples: int = 1000, noise_var=0.0,
            random_state=None, verbose: int = 0, likelihood: Likelihood | None = None) -> Calibrator:
        """Calibrate ``posterior`` on ``(X_cal, y_cal)`` (internal units, on the posterior's device).

        ``n_components`` is "auto" (the method's choice of d) or a given d; ``confidence_levels`` lists the
        levels, the first being the target; the rest are the predictive's settings (as in
        :func:`~glas_sklearn.calibration.choose_dimension`), kept for prediction. ``likelihood`` is the
        likelihood whose predictive of y is calibrated (it answers the calibration's questions: its predictive,
        regions, targets; None: the Gaussian's, :func:`resolve_calibration_likelihood`), kept for prediction too.
        Returns ``self``.
        """

    @abstractmethod
    def predict_interval(self, posterior, X: torch.Tensor, confidence_levels=None, *,
                         batch_size: int | None = None):
        """``(mean, std, bounds)`` of the regression predictive on the rows ``X``, as calibrated:
        tensors of shape (n, M), (n, M) and (n, M, 2, k) (bounds None without ``confidence_levels``)."""

    @abstractmethod
    def predict_set(self, probs: torch.Tensor, confidence_levels):
        """Prediction sets, bool of shape (n, C, k), from the class probabilities (n, C) at d."""

    def report(self, n_rows: int, confidence_levels) -> str:
        """What the estimators' log line says of this calibration on ``n_rows`` rows at ``confidence_levels`` (the
        first the target), after "calibration: <name> at d = <d> on <n> rows, <t> s", e.g. ": coverage 0.912 of the
        90 % target (reached)"; "" adds nothing."""
        return ""

    def std_scale(self, n_outputs: int) -> np.ndarray:
        """Per output, the factor that turns the predictive's std into the calibrated std the regressor's
        ``predict(return_std=True)`` returns (its ``std_scale_``): ones, the predictive's own std."""
        return np.ones(n_outputs)

    def _store(self, result, *, n_components: int, sigma0: float, table, sample_seed: int, reached, predictive: str,
               n_samples: int, noise_var) -> None:
        self.result_ = result
        self.n_components_, self.sigma0_, self.table_ = int(n_components), float(sigma0), table
        self.sample_seed_, self.reached_ = int(sample_seed), reached
        self.predictive_, self.n_samples_, self.noise_var_ = predictive, int(n_samples), noise_var


def percent(level: float) -> str:
    """0.9 → "90 %", as the log lines write levels."""
    return f"{100 * float(level):g} %"


def check_targets(y, likelihood: Likelihood, n: int, device: torch.device) -> torch.Tensor:
    """Calibration targets as a tensor on ``device`` with n rows, checked by the likelihood
    (:meth:`~glas_sklearn.likelihoods.Likelihood.check_targets`: numeric and finite for regression)."""
    if isinstance(y, torch.Tensor):
        t = y.detach().to(device)
    else:
        try:
            t = torch.as_tensor(np.asarray(y), device=device)
        except (TypeError, ValueError) as err:
            raise TypeError(f"y_cal must be a torch.Tensor or numeric array, got {type(y).__name__}.") from err
    if t.ndim < 1 or t.shape[0] != n:
        raise ValueError(f"X_cal has {n} rows but y_cal has shape {tuple(t.shape)}; they must match.")
    return likelihood.check_targets(t)


def resolve_calibration_likelihood(likelihood: Likelihood | None) -> Likelihood:
    """The likelihood whose predictive a calibration asks: the given one, or for None the Gaussian's
    (the posterior moments of f, with the noise variance added)."""
    if likelihood is None:
        return Gaussian()
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"likelihood must be None or a glas_sklearn.likelihoods.Likelihood (e.g. Gaussian() or "
                        f"Categorical()), got {type(likelihood).__name__}.")
    return likelihood
