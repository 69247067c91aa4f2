import copy

import numpy as np
import pytest
import torch
from torch import nn

from glas_sklearn.ggn import GGNOperator

from .reference import TinyLSTM, assert_unchanged, dense_ggn, mlp, snapshot


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("loss,n_out", [("mse", 1), ("mse", 3), ("cross_entropy", 4)])
def test_matches_dense_float64(loss, n_out, reuse):
    net = mlp(n_out=n_out)
    X = torch.randn(23, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    G = dense_ggn(net, X, loss)
    op = GGNOperator(net, X, loss=loss, reuse_linearization=reuse)
    V = torch.randn(op.shape[0], 4, dtype=torch.float64)
    assert op.shape == G.shape
    assert op.n_records == 23
    assert _rel(op @ V, G @ V) < 1e-12
    assert _rel(op.matvec(V[:, 0]), G @ V[:, 0]) < 1e-12
    assert op.n_products == 5


def test_float32_products_close_to_float64_reference():
    net64 = mlp(n_out=2)
    X = torch.randn(40, 3, dtype=torch.float64)
    G = dense_ggn(net64, X)
    op = GGNOperator(copy.deepcopy(net64).float(), X.float())
    assert op.dtype == torch.float32
    v = torch.randn(op.shape[0], dtype=torch.float64)
    assert _rel((op @ v.float()).double(), G @ v) < 1e-5


@pytest.mark.parametrize("reuse", [True, False])
def test_lstm_with_masked_sequences(reuse):
    torch.manual_seed(0)
    net = TinyLSTM().double()
    tokens = torch.randint(0, 6, (7, 5))
    mask = torch.ones(7, 5, dtype=torch.bool)
    mask[0, 3:] = False
    mask[4, 1:] = False
    G = dense_ggn(net, tokens, "cross_entropy", mask)
    op = GGNOperator(net, tokens, loss="cross_entropy", mask=mask, batch_size=3, reuse_linearization=reuse)
    assert op.n_records == int(mask.sum())
    V = torch.randn(op.shape[0], 2, dtype=torch.float64)
    assert _rel(op @ V, G @ V) < 1e-12


def test_padding_has_no_effect():
    torch.manual_seed(0)
    net = TinyLSTM().double()
    tokens = torch.randint(0, 6, (6, 4))
    mask = torch.ones(6, 4, dtype=torch.bool)
    # Append three padded positions filled with arbitrary tokens: the LSTM is causal, so the real
    # positions see the same outputs, and the padded ones must contribute nothing.
    padded = torch.cat([tokens, torch.randint(0, 6, (6, 3))], dim=1)
    pmask = torch.cat([mask, torch.zeros(6, 3, dtype=torch.bool)], dim=1)
    a = GGNOperator(net, tokens, loss="cross_entropy", mask=mask)
    b = GGNOperator(net, padded, loss="cross_entropy", mask=pmask)
    assert a.n_records == b.n_records == 24
    v = torch.randn(a.shape[0], dtype=torch.float64)
    assert _rel(b @ v, a @ v) < 1e-12


def test_minibatches_equal_full_batch():
    net = mlp(n_out=2)
    X = torch.randn(50, 3, dtype=torch.float64)
    v = torch.randn(sum(p.numel() for p in net.parameters()), dtype=torch.float64)
    full = GGNOperator(net, X) @ v
    for bs in (1, 7, 50, 64):
        assert _rel(GGNOperator(net, X, batch_size=bs) @ v, full) < 1e-12


def test_subsample_reproducible_and_exact():
    net = mlp()
    X = torch.randn(60, 3, dtype=torch.float64)
    a = GGNOperator(net, X, subsample=20, random_state=3)
    b = GGNOperator(net, X, subsample=20, random_state=3)
    c = GGNOperator(net, X, subsample=20, random_state=4)
    assert a.n_records == 20
    np.testing.assert_array_equal(a.indices_, b.indices_)
    assert not np.array_equal(a.indices_, c.indices_)
    v = torch.randn(a.shape[0], dtype=torch.float64)
    G_sub = dense_ggn(net, X[torch.as_tensor(a.indices_)])
    assert _rel(a @ v, G_sub @ v) < 1e-12
    assert torch.equal(a @ v, b @ v)


def test_model_left_exactly_as_found():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Dropout(0.5), nn.Linear(6, 2)).double()
    net.train()  # dropout active in the user's model
    X = torch.randn(30, 3, dtype=torch.float64)
    net(X).sum().backward()  # the user has gradients lying around
    before = snapshot(net)
    op = GGNOperator(net, X)
    v = torch.randn(op.shape[0], dtype=torch.float64)
    g1, g2 = op @ v, op @ v
    assert_unchanged(net, before)
    # Evaluated in eval mode (dropout off): deterministic and equal to the eval-mode reference.
    assert torch.equal(g1, g2)
    net_eval = nn.Sequential(*[m for m in net]).eval()
    assert _rel(g1, dense_ggn(net_eval, X) @ v) < 1e-12
    assert net.training


def test_operator_snapshots_theta0():
    net = mlp()
    X = torch.randn(20, 3, dtype=torch.float64)
    op = GGNOperator(net, X)
    v = torch.randn(op.shape[0], dtype=torch.float64)
    before = op @ v
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    assert torch.equal(op @ v, before)


def test_to_scipy_linear_operator():
    from scipy.sparse.linalg import eigsh

    net = mlp()
    X = torch.randn(25, 3, dtype=torch.float64)
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
    X = torch.randn(15, 3, dtype=torch.float64)
    op = GGNOperator(net, X)
    D = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert op.shape == (D, D)
    with torch.no_grad():
        out = op @ torch.ones(D, dtype=torch.float64)
    assert _rel(out, dense_ggn(net, X) @ torch.ones(D, dtype=torch.float64)) < 1e-12


def test_bad_inputs_raise_clear_errors():
    net = mlp()
    X = torch.randn(10, 3, dtype=torch.float64)
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
    tokens = torch.randint(0, 6, (4, 5))
    with pytest.raises(ValueError, match="mask"):
        GGNOperator(seq, tokens, loss="cross_entropy", mask=torch.ones(4, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="boolean"):
        GGNOperator(seq, tokens, loss="cross_entropy", mask=torch.ones(4, 5))
    with pytest.raises(ValueError, match="no record"):
        GGNOperator(seq, tokens, loss="cross_entropy", mask=torch.zeros(4, 5, dtype=torch.bool))
    op = GGNOperator(net, X)
    with pytest.raises(ValueError, match="shape"):
        op @ torch.ones(op.shape[0] + 1, dtype=torch.float64)
    with pytest.raises(TypeError, match="dtype"):
        op @ torch.ones(op.shape[0])
    with pytest.raises(TypeError, match="to_scipy"):
        op @ np.ones(op.shape[0])
