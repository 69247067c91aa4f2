"""Predictions past one machine: over Dask collections on a cluster's workers, and over Spark batches.

Prediction is embarrassingly parallel over rows. Given a Dask DataFrame or Dask Array, the estimators'
``predict``, ``predict_interval``, ``predict_proba`` and ``predict_set`` and the package's top-level
:func:`~glas_sklearn.predict_interval` / :func:`~glas_sklearn.predict_set` call :func:`map_prediction`, which
returns Dask Arrays (in the shapes the numpy path returns: intervals ``(n, 2, k)``, sets ``(n, C, k)``) computed
partition by partition on the workers, as dask-ml's ``ParallelPostFit`` does:

- the fitted estimator (or Pipeline) is written once with :func:`glas_sklearn.save` (a pickle only when it holds
  something that format does not store, a lambda say) and scattered to every worker at once under one key (with
  no distributed Client, a literal key of the graph); each worker loads the model once per process, cached by
  the digest of its contents, however many partitions and calls it serves (:func:`worker_cache_info` tells, run
  on the workers), and the scheduler places each partition's task where its rows are;
- within a partition, the estimator's own chunking keeps memory under ``compute__working_memory``;
- the output's trailing shapes and dtypes come from one call on two rows in the calling process (Dask's fake rows
  of the frame's meta, or the first two real rows when fake ones are refused, e.g. by a one-hot encoder).

Dask is optional and imported only when a Dask collection is given (:func:`is_dask_collection` checks the type's
module name, importing nothing). For Spark, :func:`batch_predictor` makes the function that ``mapInPandas``
calls, loading a model file once per executor process.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import sys
import threading
import warnings
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import getitem
from typing import Any

import numpy as np

from .serialization import ModelFileError, load, save

__all__ = ["ModelPayload", "batch_predictor", "is_dask_collection", "map_prediction", "model_payload",
           "output_schema", "predict", "predict_proba", "worker_cache_info"]

#: Models a worker process keeps loaded at once (least recently used dropped first).
CACHE_SIZE = 4

_lock = threading.Lock()
_models: OrderedDict[str, Any] = OrderedDict()
_loads: Counter = Counter()
_partitions: Counter = Counter()


def is_dask_collection(X) -> bool:
    """Whether ``X`` is a Dask collection (DataFrame, Series, Array, Bag), by its type's module: nothing imported."""
    module = getattr(type(X), "__module__", "") or ""
    return module.split(".")[0] in ("dask", "dask_expr")


# ----------------------------------------------------------------------------------------- the shipped model
@dataclass(frozen=True)
class ModelPayload:
    """A fitted estimator as bytes: ``kind`` "glas" (written by :func:`glas_sklearn.save`) or "pickle",
    ``key`` the SHA-256 of its contents, ``trusted`` the class paths the file names (the caller's own object, so
    its classes are trusted where it is loaded)."""

    key: str
    kind: str
    data: bytes
    trusted: tuple[str, ...] = ()


def model_payload(estimator) -> ModelPayload:
    """``estimator`` written once as bytes for the workers (see :class:`ModelPayload`)."""
    buffer = io.BytesIO()
    try:
        save(estimator, buffer)
    except ModelFileError:  # holds code (a lambda, a local class): the caller's own object, pickled by value
        try:
            import cloudpickle as pickler  # installed with dask: lambdas and local classes too
        except ImportError:
            pickler = pickle
        data = pickler.dumps(estimator, protocol=pickle.HIGHEST_PROTOCOL)
        return ModelPayload(hashlib.sha256(data).hexdigest(), "pickle", data)
    data = buffer.getvalue()
    digest = hashlib.sha256()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # the members, not the archive's write times
        schema = archive.read("model.json")
        digest.update(schema)
        digest.update(archive.read("data.bin"))
    classes = json.loads(schema).get("classes", [])
    trusted = tuple(sorted({f"{c['module']}.{c['name']}" for c in classes}))
    return ModelPayload(digest.hexdigest(), "glas", data, trusted)


def _cached(key: str, make: Callable[[], Any]):
    """The model cached under ``key`` in this process, made by ``make()`` on first use (least recently used
    dropped beyond ``CACHE_SIZE``)."""
    with _lock:
        if key in _models:
            _models.move_to_end(key)
            return _models[key]
        model = make()
        _models[key] = model
        _loads[key] += 1
        while len(_models) > CACHE_SIZE:
            _models.popitem(last=False)
        return model


def _loaded(payload: ModelPayload):
    """The model of ``payload`` in this process: loaded on first use, then taken from the cache by its key."""
    if payload.kind == "glas":
        return _cached(payload.key, lambda: load(io.BytesIO(payload.data), trusted=payload.trusted))
    return _cached(payload.key, lambda: pickle.loads(payload.data))


def worker_cache_info() -> dict:
    """This process's pid, the models it loaded (key → times loaded) and the partitions it predicted (key →
    count); ``client.run(worker_cache_info)`` asks every worker."""
    with _lock:
        return {"pid": os.getpid(), "loads": dict(_loads), "partitions": dict(_partitions),
                "cached": list(_models)}


# ------------------------------------------------------------------------------------------- one partition
@dataclass(frozen=True)
class _Output:
    """One output of a prediction: its shape after the rows, and its dtype."""

    trailing: tuple[int, ...]
    dtype: np.dtype


def _call(model, call, X, kwargs):
    if hasattr(X, "columns") and getattr(model, "feature_names_in_", None) is None:
        X = X.to_numpy()  # a model fitted on arrays takes a partition's values, in its columns' order
    return call(model, X, **kwargs) if callable(call) else getattr(model, call)(X, **kwargs)


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, tuple) else (out,)


def _predict_partition(payload: ModelPayload, part, call, kwargs: dict, outputs: tuple[_Output, ...]) -> tuple:
    """The prediction of one partition, on the worker that holds it (the model from this process's cache)."""
    n = len(part)
    if n == 0:  # an empty partition (after a filter): empty outputs, the model not called
        return tuple(np.empty((0, *o.trailing), dtype=o.dtype) for o in outputs)
    model = _loaded(payload)
    result = tuple(np.asarray(o) for o in _as_tuple(_call(model, call, part, kwargs)))
    with _lock:
        _partitions[payload.key] += 1
    return result


# ---------------------------------------------------------------------------------------------- the graph
def _probe_rows(X):
    """Two rows to learn the outputs' shapes and dtypes from: Dask's fake rows of the meta, then real ones."""
    import dask.dataframe as dd

    if isinstance(X, dd.DataFrame):
        from dask.dataframe.utils import meta_nonempty

        return [lambda: meta_nonempty(X._meta).iloc[:2], lambda: X.head(2, npartitions=-1)]
    return [lambda: np.ones((2, *X.shape[1:]), dtype=X.dtype), lambda: X[:2].compute()]


def _output_specs(estimator, X, call, kwargs) -> tuple[tuple[_Output, ...], bool]:
    """The outputs' trailing shapes and dtypes, and whether the method returns a tuple, from a call on two rows in
    this process; when fake rows are refused the first real rows are used, and their error is raised as it is."""
    attempts = _probe_rows(X)
    for i, rows in enumerate(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = _call(estimator, call, rows(), kwargs)
            break
        except Exception:
            if i == len(attempts) - 1:
                raise
    is_tuple = isinstance(out, tuple)
    specs = tuple(_Output(np.asarray(o).shape[1:], np.asarray(o).dtype) for o in _as_tuple(out))
    return specs, is_tuple


def _partitions_of(X) -> tuple[list, tuple[float, ...]]:
    """The Delayed partitions (row blocks) of X and their row counts (NaN where unknown)."""
    import dask.array as da
    import dask.dataframe as dd

    if isinstance(X, dd.DataFrame):
        parts = list(X.to_delayed())
        return parts, (np.nan,) * len(parts)
    if isinstance(X, da.Array):
        if X.ndim < 2:
            raise ValueError(f"A Dask Array of rows must be 2-D or more (n_samples, n_features, ...), got shape "
                             f"{X.shape}; reshape it, e.g. X.reshape(-1, 1) for one feature.")
        X = X.rechunk({axis: -1 for axis in range(1, X.ndim)})  # whole rows in each block
        return list(X.to_delayed().ravel()), tuple(X.chunks[0])
    raise TypeError(f"Predictions over Dask take a Dask DataFrame or a Dask Array of rows, got "
                    f"{type(X).__module__}.{type(X).__name__}; convert it (e.g. series.to_frame()).")


def _shipped(payload: ModelPayload):
    """The payload as one key of the graph: with a distributed Client, scattered to every worker at once (so the
    scheduler places each partition's task where its rows are, not where the model is); else a literal key."""
    import dask

    name = f"glas-model-{payload.key[:16]}"
    client = None
    if "distributed" in sys.modules:
        try:
            client = sys.modules["distributed"].get_client()
        except ValueError:  # no client: a local scheduler
            client = None
    if client is None:
        return dask.delayed(payload, name=name, traverse=False)
    return client.scatter({name: payload}, broadcast=True)[name]


def map_prediction(estimator, X, call: str | Callable, **kwargs):
    """``estimator.<call>(X, **kwargs)`` (or ``call(estimator, X, **kwargs)``) over a Dask DataFrame or Array,
    partition by partition on the workers.

    Parameters
    ----------
    estimator : fitted estimator or Pipeline
        Written once (:func:`glas_sklearn.save`, else pickled), scattered to every worker; each loads it once.
    X : dask.dataframe.DataFrame or dask.array.Array
        Rows; an Array is rechunked to whole rows (one chunk along every axis but the first).
    call : str or callable
        A method name (``"predict_interval"``) or a module-level function ``f(estimator, X, **kwargs)``
        (``glas_sklearn.predict_interval``), called on each partition as pandas / numpy.
    **kwargs
        Passed to each call (``confidence_level=``, ``return_std=``).

    Returns
    -------
    dask.array.Array or tuple of dask.array.Array
        What the call returns on numpy rows, as lazy Dask Arrays: row chunks as the partitions (of unknown size
        for a DataFrame: ``.compute_chunk_sizes()`` learns them), the trailing shapes and dtypes of the numpy path.
        Computing them together (``dask.compute(y_pred, y_pis)``) runs each partition once.
    """
    import dask
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    parts, rows = _partitions_of(X)
    specs, is_tuple = _output_specs(estimator, X, call, kwargs)  # also checks the call is possible, before work
    payload = model_payload(estimator)
    call_name = call if isinstance(call, str) else f"{call.__module__}.{call.__qualname__}"
    token = tokenize(payload.key, [p.key for p in parts], call_name, kwargs)
    shipped = _shipped(payload)
    tasks = [dask.delayed(_predict_partition, pure=True)(shipped, part, call, kwargs, specs,
                                                         dask_key_name=f"glas-{call_name}-{token}-{i}")
             for i, part in enumerate(parts)]
    arrays = []
    for j, spec in enumerate(specs):
        name = f"glas-{call_name}-out{j}-{token}"
        zeros = (0,) * len(spec.trailing)
        layer = {(name, i, *zeros): (getitem, task.key, j) for i, task in enumerate(tasks)}
        graph = HighLevelGraph.from_collections(name, layer, dependencies=tasks)
        chunks = (rows, *((s,) for s in spec.trailing))
        arrays.append(da.Array(graph, name, chunks, dtype=spec.dtype,
                               meta=np.empty((0,) * (1 + len(spec.trailing)), dtype=spec.dtype)))
    return tuple(arrays) if is_tuple else arrays[0]


def predict(estimator, X, **kwargs):
    """``estimator.predict`` over a Dask collection (:func:`map_prediction`): for a Pipeline too."""
    return map_prediction(estimator, X, "predict", **kwargs)


def predict_proba(estimator, X):
    """``estimator.predict_proba`` over a Dask collection (:func:`map_prediction`): for a Pipeline too."""
    return map_prediction(estimator, X, "predict_proba")


# ----------------------------------------------------------------------------------------------------- Spark
_OUTPUT_NAMES = {"predict": ("y_pred", "y_std"), "predict_interval": ("y_pred", "y_pis"),
                 "predict_proba": ("proba",), "predict_set": ("labels", "sets")}


def _flat_columns(method: str | Callable, outputs: Iterable[np.ndarray]) -> dict[str, np.ndarray]:
    """Each output as columns: ``y_pred``; ``y_pis_0_1`` (bound 0 = lower, level 1) and so on."""
    names = _OUTPUT_NAMES.get(method if isinstance(method, str) else method.__name__, ())
    columns = {}
    for j, out in enumerate(outputs):
        base = names[j] if j < len(names) else f"out{j}"
        out = np.asarray(out)
        if out.ndim == 1:
            columns[base] = out
            continue
        flat = out.reshape(len(out), -1)
        for c, index in enumerate(np.ndindex(*out.shape[1:])):
            columns[f"{base}_{'_'.join(map(str, index))}"] = flat[:, c]
    return columns


def batch_predictor(model_path: str | os.PathLike, method: str | Callable = "predict_interval", *,
                    feature_columns: list[str] | None = None, keep_columns: Iterable[str] = (),
                    trusted: Iterable[str] = (), **kwargs) -> Callable[[Iterator], Iterator]:
    """The function Spark's ``DataFrame.mapInPandas`` calls: pandas batches in, predictions out as columns.

    The model file (written by :func:`glas_sklearn.save`, readable on every executor) is loaded once per
    executor's Python worker process, cached by its path and modification time, never unpickled.

    Parameters
    ----------
    model_path : str or path-like
        A model file.
    method : str or callable
        A method of the model (``"predict"``, ``"predict_interval"``, ``"predict_proba"``, ``"predict_set"``), or a
        module-level function ``f(model, X, **kwargs)``: :func:`glas_sklearn.predict_interval` or
        :func:`glas_sklearn.predict_set` for a saved Pipeline.
    feature_columns : list of str, optional
        The columns given to the model (default: all of the batch).
    keep_columns : iterable of str
        Columns of the batch copied to the output first (a row id to join on).
    trusted : iterable of str
        Classes beyond :func:`glas_sklearn.load`'s allow-list (a prefit network's own class).
    **kwargs
        Passed to each call (``confidence_level=``).

    Returns
    -------
    callable
        ``f(batches) -> batches``: the kept columns, then the outputs' columns as :func:`output_schema` names
        them (``y_pred``, ``y_pis_<bound>_<level>``, ``proba_<class>``, ``sets_<class>_<level>``).
    """
    path = os.fspath(model_path)
    trusted, keep = tuple(trusted), list(keep_columns)

    def predict_batches(batches):
        import pandas as pd

        model = _file_model(path, trusted)
        for batch in batches:
            X = batch if feature_columns is None else batch[feature_columns]
            columns = _flat_columns(method, _as_tuple(_call(model, method, X, kwargs)))
            yield pd.concat([batch[keep].reset_index(drop=True), pd.DataFrame(columns)], axis=1)

    return predict_batches


def output_schema(model_path: str | os.PathLike, method: str | Callable, X_sample, *, trusted: Iterable[str] = (),
                  **kwargs) -> str:
    """The Spark DDL schema (``"y_pred double, y_pis_0_0 double, ..."``) of :func:`batch_predictor`'s output,
    from a call on ``X_sample`` (a few rows, pandas) in this process."""
    model = _file_model(os.fspath(model_path), tuple(trusted))
    columns = _flat_columns(method, _as_tuple(_call(model, method, X_sample, kwargs)))
    kinds = {"f": "double", "i": "bigint", "u": "bigint", "b": "boolean", "O": "string", "U": "string"}
    return ", ".join(f"`{name}` {kinds.get(values.dtype.kind, 'string')}" for name, values in columns.items())


def _file_model(path: str, trusted: tuple[str, ...]):
    """The model file at ``path`` in this process, loaded once per (path, modification time)."""
    return _cached(f"file:{path}:{os.stat(path).st_mtime_ns}", lambda: load(path, trusted=trusted))
