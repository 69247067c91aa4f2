"""The evaluation engine of the posterior: the network at many weight vectors, JVPs along many tangents, Jacobian
projections J P and per-record Jacobians, with their caches, in memory-bounded chunks.

:class:`PosteriorEvaluation` is a mixin of :class:`~glas_sklearn.posterior.ActiveSubspacePosterior`: it holds no
posterior state and works for every posterior kind. Weight vectors are evaluated with ``torch.func.vmap`` over
``functional_call`` where the model allows it (a loop otherwise, remembered per path); the user's model is never
written into.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import threading

import numpy as np
import torch
from torch.func import jvp, vmap

from .._checks import check_positive_int
from .._functional import BoundModel, forward_ad_section

__all__ = ["PosteriorEvaluation", "memory_budget"]

logger = logging.getLogger(__name__)

# Memory bounds for batched evaluation: weight rows (chunk × D) per chunk, and (chunk × input rows)
# network evaluations per vectorised call.
_WEIGHT_CHUNK_BYTES = 128 * 2**20
_MAX_BATCHED_ROWS = 2**16
# Weights per block when θ0 + z basis is formed single-threaded (see PosteriorEvaluation._form_weights).
_FORM_BLOCK = 2**14
# Bytes of activations counted per network evaluation (one input row at one weight vector) under a memory budget.
_BYTES_PER_EVALUATION = 1024

_BUDGET = threading.local()


@contextlib.contextmanager
def memory_budget(max_bytes: int, bytes_per_evaluation: int = _BYTES_PER_EVALUATION):
    """Within the block, the calling thread's posterior evaluations (weight chunks, vectorised forwards and JVPs,
    per-record Jacobian chunks) hold at most about ``max_bytes`` at once (the defaults, 128 MiB of weight rows and
    2¹⁶ evaluations per vectorised call, when larger), counting ``bytes_per_evaluation`` of activations per network
    evaluation (one input row at one weight vector). Per thread: other threads keep their own budget."""
    previous = getattr(_BUDGET, "bytes", None), getattr(_BUDGET, "per_evaluation", None)
    _BUDGET.bytes = int(max_bytes) if previous[0] is None else min(int(max_bytes), previous[0])
    _BUDGET.per_evaluation = max(1, int(bytes_per_evaluation))
    try:
        yield
    finally:
        _BUDGET.bytes, _BUDGET.per_evaluation = previous


def _weight_chunk_bytes() -> int:
    budget = getattr(_BUDGET, "bytes", None)
    return _WEIGHT_CHUNK_BYTES if budget is None else max(1, min(_WEIGHT_CHUNK_BYTES, budget // 2))


def _jacobian_chunk_bytes() -> int:
    # a chunk of float64 per-record Jacobians comes with about four times its size in temporaries (the per-weight
    # Jacobians in the model's dtype, their concatenation, the float64 copy, the squares)
    budget = getattr(_BUDGET, "bytes", None)
    return _WEIGHT_CHUNK_BYTES if budget is None else max(1, min(_WEIGHT_CHUNK_BYTES, budget // 8))


def _max_batched_rows() -> int:
    budget = getattr(_BUDGET, "bytes", None)
    if budget is None:
        return _MAX_BATCHED_ROWS
    return max(1, min(_MAX_BATCHED_ROWS, budget // 2 // getattr(_BUDGET, "per_evaluation", _BYTES_PER_EVALUATION)))


class PosteriorEvaluation(BoundModel):
    """Forwards at weight rows, JVPs, Jacobian projections and per-record Jacobians of a bound model.

    The host class sets ``functional_model`` and ``eigenvectors`` (D, K) and calls :meth:`_init_evaluation` in its
    constructor. The cache of Jacobian quantities (J P, J Jᵀ and, when
    ``_keep_record_jacobians`` is set and they fit in one chunk, the per-record Jacobians) belongs to the last
    ``X`` seen by the calling thread (the same tensor object, unmodified); it does not depend on the prior, is
    kept per thread (threads sharing a posterior never see each other's), and is not pickled.
    :meth:`release_cache` drops the calling thread's.
    """

    eigenvectors: torch.Tensor
    # Keep the per-record Jacobians of the last X in the cache (for kinds that use them at every d).
    _keep_record_jacobians = False
    # Kinds whose output covariance needs the per-record Jacobians anyway take J P from them too (J P_K in the same
    # pass, and J Jᵀ's diagonal beside it), instead of K forward-mode JVPs: no forward-mode AD, whose state torch
    # keeps per process (one thread at a time), at predict time.
    _projections_from_jacobians = False

    def _init_evaluation(self) -> None:
        self._vmap_forward_ok: bool | None = None
        self._vmap_jvp_ok: bool | None = None
        self._vmap_jac_ok: bool | None = None
        self._local = threading.local()

    @property
    def _jp_cache(self) -> dict | None:
        """The calling thread's cache of Jacobian quantities (None before its first use)."""
        return getattr(self._local, "cache", None)

    def release_cache(self) -> None:
        """Drop the calling thread's cache of Jacobian quantities (its last inputs and their J P, J Jᵀ)."""
        self._local.cache = None

    @property
    def n_weights(self) -> int:
        """D, the number of trainable weights."""
        return self.layout.size

    @property
    def max_components(self) -> int:
        """K, the number of eigenvectors: the largest subspace dimension d available."""
        return int(self.eigenvectors.shape[1])

    def _check_X(self, X) -> torch.Tensor:
        return self.functional_model.check_inputs(X, "X")

    def _check_d(self, d) -> int:
        K = self.max_components
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise ValueError(f"d must be an integer between 1 and K = {K}, got {d!r}.")
        if not 1 <= d <= K:
            raise ValueError(
                f"d must be between 1 and K = {K} (the number of eigenpairs given), got {d}; "
                "compute more eigenpairs to use a larger subspace."
            )
        return int(d)

    # ------------------------------------------------------------------ chunking
    def _row_batches(self, n: int, batch_size: int | None) -> list[slice]:
        size = batch_size or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _chunk(self, rows: int, total: int, X: torch.Tensor | None = None) -> int:
        """How many weight vectors to evaluate together on ``rows`` inputs (memory-bounded; a row of token ids
        counts as its T positions, whose activations a sequence model holds)."""
        by_weights = _weight_chunk_bytes() // (self.n_weights * self.theta0.element_size())
        positions = math.prod(X.shape[1:]) if X is not None and not X.is_floating_point() else 1
        by_rows = _max_batched_rows() // max(rows * positions, 1)
        return int(max(1, min(total, by_weights, by_rows)))

    # ------------------------------------------------------------------ forwards
    def predict_mean(self, X: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """f(x; θ0), the trained network's output; shape ``(n, *out)``."""
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        f = self.functional_model
        with torch.no_grad():
            outs = [f(X[sl]) for sl in self._row_batches(X.shape[0], batch_size)]
        return torch.cat(outs, 0)

    def _forward_many(self, delta: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
        """f(Xb; θ0 + δ_s) for every row δ_s of ``delta`` (c, D): shape ``(c, nb, *out)``."""
        return self._forward_weights(self.theta0 + delta, Xb)

    def _forward_weights(self, weights: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
        """f(Xb; w_s) for every row w_s of ``weights`` (c, D) of whole weight vectors: shape ``(c, nb, *out)``."""
        f = self.functional_model
        batched = self.layout.unflatten_rows(weights)
        if self._vmap_forward_ok is not False:
            try:
                out = vmap(lambda p: f(Xb, p))(batched)
                self._vmap_forward_ok = True
                return out
            except Exception as err:  # noqa: BLE001 - any failure of the vectorised path falls back to a loop
                if self._vmap_forward_ok:
                    raise
                logger.debug("vmap over weight samples failed (%s); evaluating them one by one", err)
                self._vmap_forward_ok = False
        return torch.stack([f(Xb, {n: t[s] for n, t in batched.items()}) for s in range(weights.shape[0])])

    def _form_weights(self, z: torch.Tensor, basis: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """θ0 + z basis for a chunk of z (c, d), written into ``out`` (c, D).

        Single-threaded on the CPU, the product is taken in blocks of ``_FORM_BLOCK`` weights, whose slices
        of θ0, the basis and the output stay in cache (a third faster than one call for the 10⁶-weight
        concrete network); with several threads one call, as a small block per call costs a thread
        synchronisation each (measured up to 3× slower on a loaded 2-core machine).
        """
        if self.device.type != "cpu" or torch.get_num_threads() > 1 or self.n_weights <= _FORM_BLOCK:
            return torch.addmm(self.theta0, z, basis, out=out)
        for i in range(0, self.n_weights, _FORM_BLOCK):
            j = min(i + _FORM_BLOCK, self.n_weights)
            torch.addmm(self.theta0[i:j], z, basis[:, i:j], out=out[:, i:j])
        return out

    # ---------------------------------------------------------------------- JVPs
    def _jvp_many(self, tangents: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
        """J(Xb) t_k for every row t_k of ``tangents`` (c, D): shape ``(c, nb, *out)``.

        Forward mode, whose state torch keeps per process: one thread at a time (:func:`forward_ad_section`)."""
        fm = self.functional_model
        batched = self.layout.unflatten_rows(tangents)

        def f(params):
            return fm(Xb, params)

        with forward_ad_section(), fm.autodiff():
            if self._vmap_jvp_ok is not False:
                try:
                    out = vmap(lambda t: jvp(f, (fm.params0,), (t,))[1])(batched)
                    self._vmap_jvp_ok = True
                    return out.detach()
                except Exception as err:  # noqa: BLE001 - any failure of the vectorised path falls back to a loop
                    if self._vmap_jvp_ok:
                        raise
                    logger.debug("vmap over JVP tangents failed (%s); computing them one by one", err)
                    self._vmap_jvp_ok = False
            cols = []
            for k in range(tangents.shape[0]):
                with torch.autograd.forward_ad.dual_level():
                    duals = {n: torch.autograd.forward_ad.make_dual(p, batched[n][k])
                             for n, p in fm.params0.items()}
                    primal, tangent = torch.autograd.forward_ad.unpack_dual(fm(Xb, duals))
                cols.append(torch.zeros_like(primal) if tangent is None else tangent.detach())
            return torch.stack(cols)

    def _cache_for(self, X: torch.Tensor) -> dict:
        """The cache of Jacobian quantities for ``X`` (the same tensor object, unmodified), reset otherwise."""
        cache = self._jp_cache
        if cache is None or cache["X"] is not X or cache["version"] != X._version:
            cache = self._local.cache = {"X": X, "version": X._version, "JP": None}
        return cache

    def jacobian_projections(self, X: torch.Tensor, d: int, batch_size: int | None = None) -> torch.Tensor:
        """J(x) p_j for j ≤ d by forward-mode JVPs (kinds with ``_projections_from_jacobians``: from the per-record
        Jacobians, by reverse mode); shape ``(n, *out, d)``.

        The result for the last ``X`` (the same tensor object, unmodified) is cached and extended column by
        column, so calling it for d = 1, …, K costs K JVPs in total.
        """
        X = self._check_X(X)
        d = self._check_d(d)
        return self._jacobian_projections(X, d, batch_size).clone()

    def _jacobian_projections(self, X: torch.Tensor, d: int, batch_size: int | None) -> torch.Tensor:
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        cache = self._cache_for(X)
        have = 0 if cache["JP"] is None else cache["JP"].shape[-1]
        if have < d and self._projections_from_jacobians:
            self._projections_and_gram(X, cache, batch_size)
            have = d
        if have < d:
            rows = self._row_batches(X.shape[0], batch_size)
            chunk = self._chunk(rows[0].stop - rows[0].start, d - have, X)
            new = []
            for k in range(have, d, chunk):
                tangents = self.eigenvectors[:, k:min(k + chunk, d)].T
                new.append(torch.cat([self._jvp_many(tangents, X[sl]) for sl in rows], 1))
            new = torch.movedim(torch.cat(new, 0), 0, -1)
            cache["JP"] = new if cache["JP"] is None else torch.cat([cache["JP"], new], -1)
        return cache["JP"][..., :d]

    def _projections_and_gram(self, X: torch.Tensor, cache: dict, batch_size: int | None) -> None:
        """J P_K and ‖J_m‖² of every record from its per-record Jacobian (reverse mode, in memory-bounded chunks),
        into ``cache`` ("JP" in the weights' dtype, "gram_diag" in float64)."""
        P = self.eigenvectors.to(torch.float64)
        jp = gram = None
        # the results are allocated once and filled chunk by chunk: small results allocated between the chunks'
        # large temporaries would pin the heap and make it grow with the number of chunks
        for rows, jac in self._jacobian_blocks(X, batch_size):  # (c, *out, D)
            if jp is None:
                jp = torch.empty(X.shape[0], *jac.shape[1:-1], P.shape[1], dtype=self.dtype, device=jac.device)
                gram = torch.empty(X.shape[0], *jac.shape[1:-1], dtype=torch.float64, device=jac.device)
            torch.matmul(jac, P, out=jp[rows]) if jp.dtype == torch.float64 else jp[rows].copy_(jac @ P)
            gram[rows] = torch.linalg.vector_norm(jac, dim=-1).square_()  # no (c, *out, D) temporary
        cache["JP"] = jp
        cache.setdefault("gram_diag", gram)

    # ------------------------------------------------------- per-record Jacobians
    def _jacobian_blocks(self, X: torch.Tensor, batch_size: int | None):
        """(rows, per-record Jacobians in float64) over memory-bounded chunks of the records of X; kept in the cache
        of ``X`` when ``_keep_record_jacobians`` is set and they fit in one chunk (so that several d reuse them)."""
        cache = self._cache_for(X)
        if cache.get("jac") is not None:
            return cache["jac"]
        blocks = self.record_jacobian_chunks(X, _jacobian_chunk_bytes(), batch_size)
        n_out = int(np.prod(self.functional_model.output_shape(X)))
        fits = X.shape[0] * n_out * self.n_weights * 8 <= _jacobian_chunk_bytes()
        if self._keep_record_jacobians and fits and (batch_size or X.shape[0]) >= X.shape[0]:
            cache["jac"] = blocks = list(blocks)
        return blocks

    def jacobian_gram(self, X: torch.Tensor, full_cov: bool = False, batch_size: int | None = None) -> torch.Tensor:
        """J(x) J(x)ᵀ over the last output axis, per record: ‖J_m(x)‖² of shape ``(n, *out)`` (``full_cov=False``)
        or the (M × M) blocks, shape ``(n, *out[:-1], M, M)``; in float64.

        Per-record Jacobians by reverse mode, vectorised over records with ``torch.func.vmap`` where the
        model allows it (a loop over records otherwise), in chunks of records holding at most about
        128 MiB of Jacobian entries (at least one record at a time). Cached for the last ``X`` like
        :meth:`jacobian_projections`.
        """
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        cache = self._cache_for(X)
        key = "gram_full" if full_cov else "gram_diag"
        if cache.get(key) is None:
            cache[key] = self._compute_gram(X, full_cov, batch_size)
        return cache[key]

    def _compute_gram(self, X: torch.Tensor, full_cov: bool, batch_size: int | None) -> torch.Tensor:
        parts = []
        for _, jac in self._jacobian_blocks(X, batch_size):  # (c, *out, D)
            parts.append(jac @ jac.transpose(-1, -2) if full_cov else torch.linalg.vector_norm(jac, dim=-1).square_())
        return torch.cat(parts, 0)
