"""What the two estimators share: their hyperparameters (constraints; their documentation is in _docs.py), the
fit orchestration (validate → split → train → posterior → choose d) as named steps, the hooks each estimator
implements (declared abstract here), prediction chunking and pickling. Input handling is in _inputs.py, the
network θ0 in _network.py."""

from __future__ import annotations

import abc
import logging
import numbers
import time
import warnings

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator
from sklearn.model_selection import train_test_split
from sklearn.utils.validation import _check_sample_weight, check_is_fitted
from torch import nn

from .._checks import check_confidence_levels, numpy_rng
from .._functional import model_outputs
from .._progress import stage
from .._threads import adjust_threads, auto_threads, scoped_threads
from ..calibration import (
    CALIBRATIONS,
    CalibrationWarning,
    Calibrator,
    choose_dimension,
    resolve_calibration,
)
from ..laplace import fit_laplace_subspace
from ..likelihoods import Likelihood
from ..posterior import POSTERIOR_KINDS, ActiveSubspacePosterior, resolve_posterior
from ..predictive import PredictiveMode, resolve_predictive
from ._calibration_rows import CalibrationRowsMixin
from ._inputs import InputsMixin
from ._network import NetworkMixin, trainable_dtype
from ._outputs import OutputsMixin
from ._pickling import PicklingMixin
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
from ._report import calibration_line, fit_line, posterior_line, training_line
from ._sigma0 import Sigma0PolicyMixin
from ._training import AUTO_EARLY_STOPPING_ROWS, OPTIMIZERS, auto_batch_size, auto_lr, auto_subsample, train_module
from ._validation import (
    BOOLEAN,
    NO_VALIDATION,
    InstanceOf,
    Interval,
    Options,
    Satisfies,
    validate_hyperparameters,
)

__all__ = ["LaplaceActiveSubspaceBase"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
# Offset of the seed of the early-stopping validation split (within the training rows).
_VALIDATION_SPLIT = 104729
# Test coverage of 90 % intervals of an overfitting prefit network calibrated on rows held out of its training
# rows, and on unseen rows (benchmarks/results/prefit_calibration.md, default settings, mean (range) over
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
            f"{_UNSEEN_COVERAGE} with unseen X_cal (benchmarks/results/prefit_calibration.md). Hold rows out "
            "before training the network (e.g. with sklearn.model_selection.train_test_split) and pass them as "
            "X_cal, y_cal; X stays the network's training rows (the curvature is built on them).")


def _check_level_list(confidence_level) -> list[float]:
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


class LaplaceActiveSubspaceBase(PicklingMixin, Sigma0PolicyMixin, CalibrationRowsMixin, InputsMixin, NetworkMixin,
                                OutputsMixin, BaseEstimator, metaclass=abc.ABCMeta):
    """Common machinery of :class:`LaplaceActiveSubspaceRegressor` and :class:`LaplaceActiveSubspaceClassifier`.

    Subclasses name their likelihood (:meth:`_resolve_likelihood`, fitted as ``likelihood_``), extend
    ``_parameter_constraints`` with their own parameters and implement the target handling (the abstract hooks).
    """

    # Every constructor parameter → the forms it may take (any one); checked at fit by validate_hyperparameters.
    _parameter_constraints: dict = {
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
        "weight_decay": [Interval(numbers.Real, 0, None)],
        "optimizer": [Options(*OPTIMIZERS), Satisfies(_is_optimizer_class, "a torch.optim.Optimizer subclass")],
        "standardize": [Options("auto"), BOOLEAN],
        "padding_idx": [None, Interval(numbers.Integral, 0, None)],
        "subsample": [None, Options("auto"), Interval(numbers.Integral, 1, None)],
        "eigen_method": [Options("lanczos", "eigsh")],
        "device": NO_VALIDATION,  # checked when resolved (torch parses it)
        "dtype": [Options("auto", *_DTYPES)],
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

    def __init__(self, module=None, *, module_kwargs=None, prefit=False, scaling="auto", n_components="auto",
                 max_components=50, sigma0="auto", posterior="low_rank", calibration="conformal",
                 predictive="auto", n_samples=1000, confidence_level=0.9,
                 calibration_size=0.1, max_epochs=500, lr="auto", batch_size="auto", weight_decay=0.0,
                 optimizer="adam", standardize="auto", padding_idx=None, subsample="auto", eigen_method="lanczos",
                 device="auto", dtype="auto", random_state=None, verbose=0, early_stopping="auto",
                 validation_fraction=0.1, n_iter_no_change=10, tol=1e-4, n_threads="auto",
                 working_memory=64):
        self.module = module
        self.module_kwargs = module_kwargs
        self.prefit = prefit
        self.scaling = scaling
        self.n_components = n_components
        self.max_components = max_components
        self.sigma0 = sigma0
        self.posterior = posterior
        self.calibration = calibration
        self.predictive = predictive
        self.n_samples = n_samples
        self.confidence_level = confidence_level
        self.calibration_size = calibration_size
        self.max_epochs = max_epochs
        self.lr = lr
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.optimizer = optimizer
        self.standardize = standardize
        self.padding_idx = padding_idx
        self.subsample = subsample
        self.eigen_method = eigen_method
        self.device = device
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose
        self.n_threads = n_threads
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.working_memory = working_memory

    # -------------------------------------------------------------------- fit
    @scoped_threads
    def _fit(self, X, y, X_cal, y_cal, sample_weight=None):
        """``fit`` of both estimators, one step per line in the order the data flows."""
        t_start = time.perf_counter()
        self._check_settings()
        X, y, X_cal, y_cal = self._validate_fit_data(X, y, X_cal, y_cal)
        sample_weight, kept = self._check_sample_weight(sample_weight, X)
        device, dtype, seed = self._resolve_device(), self._resolve_dtype(), self._seed()
        self._prefit_fingerprint = None
        if self.prefit:
            self._declare_prefit_training_rows(self._prefit_module(device, dtype), X, X_cal)
        if kept is not None:  # rows of zero weight are dropped
            X, y = X[kept], y[kept]
        if X_cal is None:
            X, X_cal, y, y_cal, sample_weight = self._split_off_calibration_rows(X, y, seed, sample_weight, kept)
        else:
            self.train_indices_ = self.calibration_indices_ = None
        Xt, yt, Xc, yc = self._fit_tensors(X, y, X_cal, y_cal, device, dtype, sample_weight)
        wt = None if sample_weight is None else torch.as_tensor(sample_weight, dtype=torch.float64).to(device)
        self.timings_ = {}
        self.module_ = self._theta0_module(Xt, yt, self._n_outputs(y), seed, dtype, wt)
        self._check_network_outputs(Xt, Xc)
        self._fit_posterior(Xt, yt, Xc, yc, seed, wt)
        self._choose_dimension(Xc, yc, seed)
        self.timings_["total"] = time.perf_counter() - t_start
        self._report(fit_line(self))
        return self

    def _report(self, line: str) -> None:
        """A finished stage's line: to standard error with ``verbose ≥ 1``, and logged at INFO level."""
        stage(line, verbose=self.verbose, logger=logger)

    def _check_settings(self) -> None:
        """The hyperparameters checked (alone and together), and the likelihood resolved (``likelihood_``)."""
        validate_hyperparameters(self)
        self.likelihood_ = self._resolve_likelihood()
        self._check_sigma0_setting()

    def _fit_tensors(self, X, y, X_cal, y_cal, device, dtype, sample_weight=None):
        """The input standardisation fitted on the training rows (weighted by ``sample_weight``); training and
        calibration rows as tensors in the internal units: ``Xt, yt, Xc, yc``."""
        self._fit_scalers(X, y, sample_weight)
        Xt = self._to_tensor(self._transform_X(X), device, dtype)
        yt = self._target_tensor(y, device, dtype)
        Xc = self._to_tensor(self._transform_X(X_cal), device, dtype)
        yc = self._calibration_targets(y_cal, device, dtype)
        return Xt, yt, Xc, yc

    def _validate_fit_data(self, X, y, X_cal, y_cal):
        """The training rows and, when given, the calibration rows, validated (X densified)."""
        X, y = self._validate_train(X, y)  # records input_shape_ and the input kind
        self._check_inputs_fit_the_settings()
        if X_cal is None and y_cal is None:
            return X, y, None, None
        if X_cal is None or y_cal is None:
            raise ValueError(f"{type(self).__name__}.fit: pass both X_cal and y_cal, or neither.")
        X_cal, y_cal = self._validate_calibration(X_cal, y_cal)
        return X, y, X_cal, y_cal

    def _check_sample_weight(self, sample_weight, X) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``sample_weight`` checked (one finite, non-negative weight per row, not all zero): the weights of the
        rows of positive weight (None when not given or all ones) and those rows' positions in ``X`` (None when
        there is no zero weight)."""
        if sample_weight is None:
            return None, None
        weight = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        if np.all(weight == 1.0):
            return None, None
        kept = np.flatnonzero(weight > 0)
        if len(kept) < 3:
            raise ValueError(f"{type(self).__name__} needs at least 3 rows of positive sample_weight (training and "
                             f"calibration rows), got {len(kept)}.")
        return weight[kept], None if len(kept) == len(weight) else kept

    def _resolve_device(self) -> torch.device:
        if self.device == "auto":
            user = self._user_module() if self.prefit else None
            params = [] if user is None else list(user.parameters())
            if params:  # a prefit module stays where it is
                return params[0].device
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"{type(self).__name__}: device {self.device!r} is not a torch device.") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{type(self).__name__}: device={self.device!r} but CUDA is not available; "
                             "use device='cpu' or 'auto'.")
        return device

    def _resolve_dtype(self) -> torch.dtype:
        """``dtype`` as a torch dtype; "auto" follows a prefit module's trainable parameters, else float32."""
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        user = self._user_module() if self.prefit else None
        weights_dtype = None if user is None else trainable_dtype(user)
        if weights_dtype is None:
            return torch.float32
        if weights_dtype not in _DTYPES.values():
            raise ValueError(f"{type(self).__name__}: the prefit module's parameters are {weights_dtype}; the "
                             "posterior needs float32 or float64 weights (cast a copy of the module, e.g. "
                             "net.float()).")
        return weights_dtype

    def _seed(self) -> int:
        """One integer seed for everything random in fit (fresh entropy when random_state is None; drawn from
        it when it is a RandomState)."""
        return int(numpy_rng(self.random_state).integers(0, 2**31 - 1))

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

    def _theta0_module(self, Xt: torch.Tensor, yt: torch.Tensor, n_outputs: int, seed: int,
                       dtype: torch.dtype, sample_weight: torch.Tensor | None = None) -> nn.Module:
        """θ0: the prefit module as it is, or our own network (new or copied) trained on the training rows
        (on the weighted mean loss with ``sample_weight``)."""
        if self.prefit:
            module = self._called_as_network(self._prefit_module(Xt.device, dtype), Xt[:1])
            self._check_trainable(module)
            self._choose_threads(module, Xt.shape[0])
            self.training_loss_ = self.loss_curve_ = []
            self.n_iter_, self.validation_scores_, self.best_validation_score_ = 0, None, None
            self.validation_indices_ = None
        else:
            module = self._build_module(Xt.shape[1], n_outputs, seed).to(device=Xt.device, dtype=dtype)
            module = self._called_as_network(module, Xt[:1])
            self._check_trainable(module)
            self._check_output_shape(module, Xt[:1], n_outputs)  # before training: a module that cannot take X
            self._choose_threads(module, Xt.shape[0])
            t0 = time.perf_counter()
            self._train(module, Xt, yt, seed, sample_weight)
            self.timings_["training"] = time.perf_counter() - t0
            self._report(training_line(self, Xt.shape[0], self.timings_["training"]))
        self._check_output_shape(module, Xt[:1], n_outputs)
        if self.prefit:
            self._warn_if_prefit_underfits(module, Xt, yt)
        return module

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

    def _thread_count(self) -> int | None:
        """torch's intra-op threads for the current call (see ``n_threads``): the given count, None (torch's
        setting left alone), or for "auto" the count the last fit chose (``n_threads_``), one before fit has seen
        the network."""
        n = getattr(self, "n_threads", "auto")  # estimators pickled before n_threads: "auto"
        if n is None or (isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1):
            return n
        return getattr(self, "n_threads_", None) or 1

    def _choose_threads(self, module: nn.Module, n_rows: int) -> None:
        """``n_threads_`` for the network about to be trained (or used, prefit), and the running fit's count set to
        it: "auto" by :func:`~glas_sklearn._threads.auto_threads` of the trainable weights × rows per batch."""
        if self.n_threads == "auto":
            n_weights = sum(p.numel() for p in module.parameters() if p.requires_grad)
            self.n_threads_ = auto_threads(n_weights, min(self._batch_size(n_rows) or n_rows, n_rows))
        else:
            self.n_threads_ = self.n_threads
        if self.n_threads_ is not None:
            adjust_threads(self.n_threads_)

    def _train(self, module: nn.Module, Xt: torch.Tensor, yt: torch.Tensor, seed: int,
               sample_weight: torch.Tensor | None) -> None:
        """Train ``module`` in place on the training rows, less the validation rows held out of them when
        ``early_stopping`` (never calibration rows), and record ``n_iter_``, ``loss_curve_``,
        ``validation_scores_``, ``best_validation_score_`` and ``validation_indices_``."""
        n_rows = len(yt)
        fit_rows, val_rows = self._split_off_validation_rows(yt, seed)
        validation = None
        if val_rows is not None:
            fit_index, val_index = (torch.as_tensor(r, device=Xt.device) for r in (fit_rows, val_rows))
            validation = (Xt[val_index], yt[val_index], None if sample_weight is None else sample_weight[val_index])
            Xt, yt = Xt[fit_index], yt[fit_index]
            sample_weight = None if sample_weight is None else sample_weight[fit_index]
        batch_size = self._batch_size(len(Xt))
        result = train_module(
            module, Xt, yt, self.likelihood_.loss, optimizer=self.optimizer, lr=self._lr(len(Xt)),
            weight_decay=self.weight_decay, batch_size=batch_size, max_epochs=self.max_epochs, seed=seed,
            verbose=self.verbose, owner=type(self).__name__, sample_weight=sample_weight, validation=validation,
            validation_loss=self.likelihood_.held_out_loss, n_iter_no_change=self.n_iter_no_change, tol=self.tol,
            fused=n_rows >= AUTO_EARLY_STOPPING_ROWS)  # fused Adam on large data (same update, ~1.4x faster)
        self.n_iter_ = result.n_iter
        self.loss_curve_ = self.training_loss_ = result.loss_curve
        self.validation_scores_ = result.validation_scores if validation is not None else None
        self.best_validation_score_ = result.best_validation_score
        self.validation_indices_ = val_rows

    def _subsample(self, n_rows: int) -> int | None:
        """The rows the curvature is built on, of ``n_rows`` training rows: ``subsample``, with "auto" resolved
        (None: all rows)."""
        return auto_subsample(n_rows) if self.subsample == "auto" else self.subsample

    def _batch_size(self, n_rows: int) -> int | None:
        """Rows per training step on ``n_rows`` rows: ``batch_size``, with "auto" resolved (None: all rows)."""
        return auto_batch_size(n_rows) if self.batch_size == "auto" else self.batch_size

    def _lr(self, n_rows: int) -> float:
        """The learning rate on ``n_rows`` rows trained on: ``lr``, with "auto" resolved (:func:`auto_lr`)."""
        return auto_lr(n_rows, self._batch_size(n_rows)) if self.lr == "auto" else self.lr

    def _split_off_validation_rows(self, yt: torch.Tensor, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Positions among the n training rows of the rows trained on and of the ``validation_fraction`` held out
        for early stopping (⌈fraction · n⌉, stratified by class where possible; seeded from ``seed``), sorted;
        ``(all rows, None)`` without early stopping ("auto" below ``AUTO_EARLY_STOPPING_ROWS`` rows), or when either
        part would have fewer than 2 rows."""
        n = len(yt)
        n_val = int(np.ceil(self.validation_fraction * n))
        auto = isinstance(self.early_stopping, str)  # "auto", the only string allowed
        if not (n >= AUTO_EARLY_STOPPING_ROWS if auto else self.early_stopping):
            if auto:
                logger.info("%s: early_stopping='auto' is off below %d training rows (%d here): training on all of "
                            "them for max_epochs=%d epochs", type(self).__name__, AUTO_EARLY_STOPPING_ROWS, n,
                            self.max_epochs)
            return np.arange(n), None
        if n_val < 2 or n - n_val < 2:
            logger.info("%s: %d training rows are too few to hold out validation rows for early stopping; training "
                        "for max_epochs=%d epochs", type(self).__name__, n, self.max_epochs)
            return np.arange(n), None
        labels = yt.detach().cpu().numpy() if self.likelihood_.is_classification else None
        stratify = labels if labels is not None and self._can_stratify(labels, n_val) else None
        fit, val = train_test_split(np.arange(n), test_size=n_val, random_state=(seed + _VALIDATION_SPLIT) % 2**31,
                                    stratify=stratify)
        return np.sort(fit), np.sort(val)

    def _fit_posterior(self, Xt, yt, Xc, yc, seed: int, sample_weight: torch.Tensor | None = None) -> None:
        """The curvature's top eigenpairs at θ0 and the posterior on them (β from σ² for regression), with the
        training rows' weights in G, σ² and β."""
        t0 = time.perf_counter()
        fitted = fit_laplace_subspace(
            self.module_, Xt, yt, loss=self.likelihood_,
            scaling=self._resolved_scaling(), noise_var=self._noise_var(self.module_, Xt, yt, Xc, yc, sample_weight),
            n_components=self._n_eigenpairs(self.module_), sigma0=self._resolved_sigma0(),
            subsample=self._subsample(Xt.shape[0]),
            eigen_method=self.eigen_method, random_state=seed, verbose=self.verbose, posterior=self.posterior,
            sample_weight=sample_weight)
        self.timings_["curvature"] = time.perf_counter() - t0
        self.posterior_ = fitted.posterior
        self.trainable_parameters_ = {name: tuple(shape) for name, shape in
                                      zip(fitted.posterior.layout.names, fitted.posterior.layout.shapes, strict=True)}
        self.n_weights_ = int(fitted.posterior.n_weights)
        self.beta_ = float(fitted.beta)
        self.n_records_ = int(fitted.n_records)
        self.eigenvalues_ = fitted.eigen.eigenvalues.detach().cpu().numpy()
        self.eigen_info_ = {
            "method": fitted.eigen.method, "n_matvecs": fitted.eigen.n_matvecs, "converged": fitted.eigen.converged,
            "residual_norms": fitted.eigen.residual_norms.detach().cpu().numpy(),
            "relative_residuals": fitted.eigen.relative_residuals.detach().cpu().numpy(),
        }
        self._set_noise()
        self._report(posterior_line(self, self.timings_["curvature"]))

    def _resolved_scaling(self):
        """``scaling`` with "auto" resolved: "mean" (each estimator may override it per likelihood)."""
        return "mean" if self.scaling == "auto" else self.scaling

    def _n_eigenpairs(self, module: nn.Module) -> int:
        """K: the given n_components, or for "auto" max_components capped at D − 1 (fit_laplace_subspace
        refuses K ≥ D, naming D)."""
        if self.n_components != "auto":
            return self.n_components
        D = sum(p.numel() for p in module.parameters() if p.requires_grad)
        K = max(1, min(self.max_components, D - 1))
        if K < self.max_components:
            logger.info("max_components=%d capped at D - 1 = %d (the network has D=%d weights)",
                        self.max_components, K, D)
        return K

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

    def _posterior_kind(self) -> type[ActiveSubspacePosterior]:
        """The class of the posterior kind ``posterior`` names."""
        return resolve_posterior(self.posterior)

    def _resolved_predictive(self) -> PredictiveMode:
        """``predictive`` with "auto" resolved: the kind's ``default_predictive`` (linearised for the low-rank
        posteriors, sampled for the subspace)."""
        if self.predictive != "auto":
            return resolve_predictive(self.predictive)
        return resolve_predictive(self._posterior_kind().default_predictive)


    # --------------------------------------------------------------- helpers
    def _check_fitted_X(self, X, method: str | None = None) -> torch.Tensor:
        """Validated rows as a tensor on the posterior's device; with ``method`` (an uncertainty output), rows of a
        prefit network's training data are warned about."""
        return self._rows_tensor(self._fitted_rows(X, method))

    def _fitted_rows(self, X, method: str | None = None) -> np.ndarray:
        """Validated rows (numpy, the user's units), warned about as :meth:`_check_fitted_X` does."""
        check_is_fitted(self, "posterior_")
        X = self._validate_X(X, reset=False)
        if method is not None:
            self._warn_if_prefit_training_rows(X, method)
        return X

    def _rows_tensor(self, X: np.ndarray) -> torch.Tensor:
        """Validated rows as the network's input tensor (standardised, on the posterior's device and dtype)."""
        p = self.posterior_
        return self._to_tensor(self._transform_X(X), p.device, p.dtype)

    def _table_in_user_units(self, table: pd.DataFrame) -> pd.DataFrame:
        return table

    def _interval_noise_var(self):
        """Observation-noise variance added to intervals (internal units); 0 for parameter uncertainty only."""
        return 0.0

    @scoped_threads
    def coverage_curve(self, X, y, *, d_max: int | None = None, confidence_level: float | None = None) -> pd.DataFrame:
        """Coverage on ``(X, y)`` of the (1 − γ) intervals (or prediction sets) for every d = 1 … d_max.

        The posterior samples are those of the calibration (same seed), and σ0 is refitted at every d by
        empirical Bayes (a σ0 given as a number, or chosen once by ``sigma0="nll"``, stays fixed), so on the
        calibration rows this reproduces the rows of ``calibration_`` of ``calibration="coverage"`` and fills in
        every other d (the paper's Fig. 6); on test rows it shows how coverage generalises. These are the
        posterior's own intervals (or sets), not the conformal ones, also with ``calibration="conformal"``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        y : array-like
            Targets (regression) or labels (classification).
        d_max : int, optional
            Largest d (default: every eigenpair computed in fit).
        confidence_level : float, optional
            Defaults to the first of the estimator's levels.

        Returns
        -------
        pandas.DataFrame
            Columns d, coverage, mean_width (regression, in the units of y for a single output) or
            mean_set_size (classification), sigma0.
        """
        check_is_fitted(self, "posterior_")
        X, y = self._validate_calibration(X, y)
        self._warn_if_prefit_training_rows(X, "coverage_curve")
        p = self.posterior_
        Xt = self._to_tensor(self._transform_X(X), p.device, p.dtype)
        yt = self._calibration_targets(y, p.device, p.dtype)
        if confidence_level is not None and np.ndim(confidence_level) != 0:
            raise ValueError(f"confidence_level must be a single number, got {confidence_level!r}.")
        level = self._levels(confidence_level)[0]
        d_max = p.max_components if d_max is None else d_max
        with warnings.catch_warnings():  # the whole curve is asked for, reaching the level or not
            warnings.simplefilter("ignore", CalibrationWarning)
            result = choose_dimension(p, Xt, yt, confidence_level=level, d_max=d_max,
                                      predictive=self.predictive_, n_samples=self.n_samples,
                                      noise_var=self._interval_noise_var(),
                                      random_state=self.calibration_seed_, full_curve=True, verbose=self.verbose,
                                      likelihood=self.likelihood_)
        return self._table_in_user_units(result.table.reset_index(drop=True))

    def _levels(self, confidence_level) -> list[float]:
        return _check_level_list(self.confidence_level if confidence_level is None else confidence_level)

    # ------------------------------------------------- hooks of the subclasses
    @abc.abstractmethod
    def _resolve_likelihood(self) -> Likelihood:
        """The likelihood of this fit (the estimator's setting resolved to an object, checked)."""

    @abc.abstractmethod
    def _validate_train(self, X, y):
        """The training rows and targets validated (``_validate_X`` with ``reset=True``), targets encoded."""

    @abc.abstractmethod
    def _validate_calibration(self, X_cal, y_cal):
        """Calibration (or scoring) rows and targets validated against what fit saw."""

    @abc.abstractmethod
    def _n_outputs(self, y) -> int:
        """The network outputs per row that the validated targets ``y`` call for."""

    @abc.abstractmethod
    def _target_tensor(self, y, device, dtype) -> torch.Tensor:
        """The validated training targets as the tensor the loss takes (internal units)."""

    @abc.abstractmethod
    def _calibration_targets(self, y, device, dtype) -> torch.Tensor:
        """The validated calibration targets as the tensor the calibration takes (internal units)."""

    @abc.abstractmethod
    def _noise_var(self, module, Xt, yt, Xc, yc):
        """σ² for β (internal units), or None when the likelihood has no noise variance."""

    @abc.abstractmethod
    def _set_noise(self) -> None:
        """Record the fitted noise attributes once the posterior is built."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.sparse = True
        tags.input_tags.three_d_array = True
        return tags
