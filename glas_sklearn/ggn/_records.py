"""What the GGN sums over: the operator's rows checked (targets, padding mask, ``sample_weight``, ``subsample``,
``trim_padding``), the weight of every record (w_n / Σ w, 0 at padding) and the mini-batches of rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._checks import check_positive_int, check_sample_weight, numpy_rng
from .._functional import FunctionalModel

__all__ = ["RecordBatches", "cells", "record_batches", "record_weight"]


@dataclass
class RecordBatches:
    """The records a :class:`~glas_sklearn.ggn.GGNOperator` averages over, cut into mini-batches.

    Attributes
    ----------
    batches : list of tuple
        (inputs, record weights) per mini-batch; the weights are the mask, the rows' weights or their product,
        None when every record counts once.
    n_records : int
        Records of positive weight (unmasked positions for sequence outputs).
    total_weight : float
        Σ_n w_n over the records (``n_records`` without ``sample_weight``).
    output_shape : tuple of int
        The model's per-record output shape, e.g. (M,) or (T, M).
    indices : numpy.ndarray or None
        The sorted rows drawn by ``subsample``; None when every row is used.
    batch_size : int or None
        Rows per mini-batch (None: all at once).
    trim_padding : bool
        Whether the mini-batches are length-sorted and cut after their last real position.
    """

    batches: list
    n_records: int
    total_weight: float
    output_shape: tuple
    indices: np.ndarray | None
    batch_size: int | None
    trim_padding: bool


def record_batches(fm: FunctionalModel, X: torch.Tensor, y: torch.Tensor | None, mask: torch.Tensor | None,
                   sample_weight, *, batch_size: int | None, subsample: int | None, random_state,
                   trim_padding: bool) -> RecordBatches:
    """The rows ``X`` of the model ``fm`` checked (with ``y``, ``mask`` and ``sample_weight`` against them),
    subsampled and cut into mini-batches with their record weights (the arguments as
    :class:`~glas_sklearn.ggn.GGNOperator` takes them)."""
    X = fm.check_inputs(X, "X")
    n_rows = X.shape[0]
    if y is not None:
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}.")
        if y.shape[0] != n_rows:
            raise ValueError(f"X has {n_rows} rows but y has {y.shape[0]}; they must match.")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("mask must be a boolean torch.Tensor (True at real tokens, False at padding).")
        if mask.device != fm.device:
            raise ValueError(f"mask is on {mask.device}, but the model lives on {fm.device}.")
        if mask.shape[0] != n_rows:
            raise ValueError(f"mask has {mask.shape[0]} rows but X has {n_rows}; they must match.")
    weight = check_sample_weight(sample_weight, n_rows, fm.device)
    if not isinstance(trim_padding, (bool, np.bool_)):
        raise ValueError(f"trim_padding must be True or False, got {trim_padding!r}.")
    if trim_padding and (mask is None or X.ndim < 2 or tuple(X.shape[:2]) != tuple(mask.shape)):
        raise ValueError("trim_padding=True needs the padding mask (mask=...) with X's first two axes equal to "
                         f"the mask's; got X {tuple(X.shape)} and mask "
                         f"{None if mask is None else tuple(mask.shape)}.")
    trim_padding = bool(trim_padding)
    batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
    subsample = check_positive_int("subsample", subsample, allow_none=True)
    indices = None
    if subsample is not None:
        if subsample > n_rows:
            raise ValueError(f"subsample={subsample} is larger than the {n_rows} rows available.")
        indices = np.sort(numpy_rng(random_state).choice(n_rows, size=subsample, replace=False))
        idx_t = torch.as_tensor(indices, device=X.device)
        X = X[idx_t]
        mask = None if mask is None else mask[idx_t]
        weight = None if weight is None else weight[idx_t]

    output_shape = fm.output_shape(X)
    if len(output_shape) < 1:
        raise ValueError("The model must return a tensor of shape (n, M) or (n, T, M); got one of shape (n,).")
    if mask is not None and tuple(mask.shape[1:]) != output_shape[:-1]:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, but the model's output has shape "
            f"(n, {', '.join(map(str, output_shape))}); the mask must be (n, "
            f"{', '.join(map(str, output_shape[:-1]))})."
        )
    records = mask  # per record (n, *output_shape[:-1]): the mask, times the row's weight
    if weight is not None:
        rows = weight.reshape(-1, *([1] * (len(output_shape) - 1)))
        records = rows.expand(-1, *output_shape[:-1]) if mask is None else rows * mask
    if records is None:
        n_records = int(X.shape[0] * math.prod(output_shape[:-1]))
        total_weight = float(n_records)
    else:
        n_records = int(torch.count_nonzero(records))
        total_weight = float(records.sum(dtype=torch.float64))
    if n_records == 0:
        raise ValueError("The mask leaves no record: every position is padding." if weight is None else
                         "sample_weight is zero at every unmasked record; at least one needs a positive weight.")
    batches = _mini_batches(X, mask, records, batch_size, trim_padding)
    return RecordBatches(batches, n_records, total_weight, output_shape, indices, batch_size, trim_padding)


def _mini_batches(X: torch.Tensor, mask: torch.Tensor | None, records: torch.Tensor | None,
                  batch_size: int | None, trim_padding: bool) -> list:
    """(inputs, record weights) per mini-batch (the weights: the mask, the rows' weights or their product;
    None when every record counts once): views of consecutive rows, or with ``trim_padding`` length-sorted
    rows cut after the batch's last real position (batches of padding only are dropped)."""
    n = X.shape[0]
    size = batch_size or n
    if not trim_padding:
        return [(X[i:i + size], None if records is None else records[i:i + size]) for i in range(0, n, size)]
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    needed = (mask * positions).amax(dim=1)  # columns up to the last real position of each row
    order = torch.argsort(needed.cpu(), stable=True).to(mask.device)
    batches = []
    for i in range(0, n, size):
        rows = order[i:i + size]
        t = int(needed[rows].max())
        if t > 0:
            batches.append((X[rows][:, :t], records[rows][:, :t]))
    return batches


def record_weight(records: torch.Tensor | None, out: torch.Tensor, total_weight: float) -> torch.Tensor:
    """w_n / Σ w at every record of a mini-batch (1/N without weights, 0 at padding), broadcastable against
    its outputs ``out``."""
    if records is None:
        return torch.full((1,) * out.ndim, 1.0 / total_weight, dtype=out.dtype, device=out.device)
    return (records.to(out.dtype) / total_weight).unsqueeze(-1)


def cells(x: torch.Tensor, trim_padding: bool) -> int:
    """Input cells of a mini-batch: rows, times positions with ``trim_padding`` (whose batches differ in length)."""
    return x.shape[0] * (x.shape[1] if trim_padding else 1)
