"""The model file's format: its name and version, its two members, the error every refusal raises, and how the
JSON names torch dtypes and classes."""

from __future__ import annotations

import functools

import torch
from sklearn.base import BaseEstimator

__all__ = ["ALIGN", "DATA_MEMBER", "FORMAT", "FORMAT_VERSION", "MAX_SCHEMA_BYTES", "ModelFileError", "PICKLING_KEYS",
           "SCHEMA_MEMBER", "VALUE_NODES", "class_path", "dtype_name", "state_is_dict", "torch_dtype"]

#: The ``format`` a model file names in its ``model.json``.
FORMAT = "glas-sklearn-model"
#: The layout of ``model.json`` and ``data.bin``; a file of another version is refused, naming both versions.
FORMAT_VERSION = 1
SCHEMA_MEMBER, DATA_MEMBER = "model.json", "data.bin"
ALIGN = 64  # every storage and array starts at a multiple of this many bytes of data.bin
#: The most bytes ``model.json`` may hold: an estimator's object graph is a few hundred kilobytes of JSON (the
#: tensors and arrays are in ``data.bin``); a larger one is refused before it is read.
MAX_SCHEMA_BYTES = 64 << 20
#: Names the estimators' pickling hooks (``__getstate__`` / ``__setstate__``) put in the state they hand to pickle,
#: never attributes of a live object: a file whose object states hold any of them is refused, so that nothing read
#: from a file is ever interpreted by a pickling hook (a deep copy, a pickle, ``sklearn.base.clone``).
PICKLING_KEYS = frozenset({"_glas_pickle", "_glas_state", "_torch_state", "_torch_device"})
#: Nodes that stand for a value (no identity to keep): never memoised, never the target of a reference.
VALUE_NODES = frozenset({"tuple", "frozenset", "bytes", "complex", "torch.dtype", "torch.device", "torch.Size",
                         "numpy.scalar", "numpy.dtype", "builtin_type", "numpy.type", "type", "enum",
                         "namedtuple", "function", "pandas.RangeIndex", "slice", "numpy.ufunc"})


class ModelFileError(ValueError):
    """A model file refused by :func:`~glas_sklearn.load`, or an object :func:`~glas_sklearn.save` cannot store as
    data: another format or format version, a member other than the format's two, an untrusted or edited class
    name, inconsistent data, a function or lock held by the estimator."""


def class_path(cls) -> tuple[str, str]:
    """A class's module and qualified name, as the class table records them."""
    return cls.__module__, cls.__qualname__


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name) -> torch.dtype:
    """``"float32"`` → ``torch.float32``; a name that is no torch dtype is refused."""
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ModelFileError(f"The model file names the torch dtype {name!r}, which is not one.")
    return dtype


def _subclasses(cls: type):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@functools.lru_cache(maxsize=None)
def state_is_dict(cls: type) -> bool:
    """Whether objects of ``cls`` are stored as their ``__dict__`` and restored by a ``__dict__`` update, with no
    pickling hook of theirs run: scikit-learn estimators, and every class whose ``__getstate__`` or
    ``__setstate__`` an estimator inherits (the estimators' pickling hooks, which carry the torch state as bytes
    for pickle). Other classes go through their ``__getstate__`` and ``__setstate__``, as pickle does."""
    if issubclass(cls, BaseEstimator):
        return True
    hooks = [next((c for c in cls.__mro__ if name in vars(c)), object) for name in ("__getstate__", "__setstate__")]
    return any(hook is not object and any(issubclass(sub, BaseEstimator) for sub in _subclasses(hook))
               for hook in hooks)
