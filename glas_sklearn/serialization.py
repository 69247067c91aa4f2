"""Model files that hold data, not code: :func:`save` and :func:`load`.

A model file is a zip archive of exactly two members. ``model.json`` holds the format and its version, the versions
that wrote it, a table of the classes the file names, a table of tensor storages, and the object graph as JSON:
every object as its class (an index into the table) and its state (its ``__dict__``, or what its
``__getstate__`` returns), recursively. ``data.bin`` holds the bytes of every tensor storage and every numpy array,
at the offsets the JSON names (as safetensors does, without the dependency).

:func:`load` reads those two members and nothing else, and never unpickles. Before it imports or makes anything it
checks every class the file names against an allow-list (glas-sklearn's own classes, torch.nn's built-in layers,
a few scikit-learn and numpy types) and the ``trusted`` names the caller gives; a name outside both, a name that
is not the class's own (an alias edited in, such as a module's imported ``os``), or a function is refused by name.
Objects are then made with ``cls.__new__(cls)`` and given their state with the class's ``__setstate__`` (or a
``__dict__`` update): no ``__init__`` runs, and scikit-learn estimators are given their ``__dict__`` directly,
so that no pickling hook of theirs runs either.
"""

from __future__ import annotations

import base64
import enum
import functools
import importlib
import json
import logging
import os
import types
import zipfile
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator
from sklearn.preprocessing import LabelBinarizer, LabelEncoder, MinMaxScaler, OneHotEncoder, StandardScaler
from torch import nn

from ._version import __version__

__all__ = ["FORMAT", "FORMAT_VERSION", "ModelFileError", "load", "save"]

logger = logging.getLogger(__name__)

#: The ``format`` a model file names in its ``model.json``.
FORMAT = "glas-sklearn-model"
#: The layout of ``model.json`` and ``data.bin``; a file of another version is refused, naming both versions.
FORMAT_VERSION = 1
_SCHEMA, _DATA = "model.json", "data.bin"
_ALIGN = 64  # every storage and array starts at a multiple of this many bytes of data.bin

#: Packages whose classes load without being trusted: glas-sklearn's own, torch.nn's built-in layers and
#: torch.optim's optimizers (named by a ``optimizer=`` setting).
_TRUSTED_PACKAGES = ("glas_sklearn", "torch.nn.modules", "torch.optim")
#: Classes of other packages that load without being trusted.
_TRUSTED_CLASSES = frozenset(f"{c.__module__}.{c.__qualname__}" for c in (
    StandardScaler, MinMaxScaler, LabelEncoder, LabelBinarizer, OneHotEncoder,
    np.random.RandomState, np.random.Generator, np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
    np.random.Philox, np.random.SFC64))
#: Builtin types a file may name as values (e.g. a ``dtype=float`` setting).
_BUILTIN_TYPES = {t.__name__: t for t in (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)}
_JSON_SCALARS = (type(None), bool, int, float, str)
#: Objects that are code, never stored.
_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.MethodWrapperType,
         types.WrapperDescriptorType, types.ModuleType, functools.partial, staticmethod, classmethod, property)


class ModelFileError(ValueError):
    """A model file refused by :func:`load` (or an object :func:`save` cannot store as data): another format or
    format version, a member other than the two of the format, an untrusted or edited class name, inconsistent
    data."""


# ------------------------------------------------------------------------------------------------------------ save
def save(estimator: Any, path: str | os.PathLike | BinaryIO) -> None:
    """Write a (fitted) estimator to a model file that holds data only: :func:`load` reads it back without
    unpickling anything.

    Tensors and arrays are stored as their bytes, everything else as JSON (see the module's documentation). Any
    object graph of allow-listed classes can be saved; a user's own classes (a prefit network's module class, a
    custom likelihood) are recorded by name, and :func:`load` makes them only when its caller trusts them.

    Parameters
    ----------
    estimator : object
        Usually a fitted :class:`~glas_sklearn.LaplaceActiveSubspaceRegressor` or
        :class:`~glas_sklearn.LaplaceActiveSubspaceClassifier`.
    path : str, path-like or binary file object
        Where to write (conventionally with the extension ``.glas``).

    Raises
    ------
    ModelFileError
        When the estimator holds something that is not data (a lambda, a lock, a tensor subclass, a class defined
        inside a function), naming where it is held.

    Examples
    --------
    >>> import io, numpy as np, glas_sklearn
    >>> X = np.random.default_rng(0).normal(size=(60, 2)); y = X[:, 0]
    >>> reg = glas_sklearn.LaplaceActiveSubspaceRegressor(max_epochs=2, max_components=2, random_state=0)
    >>> reg = reg.fit(X, y)
    >>> buffer = io.BytesIO(); glas_sklearn.save(reg, buffer); _ = buffer.seek(0)
    >>> bool(np.array_equal(glas_sklearn.load(buffer).predict(X), reg.predict(X)))
    True
    """
    writer = _Writer()
    root = writer.encode(estimator, "estimator")
    schema = {"format": FORMAT, "format_version": FORMAT_VERSION,
              "written_by": {"glas_sklearn": __version__, "torch": torch.__version__, "numpy": np.__version__},
              "classes": writer.classes, "storages": writer.storages, "root": root}
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if isinstance(path, (str, os.PathLike)):
        with open(path, "wb") as file:
            _write_archive(file, text, writer.data)
    else:
        _write_archive(path, text, writer.data)


def _write_archive(file: BinaryIO, text: str, data: list) -> None:
    with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(_SCHEMA, text)
        with archive.open(_DATA, "w", force_zip64=True) as out:
            for chunk in data:
                out.write(chunk)


def _class_path(cls) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Writer:
    """The object graph → JSON nodes, with the bytes of tensors and arrays gathered into ``data``."""

    def __init__(self) -> None:
        self.classes: list[dict] = []
        self.storages: list[dict] = []
        self.data: list[bytes | memoryview] = []
        self._size = 0
        self._class_index: dict[tuple[str, str], int] = {}
        self._storage_index: dict[tuple, int] = {}
        self._memo: dict[int, dict] = {}  # id(object) → its node (given a "#" once a second reference is met)
        self._alive: list = []  # every object memoised, kept alive so that no id is reused during the walk
        self._next_ref = 0

    # ------------------------------------------------------------------ data
    def _put(self, buffer) -> int:
        """Append bytes to data.bin (aligned); their offset."""
        pad = -self._size % _ALIGN
        if pad:
            self.data.append(b"\0" * pad)
            self._size += pad
        offset = self._size
        view = memoryview(buffer).cast("B")
        self.data.append(view)
        self._size += view.nbytes
        return offset

    def _class(self, cls, where: str) -> int:
        module, name = _class_path(cls)
        if "<locals>" in name or "<lambda>" in name:
            raise ModelFileError(f"{where} is of class {module}.{name}, defined inside a function: a model file "
                                 "names classes by their import path. Define it at the top level of a module.")
        key = (module, name)
        if key not in self._class_index:
            try:
                found = _import_attribute(module, name)
            except (ImportError, AttributeError):
                found = None
            if found is not cls:
                raise ModelFileError(f"{where} is of class {module}.{name}, which cannot be imported under that "
                                     "name; define it at the top level of an importable module.")
            self._class_index[key] = len(self.classes)
            self.classes.append({"module": module, "name": name})
        return self._class_index[key]

    # ------------------------------------------------------------------ walk
    def encode(self, obj, where: str):
        """The JSON node of ``obj`` (``where`` names it in errors: ``estimator.posterior_.eigenvectors``)."""
        if type(obj) in _JSON_SCALARS:
            return obj
        memo = self._memo.get(id(obj))
        if memo is not None:
            if "#" not in memo:
                memo["#"] = self._next_ref
                self._next_ref += 1
            return {"@": "ref", "to": memo["#"]}
        node = self._encode_new(obj, where)
        if isinstance(node, dict) and node.get("@") not in _VALUE_NODES:
            self._memo[id(obj)] = node
            self._alive.append(obj)
        return node

    def _items(self, values, where: str) -> list:
        return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(values)]

    def _encode_new(self, obj, where: str) -> dict:
        t = type(obj)
        if t is list:
            node = {"@": "list"}
            self._memo[id(obj)] = node  # before the items: a list may hold itself
            self._alive.append(obj)
            node["items"] = self._items(obj, where)
            return node
        if t in (dict, OrderedDict):
            node = {"@": "dict" if t is dict else "OrderedDict"}
            self._memo[id(obj)] = node
            self._alive.append(obj)
            if all(type(k) is str for k in obj):
                node["map"] = {k: self.encode(v, f"{where}.{k}") for k, v in obj.items()}
            else:
                node["items"] = [[self.encode(k, f"{where} key"), self.encode(v, f"{where}[{k!r}]")]
                                 for k, v in obj.items()]
            return node
        if t is tuple:
            return {"@": "tuple", "items": self._items(obj, where)}
        if t in (set, frozenset):
            return {"@": t.__name__, "items": self._items(obj, where)}
        if t in (bytes, bytearray):
            return {"@": t.__name__, "b64": base64.b64encode(obj).decode("ascii")}
        if t is complex:
            return {"@": "complex", "re": obj.real, "im": obj.imag}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, where)
        if t is torch.dtype:
            return {"@": "torch.dtype", "name": _dtype_name(obj)}
        if t is torch.device:
            return {"@": "torch.device", "name": str(obj)}
        if t is torch.Size:
            return {"@": "torch.Size", "items": list(obj)}
        if t is torch.Generator:
            return {"@": "torch.Generator", "device": str(obj.device), "seed": obj.initial_seed(),
                    "state": self._tensor(obj.get_state(), f"{where} state")}
        if isinstance(obj, np.ndarray):
            return self._array(obj, where)
        if isinstance(obj, np.generic):
            if obj.dtype.hasobject or obj.dtype.fields is not None:
                raise ModelFileError(f"{where} is a numpy scalar of dtype {obj.dtype}, which is not stored as data.")
            return {"@": "numpy.scalar", "dtype": obj.dtype.str, "hex": obj.tobytes().hex()}
        if isinstance(obj, np.dtype):
            if obj.hasobject or obj.fields is not None:
                raise ModelFileError(f"{where} is the numpy dtype {obj}, which is not stored as data.")
            return {"@": "numpy.dtype", "str": obj.str}
        if isinstance(obj, (pd.DataFrame, pd.Series, pd.Index)):
            return self._pandas(obj, where)
        if t is np.random.RandomState:
            return {"@": "object", "cls": self._class(t, where),
                    "rng_state": self.encode(obj.get_state(legacy=False), f"{where} state")}
        if t is np.random.Generator:
            bits = obj.bit_generator
            return {"@": "object", "cls": self._class(t, where), "bit_generator": self._class(type(bits), where),
                    "rng_state": self.encode(bits.state, f"{where} state")}
        if isinstance(obj, type):
            return self._type(obj, where)
        if isinstance(obj, enum.Enum):
            return {"@": "enum", "cls": self._class(t, where), "name": obj.name}
        if isinstance(obj, tuple) and hasattr(t, "_fields"):  # a NamedTuple
            return {"@": "namedtuple", "cls": self._class(t, where), "items": self._items(obj, where)}
        return self._object(obj, where)

    def _type(self, cls: type, where: str) -> dict:
        if cls in _BUILTIN_TYPES.values():
            return {"@": "builtin_type", "name": cls.__name__}
        if issubclass(cls, np.generic):
            return {"@": "numpy.type", "dtype": np.dtype(cls).str}
        return {"@": "type", "cls": self._class(cls, where)}

    def _object(self, obj, where: str) -> dict:
        t = type(obj)
        if isinstance(obj, _CODE):
            raise ModelFileError(f"{where} is {obj!r}, a function or module: a model file holds data, not code. "
                                 "Hold a name (a string) that the code maps to the function instead.")
        if isinstance(obj, (list, dict, tuple, set, frozenset)) or (
                t.__reduce_ex__ is not object.__reduce_ex__ or t.__reduce__ is not object.__reduce__):
            raise ModelFileError(f"{where} is a {t.__module__}.{t.__qualname__}, which pickles itself through "
                                 "__reduce__ (or subclasses a builtin container); a model file cannot store it as "
                                 "data.")
        node = {"@": "object", "cls": self._class(t, where)}
        self._memo[id(obj)] = node  # before the state: an object's state may refer back to it
        self._alive.append(obj)
        state = dict(vars(obj)) if isinstance(obj, BaseEstimator) else obj.__getstate__()
        self._alive.append(state)
        node["state"] = self.encode(state, where)
        return node

    def _tensor(self, t: torch.Tensor, where: str) -> dict:
        kind = type(t)
        if kind not in (torch.Tensor, nn.Parameter):
            raise ModelFileError(f"{where} is a tensor subclass {kind.__module__}.{kind.__qualname__}; a model file "
                                 "stores plain tensors and nn.Parameter only.")
        if t.layout != torch.strided or t.is_quantized or t.is_conj() or t.is_neg() or t.device.type == "meta":
            raise ModelFileError(f"{where} is a {t.layout} / quantized / conjugate or meta tensor; a model file "
                                 "stores dense tensors only (convert it with .to_dense() / .resolve_conj()).")
        storage = t.untyped_storage()
        key = (storage.data_ptr(), str(t.device), storage.nbytes())
        if key not in self._storage_index or storage.data_ptr() == 0:
            raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).detach()
            raw = raw.cpu().numpy()
            self._storage_index[key] = len(self.storages)
            self.storages.append({"at": self._put(raw), "nbytes": int(raw.nbytes), "device": str(t.device)})
            self._alive.append(storage)
        node = {"@": "tensor", "dtype": _dtype_name(t.dtype), "storage": self._storage_index[key],
                "offset": t.storage_offset(), "shape": list(t.shape), "stride": list(t.stride()),
                "requires_grad": t.requires_grad}
        if kind is nn.Parameter:
            node["parameter"] = True
        if getattr(t, "__dict__", None):
            node["attributes"] = self.encode(dict(t.__dict__), f"{where} attributes")
        return node

    def _array(self, a: np.ndarray, where: str) -> dict:
        if type(a) is not np.ndarray:
            raise ModelFileError(f"{where} is a {type(a).__qualname__} (an ndarray subclass); store np.asarray(...).")
        if a.dtype.fields is not None:
            raise ModelFileError(f"{where} is a structured array (dtype {a.dtype}), which is not stored as data.")
        shape = list(a.shape)
        if a.dtype.hasobject:
            return {"@": "ndarray", "dtype": "|O", "shape": shape, "items": self._items(a.reshape(-1), where)}
        order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
        flat = np.ascontiguousarray(a.T if order == "F" else a)
        return {"@": "ndarray", "dtype": a.dtype.str, "shape": shape, "order": order,
                "at": self._put(flat.view(np.uint8).reshape(-1) if flat.size else b""), "nbytes": int(flat.nbytes)}

    def _pandas(self, obj, where: str) -> dict:
        if isinstance(obj, pd.MultiIndex) or (not isinstance(obj, pd.Index) and isinstance(obj.index, pd.MultiIndex)):
            raise ModelFileError(f"{where} has a pandas MultiIndex, which a model file does not store.")
        if isinstance(obj, pd.RangeIndex):
            return {"@": "pandas.RangeIndex", "start": obj.start, "stop": obj.stop, "step": obj.step,
                    "name": self.encode(obj.name, where)}
        if isinstance(obj, pd.Index):
            return {"@": "pandas.Index", "values": self._column(obj, where), "name": self.encode(obj.name, where)}
        if isinstance(obj, pd.Series):
            return {"@": "pandas.Series", "values": self._column(obj, where), "index": self._pandas(obj.index, where),
                    "name": self.encode(obj.name, where)}
        columns = [self._column(obj.iloc[:, j], f"{where}[{obj.columns[j]!r}]") for j in range(obj.shape[1])]
        return {"@": "pandas.DataFrame", "columns": self._pandas(obj.columns, f"{where}.columns"),
                "index": self._pandas(obj.index, f"{where}.index"), "data": columns,
                "attrs": self.encode(dict(obj.attrs), f"{where}.attrs")}

    def _column(self, values, where: str) -> dict:
        """The values of an Index or a column: an array node, with the pandas string dtype named when it has one."""
        dtype = values.dtype
        if isinstance(dtype, pd.StringDtype):
            node = self._array(values.to_numpy(dtype=object, na_value=None), where)
            node["pandas_dtype"] = str(dtype)
            return node
        if not isinstance(dtype, np.dtype):
            raise ModelFileError(f"{where} has the pandas extension dtype {dtype}; a model file stores numpy and "
                                 "string dtypes only (convert with .astype(...)).")
        return self._array(values.to_numpy(), where)


#: Nodes that stand for a value (no identity to keep): never memoised.
_VALUE_NODES = frozenset({"tuple", "frozenset", "bytes", "complex", "torch.dtype", "torch.device", "torch.Size",
                          "numpy.scalar", "numpy.dtype", "builtin_type", "numpy.type", "type", "enum",
                          "pandas.RangeIndex"})


# ------------------------------------------------------------------------------------------------------------ load
def load(path: str | os.PathLike | BinaryIO, trusted: Iterable[str | type] | None = None, *,
         map_location: str | torch.device | None = None) -> Any:
    """Read an estimator written by :func:`save`, without unpickling anything.

    Every class the file names is checked before anything is made: glas-sklearn's own classes, torch.nn's
    built-in layers and a few scikit-learn and numpy types load as they are; any other class (a prefit network's
    own module class, say) only when ``trusted`` names it, since using it runs that class's code. A file naming
    an untrusted class, a name edited to something that is not a class of that name (``os.system``), a member
    other than the format's two (a pickle planted in the archive) or another format version is refused with a
    :class:`ModelFileError` that says which, and nothing of it is imported or run.

    Parameters
    ----------
    path : str, path-like or binary file object
        A file written by :func:`save`.
    trusted : iterable of str or type, optional
        Classes to load beyond the allow-list, by their import path (``"mypackage.nets.MyNet"``, as the refusal
        message names them) or as the classes themselves.
    map_location : str or torch.device, optional
        The device every tensor is loaded onto. By default each goes to the device it was saved from when that
        device is present here, else to the CPU (a model fitted on CUDA loads on a CPU-only machine).

    Returns
    -------
    object
        The saved estimator, predicting bit for bit as the one saved (on the same device and torch build).

    Raises
    ------
    ModelFileError
        As described above.
    """
    trusted_names = _trusted_names(trusted)
    try:
        archive = zipfile.ZipFile(path, "r")
    except (zipfile.BadZipFile, OSError) as err:
        raise ModelFileError(f"{_describe(path)} is not a glas-sklearn model file (not a zip archive: {err}); "
                             "glas_sklearn.load reads files written by glas_sklearn.save. A pickle or joblib file "
                             "is loaded with pickle / joblib, which runs code: only from a source you trust.") from None
    with archive:
        schema = _read_schema(archive, path)
        classes = _resolve_classes(schema.get("classes"), trusted_names)
        data = archive.read(_DATA)
    reader = _Reader(classes, schema.get("storages"), data, map_location)
    try:
        return reader.decode(schema.get("root"))
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError,
            RecursionError) as err:
        raise ModelFileError(f"{_describe(path)} is damaged or was edited: its object graph does not decode "
                             f"({type(err).__name__}: {err}).") from None


def _describe(path) -> str:
    return repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else "The file"


def _trusted_names(trusted) -> frozenset[str]:
    if trusted is None:
        return frozenset()
    if isinstance(trusted, (str, type)):
        trusted = [trusted]
    names = set()
    for entry in trusted:
        if isinstance(entry, type):
            names.add(".".join(_class_path(entry)))
        elif isinstance(entry, str):
            names.add(entry)
        else:
            raise TypeError(f"trusted must be a list of class names (str) or classes, got an entry {entry!r}.")
    return frozenset(names)


def _read_schema(archive: zipfile.ZipFile, path) -> dict:
    members = archive.namelist()
    if sorted(members) != sorted([_SCHEMA, _DATA]):
        others = sorted(set(members) - {_SCHEMA, _DATA})
        detail = (f"holds members other than {_SCHEMA} and {_DATA}: {others}" if others
                  else f"holds the members {members}, not exactly {_SCHEMA} and {_DATA}")
        raise ModelFileError(f"{_describe(path)} is not a glas-sklearn model file as written by glas_sklearn.save: it "
                             f"{detail}. Nothing of it was read.")
    try:
        schema = json.loads(archive.read(_SCHEMA).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ModelFileError(f"{_describe(path)}: {_SCHEMA} is not valid JSON ({err}).") from None
    if not isinstance(schema, dict) or schema.get("format") != FORMAT:
        raise ModelFileError(f"{_describe(path)} is not a glas-sklearn model file ({_SCHEMA} names no format "
                             f"{FORMAT!r}).")
    version = schema.get("format_version")
    if version != FORMAT_VERSION:
        written = schema.get("written_by") if isinstance(schema.get("written_by"), dict) else {}
        raise ModelFileError(f"{_describe(path)} is in glas-sklearn model format version {version!r} (written by "
                             f"glas-sklearn {written.get('glas_sklearn', 'unknown')}); glas-sklearn {__version__} "
                             f"reads format version {FORMAT_VERSION} only. Load it with the version that wrote it, "
                             "or refit the estimator and save it again.")
    return schema


def _is_identifier_path(text) -> bool:
    """A dotted path of identifiers, none of them a dunder name (``glas_sklearn.__main__``, ``builtins.__import__``);
    the module ``__main__`` (a script's classes, trusted only by name) is checked apart."""
    return isinstance(text, str) and bool(text) and all(
        part.isidentifier() and not (part.startswith("__") and part.endswith("__")) for part in text.split("."))


def _trusted_by_default(module: str, name: str) -> bool:
    if f"{module}.{name}" in _TRUSTED_CLASSES:
        return True
    return any(module == package or module.startswith(package + ".") for package in _TRUSTED_PACKAGES)


def _import_attribute(module: str, name: str):
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _resolve_classes(entries, trusted: frozenset[str]) -> list[type]:
    """The file's class table checked (every name allow-listed or trusted: else refused, naming all, before any
    import), then imported; each must be a class whose own module and name are the ones recorded."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ModelFileError("The model file's class table is damaged (not a list of {module, name}).")
    paths = [(e.get("module"), e.get("name")) for e in entries]
    malformed = [f"{m}.{n}" for m, n in paths
                 if not ((m == "__main__" or _is_identifier_path(m)) and _is_identifier_path(n))]
    if malformed:
        raise ModelFileError(f"The model file names {malformed}, which are not class paths (a dunder name or not an "
                             "identifier): the file was edited. Nothing was imported.")
    untrusted = sorted({f"{m}.{n}" for m, n in paths if not _trusted_by_default(m, n) and f"{m}.{n}" not in trusted})
    if untrusted:
        raise ModelFileError(
            f"The model file holds objects of {', '.join(untrusted)}, which glas_sklearn.load does not trust by "
            f"default: making and using them runs that code. If you trust this file's source and these classes, "
            f"pass them: glas_sklearn.load(path, trusted={untrusted!r}). Nothing was imported.")
    classes = []
    for module, name in paths:
        try:
            cls = _import_attribute(module, name)
        except (ImportError, AttributeError) as err:
            raise ModelFileError(f"The model file names the class {module}.{name}, which cannot be imported here "
                                 f"({err}).") from None
        if not isinstance(cls, type) or _class_path(cls) != (module, name):
            raise ModelFileError(f"The model file names {module}.{name}, which is not a class defined under that name "
                                 f"(it is {type(cls).__name__} {getattr(cls, '__module__', '?')}."
                                 f"{getattr(cls, '__qualname__', '?')}): the file was edited. Nothing was made.")
        classes.append(cls)
    return classes


def _device_available(device: torch.device) -> bool:
    """Whether tensors can be made on ``device`` in this process."""
    if device.type == "cpu":
        return True
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError):
        return False
    return True


class _Reader:
    """JSON nodes → objects, the tensors' bytes taken from ``data``."""

    def __init__(self, classes: list[type], storages, data: bytes, map_location) -> None:
        self.classes = classes
        self.data = data
        self.target = None if map_location is None else torch.device(map_location)
        self._devices: dict[str, torch.device] = {}
        if not isinstance(storages, list):
            raise ModelFileError("The model file's storage table is damaged (not a list).")
        self.storages = storages
        self._storages: dict[int, torch.UntypedStorage] = {}
        self._refs: dict[int, Any] = {}

    # --------------------------------------------------------------- devices
    def device(self, recorded: str) -> torch.device:
        """Where things recorded on ``recorded`` go: ``map_location``, else the recorded device when present
        here, else the CPU."""
        if recorded not in self._devices:
            saved = torch.device(recorded)
            if self.target is not None:
                chosen = self.target
            elif _device_available(saved):
                chosen = saved
            else:
                chosen = torch.device("cpu")
                logger.info("The model was saved on %s, which is not available here; it is loaded on the CPU.",
                            saved)
            self._devices[recorded] = chosen
        return self._devices[recorded]

    # ------------------------------------------------------------------ data
    def _bytes(self, offset, nbytes) -> memoryview:
        if not (type(offset) is int and type(nbytes) is int and 0 <= offset and 0 <= nbytes
                and offset + nbytes <= len(self.data)):
            raise ModelFileError(f"The model file names bytes {offset!r}..+{nbytes!r} beyond its data "
                                 f"({len(self.data)} bytes): the file is damaged or was edited.")
        return memoryview(self.data)[offset:offset + nbytes]

    def _storage(self, index) -> torch.UntypedStorage:
        if type(index) is not int or not 0 <= index < len(self.storages):
            raise ModelFileError(f"The model file refers to storage {index!r}, which it does not hold.")
        if index not in self._storages:
            entry = self.storages[index]
            raw = self._bytes(entry["at"], entry["nbytes"])
            flat = (torch.frombuffer(bytearray(raw), dtype=torch.uint8) if len(raw)
                    else torch.empty(0, dtype=torch.uint8))
            self._storages[index] = flat.to(self.device(entry["device"])).untyped_storage()
        return self._storages[index]

    # ------------------------------------------------------------------ walk
    def decode(self, node):
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is list:  # written as {"@": "list"}; a bare JSON list is read as a list too
            return [self.decode(v) for v in node]
        if type(node) is not dict:
            raise ModelFileError(f"The model file holds a node {node!r} of no known form.")
        kind = node["@"]
        method = _DECODERS.get(kind)
        if method is None:
            raise ModelFileError(f"The model file holds a node of unknown kind {kind!r}: it was edited or written by "
                                 "another format version.")
        return method(self, node)

    def _keep(self, node, obj):
        """Remember ``obj`` as the target of later references to ``node``."""
        ref = node.get("#")
        if ref is not None:
            self._refs[ref] = obj
        return obj

    def _ref(self, node):
        if node["to"] not in self._refs:
            raise ModelFileError(f"The model file refers to object {node['to']!r} before defining it.")
        return self._refs[node["to"]]

    def _list(self, node):
        out = self._keep(node, [])
        out.extend(self.decode(v) for v in node["items"])
        return out

    def _dict(self, node):
        out = self._keep(node, {} if node["@"] == "dict" else OrderedDict())
        if "map" in node:
            for k, v in node["map"].items():
                out[k] = self.decode(v)
        else:
            for k, v in node["items"]:
                out[self.decode(k)] = self.decode(v)
        return out

    def _tuple(self, node):
        return tuple(self.decode(v) for v in node["items"])

    def _set(self, node):
        out = self._keep(node, set())
        out.update(self.decode(v) for v in node["items"])
        return out

    def _frozenset(self, node):
        return frozenset(self.decode(v) for v in node["items"])

    def _bytes_node(self, node):
        raw = base64.b64decode(node["b64"], validate=True)
        return raw if node["@"] == "bytes" else self._keep(node, bytearray(raw))

    def _complex(self, node):
        return complex(float(node["re"]), float(node["im"]))

    def _torch_dtype(self, node):
        return _torch_dtype(node["name"])

    def _torch_device(self, node):
        return self.device(str(node["name"]))

    def _torch_size(self, node):
        return torch.Size([int(v) for v in node["items"]])

    def _generator(self, node):
        device = self.device(str(node["device"]))
        generator = torch.Generator(device=device)
        state = self.decode(node["state"])
        if device == torch.device(node["device"]):
            generator.set_state(state.cpu())
        else:  # a CUDA generator's state does not fit a CPU one: the same seed, restarted
            generator.manual_seed(int(node["seed"]))
        return self._keep(node, generator)

    def _tensor(self, node):
        dtype = _torch_dtype(node["dtype"])
        storage = self._storage(node["storage"])
        shape = [int(v) for v in node["shape"]]
        stride = [int(v) for v in node["stride"]]
        offset = int(node["offset"])
        if len(shape) != len(stride) or min(shape + stride + [offset], default=0) < 0:
            raise ModelFileError(f"The model file holds a tensor of shape {shape} and stride {stride}: it is damaged.")
        itemsize = torch.empty(0, dtype=dtype).element_size()
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else offset - 1
        if (last + 1) * itemsize > storage.nbytes():
            raise ModelFileError(f"The model file holds a tensor reaching beyond its storage ({storage.nbytes()} "
                                 "bytes): it is damaged or was edited.")
        tensor = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, shape, stride)
        if node.get("parameter"):
            tensor = nn.Parameter(tensor, requires_grad=bool(node["requires_grad"]))
        elif node["requires_grad"]:
            tensor.requires_grad_(True)
        self._keep(node, tensor)
        if "attributes" in node:
            tensor.__dict__.update(self._state_dict(node["attributes"]))
        return tensor

    def _array(self, node):
        shape = tuple(int(v) for v in node["shape"])
        if node["dtype"] == "|O":
            out = np.empty(shape, dtype=object)
            self._keep(node, out)
            items = [self.decode(v) for v in node["items"]]
            if len(items) != out.size:
                raise ModelFileError(f"The model file holds an object array of shape {shape} with {len(items)} items.")
            out.reshape(-1)[:] = items if items else []
            return out
        dtype = np.dtype(node["dtype"])
        if dtype.hasobject or dtype.fields is not None:
            raise ModelFileError(f"The model file holds a data array of dtype {dtype}, which is not data.")
        raw = self._bytes(node["at"], node["nbytes"])
        fortran = node["order"] == "F"
        flat = np.frombuffer(raw, dtype=dtype).copy() if len(raw) else np.empty(0, dtype=dtype)
        out = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
        return self._keep(node, out)

    def _numpy_scalar(self, node):
        dtype = np.dtype(node["dtype"])
        if dtype.hasobject or dtype.fields is not None:
            raise ModelFileError(f"The model file holds a numpy scalar of dtype {dtype}, which is not data.")
        return np.frombuffer(bytes.fromhex(node["hex"]), dtype=dtype)[0]

    def _numpy_dtype(self, node):
        dtype = np.dtype(node["str"])
        if dtype.hasobject and node["str"] != "|O":
            raise ModelFileError(f"The model file names the numpy dtype {node['str']!r}, which is not data.")
        return dtype

    def _numpy_type(self, node):
        return self._numpy_dtype({"str": node["dtype"]}).type

    def _builtin_type(self, node):
        if node["name"] not in _BUILTIN_TYPES:
            raise ModelFileError(f"The model file names the builtin {node['name']!r}, which is not an allowed type.")
        return _BUILTIN_TYPES[node["name"]]

    def _class(self, index) -> type:
        if type(index) is not int or not 0 <= index < len(self.classes):
            raise ModelFileError(f"The model file refers to class {index!r}, which its class table does not hold.")
        return self.classes[index]

    def _type(self, node):
        return self._class(node["cls"])

    def _enum(self, node):
        cls = self._class(node["cls"])
        member = getattr(cls, "__members__", {}).get(node["name"]) if issubclass(cls, enum.Enum) else None
        if member is None:
            raise ModelFileError(f"The model file names {node['name']!r} of {cls.__qualname__}, which is no member.")
        return member

    def _namedtuple(self, node):
        cls = self._class(node["cls"])
        if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise ModelFileError(f"The model file stores {cls.__qualname__} as a named tuple, which it is not.")
        return tuple.__new__(cls, [self.decode(v) for v in node["items"]])

    def _state_dict(self, node) -> dict:
        state = self.decode(node)
        if type(state) is not dict or not all(type(k) is str for k in state):
            raise ModelFileError("The model file holds an object whose state is not a dict of names.")
        return state

    def _object(self, node):
        cls = self._class(node["cls"])
        if cls is np.random.RandomState:
            rng = self._keep(node, np.random.RandomState())
            rng.set_state(self.decode(node["rng_state"]))
            return rng
        if cls is np.random.Generator:
            bits = self._class(node["bit_generator"])
            if not (isinstance(bits, type) and issubclass(bits, np.random.BitGenerator)):
                raise ModelFileError(f"The model file names {bits.__qualname__} as a bit generator.")
            rng = self._keep(node, np.random.Generator(bits()))
            rng.bit_generator.state = self.decode(node["rng_state"])
            return rng
        if issubclass(cls, (type, enum.Enum, tuple, list, dict, set, frozenset, torch.Tensor, np.ndarray)) or (
                cls.__reduce_ex__ is not object.__reduce_ex__ or cls.__reduce__ is not object.__reduce__):
            raise ModelFileError(f"The model file stores {cls.__module__}.{cls.__qualname__} as a plain object, which "
                                 "it is not: the file was edited.")
        obj = self._keep(node, cls.__new__(cls))
        state = self.decode(node.get("state"))
        if isinstance(obj, BaseEstimator):  # as saved: the __dict__, no pickling hook of the estimator run
            if type(state) is not dict or not all(type(k) is str for k in state):
                raise ModelFileError(f"The model file holds a {cls.__qualname__} whose state is not a dict of names.")
            obj.__dict__.update(state)
        elif getattr(cls, "__setstate__", None) is not None:
            obj.__setstate__(state)
        else:
            _default_setstate(obj, state)
        return obj

    def _pandas_range_index(self, node):
        return pd.RangeIndex(int(node["start"]), int(node["stop"]), int(node["step"]), name=self.decode(node["name"]))

    def _column(self, node):
        values = self._array(node)
        name = node.get("pandas_dtype")
        if name is None:
            return values
        dtype = pd.api.types.pandas_dtype(str(name))
        if not isinstance(dtype, pd.StringDtype):
            raise ModelFileError(f"The model file names the pandas dtype {name!r}, which is not a string dtype.")
        return pd.array(values, dtype=dtype)

    def _pandas_index(self, node):
        return pd.Index(self._column(node["values"]), name=self.decode(node["name"]), copy=False)

    def _pandas_series(self, node):
        return self._keep(node, pd.Series(self._column(node["values"]), index=self.decode(node["index"]),
                                          name=self.decode(node["name"]), copy=False))

    def _pandas_frame(self, node):
        columns = self.decode(node["columns"])
        index = self.decode(node["index"])
        data = [self._column(column) for column in node["data"]]
        if len(data) != len(columns):
            raise ModelFileError("The model file holds a DataFrame whose columns and data differ in number.")
        frame = pd.DataFrame(dict(enumerate(data)), index=index, copy=False)
        frame.columns = columns
        frame.attrs.update(self._state_dict(node["attrs"]))
        return self._keep(node, frame)


def _torch_dtype(name) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ModelFileError(f"The model file names the torch dtype {name!r}, which is not one.")
    return dtype


def _default_setstate(obj, state) -> None:
    """What pickle does for a class without ``__setstate__``: a dict updates ``__dict__``; a (dict, slots) pair
    also sets the slots."""
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        obj.__dict__.update(state)
    if slots:
        for key, value in slots.items():
            setattr(obj, key, value)


_DECODERS = {
    "ref": _Reader._ref, "list": _Reader._list, "dict": _Reader._dict, "OrderedDict": _Reader._dict,
    "tuple": _Reader._tuple, "set": _Reader._set, "frozenset": _Reader._frozenset, "bytes": _Reader._bytes_node,
    "bytearray": _Reader._bytes_node, "complex": _Reader._complex, "tensor": _Reader._tensor,
    "torch.dtype": _Reader._torch_dtype, "torch.device": _Reader._torch_device, "torch.Size": _Reader._torch_size,
    "torch.Generator": _Reader._generator, "ndarray": _Reader._array, "numpy.scalar": _Reader._numpy_scalar,
    "numpy.dtype": _Reader._numpy_dtype, "numpy.type": _Reader._numpy_type, "builtin_type": _Reader._builtin_type,
    "type": _Reader._type, "enum": _Reader._enum, "namedtuple": _Reader._namedtuple, "object": _Reader._object,
    "pandas.RangeIndex": _Reader._pandas_range_index, "pandas.Index": _Reader._pandas_index,
    "pandas.Series": _Reader._pandas_series, "pandas.DataFrame": _Reader._pandas_frame,
}
