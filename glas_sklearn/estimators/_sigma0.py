"""The estimators' σ0 policy: what ``sigma0=`` means for a posterior kind and a calibrator, and ``sigma0="nll"``
(σ0 tuned by held-out NLL on part of the calibration rows, the rest kept for the conformal scores)."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from ..calibration import tune_sigma0
from ._report import sigma0_line

__all__ = ["Sigma0PolicyMixin"]

logger = logging.getLogger("glas_sklearn.estimators._base")

# Offset of the seed of the sigma0="nll" tuning / conformal split from the calibration split's seed.
_SIGMA0_SPLIT = 7919


class Sigma0PolicyMixin:
    """σ0 settings resolved and ``sigma0="nll"`` tuned, for ``LaplaceActiveSubspaceBase``
    (which provides the parameters, the posterior, the calibrator and the levels)."""

    def _tune_sigma0(self, Xc, yc, d: int, seed: int):
        """sigma0="nll": split the calibration rows into a tuning part that chooses σ0 by its mean predictive NLL
        (over [0, σ0_EB], :func:`~glas_sklearn.calibration.tune_sigma0`) and a conformal part, returned, that
        the scores are computed on; the posterior's σ0 is then fixed at the chosen value. With too few rows for
        both parts, "auto" keeps the full-space EB σ0 and an explicit "nll" raises."""
        n, n_need = len(Xc), self._calibration_rows_needed()
        if not self._check_sigma0_rows(n):
            logger.info("%s: %d calibration rows are too few to tune sigma0 on some of them (%d needed); keeping the "
                        "full-space empirical Bayes sigma0", type(self).__name__, n, n_need + 1)
            return Xc, yc
        tune, conf = self._sigma0_split(yc, n, n_need, seed)
        index = torch.as_tensor(tune, device=Xc.device)
        t0 = time.perf_counter()
        search = self._sigma0_search(Xc[index], yc[index], d, seed)
        self.posterior_.set_sigma0(search.sigma0)
        self.sigma0_search_, self.sigma0_rows_ = search, tune
        self._report(sigma0_line(self, len(tune), time.perf_counter() - t0))
        index = torch.as_tensor(conf, device=Xc.device)
        return Xc[index], yc[index]

    def _check_sigma0_rows(self, n: int) -> bool:
        """Whether n calibration rows leave one or more to tune σ0 on besides the conformal quantile's; an explicit
        sigma0="nll" with fewer raises (``fit`` asks as soon as it knows n, before training)."""
        n_need = self._calibration_rows_needed()
        if n >= n_need + 1:
            return True
        if isinstance(self.sigma0, str) and self.sigma0 == "nll":
            raise ValueError(f"{type(self).__name__}: sigma0='nll' needs at least {n_need + 1} calibration rows "
                             f"(one or more to choose σ0 on, and the {n_need} a conformal quantile needs at level "
                             f"{max(self._levels(None))}), got {n}; pass more calibration rows or a fixed sigma0.")
        return False

    def _sigma0_search(self, Xt, yt, d: int, seed: int):
        """σ0 by the mean predictive NLL of the tuning rows (a Sigma0Result)."""
        return tune_sigma0(self.posterior_, Xt, yt, d=d, predictive=self.predictive_,
                           n_samples=self.n_samples, noise_var=self._interval_noise_var(), random_state=seed,
                           likelihood=self.likelihood_)

    def _sigma0_split(self, yc, n: int, n_need: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Sorted indices of the tuning and conformal rows among the n calibration rows (targets ``yc``, a tensor or
        array): half each, the conformal part at least the n_need rows of a finite conformal quantile (and the
        tuning part at least one row); stratified by class where every class has two rows and fits on both sides;
        seeded from ``seed``."""
        n_conf = min(n - 1, max(int(np.ceil(n / 2)), n_need))
        labels = None
        if self.likelihood_.is_classification:
            labels = np.asarray(yc.detach().cpu() if isinstance(yc, torch.Tensor) else yc)
        stratify = labels if labels is not None and self._can_stratify(labels, n - n_conf) else None
        tune, conf = train_test_split(np.arange(n), test_size=n_conf, random_state=(seed + _SIGMA0_SPLIT) % 2**31,
                                      stratify=stratify)
        return np.sort(tune), np.sort(conf)

    def _conformal_part(self, y_cal, seed: int) -> np.ndarray:
        """Indices of the calibration rows (targets ``y_cal``, class indices for a classifier) that the conformal
        scores will be computed on: all of them, or those left after the rows that tune σ0 (as
        :meth:`_tune_sigma0` will split them)."""
        n = len(y_cal)
        if self._sigma0_choice() != "nll" or not self._check_sigma0_rows(n):
            return np.arange(n)
        return self._sigma0_split(y_cal, n, self._calibration_rows_needed(), seed)[1]

    def _check_sigma0_setting(self) -> None:
        if self.sigma0 == "nll" and not self._calibrator().requires_fixed_predictor:
            raise ValueError(f"{type(self).__name__}: sigma0='nll' tunes σ0 on part of the calibration rows for "
                             f"calibration='conformal'; with calibration={self.calibration!r} (the paper) σ0 is "
                             "empirical Bayes at every d: use sigma0='auto', 'eb_subspace', 'eb_full' or a float.")

    def _auto_low_rank_sigma0(self) -> str:
        """What sigma0="auto" means for the low-rank posteriors (each estimator's choice, see its override)."""
        return "eb_full"

    def _sigma0_choice(self):
        """``sigma0`` with "auto" resolved for the kinds with variance off the subspace (the estimator's per-task
        choice); for the others "auto" is left to the kind (its ``default_sigma0``)."""
        if self.sigma0 == "auto" and self._posterior_kind().off_subspace:
            return self._auto_low_rank_sigma0()
        return self.sigma0

    def _resolved_sigma0(self):
        """The posterior's σ0 setting: the choice, with "nll" starting from the full-space EB value (the top of
        its search range)."""
        choice = self._sigma0_choice()
        return "eb_full" if choice == "nll" else choice
