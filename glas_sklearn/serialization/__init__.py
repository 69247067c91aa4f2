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
so that no pickling hook of theirs runs either; no object's state may hold the attributes those hooks interpret
(so nothing of a file is unpickled at a later deep copy, pickle or clone either).

Every damaged or edited file ends in :class:`ModelFileError` before any large allocation: the archive's checksums,
stored (never compressed) members whose declared sizes fit the file, a ``model.json`` no denser in objects than save
writes, arrays whose items match their shape, tensors whose strides do not overlap, storages and arrays tiling
``data.bin`` as save lays it out, and the state checked against what the estimators compute with
(``_consistency``). :func:`audit` and :func:`untrusted_names` list what a file would make before anything is
imported.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np
import torch

from .._version import __version__
from ._format import DATA_MEMBER, FORMAT, FORMAT_VERSION, MAX_SCHEMA_BYTES, SCHEMA_MEMBER, ModelFileError
from ._reader import Reader
from ._trust import describe_classes, resolve_classes, trusted_names
from ._writer import Writer

__all__ = ["FORMAT", "FORMAT_VERSION", "ModelFileError", "audit", "dumps_state", "load", "loads_state", "save",
           "untrusted_names"]

#: The fewest bytes of model.json per JSON object or list that save writes (``{"@":"list","items":[]}`` is 24 bytes
#: for two): a denser model.json, which would take a hundred times its size in memory to parse, is refused.
_BYTES_PER_CONTAINER = 8
#: A zip member's local header: signature, versions, flags, method, time, date, CRC, sizes, name and extra lengths.
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


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
    >>> reg = glas_sklearn.LaplaceActiveSubspaceRegressor(training=glas_sklearn.Training(max_epochs=2),
    ...                                                   n_components=2, random_state=0)
    >>> reg = reg.fit(X, y)
    >>> buffer = io.BytesIO(); glas_sklearn.save(reg, buffer); _ = buffer.seek(0)
    >>> bool(np.array_equal(glas_sklearn.load(buffer).predict(X), reg.predict(X)))
    True
    """
    writer = Writer()
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
        archive.writestr(SCHEMA_MEMBER, text)
        with archive.open(DATA_MEMBER, "w", force_zip64=True) as out:
            for chunk in data:
                out.write(chunk)


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
    trusted_classes = trusted_names(trusted)
    with contextlib.ExitStack() as stack:
        file = stack.enter_context(open(path, "rb")) if isinstance(path, (str, os.PathLike)) else path
        return _load_file(file, _describe(path), trusted_classes, map_location)


def audit(path: str | os.PathLike | BinaryIO) -> list[dict]:
    """The classes and functions a model file would make or use, read from its class table before anything is
    imported or built, each with whether :func:`load` trusts it by default.

    Parameters
    ----------
    path : str, path-like or binary file object
        A file written by :func:`save`.

    Returns
    -------
    list of dict
        One ``{"name": "module.QualName", "kind": "class" or "function", "trusted": bool}`` per entry, sorted by
        name. The names whose ``trusted`` is False are what ``load(path, trusted=[...])`` would have to name.

    Raises
    ------
    ModelFileError
        When the file is not a readable model file of this format version.

    Examples
    --------
    >>> import io, glas_sklearn
    >>> from sklearn.preprocessing import StandardScaler
    >>> buffer = io.BytesIO(); glas_sklearn.save(StandardScaler().fit([[0.0], [1.0]]), buffer); _ = buffer.seek(0)
    >>> glas_sklearn.serialization.audit(buffer)
    [{'name': 'sklearn.preprocessing._data.StandardScaler', 'kind': 'class', 'trusted': True}]
    """
    with contextlib.ExitStack() as stack:
        file = stack.enter_context(open(path, "rb")) if isinstance(path, (str, os.PathLike)) else path
        describe = _describe(path)
        archive, size = _open_archive(file, describe, stack)
        schema = _guarded(lambda: _read_schema(archive, describe, size), describe)
    return describe_classes(schema.get("classes"))


def untrusted_names(path: str | os.PathLike | BinaryIO) -> list[str]:
    """The names of the classes and functions in a model file that :func:`load` does not trust by default (what
    its ``trusted`` would have to list), read before anything is imported: ``[]`` for a file of glas-sklearn's
    estimators, scikit-learn's preprocessing and torch's layers. As skops' ``get_untrusted_types``."""
    return [entry["name"] for entry in audit(path) if not entry["trusted"]]


def dumps_state(obj: Any) -> bytes:
    """``obj`` as the bytes of a model file: how the estimators carry their torch state through pickle and deep
    copies without torch.save (nothing pickled is ever read back by :func:`loads_state`)."""
    buffer = io.BytesIO()
    save(obj, buffer)
    return buffer.getvalue()


def loads_state(blob: bytes) -> Any:
    """What :func:`dumps_state` wrote, read back with :func:`load`'s checks and without unpickling. The classes the
    blob names are trusted: a blob reaches here only through pickle (which trusts its source anyway), never from a
    model file (whose object states may not hold the pickling hooks' attributes)."""
    if not isinstance(blob, (bytes, bytearray)):
        raise ModelFileError(f"The pickled estimator state is {type(blob).__name__}, not the bytes of a model file.")
    return _load_file(io.BytesIO(blob), "The pickled estimator state", None, None)


def _load_file(file: BinaryIO, describe: str, trusted_classes: frozenset[str] | None, map_location) -> Any:
    """A model file read from ``file``: every class checked (``trusted_classes`` None trusts the file's own table,
    for :func:`loads_state`), the data read once, the object graph decoded; every failure a ModelFileError."""
    with contextlib.ExitStack() as stack:
        archive, size = _open_archive(file, describe, stack)
        schema = _guarded(lambda: _read_schema(archive, describe, size), describe)
        entries = schema.get("classes")
        if trusted_classes is None:
            trusted_classes = frozenset(e["name"] for e in describe_classes(entries))
        classes = resolve_classes(entries, trusted_classes)
        data = _guarded(lambda: _read_data(archive, file, describe, size), describe)
    reader = Reader(classes, schema.get("storages"), data, map_location)
    try:
        root = reader.decode(schema.get("root"))
        reader.check_layout()
        return root
    except ModelFileError:
        raise
    except MemoryError:
        raise ModelFileError(f"{describe} is damaged or was edited: its object graph declares more than this "
                             "machine's memory.") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError,
            RecursionError, LookupError) as err:
        raise ModelFileError(f"{describe} is damaged or was edited: its object graph does not decode "
                             f"({type(err).__name__}: {err}).") from None


#: What the zip and zlib modules raise on a damaged archive (a changed byte, a truncated file, a corrupt member).
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError,
                   ValueError, OverflowError, struct.error, UnicodeDecodeError, KeyError, MemoryError)


def _guarded(read, describe: str):
    """``read()``, a damaged archive's error raised as a ModelFileError naming it."""
    try:
        return read()
    except ModelFileError:
        raise
    except _ARCHIVE_ERRORS as err:
        raise ModelFileError(f"{describe} is damaged: its zip archive does not read ({type(err).__name__}: "
                             f"{err}).") from None


def _open_archive(file: BinaryIO, describe: str, stack: contextlib.ExitStack) -> tuple[zipfile.ZipFile, int]:
    """The zip archive of ``file`` and the file's size in bytes (what every declared size is checked against)."""
    try:
        start = file.tell()
        size = file.seek(0, os.SEEK_END) - start
        file.seek(start)
    except (OSError, AttributeError, ValueError):
        size = None
    try:
        archive = stack.enter_context(zipfile.ZipFile(file, "r"))
    except zipfile.BadZipFile as err:
        raise ModelFileError(f"{describe} is not a glas-sklearn model file (not a zip archive: {err}); "
                             "glas_sklearn.load reads files written by glas_sklearn.save. A pickle or joblib "
                             "file is loaded with pickle / joblib, which runs code: only from a source you "
                             "trust.") from None
    except _ARCHIVE_ERRORS as err:
        raise ModelFileError(f"{describe} is damaged: its zip directory does not read ({type(err).__name__}: "
                             f"{err}).") from None
    return archive, size


def _check_member(info: zipfile.ZipInfo, describe: str, size: int | None, limit: int | None = None) -> None:
    """A member as glas_sklearn.save writes it: stored (never compressed, so nothing inflates), its declared size
    within the file (and ``limit``)."""
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise ModelFileError(f"{describe}: {info.filename} is compressed, which glas_sklearn.save never does: the "
                             "file was rewritten by another tool (unzip it and save the estimator again).")
    if size is not None and not 0 <= info.header_offset + info.file_size <= size:
        raise ModelFileError(f"{describe} is damaged or was edited: {info.filename} declares {info.file_size} bytes "
                             f"at offset {info.header_offset}, beyond the file's {size} bytes.")
    if limit is not None and info.file_size > limit:
        raise ModelFileError(f"{describe}: {info.filename} declares {info.file_size} bytes, more than the "
                             f"{limit} an object graph written by glas_sklearn.save holds: refused unread.")


def _read_data(archive: zipfile.ZipFile, file: BinaryIO, describe: str, size: int | None) -> np.ndarray:
    """data.bin's bytes read once, straight from the file, into the buffer that the tensors and arrays then view
    (no copy per tensor), its CRC checked."""
    info = archive.getinfo(DATA_MEMBER)
    _check_member(info, describe, size)
    file.seek(info.header_offset)
    header = file.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise ModelFileError(f"{describe} is damaged: the zip header of {DATA_MEMBER} is missing.")
    name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
    file.seek(info.header_offset + _LOCAL_HEADER.size + name_length + extra_length)
    data = np.empty(info.file_size, dtype=np.uint8)  # one buffer, filled once (not zeroed first)
    if hasattr(file, "readinto"):
        n_read = file.readinto(memoryview(data))
    else:
        chunk = file.read(info.file_size)
        n_read = len(chunk)
        data[:n_read] = np.frombuffer(chunk, dtype=np.uint8)
    if n_read != info.file_size or zlib.crc32(data) != info.CRC:
        raise ModelFileError(f"{describe} is damaged: {DATA_MEMBER} is truncated or its bytes do not match "
                             "their checksum.")
    return data


def _describe(path) -> str:
    return repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else "The file"


def _read_schema(archive: zipfile.ZipFile, describe: str, size: int | None = None) -> dict:
    members = archive.namelist()
    if sorted(members) != sorted([SCHEMA_MEMBER, DATA_MEMBER]):
        others = sorted(set(members) - {SCHEMA_MEMBER, DATA_MEMBER})
        detail = (f"holds members other than {SCHEMA_MEMBER} and {DATA_MEMBER}: {others}" if others
                  else f"holds the members {members}, not exactly {SCHEMA_MEMBER} and {DATA_MEMBER}")
        raise ModelFileError(f"{describe} is not a glas-sklearn model file as written by glas_sklearn.save: it "
                             f"{detail}. Nothing of it was read.")
    info = archive.getinfo(SCHEMA_MEMBER)
    _check_member(info, describe, size, MAX_SCHEMA_BYTES)
    with archive.open(info) as member:
        text = member.read(info.file_size + 1)  # bounded whatever the archive claims
    if len(text) != info.file_size:
        raise ModelFileError(f"{describe} is damaged: {SCHEMA_MEMBER} holds {len(text)} bytes, not the "
                             f"{info.file_size} its zip entry declares.")
    containers = text.count(b"{") + text.count(b"[")
    if containers * _BYTES_PER_CONTAINER > len(text):  # what json.loads would make: ~100 bytes of memory each
        raise ModelFileError(f"{describe}: {SCHEMA_MEMBER} holds {containers} JSON objects and lists in "
                             f"{len(text)} bytes, denser than any object graph glas_sklearn.save writes (a node "
                             f"takes at least {_BYTES_PER_CONTAINER} bytes): refused before parsing.")
    try:
        schema = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ModelFileError(f"{describe}: {SCHEMA_MEMBER} is not valid JSON ({err}).") from None
    if not isinstance(schema, dict) or schema.get("format") != FORMAT:
        raise ModelFileError(f"{describe} is not a glas-sklearn model file ({SCHEMA_MEMBER} names no format "
                             f"{FORMAT!r}).")
    version = schema.get("format_version")
    if version != FORMAT_VERSION:
        written = schema.get("written_by") if isinstance(schema.get("written_by"), dict) else {}
        raise ModelFileError(f"{describe} is in glas-sklearn model format version {version!r} (written by "
                             f"glas-sklearn {written.get('glas_sklearn', 'unknown')}); glas-sklearn {__version__} "
                             f"reads format version {FORMAT_VERSION} only. Load it with the version that wrote it, "
                             "or refit the estimator and save it again.")
    return schema
