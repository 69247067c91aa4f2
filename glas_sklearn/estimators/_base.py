"""Shared fit logic of the two estimators: validation, the network, training, the posterior and d."""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import numbers
import time
import warnings

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.base import BaseEstimator
from sklearn.model_selection import train_test_split
from sklearn.utils.validation import check_is_fitted, validate_data
from torch import nn

from .._checks import check_confidence_levels, numpy_rng
from .._functional import eval_view
from .._progress import progress
from ..calibration import CalibrationWarning, choose_dimension
from ..laplace import fit_laplace_subspace

__all__ = ["LaplaceActiveSubspaceBase", "default_mlp"]

logger = logging.getLogger(__name__)

_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
# Fitted state that holds torch objects; pickled through torch.save so that tensors can be re-mapped on load.
_TORCH_STATE = ("module", "module_", "posterior_")
# Predictions are computed in chunks of rows holding at most this many network outputs
# (posterior samples × rows × outputs) at once; weight samples are shared by all rows, so chunking
# does not change the results.
_PREDICT_BUDGET = 2**24


def default_mlp(n_features: int, n_outputs: int, hidden_layer_sizes=(50, 50), activation: str = "tanh") -> nn.Module:
    """The default network: a fully connected MLP (tanh, two hidden layers of 50, as in the paper)."""
    acts = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
    if activation not in acts:
        raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}.")
    layers, width = [], n_features
    for h in hidden_layer_sizes:
        layers += [nn.Linear(width, int(h)), acts[activation]()]
        width = int(h)
    layers.append(nn.Linear(width, n_outputs))
    return nn.Sequential(*layers)


def _check_level_list(confidence_level, name: str = "confidence_level") -> list[float]:
    try:
        levels = check_confidence_levels(confidence_level)
    except ValueError:
        raise ValueError(f"{name} must be a number or a non-empty list of numbers strictly between 0 and 1 "
                         f"(e.g. 0.9 for 90 % intervals), got {confidence_level!r}.") from None
    return [float(v) for v in levels]


@contextlib.contextmanager
def _seeded_torch(seed: int, device: torch.device):
    """The global torch RNG seeded from ``seed`` inside the block (for weight initialisation and layers such
    as dropout that draw from it), and restored on exit: results depend on ``random_state`` only, and the
    caller's global RNG state is left as it was."""
    devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class LaplaceActiveSubspaceBase(BaseEstimator):
    """Common machinery of :class:`LaplaceActiveSubspaceRegressor` and :class:`LaplaceActiveSubspaceClassifier`.

    Subclasses set ``_task`` ("regression" | "classification") and implement the target handling.
    """

    _task = "regression"

    def __init__(self, module=None, *, module_kwargs=None, prefit=False, scaling="mean", n_components="auto",
                 max_components=50, sigma0="auto", predictive="sampled", n_samples=1000, confidence_level=0.9,
                 calibration_size=0.1, max_epochs=500, lr=1e-3, batch_size=64, weight_decay=0.0,
                 optimizer="adam", standardize=True, subsample=None, eigen_method="lanczos", device="auto",
                 dtype="float32", random_state=None, verbose=0):
        self.module = module
        self.module_kwargs = module_kwargs
        self.prefit = prefit
        self.scaling = scaling
        self.n_components = n_components
        self.max_components = max_components
        self.sigma0 = sigma0
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
        self.subsample = subsample
        self.eigen_method = eigen_method
        self.device = device
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ checks
    def _validate_hyperparameters(self) -> None:
        def is_int(v, lo=1):
            return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= lo

        def is_pos(v):
            return isinstance(v, numbers.Real) and not isinstance(v, bool) and np.isfinite(v) and v > 0

        name = type(self).__name__
        if not (self.scaling in ("mean", "standard") or (not isinstance(self.scaling, str) and is_pos(self.scaling))):
            raise ValueError(f"{name}: scaling must be 'mean', 'standard' or a positive float β, got {self.scaling!r}.")
        if not (self.n_components == "auto" or is_int(self.n_components)):
            raise ValueError(f"{name}: n_components must be 'auto' or a positive int, got {self.n_components!r}.")
        if not is_int(self.max_components):
            raise ValueError(f"{name}: max_components must be a positive int, got {self.max_components!r}.")
        if not (self.sigma0 == "auto" or (not isinstance(self.sigma0, str) and is_pos(self.sigma0))):
            raise ValueError(f"{name}: sigma0 must be 'auto' or a positive float, got {self.sigma0!r}.")
        if self.predictive not in ("sampled", "linearized"):
            raise ValueError(f"{name}: predictive must be 'sampled' or 'linearized', got {self.predictive!r}.")
        if not is_int(self.n_samples, 2):
            raise ValueError(f"{name}: n_samples must be an int >= 2, got {self.n_samples!r}.")
        _check_level_list(self.confidence_level, f"{name}: confidence_level")
        cs = self.calibration_size
        if not ((isinstance(cs, numbers.Real) and not isinstance(cs, bool) and 0 < cs < 1) or is_int(cs)):
            raise ValueError(f"{name}: calibration_size must be a fraction in (0, 1) or a number of rows, got {cs!r}.")
        if not is_int(self.max_epochs, 0):
            raise ValueError(f"{name}: max_epochs must be a non-negative int, got {self.max_epochs!r}.")
        if not is_pos(self.lr):
            raise ValueError(f"{name}: lr must be a positive float, got {self.lr!r}.")
        if not (self.batch_size is None or is_int(self.batch_size)):
            raise ValueError(f"{name}: batch_size must be None or a positive int, got {self.batch_size!r}.")
        if not (isinstance(self.weight_decay, numbers.Real) and self.weight_decay >= 0):
            raise ValueError(f"{name}: weight_decay must be a float >= 0, got {self.weight_decay!r}.")
        if not (self.optimizer in _OPTIMIZERS or (isinstance(self.optimizer, type)
                                                  and issubclass(self.optimizer, torch.optim.Optimizer))):
            raise ValueError(f"{name}: optimizer must be one of {sorted(_OPTIMIZERS)} or a torch.optim.Optimizer "
                             f"class, got {self.optimizer!r}.")
        if not (self.subsample is None or is_int(self.subsample)):
            raise ValueError(f"{name}: subsample must be None or a positive int, got {self.subsample!r}.")
        if self.eigen_method not in ("lanczos", "eigsh"):
            raise ValueError(f"{name}: eigen_method must be 'lanczos' or 'eigsh', got {self.eigen_method!r}.")
        if self.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}.")
        if not (self.module_kwargs is None or isinstance(self.module_kwargs, dict)):
            raise ValueError(f"{name}: module_kwargs must be None or a dict, got {type(self.module_kwargs).__name__}.")
        for flag in ("prefit", "standardize"):
            if not isinstance(getattr(self, flag), (bool, np.bool_)):
                raise ValueError(f"{name}: {flag} must be True or False, got {getattr(self, flag)!r}.")
        if not (isinstance(self.verbose, (numbers.Integral, np.bool_)) and self.verbose >= 0):
            raise ValueError(f"{name}: verbose must be an int >= 0, got {self.verbose!r}.")
        if not (self.random_state is None or isinstance(self.random_state, np.random.RandomState)
                or (isinstance(self.random_state, numbers.Integral) and not isinstance(self.random_state, bool)
                    and 0 <= self.random_state < 2**32)):
            raise ValueError(f"{name}: random_state must be None, an int in [0, 2**32) or a "
                             f"numpy.random.RandomState, got {self.random_state!r}.")

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

    def _seed(self) -> int:
        """One integer seed for everything random in fit (fresh entropy when random_state is None; drawn from
        it when it is a RandomState)."""
        return int(numpy_rng(self.random_state).integers(0, 2**31 - 1))

    # ----------------------------------------------------------------- module
    def _user_module(self) -> nn.Module | None:
        """The nn.Module inside ``module`` when it is an instance (or a fitted skorch net)."""
        if isinstance(self.module, nn.Module):
            return self.module
        inner = getattr(self.module, "module_", None)  # skorch's NeuralNet after fit
        if isinstance(inner, nn.Module):
            return inner
        return None

    def _build_module(self, n_features: int, n_outputs: int, seed: int) -> nn.Module:
        user = self._user_module()
        kwargs = dict(self.module_kwargs or {})
        with _seeded_torch(seed, torch.device("cpu")):  # initial weights from our seed, global RNG untouched
            if user is not None:
                return copy.deepcopy(user)  # never train the user's own instance
            if self.module is None:
                return default_mlp(n_features, n_outputs, **kwargs)
            if callable(self.module):
                module = self.module(**kwargs)
                if not isinstance(module, nn.Module):
                    raise TypeError(f"module(**module_kwargs) must return a torch.nn.Module, got {type(module).__name__}.")
                return module
        raise TypeError(f"module must be None, a torch.nn.Module, a fitted skorch net or a callable returning one; "
                        f"got {type(self.module).__name__}.")

    def _prefit_module(self) -> nn.Module:
        user = self._user_module()
        if user is None:
            raise ValueError(f"{type(self).__name__}: prefit=True needs module to be a trained torch.nn.Module "
                             f"(or a fitted skorch net), got {type(self.module).__name__}.")
        return user

    def _train(self, module: nn.Module, X: torch.Tensor, y: torch.Tensor, seed: int) -> list[float]:
        """Mini-batch training of ``module`` (our own copy) on the mean loss; returns the epoch losses."""
        with _seeded_torch(seed + 1, X.device):  # dropout & co. draw from the seeded global RNG
            return self._train_loop(module, X, y, seed)

    def _train_loop(self, module: nn.Module, X: torch.Tensor, y: torch.Tensor, seed: int) -> list[float]:
        module.train()
        opt_cls = _OPTIMIZERS.get(self.optimizer, self.optimizer) if isinstance(self.optimizer, str) else self.optimizer
        opt = opt_cls(module.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        gen = torch.Generator().manual_seed(seed)
        n = X.shape[0]
        size = min(self.batch_size or n, n)
        losses = []
        bar = progress(range(self.max_epochs), desc="training", verbose=self.verbose, leave=False)
        for _ in bar:
            perm = torch.randperm(n, generator=gen).to(X.device)
            total = 0.0
            for i in range(0, n, size):
                idx = perm[i:i + size]
                opt.zero_grad(set_to_none=True)
                loss = self._loss(module(X[idx]), y[idx])
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
            losses.append(total / n)
            bar.set_postfix(loss=f"{losses[-1]:.4g}")
            if not np.isfinite(losses[-1]):
                raise FloatingPointError(f"{type(self).__name__}: the training loss diverged to {losses[-1]}; "
                                         "lower lr or standardize the data.")
        module.eval()
        for p in module.parameters():
            p.grad = None
        return losses

    # -------------------------------------------------------------------- fit
    def _fit(self, X, y, X_cal, y_cal):
        self._validate_hyperparameters()
        name = type(self).__name__
        t_start = time.perf_counter()
        X, y = self._validate_train(X, y)
        if X_cal is not None or y_cal is not None:
            if X_cal is None or y_cal is None:
                raise ValueError(f"{name}.fit: pass both X_cal and y_cal, or neither.")
            X_cal, y_cal = self._validate_calibration(X_cal, y_cal)
        device = self._resolve_device()
        dtype = _DTYPES[self.dtype]
        seed = self._seed()
        if X_cal is None:
            n_cal = self._n_calibration_rows(X.shape[0])
            stratify = y if self._task == "classification" and self._can_stratify(y, n_cal) else None
            X, X_cal, y, y_cal = train_test_split(X, y, test_size=n_cal, random_state=seed, stratify=stratify)
        self._fit_scalers(X, y)
        Xt = self._to_tensor(self._transform_X(X), device, dtype)
        yt = self._target_tensor(y, device, dtype)
        n_outputs = self._n_outputs(y)
        timings = {}
        if self.prefit:
            module = self._prefit_module()
            ps = [p for p in module.parameters() if p.requires_grad]
            if not ps:
                raise ValueError(f"{name}: the prefit module has no trainable parameters (none with "
                                 "requires_grad=True); there is no weight posterior to build.")
            if ps[0].device != device or ps[0].dtype != dtype:
                raise ValueError(f"{name}: the prefit module lives on {ps[0].device} with dtype {ps[0].dtype}, but "
                                 f"the estimator was asked for device={str(device)!r}, dtype={self.dtype!r}; set "
                                 "device/dtype to match the module (it is never moved or copied).")
            self.training_loss_ = []
        else:
            module = self._build_module(X.shape[1], n_outputs, seed).to(device=device, dtype=dtype)
            t0 = time.perf_counter()
            self.training_loss_ = self._train(module, Xt, yt, seed)
            timings["training"] = time.perf_counter() - t0
        self.module_ = module
        self._check_output_shape(module, Xt[:1], n_outputs)

        D = sum(p.numel() for p in module.parameters() if p.requires_grad)
        if self.n_components == "auto":
            K = min(self.max_components, D - 1)
            if K < self.max_components:
                logger.info("max_components=%d capped at D - 1 = %d (the network has D=%d weights)",
                            self.max_components, K, D)
        else:
            K = self.n_components
            if K >= D:
                raise ValueError(f"{name}: n_components={K} but the network has only D={D} weights; the subspace "
                                 f"dimension must be smaller than D: use n_components <= {D - 1}.")
        if K < 1:
            raise ValueError(f"{name}: the network has a single weight; there is no subspace to build.")
        if self.subsample is not None and self.subsample > Xt.shape[0]:
            raise ValueError(f"{name}: subsample={self.subsample} is larger than the {Xt.shape[0]} training rows.")
        Xc = self._to_tensor(self._transform_X(X_cal), device, dtype)
        yc = self._calibration_targets(y_cal, device, dtype)
        t0 = time.perf_counter()
        noise_var = self._noise_var(module, Xt, yt, Xc, yc)
        fitted = fit_laplace_subspace(
            module, Xt, yt if self._task == "regression" else None,
            loss="mse" if self._task == "regression" else "cross_entropy",
            scaling=self.scaling, noise_var=noise_var, n_components=K, sigma0=self.sigma0,
            subsample=self.subsample, eigen_method=self.eigen_method, random_state=seed, verbose=self.verbose)
        timings["curvature"] = time.perf_counter() - t0
        self.posterior_ = fitted.posterior
        self.beta_ = float(fitted.beta)
        self.n_records_ = int(fitted.n_records)
        self.eigenvalues_ = fitted.eigen.eigenvalues.detach().cpu().numpy()
        self.eigen_info_ = {
            "method": fitted.eigen.method, "n_matvecs": fitted.eigen.n_matvecs, "converged": fitted.eigen.converged,
            "residual_norms": fitted.eigen.residual_norms.detach().cpu().numpy(),
            "relative_residuals": fitted.eigen.relative_residuals.detach().cpu().numpy(),
        }
        self._set_noise()
        # choose_dimension draws one sample seed from random_state=seed; predictions use the same one, so the
        # posterior samples (in weight space, shared by all rows) are those the calibration saw.
        self._sample_seed_ = int(numpy_rng(seed).integers(0, 2**62))
        self.calibration_seed_ = seed

        levels = _check_level_list(self.confidence_level)
        t0 = time.perf_counter()
        common = dict(task=self._task, confidence_level=levels[0], predictive=self.predictive,
                      n_samples=self.n_samples, noise_var=self._interval_noise_var(), random_state=seed,
                      verbose=self.verbose)
        if self.n_components == "auto":
            result = choose_dimension(self.posterior_, Xc, yc, d_max=K, full_curve=False, **common)
            self.n_components_ = int(result.n_components)
            self.calibration_ = self._table_in_user_units(result.table.reset_index(drop=True))
            self.calibration_reached_ = bool(result.reached)
        else:
            self.n_components_ = int(self.n_components)
            with warnings.catch_warnings():  # a user-chosen d: its coverage is recorded, not judged
                warnings.simplefilter("ignore", CalibrationWarning)
                result = choose_dimension(self.posterior_, Xc, yc, d_min=self.n_components_,
                                          d_max=self.n_components_, **common)
            self.calibration_ = self._table_in_user_units(result.table.reset_index(drop=True))
            self.calibration_reached_ = None
        timings["calibration"] = time.perf_counter() - t0
        self.sigma0_ = float(self.posterior_.fit_sigma0(self.n_components_))
        timings["total"] = time.perf_counter() - t_start
        self.timings_ = timings
        self.n_calibration_rows_ = int(len(Xc))
        return self

    # --------------------------------------------------------------- helpers
    def _n_calibration_rows(self, n: int) -> int:
        """Rows held out of the n training rows for choosing d (at least one, leaving at least two)."""
        cs = self.calibration_size
        if isinstance(cs, numbers.Integral):
            if cs > n - 2:
                raise ValueError(f"{type(self).__name__}: calibration_size={cs} rows, but only {n} rows were passed; "
                                 f"hold out at most {n - 2} rows, give a fraction, or pass X_cal and y_cal.")
            return int(cs)
        return int(min(max(1, np.ceil(cs * n)), n - 2))

    @staticmethod
    def _can_stratify(y, n_cal: int) -> bool:
        """A stratified split needs two rows of every class and room for every class on both sides."""
        _, counts = np.unique(y, return_counts=True)
        return counts.min() >= 2 and len(counts) <= min(n_cal, len(y) - n_cal)

    def _check_output_shape(self, module, x1, n_outputs) -> None:
        with torch.no_grad():
            out = eval_view(module)(x1)  # a prefit module in train mode is probed through an eval-mode view
        if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[1] != n_outputs:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{type(self).__name__}: the module returns outputs of shape {shape}, but {n_outputs} "
                             f"output(s) per row are needed for this {self._task} problem: (n, {n_outputs}).")

    @staticmethod
    def _to_tensor(X, device, dtype) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(X), dtype=dtype).to(device)

    @staticmethod
    def _dense(X) -> np.ndarray:
        """Networks take dense inputs: sparse matrices (e.g. one-hot encodings) are densified."""
        return X.toarray() if sp.issparse(X) else X

    def _validate_X(self, X, y="no_validation", *, reset: bool, **kwargs):
        """sklearn's validate_data (n_features_in_, feature_names_in_, NaN/inf, dtypes), densified."""
        out = validate_data(self, X, y, reset=reset, dtype=np.float64, accept_sparse=("csr", "csc", "coo"),
                            **kwargs)
        if isinstance(out, tuple):
            return (self._dense(out[0]),) + tuple(out[1:])
        return self._dense(out)

    def _fit_scalers(self, X, y) -> None:
        if self.standardize and not self.prefit:
            mean = X.mean(axis=0)
            scale = X.std(axis=0)
            scale[~(scale > 1e-12 * np.maximum(1.0, np.abs(mean)))] = 1.0
            self.x_mean_, self.x_scale_ = mean, scale
        else:
            self.x_mean_ = self.x_scale_ = None

    def _transform_X(self, X):
        if self.x_mean_ is None:
            return X
        return (X - self.x_mean_) / self.x_scale_

    def _check_fitted_X(self, X) -> torch.Tensor:
        check_is_fitted(self, "posterior_")
        X = self._validate_X(X, reset=False)
        p = self.posterior_
        return self._to_tensor(self._transform_X(X), p.device, p.dtype)

    def _table_in_user_units(self, table: pd.DataFrame) -> pd.DataFrame:
        return table

    def _interval_noise_var(self):
        """Observation-noise variance added to intervals (internal units); 0 for parameter uncertainty only."""
        return 0.0

    def coverage_curve(self, X, y, *, d_max: int | None = None, confidence_level: float | None = None) -> pd.DataFrame:
        """Coverage on ``(X, y)`` of the (1 − γ) intervals (or prediction sets) for every d = 1 … d_max.

        The posterior samples are those of the calibration (same seed), and σ0 is refitted at every d, so
        on the calibration rows this reproduces ``calibration_`` and extends it past the chosen d
        (the paper's Fig. 6); on test rows it shows how coverage generalises.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
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
        p = self.posterior_
        Xt = self._to_tensor(self._transform_X(X), p.device, p.dtype)
        yt = self._calibration_targets(y, p.device, p.dtype)
        if confidence_level is not None and np.ndim(confidence_level) != 0:
            raise ValueError(f"confidence_level must be a single number, got {confidence_level!r}.")
        level = self._levels(confidence_level)[0]
        d_max = p.max_components if d_max is None else d_max
        with warnings.catch_warnings():  # the whole curve is asked for, reaching the level or not
            warnings.simplefilter("ignore", CalibrationWarning)
            result = choose_dimension(p, Xt, yt, task=self._task, confidence_level=level, d_max=d_max,
                                      predictive=self.predictive, n_samples=self.n_samples,
                                      noise_var=self._interval_noise_var(),
                                      random_state=self.calibration_seed_, full_curve=True, verbose=self.verbose)
        return self._table_in_user_units(result.table.reset_index(drop=True))

    def _row_chunks(self, n_rows: int, n_outputs: int) -> list[slice]:
        """Row slices for prediction, sized so that samples × rows × outputs stays within the budget."""
        per_row = (self.n_samples if self.predictive == "sampled" else 1) * max(1, n_outputs)
        size = max(1, _PREDICT_BUDGET // per_row)
        return [slice(i, min(i + size, n_rows)) for i in range(0, n_rows, size)]

    def _levels(self, confidence_level) -> list[float]:
        return _check_level_list(self.confidence_level if confidence_level is None else confidence_level)

    # ------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        """Torch objects (the module, the posterior) are stored through ``torch.save`` so that ``__setstate__``
        can map their tensors to the CPU when the pickle is loaded on a machine without CUDA."""
        state = dict(super().__getstate__())
        torch_part = {k: state.pop(k) for k in _TORCH_STATE if k in state}
        if any(v is not None for v in torch_part.values()):
            buffer = io.BytesIO()
            torch.save(torch_part, buffer)
            state["_torch_state"] = buffer.getvalue()
            post = torch_part.get("posterior_")
            state["_torch_device"] = str(post.device) if post is not None else None
        else:
            state.update(torch_part)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        blob = state.pop("_torch_state", None)
        saved_device = state.pop("_torch_device", None)
        if blob is not None:
            map_location = None if torch.cuda.is_available() else "cpu"
            if map_location == "cpu" and saved_device is not None and saved_device != "cpu":
                logger.info("%s was fitted on %s; CUDA is not available here, so it is loaded on the CPU.",
                            type(self).__name__, saved_device)
            state.update(torch.load(io.BytesIO(blob), map_location=map_location, weights_only=False))
        super().__setstate__(state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.sparse = True
        return tags
