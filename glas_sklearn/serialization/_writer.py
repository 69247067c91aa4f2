"""The object graph → JSON nodes, with the bytes of every tensor storage and array gathered for ``data.bin``."""

from __future__ import annotations

import base64
import enum
import functools
import types
from collections import OrderedDict

import numpy as np
import pandas as pd
import torch
from torch import nn

from ._format import ALIGN, PICKLING_KEYS, VALUE_NODES, ModelFileError, class_path, dtype_name, state_is_dict
from ._trust import BUILTIN_TYPES, FUNCTION_TYPES, import_attribute

__all__ = ["Writer"]

_JSON_SCALARS = (type(None), bool, int, float, str)
#: Objects that are code, never stored.
_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.MethodWrapperType,
         types.WrapperDescriptorType, types.ModuleType, functools.partial, staticmethod, classmethod, property)


class Writer:
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
        pad = -self._size % ALIGN
        if pad:
            self.data.append(b"\0" * pad)
            self._size += pad
        offset = self._size
        view = memoryview(buffer).cast("B")
        self.data.append(view)
        self._size += view.nbytes
        return offset

    def _class(self, cls, where: str, kind: str = "class") -> int:
        """The index of ``cls`` (a class, or a function when ``kind="function"``) in the class table."""
        module, name = class_path(cls)
        if "<locals>" in name or "<lambda>" in name:
            way_out = (" (glas_sklearn.load then needs trusted=[its import path]), or, for arithmetic on arrays "
                       "such as a FunctionTransformer's or a TransformedTargetRegressor's func, use a numpy ufunc "
                       "(np.log1p / np.expm1), which is stored as data" if kind == "function" else "")
            raise ModelFileError(f"{where} is the {kind} {module}.{name}, defined inside a function (or a lambda): a "
                                 f"model file holds data, not code, and names a {kind} by its import path. Define it "
                                 f"at the top level of a module{way_out}.")
        key = (module, name)
        if key not in self._class_index:
            try:
                found = import_attribute(module, name)
            except (ImportError, AttributeError, TypeError):
                found = None
            if found is not cls:
                raise ModelFileError(f"{where} is the {kind} {module}.{name}, which cannot be imported under that "
                                     "name; define it at the top level of an importable module.")
            self._class_index[key] = len(self.classes)
            self.classes.append({"module": module, "name": name, **({"kind": kind} if kind != "class" else {})})
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
        if isinstance(node, dict) and node.get("@") not in VALUE_NODES:
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
        if t is slice:
            return {"@": "slice", "items": self._items((obj.start, obj.stop, obj.step), where)}
        if isinstance(obj, np.ufunc):  # by its name in numpy's namespace (np.log1p): arithmetic on arrays only
            if getattr(np, obj.__name__, None) is not obj:
                raise ModelFileError(f"{where} is the numpy ufunc {obj.__name__}, which is not numpy's own.")
            return {"@": "numpy.ufunc", "name": obj.__name__}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, where)
        if t is torch.dtype:
            return {"@": "torch.dtype", "name": dtype_name(obj)}
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
        if cls in BUILTIN_TYPES.values():
            return {"@": "builtin_type", "name": cls.__name__}
        if issubclass(cls, np.generic):
            return {"@": "numpy.type", "dtype": np.dtype(cls).str}
        return {"@": "type", "cls": self._class(cls, where)}

    def _object(self, obj, where: str) -> dict:
        t = type(obj)
        if isinstance(obj, FUNCTION_TYPES) and isinstance(getattr(obj, "__module__", None), str):
            return {"@": "function", "fn": self._class(obj, where, kind="function")}  # by its import path
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
        state = dict(vars(obj)) if state_is_dict(t) else obj.__getstate__()
        self._alive.append(state)
        held = state[0] if isinstance(state, tuple) and len(state) == 2 else state
        planted = sorted(PICKLING_KEYS.intersection(held)) if isinstance(held, dict) else []
        if planted:
            raise ModelFileError(f"{where} holds the attributes {planted}, which only the estimators' pickling hooks "
                                 "use (pickle bytes): a model file never stores them. Delete them from the object.")
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
        node = {"@": "tensor", "dtype": dtype_name(t.dtype), "storage": self._storage_index[key],
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
