"""The generalized Gauss-Newton matrix of a trained network as a matrix-free linear operator.

G = (1/N) Σ_n J_nᵀ H_n J_n (paper eqs. 28, 30), with J_n the Jacobian of the network output for record n with
respect to the trainable weights and H_n the Hessian of the loss with respect to that output:
the identity for the ½-squared loss and diag(p) − p pᵀ for softmax cross-entropy (analytic, p = softmax(f)),
in general whatever the :class:`~glas_sklearn.likelihoods.Likelihood`'s ``output_hessian_product`` gives.
With record weights w_n (``sample_weight``) G = Σ_n w_n J_nᵀ H_n J_n / Σ_n w_n: frequency weights, so an integer
weight is the same as repeating the record and a zero weight the same as dropping it.
G is never formed: G v is one Jacobian-vector product, a multiply by H at the output and one
vector-Jacobian product per mini-batch, summed over the N records. A block G V of k vectors is computed in
one pass per mini-batch: one forward pass, the k JVPs and VJPs vectorised with ``torch.func.vmap`` (in
memory-bounded chunks of columns), so the per-product overhead is paid once per block (``vectorize_blocks``).
"""

from __future__ import annotations

import abc
import logging
import math
import os
import warnings

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from scipy.sparse.linalg import LinearOperator
from torch import nn
from torch.func import jvp, vjp, vmap

from ._checks import check_positive_int, check_sample_weight, check_vector, numpy_rng
from ._functional import BoundModel, FunctionalModel, forward_ad_section
from .likelihoods import Likelihood, resolve_likelihood

__all__ = ["CurvatureOperator", "GGNOperator"]

logger = logging.getLogger(__name__)

# Memory for one vectorised block product (tangents, results and the batched activations of a mini-batch);
# larger blocks are split into chunks of columns that fit it.
_BLOCK_BYTES = 1 << 30
# vectorize_blocks="auto" on the CPU: columns with more bytes of work than this go one by one (with the cached
# linearisation, respectively streamed), where measured single products are as fast as the vectorised block.
_VECTORIZE_MAX_COLUMN_BYTES = {"cached": 8 << 20, "streamed": 32 << 20}
# Per-record Jacobian entries held at once by diagonal().
_DIAG_CHUNK_BYTES = 128 << 20


def _available_memory(device: torch.device) -> int:
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


class CurvatureOperator(abc.ABC):
    """A symmetric D×D operator known through its products with torch blocks (the curvature protocol).

    A subclass provides ``dtype`` and ``device`` (attributes or properties), either a ``layout``
    (:class:`~glas_sklearn._functional.ParameterLayout`, giving D) or its own ``shape``, and implements
    :meth:`_matmat`. It then gets checked torch products (:meth:`matvec`, :meth:`matmat`, ``@``) and a
    scipy ``LinearOperator`` (:meth:`to_scipy`), and works with :func:`~glas_sklearn.eigen.top_eigenpairs`.

    Examples
    --------
    >>> import torch
    >>> class Diagonal(CurvatureOperator):
    ...     def __init__(self, d):
    ...         self.d, self.dtype, self.device = d, d.dtype, d.device
    ...     @property
    ...     def shape(self):
    ...         return (self.d.numel(), self.d.numel())
    ...     def _matmat(self, V):
    ...         return self.d[:, None] * V
    >>> op = Diagonal(torch.tensor([1.0, 2.0, 3.0]))
    >>> op @ torch.ones(3)
    tensor([1., 2., 3.])
    >>> op.to_scipy().matmat(np.eye(3)).diagonal()
    array([1., 2., 3.])
    """

    dtype: torch.dtype
    device: torch.device

    @property
    def shape(self) -> tuple[int, int]:
        """(D, D), with D from ``self.layout`` (subclasses without a layout override this)."""
        D = self.layout.size
        return (D, D)

    @abc.abstractmethod
    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        """A V for a detached (D, k) block V, k ≥ 1, in the operator's dtype and on its device; returns (D, k)."""

    def _products(self, V: torch.Tensor) -> torch.Tensor:
        """The one path to :meth:`_matmat`: a detached (D, k) block in, its checked (D, k) product out."""
        out = self._matmat(V.detach())
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(V.shape):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise RuntimeError(f"{type(self).__name__}._matmat returned {got} for a block of shape "
                               f"{tuple(V.shape)}; it must return a tensor of the block's shape.")
        return out

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """A v for a torch vector of length D (the operator's dtype and device)."""
        check_vector("v", v, self.shape[0], self.dtype, self.device, allow_matrix=False)
        return self._products(v.unsqueeze(1))[:, 0]

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        """A V for a D×k torch block (or a vector of length D, giving a vector)."""
        check_vector("V", V, self.shape[0], self.dtype, self.device)
        if V.ndim == 1:
            return self._products(V.unsqueeze(1))[:, 0]
        return self._products(V)

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        return self.matmat(v)

    def to_scipy(self, dtype=np.float64) -> LinearOperator:
        """A symmetric ``scipy.sparse.linalg.LinearOperator`` on numpy arrays: each of its products (a vector
        or a whole block) is one call of :meth:`_matmat`, computed in the operator's dtype and device."""
        np_dtype = np.dtype(dtype)

        def mm(x: np.ndarray) -> np.ndarray:
            x = np.asarray(x)
            t = torch.as_tensor(x.reshape(x.shape[0], -1), dtype=self.dtype).to(self.device)
            out = self._products(t)
            return out.cpu().numpy().astype(np_dtype, copy=False).reshape(x.shape)

        return LinearOperator(self.shape, matvec=mm, rmatvec=mm, matmat=mm, rmatmat=mm, dtype=np_dtype)


class GGNOperator(BoundModel, CurvatureOperator):
    """Matrix-free generalized Gauss-Newton matrix G of a torch model on a data set.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network f(x; θ0). Its trainable parameters (``requires_grad=True``, in
        ``named_parameters()`` order) are the D weights; it is evaluated in eval mode and never modified.
        θ0 is copied at construction, so later changes to the model do not move the operator.
    X : torch.Tensor
        Network inputs, one record (or sequence) per row, on the model's device.
        Floating inputs must have the model's dtype; integer inputs (token ids) are passed as they are.
    y : torch.Tensor, optional
        Targets. G does not depend on them (H_n depends only on the output); when given, their
        length is checked against X.
    loss : {"mse", "cross_entropy"} or Likelihood, default="mse"
        The likelihood whose output Hessian H_n enters G: "mse" (:class:`~glas_sklearn.likelihoods.Gaussian`,
        ½-squared error, H = I), "cross_entropy" (:class:`~glas_sklearn.likelihoods.Categorical`, softmax
        cross-entropy over the last output axis, H = diag(p) − ppᵀ), their other names "gaussian" and
        "categorical", or any :class:`~glas_sklearn.likelihoods.Likelihood` instance.
    batch_size : int, optional
        Rows per mini-batch; all rows at once when None.
    mask : torch.Tensor of bool, optional
        For sequence outputs (n, T, M): a (n, T) mask, False at padding. Masked positions do not
        count as records and contribute nothing to G.
    subsample : int, optional
        Use ``subsample`` rows drawn at random without replacement (paper §2.4); counted in rows,
        that is in sequences for sequence data, at most the number of rows of X. The rows are
        ``np.sort(rng.choice(n_rows, size=subsample, replace=False))`` with ``rng`` the numpy Generator of
        ``random_state``, and are kept in ``indices_``; the operator is then exactly the one built on
        ``X[indices_]`` (and ``mask[indices_]``).
    random_state : int, numpy Generator or None
        Seeds the subsample. A Generator is used as it is and advanced by the draw, so a caller can build
        operators on successive independent subsamples from one stream.
    trim_padding : bool, default=False
        Only for *causal* sequence models, whose output at position t depends on inputs up to t alone
        (autoregressive RNNs, causal transformers): the rows are sorted by their last real position into
        mini-batches, and each mini-batch is cut after its last real position. G is unchanged and the cost
        follows the real tokens rather than the padded length. Wrong for bidirectional models. Needs
        ``mask``, with X's first two axes equal to the mask's.
    reuse_linearization : bool or "auto", default="auto"
        Keep each mini-batch's forward graph and its transposed (double-backward) graph between
        products, so a product costs one cached JVP and one cached VJP (about 1.3× a forward and
        backward pass). False streams a fresh forward-mode JVP and VJP per product (about 1.7×);
        "auto" reuses when the cache fits a quarter of the available memory (half the free memory on CUDA).
        This concerns single products (``matvec``, Lanczos) and blocks computed column by column.
    vectorize_blocks : bool or "auto", default="auto"
        How a block ``matmat`` of k ≥ 2 vectors is computed. True: one forward pass per mini-batch and the k
        JVPs and VJPs vectorised with ``torch.func.vmap`` (in memory-bounded chunks of columns), which removes
        the per-product overhead (kernel launches, Python, thread synchronisation) but not the arithmetic.
        False: column by column through the single-product path. "auto": vectorised on CUDA; on the CPU only
        while a column's work is small (at most 8 MiB with the cached linearisation, 32 MiB streamed: an MLP
        of width ≲ 150, respectively ≲ 400, on 10³ rows), since larger products are compute-bound there and
        the single products are as fast (benchmarks/results/bench_ggn.md). Models that ``vmap`` cannot
        handle fall back to columns.
    sample_weight : torch.Tensor or array-like of shape (n,), optional
        Non-negative weight w_i of each row (frequency weights): G = Σ_n w_n J_nᵀ H_n J_n / Σ_n w_n, so an
        integer weight equals repeating the row and a zero weight equals dropping it. A row's weight applies
        to each of its unmasked records (positions, for sequence outputs). Finite, not all zero.

    Attributes
    ----------
    shape : tuple of int
        (D, D).
    likelihood : Likelihood
        ``loss`` resolved to its object.
    n_records : int
        The number of records G averages over (unmasked tokens for sequence data; with ``sample_weight`` those
        of positive weight).
    total_weight : float
        N in G's normalisation: Σ_n w_n, the total record weight (``n_records`` without ``sample_weight``).
    n_products : int
        Number of single-vector products computed so far (a D×k block counts k).
    functional_model : FunctionalModel
        The model bound as a function of its weights (eval view, θ0, input checks).
    layout : ParameterLayout
        Names and shapes of the weights in the flat vector.
    theta0 : torch.Tensor of shape (D,)
        The trained weights (a detached copy).
    dtype, device
        Those of the weights; products take and return tensors in them.
    output_shape : tuple of int
        The per-record output shape of the model, e.g. (M,) or (T, M).
    indices_ : numpy.ndarray or None
        The sorted rows of X used with ``subsample``; None when every row is used.

    Notes
    -----
    A :class:`CurvatureOperator`: ``matvec``, ``matmat``, ``@`` and ``to_scipy()`` all reach one product
    path. Mini-batches are formed at construction; the cached linearisation is built on the first product.

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.ggn import GGNOperator
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    >>> op = GGNOperator(net, torch.randn(20, 3))
    >>> op.shape
    (21, 21)
    >>> (op @ torch.ones(21)).shape
    torch.Size([21])
    """

    def __init__(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor | None = None, *,
                 loss: str | Likelihood = "mse", batch_size: int | None = None, mask: torch.Tensor | None = None,
                 subsample: int | None = None, random_state=None, trim_padding: bool = False,
                 reuse_linearization: bool | str = "auto", vectorize_blocks: bool | str = "auto",
                 sample_weight: torch.Tensor | np.ndarray | None = None) -> None:
        self.likelihood = resolve_likelihood(loss, "loss")
        self.functional_model = fm = FunctionalModel(model)

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
            if mask.device != self.device:
                raise ValueError(f"mask is on {mask.device}, but the model lives on {self.device}.")
            if mask.shape[0] != n_rows:
                raise ValueError(f"mask has {mask.shape[0]} rows but X has {n_rows}; they must match.")
        weight = check_sample_weight(sample_weight, n_rows, self.device)
        if not isinstance(trim_padding, (bool, np.bool_)):
            raise ValueError(f"trim_padding must be True or False, got {trim_padding!r}.")
        if trim_padding and (mask is None or X.ndim < 2 or tuple(X.shape[:2]) != tuple(mask.shape)):
            raise ValueError("trim_padding=True needs the padding mask (mask=...) with X's first two axes equal to "
                             f"the mask's; got X {tuple(X.shape)} and mask "
                             f"{None if mask is None else tuple(mask.shape)}.")
        self.trim_padding = bool(trim_padding)
        self.batch_size = check_positive_int("batch_size", batch_size, allow_none=True)
        subsample = check_positive_int("subsample", subsample, allow_none=True)
        if subsample is not None:
            if subsample > n_rows:
                raise ValueError(f"subsample={subsample} is larger than the {n_rows} rows available.")
            idx = np.sort(numpy_rng(random_state).choice(n_rows, size=subsample, replace=False))
            idx_t = torch.as_tensor(idx, device=X.device)
            X = X[idx_t]
            mask = None if mask is None else mask[idx_t]
            weight = None if weight is None else weight[idx_t]
            self.indices_ = idx
        else:
            self.indices_ = None

        self.output_shape = fm.output_shape(X)
        if len(self.output_shape) < 1:
            raise ValueError("The model must return a tensor of shape (n, M) or (n, T, M); got one of shape (n,).")
        if mask is not None and tuple(mask.shape[1:]) != self.output_shape[:-1]:
            raise ValueError(
                f"mask has shape {tuple(mask.shape)}, but the model's output has shape "
                f"(n, {', '.join(map(str, self.output_shape))}); the mask must be (n, "
                f"{', '.join(map(str, self.output_shape[:-1]))})."
            )
        records = mask  # per record (n, *output_shape[:-1]): the mask, times the row's weight
        if weight is not None:
            rows = weight.reshape(-1, *([1] * (len(self.output_shape) - 1)))
            records = rows.expand(-1, *self.output_shape[:-1]) if mask is None else rows * mask
        if records is None:
            self.n_records = int(X.shape[0] * math.prod(self.output_shape[:-1]))
            self.total_weight = float(self.n_records)
        else:
            self.n_records = int(torch.count_nonzero(records))
            self.total_weight = float(records.sum(dtype=torch.float64))
        if self.n_records == 0:
            raise ValueError("The mask leaves no record: every position is padding." if weight is None else
                             "sample_weight is zero at every unmasked record; at least one needs a positive weight.")

        self._batches = self._make_batches(X, mask, records)
        if reuse_linearization not in (True, False, "auto"):
            raise ValueError(f"reuse_linearization must be True, False or 'auto', got {reuse_linearization!r}.")
        self.reuse_linearization = reuse_linearization
        if vectorize_blocks not in (True, False, "auto"):
            raise ValueError(f"vectorize_blocks must be True, False or 'auto', got {vectorize_blocks!r}.")
        self.vectorize_blocks = vectorize_blocks
        self._cache: list | None = None
        self._use_cache: bool | None = None
        self._block_ok: bool | None = None  # whether the vectorised block product works for this model
        self._column_bytes: int | None = None
        self.n_products = 0

    def _make_batches(self, X: torch.Tensor, mask: torch.Tensor | None, records: torch.Tensor | None) -> list:
        """(inputs, record weights) per mini-batch (the weights: the mask, the rows' weights or their product;
        None when every record counts once): views of consecutive rows, or with ``trim_padding`` length-sorted
        rows cut after the batch's last real position (batches of padding only are dropped)."""
        n = X.shape[0]
        size = self.batch_size or n
        if not self.trim_padding:
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

    # ------------------------------------------------------------- properties
    def __repr__(self) -> str:
        return (f"GGNOperator(D={self.shape[0]}, N={self.n_records}, likelihood={self.likelihood!r}, "
                f"batches={len(self._batches)}, dtype={self.dtype}, device={self.device})")

    # --------------------------------------------------------------- per batch
    def _record_weight(self, records: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        """w_n / Σ w at every record of the batch (1/N without weights, 0 at padding), broadcastable against
        ``out``."""
        if records is None:
            return torch.full((1,) * out.ndim, 1.0 / self.total_weight, dtype=out.dtype, device=out.device)
        return (records.to(out.dtype) / self.total_weight).unsqueeze(-1)

    def _cells(self, x: torch.Tensor) -> int:
        """Input cells of a mini-batch: rows, times positions with ``trim_padding`` (whose batches differ in length)."""
        return x.shape[0] * (x.shape[1] if self.trim_padding else 1)

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
        first = self._cells(self._batches[0][0])
        return int(3 * self._saved_bytes_first_batch() * sum(self._cells(xb) for xb, _ in self._batches) / first)

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
                cache.append((out, leaves, dummy, [grads[i] for i in live], live, self._record_weight(mb, out)))
        return cache

    def _decide_cache(self) -> bool:
        if self.reuse_linearization == "auto":
            need = self._estimate_cache_bytes()
            budget = _available_memory(self.device)
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
                    warnings.warn(f"Cannot reuse the linearisation ({err}); streaming JVP+VJP instead.",
                                  RuntimeWarning, stacklevel=3)
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
                    * self._record_weight(mb, primal)
                vjp = torch.autograd.grad(primal, leaves, hjv, allow_unused=True)
                result += self.layout.flatten([torch.zeros_like(p) if g is None else g
                                               for g, p in zip(vjp, leaves, strict=True)])
        return result

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        """G V: one product for a single column, else vectorised chunks of columns (column by column for a
        model that ``torch.func.vmap`` cannot handle)."""
        k = V.shape[1]
        chunk = 1 if k == 1 or self._block_ok is False or not self._vectorize() else self._block_columns(k)
        parts = []
        for i in range(0, k, chunk):
            Vc = V[:, i:i + chunk]
            if Vc.shape[1] > 1 and self._block_ok is not False:
                try:
                    parts.append(self._product_block(Vc))
                    self._block_ok = True
                    self.n_products += Vc.shape[1]
                    continue
                except Exception as err:  # noqa: BLE001 - a model the vectorised path cannot handle: columns
                    if self._block_ok:
                        raise
                    logger.debug("vectorised block product failed (%s: %s); computing G V column by column",
                                 type(err).__name__, err)
                    self._block_ok = False
            parts.append(torch.stack([self._product(Vc[:, j]) for j in range(Vc.shape[1])], dim=1))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

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
            first = self._cells(self._batches[0][0])
            largest = max(self._cells(xb) for xb, _ in self._batches)
            activations = self._saved_bytes_first_batch() * largest / first
            element = torch.empty((), dtype=self.dtype).element_size()
            self._column_bytes = int(3 * self.layout.size * element + 3 * activations) + 1
        return self._column_bytes

    def _block_columns(self, k: int) -> int:
        """Columns per vectorised chunk: per column, three D-vectors (tangent, result, its parts) and three times
        the activations of the largest mini-batch (primal tangents forward, cotangents backward), within
        ``_BLOCK_BYTES`` and half the memory budget of the device."""
        budget = min(_BLOCK_BYTES, _available_memory(self.device) // 2)
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
                    * self._record_weight(mb, primal)
                (grads,) = vmap(pullback)(hjv)
                result += torch.cat([grads[n].reshape(k, -1) for n in self.layout.names], dim=1)
        return result.T.contiguous()

    def _product(self, v: torch.Tensor) -> torch.Tensor:
        """G v for one vector v of length D: the cached or the streamed path."""
        if self._use_cache is None:
            self._use_cache = self._decide_cache()
        tangents = list(self.layout.unflatten(v).values())
        self.n_products += 1
        if self._use_cache:
            return self._product_cached(tangents)
        return self._product_streamed(tangents)

    # ------------------------------------------------------------- public API
    def diagonal(self) -> torch.Tensor:
        """The exact diagonal of G, (1/N) Σ_n diag(J_nᵀ H_n J_n), from per-record Jacobians; shape (D,), float64
        (with ``sample_weight``: Σ_n w_n diag(J_nᵀ H_n J_n) / Σ_n w_n).

        Per record and weight k the likelihood's ``output_hessian_diagonal_terms`` (Σ_m J_mk² for the ½-squared
        loss, Σ_c p_c J_ck² − (Σ_c p_c J_ck)² for softmax cross-entropy, H = diag(p) − p pᵀ), summed over the
        unmasked records of the operator's rows (the subsample's, when one was drawn). The Jacobians are formed in
        chunks of records holding at most about 128 MiB (at least one record at a time), so the cost is about one
        backward pass per output and record.
        """
        fm = self.functional_model
        total = torch.zeros(self.layout.size, dtype=torch.float64, device=self.device)
        for xb, mb in self._batches:
            with torch.no_grad():
                outputs = fm(xb)
            for rows, jac in self.record_jacobian_chunks(xb, _DIAG_CHUNK_BYTES):  # (c, *out, D)
                per_record = self.likelihood.output_hessian_diagonal_terms(outputs[rows], jac)  # (c, *out[:-1], D)
                if mb is not None:
                    per_record = per_record * mb[rows].to(torch.float64).unsqueeze(-1)
                total += per_record.reshape(-1, self.layout.size).sum(0)
        return (total / self.total_weight).clamp_min(0.0)

    def release(self) -> None:
        """Drop the cached linearisation (it is rebuilt on the next product)."""
        self._cache = None
        self._use_cache = None
