"""The calibration in fit: the predictive mode and the calibrator resolved, σ0 tuned first where the policy says so,
the calibrator fitted on the calibration rows (d chosen, or fixed), and the fitted attributes it leaves
(``calibrator_``, ``n_components_``, ``calibration_``, ``sigma0_``, the samples' seed...)."""

from __future__ import annotations

import time

import numpy as np

from ..calibration import Calibrator, resolve_calibration
from ..predictive import PredictiveMode, resolve_predictive
from ._report import calibration_line

__all__ = ["CalibrationFitMixin"]


class CalibrationFitMixin:
    """d and the calibrator fitted, for ``LaplaceActiveSubspaceBase`` (which provides the parameters,
    ``posterior_``, ``likelihood_``, the σ0 policy, the levels and the units hooks)."""

    def _choose_dimension(self, Xc, yc, seed: int) -> None:
        """d on the calibration rows by the calibrator: the smallest reaching the first level ("auto" under
        "coverage"), or the given one (its coverage recorded, not judged); with a calibrator that needs a fixed
        predictor ("conformal") d is fixed (given, or max_components) and σ0 may be tuned on part of the rows
        first. σ0 at d, and the posterior samples' seed that predictions reuse."""
        t0 = time.perf_counter()
        self.predictive_ = self._resolved_predictive()
        self.sigma0_search_, self.sigma0_rows_ = None, np.zeros(0, dtype=np.int64)
        calibrator = self._calibrator()
        d = self.n_components
        if d == "auto" and not calibrator.chooses_dimension:  # fixed before the calibration rows are seen
            d = self.posterior_.max_components
        if self._sigma0_choice() == "nll":
            Xc, yc = self._tune_sigma0(Xc, yc, d, seed)
        self.calibrator_ = calibrator.fit(
            self.posterior_, Xc, yc, n_components=d, confidence_levels=self._levels(None),
            predictive=self.predictive_, n_samples=self.n_samples, noise_var=self._interval_noise_var(),
            random_state=seed, verbose=self.verbose, likelihood=self.likelihood_)
        if self.likelihood_.is_classification:  # the labels a calibrator's warnings name classes by
            self.calibrator_.class_labels_ = self.classes_.tolist()
        self.conformity_scores_ = self.calibrator_.scores_
        self.calibration_reached_ = self.calibrator_.reached_
        self._store_calibration(self.calibrator_, Xc, seed, t0)

    def _calibrator(self) -> Calibrator:
        """``calibration`` as an unfitted calibrator object (the estimator's parameter is never fitted itself)."""
        return resolve_calibration(self.calibration)

    def _store_calibration(self, calibrator, Xc, seed: int, t0: float) -> None:
        self.timings_["calibration"] = time.perf_counter() - t0
        self.n_components_ = int(calibrator.n_components_)
        self.calibration_ = self._table_in_user_units(calibrator.table_.reset_index(drop=True))
        # Predictions draw the posterior samples (in weight space, shared by all rows) that the calibration saw.
        self.calibration_seed_ = seed
        self._sample_seed_ = int(calibrator.sample_seed_)
        self.sigma0_ = float(self.posterior_.fit_sigma0(self.n_components_))
        self.n_calibration_rows_ = int(len(Xc))
        self.n_sigma0_rows_ = int(len(self.sigma0_rows_))
        self._report(calibration_line(self, self.timings_["calibration"]))

    def _resolved_predictive(self) -> PredictiveMode:
        """``predictive`` with "auto" resolved: the kind's ``default_predictive`` (linearised for the low-rank
        posteriors, sampled for the subspace)."""
        if self.predictive != "auto":
            return resolve_predictive(self.predictive)
        return resolve_predictive(self._posterior_kind().default_predictive)
