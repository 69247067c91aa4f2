"""The hyperparameters the two estimators share: the forms each may take (``PARAMETER_CONSTRAINTS``, checked at
fit by :func:`~glas_sklearn.estimators._validation.validate_hyperparameters`; their documentation is in _docs.py),
and the confidence levels checked."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from .._checks import check_confidence_levels
from ..calibration import CALIBRATIONS, Calibrator
from ..posterior import POSTERIOR_KINDS, ActiveSubspacePosterior
from ._training import OPTIMIZERS
from ._validation import BOOLEAN, NO_VALIDATION, InstanceOf, Interval, Options, Satisfies

__all__ = ["DTYPES", "PARAMETER_CONSTRAINTS", "check_level_list"]

#: The ``dtype`` names → torch dtypes.
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def check_level_list(confidence_level) -> list[float]:
    """``confidence_level`` (a number or a non-empty list of numbers strictly between 0 and 1) as a list of
    floats; a ValueError naming the expected forms otherwise."""
    try:
        levels = check_confidence_levels(confidence_level)
    except ValueError:
        raise ValueError(f"confidence_level must be a number or a non-empty list of numbers strictly between 0 and 1 "
                         f"(e.g. 0.9 for 90 % intervals), got {confidence_level!r}.") from None
    return [float(v) for v in levels]


def _is_level_list(value) -> bool:
    try:
        check_confidence_levels(value)
    except ValueError:
        return False
    return True


def _is_optimizer_class(value) -> bool:
    return isinstance(value, type) and issubclass(value, torch.optim.Optimizer)


def _is_posterior_class(value) -> bool:
    return isinstance(value, type) and issubclass(value, ActiveSubspacePosterior)


# Every constructor parameter → the forms it may take (any one); checked at fit by validate_hyperparameters.
PARAMETER_CONSTRAINTS: dict = {
    "module": NO_VALIDATION,  # checked when the network is built
    "module_kwargs": [None, InstanceOf(dict, "a dict")],
    "prefit": [BOOLEAN],
    "scaling": [Options("auto", "mean", "standard"), Interval(numbers.Real, 0, None, closed="neither")],
    "n_components": [Options("auto"), Interval(numbers.Integral, 1, None)],
    "max_components": [Interval(numbers.Integral, 1, None)],
    "sigma0": [Options("auto", "eb_subspace", "eb_full", "nll"), Interval(numbers.Real, 0, None, closed="neither")],
    "posterior": [Satisfies(_is_posterior_class, "a subclass of ActiveSubspacePosterior"),
                  Options(*POSTERIOR_KINDS)],
    "calibration": [InstanceOf(Calibrator, "a Calibrator (e.g. ConformalCalibrator(conformity_score=...))"),
                    Options(*CALIBRATIONS)],
    "predictive": [Options("auto", "sampled", "linearized")],
    "n_samples": [Interval(numbers.Integral, 2, None)],
    "confidence_level": [Satisfies(_is_level_list, "a number or a non-empty list of numbers strictly between "
                                                   "0 and 1 (e.g. 0.9 for 90 % intervals)")],
    "calibration_size": [Interval(numbers.Real, 0, 1, closed="neither"), Interval(numbers.Integral, 1, None)],
    "max_epochs": [Interval(numbers.Integral, 0, None)],
    "lr": [Options("auto"), Interval(numbers.Real, 0, None, closed="neither")],
    "batch_size": [None, Options("auto"), Interval(numbers.Integral, 1, None)],
    "weight_decay": [Options("auto"), Interval(numbers.Real, 0, None)],
    "optimizer": [Options(*OPTIMIZERS), Satisfies(_is_optimizer_class, "a torch.optim.Optimizer subclass")],
    "standardize": [Options("auto"), BOOLEAN],
    "padding_idx": [None, Interval(numbers.Integral, 0, None)],
    "subsample": [None, Options("auto"), Interval(numbers.Integral, 1, None)],
    "eigen_method": [Options("lanczos", "eigsh")],
    "device": NO_VALIDATION,  # checked when resolved (torch parses it)
    "dtype": [Options("auto", *DTYPES)],
    "random_state": [None, Interval(numbers.Integral, 0, 2**32, closed="left"),
                     InstanceOf(np.random.RandomState, "a numpy.random.RandomState")],
    "verbose": [Interval(numbers.Integral, 0, None), BOOLEAN],
    "n_threads": [Options("auto"), None, Interval(numbers.Integral, 1, None)],
    "early_stopping": [Options("auto"), BOOLEAN],
    "validation_fraction": [Interval(numbers.Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(numbers.Integral, 1, None)],
    "tol": [Interval(numbers.Real, 0, None)],
    "working_memory": [Interval(numbers.Real, 0, None, closed="neither")],
}
