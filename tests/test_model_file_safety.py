"""Model files over the whole lifetime of a loaded model (issue 61): nothing read from a file is ever unpickled, at
load or at any later use (deep copy, pickle, ``sklearn.base.clone``, cross-validation, grid search); every damaged
or hostile file ends in a ModelFileError naming what is wrong, before any large allocation; a file mutated at
random (byte-wise, structurally) is refused or loads as the model saved.

Planted payloads write a marker file when unpickled; each test asserts the marker never appears.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import pickle
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, cross_val_score

import glas_sklearn
from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.serialization import ModelFileError, audit, untrusted_names
from tests.reference import grouped
from tests.test_serialization import _Payload, _read, _write, no_unpickling, safe_load

TINY = dict(module_kwargs=dict(hidden_layer_sizes=(4,)), max_epochs=3, lr=0.05, batch_size=None, n_samples=20,
            max_components=2, random_state=0)
pytestmark = [pytest.mark.filterwarnings("ignore::glas_sklearn.calibration.CalibrationWarning"),
              pytest.mark.filterwarnings("ignore::glas_sklearn.calibration.ConformalWarning")]


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 2))
    return X, np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(n)


@pytest.fixture(scope="module")
def fitted():
    X, y = _data()
    return LaplaceActiveSubspaceRegressor(**grouped(**TINY)).fit(X, y), X, y


@pytest.fixture(scope="module")
def saved_bytes(fitted):
    buffer = io.BytesIO()
    glas_sklearn.save(fitted[0], buffer)
    return buffer.getvalue()


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "payload-ran"
    yield path
    assert not path.exists(), "a planted payload ran"


def _torch_payload(path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"posterior_": _Payload(path)}, buffer)
    return buffer.getvalue()


def _outputs(est, X):
    return [est.predict(X), *est.predict_interval(X, [0.5, 0.9])]


def _same_outputs(a, b, X):
    return all(np.array_equal(u, v) for u, v in zip(_outputs(a, X), _outputs(b, X), strict=True))


@pytest.fixture
def refuse_torch_load(monkeypatch):
    """torch.load (every path to it) raises: what a later use of a loaded model must never call."""
    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called on bytes of a loaded model")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(torch.serialization, "load", refuse)


# ------------------------------------------------------------------ the whole lifetime of a loaded model (priority 1)
def test_the_issue_sketch_runs_nothing_at_save_load_or_any_later_use(fitted, marker, tmp_path, refuse_torch_load):
    """The sketch of issue 61: an inner estimator given the pickling hooks' attributes (torch.save bytes whose
    unpickling writes the marker). Saving it is refused; a file edited to hold it is refused at load; and the live
    object itself is deep-copied, pickled, cloned and grid-searched without its planted bytes ever being read."""
    reg, X, y = fitted
    inner = LaplaceActiveSubspaceRegressor()
    inner.__dict__.update(_glas_pickle=reg.__getstate__()["_glas_pickle"], _torch_state=_torch_payload(marker),
                          _glas_state=_torch_payload(marker))
    holder = copy.deepcopy(reg)
    holder.notes_ = inner
    with pytest.raises(ModelFileError, match=r"notes_ holds the attributes \['_glas_pickle', '_glas_state', "
                                             r"'_torch_state'\].*never stores"):
        glas_sklearn.save(holder, tmp_path / "evil.glas")

    # the same object graph written into a clean file by hand, in both pickle formats' keys
    buffer = io.BytesIO()
    glas_sklearn.save(reg, buffer)
    for key in ("_torch_state", "_glas_state", "_torch_device"):
        schema, data = _read(io.BytesIO(buffer.getvalue()))
        schema["classes"].append({"module": LaplaceActiveSubspaceRegressor.__module__,
                                  "name": LaplaceActiveSubspaceRegressor.__qualname__})
        planted = {key: {"@": "bytes", "b64": base64.b64encode(_torch_payload(marker)).decode()}}
        schema["root"]["state"]["map"]["notes_"] = {"@": "object", "cls": len(schema["classes"]) - 1,
                                                    "state": {"@": "dict", "map": planted}}
        _write(tmp_path / "evil.glas", schema, data)
        with pytest.raises(ModelFileError, match=rf"attributes \['{key}'\].*never writes.*Nothing was made"):
            safe_load(tmp_path / "evil.glas")

    # the live object (planted without any file): every later use drops the planted bytes unread
    copied = copy.deepcopy(holder)
    assert not {"_torch_state", "_glas_state"} & set(vars(copied.notes_))
    again = pickle.loads(pickle.dumps(holder))
    assert _same_outputs(again, reg, X) and not {"_torch_state", "_glas_state"} & set(vars(again.notes_))
    clone(holder)
    GridSearchCV(holder, {"noise_std": ["auto"]}, cv=2).fit(X, y)


def test_a_loaded_model_is_copied_cloned_searched_and_pickled_without_unpickling(saved_bytes, fitted,
                                                                                refuse_torch_load):
    """A loaded model deep-copied, cloned, cross-validated and grid-searched with every way to unpickle refused;
    pickled and unpickled with the one outer pickle.loads as the only unpickling (its torch state comes back
    through the model format, not torch.load)."""
    reg, X, y = fitted
    loaded = safe_load(io.BytesIO(saved_bytes))
    with no_unpickling():
        assert _same_outputs(copy.deepcopy(loaded), reg, X)
        assert clone(loaded).get_params().keys() == reg.get_params().keys()
        cross_val_score(loaded, X, y, cv=2)
        GridSearchCV(loaded, {"noise_std": ["auto"]}, cv=2).fit(X, y)
    calls = []
    real_loads = pickle.loads

    def counting_loads(*args, **kwargs):
        calls.append(1)
        return real_loads(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pickle, "loads", counting_loads)
        again = pickle.loads(pickle.dumps(loaded))
    assert len(calls) == 1 and _same_outputs(again, reg, X)
    state = loaded.__getstate__()
    assert "_torch_state" not in state and state["_glas_state"][:2] == b"PK"  # a model file's bytes
    assert state["_glas_pickle"] == (glas_sklearn.__version__, 3)


def test_a_pickle_of_the_former_format_is_refused_unread(fitted, marker):
    """A state of pickle format 2 (torch.save bytes) is refused by its stamp; bytes under its keys in a state of
    this format are dropped unread: the payload never runs."""
    reg, X, _ = fitted
    state = reg.__getstate__()
    old = {**state, "_glas_pickle": (glas_sklearn.__version__, 2), "_torch_state": _torch_payload(marker)}
    with pytest.raises(ValueError, match=r"pickle format 2.*Refit"):
        LaplaceActiveSubspaceRegressor.__new__(LaplaceActiveSubspaceRegressor).__setstate__(old)
    planted = {**state, "_torch_state": _torch_payload(marker), "_torch_device": "cpu"}
    target = LaplaceActiveSubspaceRegressor.__new__(LaplaceActiveSubspaceRegressor)
    target.__setstate__(planted)
    assert _same_outputs(target, reg, X) and "_torch_state" not in vars(target)


def test_audit_lists_the_classes_before_anything_is_imported(saved_bytes, tmp_path):
    """audit names every class and function of a file and whether it is trusted, without importing any (a file
    naming a module that does not exist is audited all the same); untrusted_names lists what load would refuse."""
    entries = audit(io.BytesIO(saved_bytes))
    assert all(entry["trusted"] for entry in entries)
    assert "glas_sklearn.estimators.regressor.LaplaceActiveSubspaceRegressor" in {e["name"] for e in entries}
    assert untrusted_names(io.BytesIO(saved_bytes)) == []
    schema, data = _read(io.BytesIO(saved_bytes))
    schema["classes"].append({"module": "no_such_package.evil", "name": "Payload"})
    _write(tmp_path / "named.glas", schema, data)
    assert untrusted_names(tmp_path / "named.glas") == ["no_such_package.evil.Payload"]


# ------------------------------------------------------------------------- damaged and hostile files (priority 2)
def _edit_json(raw: bytes, edit) -> bytes:
    schema, data = _read(io.BytesIO(raw))
    edit(schema)
    out = io.BytesIO()
    _write(out, schema, data)
    return out.getvalue()


def _nodes(node, kind):
    """Every JSON node of kind ``kind`` ("tensor", "ndarray", ...) under ``node``."""
    if isinstance(node, dict):
        if node.get("@") == kind:
            yield node
        for child in node.values():
            yield from _nodes(child, kind)
    elif isinstance(node, list):
        for child in node:
            yield from _nodes(child, kind)


def _tensor_at(schema, path):
    """The tensor node at the attribute path (names of object states) from the root."""
    node = schema["root"]
    for name in path:
        node = node["state"]["map"][name]
    return node


THETA0 = ("posterior_", "functional_model", "theta0")
EIGENVECTORS = ("posterior_", "eigenvectors")


def _set(path, **values):
    def edit(schema):
        _tensor_at(schema, path).update(values)
    return edit


def _storage_nbytes(schema):
    schema["storages"][0]["nbytes"] = 2**40


def _object_array(shape):
    def edit(schema):
        schema["root"]["state"]["map"]["huge_"] = {"@": "ndarray", "dtype": "|O", "shape": shape, "items": [1, 2]}
    return edit


def _data_array(shape):
    def edit(schema):
        schema["root"]["state"]["map"]["huge_"] = {"@": "ndarray", "dtype": "<f8", "shape": shape, "order": "C",
                                                   "at": 0, "nbytes": 8 * int(np.prod(shape, dtype=object))}
    return edit


def _with_theta0(edit):
    def apply(schema):
        edit(_tensor_at(schema, THETA0))
    return apply


HOSTILE_JSON = {
    "theta0 dtype edited": (_set(THETA0, dtype="int32"), "θ0 is torch.int32"),
    "theta0 dtype edited to float64": (_set(THETA0, dtype="float64"), "beyond its storage|θ0 has shape"),
    "theta0 shape edited": (_with_theta0(lambda t: t.update(shape=[t["shape"][0] - 1])), "θ0 has shape"),
    "theta0 stride edited": (_with_theta0(lambda t: t.update(shape=[t["shape"][0] // 2], stride=[2])),
                             "θ0 has shape"),
    "theta0 stride 0": (_set(THETA0, stride=[0]), "overlap in storage"),
    "eigenvectors transposed": (lambda s: _tensor_at(s, EIGENVECTORS).update(
        shape=_tensor_at(s, EIGENVECTORS)["shape"][::-1], stride=_tensor_at(s, EIGENVECTORS)["stride"][::-1]),
        "eigenvectors have shape"),
    "eigenvectors dtype edited": (_set(EIGENVECTORS, dtype="int32"), "eigenpairs are"),
    "eigenvectors strides overlap": (lambda s: _tensor_at(s, EIGENVECTORS).update(stride=[1, 1]),
                                     "overlap in storage"),
    "a storage of 2**40 bytes": (_storage_nbytes, "beyond its data"),
    "an object array of shape [10**12]": (_object_array([10**12]), r"shape \(1000000000000,\) with 2 items"),
    "3e8 objects declared": (_object_array([300_000_000]), "with 2 items"),
    "a data array of 2**40 bytes": (_data_array([2**37]), "beyond its data"),
    "a negative shape": (_data_array([-1]), "damaged"),
    "3e5 empty JSON objects": (lambda s: s["root"]["state"]["map"].update(junk_=[{}] * 300_000), "denser than"),
}


@pytest.mark.parametrize("case", list(HOSTILE_JSON))
def test_an_edited_object_graph_is_refused_naming_what_does_not_fit(saved_bytes, case):
    """Tensors and arrays edited in model.json (its checksum recomputed): each refused with a ModelFileError that
    names the mismatch, before anything large is allocated (peak traced memory under 8 MiB)."""
    edit, message = HOSTILE_JSON[case]
    raw = _edit_json(saved_bytes, edit)
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match=message):
            safe_load(io.BytesIO(raw))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20 + 20 * len(raw), peak


def _member_offset(raw: bytes, name: str) -> tuple[int, int]:
    """(offset of the member's data in the archive, the offset of its central directory entry)."""
    info = zipfile.ZipFile(io.BytesIO(raw)).getinfo(name)
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    central = raw.index(b"PK\x01\x02")
    while raw[central + 46:central + 46 + len(name)] != name.encode():
        central = raw.index(b"PK\x01\x02", central + 1)
    return info.header_offset + 30 + name_len + extra_len, central


def _flip_json_byte(raw):
    start, _ = _member_offset(raw, "model.json")
    out = bytearray(raw)
    out[start + 10] ^= 0x20
    return bytes(out)


def _declare_size(name, size):
    def edit(raw):
        _, central = _member_offset(raw, name)
        out = bytearray(raw)
        struct.pack_into("<II", out, central + 20, size, size)  # compressed and uncompressed size
        return bytes(out)
    return edit


def _compressed_json(raw):
    schema, data = _read(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("model.json", json.dumps(schema), compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("data.bin", data)
    return out.getvalue()


def _corrupt_deflate(raw):
    packed = bytearray(_compressed_json(raw))
    start, _ = _member_offset(bytes(packed), "model.json")
    packed[start:start + 8] = b"\xff" * 8
    return bytes(packed)


HOSTILE_ARCHIVES = {
    "a changed byte in model.json": (_flip_json_byte, "damaged.*BadZipFile|CRC"),
    "model.json compressed": (_compressed_json, "compressed, which glas_sklearn.save never does"),
    "a corrupt compressed member": (_corrupt_deflate, "compressed"),
    "model.json declaring 4 GiB": (_declare_size("model.json", 2**32 - 2), "beyond the file|declares"),
    "data.bin declaring 4 GiB": (_declare_size("data.bin", 2**32 - 2), "beyond the file|damaged"),
    "truncated": (lambda raw: raw[: len(raw) // 2], "not a zip archive|damaged"),
    "empty": (lambda raw: b"", "not a zip archive"),
}


@pytest.mark.parametrize("case", list(HOSTILE_ARCHIVES))
def test_a_damaged_archive_is_a_model_file_error(saved_bytes, case):
    edit, message = HOSTILE_ARCHIVES[case]
    with pytest.raises(ModelFileError, match=message):
        safe_load(io.BytesIO(edit(saved_bytes)))


def test_a_zip_bomb_is_refused_unread(tmp_path):
    """A small zip whose model.json inflates to 1 GiB is refused from its zip entry, with bounded memory."""
    path = tmp_path / "bomb.glas"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("model.json", "w", force_zip64=True) as out:
            chunk = b" " * (1 << 24)
            for _ in range(64):
                out.write(chunk)
        archive.writestr("data.bin", b"")
    assert path.stat().st_size < 8 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match="compressed"):
            safe_load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# --------------------------------------------------------------------------------------------------- file fuzzing
def _loads_as_saved(raw: bytes, reg, X) -> bool:
    """True when ``raw`` loads as the model saved (its outputs bit for bit); False when refused; anything else
    (another exception, other numbers) fails the test."""
    try:
        loaded = safe_load(io.BytesIO(raw))
    except ModelFileError:
        return False
    assert _same_outputs(loaded, reg, X), "a mutated file loaded as another model"
    return True


def test_byte_wise_mutations_are_refused_or_load_as_saved(fitted, saved_bytes):
    """200 random byte edits (set, flip, delete, insert) anywhere in a saved file: each refused with a
    ModelFileError or loading as the model saved (the zip's checksums guard both members)."""
    reg, X, _ = fitted
    rng = np.random.default_rng(61)
    outcomes = []
    for _ in range(200):
        out = bytearray(saved_bytes)
        at = int(rng.integers(len(out)))
        op = rng.integers(4)
        if op == 0:
            out[at] = int(rng.integers(256))
        elif op == 1:
            out[at] ^= 1 << int(rng.integers(8))
        elif op == 2:
            del out[at:at + int(rng.integers(1, 9))]
        else:
            out[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        outcomes.append(_loads_as_saved(bytes(out), reg, X))
    assert 0 < outcomes.count(False)  # the mutations did reach the members (some were refused)


_STRUCTURAL_KEYS = ("dtype", "shape", "stride", "offset", "storage", "at", "nbytes", "cls", "to", "@", "fn",
                    "items", "order")


def _mutate_value(value, rng):
    choices = [None, -1, 0, 1, 2**40, 10**12, "float64", "int8", "|O", "<f8", [], [0], [2**31, 2], {"@": "ref",
               "to": 10**6}, True, 3.5]
    if isinstance(value, list) and value and rng.random() < 0.5:
        out = list(value)
        out[int(rng.integers(len(out)))] = choices[int(rng.integers(len(choices)))]
        return out
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return value + int(rng.choice([-1, 1, 7, -(2**20), 2**33]))
    return choices[int(rng.integers(len(choices)))]


def test_structural_mutations_are_refused_or_load_as_saved(fitted, saved_bytes):
    """300 edits of the structure model.json describes (a tensor's dtype, shape, stride, offset or storage, an
    array's place in data.bin, a class index, a reference, a node's kind), the checksum recomputed: each refused
    with a ModelFileError or loading as the model saved, never another exception."""
    reg, X, _ = fitted
    schema, data = _read(io.BytesIO(saved_bytes))
    slots = []

    def walk(node):
        if isinstance(node, dict):
            for key, child in node.items():
                if key in _STRUCTURAL_KEYS and (node.get("@") in ("tensor", "ndarray", "ref", "object", "function",
                                                                 "type") or key == "@"):
                    slots.append((node, key))
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(schema["root"])
    for storage in schema["storages"]:
        slots.extend((storage, key) for key in ("at", "nbytes", "device"))
    rng = np.random.default_rng(6161)
    refused = 0
    for index in rng.choice(len(slots), size=min(300, len(slots)), replace=False):
        node, key = slots[int(index)]
        original = node[key]
        node[key] = _mutate_value(original, rng)
        out = io.BytesIO()
        _write(out, schema, data)
        refused += not _loads_as_saved(out.getvalue(), reg, X)
        node[key] = original
    assert refused > 0


def test_an_edited_ggn_diagonal_is_refused():
    """The low-rank-plus-diagonal posterior's GGN diagonal (float64, one entry per weight) edited to float32 or
    to fewer entries: refused, naming it."""
    X, y = _data()
    reg = LaplaceActiveSubspaceRegressor(**grouped(**{**TINY, "posterior": "low_rank_diag"})).fit(X, y)
    buffer = io.BytesIO()
    glas_sklearn.save(reg, buffer)
    path = ("posterior_", "_ggn_diag")
    for edit in (_set(path, dtype="float32"), lambda s: _tensor_at(s, path).update(shape=[1])):
        with pytest.raises(ModelFileError, match="GGN diagonal is"):
            safe_load(io.BytesIO(_edit_json(buffer.getvalue(), edit)))


def test_the_attribute_table_names_classes_that_exist():
    """Every class the consistency table names by import path resolves (a moved class would otherwise make the check
    refuse every file that holds it, or check nothing)."""
    import importlib

    from glas_sklearn.serialization._consistency import ATTRIBUTE_TYPES

    paths = [owner for owner in ATTRIBUTE_TYPES if owner != "*"]
    for table in ATTRIBUTE_TYPES.values():
        for expected in table.values():
            if isinstance(expected, str):
                paths.append(expected)
            elif isinstance(expected, tuple):
                paths.extend(expected)
    for path in paths:
        module, name = path.rsplit(".", 1)
        assert isinstance(getattr(importlib.import_module(module), name), type), path
