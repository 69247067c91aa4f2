"""The estimators' facade: the constructor parameters they share, ``fit`` as one call per component in the order
the data flows (prepared data → network → noise → posterior → calibration), the fitted attributes users read, and
the prediction helpers (rows checked, chunked within ``working_memory``, non-finite outputs traced)."""

from __future__ import annotations

import abc
import contextlib
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
from .._functional import model_outputs
from .._progress import stage
from .._silenced import silenced, user_stacklevel
from .._threads import scoped_threads
from .._version import __version__
from ..calibration import CALIBRATIONS, Calibrator, choose_dimension
from ..ensemble import NetworkEnsemble
from ..likelihoods import Likelihood
from ..posterior import memory_budget
from ..predictive import PredictiveMode, class_probabilities
from ._calibration import CalibrationPlan, calibration_line, calibration_name
from ._data import PreparedData, check_sample_weight, prepare_data
from ._posterior import Posterior, posterior_line, resolve_posterior_settings
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
    trainable_dtype,
    training_line,
    user_module,
)

__all__ = ["ATTRIBUTES_DOC", "Compute", "FitSettings", "LaplaceActiveSubspaceBase", "PARAMETERS_DOC",
           "check_level_list"]

logger = logging.getLogger("glas_sklearn.estimators")

#: The ``dtype`` names → torch dtypes.
DTYPES = {"float32": torch.float32, "float64": torch.float64}
# Rows per forward pass when the fit rows' outputs are checked.
_CHECK_ROWS = 1024
# Bytes per network output that a prediction holds at once per sample.
_BYTES_PER_OUTPUT = 32
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


def _rows_text(rows: np.ndarray) -> str:
    shown = ", ".join(str(int(r)) for r in rows[:10])
    return f"rows [{shown}{', …' if len(rows) > 10 else ''}]"


def _write_rows(whole, part, start: int, n: int):
    """Write a chunk's result (a tensor, or a tuple of tensors and None) at rows ``start:`` of the result over all
    ``n`` rows, allocated on the first chunk (small results kept apart between the chunks' large temporaries
    would fragment the C heap)."""
    if isinstance(part, tuple):
        whole = (None,) * len(part) if whole is None else whole
        return tuple(_write_rows(w, p, start, n) for w, p in zip(whole, part, strict=True))
    if part is None:
        return None
    if whole is None:
        whole = torch.empty((n, *part.shape[1:]), dtype=part.dtype, device=part.device)
    whole[start:start + part.shape[0]] = part
    return whole


class Compute(BaseEstimator):
    """Where and how the estimators compute: device, dtype, torch threads, prediction memory, and the padding token
    of integer sequences. Pass it as ``compute=Compute(...)``; its parameters are reached as ``compute__dtype``.

    Parameters
    ----------
    device : "auto" or str, default="auto"
        "auto": where a prefit module lives, else CUDA when available, else CPU.
    dtype : {"auto", "float32", "float64"}, default="auto"
        The floating dtype of the network, the curvature and the posterior. "auto": the dtype of a prefit module's
        trainable parameters (never cast; with mixed precisions the widest), float32 for a network built here.
    n_threads : "auto", int or None, default="auto"
        torch's intra-op thread count while the estimator's methods run, restored afterwards. "auto": one thread
        per whole 2²⁶ of trainable weights × rows of a training batch, never more than torch's own count; None
        leaves torch's setting alone. The setting is process-wide while a call runs.
    working_memory : float, default=64
        MiB that prediction may hold at once for its temporaries: rows are predicted in chunks sized to it. The
        results do not depend on it.
    padding_idx : int, optional
        The token id that pads integer sequences ``X`` (n, T) on the right: the mask of a module taking an
        ``attention_mask``, and at predict time sequences of another length are padded or cut to the fitted one.
    """

    _parameter_constraints: dict = {
        "device": NO_VALIDATION,  # checked when resolved (torch parses it)
        "dtype": [Options("auto", *DTYPES)],
        "n_threads": [Options("auto"), None, Interval(numbers.Integral, 1, None)],
        "working_memory": [Interval(numbers.Real, 0, None, closed="neither")],
        "padding_idx": [None, Interval(numbers.Integral, 0, None)],
    }

    def __init__(self, device="auto", dtype="auto", n_threads="auto", working_memory=64, padding_idx=None):
        self.device = device
        self.dtype = dtype
        self.n_threads = n_threads
        self.working_memory = working_memory
        self.padding_idx = padding_idx

    def resolve_device(self, prefit_module, owner: str) -> torch.device:
        """``device`` as a torch device; "auto" is where a prefit module lives, else CUDA when available, else CPU."""
        if self.device == "auto":
            params = [] if prefit_module is None else list(prefit_module.parameters())
            if params:  # a prefit module stays where it is
                return params[0].device
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"{owner}: device {self.device!r} is not a torch device.") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{owner}: device={self.device!r} but CUDA is not available; use device='cpu' or 'auto'.")
        return device

    def resolve_dtype(self, prefit_module, owner: str) -> torch.dtype:
        """``dtype`` as a torch dtype; "auto" follows a prefit module's trainable parameters, else float32."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        weights_dtype = None if prefit_module is None else trainable_dtype(prefit_module)
        if weights_dtype is None:
            return torch.float32
        if weights_dtype not in DTYPES.values():
            raise ValueError(f"{owner}: the prefit module's parameters are {weights_dtype}; the posterior needs "
                             "float32 or float64 weights (cast a copy of the module, e.g. net.float()).")
        return weights_dtype


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


PARAMETERS_DOC = """\
    module : None, torch.nn.Module, skorch net or callable, default=None
        The network, ``(n, *input_shape)`` → ``(n, outputs)`` (logits); None: an MLP. Copied before training.
    prefit : bool, default=False
        Use the trained module as θ0 as it is (never trained or moved); ``fit`` then needs ``X_cal, y_cal``.
    training : Training, optional
        How the network is trained (:class:`~glas_sklearn.Training`); None: ``Training()``.
    posterior : {"low_rank", "low_rank_diag", "subspace"} or Posterior, default="low_rank"
        The posterior kind and its hyperparameters (:class:`~glas_sklearn.LowRank`, ...; a name: the defaults).
    calibration : {"mondrian", "conformal", "coverage"} or Calibrator
        Split conformal per band of σ̂ (or class), split conformal, or d chosen by coverage (with
        ``posterior="subspace"``: the paper's method).
    scaling : {"auto", "mean", "standard"} or float, default="auto"
        β = 1/σ² ("mean"), N/σ² ("standard") or a given β; "auto": the likelihood's own.
    n_components : "auto" or int, default="auto"
        d. "auto": the smallest reaching the level under "coverage", else ``max_components``.
    sigma0 : {"auto", "eb_subspace", "eb_full", "nll"} or float, default="auto"
        Prior standard deviation: empirical Bayes (subspace, full space) or by held-out NLL (conformal only).
    confidence_level : float or list of float, default=0.9
        Level(s) 1 − γ; the first is the calibration target.
    calibration_size : float or int, default=0.1
        Share (or number) of rows of ``X`` held out for calibration when ``X_cal`` is not passed.
    compute : Compute, optional
        Device, dtype, threads, prediction memory, padding token (:class:`~glas_sklearn.Compute`).
    random_state : int, RandomState or None; verbose : int, default=0
        ``verbose`` ≥ 1 writes one line per finished stage to standard error (always logged at INFO level)."""

ATTRIBUTES_DOC = """\
    module_, likelihood_, posterior_, calibrator_, predictive_
        The fitted components: the network θ0, the likelihood, the posterior, the calibrator, the predictive mode.
    n_components_, sigma0_, beta_ : int, float, float
        d, the prior standard deviation at d and the posterior scaling.
    eigenvalues_, eigen_info_, n_weights_, n_records_, trainable_parameters_
        The curvature's top eigenvalues and solver record; D; N; the parameters the posterior covers.
    calibration_, conformity_scores_, calibration_reached_, calibration_seed_
        The calibration's table, scores, whether "coverage" reached the level, the samples' seed.
    n_calibration_rows_, n_sigma0_rows_, sigma0_rows_, sigma0_search_, train_indices_, calibration_indices_
        Rows scored, rows σ0 was tuned on ("nll"), positions in ``X`` of training and calibration rows.
    n_iter_, loss_curve_, validation_scores_, best_validation_score_, validation_indices_, weight_decay_
        The (first network's) training record (``training_loss_``; held out: a shadow copy's, if one ran).
    timings_, n_threads_, x_mean_, x_scale_, input_shape_, n_features_in_, feature_names_in_
        Stage times, torch threads, the input standardisation and the row shape seen in fit."""

class LaplaceActiveSubspaceBase(BaseEstimator, metaclass=abc.ABCMeta):
    """What :class:`LaplaceActiveSubspaceRegressor` and :class:`LaplaceActiveSubspaceClassifier` share: the
    orchestration of ``fit``, the fitted attributes, ``coverage_curve`` and the prediction helpers. Each subclass
    supplies its targets and its likelihood through the abstract hooks."""

    #: The N(0, σ²) prior on every weight whose MAP ``weight_decay="auto"`` trains (None: no weight decay).
    _weight_prior_std: float | None = None

    _parameter_constraints = {
        "module": NO_VALIDATION,  # checked when the network is built
        "prefit": [InstanceOf((bool, np.bool_), "True or False")],
        "training": [None, InstanceOf(Training, "a glas_sklearn.Training")],
        "posterior": [Options("low_rank", "low_rank_diag", "subspace"),
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
                            calibration_size=self.calibration_size, seed=settings.seed, fit_targets=self._fit_targets,
                            standardize=self._standardizes(settings), device=device, dtype=dtype,
                            class_labels=self._class_labels())
        self._inputs = data.inputs
        self.x_mean_, self.x_scale_, self.input_shape_ = data.inputs.x_mean, data.inputs.x_scale, inputs.input_shape
        self.train_indices_, self.calibration_indices_ = data.train_indices, data.calibration_indices
        self.module_, self.likelihood_, history, timings = self._fit_network(data, settings, dtype)
        self._keep_history(history)
        self.timings_.update(timings)
        self._check_network_outputs(data)
        noise_var = self._fit_noise(self.module_, data, settings)
        laplace = settings.posterior.fit(self.module_, data.Xt, data.yt, self.likelihood_,
                                         scaling=self._scaling(), noise_var=noise_var, n_components=self.n_components,
                                         sigma0=settings.plan.posterior_sigma0, seed=settings.seed,
                                         verbose=self.verbose, sample_weight=self._curvature_weight(data))
        self._keep_posterior(laplace, settings)
        calibration = settings.plan.fit(self.posterior_, data.Xc, data.yc, n_components=self.n_components,
                                        predictive=settings.predictive, n_samples=settings.posterior.n_samples,
                                        noise_var=self._interval_noise_var(), seed=settings.seed,
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
        """Every setting checked (alone and together) and resolved to its object, before any data is touched."""
        check_settings(self)
        training = (Training() if self.training is None else clone(self.training)).check(self._name)
        posterior = resolve_posterior_settings(self.posterior).check(self._name)
        compute = (Compute() if self.compute is None else clone(self.compute))
        check_settings(compute, self._name, prefix="compute__")
        likelihood = self._resolve_likelihood(posterior)
        plan = CalibrationPlan.resolve(self.calibration, self._levels(None), self.sigma0, likelihood,
                                       off_subspace=posterior.kind_class.off_subspace,
                                       auto_low_rank_sigma0=self._auto_low_rank_sigma0, owner=self._name)
        seed = int(numpy_rng(self.random_state).integers(0, 2**31 - 1))
        return FitSettings(likelihood, training, posterior, compute, plan, posterior.predictive_mode(), seed)

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
        self._compute = compute
        return compute.resolve_device(user, self._name), compute.resolve_dtype(user, self._name)

    def _user_prefit_module(self):
        return user_module(self.module) if self.prefit else None

    def _prefit_module(self, device, dtype, settings: FitSettings):
        return prefit_network(self.module, device, dtype, self._name, settings.compute.dtype)

    def _fit_network(self, data: PreparedData, settings: FitSettings, dtype: torch.dtype):
        """θ0: the prefit module as it is, or a network built from the recipe and trained on the training rows
        (:meth:`Training.fit`): ``(module, likelihood, history, timings)``, history None when prefit, timings
        of extra stages."""
        return (*self._train_network(data, settings, dtype, settings.likelihood), {})

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
        fit = {"sample_weight": data.weight, "weight_prior_std": self._weight_prior_std, "verbose": self.verbose}
        if n_networks == 1:
            history = settings.training.fit(module, Xt, data.yt, likelihood, seed=settings.seed, owner=self._name,
                                            **fit)
        else:  # a deep ensemble: each network trained as the first, from its own seed
            seeds = [member_seed(settings.seed, k) for k in range(n_networks)]
            members = [module] + [network(seed) for seed in seeds[1:]]
            owners = [self._name] + [f"{self._name} (network {k + 1} of {n_networks})" for k in range(1, n_networks)]
            together = settings.training.fit_together(members, Xt, data.yt, likelihood, seeds=seeds, owners=owners,
                                                      **fit)  # all in the same steps, where they stack
            if together is not None:
                history = together[0]
            else:  # networks that do not stack: one after another
                history = None
                for member, seed, owner in zip(members, seeds, owners, strict=True):
                    done = settings.training.fit(member, Xt, data.yt, likelihood, seed=seed, owner=owner, **fit)
                    if history is None:  # weight_decay="cv": the prior is the table's, chosen once
                        history, search = done, done.weight_decay_search
                        fit["cv_precision"] = None if search is None else search["chosen"]
                    else:
                        history.seconds += done.seconds
            module = NetworkEnsemble(members, combine=likelihood.ensemble_combine).eval()
            history.n_networks = n_networks
        self._report(training_line(history, self._threads_text()))
        return module, likelihood, history

    def _keep_history(self, history: TrainingResult | None) -> None:
        """The training record as the fitted attributes users read."""
        if history is None:
            self.n_iter_, self.loss_curve_, self.validation_scores_ = 0, [], None
            self.best_validation_score_ = self.validation_indices_ = self.weight_decay_ = None
        else:
            self.n_iter_, self.loss_curve_ = history.n_iter, history.loss_curve
            held = history.validation_indices
            self.validation_scores_ = history.validation_scores if held is not None else None
            self.best_validation_score_, self.validation_indices_ = history.best_validation_score, held
            self.weight_decay_ = history.weight_decay
            self.timings_["training"] = history.seconds
        self.training_loss_ = self.loss_curve_
        self._n_rows_trained = None if history is None else history.n_rows_trained

    def _check_network_outputs(self, data: PreparedData) -> None:
        """The network's outputs at θ0 on the training and calibration rows are finite; else an error naming the
        rows (positions in the ``X`` or ``X_cal`` passed to fit) and the cause, before the curvature is built."""
        split = data.train_indices is not None
        for X, where, positions, kind in ((data.Xt, "X", data.train_indices, "training"),
                                          (data.Xc, "X" if split else "X_cal", data.calibration_indices,
                                           "calibration")):
            out = model_outputs(self.module_, X, batch_size=_CHECK_ROWS)
            bad = np.flatnonzero((~torch.isfinite(out)).reshape(len(out), -1).any(1).cpu().numpy())
            if bad.size == 0:
                continue
            rows = bad if positions is None else np.sort(positions[bad])
            if self.prefit:
                cause = ("the prefit module returns NaN or inf there, so neither its predictions nor their "
                         "uncertainty are defined. Check those rows (values far outside the network's training range, "
                         "missing values encoded as numbers) and the module's forward (a log, sqrt or division of its "
                         "input)")
            else:
                losses = self.loss_curve_
                last = f" (the training loss ends at {losses[-1]:.4g})" if losses else ""
                cause = (f"after training{last}: the training diverged or overflowed; lower lr, standardise X, or "
                         "use dtype='float64'")
            raise ValueError(f"{self._name}: the network's outputs are non-finite (NaN or inf) on {len(rows)} of the "
                             f"{len(X)} {kind} rows, {_rows_text(rows)} of {where}: {cause}.")

    def _scaling(self):
        return self.likelihood_.default_scaling if self.scaling == "auto" else self.scaling

    def _curvature_weight(self, data: PreparedData):
        """The training rows' weights in the curvature: the user's ``sample_weight`` (None: all 1)."""
        return data.weight

    def _keep_posterior(self, laplace, settings: FitSettings) -> None:
        """The fitted posterior and what users read of it."""
        post = laplace.posterior
        self.timings_["curvature"] = laplace.timings["total"]
        self.posterior_, self.predictive_ = post, settings.predictive
        self.trainable_parameters_ = {name: tuple(shape)
                                      for name, shape in zip(post.layout.names, post.layout.shapes, strict=True)}
        self.n_weights_, self.beta_, self.n_records_ = int(post.n_weights), float(laplace.beta), int(laplace.n_records)
        self.eigenvalues_ = laplace.eigen.eigenvalues.detach().cpu().numpy()
        self.eigen_info_ = {
            "method": laplace.eigen.method, "n_matvecs": laplace.eigen.n_matvecs, "converged": laplace.eigen.converged,
            "residual_norms": laplace.eigen.residual_norms.detach().cpu().numpy(),
            "relative_residuals": laplace.eigen.relative_residuals.detach().cpu().numpy(),
        }
        self._n_samples = settings.posterior.n_samples
        self._report(posterior_line(settings.posterior.name, laplace, settings.plan.posterior_sigma0))

    def _keep_calibration(self, fitted, settings: FitSettings) -> None:
        """The fitted calibrator and what users read of it."""
        self.timings_["calibration"] = fitted.seconds
        for line in fitted.lines:
            self._report(line)
        self.calibrator_ = fitted.calibrator
        self.conformity_scores_ = fitted.calibrator.scores_
        self.calibration_reached_ = fitted.calibrator.reached_
        self.n_components_, self.sigma0_ = fitted.n_components, fitted.sigma0
        self.calibration_ = self._table_in_user_units(fitted.calibrator.table_.reset_index(drop=True))
        self.calibration_seed_, self._sample_seed_ = settings.seed, fitted.sample_seed
        self.sigma0_search_, self.sigma0_rows_ = fitted.sigma0_search, fitted.sigma0_rows
        self.n_calibration_rows_, self.n_sigma0_rows_ = fitted.n_rows, int(len(fitted.sigma0_rows))
        self._after_calibration(fitted.calibrator)
        self._report(calibration_line(calibration_name(self.calibration), fitted, self.calibration_,
                                      settings.plan.levels, settings.likelihood.is_classification,
                                      self.calibration_reached_))

    def _report(self, line: str) -> None:
        """A finished stage's line: to standard error with ``verbose ≥ 1``, and logged at INFO level."""
        stage(line, verbose=self.verbose, logger=logging.getLogger("glas_sklearn.estimators._base"))

    def _threads_text(self) -> str:
        n = self.n_threads_
        if n is None:
            return "torch's own thread count"
        how = "auto" if isinstance(self._compute.n_threads, str) else "n_threads"
        return f"{n} torch thread{'s' if n != 1 else ''} ({how})"

    def _fit_line(self) -> str:
        """The closing line, e.g. "LaplaceActiveSubspaceRegressor: fitted in 15.2 s: trained the network (2,951
        weights) for 500 epochs on 696 rows; posterior low_rank, d = 50; mondrian intervals at 90 % from 78
        calibration rows; 1 torch thread (auto)"."""
        what = "prediction sets" if self.likelihood_.is_classification else "intervals"
        if self.prefit:
            network = f"used the prefit network ({self.n_weights_:,} trainable weights) as it is"
        elif isinstance(self.module_, NetworkEnsemble):
            network = (f"trained {len(self.module_.members)} networks ({self.n_weights_:,} weights), the first for "
                       f"{len(self.loss_curve_)} epochs, on {self._n_rows_trained:,} rows")
        else:
            network = (f"trained the network ({self.n_weights_:,} weights) for {len(self.loss_curve_)} epochs on "
                       f"{self._n_rows_trained:,} rows")
        kind = resolve_posterior_settings(self.posterior).name
        levels = ", ".join(f"{100 * float(v):g} %" for v in self._levels(None))
        return (f"{self._name}: fitted in {self.timings_['total']:.1f} s: {network}; posterior {kind}, d = "
                f"{self.n_components_}; {calibration_name(self.calibration)} {what} at {levels} from "
                f"{self.n_calibration_rows_} calibration rows; {self._threads_text()}")

    # ------------------------------------------------------------------------------- prediction helpers
    def _thread_count(self) -> int | None:
        """torch's intra-op threads for the current call: the given count, None (torch's setting left alone), or
        for "auto" the count the last fit chose (one before fit)."""
        n = (self.compute or Compute()).n_threads
        if n is None or (isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1):
            return n
        return getattr(self, "n_threads_", None) or 1

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

    def _working_memory_bytes(self) -> float:
        """``working_memory`` in bytes (it may be set after fit with ``set_params``, so it is checked here too)."""
        wm = (self.compute or Compute()).working_memory
        if isinstance(wm, bool) or not isinstance(wm, (int, float, np.integer, np.floating)) or not wm > 0:
            raise ValueError(f"{self._name}: compute__working_memory must be a number of MiB > 0 (e.g. 64), got "
                             f"{wm!r}.")
        return float(wm) * 2**20

    def _predict_bytes_per_row(self, n_outputs: int, activations: int = 0) -> int:
        """Bytes a prediction holds per row at once: the outputs per sample (sampled) or the Jacobian projections
        and their float64 products (linearised), plus ``activations`` (of one row's forward pass) twice."""
        values = self.predictive_.values_per_output(self._n_samples, self.posterior_.max_components)
        return _BYTES_PER_OUTPUT * values * max(1, n_outputs) + 2 * activations

    def _activation_bytes_per_row(self, Xt: torch.Tensor) -> int:
        """The bytes one more row adds to the tensors a forward pass keeps for its backward pass (two forwards on 2
        and 4 rows, under ``saved_tensors_hooks``)."""
        if Xt.shape[0] < 4:
            return 0
        fm = self.posterior_.functional_model
        leaves = {n: p.detach().requires_grad_() for n, p in fm.params0.items()}
        sizes = []
        for rows in (2, 4):
            total = 0

            def pack(t):
                nonlocal total
                total += t.numel() * t.element_size()
                return t

            with fm.autodiff(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fm(Xt[:rows], leaves)
            sizes.append(total)
        return max(0, (sizes[1] - sizes[0]) // 2)

    def _predict_in_chunks(self, Xt, n_outputs: int, predict: Callable, *, finite: Callable):
        """``predict(rows)`` over chunks of the rows of ``Xt`` (a tensor, or validated rows turned into input
        tensors chunk by chunk), each within ``working_memory``, their results written into arrays allocated once.
        Where ``finite(result)`` is not finite, the error names the rows and whether the network itself or the
        posterior's samples are at fault."""
        budget = int(self._working_memory_bytes()) // 2  # half for the results, half for the posterior's chunks
        as_input = (lambda rows: rows) if isinstance(Xt, torch.Tensor) else self._rows_tensor
        activations = self._activation_bytes_per_row(as_input(Xt[:4])) if Xt.shape[0] > _CHECK_ROWS else 0
        size = max(1, budget // self._predict_bytes_per_row(n_outputs, activations))
        whole = None
        with memory_budget(budget, max(activations, 256)), self._released_cache():
            for start in range(0, Xt.shape[0], size):
                rows = as_input(Xt[start:start + size])
                try:
                    result = predict(rows)
                except (ValueError, RuntimeError) as err:
                    self._raise_if_network_nonfinite(rows, start, Xt.shape[0], cause=err)
                    raise
                check = finite(result)
                if not bool(torch.isfinite(check).all()):
                    self._raise_if_network_nonfinite(rows, start, Xt.shape[0])
                    bad = np.flatnonzero((~torch.isfinite(check)).reshape(len(check), -1).any(1).cpu().numpy())
                    raise ValueError(
                        f"{self._name}: the predictive is non-finite (NaN or inf) on {_rows_text(bad + start)} of X, "
                        "although the network's outputs at its trained weights are finite there: the posterior's "
                        "weight samples make the network overflow on them. Use posterior__predictive='linearized', "
                        "a smaller sigma0, or compute__dtype='float64'.")
                whole = _write_rows(whole, result, start, Xt.shape[0])
        return whole

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

    def _check_finite_rows(self, values: torch.Tensor, Xt: torch.Tensor) -> None:
        """Refuse non-finite ``values`` (rows first) predicted for the rows ``Xt``, naming the rows and the cause."""
        ok = torch.isfinite(values).reshape(len(values), -1).all(1)
        if not bool(ok.all()):
            self._raise_if_network_nonfinite(Xt, 0, Xt.shape[0])
            bad = np.flatnonzero((~ok).cpu().numpy())
            raise ValueError(f"{self._name}: the posterior's draws are non-finite (NaN or inf) on {_rows_text(bad)} of "
                             "X, although the network's outputs at its trained weights are finite there: the weight "
                             "samples make the network overflow on them. Use a smaller sigma0, or "
                             "compute__dtype='float64'.")

    @contextlib.contextmanager
    def _released_cache(self):
        """The posterior's cache of the last rows' Jacobian quantities is dropped when the prediction is done."""
        try:
            yield
        finally:
            self.posterior_.release_cache()

    def _raise_if_network_nonfinite(self, rows: torch.Tensor, start: int, n: int, cause=None) -> None:
        """Raise the error naming the rows (positions in X) where the network's output at θ0 is not finite."""
        try:
            with memory_budget(int(self._working_memory_bytes())):
                out = self.posterior_.predict_mean(rows, batch_size=_CHECK_ROWS)
        except Exception:  # noqa: BLE001 - the network cannot be evaluated at all: the original error stands
            if cause is None:
                raise
            return
        bad = np.flatnonzero((~torch.isfinite(out)).reshape(len(out), -1).any(1).cpu().numpy())
        if bad.size:
            raise ValueError(
                f"{self._name}: the network's outputs are non-finite (NaN or inf) on {_rows_text(bad + start)} of X "
                f"({n} rows): the network returns NaN or inf there at its trained weights, so neither the prediction "
                "nor its uncertainty is defined. Check those rows (values far outside the training range, missing "
                "values encoded as numbers) and the module's forward (a log, sqrt or division of its input).") \
                from cause

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
        yt = self._targets_tensor(y, p.device, p.dtype, self._inputs)
        if confidence_level is not None and np.ndim(confidence_level) != 0:
            raise ValueError(f"confidence_level must be a single number, got {confidence_level!r}.")
        level = self._levels(confidence_level)[0]
        d_max = p.max_components if d_max is None else d_max
        with silenced("coverage_not_reached"):  # the whole curve is asked for, reaching the level or not
            result = choose_dimension(p, Xt, yt, confidence_level=level, d_max=d_max, predictive=self.predictive_,
                                      n_samples=self._n_samples, noise_var=self._interval_noise_var(),
                                      random_state=self.calibration_seed_, full_curve=True, verbose=self.verbose,
                                      likelihood=self.likelihood_)
        return self._table_in_user_units(result.table.reset_index(drop=True))

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

    def _table_in_user_units(self, table: pd.DataFrame) -> pd.DataFrame:
        return table

    def _interval_noise_var(self):
        """Observation-noise variance added to intervals (internal units); 0 for parameter uncertainty only."""
        return 0.0

    def _after_calibration(self, calibrator: Calibrator) -> None:
        """What a subclass records once the calibrator is fitted."""

    @abc.abstractmethod
    def _resolve_likelihood(self, posterior: Posterior) -> Likelihood:
        """The likelihood of this fit (the estimator's setting resolved to an object, checked)."""

    @abc.abstractmethod
    def _auto_low_rank_sigma0(self, calibrator: Calibrator) -> str:
        """What sigma0="auto" means for the low-rank posteriors under ``calibrator``."""

    @abc.abstractmethod
    def _validate_train(self, X, y, settings: FitSettings):
        """The training rows and targets validated (``InputEncoder.from_fit_rows``): ``X, y, encoder``."""

    @abc.abstractmethod
    def _validate_calibration(self, X_cal, y_cal):
        """Calibration (or scoring) rows and targets validated against what fit saw."""

    @abc.abstractmethod
    def _fit_targets(self, y, weight, standardize: bool):
        """The fitted target scaler (regression) or label encoder of the training targets, with ``to_tensor``."""

    @abc.abstractmethod
    def _targets_tensor(self, y, device, dtype, inputs) -> torch.Tensor:
        """Validated targets as the tensor the calibration takes (internal units)."""

    @abc.abstractmethod
    def _n_outputs(self, data: PreparedData, likelihood: Likelihood) -> int:
        """The network outputs per row the targets call for under ``likelihood``."""

    @abc.abstractmethod
    def _fit_noise(self, module, data: PreparedData, settings: FitSettings):
        """The noise model fitted at θ0: σ² for β (internal units), or None without a noise variance."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.sparse = True
        tags.input_tags.three_d_array = True
        return tags

