"""What the two estimators share: the fit orchestration (validate → split → train → posterior → calibrate) as
named steps, ``coverage_curve``, the fitted rows' checks at predict time, and the hooks each estimator implements
(declared abstract here). Each other job is a module the base class calls: the hyperparameters' constraints
(_constraints.py; their documentation in _docs.py), input handling (_inputs.py), the network θ0 (_network.py) and
its training (_network_training.py), the posterior (_posterior_fit.py), the calibration and the choice of d
(_calibration_fit.py), the calibration-row split (_calibration_rows.py), the σ0 policy (_sigma0.py), the prefit
checks (_prefit_checks.py), device and dtype (_placement.py), torch threads (_thread_choice.py), outputs and
prediction chunking (_outputs.py) and pickling (_pickling.py)."""

from __future__ import annotations

import abc
import logging
import time

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

from .._checks import numpy_rng
from .._progress import stage
from .._silenced import silenced
from .._threads import scoped_threads
from ..calibration import choose_dimension
from ..likelihoods import Likelihood
from ..posterior import ActiveSubspacePosterior, resolve_posterior
from ._calibration_fit import CalibrationFitMixin
from ._calibration_rows import CalibrationRowsMixin
from ._constraints import PARAMETER_CONSTRAINTS, check_level_list
from ._inputs import InputsMixin
from ._network import NetworkMixin
from ._network_training import NetworkTrainingMixin
from ._outputs import OutputsMixin
from ._pickling import PicklingMixin
from ._placement import PlacementMixin
from ._posterior_fit import PosteriorFitMixin
from ._prefit_checks import PrefitChecksMixin
from ._report import fit_line
from ._sigma0 import Sigma0PolicyMixin
from ._thread_choice import ThreadChoiceMixin
from ._validation import validate_hyperparameters

__all__ = ["LaplaceActiveSubspaceBase"]

logger = logging.getLogger(__name__)


class LaplaceActiveSubspaceBase(NetworkTrainingMixin, PosteriorFitMixin, CalibrationFitMixin, PrefitChecksMixin,
                                PlacementMixin, ThreadChoiceMixin, PicklingMixin, Sigma0PolicyMixin,
                                CalibrationRowsMixin, InputsMixin, NetworkMixin, OutputsMixin, BaseEstimator,
                                metaclass=abc.ABCMeta):
    """Common machinery of :class:`LaplaceActiveSubspaceRegressor` and :class:`LaplaceActiveSubspaceClassifier`.

    Subclasses name their likelihood (:meth:`_resolve_likelihood`, fitted as ``likelihood_``), extend
    ``_parameter_constraints`` with their own parameters and implement the target handling (the abstract hooks).
    """

    # Every constructor parameter → the forms it may take (any one); checked at fit by validate_hyperparameters.
    _parameter_constraints: dict = PARAMETER_CONSTRAINTS

    def __init__(self, module=None, *, module_kwargs=None, prefit=False, scaling="auto", n_components="auto",
                 max_components=50, sigma0="auto", posterior="low_rank", calibration="conformal",
                 predictive="auto", n_samples=1000, confidence_level=0.9,
                 calibration_size=0.1, max_epochs=500, lr="auto", batch_size="auto", weight_decay="auto",
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
        self._check_sigma0_rows(len(X_cal))  # sigma0="nll" with too few rows raises before training
        warned = self._warn_few_calibration_rows(y_cal, seed)
        Xt, yt, Xc, yc = self._fit_tensors(X, y, X_cal, y_cal, device, dtype, sample_weight)
        wt = None if sample_weight is None else torch.as_tensor(sample_weight, dtype=torch.float64).to(device)
        self.timings_ = {}
        self.module_ = self._theta0_module(Xt, yt, self._n_outputs(y), seed, dtype, wt)
        self._check_network_outputs(Xt, Xc)
        self._fit_posterior(Xt, yt, Xc, yc, seed, wt)
        with silenced(*(("few_calibration_rows",) if warned else ())):  # said once, before training
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
        self._calibrator().check_settings(self.likelihood_)
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

    def _seed(self) -> int:
        """One integer seed for everything random in fit (fresh entropy when random_state is None; drawn from
        it when it is a RandomState)."""
        return int(numpy_rng(self.random_state).integers(0, 2**31 - 1))

    def _posterior_kind(self) -> type[ActiveSubspacePosterior]:
        """The class of the posterior kind ``posterior`` names."""
        return resolve_posterior(self.posterior)


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
        with silenced("coverage_not_reached"):  # the whole curve is asked for, reaching the level or not
            result = choose_dimension(p, Xt, yt, confidence_level=level, d_max=d_max,
                                      predictive=self.predictive_, n_samples=self.n_samples,
                                      noise_var=self._interval_noise_var(),
                                      random_state=self.calibration_seed_, full_curve=True, verbose=self.verbose,
                                      likelihood=self.likelihood_)
        return self._table_in_user_units(result.table.reset_index(drop=True))

    def _levels(self, confidence_level) -> list[float]:
        return check_level_list(self.confidence_level if confidence_level is None else confidence_level)

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
