"""FunctionalModel: the one binding of a model as a function of its weights (layout, θ0, eval view, checks)."""

import copy
import dataclasses
import math
import pickle

import pytest
import torch
from torch import nn

from glas_sklearn._functional import FunctionalModel
from glas_sklearn._jacobians import JacobianProducts

from .reference import TinyLSTM, assert_unchanged, dense_jacobian, flat_params, mlp, snapshot


def _randn(*shape, seed, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def test_binds_layout_theta0_and_an_eval_view_without_touching_the_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Dropout(0.5), nn.Linear(6, 2)).double()
    net.train()  # dropout active in the user's model
    net[0].weight.requires_grad_(False)  # frozen: not one of the D weights
    before = snapshot(net)
    f = FunctionalModel(net)
    assert f.layout.names == ("0.bias", "3.weight", "3.bias")
    assert f.n_weights == 6 + 12 + 2 and f.dtype == torch.float64 and f.device == torch.device("cpu")
    assert torch.equal(f.theta0, flat_params(net))
    assert f.theta0.data_ptr() != net[0].bias.data_ptr()  # a copy, not a view of the model's weights
    assert all(p.data_ptr() == f.theta0.data_ptr() + f.theta0.element_size() * off
               for p, off in zip(f.params0.values(), (0, 6, 18), strict=True))  # params0 are views of θ0
    X = _randn(9, 3, seed=1)
    reference = copy.deepcopy(net).eval()
    with torch.no_grad():
        expected = reference(X)
    torch.testing.assert_close(f(X), expected, rtol=0, atol=0)  # eval mode, θ0: the same computation
    # at other weights: the output of a copy of the model holding them
    theta = f.theta0 + _randn(f.n_weights, seed=2)
    moved = copy.deepcopy(reference)
    with torch.no_grad():
        for name, value in f.unflatten(theta).items():
            moved.get_parameter(name).copy_(value)
        torch.testing.assert_close(f(X, f.unflatten(theta)), moved(X), rtol=1e-14, atol=1e-14)
    assert_unchanged(net, before)
    assert net.training
    with torch.no_grad():
        net[3].bias.add_(1.0)  # later changes of the model do not move θ0
    assert torch.equal(f.theta0, flat_params(reference))


def test_input_checks_name_the_problem():
    f = FunctionalModel(mlp())
    X = _randn(5, 3, seed=3)
    assert f.check_inputs(X) is X
    tokens = torch.zeros(4, 3, dtype=torch.long)
    assert f.check_inputs(tokens) is tokens  # integer inputs (token ids) pass as they are
    with pytest.raises(TypeError, match="X_cal must be a torch.Tensor, got ndarray"):
        f.check_inputs(X.numpy(), "X_cal")
    bad = X.clone()
    bad[1, 2] = float("nan")
    bad[3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"X contains 2 NaN or infinite value\(s\)"):
        f.check_inputs(bad)
    with pytest.raises(ValueError, match="empty"):
        f.check_inputs(X[:0])
    with pytest.raises(ValueError, match="leading record axis"):
        f.check_inputs(torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"X has dtype torch.float32, but the model's weights are torch.float64; "
                                        r"convert it with .to\(torch.float64\)"):
        f.check_inputs(X.float())
    on_meta = torch.zeros(4, 3, dtype=torch.long, device="meta")  # another device, on a CPU-only machine too
    with pytest.raises(ValueError, match=r"X is on meta, but the model lives on cpu; move it with .to\('cpu'\)"):
        f.check_inputs(on_meta)


def test_output_shape_and_wrong_row_shape():
    f = FunctionalModel(mlp(n_out=2))
    assert f.output_shape(_randn(4, 3, seed=4)) == (2,)
    with pytest.raises(ValueError, match=r"cannot be evaluated on X, whose rows have shape \(5,\) and dtype "
                                         r"torch.float64") as info:
        f.output_shape(_randn(4, 5, seed=5))
    assert isinstance(info.value.__cause__, RuntimeError)  # torch's own message is kept as the cause
    seq = FunctionalModel(TinyLSTM(vocab=6).double())
    tokens = torch.randint(0, 6, (3, 7), generator=torch.Generator().manual_seed(6))
    assert seq.output_shape(tokens) == (7, 6)
    with pytest.raises(ValueError, match=r"rows have shape \(7,\)"):
        seq.output_shape(tokens + 6)  # token ids out of the vocabulary

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 1)

        def forward(self, x):
            return self.lin(x), x

    with pytest.raises(ValueError, match=r"Pair returns a tuple of 2 items .*output=0"):
        FunctionalModel(Pair().double()).output_shape(_randn(2, 3, seed=7))


def test_bad_models():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        FunctionalModel(lambda x: x)
    frozen = mlp()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        FunctionalModel(frozen)
    with pytest.raises(TypeError, match="floating point"):
        FunctionalModel(nn.Embedding(3, 2).to(torch.int64))


def test_mixed_precisions_bind_in_the_widest_dtype():
    """Trainable parameters of two dtypes: θ in the widest, each part cast back to its own in the call."""
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.low = nn.Linear(3, 4).float()
            self.high = nn.Linear(4, 2).double()

        def forward(self, x):
            return self.high(torch.tanh(self.low(x.float())).double())

    torch.manual_seed(0)
    mixed = Mixed()
    f = FunctionalModel(mixed)
    assert f.dtype == torch.float64 and f.theta0.dtype == torch.float64
    assert f.layout.param_dtypes == tuple(p.dtype for p in mixed.parameters())
    assert [f.params0[n].dtype for n, _ in mixed.named_parameters()] == [p.dtype for p in mixed.parameters()]
    x = _randn(5, 3, seed=9)
    with torch.no_grad():
        assert torch.equal(f(x), mixed(x).double())
    assert torch.equal(f.layout.flatten(f.params0), f.theta0)


def test_pickling_keeps_the_binding_and_follows_the_tensors_device():
    f = FunctionalModel(mlp(n_out=2))
    X = _randn(6, 3, seed=8)
    g = pickle.loads(pickle.dumps(f))
    torch.testing.assert_close(g(X), f(X), rtol=0, atol=0)
    assert g.params0["0.weight"].data_ptr() == g.theta0.data_ptr()  # still views of θ0 after the round trip
    # A pickle whose recorded device differs from where its tensors were loaded (a CUDA fit loaded with
    # map_location="cpu") follows the tensors.
    state = dict(f.__getstate__(), layout=dataclasses.replace(f.layout, device=torch.device("meta")))
    h = FunctionalModel.__new__(FunctionalModel)
    h.__setstate__(state)
    assert h.device == torch.device("cpu") and h.layout.device == torch.device("cpu")
    torch.testing.assert_close(h(X), f(X), rtol=0, atol=0)


class _Branching(nn.Module):
    """A forward that branches on the data (vmap over records cannot trace it); ``mix`` couples the rows."""

    def __init__(self, mix: bool):
        super().__init__()
        self.mix = mix
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        if bool((x[:, 0] > 100).any()):
            h = 2 * h
        return h + h.mean(0, keepdim=True) if self.mix else h


@pytest.mark.parametrize("mix", [False, True])
def test_record_jacobians_when_vmap_over_records_fails(mix):
    """Per-record Jacobians of a forward vmap cannot trace: by vectorised pullbacks over groups of records when
    rows do not interact (checked once against the loop), by the loop when they do; both equal the Jacobian of
    the model on the record alone (of the whole batch, for the row-mixing model), from torch.autograd."""
    from glas_sklearn._functional import BoundModel

    torch.manual_seed(0)
    net = _Branching(mix).double()
    X = _randn(40, 3, seed=8)

    class Bound(BoundModel):
        def __init__(self):
            self.functional_model = FunctionalModel(net)

    bound = Bound()
    got = bound.record_jacobians(X)  # (n, 2, D)
    names = [n for n, _ in net.named_parameters()]
    theta = flat_params(net)
    sizes = [p.numel() for p in net.parameters()]

    def outputs(flat, rows):
        parts = {n: t.view(p.shape) for n, t, p in zip(names, flat.split(sizes), net.parameters(), strict=True)}
        return torch.func.functional_call(net, parts, (rows,))

    if mix:  # a record's output in a batch depends on the other rows: each record's Jacobian alone
        expected = torch.stack([torch.autograd.functional.jacobian(lambda f, i=i: outputs(f, X[i:i + 1])[0], theta)
                                for i in range(len(X))])
    else:
        expected = torch.autograd.functional.jacobian(lambda f: outputs(f, X), theta)  # (n, 2, D), rows apart
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert bound._vmap_jac_ok is False and bound._pullback_jac_ok is (not mix)


# ------------------------------------------------------------------- J t, the factored Jacobians and J Jᵀ
class _Bound(JacobianProducts):
    def __init__(self, model):
        self.functional_model = FunctionalModel(model)


class _Conv(nn.Module):
    """Weights shared across positions: no nn.Linear factors."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 3, 3)
        self.head = nn.Linear(3 * 4, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.conv(x[:, None, :])).flatten(1))


class _TiedLinear(nn.Module):
    """One nn.Linear weight also used outside its layer: the layer taps alone miss part of its gradient."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 2)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h + torch.nn.functional.linear(x, self.a.weight))


def _dense(model, X):
    return dense_jacobian(model, X)  # (n, *out, D)


@pytest.mark.parametrize("make", [lambda: mlp(n_out=2), _Conv, lambda: TinyLSTM(vocab=4, hidden=3)])
@pytest.mark.parametrize("forward_mode", [False, True])
def test_tangent_products_match_the_dense_jacobian(make, forward_mode):
    """J t by reverse over reverse (and the forward-mode fallback) against the dense Jacobian times t (float64)."""
    torch.manual_seed(0)
    model = make().double()
    lstm = isinstance(model, TinyLSTM)
    X = torch.randint(0, 4, (3, 5)) if lstm else _randn(4, 6 if isinstance(model, _Conv) else 3, seed=1)
    bound = _Bound(model)
    if forward_mode:
        bound._reverse_jvp_ok = False
    D = bound.layout.size
    T = _randn(3, D, seed=2)
    got = bound.tangent_products(X, T)  # (3, n, *out)
    ref = torch.movedim(_dense(model, X) @ T.T, -1, 0)
    tol = 100 * torch.finfo(torch.float64).eps * float(ref.abs().max())
    torch.testing.assert_close(got, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_linear_factors_match_the_dense_jacobian(dtype):
    """An MLP's factored Jacobians: J t, ‖J_m‖² and the (M × M) blocks J Jᵀ against the dense Jacobian in float64,
    within round-off of the model's dtype (a sum over D products)."""
    model = mlp(n_out=3, dtype=dtype)
    X = _randn(7, 3, seed=1, dtype=dtype)
    bound = _Bound(model)
    factors = bound.linear_factors(X)
    assert factors is not None and bound._linear_factors_ok
    J = _dense(model.double(), X.double())  # (n, 3, D)
    model.to(dtype)
    D = J.shape[-1]
    T = _randn(4, D, seed=2)
    tol = 20 * math.sqrt(D) * torch.finfo(dtype).eps
    got = factors.projections(bound.layout.unflatten_rows(T.to(dtype)))
    ref = J @ T.T
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=tol * float(ref.abs().max()))
    full = J @ J.transpose(1, 2)
    torch.testing.assert_close(factors.gram(True), full, rtol=0, atol=tol * float(full.abs().max()))
    torch.testing.assert_close(bound.record_gram(X), torch.diagonal(full, dim1=1, dim2=2), rtol=0,
                               atol=tol * float(full.abs().max()))


@pytest.mark.parametrize("make", [_Conv, _TiedLinear])
def test_linear_factors_refuse_what_they_do_not_describe(make):
    """Weights outside nn.Linear layers (None at once) and a weight used outside its layer (caught by the check
    against the Jacobians): J Jᵀ then comes from the per-record Jacobians, right either way."""
    torch.manual_seed(0)
    model = make().double()
    X = _randn(5, 6 if make is _Conv else 3, seed=1)
    bound = _Bound(model)
    assert bound.linear_factors(X) is None and bound._linear_factors_ok is False
    J = _dense(model, X)
    tol = 100 * torch.finfo(torch.float64).eps
    torch.testing.assert_close(bound.record_gram(X), (J**2).sum(-1), rtol=tol, atol=0)
    assert bound.record_gram(X, jacobians=False) is None
