"""Posterior weight samples for models that are not tabular estimators, and the subsampling check.

The estimators cover tabular regression and classification. Other models, such as an autoregressive
sequence model that generates SMILES token by token, need the posterior as *weights* so that any
generation loop can run under them. This module provides those weights in two forms and adds the
paper's subsampling diagnostic (§2.4, Fig. 9).

Workflow for a sequence model
-----------------------------
1. Encode the training sequences: ``tokens, mask = glas_sklearn.smiles.encode_batch(smiles, vocab)``.
   The inputs are ``X = tokens[:, :-1]`` and ``mask`` is (n, T) with False at padding. The model
   returns next-token logits (n, T, V).
2. Build the posterior with :func:`glas_sklearn.laplace.fit_laplace_subspace`
   (``loss="cross_entropy", mask=mask``). Each unmasked token is one record, so N counts tokens.
   ``subsample`` is counted in sequences. ``scaling="mean"`` gives β = 1 and ``"standard"`` gives
   β = N. To compare both scalings from one eigendecomposition, build ``ActiveSubspacePosterior``
   twice from the same eigenpairs with ``beta_for``.
3. Draw weights θ = θ0 + P z. :func:`sample_parameters` returns parameter dicts for
   ``torch.func.functional_call``. :func:`perturbed_copy` yields a perturbed *copy* of the model for
   code that must call ``model(...)`` directly. The user's model is never modified, even when the
   block raises.
4. Check that the leading eigenvector does not depend on which subsample was drawn. Use
   :func:`subsample_alignment`: it runs R independent subsamples per size and reports
   |⟨p1^(i), p1^(j)⟩| (entries away from 1 flag unconverged runs) and |⟨p1, p1_ref⟩| against a
   larger reference run.

Examples
--------
>>> import torch
>>> from glas_sklearn.laplace import fit_laplace_subspace
>>> from glas_sklearn.sampling import perturbed_copy, sample_parameters
>>> from glas_sklearn.smiles import Vocabulary, encode_batch
>>> class TinyLM(torch.nn.Module):
...     def __init__(self, n_tokens):
...         super().__init__()
...         self.emb = torch.nn.Embedding(n_tokens, 8)
...         self.lstm = torch.nn.LSTM(8, 8, batch_first=True)
...         self.head = torch.nn.Linear(8, n_tokens)
...     def forward(self, tokens):
...         return self.head(self.lstm(self.emb(tokens))[0])
>>> smiles = ["CCO", "c1ccccc1", "CC(=O)O", "CCN", "OCC(N)C"]
>>> vocab = Vocabulary.from_smiles(smiles)
>>> tokens, mask = encode_batch(smiles, vocab)
>>> _ = torch.manual_seed(0)
>>> model = TinyLM(len(vocab))
>>> fit = fit_laplace_subspace(model, tokens[:, :-1], loss="cross_entropy", mask=mask,
...                            scaling="mean", n_components=2, random_state=0)
>>> fit.n_records == int(mask.sum()), fit.beta
(True, 1.0)
>>> for params in sample_parameters(fit.posterior, d=2, n_samples=3, random_state=0):
...     logits = torch.func.functional_call(model, params, (tokens[:, :-1],))
>>> logits.shape
torch.Size([5, 9, 10])
>>> z = fit.posterior.sample(1, d=2, random_state=1)[0]
>>> with perturbed_copy(model, fit.posterior, z) as sampled_model:
...     next_token_probs = torch.softmax(sampled_model(tokens[:, :1])[:, -1], dim=-1)
>>> next_token_probs.shape
torch.Size([5, 10])
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from ._checks import check_choice, check_positive_int, numpy_rng
from ._functional import ParameterLayout
from .eigen import eigenvector_alignment, top_eigenpairs
from .ggn import GGNOperator
from .posterior import ActiveSubspacePosterior

__all__ = ["sample_parameters", "perturbed_copy", "subsample_alignment"]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- weight samples


def _check_posterior(posterior) -> ActiveSubspacePosterior:
    if not isinstance(posterior, ActiveSubspacePosterior):
        raise TypeError(
            f"posterior must be an ActiveSubspacePosterior (e.g. fit_laplace_subspace(...).posterior), "
            f"got {type(posterior).__name__}."
        )
    return posterior


def sample_parameters(posterior: ActiveSubspacePosterior, d: int, n_samples: int,
                      random_state=None) -> Iterator[dict]:
    """Posterior weight samples θ_s = θ0 + P_d z_s as parameter dicts for ``functional_call``.

    Parameters
    ----------
    posterior : ActiveSubspacePosterior
        The low-rank posterior, for example ``fit_laplace_subspace(...).posterior``.
    d : int
        Subspace dimension, 1 ≤ d ≤ ``posterior.max_components``.
    n_samples : int
        Number of weight samples S.
    random_state : int, numpy Generator, torch.Generator or None
        Seeds the draws. For an int the coordinates are those of
        ``posterior.sample(n_samples, d, random_state)``. Every d uses the same standard normals
        (common random numbers), so runs at different d or β are paired.

    Returns
    -------
    iterator of dict
        S dicts that map each trainable parameter name to a tensor of its shape, dtype and device.
        Pass each one to ``torch.func.functional_call(model, params, args)``. Names the dict leaves
        out, such as buffers and frozen weights, keep the model's own values. All z are drawn when
        the function is called. Each dict is built only when the iterator reaches it, so only one
        sample of D weights is held at a time. Use ``list(...)`` only for small models.

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.posterior import ActiveSubspacePosterior
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Linear(3, 2)
    >>> P, _ = torch.linalg.qr(torch.randn(8, 2))
    >>> post = ActiveSubspacePosterior(net, torch.tensor([4.0, 1.0]), P, beta=1.0)
    >>> samples = list(sample_parameters(post, d=2, n_samples=4, random_state=0))
    >>> len(samples), sorted(samples[0]), samples[0]["weight"].shape
    (4, ['bias', 'weight'], torch.Size([2, 3]))
    """
    posterior = _check_posterior(posterior)
    z = posterior.sample(n_samples, d, random_state)
    return (posterior.parameters(row) for row in z)


def _check_same_layout(model: nn.Module, posterior: ActiveSubspacePosterior) -> None:
    layout = ParameterLayout.from_model(model)
    ref = posterior.layout
    if layout.names != ref.names or layout.shapes != ref.shapes:
        raise ValueError(
            f"The model's trainable parameters ({len(layout.names)} tensors, D={layout.size}) do not match "
            f"the posterior's ({len(ref.names)} tensors, D={ref.size}); pass the model the posterior was "
            "built from (same architecture, same parameters with requires_grad=True)."
        )
    if layout.dtype != ref.dtype or layout.device != ref.device:
        raise ValueError(
            f"The model's weights are {layout.dtype} on {layout.device}, the posterior's {ref.dtype} on "
            f"{ref.device}; move the model with .to('{ref.device}', {ref.dtype})."
        )


@contextlib.contextmanager
def perturbed_copy(model: nn.Module, posterior: ActiveSubspacePosterior, z: torch.Tensor) -> Iterator[nn.Module]:
    """Context manager yielding a copy of ``model`` with weights θ0 + P_d z.

    Use it for code that calls ``model(...)`` directly (generation loops with state, third-party
    samplers). Where ``torch.func.functional_call`` works, :func:`sample_parameters` is cheaper: it
    does not copy the module.

    Parameters
    ----------
    model : torch.nn.Module
        The trained model the posterior was built from. It is only read. The copy gets new parameter
        tensors, and its buffers are deep copies, so nothing done to the copy or inside the block can
        reach the model. That holds when the block raises too.
    posterior : ActiveSubspacePosterior
    z : torch.Tensor of shape (d,)
        Subspace coordinates, e.g. a row of ``posterior.sample(n, d, random_state)``. d ≤ K.

    Yields
    ------
    torch.nn.Module
        A deep copy of ``model`` in evaluation mode. Its trainable parameters equal θ0 + P_d z
        exactly (same ``requires_grad`` flags, no gradients). Its other state (buffers, frozen
        parameters) is copied from the model.

    Examples
    --------
    >>> import torch
    >>> from glas_sklearn.posterior import ActiveSubspacePosterior
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Linear(3, 2)
    >>> P, _ = torch.linalg.qr(torch.randn(8, 2))
    >>> post = ActiveSubspacePosterior(net, torch.tensor([4.0, 1.0]), P, beta=1.0)
    >>> before = net.weight.detach().clone()
    >>> with perturbed_copy(net, post, torch.tensor([0.5, -0.5])) as sampled:
    ...     out = sampled(torch.ones(1, 3))
    >>> torch.equal(net.weight, before), sampled is net
    (True, False)
    """
    posterior = _check_posterior(posterior)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    _check_same_layout(model, posterior)
    if not isinstance(z, torch.Tensor) or z.ndim != 1:
        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ValueError(f"z must be a 1-D tensor of subspace coordinates (d,), got {shape}; "
                         "take one row of posterior.sample(n, d).")
    params = posterior.parameters(z)
    # New parameters are substituted through the deepcopy memo: the model's own weights are never
    # cloned and then overwritten, and tied parameters stay tied in the copy.
    memo = {}
    for name, p in model.named_parameters():
        if name in params:
            memo[id(p)] = nn.Parameter(params[name].detach().clone(), requires_grad=p.requires_grad)
    sampled = copy.deepcopy(model, memo)
    sampled.eval()
    try:
        yield sampled
    finally:
        del sampled, memo, params


# ------------------------------------------------------------------------- subsampling check


def _operator_on_rows(model, X, mask, rows, loss, batch_size, trim_padding, reuse_linearization):
    idx = torch.as_tensor(rows, device=X.device)
    Xs = X[idx]
    ms = None if mask is None else mask[idx]
    return GGNOperator(model, Xs, loss=loss, mask=ms, batch_size=batch_size, trim_padding=trim_padding,
                       reuse_linearization=reuse_linearization)


def subsample_alignment(model: nn.Module, X: torch.Tensor, *, mask: torch.Tensor | None = None,
                        loss: str = "cross_entropy", subsample_sizes: Sequence[int], n_replicas: int = 3,
                        reference_size: int | None = None, n_components: int = 1, index: int = 0,
                        batch_size: int | None = None, trim_padding: bool = False,
                        eigen_method: str = "lanczos", max_matvecs: int | None = None, ncv: int | None = None,
                        tol: float = 1e-5, reuse_linearization="auto", return_eigen: bool = False,
                        random_state=None) -> dict:
    """How much the leading GGN eigenvector depends on the subsample it was computed from (paper Fig. 9).

    For every size n in ``subsample_sizes``, R = ``n_replicas`` independent subsamples of n rows
    (sequences) are drawn without replacement. The top ``n_components`` eigenpairs of the GGN on each
    subsample are computed. The R×R matrix |⟨p^(i), p^(j)⟩| of the compared eigenvector is formed.
    Entries away from 1 flag runs that did not converge or that depend on the subsample. With
    ``reference_size``, one more independent run on that many rows gives p_ref, and each replica's
    |⟨p^(i), p_ref⟩| is reported.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network (θ0). Never modified.
    X : torch.Tensor
        All available inputs, one row per sequence (token ids for sequence models).
    mask : torch.Tensor of bool, optional
        (n, T) padding mask for sequence outputs (n, T, M). Records are the unmasked tokens.
    loss : {"cross_entropy", "mse"}, default="cross_entropy"
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
            ``seconds`` and ``alignment_to_reference`` (|⟨p^(i), p_ref⟩|, NaN without a reference).
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
    >>> from glas_sklearn.sampling import subsample_alignment
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
    check_choice("loss", loss, ("mse", "cross_entropy"))
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
    for name, s in [("subsample size", s) for s in sizes] + [("reference_size", reference_size)]:
        if s is not None and s > n_rows:
            raise ValueError(f"The {name} {s} is larger than the {n_rows} rows of X.")
    if trim_padding:
        if mask is None:
            raise ValueError("trim_padding=True needs the padding mask (mask=...).")
        if X.ndim < 2 or X.shape[:2] != mask.shape:
            raise ValueError(f"trim_padding=True needs X's first two axes to match the mask {tuple(mask.shape)}, "
                             f"got X of shape {tuple(X.shape)}.")
    if reference_size is not None and reference_size <= max(sizes):
        logger.warning("reference_size=%d is not larger than the largest subsample (%d).",
                       reference_size, max(sizes))

    runs = ([("reference", reference_size, 0)] if reference_size is not None else [])
    runs += [("replica", s, r) for s in sizes for r in range(n_replicas)]
    seeds = np.random.SeedSequence(int(numpy_rng(random_state).integers(0, 2**63 - 1))).spawn(len(runs))

    records, vectors, eigen, indices = [], {}, {}, {}
    ref_vector, ref_eigen = None, None
    for (kind, size, r), seed in zip(runs, seeds):
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(n_rows, size=size, replace=False))  # as GGNOperator(subsample=...)
        lanczos_seed = int(rng.integers(0, 2**63 - 1))
        t0 = time.perf_counter()
        op = _operator_on_rows(model, X, mask, rows, loss, batch_size, trim_padding, reuse_linearization)
        if n_components >= op.shape[0]:
            raise ValueError(f"n_components={n_components} eigenpairs requested, but the model has only "
                             f"D={op.shape[0]} weights.")
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
