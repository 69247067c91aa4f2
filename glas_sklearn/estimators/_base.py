"""The estimators' facade: the constructor parameters they share, ``fit`` as one call per component in the order
the data flows (prepared data → network → noise → posterior → calibration), the fitted attributes users read, and
the prediction helpers (rows checked, chunked within ``working_memory``, non-finite outputs traced)."""

from __future__ import annotations

import abc
import logging
import numbers
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted
from torch import nn

from .._checks import check_confidence_levels, numpy_rng
from .._constraints import NO_VALIDATION, InstanceOf, Interval, Options, Satisfies, check_settings
from .._progress import stage
from .._silenced import silenced, user_stacklevel
from .._threads import scoped_threads
from .._version import __version__
from ..calibration import CALIBRATIONS, Calibrator, choose_dimension
from ..ensemble import NetworkEnsemble
from ..likelihoods import Likelihood
from ..posterior import POSTERIOR_KINDS
from ..predictive import PredictiveMode, class_probabilities
from ..training import Objective
from ._calibration import CalibrationPlan, calibration_line, calibration_name
from ._compute import ChunkedPredictions, Compute, check_network_outputs, fit_line, working_memory_bytes
from ._data import PreparedData, check_sample_weight, prepare_data
from ._posterior import Posterior, posterior_attributes, posterior_line, resolve_posterior_settings
from ._prefit import declare_training_rows, warn_if_training_rows, warn_if_underfits
from ._training import (
    Training,
    TrainingResult,
    build_network,
    called_as_network,
    check_output_shape,
    check_trainable,
    choose_threads,
    member_seed,
    prefit_network,
    training_line,
    user_module,
)

__all__ = ["Compute", "FitSettings", "LaplaceActiveSubspaceBase", "TaskComponents", "check_level_list"]

logger = logging.getLogger("glas_sklearn.estimators")

# Fitted attributes (and the module parameter) that hold torch objects, pickled as the bytes of a model file.
_TORCH_STATE = ("module", "module_", "posterior_")
#: The layout of the pickled state; a pickle of another format is refused, not migrated (3: the torch objects as a
#: model file's bytes, where format 2 held torch.save's pickle bytes).
_PICKLE_FORMAT = 3


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


@dataclass
class FitSettings:
    """The settings of one fit, resolved to objects and checked before any data is touched."""

    likelihood: Likelihood
    training: Training
    posterior: Posterior
    compute: Compute
    plan: CalibrationPlan
    predictive: PredictiveMode
    seed: int
    targets: type
    noise: object

    @classmethod
    def resolve(cls, est) -> FitSettings:
        """The settings of the estimator ``est`` checked (alone and together) and resolved to their objects, before
        any data is touched; its ``_components`` supply the likelihood, the target handling and the noise step.
        Nothing is written onto ``est``."""
        check_settings(est)
        training = (Training() if est.training is None else clone(est.training)).check(est._name)
        posterior = resolve_posterior_settings(est.posterior).check(est._name)
        compute = (Compute() if est.compute is None else clone(est.compute))
        check_settings(compute, est._name, prefix="compute__")
        task = est._components(posterior)
        plan = CalibrationPlan.resolve(est.calibration, est._levels(None), est.sigma0, task.likelihood,
                                       off_subspace=posterior.kind_class.off_subspace,
                                       auto_low_rank_sigma0=est._auto_low_rank_sigma0, owner=est._name)
        seed = int(numpy_rng(est.random_state).integers(0, 2**31 - 1))
        return cls(task.likelihood, training, posterior, compute, plan, posterior.predictive_mode(), seed,
                   task.targets, task.noise)

    def fit_targets(self, owner: str, class_labels) -> Callable:
        """``fit_targets(y, weight, standardize)`` of ``prepare_data``: the components' target handling."""
        return lambda y, weight, standardize: self.targets.fit(y, weight, standardize, owner, class_labels)


def training_attributes(history: TrainingResult | None) -> dict:
    """The estimators' fitted attributes of the training record (None: a prefit network, not trained here)."""
    if history is None:
        return {"n_iter_": 0, "loss_curve_": [], "validation_scores_": None, "best_validation_score_": None,
                "validation_indices_": None, "weight_decay_": None, "training_loss_": [], "_n_rows_trained": None}
    held = history.validation_indices
    return {"n_iter_": history.n_iter, "loss_curve_": history.loss_curve,
            "validation_scores_": history.validation_scores if held is not None else None,
            "best_validation_score_": history.best_validation_score, "validation_indices_": held,
            "weight_decay_": history.weight_decay, "training_loss_": history.loss_curve,
            "_n_rows_trained": history.n_rows_trained}


@dataclass(frozen=True)
class TaskComponents:
    """What an estimator supplies to ``fit``: its ``likelihood`` (resolved from its settings), its ``targets`` (a
    class whose ``fit(y, sample_weight, standardize, owner, class_labels)`` returns the fitted target handling:
    ``TargetScaler`` or ``LabelTargets``) and its ``noise`` step (``RegressionNoise`` or ``NoNoise``, whose
    ``fit(module, likelihood, data, ...)`` returns a ``NoiseStep``)."""

    likelihood: Likelihood
    targets: type
    noise: object


#: The constructor parameters of both estimators and what each accepts (scikit-learn's parameter validation).
BASE_CONSTRAINTS = {
    "module": NO_VALIDATION,  # checked when the network is built
    "prefit": [InstanceOf((bool, np.bool_), "True or False")],
    "training": [None, InstanceOf(Training, "a glas_sklearn.Training")],
    "posterior": [Options(*POSTERIOR_KINDS),
                  InstanceOf(Posterior, "a Posterior settings object (e.g. LowRank(max_components=20))"),
                  Satisfies(lambda v: isinstance(v, type), "a subclass of ActiveSubspacePosterior")],
    "calibration": [InstanceOf(Calibrator, "a Calibrator (e.g. ConformalCalibrator(conformity_score=...))"),
                    Options(*CALIBRATIONS)],
    "scaling": [Options("auto", "mean", "standard"), Interval(numbers.Real, 0, None, closed="neither")],
    "n_components": [Options("auto"), Interval(numbers.Integral, 1, None)],
    "sigma0": [Options("auto", "eb_subspace", "eb_full", "nll"),
               Interval(numbers.Real, 0, None, closed="neither")],
    "confidence_level": [Satisfies(_is_level_list, "a number or a non-empty list of numbers strictly between "
                                                   "0 and 1 (e.g. 0.9 for 90 % intervals)")],
    "calibration_size": [Interval(numbers.Real, 0, 1, closed="neither"), Interval(numbers.Integral, 1, None)],
    "compute": [None, InstanceOf(Compute, "a glas_sklearn.Compute")],
    "random_state": [None, Interval(numbers.Integral, 0, 2**32, closed="left"),
                     InstanceOf(np.random.RandomState, "a numpy.random.RandomState")],
    "verbose": [Interval(numbers.Integral, 0, None), InstanceOf((bool, np.bool_), "True or False")],
}


class LaplaceActiveSubspaceBase(BaseEstimator, metaclass=abc.ABCMeta):
    """What :class:`LaplaceActiveSubspaceRegressor` and :class:`LaplaceActiveSubspaceClassifier` share: the
    orchestration of ``fit``, the fitted attributes, ``coverage_curve`` and the prediction helpers. Each subclass
    supplies its components (:class:`TaskComponents`: likelihood, target handling, noise step) and validates its
    rows; ``fit`` runs the same steps for both."""

    #: The N(0, σ²) prior on every weight whose MAP ``weight_decay="auto"`` trains (None: no weight decay).
    _weight_prior_std: float | None = None

    _parameter_constraints = BASE_CONSTRAINTS

    def __init__(self, module=None, *, prefit=False, training=None, posterior="low_rank", calibration="conformal",
                 scaling="auto", n_components="auto", sigma0="auto", confidence_level=0.9, calibration_size=0.1,
                 compute=None, random_state=None, verbose=0):
        self.module = module
        self.prefit = prefit
        self.training = training
        self.posterior = posterior
        self.calibration = calibration
        self.scaling = scaling
        self.n_components = n_components
        self.sigma0 = sigma0
        self.confidence_level = confidence_level
        self.calibration_size = calibration_size
        self.compute = compute
        self.random_state = random_state
        self.verbose = verbose

    # -------------------------------------------------------------------------------------------- fit
    @scoped_threads
    def _fit(self, X, y, X_cal, y_cal, sample_weight=None):
        """``fit`` of both estimators: one component per step, in the order the data flows."""
        t_start, self.timings_ = time.perf_counter(), {}
        settings = self._resolve_settings()
        X, y, X_cal, y_cal, weight, kept, inputs = self._validate_fit_data(X, y, X_cal, y_cal, sample_weight,
                                                                           settings)
        device, dtype = self._placement(settings.compute)
        self._prefit_fingerprint = None
        if self.prefit:
            self._prefit_fingerprint = declare_training_rows(self._prefit_module(device, dtype, settings), X, X_cal,
                                                             self._name, settings.likelihood.is_classification)
        data = prepare_data(X, y, X_cal, y_cal, weight, kept, inputs=inputs, plan=settings.plan,
                            calibration_size=self.calibration_size, seed=settings.seed,
                            fit_targets=settings.fit_targets(self._name, self._class_labels()),
                            standardize=self._standardizes(settings),
                            device=device, dtype=dtype, class_labels=self._class_labels())
        self._keep_data(data, inputs)
        self.module_, likelihood, history = self._train_network(data, settings, dtype, settings.likelihood)
        self._keep_history(history)
        check_network_outputs(self.module_, data, prefit=self.prefit, loss_curve=self.loss_curve_, owner=self._name)
        noise = settings.noise.fit(self.module_, likelihood, data, seed=settings.seed,
                                   fixed_predictor=settings.plan.calibrator.requires_fixed_predictor)
        self._keep_noise(noise)
        laplace = settings.posterior.fit(self.module_, data.Xt, data.yt, self.likelihood_,
                                         scaling=self._scaling(), noise_var=noise.beta_noise_var,
                                         n_components=self.n_components, sigma0=settings.plan.posterior_sigma0,
                                         seed=settings.seed, verbose=self.verbose,
                                         sample_weight=noise.curvature_weight(data.Xt, data.weight))
        self._keep_posterior(laplace, settings)
        calibration = settings.plan.fit(self.posterior_, data.Xc, data.yc, n_components=self.n_components,
                                        predictive=settings.predictive, n_samples=settings.posterior.n_samples,
                                        noise_var=noise.interval_noise_var, seed=settings.seed,
                                        likelihood=self.likelihood_, verbose=self.verbose,
                                        class_labels=self._class_labels(), warned=data.warned,
                                        sigma0_rule=self._sigma0_rule())
        self._keep_calibration(calibration, settings)
        self.timings_["total"] = time.perf_counter() - t_start
        self._report(self._fit_line())
        return self

    def _sigma0_rule(self) -> str:
        """How ``sigma0="nll"`` chooses among the σ0 it evaluates (:func:`~glas_sklearn.calibration.tune_sigma0`).
        A network trained here under a weight prior is that prior's MAP, and its own predictive (σ0 = 0) is kept
        unless a larger σ0 beats it by more than one standard error of the tuning rows' NLL ("one_se"). A prefit
        network, or one trained without a prior, may be overconfident, and gets the σ0 of the lowest NLL
        ("lowest"). The measurements behind the two rules are in the classification guide."""
        return "one_se" if not self.prefit and (self.weight_decay_ or 0.0) > 0 else "lowest"

    @property
    def _name(self) -> str:
        return type(self).__name__

    def _resolve_settings(self) -> FitSettings:
        """Every setting checked (alone and together) and resolved to its object (:meth:`FitSettings.resolve`)."""
        return FitSettings.resolve(self)

    def _validate_fit_data(self, X, y, X_cal, y_cal, sample_weight, settings: FitSettings):
        """The training rows and, when given, the calibration rows validated (X densified), the input encoder of
        their row shape, and the weights of the rows of positive weight with those rows' positions."""
        X, y, inputs = self._validate_train(X, y, settings)
        inputs.check_settings(self.module, settings.training.standardize, self.prefit)
        self._inputs = inputs  # the calibration rows are checked against it
        if (X_cal is None) != (y_cal is None):
            raise ValueError(f"{self._name}.fit: pass both X_cal and y_cal, or neither.")
        if X_cal is not None:
            X_cal, y_cal = self._validate_calibration(X_cal, y_cal)
        weight, kept = check_sample_weight(sample_weight, X, self._name)
        return X, y, X_cal, y_cal, weight, kept, inputs

    def _standardizes(self, settings: FitSettings) -> bool:
        return settings.training.standardize is not False and not self.prefit

    def _placement(self, compute: Compute) -> tuple[torch.device, torch.dtype]:
        user = self._user_prefit_module()
        return compute.resolve_device(user, self._name), compute.resolve_dtype(user, self._name)

    def _user_prefit_module(self):
        return user_module(self.module) if self.prefit else None

    def _prefit_module(self, device, dtype, settings: FitSettings):
        return prefit_network(self.module, device, dtype, self._name, settings.compute.dtype)

    def _train_network(self, data: PreparedData, settings: FitSettings, dtype, likelihood):
        """One network for ``likelihood``, built and trained (:meth:`Training.fit`)."""
        Xt, padding, n_outputs = data.Xt, settings.compute.padding_idx, self._n_outputs(data, likelihood)
        batch = min(settings.training.batch_rows(Xt.shape[0]) or Xt.shape[0], Xt.shape[0])
        if self.prefit:
            raw = user_module(self.module)
            if isinstance(raw, NetworkEnsemble) and likelihood.ensemble_combine not in (None, raw.combine):
                warnings.warn(f"{self._name}: the prefit NetworkEnsemble combines its members' outputs by "
                              f"{raw.combine!r}, but this likelihood's outputs are combined by "
                              f"{likelihood.ensemble_combine!r} (e.g. a classifier's members' probabilities are "
                              f"averaged by 'log_mean_softmax', not their logits); build it with "
                              f"combine={likelihood.ensemble_combine!r} unless {raw.combine!r} is meant.",
                              UserWarning, stacklevel=user_stacklevel())
            module = called_as_network(self._prefit_module(Xt.device, dtype, settings), Xt[:1], padding)
            check_trainable(module, self._name, True)
            self.n_threads_ = choose_threads(settings.compute.n_threads, module, batch)
            check_output_shape(module, Xt[:1], n_outputs, likelihood, self._name)
            warn_if_underfits(module, Xt, data.yt, likelihood, self._name)
            return module, likelihood, None
        n_networks = settings.training.networks(Xt.shape[0], likelihood.is_classification,
                                                instance=user_module(self.module) is not None)
        if n_networks > 1 and likelihood.ensemble_combine is None:
            raise ValueError(f"{self._name}: training__n_networks={settings.training.n_networks!r} trains an "
                             f"ensemble, whose members' outputs are averaged, but likelihood {likelihood.name!r} "
                             "puts the noise in the network's outputs, which cannot be averaged; use "
                             "training__n_networks=1 with it.")

        def network(seed: int) -> nn.Module:
            built = build_network(self.module, settings.training.module_kwargs, Xt.shape[1], n_outputs, seed,
                                  likelihood, fresh=seed != settings.seed, owner=self._name)
            return called_as_network(built.to(device=Xt.device, dtype=dtype), Xt[:1], padding)

        module = network(settings.seed)
        check_trainable(module, self._name, False)
        check_output_shape(module, Xt[:1], n_outputs, likelihood, self._name)  # before training
        self.n_threads_ = choose_threads(settings.compute.n_threads, module, batch)
        seeds = [member_seed(settings.seed, k) for k in range(n_networks)]
        members = [module] + [network(seed) for seed in seeds[1:]]  # a deep ensemble: each from its own seed
        owners = [self._name] + [f"{self._name} (network {k + 1} of {n_networks})" for k in range(1, n_networks)]
        objective = Objective(likelihood.loss, likelihood.held_out_loss, likelihood.is_classification)
        history = settings.training.fit_networks(members, Xt, data.yt, objective, seeds=seeds, owners=owners,
                                                 sample_weight=data.weight, weight_prior_std=self._weight_prior_std,
                                                 verbose=self.verbose)[0]
        if n_networks > 1:
            module = NetworkEnsemble(members, combine=likelihood.ensemble_combine).eval()
            history.n_networks = n_networks
        self._report(training_line(history, self._threads_text()))
        return module, likelihood, history

    def _n_outputs(self, data: PreparedData, likelihood: Likelihood) -> int:
        """The network outputs per row the targets call for under ``likelihood``."""
        return likelihood.n_outputs(data.targets.n_outputs)

    def _keep_data(self, data: PreparedData, inputs) -> None:
        """The fitted input encoder and target handling, and the rows' positions."""
        self._inputs, self._targets = data.inputs, data.targets
        self.x_mean_, self.x_scale_, self.input_shape_ = data.inputs.x_mean, data.inputs.x_scale, inputs.input_shape
        self.train_indices_, self.calibration_indices_ = data.train_indices, data.calibration_indices
        self._keep(data.targets.fitted_attributes())  # the regressor's y_mean_, y_scale_

    def _keep_noise(self, noise) -> None:
        """The noise step: the fit's likelihood from here on, its σ² and what users read of it."""
        self._noise_step, self.likelihood_ = noise, noise.likelihood
        self.timings_.update(noise.timings)
        for line in noise.lines:
            self._report(line)
        self._keep(noise.attributes)  # the regressor's noise_source_, noise_std_, likelihood_support_

    def _keep_history(self, history: TrainingResult | None) -> None:
        """The training record as the fitted attributes users read."""
        if history is not None:
            self.timings_["training"] = history.seconds
        self._keep(training_attributes(history))

    def _scaling(self):
        return self.likelihood_.default_scaling if self.scaling == "auto" else self.scaling

    def _keep_posterior(self, laplace, settings: FitSettings) -> None:
        """The fitted posterior and what users read of it."""
        self.timings_["curvature"] = laplace.timings["total"]
        self._keep(posterior_attributes(laplace))
        self.predictive_, self._n_samples = settings.predictive, settings.posterior.n_samples
        self._report(posterior_line(settings.posterior.name, laplace, settings.plan.posterior_sigma0))

    def _keep_calibration(self, fitted, settings: FitSettings) -> None:
        """The fitted calibrator and what users read of it."""
        self.timings_["calibration"] = fitted.seconds
        for line in fitted.lines:
            self._report(line)
        self._keep(fitted.attributes(self._targets))
        self.calibration_seed_ = settings.seed
        self._after_calibration(fitted.calibrator)
        self._report(calibration_line(calibration_name(self.calibration), fitted, settings.plan.levels))

    def _keep(self, attributes: dict) -> None:
        """A step's fitted attributes, as its component names them."""
        for name, value in attributes.items():
            setattr(self, name, value)

    def _report(self, line: str) -> None:
        """A finished stage's line: to standard error with ``verbose ≥ 1``, and logged at INFO level."""
        stage(line, verbose=self.verbose, logger=logging.getLogger("glas_sklearn.estimators._base"))

    def _threads_text(self) -> str:
        return (self.compute or Compute()).threads_text(self.n_threads_)

    def _fit_line(self) -> str:
        """The closing line (:func:`fit_line`)."""
        return fit_line(self._name, self.timings_["total"], self.module_, prefit=self.prefit,
                        n_weights=self.n_weights_, epochs=len(self.loss_curve_), rows=self._n_rows_trained,
                        posterior=resolve_posterior_settings(self.posterior).name, d=self.n_components_,
                        calibration=calibration_name(self.calibration),
                        classification=self.likelihood_.is_classification, levels=self._levels(None),
                        n_calibration_rows=self.n_calibration_rows_, threads=self._threads_text())

    # ------------------------------------------------------------------------------- prediction helpers
    def _thread_count(self) -> int | None:
        """torch's intra-op threads for the current call (:meth:`Compute.thread_count`)."""
        return (self.compute or Compute()).thread_count(getattr(self, "n_threads_", None))

    def _validate_X(self, X, y="no_validation", **kwargs):
        return self._inputs.validate(self, X, y, **kwargs)

    def _fitted_rows(self, X, method: str | None = None) -> np.ndarray:
        """Validated rows (numpy, the user's units); with ``method`` (an uncertainty output), rows of a prefit
        network's training data are warned about."""
        check_is_fitted(self, "posterior_")
        X = self._validate_X(X)
        if method is not None:
            warn_if_training_rows(self._prefit_fingerprint, X, self._name, method)
        return X

    def _rows_tensor(self, X: np.ndarray) -> torch.Tensor:
        p = self.posterior_
        return self._inputs.rows_tensor(X, p.device, p.dtype)

    def _check_fitted_X(self, X, method: str | None = None) -> torch.Tensor:
        return self._rows_tensor(self._fitted_rows(X, method))

    def _levels(self, confidence_level) -> list[float]:
        return check_level_list(self.confidence_level if confidence_level is None else confidence_level)

    def _score_rows(self, X, method: str = "score") -> None:
        check_is_fitted(self, "posterior_")
        warn_if_training_rows(self._prefit_fingerprint, self._validate_X(X), self._name, method)

    def _predictions(self) -> ChunkedPredictions:
        """The fitted posterior's predictions in chunks of rows within ``compute__working_memory`` (checked here,
        since it may be set after fit)."""
        return ChunkedPredictions(self.posterior_, self.predictive_, self._n_samples,
                                  working_memory_bytes(self.compute, self._name), self._name)

    def _predict_bytes_per_row(self, n_outputs: int, activations: int = 0) -> int:
        return self._predictions().bytes_per_row(n_outputs, activations)

    def _predict_in_chunks(self, Xt, n_outputs: int, predict: Callable, *, finite: Callable):
        """``predict(rows)`` over chunks of the rows of ``Xt`` (:meth:`ChunkedPredictions.run`; validated rows are
        turned into input tensors chunk by chunk)."""
        return self._predictions().run(Xt, n_outputs, predict, finite=finite, as_input=self._rows_tensor)

    def _check_finite_rows(self, values: torch.Tensor, Xt: torch.Tensor) -> None:
        self._predictions().check_finite_rows(values, Xt)

    def _calibrated_interval(self, Xt: torch.Tensor, levels):
        """The predictive (mean, std, bounds) of rows ``Xt`` as the fitted calibrator makes it."""
        return self.calibrator_.predict_interval(self.posterior_, Xt, levels)

    def _calibrated_sets(self, probs: torch.Tensor, levels) -> torch.Tensor:
        """Prediction sets (n, C, k) of class probabilities as the fitted calibrator makes them."""
        return self.calibrator_.predict_set(probs, levels)

    def _posterior_draws(self, Xt: torch.Tensor, n_samples: int, random_state) -> torch.Tensor:
        """Draws of the network outputs (S, n, M) under the posterior at d, by the predictive mode."""
        return self.predictive_.draw_outputs(self.posterior_, Xt, self.n_components_, n_samples,
                                             random_state=random_state)

    def _posterior_probabilities(self, Xt: torch.Tensor) -> torch.Tensor:
        """Class probabilities (n, C) under the posterior at d, with the calibration's weight samples."""
        return class_probabilities(self.posterior_, Xt, self.n_components_, predictive=self.predictive_,
                                   n_samples=self._n_samples, random_state=self._sample_seed_)

    @scoped_threads
    def coverage_curve(self, X, y, *, d_max: int | None = None, confidence_level: float | None = None) -> pd.DataFrame:
        """Coverage on ``(X, y)`` of the posterior's own (1 − γ) intervals or sets for every d = 1 … ``d_max``
        (default K), σ0 refitted at every d, with the calibration's samples (the paper's Fig. 6).

        Returns a DataFrame with columns d, coverage, mean_width (units of y) or mean_set_size, sigma0.
        """
        check_is_fitted(self, "posterior_")
        X, y = self._validate_calibration(X, y)
        warn_if_training_rows(self._prefit_fingerprint, X, self._name, "coverage_curve")
        p = self.posterior_
        Xt = self._inputs.rows_tensor(X, p.device, p.dtype)
        yt = self._targets.to_tensor(y, p.device, p.dtype, self._inputs)
        if confidence_level is not None and np.ndim(confidence_level) != 0:
            raise ValueError(f"confidence_level must be a single number, got {confidence_level!r}.")
        level = self._levels(confidence_level)[0]
        d_max = p.max_components if d_max is None else d_max
        with silenced("coverage_not_reached"):  # the whole curve is asked for, reaching the level or not
            result = choose_dimension(p, Xt, yt, confidence_level=level, d_max=d_max, predictive=self.predictive_,
                                      n_samples=self._n_samples, noise_var=self._noise_step.interval_noise_var,
                                      random_state=self.calibration_seed_, full_curve=True, verbose=self.verbose,
                                      likelihood=self.likelihood_)
        return self._targets.table_in_user_units(result.table.reset_index(drop=True))

    # ---------------------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict:
        # The torch objects as the bytes of a model file (glas_sklearn.save's format: data only, device-portable),
        # never torch.save: what __setstate__ reads is never unpickled. Attributes named as the pickling keys are
        # never carried over from __dict__ (a loaded object graph cannot smuggle bytes for __setstate__ to read).
        from ..serialization import ModelFileError, dumps_state
        from ..serialization._format import PICKLING_KEYS

        state = {k: v for k, v in super().__getstate__().items() if k not in PICKLING_KEYS}
        state["_glas_pickle"] = (__version__, _PICKLE_FORMAT)
        torch_part = {k: state.pop(k) for k in _TORCH_STATE if k in state}
        if any(v is not None for v in torch_part.values()):
            try:
                state["_glas_state"] = dumps_state(torch_part)
            except ModelFileError:  # a user's module the format cannot hold (a class defined in a function):
                state.update(torch_part)  # carried as live objects, as pickle and deepcopy treat any object
        else:
            state.update(torch_part)
        return state

    def __setstate__(self, state: dict) -> None:
        from ..serialization import loads_state

        state = dict(state)
        stamp = state.pop("_glas_pickle", None)
        if stamp is None or tuple(stamp)[1:] != (_PICKLE_FORMAT,):
            made = ("an earlier development build of glas-sklearn" if stamp is None
                    else f"glas-sklearn {stamp[0]} (pickle format {stamp[1]})")
            raise ValueError(f"This {self._name} was pickled by {made}; glas-sklearn {__version__} loads only pickles "
                             f"of its own format ({_PICKLE_FORMAT}): states of other formats are not migrated. Refit "
                             f"the estimator with glas-sklearn {__version__} and pickle it again (or load it with the "
                             "version that saved it).")
        for key in ("_torch_state", "_torch_device"):  # torch.save bytes of format 2: never unpickled
            state.pop(key, None)
        blob = state.pop("_glas_state", None)
        if blob is not None:
            state.update(loads_state(blob))
        super().__setstate__(state)

    # ------------------------------------------------------------------------------ hooks of the subclasses
    def _class_labels(self):
        """The class labels a classifier's messages name (None for regression)."""
        return None

    def _after_calibration(self, calibrator: Calibrator) -> None:
        """What a subclass records once the calibrator is fitted."""

    @abc.abstractmethod
    def _components(self, posterior: Posterior) -> TaskComponents:
        """The likelihood of this fit (the estimator's setting resolved to an object, checked), the target handling
        and the noise step (:class:`TaskComponents`); nothing is written onto the estimator."""

    @abc.abstractmethod
    def _auto_low_rank_sigma0(self, calibrator: Calibrator) -> str:
        """What sigma0="auto" means for the low-rank posteriors under ``calibrator``."""

    @abc.abstractmethod
    def _validate_train(self, X, y, settings: FitSettings):
        """The training rows and targets validated (``InputEncoder.from_fit_rows``): ``X, y, encoder``."""

    @abc.abstractmethod
    def _validate_calibration(self, X_cal, y_cal):
        """Calibration (or scoring) rows and targets validated against what fit saw."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.sparse = True
        tags.input_tags.three_d_array = True
        return tags

