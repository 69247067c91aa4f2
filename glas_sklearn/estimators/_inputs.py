"""Input handling of the estimators: X validated the scikit-learn way (tables, images, token sequences),
rows checked against what fit saw, token sequences brought to the fitted length with ``padding_idx``, the input
standardisation of tables, and the conversion to tensors (floats in the estimator's dtype, token ids as long)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.utils.validation import check_array, check_X_y, validate_data

__all__ = ["InputsMixin"]


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


class InputsMixin:
    """What the estimators do with their inputs: validation, the input kind (table, n-d rows, token ids),
    padding to the fitted length, standardisation of float tables and the tensors the network takes.

    Reads the estimator's ``module``, ``prefit``, ``standardize`` and ``padding_idx``; ``_validate_X(...,
    reset=True)`` records ``input_shape_``, ``n_features_in_`` and the input kind, which the rest checks against.
    """

    def _to_tensor(self, X, device, dtype, what: str = "X") -> torch.Tensor:
        """Floating arrays in ``dtype``; integer arrays (token ids) as torch.long, the index type of nn.Embedding.

        Values beyond ``dtype``'s range (float32: about 3.4e38, after the input standardisation) are refused,
        naming the columns, rather than turned into inf."""
        X = np.ascontiguousarray(X)
        if np.issubdtype(X.dtype, np.integer):
            return torch.as_tensor(X, dtype=torch.long).to(device)
        t = torch.as_tensor(X, dtype=dtype)
        if not bool(torch.isfinite(t).all()):
            bad = ~torch.isfinite(t).reshape(t.shape[0], -1).all(0).numpy()
            largest = float(np.max(np.abs(X)))
            scaled = " after the input standardisation" if what == "X" and self._standardizes_inputs() else ""
            raise ValueError(f"{type(self).__name__}: {what} has values beyond the range of {dtype} (largest magnitude "
                             f"{largest:.3g}{scaled}) in {self._columns(np.flatnonzero(bad), what)}; rescale them "
                             "(divide by a power of ten, or take a log) or use dtype='float64'.")
        return t.to(device)

    def _columns(self, cols: np.ndarray, what: str = "X") -> str:
        """Columns named for a message: their indices, and their names when fit saw a DataFrame."""
        names = getattr(self, "feature_names_in_", None) if what == "X" else None
        shown = [f"{int(c)} ({names[c]!r})" if names is not None and c < len(names) else str(int(c))
                 for c in cols[:10]]
        more = f" and {len(cols) - 10} more" if len(cols) > 10 else ""
        return f"column{'s' if len(cols) > 1 else ''} {', '.join(shown)}{more}"

    def _standardisation(self, X: np.ndarray, sample_weight, what: str = "X") -> tuple[np.ndarray, np.ndarray]:
        """The (weighted) mean and standard deviation of each column of ``X``; columns whose values are too large
        for them (the variance overflows float64 beyond about 1e154) are refused, naming them."""
        with np.errstate(over="ignore", invalid="ignore"):
            mean = np.average(X, axis=0, weights=sample_weight)
            scale = np.sqrt(np.average((X - mean) ** 2, axis=0, weights=sample_weight))
        bad = np.flatnonzero(~(np.isfinite(mean) & np.isfinite(scale)))
        if bad.size:
            largest = float(np.max(np.abs(X[:, bad])))
            raise ValueError(f"{type(self).__name__}: {what} has values too large to standardise in "
                             f"{self._columns(bad, what)} (largest magnitude {largest:.3g}: the variance overflows "
                             "float64); rescale them (divide by a power of ten, or take a log) before fitting.")
        return mean, scale

    @staticmethod
    def _dense(X) -> np.ndarray:
        """Networks take dense inputs: sparse matrices (e.g. one-hot encodings) are densified."""
        return X.toarray() if sp.issparse(X) else X

    def _validate_X(self, X, y="no_validation", *, reset: bool, **kwargs):
        """X (and y) validated the scikit-learn way: any rank ≥ 2, finite, numeric, densified; float64, or int64
        for token ids. ``reset=True`` (fit) records the row shape (``input_shape_``, ``n_features_in_``) and the
        input kind; otherwise the rows are checked against them (token sequences brought to the fitted length
        with ``padding_idx``)."""
        check = dict(dtype="numeric", accept_sparse=("csr", "csc", "coo"), allow_nd=True, ensure_all_finite=True)
        no_y = isinstance(y, str) and y == "no_validation"
        try:
            if not reset and (len(self.input_shape_) != 1 or self._integer_input):
                # validate_data would count features on the second axis only; rows of n-d inputs and token
                # sequences (which have no feature names) are checked whole by _check_rows
                if no_y:
                    out = check_array(X, estimator=self, input_name="X", **check)
                else:
                    out = check_X_y(X, y, estimator=self, **check, **kwargs)
            else:
                out = validate_data(self, X, y, reset=reset, **check, **kwargs)
        except (TypeError, ValueError) as err:
            columns = _non_numeric_columns(X)
            if not columns:
                raise
            raise ValueError(_non_numeric_message(type(self).__name__, columns)) from err
        X, rest = (out[0], tuple(out[1:])) if isinstance(out, tuple) else (out, ())
        X = self._dense(X)
        if reset:
            self.input_shape_ = tuple(int(s) for s in X.shape[1:])
            self.n_features_in_ = int(np.prod(self.input_shape_))
            # integer X is token ids for the user's module; for the default MLP a table of numbers
            self._integer_input = bool(np.issubdtype(X.dtype, np.integer) and self.module is not None)
        else:
            X = self._check_rows(X)
        X = X.astype(np.int64 if self._integer_input else np.float64, copy=False)
        return (X,) + rest if rest else X

    def _check_rows(self, X: np.ndarray) -> np.ndarray:
        """X against what fit saw: token ids stay integers, and every row has the fitted shape."""
        name = type(self).__name__
        if self._integer_input and not np.issubdtype(X.dtype, np.integer):
            raise ValueError(f"X has {X.dtype} values, but {name} was fitted on integer token ids; pass the ids as "
                             "integers (e.g. X.astype(np.int64)).")
        if self.padding_idx is not None and X.ndim == 2 and len(self.input_shape_) == 1:
            X = self._to_fitted_length(X)
        if tuple(X.shape[1:]) != self.input_shape_:
            raise ValueError(f"X has rows of shape {tuple(X.shape[1:])}, but {name} was fitted on rows of shape "
                             f"{self.input_shape_}: pass X of shape (n, {', '.join(map(str, self.input_shape_))}).")
        return X

    def _to_fitted_length(self, X: np.ndarray) -> np.ndarray:
        """Token sequences (n, T') right-padded with ``padding_idx`` to the fitted length T, or cut to it where
        only padding follows."""
        T, pad = self.input_shape_[0], self.padding_idx
        if X.shape[1] < T:
            return np.concatenate([X, np.full((X.shape[0], T - X.shape[1]), pad, dtype=X.dtype)], axis=1)
        if X.shape[1] > T:
            rows = np.flatnonzero((X[:, T:] != pad).any(axis=1))
            if rows.size:
                raise ValueError(f"X has sequences of length {X.shape[1]}, and rows {rows[:5].tolist()} hold tokens "
                                 f"other than padding_idx={pad} beyond the fitted length {T}; "
                                 f"{type(self).__name__} was fitted on sequences of length {T} (refit on longer "
                                 "ones, or truncate these).")
            return X[:, :T]
        return X

    def _check_inputs_fit_the_settings(self) -> None:
        """The input kind seen in fit against module, standardize and padding_idx."""
        name, shape = type(self).__name__, self.input_shape_
        if self.module is None and len(shape) != 1:
            raise ValueError(f"{name}: X has rows of shape {shape}, but the default network is an MLP on 2-D tables; "
                             f"pass a network that takes (n, {', '.join(map(str, shape))}) inputs as module= (e.g. a "
                             f"CNN for images), or flatten X to (n, {self.n_features_in_}).")
        table = len(shape) == 1 and not self._integer_input
        if self.standardize is True and not self.prefit and not table:
            what = "integer token ids" if self._integer_input else f"rows of shape {shape}"
            raise ValueError(f"{name}: standardize=True applies to 2-D tables of floats, but X has {what}; use "
                             "standardize='auto' (inputs left as they are, regression targets standardised) or "
                             "False, and normalise the inputs in the module or beforehand.")
        if self.padding_idx is not None and not (self._integer_input and len(shape) == 1):
            raise ValueError(f"{name}: padding_idx={self.padding_idx} applies to integer token sequences (n, T) "
                             f"passed to a module, but X has rows of shape {shape} and "
                             f"{'integer' if self._integer_input else 'float'} values"
                             f"{' for the default MLP' if self.module is None else ''}.")

    def _standardizes_inputs(self) -> bool:
        return (self.standardize is not False and not self.prefit and len(self.input_shape_) == 1
                and not self._integer_input)

    def _fit_scalers(self, X, y, sample_weight=None) -> None:
        """The inputs' (weighted) mean and standard deviation, when they are standardised."""
        if self._standardizes_inputs():
            mean, scale = self._standardisation(X, sample_weight)
            scale[~(scale > 1e-12 * np.maximum(1.0, np.abs(mean)))] = 1.0
            self.x_mean_, self.x_scale_ = mean, scale
        else:
            self.x_mean_ = self.x_scale_ = None

    def _transform_X(self, X):
        if self.x_mean_ is None:
            return X
        return (X - self.x_mean_) / self.x_scale_
