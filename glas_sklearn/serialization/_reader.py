"""JSON nodes → objects: only the classes of the checked class table are made (``cls.__new__`` and their state),
the tensors' bytes are taken from ``data.bin`` onto the device chosen for them."""

from __future__ import annotations

import base64
import enum
import functools
import logging
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from ._consistency import check_state, check_tensor_layout
from ._format import ALIGN, PICKLING_KEYS, ModelFileError, state_is_dict, torch_dtype
from ._trust import BUILTIN_TYPES, FUNCTION_TYPES

__all__ = ["Reader", "device_available"]

logger = logging.getLogger(__name__)


def device_available(device: torch.device) -> bool:
    """Whether tensors can be made on ``device`` in this process."""
    if device.type == "cpu":
        return True
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError):
        return False
    return True


class Reader:
    """JSON nodes → objects, the tensors' bytes taken from ``data``."""

    def __init__(self, classes: list[type], storages, data: np.ndarray, map_location) -> None:
        self.classes = classes
        self.data = data
        self.target = None if map_location is None else torch.device(map_location)
        self._devices: dict[str, torch.device] = {}
        if not isinstance(storages, list):
            raise ModelFileError("The model file's storage table is damaged (not a list).")
        self.storages = storages
        self._storages: dict[int, torch.UntypedStorage] = {}
        self._refs: dict[int, Any] = {}
        self._spans: dict[int, int] = {}  # offset → bytes of every storage and array read from data.bin

    # --------------------------------------------------------------- devices
    def device(self, recorded: str) -> torch.device:
        """Where things recorded on ``recorded`` go: ``map_location``, else the recorded device when present
        here, else the CPU."""
        if recorded not in self._devices:
            saved = torch.device(recorded)
            if self.target is not None:
                chosen = self.target
            elif device_available(saved):
                chosen = saved
            else:
                chosen = torch.device("cpu")
                logger.info("The model was saved on %s, which is not available here; it is loaded on the CPU.",
                            saved)
            self._devices[recorded] = chosen
        return self._devices[recorded]

    # ------------------------------------------------------------------ data
    def _check_span(self, offset, nbytes) -> None:
        if not (type(offset) is int and type(nbytes) is int and 0 <= offset and 0 <= nbytes
                and offset + nbytes <= len(self.data)):
            raise ModelFileError(f"The model file names bytes {offset!r}..+{nbytes!r} beyond its data "
                                 f"({len(self.data)} bytes): the file is damaged or was edited.")

    def _storage(self, index) -> torch.UntypedStorage:
        if type(index) is not int or not 0 <= index < len(self.storages):
            raise ModelFileError(f"The model file refers to storage {index!r}, which it does not hold.")
        if index not in self._storages:
            entry = self.storages[index]
            offset, nbytes = entry["at"], entry["nbytes"]
            self._check_span(offset, nbytes)
            if nbytes:
                if offset in self._spans:
                    raise ModelFileError(f"The model file places two storages at byte {offset} of its data: it was "
                                         "edited.")
                self._spans[offset] = nbytes
            flat = torch.from_numpy(self.data[offset:offset + nbytes])  # a view of the file's buffer: no copy
            self._storages[index] = flat.to(self.device(entry["device"])).untyped_storage()
        return self._storages[index]

    def check_layout(self) -> None:
        """After the walk: the storages and arrays read tile data.bin as save lays them out (each at an aligned
        offset, none overlapping another, nothing but padding between them), so that no offset or size edited to
        point at other bytes goes unnoticed."""
        for index in range(len(self.storages)):
            self._storage(index)
        end = 0
        for offset in sorted(self._spans):
            if offset % ALIGN or offset < end or offset - end >= ALIGN:
                raise ModelFileError(f"The model file's arrays and tensors do not tile its data as glas_sklearn.save "
                                     f"writes it (one starts at byte {offset}, after one ending at byte {end}): the "
                                     "file was edited.")
            end = offset + self._spans[offset]
        if len(self.data) - end >= ALIGN:
            raise ModelFileError(f"The model file's data holds {len(self.data) - end} bytes that no array or tensor "
                                 "uses: the file was edited.")

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

    def _slice(self, node):
        start, stop, step = (self.decode(v) for v in node["items"])
        if not all(v is None or type(v) is int for v in (start, stop, step)):
            raise ModelFileError(f"The model file holds a slice of {start!r}, {stop!r}, {step!r}: not integers.")
        return slice(start, stop, step)

    def _ufunc(self, node):
        ufunc = getattr(np, str(node["name"]), None) if str(node["name"]).isidentifier() else None
        if not isinstance(ufunc, np.ufunc):
            raise ModelFileError(f"The model file names the numpy ufunc {node['name']!r}, which is not one.")
        return ufunc

    def _torch_dtype(self, node):
        return torch_dtype(node["name"])

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
        dtype = torch_dtype(node["dtype"])
        storage = self._storage(node["storage"])
        shape = [int(v) for v in node["shape"]]
        stride = [int(v) for v in node["stride"]]
        offset = int(node["offset"])
        if len(shape) != len(stride) or min(shape + stride + [offset], default=0) < 0:
            raise ModelFileError(f"The model file holds a tensor of shape {shape} and stride {stride}: it is damaged.")
        check_tensor_layout(shape, stride)
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
        if any(n < 0 for n in shape):
            raise ModelFileError(f"The model file holds an array of shape {shape}: it is damaged or was edited.")
        if node["dtype"] == "|O":
            if type(node["items"]) is not list or len(node["items"]) != math.prod(shape):
                raise ModelFileError(f"The model file holds an object array of shape {shape} with "
                                     f"{len(node['items']) if type(node['items']) is list else 'no'} items: it is "
                                     "damaged or was edited.")  # checked before the array is made
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
        offset, nbytes = node["at"], node["nbytes"]
        self._check_span(offset, nbytes)
        if nbytes != math.prod(shape) * dtype.itemsize:
            raise ModelFileError(f"The model file holds an array of shape {shape} and dtype {dtype} in {nbytes!r} "
                                 "bytes: it is damaged or was edited.")
        if nbytes:
            if offset in self._spans:
                raise ModelFileError(f"The model file places two arrays at byte {offset} of its data: it was edited.")
            self._spans[offset] = nbytes
        flat = self.data[offset:offset + nbytes].view(dtype)  # a view of the file's buffer: no copy
        if node["order"] not in ("C", "F"):
            raise ModelFileError(f"The model file holds an array of memory order {node['order']!r}, not 'C' or 'F'.")
        out = flat.reshape(shape[::-1]).T if node["order"] == "F" else flat.reshape(shape)
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
        if node["name"] not in BUILTIN_TYPES:
            raise ModelFileError(f"The model file names the builtin {node['name']!r}, which is not an allowed type.")
        return BUILTIN_TYPES[node["name"]]

    def _entry(self, index):
        if type(index) is not int or not 0 <= index < len(self.classes):
            raise ModelFileError(f"The model file refers to class {index!r}, which its class table does not hold.")
        return self.classes[index]

    def _class(self, index) -> type:
        cls = self._entry(index)
        if not isinstance(cls, type):
            raise ModelFileError(f"The model file uses the function {cls.__qualname__} as a class: it was edited.")
        return cls

    def _function(self, node):
        function = self._entry(node["fn"])
        if not isinstance(function, FUNCTION_TYPES):
            raise ModelFileError(f"The model file uses the class {function.__qualname__} as a function: it was "
                                 "edited.")
        return function

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
        obj = self._keep(node, cls.__new__(cls))  # as pickle makes objects: no __init__
        state = self.decode(node.get("state"))
        held = state[0] if isinstance(state, tuple) and len(state) == 2 else state
        planted = sorted(PICKLING_KEYS.intersection(held)) if isinstance(held, dict) else []
        if planted:  # what a pickling hook would interpret (bytes to unpickle): never an attribute a save writes
            raise ModelFileError(f"The model file gives a {cls.__module__}.{cls.__qualname__} the attributes "
                                 f"{planted}, which only the estimators' pickling hooks use and glas_sklearn.save "
                                 "never writes: the file was edited to carry bytes that a later copy, pickle or "
                                 "clone would unpickle. Nothing was made.")
        check_state(cls, state)
        if state_is_dict(cls):  # an estimator: its __dict__, none of its pickling hooks run
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
        return pd.array(values, dtype=_string_dtype(str(name)))

    def _pandas_index(self, node):
        return self._keep(node, pd.Index(self._column(node["values"]), name=self.decode(node["name"]), copy=False))

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


@functools.lru_cache(maxsize=8)
def _string_dtype(name: str) -> pd.StringDtype:
    """The pandas string dtype ``name`` names (``"str"``, ``"string"``); any other dtype is refused."""
    dtype = pd.api.types.pandas_dtype(name)
    if not isinstance(dtype, pd.StringDtype):
        raise ModelFileError(f"The model file names the pandas dtype {name!r}, which is not a string dtype.")
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
    "ref": Reader._ref, "list": Reader._list, "dict": Reader._dict, "OrderedDict": Reader._dict,
    "tuple": Reader._tuple, "set": Reader._set, "frozenset": Reader._frozenset, "bytes": Reader._bytes_node,
    "bytearray": Reader._bytes_node, "complex": Reader._complex, "slice": Reader._slice, "numpy.ufunc": Reader._ufunc,
    "tensor": Reader._tensor,
    "torch.dtype": Reader._torch_dtype, "torch.device": Reader._torch_device, "torch.Size": Reader._torch_size,
    "torch.Generator": Reader._generator, "ndarray": Reader._array, "numpy.scalar": Reader._numpy_scalar,
    "numpy.dtype": Reader._numpy_dtype, "numpy.type": Reader._numpy_type, "builtin_type": Reader._builtin_type,
    "type": Reader._type, "function": Reader._function, "enum": Reader._enum, "namedtuple": Reader._namedtuple,
    "object": Reader._object,
    "pandas.RangeIndex": Reader._pandas_range_index, "pandas.Index": Reader._pandas_index,
    "pandas.Series": Reader._pandas_series, "pandas.DataFrame": Reader._pandas_frame,
}
