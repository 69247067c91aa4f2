"""The split of the calibration rows off the training rows (``calibration_size``, stratified for classes)."""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from sklearn.model_selection import train_test_split

from ..calibration import ConformalWarning

__all__ = ["CalibrationRowsMixin"]


class CalibrationRowsMixin:
    """How many rows calibration holds out, and which, for
    ``LaplaceActiveSubspaceBase``."""

    def _split_off_calibration_rows(self, X, y, seed, sample_weight=None, positions=None):
        """``X, X_cal, y, y_cal, weights``: ``calibration_size`` rows held out of training (stratified for classes
        when possible); the training rows keep their weights (None stays None), the calibration rows are
        unweighted. Their positions in the user's ``X`` (``positions`` of these rows there, when rows of zero
        weight were dropped) are kept as ``train_indices_`` and ``calibration_indices_``."""
        n_cal = self._n_calibration_rows(X.shape[0], y if self.likelihood_.is_classification else None)
        stratify = y if self.likelihood_.is_classification and self._can_stratify(y, n_cal) else None
        train, cal = train_test_split(np.arange(X.shape[0]), test_size=n_cal, random_state=seed, stratify=stratify)
        at = np.arange(X.shape[0]) if positions is None else positions
        self.train_indices_, self.calibration_indices_ = at[train], at[cal]
        return X[train], X[cal], y[train], y[cal], None if sample_weight is None else sample_weight[train]

    def _calibration_rows_needed(self) -> int:
        """The calibration rows the calibrator needs at the estimator's levels ("conformal": ⌈1/γ⌉ − 1 at the
        highest level, for a finite quantile)."""
        return self._calibrator().rows_needed(self._levels(None))

    def _class_rows_needed(self) -> int:
        """The calibration rows every class needs (a class-conditional calibration of a classifier: ⌈1/γ⌉ − 1 at
        the highest level, for a finite class quantile); 0 where the rows are pooled."""
        if not self.likelihood_.is_classification:
            return 0
        return self._calibrator().class_rows_needed(self._levels(None))

    def _warn_few_calibration_rows(self, y_cal, seed: int) -> bool:
        """A ConformalWarning before training when the calibration rows ``y_cal`` are too few for a finite conformal
        quantile at the highest level, in all or (class-conditional calibration) in some class, counting the rows
        left for the quantile after those that tune σ0 (given ``X_cal`` or an integer ``calibration_size``, or
        few rows in all): there the intervals would be infinite or the sets hold the class always, which the user
        learns now rather than after the training. Whether it warned (the calibration then does not warn again)."""
        n_cal, need, level = len(y_cal), self._calibration_rows_needed(), max(self._levels(None))
        name = type(self).__name__
        fix = ("calibration rows (X_cal and y_cal, or a larger calibration_size), or lower confidence_level. "
               "Training goes on.")
        if n_cal < need:
            what = "prediction sets hold every class" if self.likelihood_.is_classification else \
                "intervals are infinite"
            warnings.warn(f"{name}.fit: {n_cal} calibration rows are too few for a conformal quantile at level {level} "
                          f"(it needs {need}); at that level the {what}. Pass at least {need} {fix}", ConformalWarning,
                          stacklevel=5)
            return True
        per_class = self._class_rows_needed()
        if per_class == 0:
            return False
        labels = np.asarray(y_cal)[self._conformal_part(y_cal, seed)]
        counts = np.bincount(labels, minlength=len(self.classes_))
        short = np.flatnonzero(counts < per_class)
        if short.size == 0:
            return False
        tuned = " (after the rows that tune sigma0)" if len(labels) < n_cal else ""
        labels_of = self.classes_.tolist()
        listed = ", ".join(f"{labels_of[c]!r}: {counts[c]}" for c in short)
        warnings.warn(f"{name}.fit: class-conditional calibration needs {per_class} calibration rows of every class "
                      f"for a quantile at level {level}, but {short.size} class(es) have fewer{tuned}: {listed}. "
                      f"Those classes would be in every prediction set at that level. Pass more {fix}",
                      ConformalWarning, stacklevel=5)
        return True

    def _n_calibration_rows(self, n: int, y=None) -> int:
        """Rows held out of the n training rows ``y`` for calibration (at least one, leaving at least two; with
        "conformal" and a fraction, at least the ⌈1/γ⌉ − 1 rows a finite quantile needs at the highest level; with
        a class-conditional calibration, as many as give the rarest class that many, where half the rows or fewer
        do)."""
        cs = self.calibration_size
        if isinstance(cs, numbers.Integral):
            if cs > n - 2:
                raise ValueError(f"{type(self).__name__}: calibration_size={cs} rows, but only {n} rows were passed; "
                                 f"hold out at most {n - 2} rows, give a fraction, or pass X_cal and y_cal.")
            return int(cs)
        n_cal = max(1, int(np.ceil(cs * n)))
        # enough rows for the calibrator (a finite conformal quantile at every level), and one more to tune σ0 on
        # with sigma0="nll"
        tuned = self._sigma0_choice() == "nll"
        n_cal = max(n_cal, self._calibration_rows_needed() + tuned)
        per_class = self._class_rows_needed()
        if per_class and y is not None:
            # a stratified split gives class c about n_cal · n_c / n rows (one more for rounding); σ0 tuning takes
            # half of them
            rarest = int(np.bincount(np.asarray(y)).min(initial=n) or 1)
            rows = (2 * per_class + 1 if tuned else per_class) + 1
            wanted = int(np.ceil(rows * n / rarest))
            if wanted <= n // 2:  # else the rarest class is too rare for it: the share stays, fit warns
                n_cal = max(n_cal, wanted)
        return int(min(n_cal, n - 2))

    @staticmethod
    def _can_stratify(y, n_cal: int) -> bool:
        """A stratified split needs two rows of every class and room for every class on both sides."""
        _, counts = np.unique(y, return_counts=True)
        return counts.min() >= 2 and len(counts) <= min(n_cal, len(y) - n_cal)
