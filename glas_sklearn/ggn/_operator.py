"""The generalized Gauss-Newton matrix of a trained network as a matrix-free linear operator
(:class:`GGNOperator`): its parameters and attributes, the product dispatch and the exact diagonal. It holds its
parts, each built from explicit inputs: what it sums over (_records.py's ``RecordBatches``), single products
(_linearization.py's ``Linearization``), vectorised blocks (_blocks.py's ``BlockProducts``) and the per-record
Jacobians of the bound model (_functional.py's ``BoundModel``)."""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from .._functional import BoundModel, FunctionalModel, ParameterLayout
from ..likelihoods import Likelihood, resolve_likelihood
from ._blocks import BlockProducts
from ._linearization import Linearization
from ._protocol import CurvatureOperator
from ._records import record_batches

__all__ = ["GGNOperator"]

logger = logging.getLogger("glas_sklearn.ggn")

# Per-record Jacobian entries held at once by diagonal().
_DIAG_CHUNK_BYTES = 128 << 20


class GGNOperator(CurvatureOperator):
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
        records = record_batches(fm, X, y, mask, sample_weight, batch_size=batch_size, subsample=subsample,
                                 random_state=random_state, trim_padding=trim_padding)
        self.trim_padding, self.batch_size, self.indices_ = records.trim_padding, records.batch_size, records.indices
        self.output_shape = records.output_shape
        self.n_records, self.total_weight = records.n_records, records.total_weight
        self._batches = records.batches
        if reuse_linearization not in (True, False, "auto"):
            raise ValueError(f"reuse_linearization must be True, False or 'auto', got {reuse_linearization!r}.")
        self.reuse_linearization = reuse_linearization
        if vectorize_blocks not in (True, False, "auto"):
            raise ValueError(f"vectorize_blocks must be True, False or 'auto', got {vectorize_blocks!r}.")
        self.vectorize_blocks = vectorize_blocks
        self._bound = BoundModel(fm)
        self._linearization = Linearization(fm, self.likelihood, records, reuse_linearization)
        self._blocks = BlockProducts(fm, self.likelihood, records, vectorize_blocks, self._linearization)
        self._block_ok: bool | None = None  # whether the vectorised block product works for this model
        self.n_products = 0

    # ------------------------------------------------------------- properties
    @property
    def layout(self) -> ParameterLayout:
        return self.functional_model.layout

    @property
    def dtype(self) -> torch.dtype:
        return self.functional_model.dtype

    @property
    def device(self) -> torch.device:
        return self.functional_model.device

    @property
    def theta0(self) -> torch.Tensor:
        return self.functional_model.theta0

    @property
    def _use_cache(self) -> bool | None:
        """Whether single products go through the cached linearisation (None until the first product)."""
        return self._linearization.use_cache

    @property
    def _column_bytes(self) -> int | None:
        """Bytes a vectorised block needs per column (None until measured)."""
        return self._blocks.column_bytes

    def __repr__(self) -> str:
        return (f"GGNOperator(D={self.shape[0]}, N={self.n_records}, likelihood={self.likelihood!r}, "
                f"batches={len(self._batches)}, dtype={self.dtype}, device={self.device})")

    # ----------------------------------------------------------- products
    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        """G V: one product for a single column, else vectorised chunks of columns (column by column for a
        model that ``torch.func.vmap`` cannot handle)."""
        k = V.shape[1]
        chunk = 1 if k == 1 or self._block_ok is False or not self._vectorize() else self._blocks.columns(k)
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
        return self._blocks.vectorize()

    def _product_block(self, V: torch.Tensor) -> torch.Tensor:
        """G V for a D×k block in one vectorised pass per mini-batch."""
        return self._blocks.product(V)

    def _product(self, v: torch.Tensor) -> torch.Tensor:
        """G v for one vector v of length D: the cached or the streamed path."""
        self.n_products += 1
        return self._linearization.product(v)

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
            for rows, jac in self._bound.record_jacobian_chunks(xb, _DIAG_CHUNK_BYTES):  # (c, *out, D)
                per_record = self.likelihood.output_hessian_diagonal_terms(outputs[rows], jac)  # (c, *out[:-1], D)
                if mb is not None:
                    per_record = per_record * mb[rows].to(torch.float64).unsqueeze(-1)
                total += per_record.reshape(-1, self.layout.size).sum(0)
        return (total / self.total_weight).clamp_min(0.0)

    def release(self) -> None:
        """Drop the cached linearisation (it is rebuilt on the next product)."""
        self._linearization.release()
