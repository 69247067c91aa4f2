"""The loaded state checked against what the estimators' computations expect of it: every tensor a view that
covers distinct bytes (no edited stride makes two entries share one), a network binding's flat weights θ0 of the
layout's size and dtype and the network's parameters of the layout's shapes, a posterior's eigenpairs of the shapes
and dtype of its weights. A file edited consistently (checksums recomputed) is refused here, naming what does not
fit, rather than failing later inside torch or predicting other numbers."""

from __future__ import annotations

import math

import numpy as np
import torch

from .._functional import FunctionalModel, ParameterLayout
from ..posterior import ActiveSubspacePosterior
from ._format import ModelFileError

__all__ = ["check_loaded", "check_tensor_layout"]


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


def _check_functional(model: FunctionalModel) -> None:
    layout = getattr(model, "layout", None)
    theta0 = getattr(model, "theta0", None)
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
    module = getattr(model, "module", None)
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


def _check_posterior(posterior: ActiveSubspacePosterior) -> None:
    model = getattr(posterior, "functional_model", None)
    lam, vectors = getattr(posterior, "eigenvalues", None), getattr(posterior, "eigenvectors", None)
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
    lam64 = getattr(posterior, "_lam64", None)
    if isinstance(lam64, np.ndarray) and lam64.shape != (K,):
        _fail(f"posterior's float64 eigenvalues have shape {lam64.shape}, where it holds {K} eigenpairs")


def check_loaded(made: list) -> None:
    """Every network binding (first) and posterior among the objects a load made, checked as described above."""
    for obj in made:
        if isinstance(obj, FunctionalModel):
            _check_functional(obj)
    for obj in made:
        if isinstance(obj, ActiveSubspacePosterior):
            _check_posterior(obj)
