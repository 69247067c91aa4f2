"""glas_sklearn.save / glas_sklearn.load: model files of data only.

Round trips are checked against the estimator saved: every piece of its fitted state (walked generically, so the
check follows the state's layout wherever it goes), the aliasing inside it (one tensor held in two places stays
one), and every prediction bit for bit (the loaded estimator takes the same computational path). Tampered files
are refused without running anything: each load runs under a guard that fails on any unpickling, and planted
payloads carry a side effect (a file written) that is asserted never to happen.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import io
import json
import logging
import math
import pathlib
import pickle
import zipfile
from collections import OrderedDict

import joblib
import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import BaseEstimator, clone
from torch import nn

import glas_sklearn
from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor
from glas_sklearn.serialization import FORMAT_VERSION, ModelFileError
from tests.reference import grouped

SMALL = dict(module_kwargs=dict(hidden_layer_sizes=(8,)), max_epochs=10, lr=0.05, batch_size=None, n_samples=30,
             max_components=3, random_state=0)
_REAL_PICKLE_LOADS = pickle.loads
# The tiny fits here calibrate on few rows; what the calibration warns about is tested elsewhere.
pytestmark = [pytest.mark.filterwarnings("ignore::glas_sklearn.calibration.CalibrationWarning"),
              pytest.mark.filterwarnings("ignore::glas_sklearn.calibration.ConformalWarning")]


def _regression(n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    return X, np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)


def _classification(n=90, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return X, np.array(["a", "b", "c"])[(X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)]


class TinyNet(nn.Module):
    """A user's own module class (prefit): loading it runs its code, so it loads only when trusted."""

    def __init__(self, n_in=3, hidden=6):
        super().__init__()
        self.hidden = nn.Linear(n_in, hidden)
        self.out = nn.Linear(hidden, 1)
        self.scale = 2.0
        self.activation = torch.nn.functional.gelu  # a function held as an attribute (torch's, trusted by default)

    def forward(self, x):
        return self.out(self.activation(self.hidden(x) * self.scale))


class _Payload:
    """Unpickling this writes ``path``: the side effect a planted pickle would have."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.write_text, (pathlib.Path(self.path), "payload ran")


# ---------------------------------------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def no_unpickling():
    """Every way to unpickle (pickle, _pickle, torch.load, numpy.load, joblib.load) raises inside the block."""

    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled during glas_sklearn.load")

    class RefusingUnpickler:
        def __init__(self, *args, **kwargs):
            refuse()

    import _pickle

    with pytest.MonkeyPatch.context() as mp:
        for module in (pickle, _pickle):
            mp.setattr(module, "Unpickler", RefusingUnpickler)
            mp.setattr(module, "load", refuse)
            mp.setattr(module, "loads", refuse)
        mp.setattr(torch, "load", refuse)
        mp.setattr(torch.serialization, "load", refuse)
        mp.setattr(np, "load", refuse)
        mp.setattr(joblib, "load", refuse)
        yield


def safe_load(path, **kwargs):
    with no_unpickling():
        return glas_sklearn.load(path, **kwargs)


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_state(a, b, where="estimator", pairs=None):
    """``b`` is a faithful copy of ``a``: same types, the same bits in every tensor and array (dtype, shape,
    device, requires_grad), the same values elsewhere, and the same aliasing (what ``a`` holds twice, ``b`` holds
    twice as one object)."""
    pairs = {} if pairs is None else pairs
    if type(a) in (type(None), bool, int, str):
        assert type(b) is type(a) and a == b, where
        return
    if type(a) is float:
        assert type(b) is float and (a == b or (math.isnan(a) and math.isnan(b))), where
        assert math.copysign(1.0, a) == math.copysign(1.0, b), where
        return
    if not isinstance(a, (tuple, frozenset, bytes)):  # immutable values may come back as equal copies
        if id(a) in pairs:
            assert pairs[id(a)][1] is b, f"{where}: aliasing not kept"
            return
        pairs[id(a)] = (a, b)  # both kept alive: no id is reused while the walk goes on
    assert type(b) is type(a), f"{where}: {type(a)} became {type(b)}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.device, a.requires_grad, a.stride()) == (b.dtype, b.shape, b.device,
                                                                               b.requires_grad, b.stride()), where
        assert _bits(a) == _bits(b), where
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        if a.dtype.hasobject:
            for i, (u, v) in enumerate(zip(a.reshape(-1), b.reshape(-1), strict=True)):
                assert_same_state(u, v, f"{where}[{i}]", pairs)
        else:
            assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b, check_exact=True)
    elif isinstance(a, pd.Index):
        pd.testing.assert_index_equal(a, b, exact=True, check_exact=True)
    elif isinstance(a, (dict,)):
        assert list(a) == list(b), f"{where}: keys differ"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}", pairs)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            assert_same_state(u, v, f"{where}[{i}]", pairs)
    elif isinstance(a, (set, frozenset, torch.dtype, torch.device, torch.Size, np.dtype, type, bytes)):
        assert a == b, where
    elif isinstance(a, np.random.RandomState):
        assert_same_state(a.get_state(legacy=False), b.get_state(legacy=False), where, pairs)
    elif isinstance(a, torch.Generator):
        assert torch.equal(a.get_state(), b.get_state()), where
    else:
        state_a = dict(vars(a)) if isinstance(a, BaseEstimator) else a.__getstate__()
        state_b = dict(vars(b)) if isinstance(b, BaseEstimator) else b.__getstate__()
        assert_same_state(state_a, state_b, where, pairs)


def _predictions(est, X):
    """Every prediction the estimator gives, as arrays."""
    if isinstance(est, LaplaceActiveSubspaceClassifier):
        return [est.predict(X), est.predict_proba(X), *est.predict_set(X), *est.predict_set(X, [0.5, 0.8])]
    mean, std = est.predict(X, return_std=True)
    return [mean, std, *est.predict_interval(X), *est.predict_interval(X, [0.5, 0.8]),
            est.sample_y(X, n_samples=3, random_state=1)]


def _assert_round_trip(est, X, y, path, **load_kwargs):
    glas_sklearn.save(est, path)
    loaded = safe_load(path, **load_kwargs)
    assert loaded is not est
    assert_same_state(est, loaded)
    for want, got in zip(_predictions(est, X), _predictions(loaded, X), strict=True):
        assert want.dtype == got.dtype and want.shape == got.shape
        np.testing.assert_array_equal(got, want, strict=True)
    pd.testing.assert_frame_equal(loaded.coverage_curve(X, y, d_max=2), est.coverage_curve(X, y, d_max=2),
                                  check_exact=True)
    assert clone(loaded).get_params().keys() == est.get_params().keys()
    return loaded


# ------------------------------------------------------------------------------------------------------ round trips
REGRESSORS = {
    "default": {},
    "gaussian": dict(likelihood="gaussian"),
    "heteroscedastic": dict(likelihood="heteroscedastic"),
    "student_t": dict(likelihood="student_t"),
    "subspace": dict(likelihood="gaussian", posterior="subspace"),
    "low_rank_diag": dict(likelihood="gaussian", posterior="low_rank_diag"),
    "mondrian": dict(likelihood="gaussian", calibration="mondrian"),
    "coverage_sampled": dict(likelihood="gaussian", posterior="subspace", calibration="coverage",
                             predictive="sampled"),
    "float64": dict(likelihood="gaussian", dtype="float64", random_state=np.random.RandomState(3)),
    "ensemble": dict(likelihood="gaussian", n_networks=2),
}


@pytest.mark.parametrize("name", list(REGRESSORS))
def test_regressor_round_trips_bit_for_bit(name, tmp_path):
    X, y = _regression()
    kwargs = {**SMALL, **REGRESSORS[name]}
    if name == "default":
        kwargs = dict(max_epochs=10, n_samples=30, random_state=0)
    est = LaplaceActiveSubspaceRegressor(**grouped(**kwargs)).fit(X, y)
    _assert_round_trip(est, X, y, tmp_path / "reg.glas")


@pytest.mark.parametrize("kwargs", [{}, dict(posterior="subspace", calibration="coverage", predictive="sampled"),
                                    dict(posterior="low_rank_diag", calibration="mondrian", dtype="float64")],
                         ids=["default", "paper", "low_rank_diag_mondrian_float64"])
def test_classifier_round_trips_bit_for_bit(kwargs, tmp_path):
    X, y = _classification()
    est = LaplaceActiveSubspaceClassifier(**grouped(**{**SMALL, **kwargs})).fit(X, y)
    loaded = _assert_round_trip(est, X, y, tmp_path / "clf.glas")
    assert loaded.classes_.tolist() == ["a", "b", "c"]


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")  # an untrained network serves here
def test_prefit_user_module_loads_only_when_trusted(tmp_path):
    X, y = _regression()
    torch.manual_seed(0)
    net = TinyNet()
    X_cal, y_cal = _regression(40, seed=1)
    est = LaplaceActiveSubspaceRegressor(**grouped(module=net, prefit=True, likelihood="gaussian", **{
        k: v for k, v in SMALL.items() if k not in ("module_kwargs",)})).fit(X, y, X_cal=X_cal, y_cal=y_cal)
    path = tmp_path / "prefit.glas"
    glas_sklearn.save(est, path)
    name = f"{TinyNet.__module__}.{TinyNet.__qualname__}"
    with pytest.raises(ModelFileError, match=rf"{name}.*does not trust.*trusted=\['{name}'\]"):
        safe_load(path)
    with pytest.raises(TypeError, match="not a bool"):
        safe_load(path, trusted=True)
    loaded = _assert_round_trip(est, X_cal, y_cal, path, trusted=[name])  # rows the network was not trained on
    assert type(loaded.module) is TinyNet and loaded.module is not net
    _assert_round_trip(est, X_cal, y_cal, path, trusted=[TinyNet])  # the class itself names it too


@pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")  # an untrained network serves here
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' own deprecations
def test_a_prefit_transformers_lora_model_loads_once_its_classes_are_trusted(tmp_path):
    """A Hugging Face peft LoRA classifier: its many classes are named in the refusal, and with them trusted the
    estimator comes back bit for bit (its activation functions are stored by import path)."""
    pytest.importorskip("peft")
    from .test_transformers import LENGTH, PAD, VOCAB, tiny_bert

    rng = np.random.default_rng(0)
    X, X_cal = rng.integers(1, VOCAB, size=(40, LENGTH)), rng.integers(1, VOCAB, size=(30, LENGTH))
    y, y_cal = (X[:, 0] > VOCAB // 2).astype(int), (X_cal[:, 0] > VOCAB // 2).astype(int)
    est = LaplaceActiveSubspaceClassifier(**grouped(module=tiny_bert(), prefit=True, padding_idx=PAD,
                                                    max_components=3, n_samples=20, random_state=0))
    est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    path = tmp_path / "lora.glas"
    glas_sklearn.save(est, path)
    with pytest.raises(ModelFileError, match=r"peft\.peft_model\.PeftModelForSequenceClassification.*transformers"
                                             r"\.models\.bert\.modeling_bert\.BertEncoder") as refusal:
        safe_load(path)
    trusted = json.loads(str(refusal.value).split("trusted=")[1].split(")")[0].replace("'", '"'))
    loaded = safe_load(path, trusted=trusted)
    assert_same_state(est, loaded)
    np.testing.assert_array_equal(loaded.predict_proba(X_cal), est.predict_proba(X_cal), strict=True)


def test_a_pipeline_round_trips(tmp_path):
    """A Pipeline and a TransformedTargetRegressor around the regressor (what glas_sklearn.compose serves)."""
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = _regression()
    model = make_pipeline(StandardScaler(), TransformedTargetRegressor(
        LaplaceActiveSubspaceRegressor(**grouped(**SMALL)), transformer=StandardScaler())).fit(X, 10 * y)
    glas_sklearn.save(model, tmp_path / "pipe.glas")
    loaded = safe_load(tmp_path / "pipe.glas")
    assert_same_state(model, loaded)
    for want, got in zip(glas_sklearn.predict_interval(model, X), glas_sklearn.predict_interval(loaded, X),
                         strict=True):
        np.testing.assert_array_equal(got, want, strict=True)


def test_an_edited_function_entry_is_refused(tmp_path, marker):
    """A network's activation is stored as a function entry of the class table; edited to os.system it is refused
    by name (also with the network's class trusted), and a function entry may not stand for a class."""
    path, _ = marker
    X, y = _regression()
    X_cal, y_cal = _regression(40, seed=1)
    with pytest.warns(glas_sklearn.PrefitUnderfitWarning):
        est = LaplaceActiveSubspaceRegressor(**grouped(module=TinyNet(), prefit=True, likelihood="gaussian",
                                                       max_components=3, n_samples=30, random_state=0))
        est.fit(X, y, X_cal=X_cal, y_cal=y_cal)
    glas_sklearn.save(est, tmp_path / "net.glas")
    schema, data = _read(tmp_path / "net.glas")
    gelu = next(i for i, c in enumerate(schema["classes"]) if c.get("kind") == "function")
    assert schema["classes"][gelu]["name"] == "gelu"
    trusted = [TinyNet]
    for entry, pattern in (({"module": "os", "name": "system", "kind": "function"}, "os.system, which glas_sklearn"),
                           ({"module": "torch._C._nn", "name": "gelu"}, "does not trust"),
                           ({"module": "torch.nn.functional", "name": "Tensor", "kind": "function"},  # an import
                            "not a function defined under that name")):
        edited_schema = json.loads(json.dumps(schema))
        edited_schema["classes"][gelu] = entry
        _write(tmp_path / "edited.glas", edited_schema, data)
        with pytest.raises(ModelFileError, match=pattern):
            safe_load(tmp_path / "edited.glas", trusted=trusted)


def test_pickle_and_joblib_keep_working(tmp_path):
    X, y = _regression()
    est = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X, y)
    joblib.dump(est, tmp_path / "reg.joblib")
    for loaded in (pickle.loads(pickle.dumps(est)), joblib.load(tmp_path / "reg.joblib")):
        np.testing.assert_array_equal(loaded.predict_interval(X)[1], est.predict_interval(X)[1])


def test_model_fitted_on_cuda_loads_on_the_cpu(tmp_path, caplog):
    """A file saved from CUDA records "cuda:0" for every storage and torch.device; here (no CUDA) it loads onto the
    CPU and predicts as the CPU original (the bytes of a storage do not depend on its device)."""
    X, y = _regression()
    est = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X, y)
    path = tmp_path / "reg.glas"
    glas_sklearn.save(est, path)
    schema, data = _read(path)
    for storage in schema["storages"]:
        storage["device"] = "cuda:0"
    n_devices = _replace_nodes(schema["root"], lambda n: n.get("@") == "torch.device",
                               lambda n: {**n, "name": "cuda:0"})
    assert n_devices > 0 and schema["storages"]
    as_cuda = tmp_path / "cuda.glas"
    _write(as_cuda, schema, data)
    if torch.cuda.is_available():  # pragma: no cover - CPU-only CI
        pytest.skip("the CPU fallback is checked where CUDA is absent")
    for kwargs in ({}, {"map_location": "cpu"}):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="glas_sklearn.serialization"):
            loaded = safe_load(as_cuda, **kwargs)
        assert ("not available here" in caplog.text) == (not kwargs)
        assert loaded.posterior_.device == torch.device("cpu")
        assert all(p.device.type == "cpu" for p in loaded.module_.parameters())
        for want, got in zip(_predictions(est, X), _predictions(loaded, X), strict=True):
            np.testing.assert_array_equal(got, want, strict=True)


def test_save_refuses_what_is_not_data(tmp_path):
    est = LaplaceActiveSubspaceRegressor(module=lambda: nn.Linear(3, 1))
    with pytest.raises(ModelFileError, match=r"estimator\.module .*function"):
        glas_sklearn.save(est, tmp_path / "x.glas")

    class Local(nn.Module):
        pass

    with pytest.raises(ModelFileError, match="defined inside a function"):
        glas_sklearn.save(LaplaceActiveSubspaceRegressor(module=Local()), tmp_path / "x.glas")


# ---------------------------------------------------------------------------------------------------------- tampering
def _read(path):
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("model.json")), archive.read("data.bin")


def _write(path, schema, data, extra=()):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model.json", schema if isinstance(schema, (str, bytes)) else json.dumps(schema))
        archive.writestr("data.bin", data)
        for name, content in extra:
            archive.writestr(name, content)


def _replace_nodes(node, match, replace) -> int:
    """Replace, in place, every JSON node for which ``match`` holds; the number replaced."""
    count = 0
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in list(children):
        count += _replace_nodes(child, match, replace)
    if isinstance(node, dict):
        for key, child in node.items():
            if isinstance(child, dict) and match(child):
                node[key] = replace(child)
                count += 1
    elif isinstance(node, list):
        for i, child in enumerate(node):
            if isinstance(child, dict) and match(child):
                node[i] = replace(child)
                count += 1
    return count


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    X, y = _regression()
    est = LaplaceActiveSubspaceRegressor(**grouped(**SMALL)).fit(X, y)
    path = tmp_path_factory.mktemp("saved") / "reg.glas"
    glas_sklearn.save(est, path)
    return path


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "payload-ran"
    payload = pickle.dumps(_Payload(path))
    _REAL_PICKLE_LOADS(payload)  # the payload is live: unpickling it writes the marker
    assert path.exists()
    path.unlink()
    yield path, payload
    assert not path.exists(), "a planted payload ran"


def test_the_guard_refuses_unpickling():
    with no_unpickling():
        for load in (lambda: pickle.loads(pickle.dumps(1)), lambda: torch.load(io.BytesIO(b"")),
                     lambda: pickle.Unpickler(io.BytesIO(b"")).load()):
            with pytest.raises(AssertionError, match="unpickled"):
                load()


def test_a_planted_pickle_member_is_refused(saved, marker, tmp_path):
    path, payload = marker
    schema, data = _read(saved)
    for extra, pattern in ((("payload.pkl", payload),), "members other than.*payload.pkl"), (
            (("data.pkl", payload), ("__reduce__.json", b"{}")), "payload|data.pkl"):
        planted = tmp_path / "planted.glas"
        _write(planted, schema, data, extra)
        with pytest.raises(ModelFileError, match=pattern):
            safe_load(planted)
    # the payload in place of the data, or of the JSON
    for schema_bytes, data_bytes in ((json.dumps(schema), payload), (payload, data)):
        planted = tmp_path / "swapped.glas"
        _write(planted, schema_bytes, data_bytes)
        with pytest.raises(ModelFileError, match="beyond its data|not valid JSON"):
            safe_load(planted)
    # a pickle or joblib file given to load
    pickled = tmp_path / "model.pkl"
    pickled.write_bytes(payload)
    with pytest.raises(ModelFileError, match="not a glas-sklearn model file.*not a zip"):
        safe_load(pickled)


@pytest.mark.parametrize("module, name", [
    ("os", "system"), ("posix", "system"), ("subprocess", "Popen"), ("builtins", "eval"),
    ("pathlib", "Path"), ("sklearn.linear_model", "LogisticRegression"), ("collections", "defaultdict"),
])
def test_an_edited_class_path_is_refused_by_name(saved, marker, tmp_path, module, name):
    """Every class of the file named something outside the allow-list is refused by that name before anything
    is imported or made (a naive loader would call the edited name with the state: writing the marker)."""
    path, _ = marker
    schema, data = _read(saved)
    linear = next(i for i, c in enumerate(schema["classes"]) if c["name"] == "Linear")
    schema["classes"][linear] = {"module": module, "name": name}
    _replace_nodes(schema["root"], lambda n: n.get("@") == "object" and n.get("cls") == linear,
                   lambda n: {**n, "state": {"@": "dict", "map": {"args": f"touch {path}", "path": str(path)}}})
    edited = tmp_path / "edited.glas"
    _write(edited, schema, data)
    with pytest.raises(ModelFileError, match=rf"{module}\.{name}, which glas_sklearn.load does not trust.*"
                                             r"trusted=.*Nothing was imported"):
        safe_load(edited)


@pytest.mark.parametrize("module, name, pattern", [
    ("glas_sklearn.__main__", "main", "not class paths"),  # importing it would run the command line
    ("glas_sklearn._functional", "threading.Thread", "not a class defined under that name"),  # an alias
    ("glas_sklearn.serialization", "load", "not a class defined under that name"),  # a function
    ("glas_sklearn", "__builtins__", "not class paths"),
    ("torch.nn.functional", "gelu", "does not trust"),  # a function named as a class
])
def test_an_edited_class_path_inside_the_package_is_refused(saved, tmp_path, module, name, pattern):
    schema, data = _read(saved)
    schema["classes"][0] = {"module": module, "name": name}
    edited = tmp_path / "edited.glas"
    _write(edited, schema, data)
    with pytest.raises(ModelFileError, match=pattern):
        safe_load(edited)


def test_edited_nodes_are_refused(saved, tmp_path):
    schema, data = _read(saved)
    edits = {
        "unknown kind": (lambda n: n.get("@") == "tensor", lambda n: {**n, "@": "pickle"}, "unknown kind 'pickle'"),
        "out of bounds": (lambda n: n.get("@") == "tensor", lambda n: {**n, "offset": 10**9}, "beyond its storage"),
        "object as list": (lambda n: n.get("@") == "object", lambda n: {**n, "cls": 10**6}, "class table"),
    }
    for what, (match, replace, pattern) in edits.items():
        edited_schema = json.loads(json.dumps(schema))
        assert _replace_nodes(edited_schema["root"], match, replace) > 0, what
        edited = tmp_path / "edited.glas"
        _write(edited, edited_schema, data)
        with pytest.raises(ModelFileError, match=pattern):
            safe_load(edited)


def test_another_format_version_says_so(saved, tmp_path):
    schema, data = _read(saved)
    assert schema["format_version"] == FORMAT_VERSION
    assert schema["written_by"]["glas_sklearn"] == glas_sklearn.__version__
    schema["format_version"] = FORMAT_VERSION + 1
    schema["written_by"]["glas_sklearn"] = "9.9"
    edited = tmp_path / "future.glas"
    _write(edited, schema, data)
    with pytest.raises(ModelFileError, match=rf"format version {FORMAT_VERSION + 1} \(written by glas-sklearn 9\.9\)"
                                             rf".*reads format version {FORMAT_VERSION} only"):
        safe_load(edited)


def _glas_classes():
    import importlib
    import inspect
    import pkgutil

    for info in pkgutil.walk_packages(glas_sklearn.__path__, "glas_sklearn."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (rdkit) is missing
            continue
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == info.name:
                yield cls


def test_load_runs_only_reviewed_hooks_of_the_package():
    """What load may run of the package's own classes: ``cls.__new__(cls)`` and ``__setstate__`` of every class it
    does not restore by ``__dict__`` (estimators and the classes they inherit pickling hooks from are restored by
    ``__dict__``; tuples, enums and classes pickled through ``__reduce__`` are never made as plain objects). This
    list is the review: a new ``__new__`` or ``__setstate__`` in the package must be read for what it does with a
    state an attacker wrote, and added here."""
    from glas_sklearn.serialization._format import state_is_dict

    found = set()
    for cls in _glas_classes():
        if state_is_dict(cls) or issubclass(cls, (tuple, enum.Enum, BaseException)):
            continue
        for hook in ("__new__", "__setstate__"):
            owner = next((c for c in cls.__mro__ if hook in vars(c)), object)
            if owner is not object:
                found.add((hook, f"{owner.__module__}.{owner.__qualname__}"))
    assert found == {
        ("__new__", "glas_sklearn.posterior._base.ActiveSubspacePosterior"),  # resolves a kind's name to its class
        ("__new__", "tqdm.std.tqdm"),  # a progress bar (never in a fitted state)
        ("__setstate__", "glas_sklearn._functional.FunctionalModel"),  # rebuilds per-thread views
        ("__setstate__", "glas_sklearn.posterior._base.ActiveSubspacePosterior"),  # per-thread caches
        ("__setstate__", "torch.nn.modules.module.Module"),  # fills in hook dicts
    }


def test_an_estimator_pickling_hook_named_in_a_file_does_not_unpickle(saved, marker, tmp_path):
    """The estimators' pickling hooks carry their torch state as bytes. A file that gives such bytes (a torch blob
    whose unpickling would write the marker) as the state of an estimator, or of the class the estimators inherit
    that hook from, is refused, naming the attributes: nothing is unpickled, the payload never runs."""
    path, payload = marker
    blob = io.BytesIO()
    torch.save({"posterior_": _Payload(path)}, blob)
    owner = next(c for c in LaplaceActiveSubspaceRegressor.__mro__ if "__setstate__" in vars(c))
    for key in ("_torch_state", "_glas_state"):
        state = {"_glas_pickle": {"@": "tuple", "items": [glas_sklearn.__version__, 3]},
                 key: {"@": "bytes", "b64": base64.b64encode(blob.getvalue()).decode()}}
        for cls in (owner, LaplaceActiveSubspaceRegressor):
            schema, data = _read(saved)
            schema["classes"].append({"module": cls.__module__, "name": cls.__qualname__})
            schema["root"]["state"]["map"]["planted_"] = {"@": "object", "cls": len(schema["classes"]) - 1,
                                                          "state": {"@": "dict", "map": state}}
            edited = tmp_path / "hook.glas"
            _write(edited, schema, data)
            refused = rf"attributes \['_glas_pickle', '{key}'\].*never writes" if cls is not owner else "abstract"
            with pytest.raises(ModelFileError, match=refused):
                safe_load(edited)
    assert not pathlib.Path(path).exists()


def test_the_object_graph_round_trips_whatever_its_layout(tmp_path):
    """The format is generic over the object graph (the estimators' state may take any layout): containers,
    shared and cyclic references, tensor views of one storage, every dtype and memory order, random generators'
    states, pandas objects, named tuples and class references come back as they were."""
    from glas_sklearn.predictive.modes import RegressionMoments

    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    shared = [1, 2]
    generator = torch.Generator().manual_seed(5)
    torch.randn(4, generator=generator)  # the state moved past its seed
    rng = np.random.default_rng(7)
    rng.normal(size=3)
    cyclic: dict = {"name": "loop"}
    cyclic["self"] = cyclic
    graph = {
        "tensors": {"base": base, "column": base[:, 1], "transposed": base.T,
                    "bf16": torch.ones(3, dtype=torch.bfloat16),
                    "int": torch.tensor([1, -2], dtype=torch.int64), "bool": torch.tensor([True, False]),
                    "scalar": torch.tensor(-0.0), "empty": torch.zeros(0, 3),
                    "parameter": nn.Parameter(torch.randn(2, 2)), "frozen": nn.Parameter(torch.ones(2), False)},
        "arrays": {"fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "strings": np.array(["a", "bc"]),
                   "objects": np.array(["a", 1, None], dtype=object), "uint": np.arange(3, dtype=np.uint16),
                   "complex": np.array([1 + 2j]), "empty": np.zeros((0, 2), dtype=np.float32)},
        "scalars": [np.float32(1.5), np.int64(-3), np.bool_(True), 1 + 2j, float("nan"), float("-inf"), -0.0, 2**70],
        "containers": (shared, shared, {1: "int key", (2, 3): "tuple key"}, {3, 4}, frozenset({5}), b"\x00\xff",
                       bytearray(b"ab"), OrderedDict(b=1, a=2)),
        "cyclic": cyclic,
        "random": {"torch": generator, "numpy": rng, "legacy": np.random.RandomState(3)},
        "types": [float, np.float32, torch.float16, torch.device("cpu"), torch.Size([2, 3]), np.dtype("<i4"),
                  LaplaceActiveSubspaceRegressor, torch.optim.SGD],
        "pandas": {"frame": pd.DataFrame({"d": [1, 2], "x": [0.5, np.nan], "s": ["a", None]}, index=[10, 20]),
                   "series": pd.Series([1.0, 2.0], index=pd.Index(["u", "v"], name="k"), name="y"),
                   "range": pd.RangeIndex(2, 8, 3, name="r")},
        "named": RegressionMoments(torch.zeros(2), torch.ones(2)),
    }
    graph["again"] = [graph["named"], graph["pandas"]["series"].index, graph["pandas"]["frame"],
                      graph["arrays"]["uint"], graph["random"]["numpy"], graph["tensors"]["parameter"]]  # held twice
    glas_sklearn.save(graph, tmp_path / "graph.glas")
    loaded = safe_load(tmp_path / "graph.glas")
    assert_same_state(graph, loaded)
    t = loaded["tensors"]
    assert t["column"].untyped_storage().data_ptr() == t["base"].untyped_storage().data_ptr()
    t["base"][0, 1] = 100.0  # views of one storage stay views of one storage
    assert t["column"][0] == 100.0 and t["transposed"][1, 0] == 100.0
    assert type(t["parameter"]) is nn.Parameter and not t["frozen"].requires_grad
    assert loaded["containers"][0] is loaded["containers"][1] and loaded["cyclic"]["self"] is loaded["cyclic"]
    assert loaded["random"]["numpy"].normal() == rng.normal()
    assert torch.equal(torch.randn(3, generator=loaded["random"]["torch"]), torch.randn(3, generator=generator))
    assert loaded["random"]["legacy"].rand() == np.random.RandomState(3).rand()
    assert isinstance(loaded["named"], RegressionMoments)
