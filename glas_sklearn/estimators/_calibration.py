"""The calibration component of the estimators: the calibrator with the rows it needs (how many are held out of
``X``, the split, the warning when they are too few), the σ0 policy (``sigma0="nll"`` tunes σ0 on part of the
calibration rows), and :meth:`CalibrationPlan.fit`, which fits the calibrator on the calibration rows (d chosen,
or fixed) and returns a :class:`FittedCalibration` with its report line."""

from __future__ import annotations

import logging
import numbers
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from .._checks import can_stratify
from .._silenced import silenced
from .._warnings import warn
from ..calibration import Calibrator, ConformalWarning, resolve_calibration, tune_sigma0

__all__ = ["CalibrationPlan", "FittedCalibration"]

logger = logging.getLogger("glas_sklearn.estimators")

# Offset of the seed of the sigma0="nll" tuning / conformal split from the calibration split's seed.
_SIGMA0_SPLIT = 7919


@dataclass
class FittedCalibration:
    """What :meth:`CalibrationPlan.fit` returns: the fitted calibrator and what the estimator reports of it."""

    calibrator: Calibrator
    n_components: int
    sample_seed: int
    sigma0: float
    n_rows: int
    sigma0_rows: np.ndarray
    sigma0_search: object | None
    seconds: float
    lines: list[str] = field(default_factory=list)


    def attributes(self, targets) -> dict:
        """The estimators' fitted attributes of the calibration step (the table in the units of y, by ``targets``)."""
        cal = self.calibrator
        return {"calibrator_": cal, "conformity_scores_": cal.scores_, "calibration_reached_": cal.reached_,
                "n_components_": self.n_components, "sigma0_": self.sigma0,
                "calibration_": targets.table_in_user_units(cal.table_.reset_index(drop=True)),
                "_sample_seed_": self.sample_seed, "sigma0_search_": self.sigma0_search,
                "sigma0_rows_": self.sigma0_rows, "n_calibration_rows_": self.n_rows,
                "n_sigma0_rows_": int(len(self.sigma0_rows))}


@dataclass
class CalibrationPlan:
    """The calibration of one fit, resolved before training: the unfitted calibrator, the levels (the first the
    target), the σ0 choice ("nll", "eb_subspace", "eb_full", "auto" left to the kind, or a float) and whether
    the targets are class labels. ``owner`` names the estimator in messages."""

    calibrator: Calibrator
    levels: list[float]
    sigma0_choice: object
    classification: bool
    owner: str
    explicit_nll: bool = False

    @classmethod
    def resolve(cls, calibration, levels, sigma0, likelihood, *, off_subspace: bool, auto_low_rank_sigma0,
                owner: str) -> CalibrationPlan:
        """The plan for the estimator's ``calibration`` and ``sigma0`` settings: "auto" σ0 resolved for the kinds
        with variance off the subspace by the estimator's per-task ``auto_low_rank_sigma0(calibrator)``; the
        settings checked together."""
        calibrator = resolve_calibration(calibration)
        calibrator.check_settings(likelihood)
        choice = sigma0
        if isinstance(sigma0, str) and sigma0 == "auto" and off_subspace:
            choice = auto_low_rank_sigma0(calibrator)
        if isinstance(sigma0, str) and sigma0 == "nll" and not calibrator.requires_fixed_predictor:
            raise ValueError(f"{owner}: sigma0='nll' tunes σ0 on part of the calibration rows for "
                             f"calibration='conformal'; with calibration={calibration!r} (the paper) σ0 is "
                             "empirical Bayes at every d: use sigma0='auto', 'eb_subspace', 'eb_full' or a float.")
        explicit = isinstance(sigma0, str) and sigma0 == "nll"
        return cls(calibrator, levels, choice, likelihood.is_classification, owner, explicit)

    @property
    def tunes_sigma0(self) -> bool:
        return isinstance(self.sigma0_choice, str) and self.sigma0_choice == "nll"

    @property
    def posterior_sigma0(self):
        """The posterior's σ0 setting: the choice, with "nll" starting from the full-space EB value (the top of
        its search range)."""
        return "eb_full" if self.tunes_sigma0 else self.sigma0_choice

    # ------------------------------------------------------------------------------- the rows it needs
    def rows_needed(self) -> int:
        """The calibration rows the calibrator needs at the levels ("conformal": ⌈1/γ⌉ − 1 at the highest)."""
        return self.calibrator.rows_needed(self.levels)

    def class_rows_needed(self) -> int:
        """The calibration rows every class needs (class-conditional calibration); 0 where rows are pooled."""
        return self.calibrator.class_rows_needed(self.levels) if self.classification else 0

    def n_calibration_rows(self, n: int, calibration_size, y=None) -> int:
        """Rows held out of the n training rows ``y`` for calibration (at least one, leaving at least two; with
        a conformal calibration and a fraction, at least the ⌈1/γ⌉ − 1 rows a finite quantile needs at the highest
        level; with a class-conditional calibration, as many as give the rarest class that many, where half the
        rows or fewer do)."""
        cs = calibration_size
        if isinstance(cs, numbers.Integral):
            if cs > n - 2:
                raise ValueError(f"{self.owner}: calibration_size={cs} rows, but only {n} rows were passed; hold out "
                                 f"at most {n - 2} rows, give a fraction, or pass X_cal and y_cal.")
            return int(cs)
        n_cal = max(1, int(np.ceil(cs * n)))
        tuned = self.tunes_sigma0  # one more row to tune σ0 on
        n_cal = max(n_cal, self.rows_needed() + tuned)
        per_class = self.class_rows_needed()
        if per_class and y is not None:
            # a stratified split gives class c about n_cal · n_c / n rows (one more for rounding); σ0 tuning takes
            # half of them
            rarest = int(np.bincount(np.asarray(y)).min(initial=n) or 1)
            rows = (2 * per_class + 1 if tuned else per_class) + 1
            wanted = int(np.ceil(rows * n / rarest))
            if wanted <= n // 2:  # else the rarest class is too rare for it: the share stays, fit warns
                n_cal = max(n_cal, wanted)
        return int(min(n_cal, n - 2))

    def split(self, n: int, y, calibration_size, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the training and calibration rows among n rows (stratified for classes when possible)."""
        labels = y if self.classification else None
        n_cal = self.n_calibration_rows(n, calibration_size, labels)
        stratify = y if self.classification and can_stratify(y, n_cal) else None
        return train_test_split(np.arange(n), test_size=n_cal, random_state=seed, stratify=stratify)

    def check_sigma0_rows(self, n: int) -> bool:
        """Whether n calibration rows leave one or more to tune σ0 on besides the conformal quantile's; an explicit
        sigma0="nll" with fewer raises (``fit`` asks as soon as it knows n, before training)."""
        n_need = self.rows_needed()
        if n >= n_need + 1:
            return True
        if self.explicit_nll:
            raise ValueError(f"{self.owner}: sigma0='nll' needs at least {n_need + 1} calibration rows (one or more to "
                             f"choose σ0 on, and the {n_need} a conformal quantile needs at level {max(self.levels)}), "
                             f"got {n}; pass more calibration rows or a fixed sigma0.")
        return False

    def sigma0_split(self, yc, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Sorted indices of the tuning and conformal rows among the n calibration rows (targets ``yc``, a tensor or
        array): half each, the conformal part at least the rows of a finite conformal quantile (and the tuning
        part at least one row); stratified by class where possible; seeded from ``seed``."""
        n_conf = min(n - 1, max(int(np.ceil(n / 2)), self.rows_needed()))
        labels = None
        if self.classification:
            labels = np.asarray(yc.detach().cpu() if isinstance(yc, torch.Tensor) else yc)
        stratify = labels if labels is not None and can_stratify(labels, n - n_conf) else None
        tune, conf = train_test_split(np.arange(n), test_size=n_conf, random_state=(seed + _SIGMA0_SPLIT) % 2**31,
                                      stratify=stratify)
        return np.sort(tune), np.sort(conf)

    def conformal_part(self, y_cal, seed: int) -> np.ndarray:
        """Indices of the calibration rows the conformal scores will be computed on: all of them, or those left
        after the rows that tune σ0."""
        n = len(y_cal)
        if not self.tunes_sigma0 or not self.check_sigma0_rows(n):
            return np.arange(n)
        return self.sigma0_split(y_cal, n, seed)[1]

    def warn_few_rows(self, y_cal, seed: int, class_labels=None) -> bool:
        """A ConformalWarning before training when the calibration rows ``y_cal`` are too few for a finite
        conformal quantile at the highest level, in all or (class-conditional calibration) in some class, counting
        the rows left after those that tune σ0. Whether it warned (the calibration then does not warn again)."""
        n_cal, need, level = len(y_cal), self.rows_needed(), max(self.levels)
        fix = ("calibration rows (X_cal and y_cal, or a larger calibration_size), or lower confidence_level. "
               "Training goes on.")
        if n_cal < need:
            what = "prediction sets hold every class" if self.classification else "intervals are infinite"
            warn(f"{self.owner}.fit: {n_cal} calibration rows are too few for a conformal quantile at level "
                 f"{level} (it needs {need}); at that level the {what}. Pass at least {need} {fix}",
                 ConformalWarning)
            return True
        per_class = self.class_rows_needed()
        if per_class == 0:
            return False
        labels = np.asarray(y_cal)[self.conformal_part(y_cal, seed)]
        counts = np.bincount(labels, minlength=len(class_labels))
        short = np.flatnonzero(counts < per_class)
        if short.size == 0:
            return False
        tuned = " (after the rows that tune sigma0)" if len(labels) < n_cal else ""
        listed = ", ".join(f"{class_labels[c]!r}: {counts[c]}" for c in short)
        warn(f"{self.owner}.fit: class-conditional calibration needs {per_class} calibration rows of every "
             f"class for a quantile at level {level}, but {short.size} class(es) have fewer{tuned}: "
             f"{listed}. Those classes would be in every prediction set at that level. Pass more {fix}",
             ConformalWarning)
        return True

    # ------------------------------------------------------------------------------------------- the fit
    def fit(self, posterior, Xc, yc, *, n_components, predictive, n_samples: int, noise_var, seed: int,
            likelihood, verbose: int = 0, class_labels=None, warned: bool = False,
            sigma0_rule: str = "lowest") -> FittedCalibration:
        """d on the calibration rows by the calibrator: the smallest reaching the first level ("auto" under
        "coverage"), or the given one; with a calibrator that needs a fixed predictor d is fixed (given, or
        ``max_components``) and σ0 may be tuned on part of the rows first (by :func:`tune_sigma0` under
        ``sigma0_rule``). ``warned``: the few-rows warning was given before training (not repeated)."""
        t0 = time.perf_counter()
        calibrator = resolve_calibration(self.calibrator)  # a fresh one for every fit
        lines, search, sigma0_rows = [], None, np.zeros(0, dtype=np.int64)
        d = n_components
        if d == "auto" and not calibrator.chooses_dimension:  # fixed before the calibration rows are seen
            d = posterior.max_components
        if self.tunes_sigma0:
            if self.check_sigma0_rows(len(Xc)):
                sigma0_rows, conf = self.sigma0_split(yc, len(Xc), seed)
                t1 = time.perf_counter()
                index = torch.as_tensor(sigma0_rows, device=Xc.device)
                search = tune_sigma0(posterior, Xc[index], yc[index], d=d, predictive=predictive, n_samples=n_samples,
                                     noise_var=noise_var, random_state=seed, likelihood=likelihood,
                                     rule=sigma0_rule)
                posterior.set_sigma0(search.sigma0)
                lowest = "" if search.sigma0_lowest == search.sigma0 else \
                    f", the smallest within one standard error of the lowest at {search.sigma0_lowest:.4g}"
                lines.append(f"sigma0: {search.sigma0:.4g} chosen by the predictive NLL of {len(sigma0_rows)} "
                             f"calibration rows{lowest} (full-space empirical Bayes {search.sigma0_upper:.4g}), "
                             f"{time.perf_counter() - t1:.1f} s")
                index = torch.as_tensor(conf, device=Xc.device)
                Xc, yc = Xc[index], yc[index]
            else:
                logger.info("%s: %d calibration rows are too few to tune sigma0 on some of them (%d needed); keeping "
                            "the full-space empirical Bayes sigma0", self.owner, len(Xc), self.rows_needed() + 1)
        with silenced(*(("few_calibration_rows",) if warned else ())):  # said once, before training
            calibrator.fit(posterior, Xc, yc, n_components=d, confidence_levels=self.levels, predictive=predictive,
                           n_samples=n_samples, noise_var=noise_var, random_state=seed, verbose=verbose,
                           likelihood=likelihood)
        if class_labels is not None:  # the labels a calibrator's warnings name classes by
            calibrator.class_labels_ = list(class_labels)
        n_comp = int(calibrator.n_components_)
        return FittedCalibration(calibrator, n_comp, int(calibrator.sample_seed_),
                                 float(posterior.fit_sigma0(n_comp)), int(len(Xc)), sigma0_rows, search,
                                 time.perf_counter() - t0, lines)


# ------------------------------------------------------------------------------------------ the report line
def calibration_name(calibration) -> str:
    return calibration if isinstance(calibration, str) else type(calibration).__name__


def calibration_line(name: str, fitted: FittedCalibration, levels) -> str:
    """E.g. "calibration: conformal at d = 50 on 78 rows, 0.4 s: quantile 1.64 at 90 %" or "calibration:
    coverage at d = 12 on 78 rows, 0.9 s: coverage 0.91 of the 90 % target (reached)": what follows the rows
    and the time is the calibrator's own :meth:`~glas_sklearn.calibration.Calibrator.report`."""
    text = f"calibration: {name} at d = {fitted.n_components} on {fitted.n_rows} rows, {fitted.seconds:.1f} s"
    return text + fitted.calibrator.report(fitted.n_rows, levels)
