"""One G v product: through each mini-batch's cached linearisation (its forward graph and the transposed,
double-backward graph, kept between products when they fit the memory budget) or streamed (a fresh forward-mode
JVP and a VJP per product)."""

from __future__ import annotations

import logging
import os

import torch
import torch.autograd.forward_ad as fwAD

from .._functional import FunctionalModel, forward_ad_section
from .._warnings import warn
from ..likelihoods import Likelihood
from ._records import RecordBatches, cells, record_weight

__all__ = ["Linearization", "available_memory"]

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


class Linearization:
    """G v for one vector, cached or streamed, over the mini-batches of one bound model.

    Parameters
    ----------
    functional_model : FunctionalModel
        The model bound as a function of its weights.
    likelihood : Likelihood
        Gives the output Hessian products H_n u.
    records : RecordBatches
        The mini-batches with their record weights, the total weight and ``trim_padding``.
    reuse : bool or "auto"
        Keep each mini-batch's forward graph and its transposed graph between products (True), stream a fresh JVP
        and VJP per product (False), or reuse while the cache fits the memory budget ("auto").

    Attributes
    ----------
    use_cache : bool or None
        Whether products go through the cached graphs; None until the first product (or :meth:`uses_cache`) decides.
    """

    def __init__(self, functional_model: FunctionalModel, likelihood: Likelihood, records: RecordBatches,
                 reuse: bool | str) -> None:
        self.functional_model, self.likelihood, self.reuse = functional_model, likelihood, reuse
        self.batches, self.total_weight, self.trim_padding = records.batches, records.total_weight, records.trim_padding
        self.cache: list | None = None
        self.use_cache: bool | None = None

    def uses_cache(self) -> bool:
        """Whether products go through the cached linearisation (decided, and the cache built, on the first call)."""
        if self.use_cache is None:
            self.use_cache = self._decide_cache()
        return self.use_cache

    def release(self) -> None:
        """Drop the cached linearisation (it is rebuilt on the next product)."""
        self.cache = None
        self.use_cache = None

    def saved_bytes_first_batch(self) -> int:
        """Bytes the autograd graph of a forward pass over the first mini-batch saves."""
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        fm = self.functional_model
        leaves = {n: p.detach().requires_grad_() for n, p in fm.params0.items()}
        with fm.autodiff(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fm(self.batches[0][0], leaves)
        return total

    def _estimate_cache_bytes(self) -> int:
        """Bytes the autograd graph of the first mini-batch saves, times 3 (forward + transposed graph),
        scaled to all mini-batches by their number of input cells (rows × positions)."""
        first = cells(self.batches[0][0], self.trim_padding)
        return int(3 * self.saved_bytes_first_batch() * sum(cells(xb, self.trim_padding) for xb, _ in self.batches)
                   / first)

    def _build_cache(self) -> list:
        """Per mini-batch: the output graph at θ0 and the transposed graph u ↦ Jᵀu (kept for J v)."""
        cache = []
        fm = self.functional_model
        with fm.autodiff():
            for xb, mb in self.batches:
                leaves = [p.detach().requires_grad_() for p in fm.params0.values()]
                out = fm(xb, dict(zip(fm.layout.names, leaves, strict=True)))
                dummy = torch.zeros_like(out, requires_grad=True)
                grads = torch.autograd.grad(out, leaves, dummy, create_graph=True, allow_unused=True)
                live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
                cache.append((out, leaves, dummy, [grads[i] for i in live], live,
                              record_weight(mb, out, self.total_weight)))
        return cache

    def _decide_cache(self) -> bool:
        if self.reuse == "auto":
            need = self._estimate_cache_bytes()
            budget = available_memory(self.functional_model.device)
            use = need <= budget
            logger.debug("GGN cache needs ≈%.1f MiB of %.1f MiB budget: reuse=%s", need / 2**20, budget / 2**20, use)
        else:
            use = bool(self.reuse)
        if use:
            try:
                self.cache = self._build_cache()
            except RuntimeError as err:  # e.g. a layer without double backward (cuDNN RNNs)
                self.cache = None
                if self.reuse is True:
                    warn(f"Cannot reuse the linearisation ({err}); streaming JVP+VJP instead. "
                         "reuse_linearization='auto' (or False) chooses the streaming products without this "
                         "warning.", RuntimeWarning)
                use = False
        return use

    def _product_cached(self, tangents: list) -> torch.Tensor:
        fm = self.functional_model
        result = torch.zeros(fm.layout.size, dtype=fm.dtype, device=fm.device)
        with fm.autodiff():
            for out, leaves, dummy, grads, live, weight in self.cache:
                jv = torch.autograd.grad(grads, dummy, [tangents[i] for i in live],
                                         retain_graph=True, allow_unused=True)[0]
                if jv is None:  # the output does not depend on the weights at all
                    continue
                hjv = self.likelihood.output_hessian_product(out.detach(), jv) * weight
                vjp = torch.autograd.grad(out, leaves, hjv, retain_graph=True, allow_unused=True)
                result += fm.layout.flatten([torch.zeros_like(p) if g is None else g
                                             for g, p in zip(vjp, leaves, strict=True)])
        return result

    def _product_streamed(self, tangents: list) -> torch.Tensor:
        fm = self.functional_model
        result = torch.zeros(fm.layout.size, dtype=fm.dtype, device=fm.device)
        with fm.autodiff():
            for xb, mb in self.batches:
                leaves = [p.detach().requires_grad_() for p in fm.params0.values()]
                with forward_ad_section(), fwAD.dual_level():
                    duals = {n: fwAD.make_dual(p, t)
                             for n, p, t in zip(fm.layout.names, leaves, tangents, strict=True)}
                    primal, jv = fwAD.unpack_dual(fm(xb, duals))
                if jv is None:
                    continue
                hjv = self.likelihood.output_hessian_product(primal.detach(), jv.detach()) \
                    * record_weight(mb, primal, self.total_weight)
                vjp = torch.autograd.grad(primal, leaves, hjv, allow_unused=True)
                result += fm.layout.flatten([torch.zeros_like(p) if g is None else g
                                             for g, p in zip(vjp, leaves, strict=True)])
        return result

    def product(self, v: torch.Tensor) -> torch.Tensor:
        """G v for one vector v of length D: the cached or the streamed path."""
        tangents = list(self.functional_model.layout.unflatten(v).values())
        if self.uses_cache():
            return self._product_cached(tangents)
        return self._product_streamed(tangents)
