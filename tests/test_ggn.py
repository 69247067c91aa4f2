import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from glas_sklearn.ggn import CurvatureOperator, GGNOperator

from .reference import TinyLSTM, assert_unchanged, dense_ggn, mlp, snapshot


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _randn(*shape, seed, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _tokens(*shape, seed, vocab=6):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("loss,n_out", [("mse", 1), ("mse", 3), ("cross_entropy", 4)])
def test_matches_dense_float64(loss, n_out, reuse):
    net = mlp(n_out=n_out)
    X = _randn(23, 3, seed=1)
    G = dense_ggn(net, X, loss)
    op = GGNOperator(net, X, loss=loss, reuse_linearization=reuse)
    V = _randn(op.shape[0], 4, seed=2)
    assert op.shape == G.shape
    assert op.n_records == 23
    assert _rel(op @ V, G @ V) < 1e-12
    assert _rel(op.matvec(V[:, 0]), G @ V[:, 0]) < 1e-12
    assert op.n_products == 5


def test_float32_products_close_to_float64_reference():
    net64 = mlp(n_out=2)
    X = _randn(40, 3, seed=3)
    G = dense_ggn(net64, X)
    op = GGNOperator(copy.deepcopy(net64).float(), X.float())
    assert op.dtype == torch.float32
    v = _randn(op.shape[0], seed=4)
    assert _rel((op @ v.float()).double(), G @ v) < 1e-5


@pytest.mark.parametrize("reuse", [True, False])
def test_lstm_with_masked_sequences(reuse):
    torch.manual_seed(0)
    net = TinyLSTM().double()
    tokens = _tokens(7, 5, seed=5)
    mask = torch.ones(7, 5, dtype=torch.bool)
    mask[0, 3:] = False
    mask[4, 1:] = False
    G = dense_ggn(net, tokens, "cross_entropy", mask)
    op = GGNOperator(net, tokens, loss="cross_entropy", mask=mask, batch_size=3, reuse_linearization=reuse)
    assert op.n_records == int(mask.sum())
    V = _randn(op.shape[0], 2, seed=6)
    assert _rel(op @ V, G @ V) < 1e-12


def test_padding_has_no_effect():
    torch.manual_seed(0)
    net = TinyLSTM().double()
    tokens = _tokens(6, 4, seed=7)
    mask = torch.ones(6, 4, dtype=torch.bool)
    # Append three padded positions filled with arbitrary tokens: the LSTM is causal, so the real
    # positions see the same outputs, and the padded ones must contribute nothing.
    padded = torch.cat([tokens, _tokens(6, 3, seed=8)], dim=1)
    pmask = torch.cat([mask, torch.zeros(6, 3, dtype=torch.bool)], dim=1)
    a = GGNOperator(net, tokens, loss="cross_entropy", mask=mask)
    b = GGNOperator(net, padded, loss="cross_entropy", mask=pmask)
    assert a.n_records == b.n_records == 24
    v = _randn(a.shape[0], seed=9)
    assert _rel(b @ v, a @ v) < 1e-12


def test_minibatches_equal_full_batch():
    net = mlp(n_out=2)
    X = _randn(50, 3, seed=10)
    v = _randn(sum(p.numel() for p in net.parameters()), seed=11)
    full = GGNOperator(net, X) @ v
    for bs in (1, 7, 50, 64):
        assert _rel(GGNOperator(net, X, batch_size=bs) @ v, full) < 1e-12


def test_subsample_reproducible_and_exact():
    net = mlp()
    X = _randn(60, 3, seed=12)
    # Both pinned to the cached path ("auto" decides from the free memory at the first product, which may
    # differ between a and b): then a and b replay the same computation on the same rows, bit for bit.
    a = GGNOperator(net, X, subsample=20, random_state=3, reuse_linearization=True)
    b = GGNOperator(net, X, subsample=20, random_state=3, reuse_linearization=True)
    c = GGNOperator(net, X, subsample=20, random_state=4)
    assert a.n_records == 20
    np.testing.assert_array_equal(a.indices_, b.indices_)
    assert not np.array_equal(a.indices_, c.indices_)
    v = _randn(a.shape[0], seed=13)
    G_sub = dense_ggn(net, X[torch.as_tensor(a.indices_)])
    assert _rel(a @ v, G_sub @ v) < 1e-12
    assert torch.equal(a @ v, b @ v)


def test_subsample_semantics_are_the_documented_draw():
    """subsample=m with a numpy Generator takes np.sort(rng.choice(n, m, replace=False)) from that generator and
    advances it, and the operator is the one built on X[indices_]: what a caller needs to draw successive
    independent subsamples from one stream (the subsample-alignment study) without drawing rows itself."""
    net = mlp()
    X = _randn(60, 3, seed=14)
    rng, twin = np.random.default_rng(7), np.random.default_rng(7)
    first = GGNOperator(net, X, subsample=25, random_state=rng, reuse_linearization=False)
    second = GGNOperator(net, X, subsample=25, random_state=rng, reuse_linearization=False)
    np.testing.assert_array_equal(first.indices_, np.sort(twin.choice(60, size=25, replace=False)))
    np.testing.assert_array_equal(second.indices_, np.sort(twin.choice(60, size=25, replace=False)))
    assert rng.integers(0, 2**62) == twin.integers(0, 2**62)  # the stream continues where the draws left it
    assert GGNOperator(net, X).indices_ is None
    # Same rows, same (streamed) path, same mini-batches: the same computation replayed, bit for bit.
    on_rows = GGNOperator(net, X[torch.as_tensor(first.indices_)], reuse_linearization=False)
    v = _randn(first.shape[0], seed=15)
    assert torch.equal(first @ v, on_rows @ v)
    with pytest.raises(ValueError, match="subsample=61 is larger than the 60 rows"):
        GGNOperator(net, X, subsample=61, random_state=rng)


@pytest.mark.parametrize("loss,n_out", [("mse", 2), ("cross_entropy", 3)])
def test_cached_and_streamed_products_agree(loss, n_out):
    """Two different computational paths (cached double-backward graph vs fresh forward-mode JVP): equal up to
    round-off, relative error below 50·eps·√D."""
    net = mlp(n_out=n_out, seed=2)
    X = _randn(37, 3, seed=16)
    cached = GGNOperator(net, X, loss=loss, batch_size=10, reuse_linearization=True)
    streamed = GGNOperator(net, X, loss=loss, batch_size=10, reuse_linearization=False)
    V = _randn(cached.shape[0], 3, seed=17)
    tol = 50 * torch.finfo(torch.float64).eps * math.sqrt(cached.shape[0])
    assert _rel(cached @ V, streamed @ V) < tol  # blocks: the vectorised path, which uses neither
    # single products: one through the cached graph, one streamed
    assert _rel(_columns(cached, V), _columns(streamed, V)) < tol
    assert cached._use_cache is True and streamed._use_cache is False


def test_model_left_exactly_as_found():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Dropout(0.5), nn.Linear(6, 2)).double()
    net.train()  # dropout active in the user's model
    X = _randn(30, 3, seed=18)
    net(X).sum().backward()  # the user has gradients lying around
    before = snapshot(net)
    op = GGNOperator(net, X)
    v = _randn(op.shape[0], seed=19)
    g1, g2 = op @ v, op @ v
    assert_unchanged(net, before)
    # Evaluated in eval mode (dropout off): deterministic (one operator decides its path once, so g1 and g2
    # replay the same computation, bit for bit) and equal to the eval-mode reference.
    assert torch.equal(g1, g2)
    net_eval = nn.Sequential(*[m for m in net]).eval()
    assert _rel(g1, dense_ggn(net_eval, X) @ v) < 1e-12
    assert net.training


def test_operator_snapshots_theta0():
    net = mlp()
    X = _randn(20, 3, seed=20)
    op = GGNOperator(net, X)
    v = _randn(op.shape[0], seed=21)
    before = op @ v  # the operator keeps the path it chose here: the product below replays it
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    assert torch.equal(op @ v, before)


def test_to_scipy_linear_operator():
    from scipy.sparse.linalg import eigsh

    net = mlp()
    X = _randn(25, 3, seed=22)
    op = GGNOperator(net, X)
    G = dense_ggn(net, X).numpy()
    lin = op.to_scipy()
    assert lin.shape == G.shape and lin.dtype == np.float64
    x = np.random.default_rng(0).standard_normal((G.shape[0], 3))
    np.testing.assert_allclose(lin @ x[:, 0], G @ x[:, 0], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(lin @ x, G @ x, rtol=1e-10, atol=1e-14)
    vals = eigsh(lin, k=3, which="LA", return_eigenvectors=False)
    np.testing.assert_allclose(np.sort(vals), np.linalg.eigvalsh(G)[-3:], rtol=1e-8)


def test_works_under_no_grad_and_without_grad_layers():
    net = mlp()
    for p in net[0].parameters():
        p.requires_grad_(False)  # frozen first layer: not part of the D weights
    X = _randn(15, 3, seed=23)
    op = GGNOperator(net, X)
    D = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert op.shape == (D, D)
    with torch.no_grad():
        out = op @ torch.ones(D, dtype=torch.float64)
    assert _rel(out, dense_ggn(net, X) @ torch.ones(D, dtype=torch.float64)) < 1e-12


def test_bad_inputs_raise_clear_errors():
    net = mlp()
    X = _randn(10, 3, seed=24)
    with pytest.raises(ValueError, match="NaN"):
        GGNOperator(net, torch.full((4, 3), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match="empty"):
        GGNOperator(net, torch.zeros(0, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="dtype"):
        GGNOperator(net, X.float())
    with pytest.raises(TypeError, match="torch.Tensor"):
        GGNOperator(net, X.numpy())
    with pytest.raises(ValueError, match="loss"):
        GGNOperator(net, X, loss="hinge")
    with pytest.raises(ValueError, match="rows"):
        GGNOperator(net, X, y=torch.zeros(9, dtype=torch.float64))
    with pytest.raises(ValueError, match="subsample"):
        GGNOperator(net, X, subsample=11)
    with pytest.raises(ValueError, match="batch_size"):
        GGNOperator(net, X, batch_size=0)
    frozen = mlp()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        GGNOperator(frozen, X)
    seq = TinyLSTM().double()
    tokens = _tokens(4, 5, seed=25)
    with pytest.raises(ValueError, match="mask"):
        GGNOperator(seq, tokens, loss="cross_entropy", mask=torch.ones(4, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="boolean"):
        GGNOperator(seq, tokens, loss="cross_entropy", mask=torch.ones(4, 5))
    with pytest.raises(ValueError, match="no record"):
        GGNOperator(seq, tokens, loss="cross_entropy", mask=torch.zeros(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"cannot be evaluated on X, whose rows have shape \(4,\)"):
        GGNOperator(net, _randn(10, 4, seed=26))  # a 3-feature network given 4 features
    op = GGNOperator(net, X)
    with pytest.raises(ValueError, match="shape"):
        op @ torch.ones(op.shape[0] + 1, dtype=torch.float64)
    with pytest.raises(TypeError, match="dtype"):
        op @ torch.ones(op.shape[0])
    with pytest.raises(TypeError, match="to_scipy"):
        op @ np.ones(op.shape[0])


# --------------------------------------------------------------------- the operator protocol


class DenseCurvature(CurvatureOperator):
    """The smallest CurvatureOperator: a dense symmetric matrix, recording the block shapes _matmat receives."""

    def __init__(self, A: torch.Tensor):
        self.A, self.dtype, self.device = A, A.dtype, A.device
        self.blocks = []

    @property
    def shape(self):
        return tuple(self.A.shape)

    def _matmat(self, V):
        self.blocks.append(tuple(V.shape))
        return self.A @ V


def spd_matrix(D: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """A = Q diag(λ) Qᵀ with λ spread over [1, 100] (float64 reference), and A in ``dtype``."""
    Q, _ = torch.linalg.qr(_randn(D, D, seed=seed))
    lam = torch.linspace(100.0, 1.0, D, dtype=torch.float64)
    A64 = (Q * lam) @ Q.T
    A64 = (A64 + A64.T) / 2
    return A64, A64.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_curvature_operator_products_match_its_matrix(dtype):
    from scipy.sparse.linalg import eigsh

    D = 40
    A64, A = spd_matrix(D, seed=30, dtype=dtype)
    op = DenseCurvature(A)
    v64, V64 = _randn(D, seed=31), _randn(D, 3, seed=32)
    v, V = v64.to(dtype), V64.to(dtype)
    eps = torch.finfo(dtype).eps
    tol = 50 * eps * math.sqrt(D)  # relative error of a product of a well-scaled D×D matrix, with margin
    assert op.shape == (D, D)
    mv, at_v, mm, at_V = op.matvec(v), op @ v, op.matmat(V), op @ V
    assert mv.shape == at_v.shape == (D,) and mm.shape == at_V.shape == (D, 3)
    assert mv.dtype == mm.dtype == dtype
    for got, ref in ((mv, A64 @ v64), (at_v, A64 @ v64), (mm, A64 @ V64), (at_V, A64 @ V64)):
        assert _rel(got.double(), ref) < tol
    assert op.blocks == [(D, 1), (D, 1), (D, 3), (D, 3)]  # a block reaches _matmat whole
    lin = op.to_scipy()
    assert lin.shape == (D, D) and lin.dtype == np.float64
    X = V64.numpy()
    op.blocks.clear()
    np.testing.assert_allclose(lin.matmat(X), (A64 @ V64).numpy(), rtol=0, atol=tol * float(A64.norm(2)) * 3)
    np.testing.assert_allclose(lin @ X[:, 0], (A64 @ V64[:, 0]).numpy(), rtol=0, atol=tol * float(A64.norm(2)) * 3)
    assert op.blocks == [(D, 3), (D, 1)]  # scipy's block product is one _matmat call, not a loop of columns
    vals = np.sort(eigsh(lin, k=3, which="LA", tol=1e-10, return_eigenvectors=False))
    # eigenvalues of A in its own dtype: perturbed by at most ‖A − A64‖ ≤ eps·√D·λ_max (Weyl), with margin
    np.testing.assert_allclose(vals, np.linalg.eigvalsh(A64.numpy())[-3:], rtol=0, atol=tol * 100.0)


def test_curvature_operator_checks_inputs_and_outputs():
    A64, _ = spd_matrix(6, seed=33)
    op = DenseCurvature(A64)
    with pytest.raises(ValueError, match=r"shape \(7,\), expected \(6,\)"):
        op.matvec(torch.ones(7, dtype=torch.float64))
    with pytest.raises(ValueError, match="expected"):
        op.matvec(torch.ones(6, 2, dtype=torch.float64))  # matvec takes vectors only
    with pytest.raises(TypeError, match="dtype"):
        op @ torch.ones(6)
    with pytest.raises(TypeError, match="to_scipy"):
        op @ np.ones(6)

    class Broken(DenseCurvature):
        def _matmat(self, V):
            return V[:, :1]

    with pytest.raises(RuntimeError, match="_matmat returned"):
        Broken(A64) @ torch.ones(6, 2, dtype=torch.float64)

    class Incomplete(CurvatureOperator):
        dtype, device, shape = torch.float64, torch.device("cpu"), (2, 2)

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()


def test_ggn_is_a_curvature_operator_with_one_product_path():
    net = mlp()
    X = _randn(20, 3, seed=34)
    op = GGNOperator(net, X)
    assert isinstance(op, CurvatureOperator)
    V = _randn(op.shape[0], 3, seed=35)
    G = dense_ggn(net, X)
    np.testing.assert_allclose(op.to_scipy().matmat(V.numpy()), (G @ V).numpy(), rtol=1e-10, atol=1e-14)
    assert op.n_products == 3  # a block of 3 counts 3 single-vector products
    assert op.functional_model.n_weights == op.shape[0] and op.theta0 is op.functional_model.theta0


# ------------------------------------------------------------------ block products (G V in one pass)

def _columns(op, V):
    """The reference for a block: k single products, one column at a time."""
    return torch.stack([op.matvec(V[:, j]) for j in range(V.shape[1])], dim=1)


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("loss,n_out,batch_size", [("mse", 1, None), ("mse", 3, 7), ("cross_entropy", 4, 5)])
def test_block_product_matches_dense_and_single_products(loss, n_out, batch_size, reuse):
    net = mlp(n_out=n_out)
    X = torch.randn(23, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    G = dense_ggn(net, X, loss)
    op = GGNOperator(net, X, loss=loss, batch_size=batch_size, reuse_linearization=reuse)
    V = torch.randn(op.shape[0], 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    block = op.matmat(V)
    assert block.shape == V.shape and block.is_contiguous()
    assert op.n_products == 6
    assert _rel(block, G @ V) < 1e-12
    assert _rel(block, _columns(op, V)) < 1e-12
    assert op.n_products == 12


def test_block_product_float32_within_round_off_of_columns():
    net = mlp(n_out=2, hidden=16, dtype=torch.float32)
    X = torch.randn(200, 3, generator=torch.Generator().manual_seed(4))
    op = GGNOperator(net, X, batch_size=64)
    V = torch.randn(op.shape[0], 9, generator=torch.Generator().manual_seed(5))
    ref64 = dense_ggn(copy.deepcopy(net).double(), X.double()) @ V.double()
    # Both paths sum the same O(N) terms in a different order: a few hundred float32 ulps at most.
    tol = 300 * torch.finfo(torch.float32).eps
    block = op.matmat(V)
    assert _rel(block.double(), ref64) < tol
    assert _rel(block, _columns(op, V)) < tol


@pytest.mark.parametrize("reuse", [True, False])
def test_block_product_masked_and_trimmed_sequences(reuse):
    torch.manual_seed(1)
    net = TinyLSTM().double()
    tokens = torch.randint(0, 6, (9, 6))
    mask = torch.ones(9, 6, dtype=torch.bool)
    mask[0, 2:] = False
    mask[3, 4:] = False
    mask[5, 1:] = False
    G = dense_ggn(net, tokens, "cross_entropy", mask)
    V = torch.randn(G.shape[0], 4, dtype=torch.float64)
    for trim in (False, True):
        op = GGNOperator(net, tokens, loss="cross_entropy", mask=mask, batch_size=4, trim_padding=trim,
                         reuse_linearization=reuse)
        assert _rel(op @ V, G @ V) < 1e-12


def test_block_product_is_chunked_to_its_memory_budget(monkeypatch):
    import glas_sklearn.ggn._blocks as blocks

    net = mlp(n_out=2)
    X = torch.randn(30, 3, dtype=torch.float64)
    op = GGNOperator(net, X, batch_size=8)
    op.matmat(torch.zeros(op.shape[0], 2, dtype=torch.float64))  # measures the bytes per column
    monkeypatch.setattr(blocks, "_BLOCK_BYTES", int(2.5 * op._column_bytes))
    widths = []
    original = op._product_block

    def spy(Vc):
        widths.append(Vc.shape[1])
        return original(Vc)

    monkeypatch.setattr(op, "_product_block", spy)
    V = torch.randn(op.shape[0], 5, dtype=torch.float64)
    assert _rel(op @ V, dense_ggn(net, X) @ V) < 1e-12
    assert widths == [2, 2]  # the fifth column is one ordinary product
    assert op.n_products == 2 + 5


class _Square(torch.autograd.Function):
    """x², as an old-style autograd.Function: differentiable twice, but unusable under torch.func transforms."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class _SquareNet(nn.Module):
    def __init__(self, custom: bool):
        super().__init__()
        self.custom = custom
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)
        return self.b(_Square.apply(h) if self.custom else h**2)


def test_block_product_falls_back_to_columns_when_vmap_fails(caplog):
    torch.manual_seed(0)
    net = _SquareNet(custom=True).double()
    twin = _SquareNet(custom=False).double()
    twin.load_state_dict(net.state_dict())
    X = torch.randn(20, 3, dtype=torch.float64)
    G = dense_ggn(twin, X)
    op = GGNOperator(net, X, reuse_linearization=True)  # the cached graph needs no torch.func
    V = torch.randn(op.shape[0], 3, dtype=torch.float64)
    with caplog.at_level("DEBUG", logger="glas_sklearn.ggn"):
        assert _rel(op @ V, G @ V) < 1e-12
    assert "column by column" in caplog.text
    assert _rel(op @ V, G @ V) < 1e-12  # and it keeps working without retrying the vectorised path
    assert op.n_products == 6


def test_to_scipy_passes_whole_blocks(monkeypatch):
    net = mlp()
    X = torch.randn(25, 3, dtype=torch.float64)
    op = GGNOperator(net, X)
    shapes = []
    original = op._matmat

    def spy(V):
        shapes.append(tuple(V.shape))
        return original(V)

    monkeypatch.setattr(op, "_matmat", spy)
    x = np.random.default_rng(1).standard_normal((op.shape[0], 4))
    np.testing.assert_allclose(op.to_scipy() @ x, dense_ggn(net, X).numpy() @ x, rtol=1e-10, atol=1e-14)
    assert shapes == [(op.shape[0], 4)]


def test_vectorize_blocks_choices_agree_and_auto_follows_its_rule(monkeypatch):
    import glas_sklearn.ggn._blocks as blocks

    net = mlp(n_out=2)
    X = _randn(30, 3, seed=40)
    G = dense_ggn(net, X)
    V = _randn(G.shape[0], 4, seed=41)

    def paths(op):
        calls = []
        original = op._product_block
        monkeypatch.setattr(op, "_product_block", lambda Vc: calls.append(Vc.shape[1]) or original(Vc))
        assert _rel(op @ V, G @ V) < 1e-12
        return calls

    assert paths(GGNOperator(net, X, vectorize_blocks=True)) == [4]
    assert paths(GGNOperator(net, X, vectorize_blocks=False)) == []
    assert paths(GGNOperator(net, X)) == [4]  # auto, CPU, small columns: vectorised
    monkeypatch.setattr(blocks, "_VECTORIZE_MAX_COLUMN_BYTES", {"cached": 0, "streamed": 1 << 40})
    assert paths(GGNOperator(net, X, reuse_linearization=True)) == []  # auto, large cached columns: one by one
    assert paths(GGNOperator(net, X, reuse_linearization=False)) == [4]  # auto, small streamed columns: vectorised
    monkeypatch.setattr(blocks, "_VECTORIZE_MAX_COLUMN_BYTES", {"cached": 1 << 40, "streamed": 0})
    assert paths(GGNOperator(net, X, reuse_linearization=True)) == [4]
    assert paths(GGNOperator(net, X, reuse_linearization=False)) == []
    with pytest.raises(ValueError, match="vectorize_blocks"):
        GGNOperator(net, X, vectorize_blocks="yes")
