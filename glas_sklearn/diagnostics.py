"""Diagnostics of the curvature eigenvectors: does the leading eigenvector depend on the data subsample?

The paper computes the GGN on a random subsample of the training rows (§2.4) and checks, for several
subsample sizes, that independent subsamples give the same leading eigenvector (Fig. 9).

- :func:`eigenvector_alignment`: ``|⟨p^(i), p^(j)⟩|`` between eigenvectors of independent runs, or against a
  reference run.
- :func:`subsample_alignment`: the whole study. For each size it draws R subsamples through
  :class:`~glas_sklearn.ggn.GGNOperator`'s own ``subsample``, computes the top eigenpairs and tabulates
  eigenvalues, residuals and alignments.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ._checks import check_positive_int, numpy_rng
from .eigen import top_eigenpairs
from .ggn import GGNOperator

__all__ = ["eigenvector_alignment", "subsample_alignment"]

logger = logging.getLogger(__name__)


def eigenvector_alignment(eigenvectors: Sequence[torch.Tensor], reference: torch.Tensor | None = None,
                          index: int = 0) -> np.ndarray:
    """Replica alignment of the leading eigenvectors (paper §2.4, Fig. 9).

    Parameters
    ----------
    eigenvectors : sequence of torch.Tensor
        R matrices P^(i) of shape (D, k_i) (or vectors of length D) from independent runs.
    reference : torch.Tensor, optional
        A reference P (or vector) from a larger run.
    index : int, default=0
        Which eigenvector to compare (0 = p_1).

    Returns
    -------
    numpy.ndarray
        The R×R matrix ``|⟨p^(i), p^(j)⟩|`` (entries near 1: converged; away from 1: not), or, with
        ``reference``, the length-R vector ``|⟨p^(i), p_ref⟩|``.

    Examples
    --------
    >>> import torch
    >>> p, q = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]) / 2**0.5
    >>> eigenvector_alignment([p, -p, q]).round(4).tolist()
    [[1.0, 1.0, 0.7071], [1.0, 1.0, 0.7071], [0.7071, 0.7071, 1.0]]
    >>> eigenvector_alignment([p, q], reference=p).round(4).tolist()
    [1.0, 0.7071]
    """
    if len(eigenvectors) == 0:
        raise ValueError("eigenvector_alignment needs at least one set of eigenvectors.")

    def column(P):
        P = torch.as_tensor(P)
        p = P if P.ndim == 1 else P[:, index]
        p = p.detach().to("cpu", torch.float64)
        return p / p.norm()

    cols = [column(P) for P in eigenvectors]
    sizes = {c.shape[0] for c in cols}
    if reference is not None:
        ref = column(reference)
        sizes.add(ref.shape[0])
    if len(sizes) != 1:
        raise ValueError(f"All eigenvectors must have the same length D, got lengths {sorted(sizes)}.")
    M = torch.stack(cols, dim=1)
    if reference is not None:
        return (M.T @ ref).abs().numpy()
    return (M.T @ M).abs().numpy()


def subsample_alignment(model: nn.Module, X: torch.Tensor, *, mask: torch.Tensor | None = None,
                        loss="cross_entropy", subsample_sizes: Sequence[int], n_replicas: int = 3,
                        reference_size: int | None = None, n_components: int = 1, index: int = 0,
                        batch_size: int | None = None, trim_padding: bool = False,
                        eigen_method: str = "lanczos", max_matvecs: int | None = None, ncv: int | None = None,
                        tol: float = 1e-5, reuse_linearization="auto", return_eigen: bool = False,
                        random_state=None) -> dict:
    """How much the leading GGN eigenvector depends on the subsample it was computed from (paper Fig. 9).

    For every size n in ``subsample_sizes``, R = ``n_replicas`` independent subsamples of n rows
    (sequences) are drawn without replacement. The top ``n_components`` eigenpairs of the GGN on each
    subsample are computed. The R×R matrix ``|⟨p^(i), p^(j)⟩|`` of the compared eigenvector is formed.
    Entries away from 1 flag runs that did not converge or that depend on the subsample. With
    ``reference_size``, one more independent run on that many rows gives p_ref, and each replica's
    ``|⟨p^(i), p_ref⟩|`` is reported.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network (θ0). Never modified.
    X : torch.Tensor
        All available inputs, one row per sequence (token ids for sequence models).
    mask : torch.Tensor of bool, optional
        (n, T) padding mask for sequence outputs (n, T, M). Records are the unmasked tokens.
    loss : {"cross_entropy", "mse"} or Likelihood, default="cross_entropy"
        Passed to :class:`~glas_sklearn.ggn.GGNOperator`.
    subsample_sizes : sequence of int
        The subsample sizes n to study, in rows. Each must be at most the number of rows of X.
    n_replicas : int, default=3
        R, the number of independent subsamples per size.
    reference_size : int, optional
        Rows of the reference run. It should be larger than the largest subsample. None skips the
        reference.
    n_components : int, default=1
        Eigenpairs computed per run (the paper uses d_max = 3).
    index : int, default=0
        The eigenvector compared (0 = p_1).
    batch_size : int, optional
        Rows per mini-batch of the GGN products.
    trim_padding : bool, default=False
        Only for *causal* models, where the output at position t depends only on inputs up to t
        (autoregressive RNNs, causal transformers). Each subsample is sorted by length into
        mini-batches, and each mini-batch is cut after its last real position. G is unchanged and the
        cost follows the real tokens, not the padded length. Do not use it for bidirectional models.
        It needs ``mask``, and X's second axis must be the mask's sequence axis.
    eigen_method, max_matvecs, ncv, tol
        Passed to :func:`~glas_sklearn.eigen.top_eigenpairs`. The paper's l Lanczos steps are
        ``max_matvecs=l, ncv=l`` (l = 13 for d = 3).
    reuse_linearization : bool or "auto", default="auto"
        Passed to :class:`~glas_sklearn.ggn.GGNOperator` (one decision for all mini-batches).
        The cache is released after each run.
    return_eigen : bool, default=False
        Also return every run's :class:`~glas_sklearn.eigen.EigenResult`. For a large model each
        result holds D × ``n_components`` values.
    random_state : int, numpy Generator or None
        Seeds the subsamples and the Lanczos start vectors, with an independent stream per run.

    Returns
    -------
    dict
        ``"table"``
            pandas.DataFrame, one row per run. Columns: ``run`` ("replica" or "reference"),
            ``subsample_size``, ``replica``, ``n_records`` (N of the run, in tokens),
            ``lambda_1`` … ``lambda_k``, ``max_relative_residual``, ``converged``, ``n_matvecs``,
            ``seconds`` and ``alignment_to_reference`` (``|⟨p^(i), p_ref⟩|``, NaN without a reference).
        ``"summary"``
            pandas.DataFrame, one row per size. Columns: ``min_replica_alignment`` (the smallest
            off-diagonal entry, 1 when R = 1), ``mean_replica_alignment`` (mean of the off-diagonal
            entries), ``min_alignment_to_reference`` and ``mean_alignment_to_reference``.
        ``"replica_alignment"``
            dict size → numpy.ndarray (R, R). Symmetric, with unit diagonal.
        ``"reference_alignment"``
            dict size → numpy.ndarray (R,). Empty without a reference.
        ``"indices"``
            dict (size, replica) → sorted row indices of X used by that run, plus "reference".
        ``"eigen"``, ``"reference_eigen"``
            Only with ``return_eigen``: dict (size, replica) → EigenResult, and the reference's
            EigenResult (or None).

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.diagnostics import subsample_alignment
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    >>> X = torch.randn(200, 2)
    >>> res = subsample_alignment(net, X, subsample_sizes=[50, 100], n_replicas=2,
    ...                           reference_size=150, random_state=0)
    >>> res["replica_alignment"][50].shape, sorted(res["reference_alignment"])
    ((2, 2), [50, 100])
    >>> list(res["summary"].columns)  # doctest: +NORMALIZE_WHITESPACE
    ['subsample_size', 'min_replica_alignment', 'mean_replica_alignment',
     'min_alignment_to_reference', 'mean_alignment_to_reference']
    """
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a torch.Tensor, got {type(X).__name__}; convert with torch.as_tensor.")
    n_rows = X.shape[0]
    if isinstance(subsample_sizes, (int, np.integer)) or len(subsample_sizes) == 0:
        raise ValueError(f"subsample_sizes must be a non-empty sequence of ints, got {subsample_sizes!r}.")
    sizes = [check_positive_int("each subsample size", s) for s in subsample_sizes]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"subsample_sizes contains duplicates: {list(subsample_sizes)}.")
    n_replicas = check_positive_int("n_replicas", n_replicas)
    reference_size = check_positive_int("reference_size", reference_size, allow_none=True)
    n_components = check_positive_int("n_components", n_components)
    index = check_positive_int("index", index, minimum=0)
    if index >= n_components:
        raise ValueError(f"index={index} compares eigenvector {index + 1}, but only n_components={n_components} "
                         "are computed; raise n_components.")
    # GGNOperator checks its subsample too, but only when the run is reached: fail before the first eigen-solve.
    for name, s in [("subsample size", s) for s in sizes] + [("reference_size", reference_size)]:
        if s is not None and s > n_rows:
            raise ValueError(f"The {name} {s} is larger than the {n_rows} rows of X.")
    if reference_size is not None and reference_size <= max(sizes):
        logger.warning("reference_size=%d is not larger than the largest subsample (%d).",
                       reference_size, max(sizes))

    runs = ([("reference", reference_size, 0)] if reference_size is not None else [])
    runs += [("replica", s, r) for s in sizes for r in range(n_replicas)]
    seeds = np.random.SeedSequence(int(numpy_rng(random_state).integers(0, 2**63 - 1))).spawn(len(runs))

    records, vectors, eigen, indices = [], {}, {}, {}
    ref_vector, ref_eigen = None, None
    for (kind, size, r), seed in zip(runs, seeds, strict=True):
        rng = np.random.default_rng(seed)
        t0 = time.perf_counter()
        # The operator draws its own subsample from the run's stream (loss, mask and trim_padding are checked
        # there too); the Lanczos start vector comes from the same stream, after the rows.
        op = GGNOperator(model, X, loss=loss, mask=mask, batch_size=batch_size, subsample=size, random_state=rng,
                         trim_padding=trim_padding, reuse_linearization=reuse_linearization)
        rows = op.indices_
        lanczos_seed = int(rng.integers(0, 2**63 - 1))
        res = top_eigenpairs(op, n_components, method=eigen_method, tol=tol, max_matvecs=max_matvecs,
                             ncv=ncv, random_state=lanczos_seed)
        op.release()
        seconds = time.perf_counter() - t0
        row = {"run": kind, "subsample_size": size, "replica": r, "n_records": op.n_records}
        lam = res.eigenvalues.detach().cpu().numpy()
        for j in range(n_components):
            row[f"lambda_{j + 1}"] = float(lam[j]) if j < len(lam) else math.nan
        row.update(max_relative_residual=float(res.relative_residuals.max()), converged=res.converged,
                   n_matvecs=res.n_matvecs, seconds=seconds)
        records.append(row)
        p = res.eigenvectors[:, index].detach().cpu()
        if kind == "reference":
            ref_vector, ref_eigen = p, res
            indices["reference"] = rows
        else:
            vectors.setdefault(size, []).append(p)
            eigen[(size, r)] = res
            indices[(size, r)] = rows
        logger.info("subsample_alignment: %s n=%d replica %d: N=%d, lambda_1=%.4g, max rel. residual %.2e, %.1f s",
                    kind, size, r, op.n_records, float(lam[0]), row["max_relative_residual"], seconds)
        del op

    replica_alignment, reference_alignment, summary = {}, {}, []
    for size in sizes:
        A = eigenvector_alignment(vectors[size])
        replica_alignment[size] = A
        off = A[~np.eye(len(A), dtype=bool)]
        entry = {"subsample_size": size,
                 "min_replica_alignment": float(off.min()) if off.size else 1.0,
                 "mean_replica_alignment": float(off.mean()) if off.size else 1.0,
                 "min_alignment_to_reference": math.nan, "mean_alignment_to_reference": math.nan}
        if ref_vector is not None:
            a = eigenvector_alignment(vectors[size], reference=ref_vector)
            reference_alignment[size] = a
            entry.update(min_alignment_to_reference=float(a.min()), mean_alignment_to_reference=float(a.mean()))
        summary.append(entry)

    table = pd.DataFrame(records)
    table["alignment_to_reference"] = math.nan
    for size, a in reference_alignment.items():
        for r in range(n_replicas):
            table.loc[(table["run"] == "replica") & (table["subsample_size"] == size)
                      & (table["replica"] == r), "alignment_to_reference"] = float(a[r])
    if ref_vector is not None:
        table.loc[table["run"] == "reference", "alignment_to_reference"] = 1.0
    out = {"table": table, "summary": pd.DataFrame(summary), "replica_alignment": replica_alignment,
           "reference_alignment": reference_alignment, "indices": indices}
    if return_eigen:
        out["eigen"] = eigen
        out["reference_eigen"] = ref_eigen
    return out
