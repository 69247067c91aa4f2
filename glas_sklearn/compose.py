"""Intervals and prediction sets through scikit-learn's composite estimators.

A ``Pipeline`` forwards ``predict`` and ``predict_proba`` to its last step but not ``predict_interval`` or
``predict_set``, and a ``TransformedTargetRegressor`` maps predictions back through its inverse transform but
drops every other output. :func:`predict_interval` and :func:`predict_set` run the transforms of (nested)
pipelines and call the final step; :func:`predict_interval` also maps intervals through the inverse of an
affine target transform. The interval scorers of :mod:`glas_sklearn.metrics` call :func:`predict_interval`.
"""

from __future__ import annotations

import inspect

import numpy as np
from sklearn.compose import TransformedTargetRegressor
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from .scale_out import is_dask_collection, map_prediction

__all__ = ["final_step", "predict_interval", "predict_set"]

# An inverse target transform counts as affine when it reproduces intercept + slope·t at every value mapped,
# to this relative tolerance (float64 round-off of an affine map is some 1e-16 relative).
_AFFINE_RTOL = 1e-9


def final_step(estimator, X):
    """The last step of (nested) Pipelines, and X transformed by every step before it (the estimator itself and X
    when it is not a Pipeline)."""
    while isinstance(estimator, Pipeline):
        if len(estimator.steps) > 1:
            X = estimator[:-1].transform(X)
        estimator = estimator[-1]
    return estimator, X


def _takes_level(method) -> bool:
    try:
        return "confidence_level" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _call_with_level(estimator, name: str, X, confidence_level):
    """``estimator.<name>(X, confidence_level=...)``; a method without that argument (MAPIE v1, whose levels
    are fixed at construction) is called without it, and a level other than the estimator's is refused."""
    method = getattr(estimator, name, None)
    if method is None:
        raise TypeError(f"{type(estimator).__name__} has no {name} method and is not a Pipeline (or "
                        f"TransformedTargetRegressor) ending in an estimator that has one.")
    if _takes_level(method):
        return method(X, confidence_level=confidence_level)
    fixed = getattr(estimator, "confidence_level", None)
    if confidence_level is not None and fixed is not None and not np.array_equal(
            np.atleast_1d(np.asarray(confidence_level, dtype=float)), np.atleast_1d(np.asarray(fixed, dtype=float))):
        raise ValueError(f"{type(estimator).__name__}.{name} takes no confidence_level: its level is fixed at "
                         f"construction ({fixed!r}), but confidence_level={confidence_level!r} was asked for.")
    return method(X)


def _inverse_affine(ttr: TransformedTargetRegressor, y_pred: np.ndarray, y_pis: np.ndarray):
    """Predictions and interval bounds (n, 2, k) or (n, M, 2, k) of the inner regressor mapped through the
    inverse target transform, which must be affine: y = a + b·t per output; bounds swap where b < 0."""
    inverse = ttr.transformer_.inverse_transform
    n = y_pred.shape[0]
    pred = np.asarray(y_pred, dtype=np.float64).reshape(n, -1)
    M = pred.shape[1]
    pis = np.asarray(y_pis, dtype=np.float64)
    k = pis.shape[-1]
    bounds = pis.reshape(n, M, 2, k)
    values = np.concatenate([pred, bounds.transpose(0, 2, 3, 1).reshape(-1, M)])  # (n + 2kn, M)
    intercept = np.asarray(inverse(np.zeros((1, M))), dtype=np.float64).reshape(1, M)
    slope = np.asarray(inverse(np.ones((1, M))), dtype=np.float64).reshape(1, M) - intercept
    mapped = np.asarray(inverse(values), dtype=np.float64).reshape(values.shape)
    affine = intercept + slope * values
    tol = _AFFINE_RTOL * (np.abs(intercept) + np.abs(slope * values)) + np.finfo(np.float64).tiny
    if not np.all(np.abs(mapped - affine) <= tol) or not np.all(slope != 0):
        raise ValueError(
            f"{type(ttr).__name__}: the inverse target transform ({type(ttr.transformer_).__name__}) is not an "
            "affine map y = a + b·t with b != 0 on the values predicted, so the regressor's intervals cannot be "
            "mapped to y exactly; use an affine transform (StandardScaler, or func/inverse_func a + b·t), or "
            "predict intervals of the transformed target with predict_interval(ttr.regressor_, X).")
    out_pred = mapped[:n].reshape(y_pred.shape)
    b = mapped[n:].reshape(n, 2, k, M).transpose(0, 3, 1, 2)  # back to (n, M, 2, k)
    lower, upper = np.minimum(b[:, :, 0], b[:, :, 1]), np.maximum(b[:, :, 0], b[:, :, 1])
    out_pis = np.stack([lower, upper], axis=2).reshape(pis.shape)
    return out_pred, out_pis


def predict_interval(estimator, X, confidence_level=None) -> tuple[np.ndarray, np.ndarray]:
    """``predict_interval`` of an estimator, of the last step of a (nested) Pipeline, or through a
    ``TransformedTargetRegressor`` with an affine target transform.

    Parameters
    ----------
    estimator : estimator, Pipeline or TransformedTargetRegressor
        Fitted. Its final step has ``predict_interval(X, confidence_level=...)`` (as
        :class:`~glas_sklearn.LaplaceActiveSubspaceRegressor`) or ``predict_interval(X)`` with the level fixed
        at construction (as MAPIE's regressors; then ``confidence_level`` must be None or that level).
    X : array-like
        The inputs of ``estimator``: a Pipeline's steps before the last transform them first.
    confidence_level : float or list of float, optional
        Defaults to the final step's own level(s).

    Returns
    -------
    y_pred : ndarray of shape (n_samples,) or (n_samples, n_outputs)
    y_pis : ndarray of shape (n_samples, 2, k) or (n_samples, n_outputs, 2, k)
        Lower ([:, 0]) and upper ([:, 1]) bounds, in the units of y. Under a ``TransformedTargetRegressor``
        the inner regressor's bounds are mapped through the inverse transform y = a + b·t (swapped when
        b < 0); a transform that is not affine raises a ValueError (a nonlinear map of a mean and its
        interval is not the mean and interval of y).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank, Training, predict_interval
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(0, 10, size=(100, 2)); y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(100)
    >>> pipe = make_pipeline(StandardScaler(), LaplaceActiveSubspaceRegressor(
    ...     training=Training(max_epochs=100, batch_size=None, lr=0.02),
    ...     posterior=LowRank(include_noise=True, n_samples=100, max_components=5), random_state=0)).fit(X, y)
    >>> y_pred, y_pis = predict_interval(pipe, X[:4], confidence_level=[0.5, 0.9])
    >>> y_pis.shape
    (4, 2, 2)
    """
    if is_dask_collection(X):  # Dask Arrays computed on the workers (glas_sklearn.scale_out)
        return map_prediction(estimator, X, predict_interval, confidence_level=confidence_level)
    final, Xt = final_step(estimator, X)
    if isinstance(final, TransformedTargetRegressor):
        check_is_fitted(final)
        y_pred, y_pis = predict_interval(final.regressor_, Xt, confidence_level)
        return _inverse_affine(final, y_pred, y_pis)
    out = _call_with_level(final, "predict_interval", Xt, confidence_level)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"{type(final).__name__}.predict_interval must return (y_pred, y_pis), "
                        f"got {type(out).__name__}.")
    return out


def predict_set(estimator, X, confidence_level=None) -> tuple[np.ndarray, np.ndarray]:
    """``predict_set`` of a classifier or of the last step of a (nested) Pipeline.

    Parameters
    ----------
    estimator : estimator or Pipeline
        Fitted; its final step has ``predict_set`` (as :class:`~glas_sklearn.LaplaceActiveSubspaceClassifier`).
    X : array-like
        The inputs of ``estimator``.
    confidence_level : float or list of float, optional
        Defaults to the final step's own level(s).

    Returns
    -------
    labels : ndarray of shape (n_samples,)
    sets : ndarray of bool, shape (n_samples, n_classes, k)

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from glas_sklearn import LaplaceActiveSubspaceClassifier, LowRank, Training, predict_set
    >>> X, y = make_blobs(n_samples=90, centers=3, random_state=0)
    >>> pipe = make_pipeline(StandardScaler(), LaplaceActiveSubspaceClassifier(
    ...     training=Training(max_epochs=20), posterior=LowRank(n_samples=50, max_components=3),
    ...     random_state=0)).fit(X, y)
    >>> labels, sets = predict_set(pipe, X[:4])
    >>> sets.shape
    (4, 3, 1)
    """
    if is_dask_collection(X):  # Dask Arrays computed on the workers (glas_sklearn.scale_out)
        return map_prediction(estimator, X, predict_set, confidence_level=confidence_level)
    final, Xt = final_step(estimator, X)
    return _call_with_level(final, "predict_set", Xt, confidence_level)
