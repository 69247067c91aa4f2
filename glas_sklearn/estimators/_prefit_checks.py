"""What the estimators check about a prefit network and its rows: fit needs unseen calibration rows and records
X as the network's training rows (:data:`~glas_sklearn.estimators._prefit.REGISTRY`), rows declared so are warned
about wherever unseen rows are needed, and a network predicting its training rows no better than a constant is
warned about."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from .._functional import model_outputs
from ._prefit import (
    REGISTRY,
    PrefitLeakageWarning,
    PrefitUnderfitWarning,
    check_rows,
    module_fingerprint,
    no_better_than_a_constant,
    row_digests,
    user_stacklevel,
)

__all__ = ["PrefitChecksMixin"]

# Test coverage of 90 % intervals of an overfitting prefit network calibrated on rows held out of its training
# rows, and on unseen rows (docs/benchmarks/studies.md#prefit-calibration, default settings, mean (range) over
# 5 seeds).
_SEEN_COVERAGE, _UNSEEN_COVERAGE = "59 % (52–63 %)", "90 %"


def _prefit_needs_calibration_rows(name: str, classification: bool) -> str:
    """The refusal of a prefit fit without X_cal: what is missing, why (with the measured effect), how to fix it."""
    what = "prediction sets" if classification else "intervals"
    return (f"{name}: prefit=True needs calibration rows that the network was not trained on; pass them as "
            f"fit(X, y, X_cal=..., y_cal=...). With prefit=True the rows of X are taken to be the network's "
            f"training rows, so rows held out of them (calibration_size) would have training residuals, smaller "
            f"than on new rows, and the calibrated {what} would under-cover: on concrete an overfitting "
            f"8-256-256-1 network's 90 % intervals covered {_SEEN_COVERAGE} of new rows calibrated that way, "
            f"{_UNSEEN_COVERAGE} with unseen X_cal (docs/benchmarks/studies.md#prefit-calibration). Hold rows out "
            "before training the network (e.g. with sklearn.model_selection.train_test_split) and pass them as "
            "X_cal, y_cal; X stays the network's training rows (the curvature is built on them).")


class PrefitChecksMixin:
    """The prefit checks and registry calls of ``LaplaceActiveSubspaceBase`` (which provides ``likelihood_``
    and sets ``_prefit_fingerprint`` to None at the start of every fit)."""

    def _declare_prefit_training_rows(self, module: nn.Module, X: np.ndarray, X_cal: np.ndarray | None) -> None:
        """Prefit: the rows of X are the network's training rows, so calibration needs unseen ``X_cal`` (refused
        without it). The rows are recorded as the network's training rows (see ``_prefit.REGISTRY``); X_cal rows
        among them are warned about."""
        if X_cal is None:
            raise ValueError(_prefit_needs_calibration_rows(type(self).__name__, self.likelihood_.is_classification))
        self._prefit_fingerprint = module_fingerprint(module)
        REGISTRY.declare(self._prefit_fingerprint, row_digests(X))
        seen = REGISTRY.reused(self._prefit_fingerprint, row_digests(X_cal))
        if seen:
            warnings.warn(f"{type(self).__name__}.fit: {seen} of the {len(X_cal)} X_cal rows are rows "
                          "declared as training rows of this prefit network (rows of X in this or an earlier fit "
                          "with the same weights). Their residuals are training residuals, so the calibrated "
                          "intervals or sets will under-cover new rows; pass as X_cal only rows the network was not "
                          "trained on.", PrefitLeakageWarning, stacklevel=user_stacklevel())

    def _warn_if_prefit_training_rows(self, X: np.ndarray, method: str) -> None:
        """Warn (:class:`PrefitLeakageWarning`) when validated rows ``X`` passed to ``method`` were declared as
        training rows of this estimator's prefit network."""
        fingerprint = getattr(self, "_prefit_fingerprint", None)
        if fingerprint is None:
            return
        seen = REGISTRY.reused(fingerprint, row_digests(X))
        if seen:
            warnings.warn(
                f"{type(self).__name__}.{method}: {seen} of the {len(X)} rows were declared as training "
                "rows of this prefit network (rows of X in a fit with prefit=True and the same weights). The network "
                "was trained on them, so its errors there are smaller than on new rows, and coverage or scores "
                "measured on them overstate what new rows get. This happens when a prefit network is "
                "cross-validated (GridSearchCV, cross_validate): every test fold was training data of the one "
                "network. Evaluate on rows held out before the network was trained.",
                PrefitLeakageWarning, stacklevel=user_stacklevel())


    def _warn_if_prefit_underfits(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor) -> None:
        """A :class:`PrefitUnderfitWarning` when the prefit network predicts its training rows (those of X, at
        most 2048 of them evenly spaced) no better than a constant."""
        rows = check_rows(Xt.shape[0]).to(Xt.device)
        finding = no_better_than_a_constant(self.likelihood_, model_outputs(module, Xt[rows], batch_size=256),
                                            yt[rows])
        if finding:
            warnings.warn(f"{type(self).__name__}.fit: the prefit network predicts its training rows (the rows of X) "
                          f"no better than a constant: {finding}. prefit=True uses the network as it is; check that it "
                          "was trained and its trained weights loaded, on these targets in these units (y is not "
                          "standardised for a prefit network), and that X holds the rows it was trained on.",
                          PrefitUnderfitWarning, stacklevel=user_stacklevel())
