"""The prepared-data component of the estimators: rows validated the scikit-learn way (tables, images, token
sequences), the calibration rows held out of the training rows, the input and target standardisation fitted on
the training rows only, and the tensors the network takes (:func:`prepare_data` → :class:`PreparedData`); at
predict time the fitted :class:`InputEncoder` turns new rows into input tensors and :class:`TargetScaler` brings
results back to the units of y."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.utils.validation import _check_sample_weight, _num_samples, check_array, check_X_y, validate_data

from .._checks import normalized_sample_weight

__all__ = ["InputEncoder", "LabelTargets", "PreparedData", "TargetScaler", "check_sample_weight", "prepare_data",
           "standardisation"]


def _is_text(value) -> bool:
    """A string (or bytes) that is not a number, such as a category's name ('high')."""
    if not isinstance(value, (str, bytes)):
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False


def _non_numeric_columns(X) -> list[tuple[object, object]]:
    """(name, or position for an array, and the first text value) of each column of a 2-D ``X`` holding text
    that is not a number (a categorical column); empty for other inputs (other failures are scikit-learn's to
    report)."""
    if hasattr(X, "columns") and hasattr(X, "iloc"):  # a DataFrame
        columns = [(name, X.iloc[:, j]) for j, name in enumerate(X.columns)]
    else:
        if sp.issparse(X):
            return []
        try:
            A = np.asarray(X, dtype=object)
        except (TypeError, ValueError):
            return []
        if A.ndim != 2:
            return []
        columns = [(j, A[:, j]) for j in range(A.shape[1])]
    found = []
    for name, values in columns:
        bad = next((v for v in values if _is_text(v)), None)
        if bad is not None:
            found.append((name, bad))
    return found


def _non_numeric_message(owner: str, columns: list[tuple[object, object]]) -> str:
    """The refusal of text columns: which, an example value, and how to encode them."""
    named = ", ".join(f"{name!r} (e.g. {bad!r})" if not isinstance(name, (int, np.integer))
                      else f"{name} (0-based; e.g. {bad!r})" for name, bad in columns[:5])
    more = f" and {len(columns) - 5} more" if len(columns) > 5 else ""
    first = columns[0][0]
    example = (f"make_column_transformer((OneHotEncoder(), [{first!r}]), remainder='passthrough')"
               if not isinstance(first, (int, np.integer)) else "a ColumnTransformer with a OneHotEncoder")
    return (f"X has non-numeric values in column{'s' if len(columns) > 1 else ''} {named}{more}; {owner} takes "
            f"numbers. Encode such columns before it, e.g. make_pipeline({example}, {owner}(...)) "
            "(sklearn.compose, sklearn.preprocessing.OneHotEncoder or OrdinalEncoder), or drop them.")


def _columns(cols: np.ndarray, names, what: str = "X") -> str:
    """Columns named for a message: their indices, and their names when fit saw a DataFrame."""
    names = names if what == "X" else None
    shown = [f"{int(c)} ({names[c]!r})" if names is not None and c < len(names) else str(int(c)) for c in cols[:10]]
    more = f" and {len(cols) - 10} more" if len(cols) > 10 else ""
    return f"column{'s' if len(cols) > 1 else ''} {', '.join(shown)}{more}"


def standardisation(X: np.ndarray, sample_weight, owner: str, what: str = "X",
                    names=None) -> tuple[np.ndarray, np.ndarray]:
    """The (weighted) mean and standard deviation of each column of ``X``; columns whose values are too large
    for them (the variance overflows float64 beyond about 1e154) are refused, naming them."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.average(X, axis=0, weights=sample_weight)
        scale = np.sqrt(np.average((X - mean) ** 2, axis=0, weights=sample_weight))
    bad = np.flatnonzero(~(np.isfinite(mean) & np.isfinite(scale)))
    if bad.size:
        largest = float(np.max(np.abs(X[:, bad])))
        raise ValueError(f"{owner}: {what} has values too large to standardise in {_columns(bad, names, what)} "
                         f"(largest magnitude {largest:.3g}: the variance overflows float64); rescale them (divide "
                         "by a power of ten, or take a log) before fitting.")
    return mean, scale


def _dense(X) -> np.ndarray:
    """Networks take dense inputs: sparse matrices (e.g. one-hot encodings) are densified."""
    return X.toarray() if sp.issparse(X) else X


_CHECK = dict(dtype="numeric", accept_sparse=("csr", "csc", "coo"), allow_nd=True, ensure_all_finite=True)


def _validated(est, X, y, reset: bool, whole_rows: bool, **kwargs):
    """scikit-learn's validation of X (and y), with text columns named in the error."""
    no_y = isinstance(y, str) and y == "no_validation"
    try:
        if whole_rows:
            # validate_data would count features on the second axis only; rows of n-d inputs and token
            # sequences (which have no feature names) are checked whole by InputEncoder.check_rows
            if no_y:
                return check_array(X, estimator=est, input_name="X", **_CHECK)
            return check_X_y(X, y, estimator=est, **_CHECK, **kwargs)
        return validate_data(est, X, y, reset=reset, **_CHECK, **kwargs)
    except (TypeError, ValueError) as err:
        columns = _non_numeric_columns(X)
        if not columns:
            raise
        raise ValueError(_non_numeric_message(type(est).__name__, columns)) from err


def _split_out(out):
    return (out[0], tuple(out[1:])) if isinstance(out, tuple) else (out, ())


@dataclass
class InputEncoder:
    """How rows of ``X`` become the network's input tensors: the row shape and kind seen in fit (a table of
    floats, n-d rows, integer token ids), padding to the fitted length with ``pad_id`` (the ``padding_idx``), and the
    standardisation of float tables (``x_mean``, ``x_scale``; None when off), fitted on the training rows only."""

    owner: str
    input_shape: tuple
    integer_input: bool
    pad_id: int | None = None
    feature_names: np.ndarray | None = None
    x_mean: np.ndarray | None = None
    x_scale: np.ndarray | None = None

    @classmethod
    def from_fit_rows(cls, est, X, y, *, module, padding_idx, **kwargs):
        """The training rows (and targets) validated the scikit-learn way (``n_features_in_`` and
        ``feature_names_in_`` recorded on ``est``) and the encoder of their row shape and kind: ``X, y, encoder``."""
        out = _validated(est, X, y, True, False, **kwargs)
        X, rest = _split_out(out)
        X = _dense(X)
        shape = tuple(int(s) for s in X.shape[1:])
        est.n_features_in_ = int(np.prod(shape))
        # integer X is token ids for the user's module; for the default MLP a table of numbers
        integer = bool(np.issubdtype(X.dtype, np.integer) and module is not None)
        encoder = cls(type(est).__name__, shape, integer, padding_idx, getattr(est, "feature_names_in_", None))
        X = X.astype(np.int64 if integer else np.float64, copy=False)
        return (X, *rest, encoder)

    def validate(self, est, X, y="no_validation", **kwargs):
        """Rows (and targets) of a later call validated and checked against what fit saw (token sequences brought
        to the fitted length); float64, or int64 for token ids."""
        out = _validated(est, X, y, False, len(self.input_shape) != 1 or self.integer_input, **kwargs)
        X, rest = _split_out(out)
        X = self.check_rows(_dense(X))
        X = X.astype(np.int64 if self.integer_input else np.float64, copy=False)
        return (X,) + rest if rest else X

    def check_rows(self, X: np.ndarray) -> np.ndarray:
        """X against what fit saw: token ids stay integers, and every row has the fitted shape."""
        name = self.owner
        if self.integer_input and not np.issubdtype(X.dtype, np.integer):
            raise ValueError(f"X has {X.dtype} values, but {name} was fitted on integer token ids; pass the ids as "
                             "integers (e.g. X.astype(np.int64)).")
        if self.pad_id is not None and X.ndim == 2 and len(self.input_shape) == 1:
            X = self._to_fitted_length(X)
        if tuple(X.shape[1:]) != self.input_shape:
            raise ValueError(f"X has rows of shape {tuple(X.shape[1:])}, but {name} was fitted on rows of shape "
                             f"{self.input_shape}: pass X of shape (n, {', '.join(map(str, self.input_shape))}).")
        return X

    def _to_fitted_length(self, X: np.ndarray) -> np.ndarray:
        """Token sequences (n, T') right-padded with ``padding_idx`` to the fitted length T, or cut to it where
        only padding follows."""
        T, pad = self.input_shape[0], self.pad_id
        if X.shape[1] < T:
            return np.concatenate([X, np.full((X.shape[0], T - X.shape[1]), pad, dtype=X.dtype)], axis=1)
        if X.shape[1] > T:
            rows = np.flatnonzero((X[:, T:] != pad).any(axis=1))
            if rows.size:
                raise ValueError(f"X has sequences of length {X.shape[1]}, and rows {rows[:5].tolist()} hold tokens "
                                 f"other than padding_idx={pad} beyond the fitted length {T}; {self.owner} was "
                                 f"fitted on sequences of length {T} (refit on longer ones, or truncate these).")
            return X[:, :T]
        return X

    @property
    def is_table(self) -> bool:
        return len(self.input_shape) == 1 and not self.integer_input

    def check_settings(self, module, standardize, prefit: bool) -> None:
        """The input kind seen in fit against ``module``, ``standardize`` and ``padding_idx``."""
        name, shape = self.owner, self.input_shape
        if module is None and len(shape) != 1:
            raise ValueError(f"{name}: X has rows of shape {shape}, but the default network is an MLP on 2-D tables; "
                             f"pass a network that takes (n, {', '.join(map(str, shape))}) inputs as module= (e.g. a "
                             f"CNN for images), or flatten X to (n, {int(np.prod(shape))}).")
        if standardize is True and not prefit and not self.is_table:
            what = "integer token ids" if self.integer_input else f"rows of shape {shape}"
            raise ValueError(f"{name}: training__standardize=True applies to 2-D tables of floats, but X has {what}; "
                             "use standardize='auto' (inputs left as they are, regression targets standardised) or "
                             "False, and normalise the inputs in the module or beforehand.")
        if self.pad_id is not None and not (self.integer_input and len(shape) == 1):
            raise ValueError(f"{name}: compute__padding_idx={self.pad_id} applies to integer token sequences "
                             f"(n, T) passed to a module, but X has rows of shape {shape} and "
                             f"{'integer' if self.integer_input else 'float'} values"
                             f"{' for the default MLP' if module is None else ''}.")

    def fitted(self, X: np.ndarray, sample_weight, standardize: bool) -> InputEncoder:
        """This encoder with the inputs' (weighted) mean and standard deviation of the training rows ``X`` when
        ``standardize`` and the rows are a table of floats."""
        if not (standardize and self.is_table):
            return replace(self, x_mean=None, x_scale=None)
        mean, scale = standardisation(X, sample_weight, self.owner, "X", self.feature_names)
        scale[~(scale > 1e-12 * np.maximum(1.0, np.abs(mean)))] = 1.0
        return replace(self, x_mean=mean, x_scale=scale)

    def transform(self, X):
        return X if self.x_mean is None else (X - self.x_mean) / self.x_scale

    def to_tensor(self, X, device, dtype, what: str = "X") -> torch.Tensor:
        """Floating arrays in ``dtype``; integer arrays (token ids) as torch.long, the index type of nn.Embedding.
        Values beyond ``dtype``'s range are refused, naming the columns, rather than turned into inf."""
        X = np.ascontiguousarray(X)
        if np.issubdtype(X.dtype, np.integer):
            return torch.as_tensor(X, dtype=torch.long).to(device)
        t = torch.as_tensor(X, dtype=dtype)
        if not bool(torch.isfinite(t).all()):
            bad = ~torch.isfinite(t).reshape(t.shape[0], -1).all(0).numpy()
            largest = float(np.max(np.abs(X)))
            scaled = " after the input standardisation" if what == "X" and self.x_mean is not None else ""
            raise ValueError(f"{self.owner}: {what} has values beyond the range of {dtype} (largest magnitude "
                             f"{largest:.3g}{scaled}) in {_columns(np.flatnonzero(bad), self.feature_names, what)}; "
                             "rescale them (divide by a power of ten, or take a log) or use dtype='float64'.")
        return t.to(device)

    def rows_tensor(self, X: np.ndarray, device, dtype) -> torch.Tensor:
        """Validated rows as the network's input tensor (standardised, in ``dtype`` on ``device``)."""
        return self.to_tensor(self.transform(X), device, dtype)


@dataclass
class TargetScaler:
    """Regression targets in and out of the internal units: the (weighted) mean and scale of each output of the
    training targets (zeros and ones when off), and whether y was 1-D."""

    owner: str
    y_mean: np.ndarray
    y_scale: np.ndarray
    y_1d: bool

    @classmethod
    def fit(cls, y: np.ndarray, sample_weight, standardize: bool, owner: str, class_labels=None) -> TargetScaler:
        """The scaler of the training targets ``y`` (weighted by ``sample_weight``; ``class_labels`` unused)."""
        Y = y.reshape(len(y), -1)
        if standardize:
            mean, scale = standardisation(Y, sample_weight, owner, "y")
            scale[~(scale > 0)] = 1.0
            return cls(owner, mean, scale, y.ndim == 1)
        return cls(owner, np.zeros(Y.shape[1]), np.ones(Y.shape[1]), y.ndim == 1)

    @property
    def n_outputs(self) -> int:
        return len(self.y_mean)

    def to_tensor(self, y, device, dtype, encoder: InputEncoder) -> torch.Tensor:
        return encoder.to_tensor((y.reshape(len(y), -1) - self.y_mean) / self.y_scale, device, dtype, "y")

    def fitted_attributes(self) -> dict:
        """The regressor's fitted attributes of the scaling."""
        return {"y_mean_": self.y_mean, "y_scale_": self.y_scale}

    def table_in_user_units(self, table):
        """A calibration table with ``mean_width`` in the units of y (one output)."""
        if len(self.y_scale) == 1 and "mean_width" in table:
            table = table.assign(mean_width=table["mean_width"] * float(self.y_scale[0]))
        return table

    def to_user_units(self, t: torch.Tensor, shift: bool = True) -> np.ndarray:
        """A tensor (n, M, ...) in internal units as an array in the units of y (``shift=False``: a scale)."""
        out = t.detach().cpu().double().numpy() * self.y_scale.reshape((-1,) + (1,) * (t.ndim - 2))
        if shift:
            out = out + self.y_mean.reshape((-1,) + (1,) * (t.ndim - 2))
        return out


@dataclass
class PreparedData:
    """The rows of one fit as the components take them: training and calibration rows as tensors in internal
    units, the training rows' weights, the fitted input encoder and target scaler, and the positions of the
    training and calibration rows in the ``X`` passed to fit (None when ``X_cal`` was passed)."""

    Xt: torch.Tensor
    yt: torch.Tensor
    Xc: torch.Tensor
    yc: torch.Tensor
    weight: torch.Tensor | None
    inputs: InputEncoder
    targets: object
    train_indices: np.ndarray | None
    calibration_indices: np.ndarray | None
    warned: bool = False


def check_sample_weight(sample_weight, X, owner: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``sample_weight`` checked (one finite, non-negative weight per row, not all zero) and normalised to a mean of
    1 over the rows of positive weight (so that its scale never matters): the weights of those rows (None when not
    given or uniform) and those rows' positions in ``X`` (None when there is
    no zero weight)."""
    if sample_weight is None:
        return None, None
    weight = _check_sample_weight(normalized_sample_weight(sample_weight, _num_samples(X), owner), X,
                                  dtype=np.float64)
    if np.all(weight == 1.0):
        return None, None
    kept = np.flatnonzero(weight > 0)
    if len(kept) < 3:
        raise ValueError(f"{owner} needs at least 3 rows of positive sample_weight (training and calibration rows), "
                         f"got {len(kept)}.")
    return weight[kept], None if len(kept) == len(weight) else kept


def prepare_data(X, y, X_cal, y_cal, weight, kept, *, inputs: InputEncoder, plan, calibration_size, seed: int,
                 fit_targets, standardize: bool, device, dtype, class_labels=None) -> PreparedData:
    """The rows of one fit prepared: rows of zero weight dropped, the calibration rows held out of the training
    rows when not given (``plan`` says how many), the few-rows warning, the input and target standardisation
    fitted on the training rows only (weighted), and the tensors. ``fit_targets(y, weight, standardize)`` fits
    the target scaler (regression) or label encoder (classification), which has ``to_tensor(y, device, dtype, inputs)``;
    ``standardize``: whether inputs and targets are standardised."""
    if kept is not None:  # rows of zero weight are dropped
        X, y = X[kept], y[kept]
    train_indices = calibration_indices = None
    if X_cal is None:
        train, cal = plan.split(X.shape[0], y, calibration_size, seed)
        at = np.arange(X.shape[0]) if kept is None else kept
        train_indices, calibration_indices = at[train], at[cal]
        X, X_cal, y, y_cal = X[train], X[cal], y[train], y[cal]
        weight = None if weight is None else weight[train]
    plan.check_sigma0_rows(len(X_cal))  # sigma0="nll" with too few rows raises before training
    warned = plan.warn_few_rows(y_cal, seed, class_labels)
    inputs = inputs.fitted(X, weight, standardize)
    targets = fit_targets(y, weight, standardize)
    Xt = inputs.to_tensor(inputs.transform(X), device, dtype)
    Xc = inputs.to_tensor(inputs.transform(X_cal), device, dtype)
    yt, yc = targets.to_tensor(y, device, dtype, inputs), targets.to_tensor(y_cal, device, dtype, inputs)
    wt = None if weight is None else torch.as_tensor(weight, dtype=torch.float64).to(device)
    return PreparedData(Xt, yt, Xc, yc, wt, inputs, targets, train_indices, calibration_indices, warned)


@dataclass
class LabelTargets:
    """Class indices as the tensor the categorical loss takes; ``n_outputs``: the number of classes."""

    n_outputs: int

    @classmethod
    def fit(cls, y, sample_weight, standardize: bool, owner: str, class_labels=()) -> LabelTargets:
        """The classes ``class_labels`` of the estimator (the training rows ``y`` may miss some)."""
        return cls(len(class_labels))

    @staticmethod
    def to_tensor(y, device, dtype, inputs=None) -> torch.Tensor:
        return torch.as_tensor(np.asarray(y, dtype=np.int64)).to(device)

    def fitted_attributes(self) -> dict:
        return {}

    def table_in_user_units(self, table):
        return table
