"""Posterior weight samples for models that are not tabular estimators.

The estimators cover tabular regression and classification. Other models, such as an autoregressive
sequence model that generates SMILES token by token, need the posterior as *weights* so that any
generation loop can run under them. This module provides those weights in two forms.

Workflow for a sequence model
-----------------------------
1. Encode the training sequences, e.g. with the optional SMILES tokenizer
   ``tokens, mask = glas_sklearn.contrib.smiles.encode_batch(smiles, vocab)``.
   The inputs are ``X = tokens[:, :-1]`` and ``mask`` is (n, T) with False at padding. The model
   returns next-token logits (n, T, V).
2. Build the posterior with :func:`glas_sklearn.laplace.fit_laplace_subspace`
   (``loss="cross_entropy", mask=mask``). Each unmasked token is one record, so N counts tokens.
   ``subsample`` is counted in sequences. ``scaling="mean"`` gives β = 1 and ``"standard"`` gives
   β = N. To compare both scalings from one eigendecomposition, build ``ActiveSubspacePosterior``
   twice from the same eigenpairs with ``likelihood.beta(scaling, N)``.
3. Draw weights θ = θ0 + P z. :func:`sample_parameters` returns parameter dicts for
   ``torch.func.functional_call``. :func:`perturbed_copy` yields a perturbed *copy* of the model for
   code that must call ``model(...)`` directly. The user's model is never modified, even when the
   block raises.
4. Check that the leading eigenvector does not depend on which subsample was drawn. Use
   :func:`glas_sklearn.diagnostics.subsample_alignment`: it runs R independent subsamples per size and reports
   ``|⟨p1^(i), p1^(j)⟩|`` (entries away from 1 flag unconverged runs) and ``|⟨p1, p1_ref⟩|`` against a
   larger reference run.

Examples
--------
>>> import torch
>>> from glas_sklearn.laplace import fit_laplace_subspace
>>> from glas_sklearn.sampling import perturbed_copy, sample_parameters
>>> from glas_sklearn.contrib.smiles import Vocabulary, encode_batch
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
from typing import Iterator

import torch
from torch import nn

from ._functional import ParameterLayout
from .adapters import unwrap_model
from .posterior import ActiveSubspacePosterior

__all__ = ["sample_parameters", "perturbed_copy"]


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
def perturbed_copy(model: nn.Module, posterior: ActiveSubspacePosterior, z: torch.Tensor, *,
                   share_frozen: bool = True) -> Iterator[nn.Module]:
    """Context manager yielding a copy of ``model`` with weights θ0 + P_d z.

    Use it for code that calls ``model(...)`` directly (generation loops with state, third-party
    samplers). Where ``torch.func.functional_call`` works, :func:`sample_parameters` is cheaper: it
    does not copy the module.

    Parameters
    ----------
    model : torch.nn.Module
        The trained model the posterior was built from (or the :class:`~glas_sklearn.adapters.ModelAdapter`
        around it). It is only read. The copy gets new tensors for the D trainable parameters, and its buffers
        are deep copies.
    posterior : ActiveSubspacePosterior
    z : torch.Tensor of shape (d,)
        Subspace coordinates, e.g. a row of ``posterior.sample(n, d, random_state)``. d ≤ K.
    share_frozen : bool, default=True
        The frozen parameters (``requires_grad=False``: a transformer's base under LoRA adapters) are the
        model's own tensors in the copy, so a sample costs D new weights, not a copy of the base. Writing into
        one inside the block would reach the model: such a write is detected when the block ends (a
        RuntimeError). False copies them too, so that nothing done to the copy can reach the model.

    Yields
    ------
    torch.nn.Module
        A copy of ``model`` in evaluation mode. Its trainable parameters equal θ0 + P_d z
        exactly (same ``requires_grad`` flags, no gradients). Its other state (buffers, and frozen
        parameters unless shared) is copied from the model.

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
    # cloned and then overwritten, and tied parameters stay tied in the copy. Shared frozen ones enter
    # the memo as themselves.
    memo, shared = {}, {}
    for name, p in unwrap_model(model).named_parameters():
        if name in params:
            memo[id(p)] = nn.Parameter(params[name].detach().clone(), requires_grad=p.requires_grad)
        elif share_frozen and not p.requires_grad:
            memo[id(p)] = p
            shared[name] = (p, p._version)
    sampled = copy.deepcopy(model, memo)
    sampled.eval()
    try:
        yield sampled
    finally:
        del sampled, memo, params
        written = [name for name, (p, version) in shared.items() if p._version != version]
        if written:
            raise RuntimeError(f"The block wrote into frozen parameters shared with the model ({written[:3]}"
                               f"{' …' if len(written) > 3 else ''}), so the model changed; use "
                               "perturbed_copy(..., share_frozen=False) for code that writes into the weights.")
