"""Independent references for the tests: dense Jacobians and GGN matrices from torch.func.jacrev."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, jacrev


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])


def _unflatten(model, theta):
    out, i = {}, 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[name] = theta[i:i + p.numel()].view_as(p)
            i += p.numel()
    return out


def dense_jacobian(model: nn.Module, X: torch.Tensor) -> torch.Tensor:
    """J of shape (*output_shape, D), by reverse mode over the flat weight vector."""
    theta = flat_params(model)
    return jacrev(lambda th: functional_call(model, _unflatten(model, th), (X,)))(theta)


def dense_ggn(model: nn.Module, X: torch.Tensor, loss: str = "mse", mask: torch.Tensor | None = None) -> torch.Tensor:
    """G = (1/N) Σ J_nᵀ H_n J_n built explicitly (records = all leading axes but the last)."""
    with torch.no_grad():
        out = model(X)
    J = dense_jacobian(model, X)
    M, D = out.shape[-1], J.shape[-1]
    J = J.reshape(-1, M, D)
    f = out.reshape(-1, M)
    if loss == "mse":
        H = torch.eye(M, dtype=J.dtype).expand(f.shape[0], M, M)
    else:
        p = torch.softmax(f, dim=-1)
        H = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    w = torch.ones(f.shape[0], dtype=J.dtype) if mask is None else mask.reshape(-1).to(J.dtype)
    return torch.einsum("n,nmd,nmk,nke->de", w, J, H, J) / w.sum()


def snapshot(model: nn.Module) -> dict:
    """Everything about a model that our code must leave untouched."""
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
    }


def assert_unchanged(model: nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert before["state"].keys() == after["state"].keys()
    for k in before["state"]:
        assert torch.equal(before["state"][k], after["state"][k]), f"{k} changed"
    assert before["training"] == after["training"]
    assert before["requires_grad"] == after["requires_grad"]
    for a, b in zip(before["grads"], after["grads"], strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


class TinyLSTM(nn.Module):
    """Embedding + one LSTM layer + linear head over a small vocabulary: logits (n, T, V)."""

    def __init__(self, vocab: int = 6, hidden: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        h, _ = self.lstm(self.emb(tokens))
        return self.head(h)


def mlp(n_in=3, hidden=5, n_out=1, dtype=torch.float64, seed=0, act=nn.Tanh):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, hidden), act(), nn.Linear(hidden, hidden), act(),
                         nn.Linear(hidden, n_out)).to(dtype)


def step_noise_data(n: int, seed: int = 0, outputs: int = 1):
    """X uniform on [−1, 1]³ and y = sin(2 x₀) + k (output k) with Gaussian noise of std 0.05, or 0.65 where
    x₁ > 0.3: a noise level that jumps 13× across the input space; y of shape (n,) for one output."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    noise = 0.05 + 0.6 * (X[:, 1] > 0.3)
    cols = [np.sin(2 * X[:, 0]) + k + noise * rng.standard_normal(n) for k in range(outputs)]
    return X, (cols[0] if outputs == 1 else np.stack(cols, axis=1))


#: Settings the estimators take inside their settings objects, by object.
_TRAINING = tuple(__import__("glas_sklearn").Training().get_params(deep=False))  # every Training setting
_POSTERIOR = ("max_components", "eigen_method", "subsample", "predictive", "n_samples", "include_noise")
_COMPUTE = ("device", "dtype", "n_threads", "working_memory", "padding_idx")


def grouped(**settings) -> dict:
    """Estimator keyword arguments from one flat dict of settings, as the tests' shared presets hold them: the
    training, posterior and compute settings gathered into ``Training``, the posterior kind's settings object and
    ``Compute`` (a preset and a test's own settings merge as plain dicts first)."""
    from glas_sklearn import Compute, Posterior, Training
    from glas_sklearn.estimators._posterior import resolve_posterior_settings

    out = {k: v for k, v in settings.items() if k not in _TRAINING + _POSTERIOR + _COMPUTE}
    training = {k: settings[k] for k in _TRAINING if k in settings}
    posterior = {k: settings[k] for k in _POSTERIOR if k in settings}
    compute = {k: settings[k] for k in _COMPUTE if k in settings}
    if training:
        out["training"] = Training(**training)
    if posterior:
        kind = out.get("posterior", "low_rank")
        try:
            base = kind if isinstance(kind, Posterior) else resolve_posterior_settings(kind)
        except ValueError:  # a kind the estimator is to refuse: left as it is
            return out
        out["posterior"] = base.set_params(**posterior)
    if compute:
        out["compute"] = Compute(**compute)
    return out


def full_name(param: str) -> str:
    """A setting's name as ``get_params`` lists it: ``max_components`` → ``posterior__max_components``."""
    for prefix, names in (("training__", _TRAINING), ("posterior__", _POSTERIOR), ("compute__", _COMPUTE)):
        if param in names:
            return prefix + param
    return param


def decays_recorded(seen: list, build):
    """``build_optimizer`` that appends to ``seen`` the weight decay it is given, or that of each parameter group
    (networks trained together, their decays in the groups)."""
    def recorded(optimizer, params, **kw):
        params = list(params)
        groups = [g for g in params if isinstance(g, dict)]
        seen.extend([g["weight_decay"] for g in groups] if groups else [kw["weight_decay"]])
        return build(optimizer, params, **kw)

    return recorded
