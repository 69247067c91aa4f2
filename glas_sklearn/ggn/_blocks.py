"""A block G V of k ≥ 2 vectors in one pass per mini-batch: the forward pass once, the k JVPs and VJPs
vectorised with ``torch.func.vmap`` in memory-bounded chunks of columns (``vectorize_blocks``)."""

from __future__ import annotations

import torch
from torch.func import jvp, vjp, vmap

from .._functional import forward_ad_section
from ._linearization import available_memory
from ._records import cells, record_weight

__all__ = ["BlockProductMixin"]

# Memory for one vectorised block product (tangents, results and the batched activations of a mini-batch);
# larger blocks are split into chunks of columns that fit it.
_BLOCK_BYTES = 1 << 30
# vectorize_blocks="auto" on the CPU: columns with more bytes of work than this go one by one (with the cached
# linearisation, respectively streamed), where measured single products are as fast as the vectorised block.
_VECTORIZE_MAX_COLUMN_BYTES = {"cached": 8 << 20, "streamed": 32 << 20}


class BlockProductMixin:
    """Vectorised block products for :class:`~glas_sklearn.ggn.GGNOperator` (which provides the bound model,
    the likelihood, the mini-batches, ``vectorize_blocks`` and, from
    :class:`~glas_sklearn.ggn._linearization.SingleProductMixin`, the cache decision and the activation bytes)."""

    def _vectorize(self) -> bool:
        """Whether blocks go the vectorised way (``vectorize_blocks``, "auto" resolved)."""
        if self.vectorize_blocks != "auto":
            return bool(self.vectorize_blocks)
        if self.device.type != "cpu":
            return True
        if self._use_cache is None:
            self._use_cache = self._decide_cache()
        limit = _VECTORIZE_MAX_COLUMN_BYTES["cached" if self._use_cache else "streamed"]
        return self._per_column_bytes() <= limit

    def _per_column_bytes(self) -> int:
        """Bytes a vectorised block needs per column (see :meth:`_block_columns`), measured once."""
        if self._column_bytes is None:
            first = cells(self._batches[0][0], self.trim_padding)
            largest = max(cells(xb, self.trim_padding) for xb, _ in self._batches)
            activations = self._saved_bytes_first_batch() * largest / first
            element = torch.empty((), dtype=self.dtype).element_size()
            self._column_bytes = int(3 * self.layout.size * element + 3 * activations) + 1
        return self._column_bytes

    def _block_columns(self, k: int) -> int:
        """Columns per vectorised chunk: per column, three D-vectors (tangent, result, its parts) and three times
        the activations of the largest mini-batch (primal tangents forward, cotangents backward), within
        ``_BLOCK_BYTES`` and half the memory budget of the device."""
        budget = min(_BLOCK_BYTES, available_memory(self.device) // 2)
        return int(max(1, min(k, budget // self._per_column_bytes())))

    def _product_block(self, V: torch.Tensor) -> torch.Tensor:
        """G V for a D×k block in one pass per mini-batch: the forward pass once, the k JVPs (forward mode)
        and the k VJPs vectorised over the columns with ``torch.func.vmap``."""
        k = V.shape[1]
        fm = self.functional_model
        tangents = self.layout.unflatten_rows(V.T)
        result = torch.zeros(k, self.layout.size, dtype=self.dtype, device=self.device)
        with fm.autodiff():
            for xb, mb in self._batches:
                def f(params, xb=xb):
                    return fm(xb, params)

                primal, pullback = vjp(f, fm.params0)
                with forward_ad_section():  # torch's forward-mode state is per process
                    jv = vmap(lambda t, f=f: jvp(f, (fm.params0,), (t,))[1])(tangents)
                # H_n at every column's tangent: the output broadcast (a view) to the block's shape (k, *out)
                hjv = self.likelihood.output_hessian_product(primal.detach().expand_as(jv), jv) \
                    * record_weight(mb, primal, self.total_weight)
                (grads,) = vmap(pullback)(hjv)
                result += torch.cat([grads[n].reshape(k, -1) for n in self.layout.names], dim=1)
        return result.T.contiguous()
