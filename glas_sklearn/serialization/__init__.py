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

import contextlib
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
from ._format import DATA_MEMBER, FORMAT, FORMAT_VERSION, SCHEMA_MEMBER, ModelFileError
from ._reader import Reader
from ._trust import resolve_classes, trusted_names
from ._writer import Writer

__all__ = ["FORMAT", "FORMAT_VERSION", "ModelFileError", "load", "save"]

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
        try:
            archive = stack.enter_context(zipfile.ZipFile(file, "r"))
        except zipfile.BadZipFile as err:
            raise ModelFileError(f"{_describe(path)} is not a glas-sklearn model file (not a zip archive: {err}); "
                                 "glas_sklearn.load reads files written by glas_sklearn.save. A pickle or joblib "
                                 "file is loaded with pickle / joblib, which runs code: only from a source you "
                                 "trust.") from None
        schema = _read_schema(archive, path)
        classes = resolve_classes(schema.get("classes"), trusted_classes)
        data = _read_data(archive, file, path)
    reader = Reader(classes, schema.get("storages"), data, map_location)
    try:
        return reader.decode(schema.get("root"))
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError,
            RecursionError) as err:
        raise ModelFileError(f"{_describe(path)} is damaged or was edited: its object graph does not decode "
                             f"({type(err).__name__}: {err}).") from None


def _read_data(archive: zipfile.ZipFile, file: BinaryIO, path) -> np.ndarray:
    """data.bin's bytes read once, straight from the file, into the buffer that the tensors and arrays then view
    (no copy per tensor), its CRC checked."""
    info = archive.getinfo(DATA_MEMBER)
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise ModelFileError(f"{_describe(path)}: {DATA_MEMBER} is compressed, which glas_sklearn.save never does: "
                             "the file was rewritten by another tool.")
    file.seek(info.header_offset)
    header = file.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise ModelFileError(f"{_describe(path)} is damaged: the zip header of {DATA_MEMBER} is missing.")
    name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
    file.seek(info.header_offset + _LOCAL_HEADER.size + name_length + extra_length)
    data = np.empty(info.file_size, dtype=np.uint8)  # one buffer, filled once (not zeroed first)
    if hasattr(file, "readinto"):
        n_read = file.readinto(memoryview(data))
    else:
        chunk = file.read(info.file_size)
        n_read = len(chunk)
        data[:n_read] = chunk
    if n_read != info.file_size or zlib.crc32(data) != info.CRC:
        raise ModelFileError(f"{_describe(path)} is damaged: {DATA_MEMBER} is truncated or its bytes do not match "
                             "their checksum.")
    return data


def _describe(path) -> str:
    return repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else "The file"


def _read_schema(archive: zipfile.ZipFile, path) -> dict:
    members = archive.namelist()
    if sorted(members) != sorted([SCHEMA_MEMBER, DATA_MEMBER]):
        others = sorted(set(members) - {SCHEMA_MEMBER, DATA_MEMBER})
        detail = (f"holds members other than {SCHEMA_MEMBER} and {DATA_MEMBER}: {others}" if others
                  else f"holds the members {members}, not exactly {SCHEMA_MEMBER} and {DATA_MEMBER}")
        raise ModelFileError(f"{_describe(path)} is not a glas-sklearn model file as written by glas_sklearn.save: it "
                             f"{detail}. Nothing of it was read.")
    try:
        schema = json.loads(archive.read(SCHEMA_MEMBER).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ModelFileError(f"{_describe(path)}: {SCHEMA_MEMBER} is not valid JSON ({err}).") from None
    if not isinstance(schema, dict) or schema.get("format") != FORMAT:
        raise ModelFileError(f"{_describe(path)} is not a glas-sklearn model file ({SCHEMA_MEMBER} names no format "
                             f"{FORMAT!r}).")
    version = schema.get("format_version")
    if version != FORMAT_VERSION:
        written = schema.get("written_by") if isinstance(schema.get("written_by"), dict) else {}
        raise ModelFileError(f"{_describe(path)} is in glas-sklearn model format version {version!r} (written by "
                             f"glas-sklearn {written.get('glas_sklearn', 'unknown')}); glas-sklearn {__version__} "
                             f"reads format version {FORMAT_VERSION} only. Load it with the version that wrote it, "
                             "or refit the estimator and save it again.")
    return schema
