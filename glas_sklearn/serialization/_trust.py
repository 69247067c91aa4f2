"""Which classes a model file may name: the allow-list, the caller's ``trusted`` names, and the check of a file's
class table (every name checked before any import; each imported name must be a class of that very name)."""

from __future__ import annotations

import importlib
import types

import numpy as np
from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
from sklearn.impute import MissingIndicator, SimpleImputer
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.preprocessing import (
    Binarizer,
    FunctionTransformer,
    KBinsDiscretizer,
    LabelBinarizer,
    LabelEncoder,
    MaxAbsScaler,
    MinMaxScaler,
    Normalizer,
    OneHotEncoder,
    OrdinalEncoder,
    PolynomialFeatures,
    PowerTransformer,
    QuantileTransformer,
    RobustScaler,
    StandardScaler,
)

from ._format import ModelFileError, class_path

__all__ = ["BUILTIN_TYPES", "FUNCTION_TYPES", "TRUSTED_CLASSES", "TRUSTED_FUNCTION_MODULES", "TRUSTED_PACKAGES",
           "describe_classes", "import_attribute", "resolve_classes", "trusted_names"]

#: Packages whose classes load without being trusted: glas-sklearn's own, torch.nn's built-in layers and
#: torch.optim's optimizers (named by a ``optimizer=`` setting).
TRUSTED_PACKAGES = ("glas_sklearn", "torch.nn.modules", "torch.optim")
#: Classes of other packages that load without being trusted: scikit-learn's composites (Pipeline, ColumnTransformer,
#: FeatureUnion, TransformedTargetRegressor) and the tabular preprocessing steps users put before a network (restored
#: by ``__dict__``, as scikit-learn estimators are: none of their code runs at load; a FunctionTransformer's function
#: is checked as any function is, a numpy ufunc being data), numpy's random generators (restored through their state).
TRUSTED_CLASSES = frozenset(f"{c.__module__}.{c.__qualname__}" for c in (
    Pipeline, ColumnTransformer, FeatureUnion, TransformedTargetRegressor, FunctionTransformer,
    StandardScaler, MinMaxScaler, MaxAbsScaler, RobustScaler, QuantileTransformer, PowerTransformer, Normalizer,
    Binarizer, KBinsDiscretizer, PolynomialFeatures, OneHotEncoder, OrdinalEncoder, SimpleImputer, MissingIndicator,
    LabelEncoder, LabelBinarizer,
    np.random.RandomState, np.random.Generator, np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
    np.random.Philox, np.random.SFC64))
#: Modules whose functions load without being trusted (a network's activation held as a function): torch's
#: neural-network operators, which compute on tensors and nothing else.
TRUSTED_FUNCTION_MODULES = ("torch.nn.functional", "torch._C._nn")
#: What a function entry of the class table must resolve to.
FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType)
#: Builtin types a file may name as values (e.g. a ``dtype=float`` setting).
BUILTIN_TYPES = {t.__name__: t for t in (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)}


def trusted_names(trusted) -> frozenset[str]:
    """``load``'s ``trusted`` (None, a name, a class, or an iterable of names and classes) as dotted class paths."""
    if trusted is None:
        return frozenset()
    if isinstance(trusted, bool):
        raise TypeError("trusted must name the classes to trust (a list of import paths or classes), not a bool: "
                        "trusting every class a file names would let the file run any code.")
    if isinstance(trusted, (str, type)):
        trusted = [trusted]
    names = set()
    for entry in trusted:
        if isinstance(entry, type):
            names.add(".".join(class_path(entry)))
        elif isinstance(entry, str):
            names.add(entry)
        else:
            raise TypeError(f"trusted must be a list of class names (str) or classes, got an entry {entry!r}.")
    return frozenset(names)


def _is_identifier_path(text) -> bool:
    """A dotted path of identifiers, none of them a dunder name (``glas_sklearn.__main__``, ``builtins.__import__``);
    the module ``__main__`` (a script's classes, trusted only by name) is checked apart."""
    return isinstance(text, str) and bool(text) and all(
        part.isidentifier() and not (part.startswith("__") and part.endswith("__")) for part in text.split("."))


def _trusted_by_default(module: str, name: str, kind: str) -> bool:
    """Whether the class (or function) ``module.name`` is on the allow-list (by its name alone: nothing is
    imported)."""
    if kind == "function":
        return module in TRUSTED_FUNCTION_MODULES
    if f"{module}.{name}" in TRUSTED_CLASSES:
        return True
    return any(module == package or module.startswith(package + ".") for package in TRUSTED_PACKAGES)


def import_attribute(module: str, name: str):
    """``module``'s attribute ``name`` (a dotted qualified name), the module imported."""
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def describe_classes(entries) -> list[dict]:
    """The class table's entries as ``{"name", "kind", "trusted"}`` (trusted: on the allow-list), sorted by name;
    nothing is imported. A malformed table is refused."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ModelFileError("The model file's class table is damaged (not a list of {module, name}).")
    out = {}
    for entry in entries:
        module, name, kind = entry.get("module"), entry.get("name"), entry.get("kind", "class")
        if not (isinstance(module, str) and isinstance(name, str) and kind in ("class", "function")):
            raise ModelFileError(f"The model file's class table holds {entry!r}, which is no class entry.")
        out[f"{module}.{name}"] = {"name": f"{module}.{name}", "kind": kind,
                                   "trusted": _trusted_by_default(module, name, kind)}
    return [out[key] for key in sorted(out)]


def resolve_classes(entries, trusted: frozenset[str]) -> list:
    """The file's class table checked (every name allow-listed or trusted: else refused, naming all, before any
    import), then imported; each must be a class (or, for an entry of kind "function", a function) whose own
    module and name are the ones recorded."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ModelFileError("The model file's class table is damaged (not a list of {module, name}).")
    paths = [(e.get("module"), e.get("name"), e.get("kind", "class")) for e in entries]
    malformed = [f"{m}.{n}" for m, n, kind in paths
                 if not ((m == "__main__" or _is_identifier_path(m)) and _is_identifier_path(n)
                         and kind in ("class", "function"))]
    if malformed:
        raise ModelFileError(f"The model file names {malformed}, which are not class paths (a dunder name or not an "
                             "identifier): the file was edited. Nothing was imported.")
    untrusted = sorted({f"{m}.{n}" for m, n, kind in paths
                        if not _trusted_by_default(m, n, kind) and f"{m}.{n}" not in trusted})
    if untrusted:
        raise ModelFileError(
            f"The model file holds objects of {', '.join(untrusted)}, which glas_sklearn.load does not trust by "
            f"default: making and using them runs that code. If you trust this file's source and these classes, "
            f"pass them: glas_sklearn.load(path, trusted={untrusted!r}). Nothing was imported.")
    resolved = []
    for module, name, kind in paths:
        try:
            target = import_attribute(module, name)
        except (ImportError, AttributeError) as err:
            raise ModelFileError(f"The model file names the {kind} {module}.{name}, which cannot be imported here "
                                 f"({err}).") from None
        expected = FUNCTION_TYPES if kind == "function" else type
        if not isinstance(target, expected) or class_path(target) != (module, name):
            raise ModelFileError(f"The model file names {module}.{name}, which is not a {kind} defined under that name "
                                 f"(it is {type(target).__name__} {getattr(target, '__module__', '?')}."
                                 f"{getattr(target, '__qualname__', '?')}): the file was edited. Nothing was made.")
        resolved.append(target)
    return resolved
