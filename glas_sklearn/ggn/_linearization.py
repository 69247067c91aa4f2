"""One G v product: through each mini-batch's cached linearisation (its forward graph and the transposed,
double-backward graph, kept between products when they fit the memory budget) or streamed (a fresh forward-mode
JVP and a VJP per product)."""

from __future__ import annotations

import logging
import os

import torch
import torch.autograd.forward_ad as fwAD

from .._functional import forward_ad_section
from .._warnings import warn
from ._records import cells, record_weight

__all__ = ["SingleProductMixin", "available_memory"]

logger = logging.getLogger("glas_sklearn.ggn")


def available_memory(device: torch.device) -> int:
    """Bytes that may be spent on cached linearisations: half the free device memory on CUDA,
    a quarter of the available RAM otherwise."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 4
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 2 * 1024**3


class SingleProductMixin:
    """G v for one vector, cached or streamed (``reuse_linearization``), for
    :class:`~glas_sklearn.ggn.GGNOperator` (which provides the bound model, the likelihood, the mini-batches
    ``_batches`` with their record weights, and the cache state ``_cache`` / ``_use_cache``)."""

    def _saved_bytes_first_batch(self) -> int:
        """Bytes the autograd graph of a forward pass over the first mini-batch saves."""
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        fm = self.functional_model
        leaves = {n: p.detach().requires_grad_() for n, p in fm.params0.items()}
        with fm.autodiff(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fm(self._batches[0][0], leaves)
        return total

    def _estimate_cache_bytes(self) -> int:
        """Bytes the autograd graph of the first mini-batch saves, times 3 (forward + transposed graph),
        scaled to all mini-batches by their number of input cells (rows × positions)."""
        first = cells(self._batches[0][0], self.trim_padding)
        return int(3 * self._saved_bytes_first_batch() * sum(cells(xb, self.trim_padding) for xb, _ in self._batches)
                   / first)

    def _build_cache(self) -> list:
        """Per mini-batch: the output graph at θ0 and the transposed graph u ↦ Jᵀu (kept for J v)."""
        cache = []
        fm = self.functional_model
        with fm.autodiff():
            for xb, mb in self._batches:
                leaves = [p.detach().requires_grad_() for p in fm.params0.values()]
                out = fm(xb, dict(zip(self.layout.names, leaves, strict=True)))
                dummy = torch.zeros_like(out, requires_grad=True)
                grads = torch.autograd.grad(out, leaves, dummy, create_graph=True, allow_unused=True)
                live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
                cache.append((out, leaves, dummy, [grads[i] for i in live], live,
                              record_weight(mb, out, self.total_weight)))
        return cache

    def _decide_cache(self) -> bool:
        if self.reuse_linearization == "auto":
            need = self._estimate_cache_bytes()
            budget = available_memory(self.device)
            use = need <= budget
            logger.debug("GGN cache needs ≈%.1f MiB of %.1f MiB budget: reuse=%s", need / 2**20, budget / 2**20, use)
        else:
            use = bool(self.reuse_linearization)
        if use:
            try:
                self._cache = self._build_cache()
            except RuntimeError as err:  # e.g. a layer without double backward (cuDNN RNNs)
                self._cache = None
                if self.reuse_linearization is True:
                    warn(f"Cannot reuse the linearisation ({err}); streaming JVP+VJP instead. "
                         "reuse_linearization='auto' (or False) chooses the streaming products without this "
                         "warning.", RuntimeWarning)
                use = False
        return use

    def _product_cached(self, tangents: list) -> torch.Tensor:
        result = torch.zeros(self.layout.size, dtype=self.dtype, device=self.device)
        with self.functional_model.autodiff():
            for out, leaves, dummy, grads, live, weight in self._cache:
                jv = torch.autograd.grad(grads, dummy, [tangents[i] for i in live],
                                         retain_graph=True, allow_unused=True)[0]
                if jv is None:  # the output does not depend on the weights at all
                    continue
                hjv = self.likelihood.output_hessian_product(out.detach(), jv) * weight
                vjp = torch.autograd.grad(out, leaves, hjv, retain_graph=True, allow_unused=True)
                result += self.layout.flatten([torch.zeros_like(p) if g is None else g
                                               for g, p in zip(vjp, leaves, strict=True)])
        return result

    def _product_streamed(self, tangents: list) -> torch.Tensor:
        result = torch.zeros(self.layout.size, dtype=self.dtype, device=self.device)
        fm = self.functional_model
        with fm.autodiff():
            for xb, mb in self._batches:
                leaves = [p.detach().requires_grad_() for p in fm.params0.values()]
                with forward_ad_section(), fwAD.dual_level():
                    duals = {n: fwAD.make_dual(p, t)
                             for n, p, t in zip(self.layout.names, leaves, tangents, strict=True)}
                    primal, jv = fwAD.unpack_dual(fm(xb, duals))
                if jv is None:
                    continue
                hjv = self.likelihood.output_hessian_product(primal.detach(), jv.detach()) \
                    * record_weight(mb, primal, self.total_weight)
                vjp = torch.autograd.grad(primal, leaves, hjv, allow_unused=True)
                result += self.layout.flatten([torch.zeros_like(p) if g is None else g
                                               for g, p in zip(vjp, leaves, strict=True)])
        return result

    def _product(self, v: torch.Tensor) -> torch.Tensor:
        """G v for one vector v of length D: the cached or the streamed path."""
        if self._use_cache is None:
            self._use_cache = self._decide_cache()
        tangents = list(self.layout.unflatten(v).values())
        self.n_products += 1
        if self._use_cache:
            return self._product_cached(tangents)
        return self._product_streamed(tangents)
