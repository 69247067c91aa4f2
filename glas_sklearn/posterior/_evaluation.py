"""The evaluation engine of the posterior: the network at many weight vectors, Jacobian projections J P (from an
MLP's factored Jacobians, by products along the eigenvectors, or from per-record Jacobians, whichever is cheaper)
and J Jᵀ, with their caches, in memory-bounded chunks.

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
from torch.func import vmap

from .._checks import check_positive_int
from .._functional import BoundModel, FunctionalModel
from .._jacobians import JacobianProducts

__all__ = ["PosteriorEvaluation", "jacobians_cheaper", "memory_budget"]

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

# Tangents per vectorised call of the products along the eigenvectors (more gain nothing and hold more activations).
_TANGENTS_PER_CALL = 16
# The cost model of jacobians_cheaper, in multiply-adds of a forward pass (measured on one CPU thread, 1M-weight
# tanh MLP): a product J t costs about three forward passes; forming one per-record Jacobian entry (the vectorised
# reverse mode writes the per-record outer products and reads them back) about 150; the product of the Jacobians
# with P, a tall and thin matrix product, about 3 per multiply-add; and reading P once per chunk of records about 60
# per entry.
_TANGENT_PASSES = 3.0
_JACOBIAN_ENTRY_COST = 150.0
_PROJECTION_PRODUCT_COST = 3.0
_EIGENVECTOR_READ_COST = 60.0


def jacobians_cheaper(rows: int, outputs: int, columns: int, reuse: float = 1.0, *,
                      jacobians_needed: bool = False) -> bool:
    """Whether J P for a chunk of ``rows`` records with ``outputs`` outputs each and ``columns`` eigenvectors is
    cheaper from the per-record Jacobians (J times P) than by ``columns`` products J p_j.

    Both costs are proportional to D, the number of weights. The products cost about three forward passes each,
    a forward pass ``reuse`` multiply-adds per weight and record (1 for a dense network, more where weights are
    shared across positions); the Jacobians cost forming them (unless ``jacobians_needed``: the kind computes
    them anyway), their product with P, and reading P once per chunk. So products win for dense networks, and the
    Jacobians where each weight is used many times per record and few outputs are asked for.
    """
    products = _TANGENT_PASSES * columns * reuse * rows
    jacobians = (_PROJECTION_PRODUCT_COST * outputs * rows * columns + _EIGENVECTOR_READ_COST * columns
                 + (0.0 if jacobians_needed else outputs * rows * (2.0 * reuse + _JACOBIAN_ENTRY_COST)))
    return jacobians < products


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
    # a chunk of per-record Jacobians in the weights' dtype comes with about as much again in temporaries (the
    # per-weight Jacobians before their concatenation), and twice as much in float64 (low_rank_diag's blocks)
    budget = getattr(_BUDGET, "bytes", None)
    return _WEIGHT_CHUNK_BYTES if budget is None else max(1, min(_WEIGHT_CHUNK_BYTES, budget // 4))


def _max_batched_rows() -> int:
    budget = getattr(_BUDGET, "bytes", None)
    if budget is None:
        return _MAX_BATCHED_ROWS
    return max(1, min(_MAX_BATCHED_ROWS, budget // 2 // getattr(_BUDGET, "per_evaluation", _BYTES_PER_EVALUATION)))


class PosteriorEvaluation(JacobianProducts):
    """Forwards at weight rows, JVPs, Jacobian projections and per-record Jacobians of a bound model.

    The host class calls :meth:`_init_evaluation` with the bound model and the eigenvectors (D, K) in its
    constructor (and :meth:`_init_thread_caches` when unpickled); the state read here is set here. The cache of
    Jacobian quantities (J P, J Jᵀ and, when ``_keep_record_jacobians`` is set and they fit in one chunk, the
    per-record Jacobians) belongs to the last ``X`` seen by the calling thread (the same tensor object,
    unmodified); it does not depend on the prior, is kept per thread (threads sharing a posterior never see each
    other's), and is not pickled.
    :meth:`release_cache` drops the calling thread's.
    """

    eigenvectors: torch.Tensor
    # Keep the per-record Jacobians of the last X in the cache (for kinds that use them at every d).
    _keep_record_jacobians = False
    # Kinds whose output covariance needs J Jᵀ (variance off span(P)).
    _uses_gram = False

    def _init_evaluation(self, functional_model: FunctionalModel, eigenvectors: torch.Tensor) -> None:
        """Bind the model (:class:`~glas_sklearn._functional.BoundModel`) and the eigenvectors P (D, K), checked."""
        BoundModel.__init__(self, functional_model)
        self.eigenvectors = eigenvectors
        self._vmap_forward_ok: bool | None = None
        self._init_thread_caches()

    def _init_thread_caches(self) -> None:
        """Empty per-thread caches of the last inputs and their J P (not pickled)."""
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

    # ------------------------------------------------------- Jacobian projections
    def _cache_for(self, X: torch.Tensor) -> dict:
        """The cache of Jacobian quantities for ``X`` (the same tensor object, unmodified), reset otherwise."""
        cache = self._jp_cache
        if cache is None or cache["X"] is not X or cache["version"] != X._version:
            cache = self._local.cache = {"X": X, "version": X._version, "JP": None}
        return cache

    def jacobian_projections(self, X: torch.Tensor, d: int, batch_size: int | None = None) -> torch.Tensor:
        """J(x) p_j for j ≤ d; shape ``(n, *out, d)``, in the weights' dtype.

        Per chunk of records the cheaper of two ways (:func:`jacobians_cheaper`): d products J p_j
        (:meth:`~glas_sklearn._jacobians.JacobianProducts.tangent_products`, reverse over reverse), or the per-record
        Jacobians times P (all K columns at once; J Jᵀ's diagonal from the same Jacobians for the kinds that
        need it). The result for the last ``X`` (the same tensor object, unmodified) is cached and extended
        column by column, so calling it for d = 1, …, K costs K products in total.
        """
        X = self._check_X(X)
        d = self._check_d(d)
        return self._jacobian_projections(X, d, batch_size).clone()

    def _jacobian_projections(self, X: torch.Tensor, d: int, batch_size: int | None) -> torch.Tensor:
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        cache = self._cache_for(X)
        have = 0 if cache["JP"] is None else cache["JP"].shape[-1]
        if have < d:
            new = self._new_projections(X, have, d, cache, batch_size)
            cache["JP"] = new if cache["JP"] is None else torch.cat([cache["JP"], new], -1)
        return cache["JP"][..., :d]

    def _weight_reuse(self, X: torch.Tensor) -> float:
        """Multiply-adds of one record's forward pass per weight (1 for a dense network; more where weights are
        shared across positions, as in convolutions and recurrent layers); cached."""
        reuse = getattr(self, "_reuse", None)
        if reuse is None:
            flops = self.flops_per_record(X)
            reuse = self._reuse = 1.0 if not flops else max(1.0, flops / (2 * self.n_weights))
        return reuse

    def _new_projections(self, X: torch.Tensor, start: int, d: int, cache: dict,
                         batch_size: int | None) -> torch.Tensor:
        """J P[:, start:stop] of every record of X: from the factored Jacobians of an MLP (stop = d; J Jᵀ's diagonal
        beside it for the kinds that use it), else the cheaper of products along the columns (stop = d) and the
        per-record Jacobians (stop = K)."""
        want_gram = self._uses_gram and cache.get("gram_diag") is None
        if getattr(self, "_linear_factors_ok", None) is not False:
            jp = self._factor_projections(X, start, d, cache if want_gram else None, batch_size)
            if jp is not None:
                return jp
        n = X.shape[0]
        n_out = math.prod(self.functional_model.output_shape(X))
        needed = self._keep_record_jacobians or want_gram
        rows = max(1, min(n, batch_size or n, _jacobian_chunk_bytes() // (n_out * self.n_weights *
                                                                              self.theta0.element_size())))
        if not jacobians_cheaper(rows, n_out, d - start, self._weight_reuse(X), jacobians_needed=needed):
            return self._tangent_projections(X, start, d, batch_size)
        P = self.eigenvectors[:, start:]
        jp = gram = None
        # the results are allocated once and filled chunk by chunk: small results allocated between the chunks'
        # large temporaries would pin the heap and make it grow with the number of chunks
        for i in range(0, n, rows):
            sl = slice(i, min(i + rows, n))
            jac = self.record_jacobians(X[sl])  # (c, *out, D)
            if jp is None:
                jp = torch.empty(n, *jac.shape[1:-1], P.shape[1], dtype=self.dtype, device=jac.device)
                gram = torch.empty(n, *jac.shape[1:-1], dtype=torch.float64, device=jac.device) if want_gram else None
            torch.matmul(jac, P, out=jp[sl])
            if want_gram:
                gram[sl] = self._jacobian_gram(jac, False)
            del jac
        if want_gram:
            cache["gram_diag"] = gram
        return jp

    def _factor_projections(self, X: torch.Tensor, start: int, stop: int, cache: dict | None,
                            batch_size: int | None) -> torch.Tensor | None:
        """J p_j for start ≤ j < stop from :meth:`~glas_sklearn._jacobians.JacobianProducts.linear_factors` (and J Jᵀ's
        diagonal into ``cache`` when given); None for a network they do not describe."""
        n, cols = X.shape[0], stop - start
        tangents = self.eigenvectors.T  # (K, D): the rows are the tangents
        jp = gram = None
        for sl in self._row_batches(n, batch_size or max(1, _max_batched_rows())):
            factors = self.linear_factors(X[sl])
            if factors is None:  # (only ever the first chunk)
                return None
            if cache is not None:
                part = factors.gram(False)
                if gram is None:
                    gram = torch.empty(n, *part.shape[1:], dtype=part.dtype, device=part.device)
                gram[sl] = part
            chunk = min(cols, max(1, _weight_chunk_bytes() // factors.bytes_per_tangent()))
            for k in range(start, stop, chunk):
                block = self.layout.unflatten_rows(tangents[k:min(k + chunk, stop)])
                part = factors.projections(block)  # (c, *out, k)
                if jp is None:
                    jp = torch.empty(n, *part.shape[1:-1], cols, dtype=self.dtype, device=part.device)
                jp[sl, ..., k - start:k - start + part.shape[-1]] = part
            del factors
        if cache is not None:
            cache["gram_diag"] = gram
        return jp

    def _tangent_projections(self, X: torch.Tensor, start: int, stop: int, batch_size: int | None) -> torch.Tensor:
        """J p_j for start ≤ j < stop by products along the eigenvectors, a few columns at a time."""
        rows = self._row_batches(X.shape[0], batch_size or max(1, _max_batched_rows()))
        cols = stop - start
        chunk = min(cols, _TANGENTS_PER_CALL, max(1, _max_batched_rows() // max(1, rows[0].stop - rows[0].start)))
        tangents = self.eigenvectors.T  # (K, D): rows are the tangents (contiguous when P is stored by columns)
        if not tangents.is_contiguous():  # the rows are copied per call: count them against the budget
            chunk = min(chunk, self._chunk(rows[0].stop - rows[0].start, cols, X))
        jp = None
        for k in range(start, stop, chunk):
            block = tangents[k:min(k + chunk, stop)]
            for sl in rows:
                part = torch.movedim(self.tangent_products(X[sl], block), 0, -1)  # (nb, *out, c)
                if jp is None:
                    jp = torch.empty(X.shape[0], *part.shape[1:-1], cols, dtype=part.dtype, device=part.device)
                jp[sl, ..., k - start:k - start + block.shape[0]] = part
        return jp

    def jacobian_gram(self, X: torch.Tensor, full_cov: bool = False, batch_size: int | None = None) -> torch.Tensor:
        """J(x) J(x)ᵀ over the last output axis, per record: ‖J_m(x)‖² of shape ``(n, *out)`` (``full_cov=False``)
        or the (M × M) blocks, shape ``(n, *out[:-1], M, M)``; in float64.

        From one forward pass and its pullbacks for a network whose trainable weights all sit in ``nn.Linear``
        layers (:meth:`~glas_sklearn._jacobians.JacobianProducts.record_gram`), else from per-record Jacobians by
        reverse mode, in chunks of records holding at most about 128 MiB of Jacobian entries (at least one
        record at a time). Cached for the last ``X`` like :meth:`jacobian_projections`.
        """
        X = self._check_X(X)
        batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        cache = self._cache_for(X)
        key = "gram_full" if full_cov else "gram_diag"
        if cache.get(key) is None:
            cache[key] = self._gram(X, full_cov, batch_size)
        return cache[key]

    def _gram(self, X: torch.Tensor, full_cov: bool, batch_size: int | None, jacobians: bool = True):
        """J Jᵀ of every record of X in chunks (:meth:`jacobian_gram`); None when it needs the per-record Jacobians
        and ``jacobians`` is False."""
        n = X.shape[0]
        gram = None
        if getattr(self, "_linear_factors_ok", None) is not False:  # without the Jacobians: chunks by activations
            for sl in self._row_batches(n, batch_size or max(1, _max_batched_rows())):
                part = self.record_gram(X[sl], full_cov, jacobians=False)
                if part is None:  # (only ever the first chunk)
                    break
                if gram is None:
                    gram = torch.empty(n, *part.shape[1:], dtype=part.dtype, device=part.device)
                gram[sl] = part
            else:
                return gram
        if not jacobians:
            return None
        n_out = math.prod(self.functional_model.output_shape(X))
        size = max(1, _jacobian_chunk_bytes() // (n_out * self.n_weights * self.theta0.element_size()))
        for sl in self._row_batches(n, min(size, batch_size or size)):
            part = self.record_gram(X[sl], full_cov)
            if gram is None:
                gram = torch.empty(n, *part.shape[1:], dtype=part.dtype, device=part.device)
            gram[sl] = part
        return gram

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
