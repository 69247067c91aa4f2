"""LaplaceActiveSubspaceRegressor: a torch regression network with calibrated GLAS intervals."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import RegressorMixin
from sklearn.utils.validation import check_is_fitted
from torch import nn

from .._checks import make_generator, numpy_rng
from .._threads import scoped_threads
from ..likelihoods import REGRESSION_LIKELIHOODS, FittedNoiseGaussian, Likelihood, resolve_likelihood
from ._base import LaplaceActiveSubspaceBase
from ._docs import (
    ATTRIBUTES_DOC,
    NOTES_DOC,
    PARAMETERS_DOC,
    REGRESSOR_ATTRIBUTES_DOC,
    REGRESSOR_PARAMETERS_DOC,
    SAMPLE_WEIGHT_DOC,
)
from ._likelihood_choice import fit_noise_stage
from ._observation_noise import NOISE_SOURCES, ObservationNoiseMixin
from ._output_layout import OutputLayoutMixin
from ._regression_targets import RegressionTargetsMixin
from ._validation import BOOLEAN, InstanceOf, Interval, Options

__all__ = ["LaplaceActiveSubspaceRegressor"]

# The likelihood names the regressor takes (resolve_likelihood turns them into objects).
_LIKELIHOODS = (*REGRESSION_LIKELIHOODS, "auto")
# On a network built here: the names that take the Gaussian's network and a noise model σ(x) fitted after it, and
# whether σ(x) is tested against a constant σ ("auto": where the intervals are conformal ones made from σ̂).
_NOISE_STAGE = {"auto": True, "heteroscedastic": False}


class LaplaceActiveSubspaceRegressor(ObservationNoiseMixin, RegressionTargetsMixin, OutputLayoutMixin, RegressorMixin,
                                     LaplaceActiveSubspaceBase):
    __doc__ = f"""Regression with a torch network and generalized Laplace active-subspace uncertainty.

    ``fit`` trains the network (unless ``prefit``), builds the generalized Gauss-Newton matrix of the
    ½-squared loss matrix-free, takes its top eigenpairs and sets the prior scale σ0 by empirical Bayes.
    By default (``posterior="low_rank", calibration="mondrian"``) the posterior keeps the prior's variance
    off the top-d eigenvectors and the intervals ŷ ± q σ̂ are split-conformal on the calibration rows
    (coverage ≥ ``confidence_level`` for exchangeable data), with one q per band of σ̂ once there are enough
    calibration rows (at least 200 a band) so that the level also holds where σ̂ is small or large; the paper's method,
    ``posterior="subspace", calibration="coverage"``, instead chooses the subspace dimension d as the smallest
    one whose intervals cover ``confidence_level`` of the calibration data.

    Parameters
    ----------
{PARAMETERS_DOC}
{REGRESSOR_PARAMETERS_DOC}
    Attributes
    ----------
{ATTRIBUTES_DOC}
{REGRESSOR_ATTRIBUTES_DOC}

    Notes
    -----
{NOTES_DOC}

    Examples
    --------
    >>> import numpy as np
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-1, 1, size=(200, 2)); y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(200)
    >>> reg = LaplaceActiveSubspaceRegressor(max_epochs=100, n_samples=200, max_components=10,
    ...                                      random_state=0).fit(X, y)
    >>> y_pred, y_pis = reg.predict_interval(X[:5])
    >>> y_pis.shape
    (5, 2, 1)
    """

    _parameter_constraints: dict = {
        **LaplaceActiveSubspaceBase._parameter_constraints,
        "likelihood": [Options(*_LIKELIHOODS), InstanceOf(Likelihood, "a glas_sklearn.likelihoods.Likelihood")],
        "noise_std": [Options(*NOISE_SOURCES), Interval(numbers.Real, 0, None, closed="neither")],
        "include_noise": [BOOLEAN],
    }

    def __init__(self, module=None, *, module_kwargs=None, prefit=False, scaling="auto", n_components="auto",
                 max_components=50, sigma0="auto", posterior="low_rank", calibration="mondrian",
                 predictive="auto", n_samples=1000, confidence_level=0.9, calibration_size=0.1,
                 likelihood="auto", noise_std="auto", include_noise=False, max_epochs=500, lr="auto",
                 batch_size="auto", weight_decay=0.0, optimizer="adam", standardize="auto", padding_idx=None,
                 subsample="auto", eigen_method="lanczos", device="auto", dtype="auto", random_state=None, verbose=0,
                 early_stopping="auto", validation_fraction=0.1, n_iter_no_change=10, tol=1e-4,
                 n_threads="auto", working_memory=64):
        super().__init__(
            module, module_kwargs=module_kwargs, prefit=prefit, scaling=scaling, n_components=n_components,
            max_components=max_components, sigma0=sigma0, posterior=posterior, calibration=calibration,
            predictive=predictive, n_samples=n_samples,
            confidence_level=confidence_level, calibration_size=calibration_size, max_epochs=max_epochs, lr=lr,
            batch_size=batch_size, weight_decay=weight_decay, optimizer=optimizer, standardize=standardize,
            padding_idx=padding_idx, subsample=subsample, eigen_method=eigen_method, device=device, dtype=dtype,
            random_state=random_state, verbose=verbose, early_stopping=early_stopping,
            validation_fraction=validation_fraction, n_iter_no_change=n_iter_no_change, tol=tol,
            n_threads=n_threads, working_memory=working_memory)
        self.likelihood = likelihood
        self.noise_std = noise_std
        self.include_noise = include_noise

    # ------------------------------------------------------------------ hooks
    def _resolve_likelihood(self) -> Likelihood:
        likelihood = self.likelihood
        # names that on a network built here take the Gaussian's network and a noise model after it (_theta0_module)
        tested, own = _NOISE_STAGE.get(likelihood) if isinstance(likelihood, str) else None, self.module is None
        paper = self.include_noise or self._calibrator().chooses_dimension  # a constant σ: the Gaussian
        self._choose_likelihood = bool(tested) and own and not paper
        self._fit_noise = self._choose_likelihood or (tested is False and own)
        likelihood = FittedNoiseGaussian() if self._fit_noise else "gaussian" if tested else likelihood
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
        return likelihood

    def _theta0_module(self, Xt, yt, n_outputs, seed, dtype, sample_weight=None) -> nn.Module:
        self.likelihood_support_ = None  # "auto" on a network built here: the noise model tested after training
        module = super()._theta0_module(Xt, yt, n_outputs, seed, dtype, sample_weight)
        if self._fit_noise:
            fit_noise_stage(self, module, Xt, yt, seed, sample_weight, choose=self._choose_likelihood)
        return module

    def _resolved_scaling(self):
        if self.scaling == "auto":
            return self.likelihood_.default_scaling
        return self.scaling

    def _auto_low_rank_sigma0(self) -> str:
        # Conformal intervals are rescaled, so only the shape of σ̂(x) matters, and the larger subspace-EB σ0
        # weights the off-data directions more: wider where the network extrapolates
        # (benchmarks/results/uci_intervals.md, uci_shift.md).
        return "eb_subspace"

    def _choose_dimension(self, Xc, yc, seed: int) -> None:
        super()._choose_dimension(Xc, yc, seed)
        self._set_std_scale()

    def _set_std_scale(self) -> None:
        """``std_scale_``: with conformal calibration the root mean square of the calibration scores per output, the
        Gaussian maximum-likelihood scale that turns σ̂ into the calibrated std of ``predict(return_std=True)``;
        ones otherwise."""
        if self.conformity_scores_ is not None:
            sc = np.asarray(self.conformity_scores_, dtype=np.float64).reshape(len(self.conformity_scores_), -1)
            self.std_scale_ = np.sqrt(np.mean(sc**2, axis=0))
        else:
            self.std_scale_ = np.ones(self._n_out)

    # ------------------------------------------------------------------- API
    def fit(self, X, y, sample_weight=None, *, X_cal=None, y_cal=None) -> "LaplaceActiveSubspaceRegressor":
        """Train the network (unless prefit), build the posterior and choose d.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
        sample_weight
        X_cal, y_cal : array-like, optional
            Calibration rows, never used for training: the conformal scores, or the rows d is chosen on. When
            absent, ``calibration_size`` of ``X`` is held out of training.
            With ``prefit=True`` they are required and must be rows the network was not trained on (``X``
            being its training rows). Inside a Pipeline, rely on ``calibration_size``: ``X_cal`` passed as a
            fit parameter reaches this step without going through the earlier steps' transforms (with
            ``prefit=True`` pass it transformed, or put the preprocessing inside the network).

        Returns
        -------
        self
        """
        return self._fit(X, y, X_cal, y_cal, sample_weight)

    fit.__doc__ = fit.__doc__.replace("        sample_weight\n", SAMPLE_WEIGHT_DOC + "\n")

    def _predictive(self, Xt: torch.Tensor, levels=None):
        """For one chunk of rows, in internal units: the predictive mean and standard deviation (of f, or
        of y with ``include_noise``), (n, M) each, and the interval bounds (n, M, 2, k) when ``levels``, as
        the fitted calibrator makes them ("conformal": ŷ ± q σ̂; "coverage": the posterior's own intervals).
        The likelihood supplies the predictive of y (heteroscedastic: N(μ̂, σ_ale² + σ_epi²))."""
        return self.calibrator_.predict_interval(self.posterior_, Xt, levels)

    def _predict_rows(self, X, levels=None, method=None):
        """:meth:`_predictive` over all rows of X, chunk by chunk (bounded memory for large X); ``method`` names
        the public method for the prefit-training-rows warning."""
        rows = self._fitted_rows(X, method)  # made input tensors chunk by chunk (memory)
        mean, std, bounds = self._predict_in_chunks(rows, self._n_out, lambda rows: self._predictive(rows, levels),
                                                    finite=lambda part: torch.stack([part[0], part[1]]))
        return mean, std, bounds

    @scoped_threads
    def predict(self, X, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean (sampled: the mean over posterior samples; linearised: f(x; θ0)).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        return_std : bool, default=False
            Also return the predictive standard deviation of y. With conformal calibration it is calibrated:
            the conformal normalisation σ̂(x) (heteroscedastic: sqrt(σ_ale²(x) + σ_epi²(x)); homoscedastic: σ_f,
            or σ_f ⊕ σ with ``include_noise``) times ``std_scale_``, the root mean square of the calibration
            scores ``|y − ŷ|/σ̂``, so that N(ŷ, std²) has the maximum-likelihood scale on the calibration rows
            (``calibration="mondrian"``, the default: the scale of the row's σ̂ band, one per band).
            With ``calibration="coverage"`` (the paper) it is the posterior's own: of f, or of y (``noise_std_``
            added in quadrature) with ``include_noise=True``, or heteroscedastic sqrt(σ_ale² + σ_epi²).

        Returns
        -------
        y_pred : ndarray of shape (n_samples,) or (n_samples, n_outputs)
        y_std : ndarray, same shape, only with ``return_std``
        """
        mean, std, _ = self._predict_rows(X)
        y_pred = self._to_user_units(mean)
        y_std = self._to_user_units(std, shift=False) * self.std_scale_.reshape((-1,) + (1,) * (std.ndim - 2))
        if self._y_1d:
            y_pred, y_std = y_pred[:, 0], y_std[:, 0]
        return (y_pred, y_std) if return_std else y_pred

    @scoped_threads
    def predict_interval(self, X, confidence_level=None) -> tuple[np.ndarray, np.ndarray]:
        """Central (1 − γ) intervals: split-conformal ŷ ± q σ̂ for y (``calibration="mondrian"``: q per band of σ̂;
        ``"conformal"``: one q), or those of
        the GLAS predictive (for f, or for y with ``include_noise=True``; ``calibration="coverage"``).

        A level the estimator was not fitted with works too: conformal quantiles are computed from the stored
        calibration scores (infinite intervals, with a warning, when there are fewer than 1/γ − 1 rows).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        confidence_level : float or list of float, optional
            Defaults to the estimator's ``confidence_level``.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,) or (n_samples, n_outputs)
        y_pis : ndarray of shape (n_samples, 2, k) or (n_samples, n_outputs, 2, k)
            Lower ([:, 0, :]) and upper ([:, 1, :]) bounds for each of the k levels (the level axis is kept).
        """
        check_is_fitted(self, "posterior_")
        levels = self._levels(confidence_level)
        mean, _, bounds = self._predict_rows(X, levels, method="predict_interval")
        y_pred = self._to_user_units(mean)
        b = bounds.detach().cpu().double().numpy() * self.y_scale_[None, :, None, None] \
            + self.y_mean_[None, :, None, None]
        if self._y_1d:
            return y_pred[:, 0], b[:, 0]
        return y_pred, b

    @scoped_threads
    def predict_noise_std(self, X) -> np.ndarray:
        """The noise level σ_ale(x) per row, in the units of y: the noise model's σ(x) with
        ``likelihood="heteroscedastic"`` (or "auto" that chose it; a variance head: its σ(x; θ0)), else the constant
        ``noise_std_`` (the epistemic part is in ``predict(return_std=True)``, which adds it in quadrature).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
        """
        Xt = self._check_fitted_X(X)
        var = self.likelihood_.row_noise_variance(self.module_, Xt)  # None: one constant noise level
        std = (np.broadcast_to(np.atleast_1d(self.noise_std_), (Xt.shape[0], self._n_out)).copy() if var is None
               else self._to_user_units(var.sqrt(), shift=False))  # (a variance head's outputs are checked finite)
        return std[:, 0] if self._y_1d else std

    @scoped_threads
    def sample_y(self, X, n_samples: int = 1, random_state=0) -> np.ndarray:
        """Draws of f(x; θ) for θ from the posterior, pushed through the network (plus N(0, σ²) noise
        with ``include_noise=True``: draws of y). With ``likelihood="heteroscedastic"``, draws of y: for each θ,
        y = μ(x; θ) + σ(x) ε with ε ~ N(0, 1) (σ(x) the noise model's, or a variance head's σ(x; θ)).

        With ``posterior="low_rank"`` and the linearised predictive they are draws of the linearised network
        f(x; θ0) + J(x)(θ − θ0), whose distribution is the linearised predictive; either way they are the
        posterior's, not conformally rescaled.

        Parameters
        ----------
        X : array-like of shape (n_samples_X, n_features) or ``(n_samples_X, *input_shape_)``
        n_samples : int, default=1
        random_state : int or None, default=0

        Returns
        -------
        ndarray of shape (n_samples_X, n_samples) or (n_samples_X, n_outputs, n_samples)
        """
        Xt = self._check_fitted_X(X)
        p = self.posterior_
        s = self.predictive_.draw_outputs(p, Xt, self.n_components_, n_samples, random_state=random_state)
        gen = make_generator(None if random_state is None else numpy_rng(random_state).integers(2**62) + 1, s.device)
        noise_var = self.likelihood_.row_noise_variance(self.module_, Xt)  # σ²(x), or None: the constant's
        s = self.likelihood_.draw_y(s, self._noise_var_out if noise_var is None and self.include_noise else noise_var,
                                    gen)
        self._check_finite_rows(s.transpose(0, 1), Xt)
        out = self._to_user_units(s.permute(1, 2, 0))
        return out[:, 0, :] if self._y_1d else out

    @scoped_threads
    def score(self, X, y, sample_weight=None) -> float:
        """R² of :meth:`predict` (scikit-learn's ``RegressorMixin.score``); rows that were training rows of a
        prefit network raise a :class:`~glas_sklearn.PrefitLeakageWarning`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
        sample_weight : array-like of shape (n_samples,), optional

        Returns
        -------
        float
        """
        check_is_fitted(self, "posterior_")
        self._warn_if_prefit_training_rows(self._validate_X(X, reset=False), "score")
        return super().score(X, y, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags
