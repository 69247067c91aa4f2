"""GLAS for autoregressive sequence models: a 1-layer × 16 LSTM over SMILES from the fixture (paper §2.4).

Covers the masked GGN against a dense reference, token counting, β for both scalings, posterior weight
samples (functional and as a perturbed copy) that never touch the model, generation under a perturbed
copy, the scoped oneDNN switch for forward-mode AD through nn.LSTM, and the subsampling check.
"""

from __future__ import annotations

import doctest
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from glas_sklearn import sampling
from glas_sklearn._functional import autodiff_context
from glas_sklearn.contrib.smiles import Vocabulary, encode_batch, load_smiles, tokenize
from glas_sklearn.diagnostics import subsample_alignment
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.laplace import fit_laplace_subspace
from glas_sklearn.posterior import ActiveSubspacePosterior
from glas_sklearn.sampling import perturbed_copy, sample_parameters

from .reference import assert_unchanged, dense_ggn, flat_params, snapshot

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "smiles_sample.smi")


class SmallLM(nn.Module):
    """Embedding(V, 16) → LSTM(16, 16, 1 layer) → Linear(16, V): next-token logits (n, T, V)."""

    def __init__(self, n_tokens: int, hidden: int = 16):
        super().__init__()
        self.embedding = nn.Embedding(n_tokens, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=1, batch_first=True)
        self.linear = nn.Linear(hidden, n_tokens)

    def forward(self, tokens):
        return self.linear(self.lstm(self.embedding(tokens))[0])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return load_smiles(FIXTURE)


@pytest.fixture(scope="module")
def vocab(corpus) -> Vocabulary:
    return Vocabulary.from_smiles(corpus)


@pytest.fixture(scope="module")
def short100(corpus) -> list[str]:
    """The 100 shortest SMILES of the fixture (14 to 39 tokens), in fixture order: the LSTM's cost per
    product grows with the padded length, and this keeps the eigen solves to seconds."""
    cutoff = sorted(len(tokenize(s)) for s in corpus)[99]
    return [s for s in corpus if len(tokenize(s)) <= cutoff][:100]


@pytest.fixture(scope="module")
def data(short100, vocab):
    """100 SMILES as teacher-forcing inputs (n, T) and their target mask (n, T)."""
    tokens, mask = encode_batch(short100, vocab)
    return tokens[:, :-1], mask


def _model(vocab, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return SmallLM(len(vocab)).to(dtype)


@pytest.fixture(scope="module")
def fitted(vocab, data):
    X, mask = data
    model = _model(vocab)
    fit = fit_laplace_subspace(model, X, loss="cross_entropy", mask=mask, scaling="mean", n_components=3,
                               tol=1e-3, random_state=0)
    return model, fit


# ---------------------------------------------------------------------------------- curvature


def test_ggn_matches_dense_reference_with_masks(corpus):
    # The five shortest SMILES of different lengths: real padding, and a dense Jacobian that fits in memory.
    by_len = {}
    for s in sorted(corpus, key=len):
        by_len.setdefault(len(tokenize(s)), s)
    short = list(by_len.values())[:5]
    # The dense G costs O(N V D²): a vocabulary of just these SMILES keeps V and D small.
    small_vocab = Vocabulary.from_smiles(short)
    tokens, mask = encode_batch(short, small_vocab)
    X = tokens[:, :-1]
    assert not bool(mask.all())
    net = _model(small_vocab)
    G = dense_ggn(net, X, "cross_entropy", mask)
    V = torch.randn(G.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for reuse in (True, False):
        op = GGNOperator(net, X, loss="cross_entropy", mask=mask, batch_size=4, reuse_linearization=reuse)
        assert _rel(op @ V, G @ V) < 1e-11
    for reuse in (True, False):  # causal LSTM: cutting length-sorted batches after their last token is exact
        trimmed = GGNOperator(net, X, loss="cross_entropy", mask=mask, batch_size=2, trim_padding=True,
                              reuse_linearization=reuse)
        assert trimmed.n_records == int(mask.sum())
        assert _rel(trimmed @ V, G @ V) < 1e-11
    # every batch is cut after its own last real position, so fewer positions are evaluated
    assert sum(xb.numel() for xb, _ in trimmed._batches) < X.numel()
    assert all(bool(mb[:, -1].any()) for _, mb in trimmed._batches)


def test_padding_has_no_effect_on_G(corpus, vocab):
    rows = corpus[:20]
    longest = max(corpus, key=len)
    alone, mask_alone = encode_batch(rows, vocab)
    together, mask_together = encode_batch(rows + [longest], vocab)
    X_pad, mask_pad = together[:20, :-1].clone(), mask_together[:20]
    assert X_pad.shape[1] > alone.shape[1] - 1
    # Whatever sits at padded positions must not matter either.
    gen = torch.Generator().manual_seed(1)
    X_pad[~mask_pad] = torch.randint(0, len(vocab), (int((~mask_pad).sum()),), generator=gen)
    net = _model(vocab)
    a = GGNOperator(net, alone[:, :-1], loss="cross_entropy", mask=mask_alone)
    b = GGNOperator(net, X_pad, loss="cross_entropy", mask=mask_pad)
    assert a.n_records == b.n_records
    v = torch.randn(a.shape[0], dtype=torch.float64, generator=gen)
    assert _rel(b @ v, a @ v) < 1e-12


def test_n_counts_tokens(short100, vocab, data):
    X, mask = data
    op = GGNOperator(_model(vocab), X, loss="cross_entropy", mask=mask)
    expected = sum(len(tokenize(s)) + 1 for s in short100)  # the tokens and the stop token
    assert op.n_records == int(mask.sum()) == expected
    assert op.n_records < X.numel()


def test_fit_scalings_beta_in_tokens(vocab, data):
    X, mask = data
    model = _model(vocab)
    N = int(mask.sum())
    kw = dict(loss="cross_entropy", mask=mask, n_components=1, tol=1e-2, random_state=0)
    std = fit_laplace_subspace(model, X, scaling="standard", **kw)
    mean = fit_laplace_subspace(model, X, scaling="mean", **kw)
    assert std.n_records == mean.n_records == N
    assert std.beta == float(N) and mean.beta == 1.0
    torch.testing.assert_close(std.eigen.eigenvalues, mean.eigen.eigenvalues)
    # Standard scaling contracts the leading directions far more than mean scaling.
    assert float(std.posterior.contraction(1)[0]) > float(mean.posterior.contraction(1)[0])
    # A subsample is counted in sequences; N is then the tokens of those sequences.
    sub = fit_laplace_subspace(model, X, loss="cross_entropy", mask=mask, scaling="standard", n_components=1,
                               tol=1e-2, subsample=40, random_state=3)
    rows = np.sort(np.random.default_rng(3).choice(X.shape[0], size=40, replace=False))
    assert sub.n_records == int(mask[torch.as_tensor(rows)].sum()) == sub.beta


# ------------------------------------------------------------------------------ weight samples


def test_sample_parameters_reproducible_and_equal_theta0_plus_Pz(fitted, data):
    model, fit = fitted
    post = fit.posterior
    a = list(sample_parameters(post, 2, 4, random_state=7))
    b = list(sample_parameters(post, 2, 4, random_state=7))
    c = list(sample_parameters(post, 2, 4, random_state=8))
    assert len(a) == 4 and set(a[0]) == {n for n, _ in model.named_parameters()}
    for pa, pb in zip(a, b, strict=True):
        assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not torch.equal(a[0]["linear.weight"], c[0]["linear.weight"])
    z = post.sample(4, 2, random_state=7)
    P = post.eigenvectors[:, :2]
    theta0 = flat_params(model)
    eps = torch.finfo(torch.float64).eps
    for s, params in enumerate(a):
        flat = post.layout.flatten(params)
        # θ0 + P z with d = 2: the library forms z @ Pᵀ, the reference P @ z; the same three roundings in either
        # kernel's order, so they agree to (d + 1) ulps of the terms' magnitude |θ0| + |P| |z|.
        bound = 3 * eps * (theta0.abs() + P.abs() @ z[s].abs())
        assert bool(((flat - (theta0 + P @ z[s])).abs() <= bound).all())
        assert params["linear.weight"].shape == model.linear.weight.shape


def test_samples_and_copies_leave_model_untouched(fitted, data):
    model, fit = fitted
    X, _ = data
    model.train()  # the copy is put in eval mode; the user's flags must stay as they are
    before = snapshot(model)
    try:
        for params in sample_parameters(fit.posterior, 3, 3, random_state=0):
            functional_call(model, params, (X[:5],))
        z = fit.posterior.sample(1, 3, random_state=1)[0]
        with perturbed_copy(model, fit.posterior, z) as m:
            assert m is not model and not m.training
            m(X[:5]).sum().backward()  # gradients land on the copy only
            with torch.no_grad():
                m.linear.weight.add_(1.0)
        assert_unchanged(model, before)
    finally:
        model.eval()


def test_perturbed_copy_leaves_model_untouched_when_block_raises(fitted, data):
    model, fit = fitted
    X, _ = data
    before = snapshot(model)
    z = fit.posterior.sample(1, 2, random_state=2)[0]
    with pytest.raises(RuntimeError, match="inside the block"):
        with perturbed_copy(model, fit.posterior, z) as m:
            with torch.no_grad():
                for p in m.parameters():
                    p.mul_(0.0)
            raise RuntimeError("failure inside the block")
    assert_unchanged(model, before)


def test_perturbed_copy_weights_are_exactly_theta0_plus_Pz(fitted, data):
    model, fit = fitted
    X, _ = data
    post = fit.posterior
    z = post.sample(1, 3, random_state=4)[0]
    expected = post.parameters(z)
    with perturbed_copy(model, post, z) as m:
        got = dict(m.named_parameters())
        for name, t in expected.items():
            # the copy holds the tensors posterior.parameters(z) computed (the same path): bitwise equal
            assert torch.equal(got[name], t), name
            assert got[name].data_ptr() != dict(model.named_parameters())[name].data_ptr()
        # The copy's own forward (nn.LSTM's flat-weight kernel) agrees with the functional call (the per-gate
        # path): two kernels summing in different orders, so a few ulps times √(reduction length), here the
        # hidden size times the T recurrent steps the error can accumulate over (≈ 4e-14 for float64).
        out, ref = m(X[:7]), functional_call(model, expected, (X[:7],))
        tol = 8 * torch.finfo(out.dtype).eps * (m.lstm.hidden_size * X.shape[1]) ** 0.5
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        assert float((post.layout.flatten(got) - post.theta0).detach().norm()) > 0


def _sample_sequences(model, vocab, n, max_len, generator):
    """A tiny ancestral sampler: feed the prefix, draw the next token from the softmax, stop at '$'."""
    seqs = torch.full((n, 1), vocab.start_id, dtype=torch.long)
    done = torch.zeros(n, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(max_len):
            probs = torch.softmax(model(seqs)[:, -1].float(), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, vocab.stop_id), nxt)
            seqs = torch.cat([seqs, nxt[:, None]], dim=1)
            done |= nxt == vocab.stop_id
            if bool(done.all()):
                break
    return [vocab.decode(row.tolist(), strict=False) for row in seqs]


def test_generation_under_perturbed_copy(fitted, vocab):
    model, fit = fitted
    before = snapshot(model)
    outputs = []
    for z in fit.posterior.sample(3, 3, random_state=5):
        with perturbed_copy(model, fit.posterior, z) as m:
            outputs += _sample_sequences(m, vocab, 8, 15, torch.Generator().manual_seed(0))
    assert len(outputs) == 24 and all(isinstance(s, str) for s in outputs)
    assert_unchanged(model, before)


# -------------------------------------------------------------- forward-mode AD through nn.LSTM


@pytest.mark.filterwarnings("ignore:TF32 acceleration:UserWarning")
@pytest.mark.parametrize("enabled", [True, False])
def test_jvp_through_lstm_and_onednn_flag_restored(vocab, data, enabled):
    X, mask = data
    model = _model(vocab, dtype=torch.float32)
    with torch.backends.mkldnn.flags(enabled=enabled):
        assert torch.backends.mkldnn.enabled is enabled
        op = GGNOperator(model, X[:10], loss="cross_entropy", mask=mask[:10], reuse_linearization=False)
        gen = torch.Generator().manual_seed(0)
        v = torch.randn(op.shape[0], generator=gen)
        gv = op @ v  # forward-mode JVP through nn.LSTM on CPU
        assert torch.isfinite(gv).all() and float(v @ gv) >= 0
        assert torch.backends.mkldnn.enabled is enabled
        P, _ = torch.linalg.qr(torch.randn(op.shape[0], 2, generator=gen))
        post = ActiveSubspacePosterior(model, torch.tensor([2.0, 1.0]), P, beta=1.0)
        var = post.linearized_variance(X[:4], 2)  # torch.func.jvp through nn.LSTM
        assert var.shape == (4, X.shape[1], len(vocab)) and torch.isfinite(var).all()
        assert torch.backends.mkldnn.enabled is enabled


def test_onednn_flag_restored_when_autodiff_block_raises(vocab):
    model = _model(vocab)
    state = torch.backends.mkldnn.enabled
    with pytest.raises(ValueError):
        with autodiff_context(model, torch.device("cpu")):
            assert torch.backends.mkldnn.enabled is False
            raise ValueError("boom")
    assert torch.backends.mkldnn.enabled is state


def test_onednn_switch_is_silent_and_touches_nothing_else(vocab, monkeypatch):
    """Switching oneDNN off for an RNN warns nothing (torch's ``mkldnn.flags`` would warn about TF32 on a CPU build),
    without the process-wide warning filters (which threads share: serving threads enter and leave this block at
    once), and leaves oneDNN's other settings as they were."""
    import warnings

    model = _model(vocab)
    tf32 = torch._C._get_onednn_allow_tf32()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        touched = []
        for name in ("filterwarnings", "simplefilter", "catch_warnings"):
            original = getattr(warnings, name)
            monkeypatch.setattr(warnings, name, lambda *a, _n=name, _f=original, **k: touched.append(_n) or _f(*a, **k))
        try:
            with autodiff_context(model, torch.device("cpu")):
                assert torch.backends.mkldnn.enabled is False
        finally:
            monkeypatch.undo()
    assert not caught and not touched and torch._C._get_onednn_allow_tf32() == tf32


# --------------------------------------------------------------------------- subsampling check


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_subsample_alignment_matrix(vocab, data):
    X, mask = data
    model = _model(vocab)
    before = snapshot(model)
    res = subsample_alignment(model, X, mask=mask, subsample_sizes=[20, 40], n_replicas=3, reference_size=80,
                              n_components=2, max_matvecs=8, ncv=8, return_eigen=True, random_state=0)
    p_ref = res["reference_eigen"].eigenvectors[:, 0]
    for size in (20, 40):
        A = res["replica_alignment"][size]
        assert A.shape == (3, 3)
        # the entries are |<p_i, p_j>| of the replicas' own leading eigenvectors, in replica order
        # (unit vectors in float64: products of 3k terms, agree to 1e-12)
        p = [res["eigen"][(size, r)].eigenvectors[:, 0] for r in range(3)]
        expected = np.array([[abs(float(p[i] @ p[j]) / float(p[i].norm() * p[j].norm())) for j in range(3)]
                             for i in range(3)])
        np.testing.assert_allclose(A, expected, rtol=0, atol=1e-12)
        assert ((A >= 0) & (A <= 1 + 1e-6)).all()
        a = res["reference_alignment"][size]
        assert a.shape == (3,) and ((a >= 0) & (a <= 1 + 1e-6)).all()
        np.testing.assert_allclose(a, [abs(float(q @ p_ref) / float(q.norm() * p_ref.norm())) for q in p],
                                   rtol=0, atol=1e-12)
    table = res["table"]
    assert len(table) == 1 + 2 * 3
    assert list(table["run"]).count("reference") == 1
    for (size, r), rows in ((k, v) for k, v in res["indices"].items() if k != "reference"):
        assert len(rows) == size
        row = table[(table.run == "replica") & (table.subsample_size == size) & (table.replica == r)].iloc[0]
        assert row["n_records"] == int(mask[torch.as_tensor(rows)].sum())
    assert list(res["summary"]["subsample_size"]) == [20, 40]
    assert_unchanged(model, before)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_subsample_alignment_trimmed_padding_is_exact(vocab, data):
    X, mask = data
    model = _model(vocab)
    kw = dict(mask=mask, subsample_sizes=[30], n_replicas=2, reference_size=60, n_components=2, batch_size=15,
              max_matvecs=6, ncv=6, random_state=1, return_eigen=True)
    plain = subsample_alignment(model, X, **kw)
    trimmed = subsample_alignment(model, X, trim_padding=True, **kw)
    for key in plain["eigen"]:
        torch.testing.assert_close(trimmed["eigen"][key].eigenvalues, plain["eigen"][key].eigenvalues,
                                   rtol=1e-8, atol=0)
    np.testing.assert_allclose(trimmed["replica_alignment"][30], plain["replica_alignment"][30], atol=1e-6)
    np.testing.assert_allclose(trimmed["reference_alignment"][30], plain["reference_alignment"][30], atol=1e-6)


# ---------------------------------------------------------------------------------- errors, docs


def test_argument_errors(fitted, vocab, data):
    model, fit = fitted
    X, mask = data
    other = SmallLM(len(vocab), hidden=8).double()
    z = fit.posterior.sample(2, 2, random_state=0)
    with pytest.raises(ValueError, match="do not match"):
        with perturbed_copy(other, fit.posterior, z[0]):
            pass
    with pytest.raises(ValueError, match="1-D"):
        with perturbed_copy(model, fit.posterior, z):
            pass
    with pytest.raises(TypeError, match="ActiveSubspacePosterior"):
        sample_parameters(object(), 1, 2)
    with pytest.raises(ValueError):
        sample_parameters(fit.posterior, 4, 2)  # d > K
    with pytest.raises(ValueError, match="larger than"):
        subsample_alignment(model, X, mask=mask, subsample_sizes=[500])
    with pytest.raises(ValueError, match="mask"):
        subsample_alignment(model, X, subsample_sizes=[10], trim_padding=True)
    with pytest.raises(ValueError, match="trim_padding=True needs the padding mask"):
        GGNOperator(model, X, loss="cross_entropy", trim_padding=True)
    with pytest.raises(ValueError, match="trim_padding=True needs the padding mask"):
        GGNOperator(model, X[:, :-1], loss="cross_entropy", mask=mask[:, :-1].clone()[:, :-1], trim_padding=True)
    with pytest.raises(ValueError, match="trim_padding must be True or False"):
        GGNOperator(model, X, loss="cross_entropy", mask=mask, trim_padding="yes")
    with pytest.raises(ValueError, match="n_components"):
        subsample_alignment(model, X, mask=mask, subsample_sizes=[10], index=1)


def test_module_examples_run():
    result = doctest.testmod(sampling, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
