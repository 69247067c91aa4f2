"""Several copies of one network trained at once (training/networks.py's Stacked, through the one loop): each copy
ends where train_module takes
it alone on its rows with its weight decay, for each built-in optimizer and with row weights; the module is left
as it was; modules vmap cannot batch are recognised."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from glas_sklearn.training import build_optimizer, train_module, train_stacked
from glas_sklearn.training.networks import can_stack_layers, can_train_copies, stacked_forward


def train_copies(*args, **kwargs):
    """The networks of :func:`train_stacked` (its records dropped)."""
    return train_stacked(*args, **kwargs)[0]


def _rows(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g)
    y = (X[:, 0] * X[:, 1] > 0).long()
    return X, y


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 12), nn.Tanh(), nn.Dropout(0.1), nn.Linear(12, 2))


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd"])
@pytest.mark.parametrize("weighted", [False, True])
def test_each_copy_trains_as_it_would_alone(optimizer, weighted):
    """Copies on different rows (sets of one size) with different weight decays: each copy's weights are those of
    train_module on its rows alone, up to float32 rounding amplified over the steps (batched matrix products
    round differently), with dropout drawing different masks per copy (so not compared there: p = 0 below)."""
    X, y = _rows()
    net = _net()
    net[2].p = 0.0
    before = copy.deepcopy(net.state_dict())
    rng = np.random.default_rng(1)
    sets = [np.sort(rng.choice(len(X), 32, replace=False)) for _ in range(4)]
    decays = [0.0, 0.05, 0.05, 0.3]
    w = torch.as_tensor(rng.uniform(0.2, 2.0, len(X)), dtype=torch.float32) if weighted else None
    lr = 0.05 if optimizer == "sgd" else 1e-2
    copies = train_copies(net, X, y, nn.functional.cross_entropy, row_sets=sets, weight_decays=decays,
                          build=lambda g: build_optimizer(optimizer, g, lr=lr, weight_decay=0.0),
                          batch_size=10, max_epochs=8, seed=5, sample_weight=w)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())  # the module is untouched
    eps = np.finfo(np.float32).eps
    for rows, decay, trained in zip(sets, decays, copies, strict=True):
        alone = copy.deepcopy(net)
        idx = torch.as_tensor(rows)
        train_module(alone, X[idx], y[idx], nn.functional.cross_entropy, optimizer=optimizer, lr=lr,
                     weight_decay=decay, batch_size=10, max_epochs=8, seed=5,
                     sample_weight=None if w is None else w[idx])
        assert not trained.training
        for (name, p), q in zip(alone.named_parameters(), trained.parameters(), strict=True):
            scale = float(p.detach().abs().max())
            # 32 steps of an update of size lr each, each rounded: a few hundred eps of the weights' scale
            np.testing.assert_allclose(q.detach(), p.detach(), rtol=0, atol=1e3 * eps * max(scale, 1.0),
                                       err_msg=name)
    moved = [float((a[0].weight - b[0].weight).detach().abs().max())
             for a, b in zip(copies[1:3], copies[2:4], strict=True)]
    assert min(moved) > 1e-4  # different rows or decays give different networks


def test_copies_train_on_their_own_rows_only_whatever_their_sizes():
    """Row sets of different sizes (each copy takes the smaller size's count of its rows an epoch): rows outside
    every set are NaN and never reached, and rows outside one copy's set never move it (its weights equal those
    of the same copy trained with other values there)."""
    X, y = _rows()
    X_nan = X.clone()
    X_nan[40:] = float("nan")
    sets = [np.arange(0, 30), np.arange(10, 41)]
    X_other = X_nan.clone()
    X_other[:10] = 100 * torch.randn(10, 3)  # other values outside the second set only

    def train(inputs):
        return train_copies(_net(), inputs, y, nn.functional.cross_entropy, row_sets=sets, weight_decays=[0.0, 0.1],
                            build=lambda g: build_optimizer("adam", g, lr=1e-2, weight_decay=0.0),
                            batch_size=8, max_epochs=3, seed=0)

    X_nan[40] = X[40]  # row 40 belongs to the second set
    X_other[40] = X[40]
    first, second = train(X_nan)
    assert all(torch.isfinite(p).all() for net in (first, second) for p in net.parameters())
    _, second_again = train(X_other)
    assert all(torch.equal(p, q) for p, q in zip(second.parameters(), second_again.parameters(), strict=True))


def test_modules_with_buffers_or_frozen_weights_are_trained_one_by_one():
    X, y = _rows()
    loss = nn.functional.cross_entropy
    assert can_train_copies(_net(), X[:2], y[:2], loss)
    assert not can_train_copies(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)), X[:2], y[:2],
                                loss)
    frozen = _net()
    frozen[0].weight.requires_grad_(False)
    assert not can_train_copies(frozen, X[:2], y[:2], loss)

    class DataDependent(nn.Module):  # control flow on a value: vmap cannot batch it
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x) if float(x.sum()) > 0 else -self.lin(x)

    assert not can_train_copies(DataDependent(), X[:2], y[:2], loss)


def test_a_diverging_copy_raises():
    X, y = _rows()
    with pytest.raises(FloatingPointError, match="diverged"):
        train_copies(nn.Linear(3, 2), X * 1e20, y, nn.functional.cross_entropy, row_sets=[np.arange(10)] * 2,
                     weight_decays=[0.0, 0.0], build=lambda g: build_optimizer("sgd", g, lr=1e20, weight_decay=0.0),
                     batch_size=None, max_epochs=3, seed=0)


@pytest.mark.parametrize("layers", [
    lambda: [nn.Linear(3, 7), nn.Tanh(), nn.Linear(7, 2)],
    lambda: [nn.Linear(3, 7, bias=False), nn.GELU(), nn.Dropout(0.3), nn.Linear(7, 5), nn.LeakyReLU(0.1),
             nn.Linear(5, 2)],
    lambda: [nn.Linear(3, 4), nn.SiLU(), nn.Linear(4, 4), nn.Softplus(), nn.Identity(), nn.Linear(4, 2)],
])
def test_stacked_products_give_each_networks_own_outputs(layers):
    """The batched matrix products of a stack of linear layers, each network's weights a slice of the stacked ones
    and its own rows, against each network called on its rows (eval mode: dropout off): to float32 rounding."""
    nets = [nn.Sequential(*layers()) for _ in range(3)]
    for k, net in enumerate(nets):
        torch.manual_seed(k)
        for p in net.parameters():
            nn.init.normal_(p)
        net.eval()
    x = torch.randn(3, 11, 3, generator=torch.Generator().manual_seed(0))
    assert can_stack_layers(nets[0], x[0, :1])
    params = {name: torch.stack([dict(n.named_parameters())[name] for n in nets]) for name, _ in
              nets[0].named_parameters()}
    with torch.no_grad():
        got = stacked_forward(nets[0], x[0, :1])(params, x)
        want = torch.stack([n(x[k]) for k, n in enumerate(nets)])
    scale = float(want.abs().max())
    np.testing.assert_allclose(got, want, rtol=0, atol=100 * np.finfo(np.float32).eps * max(scale, 1.0))


def test_only_stacks_of_linear_layers_on_vector_rows_run_as_batched_products():
    x = torch.randn(1, 3)
    assert not can_stack_layers(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)), x)
    assert not can_stack_layers(nn.Sequential(nn.Sequential(nn.Linear(3, 4)), nn.Linear(4, 2)), x)  # nested
    assert not can_stack_layers(nn.Linear(3, 2), x)  # not a Sequential
    assert not can_stack_layers(nn.Sequential(nn.Linear(3, 2)), torch.randn(1, 5, 3))  # rows that are not vectors
    frozen = nn.Sequential(nn.Linear(3, 2))
    frozen[0].bias.requires_grad_(False)
    assert not can_stack_layers(frozen, x)
    assert can_stack_layers(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), x)


def test_only_modules_that_compute_the_same_in_both_modes_are_scored_without_a_mode_switch():
    """The default MLP's layers compute the same in train and eval mode, so its held-out loss is computed without
    switching; dropout, batch norm, nested custom modules and a module overriding train() are switched, and the
    held-out loss of a dropout network is the eval-mode one (dropout off) either way it was left."""
    from glas_sklearn.training.networks import mode_free
    from glas_sklearn.training.pieces import held_out_loss

    class OwnTrain(nn.Sequential):
        def train(self, mode=True):
            return super().train(mode)

    assert mode_free(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert not mode_free(_net())  # Dropout
    assert not mode_free(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)))
    assert not mode_free(OwnTrain(nn.Linear(3, 2)))
    X, y = _rows()
    net = _net()
    net[2].p = 0.9
    net.train()
    got = held_out_loss(net, X, y, nn.functional.cross_entropy)
    assert net.training  # left as it was
    with torch.no_grad():
        want = float(nn.functional.cross_entropy(net.eval()(X), y))
    assert got == pytest.approx(want, rel=1e-6)
