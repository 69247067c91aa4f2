"""The loaded state checked against what the estimators' computations expect of it: every tensor a view that
covers distinct bytes (no edited stride makes two entries share one), a network binding's flat weights θ0 of the
layout's size and dtype and the network's parameters of the layout's shapes, a posterior's eigenpairs of the shapes
and dtype of its weights. A file edited consistently (checksums recomputed) is refused here, naming what does not
fit, rather than failing later inside torch or predicting other numbers."""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import torch
from torch import nn

from .._functional import FunctionalModel, ModelAdapter, ParameterLayout
from ..calibration._base import Calibrator
from ..conformity_scores import ConformityScore
from ..likelihoods._base import Likelihood
from ..posterior import ActiveSubspacePosterior
from ..predictive.modes import PredictiveMode
from ._format import ModelFileError

__all__ = ["check_state", "check_tensor_layout"]


def check_tensor_layout(shape: list[int], stride: list[int]) -> None:
    """Refuse a tensor whose strides make two of its entries one element of storage (a stride edited to 0, or
    strides that interleave): every tensor an estimator saves addresses distinct elements."""
    dims = sorted((s, n) for n, s in zip(shape, stride, strict=True) if n > 1)
    reach = 1
    for s, n in dims:
        if s < reach:
            raise ModelFileError(f"The model file holds a tensor of shape {shape} and stride {stride}, whose entries "
                                 "overlap in storage: the file was edited.")
        reach = s * n


def _fail(what: str) -> None:
    raise ModelFileError(f"The model file's {what}: the file was edited or damaged. Nothing was returned.")


def _check_functional(state: dict) -> None:
    layout = state.get("layout")
    theta0 = state.get("theta0")
    if not isinstance(layout, ParameterLayout) or not isinstance(theta0, torch.Tensor):
        _fail("network binding has no parameter layout or no weight vector θ0")
    shapes, numels = tuple(layout.shapes), tuple(layout.numels)
    if not (isinstance(layout.dtype, torch.dtype) and len(layout.names) == len(shapes) == len(numels)
            and all(isinstance(s, torch.Size) and math.prod(s) == n for s, n in zip(shapes, numels, strict=True))):
        _fail(f"parameter layout is inconsistent (shapes {shapes}, sizes {numels})")
    if layout.param_dtypes is not None and len(layout.param_dtypes) != len(shapes):
        _fail("parameter layout names dtypes for another number of parameters")
    if theta0.ndim != 1 or theta0.numel() != sum(numels) or not theta0.is_contiguous():
        _fail(f"weight vector θ0 has shape {tuple(theta0.shape)} and stride {theta0.stride()}, where its layout "
              f"needs a contiguous vector of {sum(numels)} weights")
    if theta0.dtype != layout.dtype:
        _fail(f"weight vector θ0 is {theta0.dtype}, where its layout records {layout.dtype}")
    module = state.get("module")
    if isinstance(module, torch.nn.Module):
        held = dict(module.named_parameters())
        for i, (name, shape) in enumerate(zip(layout.names, shapes, strict=True)):
            param = held.get(name)
            if param is None:
                continue  # a buffer or a weight the layout binds by another path
            dtype = layout.dtype if layout.param_dtypes is None else layout.param_dtypes[i]
            if param.shape != shape or param.dtype != dtype:
                _fail(f"network parameter {name!r} is {param.dtype} of shape {tuple(param.shape)}, where the "
                      f"layout of θ0 records {dtype} of shape {tuple(shape)}")


def _check_posterior(state: dict) -> None:
    model = state.get("functional_model")
    lam, vectors = state.get("eigenvalues"), state.get("eigenvectors")
    if not isinstance(model, FunctionalModel) or not isinstance(lam, torch.Tensor) or not isinstance(vectors,
                                                                                                     torch.Tensor):
        _fail("posterior has no network binding or no eigenpairs")
    theta0 = model.theta0
    K = lam.shape[0] if lam.ndim == 1 else -1
    if vectors.ndim != 2 or tuple(vectors.shape) != (theta0.numel(), K):
        _fail(f"posterior's eigenvectors have shape {tuple(vectors.shape)} and its eigenvalues "
              f"{tuple(lam.shape)}, where {theta0.numel()} weights need ({theta0.numel()}, K) and (K,)")
    if not (lam.dtype == vectors.dtype == theta0.dtype and lam.device == vectors.device == theta0.device):
        _fail(f"posterior's eigenpairs are {lam.dtype} / {vectors.dtype} on {lam.device} / {vectors.device}, "
              f"where its weights are {theta0.dtype} on {theta0.device}")
    diag = state.get("_ggn_diag")  # the low-rank-plus-diagonal kind's GGN diagonal, one entry per weight
    if diag is not None and not (isinstance(diag, torch.Tensor) and tuple(diag.shape) == (theta0.numel(),)
                                 and diag.dtype == torch.float64 and diag.device == theta0.device):
        _fail(f"posterior's GGN diagonal is {getattr(diag, 'dtype', type(diag).__name__)} of shape "
              f"{tuple(getattr(diag, 'shape', ()))}, where {theta0.numel()} weights need a float64 vector of as many")
    lam64 = state.get("_lam64")
    if isinstance(lam64, np.ndarray) and lam64.shape != (K,):
        _fail(f"posterior's float64 eigenvalues have shape {lam64.shape}, where it holds {K} eigenpairs")


#: What the attributes of glas-sklearn's objects hold when they are set (None aside): by the owner's class (its own
#: or a base's import path, "*" for every glas-sklearn class), then the attribute's name. A reference or class index
#: edited to another object is refused here rather than failing inside a prediction.
ATTRIBUTE_TYPES = {
    "*": {"posterior_": ActiveSubspacePosterior, "likelihood_": Likelihood, "predictive_": PredictiveMode,
          "calibrator_": Calibrator, "conformity_score_": ConformityScore, "module_": nn.Module,
          "functional_model": FunctionalModel},
    "glas_sklearn.calibration.conformal.ConformalResult": {"conformity_score": ConformityScore},
    "glas_sklearn._functional.FunctionalModel": {"layout": ParameterLayout, "adapter": ModelAdapter,
                                                 "module": nn.Module, "theta0": torch.Tensor},
    "glas_sklearn.posterior._base.ActiveSubspacePosterior": {"functional_model": FunctionalModel,
                                                            "eigenvalues": torch.Tensor,
                                                            "eigenvectors": torch.Tensor},
    # the estimators' own pieces, by name (serialization does not import the estimators it reads)
    "glas_sklearn.estimators._base.LaplaceActiveSubspaceBase": {
        "_inputs": "glas_sklearn.estimators._data.InputEncoder",
        "_targets": ("glas_sklearn.estimators._data.TargetScaler", "glas_sklearn.estimators._data.LabelTargets"),
        "compute": "glas_sklearn.estimators._compute.Compute", "training": "glas_sklearn.training.settings.Training",
        "_noise_step": "glas_sklearn.estimators._likelihood_choice.NoiseStep"},
}


def _is_a(value, expected) -> bool:
    """Whether ``value`` is an instance of ``expected``: a class, an import path, or a tuple of import paths."""
    if isinstance(expected, type):
        return isinstance(value, expected)
    paths = (expected,) if isinstance(expected, str) else expected
    return any(f"{c.__module__}.{c.__qualname__}" in paths for c in type(value).__mro__)


def _check_attribute_types(cls: type, state: dict) -> None:
    owners = {f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__} | {"*"}
    for owner, table in ATTRIBUTE_TYPES.items():
        if owner not in owners:
            continue
        for name, expected in table.items():
            value = state.get(name)
            if value is not None and not _is_a(value, expected):
                wanted = (expected.__qualname__ if isinstance(expected, type) else
                          " or ".join(p.rsplit(".", 1)[-1] for p in ((expected,) if isinstance(expected, str)
                                                                      else expected)))
                _fail(f"{cls.__qualname__} holds a {type(value).__module__}.{type(value).__qualname__} as {name}, "
                      f"where a {wanted} belongs")


def _check_layer(cls: type, state: dict) -> None:
    """A torch.nn built-in layer's state holds the settings its class declares (``__constants__``: a Linear's
    in_features and out_features): a class index edited to another layer is refused."""
    missing = sorted(set(getattr(cls, "__constants__", ())) - set(state))
    if missing:
        _fail(f"{cls.__module__}.{cls.__qualname__} has no {missing}, which every such layer holds")
    reference = _default_layer(cls)
    if reference is not None:  # a layer made without arguments (an activation, Dropout, Identity): the same fields
        for field in ("_parameters", "_buffers"):
            held = state.get(field)
            if isinstance(held, dict) and set(held) != set(reference[field]):
                _fail(f"{cls.__module__}.{cls.__qualname__} holds the {field.strip('_')} {sorted(held)}, where "
                      f"such a layer has {sorted(reference[field])}")
        extra = sorted(k for k in state if not k.startswith("_") and k not in reference["public"])
        if extra:
            _fail(f"{cls.__module__}.{cls.__qualname__} holds the settings {extra}, which such a layer has not")


@functools.lru_cache(maxsize=None)
def _default_layer(cls: type) -> dict | None:
    """The fields of a torch.nn built-in layer made with no arguments, on the meta device (None when it needs
    arguments)."""
    try:
        with torch.device("meta"), warnings.catch_warnings():  # no memory for its weights (nn.Transformer())
            warnings.simplefilter("ignore")
            layer = cls()
    except Exception:  # noqa: BLE001 - a layer that needs arguments (Linear) or cannot be made here
        return None
    return {"_parameters": frozenset(layer._parameters), "_buffers": frozenset(layer._buffers),
            "public": frozenset(k for k in vars(layer) if not k.startswith("_"))}


def check_state(cls: type, state) -> None:
    """Before an object of ``cls`` is given ``state``: the types of its known attributes (for glas-sklearn's own
    classes), a network binding's and a posterior's state checked as described above (so that their
    ``__setstate__`` never computes on inconsistent tensors)."""
    if not isinstance(state, dict):
        return
    if cls.__module__.startswith("glas_sklearn."):
        _check_attribute_types(cls, state)
    elif cls.__module__.startswith("torch.nn.modules.") and issubclass(cls, nn.Module):
        _check_layer(cls, state)
    if issubclass(cls, FunctionalModel):
        _check_functional(state)
    elif issubclass(cls, ActiveSubspacePosterior):
        _check_posterior(state)
