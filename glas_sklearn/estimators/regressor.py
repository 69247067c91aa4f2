"""LaplaceActiveSubspaceRegressor: a torch regression network with calibrated GLAS intervals."""

from __future__ import annotations

import numbers
import warnings

import numpy as np
import torch
from sklearn.base import RegressorMixin
from sklearn.utils.validation import check_is_fitted
from torch import nn

from .._checks import make_generator, numpy_rng
from .._functional import eval_view, model_outputs
from .._threads import scoped_threads
from ..laplace import residual_noise_variance
from ..likelihoods import REGRESSION_LIKELIHOODS, Likelihood, resolve_likelihood
from ._base import LaplaceActiveSubspaceBase
from ._docs import ATTRIBUTES_DOC, NOTES_DOC, PARAMETERS_DOC, SAMPLE_WEIGHT_DOC
from ._likelihood_choice import choose_auto_likelihood
from ._validation import BOOLEAN, InstanceOf, Interval, Options

__all__ = ["LaplaceActiveSubspaceRegressor"]

_NOISE_SOURCES = ("auto", "calibration", "training")
# The likelihood names the regressor takes (resolve_likelihood turns them into objects).
_LIKELIHOODS = (*REGRESSION_LIKELIHOODS, "auto")
# Below this many held-out rows the residual variance is too noisy to prefer it over the training residuals.
_MIN_CALIBRATION_ROWS_FOR_NOISE = 30


class LaplaceActiveSubspaceRegressor(RegressorMixin, LaplaceActiveSubspaceBase):
    __doc__ = f"""Regression with a torch network and generalized Laplace active-subspace uncertainty.

    ``fit`` trains the network (unless ``prefit``), builds the generalized Gauss-Newton matrix of the
    ½-squared loss matrix-free, takes its top eigenpairs and sets the prior scale σ0 by empirical Bayes.
    By default (``posterior="low_rank", calibration="conformal"``) the posterior keeps the prior's variance
    off the top-d eigenvectors and the intervals ŷ ± q σ̂ are split-conformal on the calibration rows
    (coverage ≥ ``confidence_level`` for exchangeable data); the paper's method,
    ``posterior="subspace", calibration="coverage"``, instead chooses the subspace dimension d as the smallest
    one whose intervals cover ``confidence_level`` of the calibration data.

    Parameters
    ----------
{PARAMETERS_DOC}
    likelihood : "auto", "gaussian", "heteroscedastic", "student_t" or Likelihood, default="auto"
        "auto": "heteroscedastic" when the data support a noise level that varies with x, "gaussian" otherwise.
        On a network the estimator builds, with conformal intervals, ``fit`` trains both networks and compares
        their negative log-likelihood on rows neither was trained on (the early-stopping validation rows, else 20 %
        of the training rows, after which the chosen network is trained on all of them; never the calibration
        rows): heteroscedastic when it is lower by more than one standard error (``likelihood_support_``;
        fewer than 100 training rows: "gaussian"). A module of your own, ``include_noise=True`` and the
        paper's ``calibration="coverage"`` take "gaussian" (benchmarks/results/likelihood_auto.md,
        naval_like.md). "gaussian": y = f(x) + ε with one noise level σ per output (the paper's).
        "heteroscedastic"
        (:class:`~glas_sklearn.likelihoods.HeteroscedasticGaussian`): per target the network outputs a mean μ(x)
        and a variance parameter, so the noise level σ(x) varies with x. The default MLP then has 2k outputs
        [μ_1 … μ_k, log σ²_1 … log σ²_k] and is trained with β-NLL (Seitzer et al. 2022; ``beta_nll=0.5`` of the
        likelihood object; the plain NLL starves the mean of gradient where σ is large). A module of your own
        (trained here, or ``prefit``) must output 2k columns in the layout it declares:
        ``HeteroscedasticGaussian(output="mean_logvar")`` (means, then log-variances) or ``output="natural"``
        (η1 = μ/σ², then η2 = −1/(2σ²) < 0; end the module with
        :class:`~glas_sklearn.likelihoods.NaturalParameterHead` to map free outputs there). The curvature is
        the GGN with the Fisher output Hessian diag(1/σ², ½) (exact Hessian in natural parameters), β = N under
        ``scaling="auto"``, and the predictive for y is N(μ(x), σ²(x) + σ_epi²(x)), σ_epi² the posterior
        variance of the mean output (linearised J_μ Σ J_μᵀ, or sampled); conformal scores are normalised by
        that total σ̂, and ``calibration="coverage"`` chooses d on its Gaussian intervals. ``include_noise``
        does not apply (σ(x) is always included). "student_t"
        (:class:`~glas_sklearn.likelihoods.StudentT`, ν = 4 by name; pass ``StudentT(df=...)`` for another ν):
        heavy-tailed noise; its intervals for y (``include_noise=True``) are the quantiles of f + s t_ν. Any
        :class:`~glas_sklearn.likelihoods.Likelihood` of regression that names its default conformity score plugs
        in the same way (the regressor asks the object, never its kind).
    noise_std : "auto", "calibration", "training" or float, default="auto"
        Observation-noise standard deviation σ in β: from the residuals of the held-out calibration rows
        ("calibration"), from the training residuals ("training", the paper's choice), or given (in the
        units of y). "auto" takes the calibration residuals when there are at least 30 calibration rows and
        the training residuals otherwise: a network that fits its training data closely understates σ from
        its training residuals (11–22× in σ² for the paper's 10⁶-weight concrete network), which inflates β and d
        and under-covers new data (benchmarks/results/paper_concrete.md). For small, well-regularised networks
        the training residuals are unbiased enough and give somewhat narrower intervals (benchmarks/results/uci.md:
        about 7 % better interval scores), so "training" is the better choice there. The same calibration rows
        also choose d. With ``calibration="conformal"``, "auto" is "training": σ from the calibration rows
        would make the scores depend on those rows and void the finite-sample guarantee (a warning says so
        when "calibration" is asked for).
    include_noise : bool, default=False
        False (the paper): intervals, ``predict(return_std=True)`` and ``sample_y`` describe the network
        output f(x; θ) under the weight posterior, and d is chosen so that these intervals cover y.
        True: they describe y = f(x; θ) + ε with ε ~ N(0, σ²), σ = ``noise_std_`` per output (exact
        Gaussian-mixture quantiles for the sampled predictive), and d is chosen for those intervals:
        prediction intervals in the usual statistical sense, usually reaching the level at a smaller d.
        With ``calibration="conformal"`` the intervals are for y either way; ``include_noise`` sets the
        scale the scores are normalised by, σ̂² = σ_f² (False) or σ_f² + σ² (True), which
        ``predict(return_std=True)`` returns (times ``std_scale_``).
    Attributes
    ----------
{ATTRIBUTES_DOC}
    noise_source_ : {{"calibration", "training", "given", "heteroscedastic"}}
        Where σ came from ("heteroscedastic": the network's own σ(x), see :meth:`predict_noise_std`).
    noise_std_ : float or ndarray
        σ in the units of y (per output for multi-output y); heteroscedastic: the root mean σ²(x) over the
        training rows.
    std_scale_ : ndarray of shape (n_outputs,)
        With ``calibration="conformal"``: the root mean square of the calibration scores ``|y − ŷ|/σ̂``, the
        Gaussian maximum-likelihood scale by which ``predict(return_std=True)`` multiplies σ̂ (ones otherwise).
    y_mean_, y_scale_ : ndarray
        The internal standardisation of the targets (zeros and ones when off or prefit).
    likelihood_support_ : dict or None
        With ``likelihood="auto"`` on a network built here: the evidence of the choice, ``chosen`` (the
        likelihood's name), ``supported``, ``nll_gain`` (mean held-out NLL of the Gaussian network minus that of
        the heteroscedastic one, nats per row, each with one noise scale fitted on those rows), ``nll_gain_se``,
        ``z``, ``n_rows``, ``rows`` (which rows), the fitted scales and ``seconds``; None otherwise.

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
        "noise_std": [Options(*_NOISE_SOURCES), Interval(numbers.Real, 0, None, closed="neither")],
        "include_noise": [BOOLEAN],
    }

    def __init__(self, module=None, *, module_kwargs=None, prefit=False, scaling="auto", n_components="auto",
                 max_components=50, sigma0="auto", posterior="low_rank", calibration="conformal",
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
        # "auto": a variance head only on a network built here, for intervals the conformal calibrator makes from σ̂,
        # kept when held-out rows support it (_theta0_module); the Gaussian under the paper's calibration or noise
        self._choose_likelihood = (isinstance(likelihood, str) and likelihood == "auto" and self.module is None
                                   and not self.include_noise and not self._calibrator().chooses_dimension)
        if isinstance(likelihood, str) and likelihood == "auto":
            likelihood = "heteroscedastic" if self._choose_likelihood else "gaussian"
        likelihood = resolve_likelihood(likelihood)
        if likelihood.is_classification:
            raise ValueError(f"LaplaceActiveSubspaceRegressor: likelihood={self.likelihood!r} is a likelihood of class "
                             "labels; use LaplaceActiveSubspaceClassifier for classification, or a regression "
                             "likelihood here (e.g. 'gaussian' or 'heteroscedastic').")
        try:  # a likelihood the regressor can calibrate describes its predictive of y and names its conformity score
            likelihood.default_conformity_score()
        except NotImplementedError as err:
            raise ValueError(f"LaplaceActiveSubspaceRegressor: likelihood {likelihood!r} is not supported: the "
                             "regressor "
                             "needs a likelihood that describes its predictive of y (Likelihood.predictive_moments / "
                             "predictive_interval) and names its default conformity score (default_conformity_score), "
                             "as 'gaussian', 'heteroscedastic' and 'student_t' do.") from err
        return likelihood

    def _theta0_module(self, Xt, yt, n_outputs, seed, dtype, sample_weight=None) -> nn.Module:
        self.likelihood_support_ = None  # "auto" on a network built here: both trained, the support tested
        if self._choose_likelihood:
            return choose_auto_likelihood(self, super()._theta0_module, Xt, yt, seed, dtype, sample_weight)
        return super()._theta0_module(Xt, yt, n_outputs, seed, dtype, sample_weight)

    def _resolved_scaling(self):
        if self.scaling == "auto":
            return self.likelihood_.default_scaling
        return self.scaling

    def _auto_low_rank_sigma0(self) -> str:
        # Conformal intervals are rescaled, so only the shape of σ̂(x) matters, and the larger subspace-EB σ0
        # weights the off-data directions more: wider where the network extrapolates
        # (benchmarks/results/uci_intervals.md, uci_shift.md).
        return "eb_subspace"

    def _validate_train(self, X, y):
        X, y = self._validate_X(X, y, reset=True, multi_output=True, y_numeric=True)
        if X.shape[0] < 3:
            raise ValueError(f"LaplaceActiveSubspaceRegressor needs at least 3 samples (training and calibration "
                             f"rows), got n_samples={X.shape[0]}.")
        y = np.asarray(y, dtype=np.float64)
        if y.ndim == 2 and y.shape[1] == 0:
            raise ValueError("y has 0 columns; at least one target is needed.")
        self._y_1d = y.ndim == 1
        self._n_out = 1 if y.ndim == 1 else y.shape[1]
        if self.include_noise and self.likelihood_.noise_in_outputs:
            raise ValueError("LaplaceActiveSubspaceRegressor: include_noise applies to a likelihood with a constant "
                             f"noise; with likelihood={self.likelihood!r} the intervals and std are always for y (the "
                             "network's σ(x) is the noise): leave include_noise=False.")
        return X, y

    def _validate_calibration(self, X_cal, y_cal):
        X_cal, y_cal = self._validate_X(X_cal, y_cal, reset=False, multi_output=True, y_numeric=True)
        y_cal = np.asarray(y_cal, dtype=np.float64)
        expected = (X_cal.shape[0],) if self._y_1d else (X_cal.shape[0], self._n_out)
        if y_cal.shape != expected and not (self._y_1d and y_cal.shape == (X_cal.shape[0], 1)):
            raise ValueError(f"y_cal has shape {y_cal.shape}, but y had {self._n_out} output(s): expected {expected}.")
        return X_cal, y_cal.reshape(expected)

    def _n_outputs(self, y) -> int:
        return self.likelihood_.n_outputs(1 if y.ndim == 1 else y.shape[1])

    def _build_module(self, n_features: int, n_outputs: int, seed: int) -> nn.Module:
        module = super()._build_module(n_features, n_outputs, seed)
        return module if self.module is not None else self.likelihood_.wrap_module(module)

    def _check_output_shape(self, module, x1, n_outputs) -> None:
        try:
            with torch.no_grad():
                out = eval_view(module)(x1)
        except (RuntimeError, TypeError, IndexError, ValueError):  # reported by the base check
            out = None
        if isinstance(out, torch.Tensor):
            try:
                self.likelihood_.check_module_output(out, n_outputs)
            except ValueError as err:
                raise ValueError(f"LaplaceActiveSubspaceRegressor: {err}") from err
        super()._check_output_shape(module, x1, n_outputs)

    def _fit_scalers(self, X, y, sample_weight=None) -> None:
        super()._fit_scalers(X, y, sample_weight)
        Y = y.reshape(len(y), -1)
        if self.standardize is not False and not self.prefit:
            self.y_mean_, scale = self._standardisation(Y, sample_weight, "y")
            scale[~(scale > 0)] = 1.0
            self.y_scale_ = scale
        else:
            self.y_mean_ = np.zeros(Y.shape[1])
            self.y_scale_ = np.ones(Y.shape[1])

    def _target_tensor(self, y, device, dtype) -> torch.Tensor:
        Y = (y.reshape(len(y), -1) - self.y_mean_) / self.y_scale_
        return self._to_tensor(Y, device, dtype, "y")

    _calibration_targets = _target_tensor

    def _table_in_user_units(self, table):
        if len(self.y_scale_) == 1 and "mean_width" in table:
            table = table.assign(mean_width=table["mean_width"] * float(self.y_scale_[0]))
        return table

    def _noise_var(self, module, Xt, yt, Xc, yc, sample_weight=None):
        """σ² for β (pooled over outputs, internal units; training residuals weighted by ``sample_weight``,
        calibration residuals unweighted); the per-output values are kept for intervals. Heteroscedastic: no σ²
        enters β; the mean of σ²(x) over the training rows is kept for ``noise_std_``."""
        if self.likelihood_.noise_in_outputs:
            out = model_outputs(module, Xt)
            self.likelihood_.check_output(out, "the module")
            self.noise_source_ = self.likelihood_.name
            var = self.likelihood_.noise_variance(out).to(torch.float64)
            self._noise_var_out = var.reshape(len(out), -1).mean(0).cpu().numpy()
            return None
        source = self.noise_std
        if source == "auto":
            enough = len(Xc) >= _MIN_CALIBRATION_ROWS_FOR_NOISE
            source = "calibration" if enough and not self._calibrator().requires_fixed_predictor else "training"
        elif source == "calibration" and self._calibrator().requires_fixed_predictor:
            warnings.warn("LaplaceActiveSubspaceRegressor: noise_std='calibration' with calibration='conformal' "
                          "estimates σ from the calibration rows, so the conformal scores depend on those rows "
                          "and the coverage guarantee is only approximate; use noise_std='training' or a "
                          "given σ for the exact guarantee.", UserWarning, stacklevel=4)
        self.noise_source_ = source if isinstance(source, str) else "given"
        if source == "training":
            per_output = residual_noise_variance(module, Xt, yt, per_output=True, sample_weight=sample_weight)
        elif source == "calibration":
            if len(Xc) < 2:
                raise ValueError(f"noise_std='calibration' needs at least 2 calibration rows, got {len(Xc)}.")
            per_output = residual_noise_variance(module, Xc, yc, per_output=True)
        else:
            per_output = (float(self.noise_std) / self.y_scale_) ** 2
        self._noise_var_out = np.asarray(per_output, dtype=np.float64)
        return float(np.mean(self._noise_var_out))

    def _set_noise(self) -> None:
        std = np.sqrt(self._noise_var_out) * self.y_scale_
        if not isinstance(self.noise_std, str):
            std = np.full_like(std, float(self.noise_std))  # a given σ is reported exactly as given
        self.noise_std_ = float(std[0]) if self._y_1d else std

    def _interval_noise_var(self):
        return self._noise_var_out if self.include_noise else 0.0

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

    def _to_user_units(self, t: torch.Tensor, shift: bool = True) -> np.ndarray:
        out = t.detach().cpu().double().numpy() * self.y_scale_.reshape((-1,) + (1,) * (t.ndim - 2))
        if shift:
            out = out + self.y_mean_.reshape((-1,) + (1,) * (t.ndim - 2))
        return out

    @scoped_threads
    def predict(self, X, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean (sampled: the mean over posterior samples; linearised: f(x; θ0)).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``
        return_std : bool, default=False
            Also return the predictive standard deviation of y. With ``calibration="conformal"`` it is calibrated:
            the conformal normalisation σ̂(x) (heteroscedastic: sqrt(σ_ale²(x) + σ_epi²(x)); homoscedastic: σ_f,
            or σ_f ⊕ σ with ``include_noise``) times ``std_scale_``, the root mean square of the calibration
            scores ``|y − ŷ|/σ̂``, so that N(ŷ, std²) has the maximum-likelihood scale on the calibration rows.
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
        """Central (1 − γ) intervals: split-conformal ŷ ± q σ̂ for y (``calibration="conformal"``), or those of
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
        """The noise level σ_ale(x) per row, in the units of y: the network's own σ(x; θ0) with
        ``likelihood="heteroscedastic"``, the constant ``noise_std_`` otherwise (the aleatoric part; the
        epistemic part is in ``predict(return_std=True)``, which adds it in quadrature).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or ``(n_samples, *input_shape_)``

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
        """
        Xt = self._check_fitted_X(X)
        if self.likelihood_.noise_in_outputs:
            out = model_outputs(self.module_, Xt)
            self._check_finite_rows(out, Xt)
            std = self._to_user_units(self.likelihood_.noise_variance(out).sqrt(), shift=False)
        else:
            std = np.broadcast_to(np.atleast_1d(self.noise_std_), (Xt.shape[0], self._n_out)).copy()
        return std[:, 0] if self._y_1d else std

    @scoped_threads
    def sample_y(self, X, n_samples: int = 1, random_state=0) -> np.ndarray:
        """Draws of f(x; θ) for θ from the posterior, pushed through the network (plus N(0, σ²) noise
        with ``include_noise=True``: draws of y). With ``likelihood="heteroscedastic"``, draws of y: for each θ,
        y = μ(x; θ) + σ(x; θ) ε with ε ~ N(0, 1).

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
        s = self.likelihood_.draw_y(s, self._noise_var_out if self.include_noise else None, gen)
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
