"""LaplaceActiveSubspaceRegressor: a torch regression network with calibrated GLAS intervals."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import RegressorMixin
from sklearn.utils import metadata_routing
from sklearn.utils.validation import check_is_fitted

from .._checks import check_target_bounds, clip_to_bounds, make_generator, numpy_rng
from .._constraints import InstanceOf, Interval, Options
from .._threads import scoped_threads
from ..calibration import resolve_calibration
from ..likelihoods import REGRESSION_LIKELIHOODS, FittedNoiseGaussian, Likelihood, resolve_likelihood
from ..scale_out import is_dask_collection, map_prediction
from ._base import LaplaceActiveSubspaceBase, TaskComponents
from ._data import InputEncoder, TargetScaler
from ._likelihood_choice import NoiseStage, RegressionNoise

__all__ = ["LaplaceActiveSubspaceRegressor"]

#: The sources ``noise_std`` names.
NOISE_SOURCES = ("auto", "calibration", "training")
#: The names that, on a network built here, take the Gaussian's network and a noise model σ(x) fitted after it:
#: tested against one constant σ ("auto"), or always kept ("heteroscedastic").
_NOISE_STAGES = {"auto": NoiseStage(test=True), "heteroscedastic": NoiseStage(test=False)}

class LaplaceActiveSubspaceRegressor(RegressorMixin, LaplaceActiveSubspaceBase):
    """Regression with a torch network and generalized Laplace active-subspace uncertainty.

    ``fit`` trains the network, takes the top eigenpairs of the generalized Gauss-Newton matrix and sets σ0 by
    empirical Bayes; the intervals ŷ ± q σ̂ are split-conformal on the calibration rows, per band of σ̂. Nothing
    fitted before the calibration sees its rows; posterior samples are seeded by ``random_state``.

    Parameters
    ----------
    module : None, torch.nn.Module, skorch net or callable, default=None
        The network, ``(n, *input_shape)`` → ``(n, outputs)`` (the mean, or the likelihood's outputs); None: an
        MLP. Copied before training.
    prefit : bool, default=False
        Use the trained module as θ0 as it is (never trained or moved); ``fit`` then needs ``X_cal, y_cal``.
    training : Training, optional
        How the network is trained (:class:`~glas_sklearn.Training`); None: ``Training()``.
    likelihood : "auto", "gaussian", "heteroscedastic", "student_t" or Likelihood, default="auto"
        "gaussian": one σ (the paper's); "heteroscedastic": σ(x) fitted after the network on its residuals
        (:class:`~glas_sklearn.likelihoods.FittedNoiseGaussian`; a variance head on a module of your own);
        "student_t": heavy tails; "auto": σ(x) where a cross-fitted test on the residuals supports it.
    noise_std : "auto", "calibration", "training" or float, default="auto"
        σ in β: from calibration or training residuals, or given (units of y). "auto": "training" under a
        conformal calibration, else "calibration" from 30 calibration rows.
    posterior : {"low_rank", "low_rank_diag", "subspace"} or Posterior, default="low_rank"
        The posterior kind and its hyperparameters (:class:`~glas_sklearn.LowRank`, ...; a name: the defaults).
    calibration : {"mondrian", "conformal", "coverage"} or Calibrator, default="mondrian"
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
    random_state : int, RandomState or None, default=None
        Seeds the calibration split, the network's initialisation and the posterior samples.
    verbose : int, default=0
        ≥ 1 writes one line per finished stage to standard error (always logged at INFO level).
    y_bounds : (low, high), one pair per output, or None, default=None
        The targets' support, e.g. ``(0, None)`` for a price (None: unbounded); outputs are clipped to it,
        which keeps every covered target covered. ``fit`` refuses targets outside it.

    Attributes
    ----------
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
        Stage times, torch threads, the input standardisation and the row shape seen in fit.
    noise_source_, noise_std_, std_scale_, y_mean_, y_scale_, likelihood_support_, y_bounds_
        The constant σ's source and value (units of y), the std's scale, the target scaling, the evidence of
        "auto" (cross-fitted NLL gain of σ(x), nats per row, and the choice), [low, high] per output.

    Examples
    --------
    >>> import numpy as np
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank, Training
    >>> X = np.random.default_rng(0).uniform(-1, 1, size=(200, 2)); y = np.sin(3 * X[:, 0])
    >>> reg = LaplaceActiveSubspaceRegressor(training=Training(max_epochs=100), posterior=LowRank(max_components=10),
    ...                                      random_state=0).fit(X, y)
    >>> reg.predict_interval(X[:5])[1].shape
    (5, 2, 1)
    """

    # return_std is an option of the output, not metadata to route
    __metadata_request__predict = {"return_std": metadata_routing.UNUSED}

    _parameter_constraints = {
        **LaplaceActiveSubspaceBase._parameter_constraints,
        "likelihood": [Options(*REGRESSION_LIKELIHOODS, "auto"),
                       InstanceOf(Likelihood, "a glas_sklearn.likelihoods.Likelihood")],
        "noise_std": [Options(*NOISE_SOURCES), Interval(numbers.Real, 0, None, closed="neither")],
        "y_bounds": [None, InstanceOf((tuple, list), "a (low, high) pair, or one pair per output")],
    }

    def __init__(self, module=None, *, prefit=False, training=None, likelihood="auto", noise_std="auto",
                 posterior="low_rank", calibration="mondrian", scaling="auto", n_components="auto", sigma0="auto",
                 confidence_level=0.9, calibration_size=0.1, compute=None, random_state=None, verbose=0,
                 y_bounds=None):
        super().__init__(module, prefit=prefit, training=training, posterior=posterior, calibration=calibration,
                         scaling=scaling, n_components=n_components, sigma0=sigma0,
                         confidence_level=confidence_level, calibration_size=calibration_size, compute=compute,
                         random_state=random_state, verbose=verbose)
        self.likelihood = likelihood
        self.noise_std = noise_std
        self.y_bounds = y_bounds

    # ------------------------------------------------------------------------------------------ hooks
    def _components(self, posterior) -> TaskComponents:
        """The likelihood (checked), the target scaler and the noise step (:class:`RegressionNoise`)."""
        likelihood = self.likelihood
        include_noise = bool(posterior.include_noise)
        # on a network built here "auto" and "heteroscedastic" take the Gaussian's network and a noise stage after
        # it; "auto" takes the Gaussian alone under "coverage" or include_noise (one constant σ) and on a user's module
        stage = _NOISE_STAGES.get(likelihood) if isinstance(likelihood, str) else None
        if stage is not None and (self.module is not None or stage.test and (
                include_noise or resolve_calibration(self.calibration).chooses_dimension)):
            stage, likelihood = None, "gaussian" if stage.test else likelihood
        if isinstance(likelihood, FittedNoiseGaussian):  # an instance: its noise model is fitted here, always
            stage = NoiseStage(test=False)
        if stage is not None:
            likelihood = FittedNoiseGaussian()
        likelihood = resolve_likelihood(likelihood)
        likelihood = type(likelihood)(**likelihood.get_params())  # as clone: checks rerun, the fit's own object
        if likelihood.is_classification:
            raise ValueError(f"LaplaceActiveSubspaceRegressor: likelihood={self.likelihood!r} is a likelihood of class "
                             "labels; use LaplaceActiveSubspaceClassifier for classification, or a regression "
                             "likelihood here (e.g. 'gaussian' or 'heteroscedastic').")
        try:  # a likelihood the regressor can calibrate describes its predictive of y and names its conformity score
            likelihood.default_conformity_score()
        except NotImplementedError as err:
            raise ValueError(f"LaplaceActiveSubspaceRegressor: likelihood {likelihood!r} is not supported: the "
                             "regressor needs a likelihood that describes its predictive of y "
                             "(Likelihood.predictive_moments / predictive_interval) and names its default conformity "
                             "score (default_conformity_score), as 'gaussian', 'heteroscedastic' and 'student_t' "
                             "do.") from err
        if include_noise and likelihood.noise_per_row:
            raise ValueError("LaplaceActiveSubspaceRegressor: posterior__include_noise applies to a likelihood with a "
                             f"constant noise; with likelihood={self.likelihood!r} the intervals and std are always "
                             "for y (σ(x) is the noise): leave include_noise=False.")
        noise = RegressionNoise(self.noise_std, include_noise, stage, self._name)
        return TaskComponents(likelihood, TargetScaler, noise)

    def _auto_low_rank_sigma0(self, calibrator) -> str:
        # Conformal intervals are rescaled, so only the shape of σ̂(x) matters, and the larger subspace-EB σ0
        # weights the off-data directions more: wider where the network extrapolates.
        return "eb_subspace"

    def _validate_train(self, X, y, settings):
        X, y, inputs = InputEncoder.from_fit_rows(self, X, y, module=self.module,
                                                  padding_idx=settings.compute.padding_idx, multi_output=True,
                                                  y_numeric=True)
        if X.shape[0] < 3:
            raise ValueError(f"LaplaceActiveSubspaceRegressor needs at least 3 samples (training and calibration "
                             f"rows), got n_samples={X.shape[0]}.")
        y = np.asarray(y, dtype=np.float64)
        if y.ndim == 2 and y.shape[1] == 0:
            raise ValueError("y has 0 columns; at least one target is needed.")
        self._y_shape = (y.ndim == 1, 1 if y.ndim == 1 else y.shape[1])
        self.y_bounds_ = check_target_bounds(self.y_bounds, y)
        return X, y, inputs

    def _validate_calibration(self, X_cal, y_cal):
        X_cal, y_cal = self._validate_X(X_cal, y_cal, multi_output=True, y_numeric=True)
        y_cal = np.asarray(y_cal, dtype=np.float64)
        y_1d, n_out = self._y_shape
        expected = (X_cal.shape[0],) if y_1d else (X_cal.shape[0], n_out)
        if y_cal.shape != expected and not (y_1d and y_cal.shape == (X_cal.shape[0], 1)):
            raise ValueError(f"y_cal has shape {y_cal.shape}, but y had {n_out} output(s): expected {expected}.")
        check_target_bounds(self.y_bounds, y_cal, "y_cal")
        return X_cal, y_cal.reshape(expected)

    def _after_calibration(self, calibrator) -> None:
        """``std_scale_``: the calibrator's scale from σ̂ to the calibrated std of ``predict(return_std=True)``
        (:meth:`~glas_sklearn.calibration.Calibrator.std_scale`)."""
        self.std_scale_ = calibrator.std_scale(self._y_shape[1])

    # -------------------------------------------------------------------------------------------- API
    def fit(self, X, y, sample_weight=None, *, X_cal=None, y_cal=None) -> "LaplaceActiveSubspaceRegressor":
        """Train the network (unless prefit), build the posterior and calibrate; returns self. ``sample_weight``:
        weights of the training rows; ``X_cal, y_cal``: rows never trained on (default: ``calibration_size``)."""
        return self._fit(X, y, X_cal, y_cal, sample_weight)

    def _predict_rows(self, X, levels=None, method=None):
        """The calibrated predictive (mean, std, bounds) of all rows of X, chunk by chunk (bounded memory);
        ``method`` names the public method for the prefit-training-rows warning."""
        rows = self._fitted_rows(X, method)  # made input tensors chunk by chunk (memory)
        return self._predict_in_chunks(rows, self._y_shape[1], lambda rows: self._calibrated_interval(rows, levels),
                                       finite=lambda part: torch.stack([part[0], part[1]]))

    @scoped_threads
    def predict(self, X, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean, and with ``return_std`` its standard deviation (conformal: σ̂(x) × ``std_scale_``;
        "coverage": the posterior's own), of shape (n_samples,) or (n_samples, n_outputs)."""
        if is_dask_collection(X):  # Dask Arrays computed on the workers (glas_sklearn.scale_out)
            return map_prediction(self, X, "predict", return_std=return_std)
        mean, std, _ = self._predict_rows(X)
        y_pred = clip_to_bounds(self._targets.to_user_units(mean), self.y_bounds_)
        y_std = self._targets.to_user_units(std, shift=False) * self.std_scale_.reshape((-1,) + (1,) * (std.ndim - 2))
        if self._y_shape[0]:
            y_pred, y_std = y_pred[:, 0], y_std[:, 0]
        return (y_pred, y_std) if return_std else y_pred

    @scoped_threads
    def predict_interval(self, X, confidence_level=None) -> tuple[np.ndarray, np.ndarray]:
        """Central (1 − γ) intervals at ``confidence_level`` (default: the estimator's): ``y_pred`` and ``y_pis``
        of shape (n_samples, 2, k) or (n_samples, n_outputs, 2, k), lower and upper bounds per level."""
        if is_dask_collection(X):  # Dask Arrays computed on the workers (glas_sklearn.scale_out)
            return map_prediction(self, X, "predict_interval", confidence_level=confidence_level)
        check_is_fitted(self, "posterior_")
        levels = self._levels(confidence_level)
        mean, _, bounds = self._predict_rows(X, levels, method="predict_interval")
        y_pred = clip_to_bounds(self._targets.to_user_units(mean), self.y_bounds_)
        b = bounds.detach().cpu().double().numpy() * self._targets.y_scale[None, :, None, None] \
            + self._targets.y_mean[None, :, None, None]
        b = clip_to_bounds(b, self.y_bounds_)  # clipping to the support keeps every covered target covered
        if self._y_shape[0]:
            return y_pred[:, 0], b[:, 0]
        return y_pred, b

    @scoped_threads
    def predict_noise_std(self, X) -> np.ndarray:
        """The noise level σ_ale(x) per row in the units of y: the noise model's σ(x), or ``noise_std_``."""
        Xt = self._check_fitted_X(X)
        var = self.likelihood_.row_noise_variance(self.module_, Xt)  # None: one constant noise level
        if var is None:
            std = np.broadcast_to(np.atleast_1d(self.noise_std_), (Xt.shape[0], self._y_shape[1])).copy()
        else:
            self._check_finite_rows(var, Xt)
            std = self._targets.to_user_units(var.sqrt(), shift=False)
        return std[:, 0] if self._y_shape[0] else std

    @scoped_threads
    def sample_y(self, X, n_samples: int = 1, random_state=0) -> np.ndarray:
        """Posterior draws of f(x; θ) (of y with ``include_noise`` or σ(x)), unrescaled, clipped to ``y_bounds``."""
        Xt = self._check_fitted_X(X)
        s = self._posterior_draws(Xt, n_samples, random_state)
        gen = make_generator(None if random_state is None else numpy_rng(random_state).integers(2**62) + 1, s.device)
        noise_var = self.likelihood_.row_noise_variance(self.module_, Xt)  # σ²(x), or None: the constant's
        if noise_var is None and self._noise_step.include_noise:
            noise_var = self._noise_step.noise_var
        s = self.likelihood_.draw_y(s, noise_var, gen)
        self._check_finite_rows(s.transpose(0, 1), Xt)
        out = clip_to_bounds(self._targets.to_user_units(s.permute(1, 2, 0)), self.y_bounds_)
        return out[:, 0, :] if self._y_shape[0] else out

    @scoped_threads
    def score(self, X, y, sample_weight=None) -> float:
        """R² of :meth:`predict` (a prefit network's training rows raise a PrefitLeakageWarning)."""
        self._score_rows(X)
        return super().score(X, y, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags
