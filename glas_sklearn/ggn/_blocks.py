"""A block G V of k ≥ 2 vectors in one pass per mini-batch: the forward pass once, the k JVPs and VJPs
vectorised with ``torch.func.vmap`` in memory-bounded chunks of columns (``vectorize_blocks``)."""

from __future__ import annotations

import torch
from torch.func import jvp, vjp, vmap

from .._functional import FunctionalModel, forward_ad_section
from ..likelihoods import Likelihood
from ._linearization import Linearization, available_memory
from ._records import RecordBatches, cells, record_weight

__all__ = ["BlockProducts"]

# Memory for one vectorised block product (tangents, results and the batched activations of a mini-batch);
# larger blocks are split into chunks of columns that fit it.
_BLOCK_BYTES = 1 << 30
# vectorize_blocks="auto" on the CPU: columns with more bytes of work than this go one by one (with the cached
# linearisation, respectively streamed), where measured single products are as fast as the vectorised block.
_VECTORIZE_MAX_COLUMN_BYTES = {"cached": 8 << 20, "streamed": 32 << 20}


class BlockProducts:
    """Vectorised block products G V over the mini-batches of one bound model.

    Parameters
    ----------
    functional_model : FunctionalModel
        The model bound as a function of its weights.
    likelihood : Likelihood
        Gives the output Hessian products H_n u.
    records : RecordBatches
        The mini-batches with their record weights, the total weight and ``trim_padding``.
    vectorize : bool or "auto"
        ``vectorize_blocks`` of :class:`~glas_sklearn.ggn.GGNOperator`.
    linearization : Linearization
        The single products, asked whether they go through the cache and how many bytes a forward pass saves.

    Attributes
    ----------
    column_bytes : int or None
        Bytes a vectorised block needs per column, measured on the first call of :meth:`columns` or
        :meth:`vectorize`.
    """

    def __init__(self, functional_model: FunctionalModel, likelihood: Likelihood, records: RecordBatches,
                 vectorize: bool | str, linearization: Linearization) -> None:
        self.functional_model, self.likelihood, self.vectorize_blocks = functional_model, likelihood, vectorize
        self.batches, self.total_weight, self.trim_padding = records.batches, records.total_weight, records.trim_padding
        self.linearization = linearization
        self.column_bytes: int | None = None

    def vectorize(self) -> bool:
        """Whether blocks go the vectorised way (``vectorize_blocks``, "auto" resolved)."""
        if self.vectorize_blocks != "auto":
            return bool(self.vectorize_blocks)
        if self.functional_model.device.type != "cpu":
            return True
        limit = _VECTORIZE_MAX_COLUMN_BYTES["cached" if self.linearization.uses_cache() else "streamed"]
        return self.per_column_bytes() <= limit

    def per_column_bytes(self) -> int:
        """Bytes a vectorised block needs per column (see :meth:`columns`), measured once."""
        if self.column_bytes is None:
            first = cells(self.batches[0][0], self.trim_padding)
            largest = max(cells(xb, self.trim_padding) for xb, _ in self.batches)
            activations = self.linearization.saved_bytes_first_batch() * largest / first
            element = torch.empty((), dtype=self.functional_model.dtype).element_size()
            self.column_bytes = int(3 * self.functional_model.layout.size * element + 3 * activations) + 1
        return self.column_bytes

    def columns(self, k: int) -> int:
        """Columns per vectorised chunk: per column, three D-vectors (tangent, result, its parts) and three times
        the activations of the largest mini-batch (primal tangents forward, cotangents backward), within
        ``_BLOCK_BYTES`` and half the memory budget of the device."""
        budget = min(_BLOCK_BYTES, available_memory(self.functional_model.device) // 2)
        return int(max(1, min(k, budget // self.per_column_bytes())))

    def product(self, V: torch.Tensor) -> torch.Tensor:
        """G V for a D×k block in one pass per mini-batch: the forward pass once, the k JVPs (forward mode)
        and the k VJPs vectorised over the columns with ``torch.func.vmap``."""
        k = V.shape[1]
        fm = self.functional_model
        layout = fm.layout
        tangents = layout.unflatten_rows(V.T)
        result = torch.zeros(k, layout.size, dtype=fm.dtype, device=fm.device)
        with fm.autodiff():
            for xb, mb in self.batches:
                def f(params, xb=xb):
                    return fm(xb, params)

                primal, pullback = vjp(f, fm.params0)
                with forward_ad_section():  # torch's forward-mode state is per process
                    jv = vmap(lambda t, f=f: jvp(f, (fm.params0,), (t,))[1])(tangents)
                # H_n at every column's tangent: the output broadcast (a view) to the block's shape (k, *out)
                hjv = self.likelihood.output_hessian_product(primal.detach().expand_as(jv), jv) \
                    * record_weight(mb, primal, self.total_weight)
                (grads,) = vmap(pullback)(hjv)
                result += torch.cat([grads[n].reshape(k, -1) for n in layout.names], dim=1)
        return result.T.contiguous()
