"""Hugging Face transformers models with peft LoRA adapters, taken as they come (issue 21).

Tiny configs built offline (no downloads): a 2-layer BERT sequence classifier (and regressor) with LoRA on the
query/value projections and its head in ``modules_to_save``, briefly fine-tuned on a token task (does the sequence
contain the marker token?); a 1-layer GPT-2 with LoRA for per-token outputs. Checked: the estimators fit them with
no hand-written wrapper; the base weights stay bit-identical; the posterior covers the trainable parameters only
(named); the adapter's predictions are the model's own ``logits`` (ModelOutput, dict, tuple; the attention mask
built from the padding id equals one passed by hand); the GGN of the per-token LM head against a dense float64
oracle; the held-out NLL against the fine-tuned model's; clear errors when the output cannot be determined.
"""

from __future__ import annotations

import copy
import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from glas_sklearn import Compute, LowRank, Subspace

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from glas_sklearn import LaplaceActiveSubspaceClassifier, LaplaceActiveSubspaceRegressor  # noqa: E402
from glas_sklearn._functional import FunctionalModel  # noqa: E402
from glas_sklearn.adapters import ModelAdapter  # noqa: E402
from glas_sklearn.ggn import GGNOperator  # noqa: E402
from glas_sklearn.laplace import fit_laplace_subspace  # noqa: E402
from glas_sklearn.sampling import perturbed_copy, sample_parameters  # noqa: E402

#: Prefit networks here are often untrained on purpose; the warning saying so is tested in test_messages.py.
pytestmark = pytest.mark.filterwarnings("ignore::glas_sklearn.PrefitUnderfitWarning")

VOCAB, LENGTH, MARKER, PAD = 30, 10, 1, 0


def marker_task(n: int, seed: int, flip: float = 0.1):
    """Token ids (n, LENGTH), right-padded with PAD, lengths 4..LENGTH; label 1 when the marker token occurs
    (a share ``flip`` of labels flipped, so that the NLL stays measurable)."""
    rng = np.random.default_rng(seed)
    X = rng.integers(2, VOCAB, (n, LENGTH))
    lengths = rng.integers(4, LENGTH + 1, n)
    y = rng.integers(0, 2, n)
    for i in range(n):
        if y[i]:
            X[i, rng.integers(0, lengths[i])] = MARKER
        X[i, lengths[i]:] = PAD
    noisy = np.where(rng.random(n) < flip, 1 - y, y)
    return X, noisy


def tiny_bert(num_labels: int = 2, seed: int = 0, **config):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=LENGTH, num_labels=num_labels,
                                  **config)
    base = transformers.BertForSequenceClassification(cfg)
    return peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=2, target_modules=["query", "value"]))


def fine_tune(model, X, y, epochs: int, regression: bool = False, seed: int = 0):
    """A few epochs of Adam on the trainable (LoRA + head) parameters; the model is left in train mode, as a
    user's training loop leaves it."""
    gen = torch.Generator().manual_seed(seed)
    Xt = torch.as_tensor(X)
    yt = torch.as_tensor(y, dtype=torch.float32 if regression else torch.long)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(Xt), generator=gen).split(32):
            out = model(input_ids=Xt[idx], attention_mask=(Xt[idx] != PAD).long(), labels=yt[idx])
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    return model


def state_of(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bit_identical(model, before: dict) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    changed = [k for k, v in before.items() if not torch.equal(v, after[k])]
    assert not changed, f"weights written: {changed[:3]}"


@pytest.fixture(scope="module")
def task():
    X, y = marker_task(360, seed=0)
    return {"train": (X[:200], y[:200]), "cal": (X[200:280], y[200:280]), "test": (X[280:], y[280:])}


@pytest.fixture(scope="module")
def tuned(task):
    with torch.random.fork_rng():
        model = fine_tune(tiny_bert(), *task["train"], epochs=12)
    return model


def own_logits(model, X: np.ndarray) -> torch.Tensor:
    """The model's own logits (eval mode restored after), with the attention mask passed by hand."""
    Xt = torch.as_tensor(X)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(input_ids=Xt, attention_mask=(Xt != PAD).long()).logits
    finally:
        model.train(was_training)


def mean_nll(probs: np.ndarray, y: np.ndarray) -> float:
    return float(-np.mean(np.log(np.clip(probs[np.arange(len(y)), y], 1e-300, None))))


# ------------------------------------------------------------------------ the estimators, as it comes
def test_bert_lora_classifier_as_it_comes(tuned, task):
    """No wrapper: fit, predictions and prediction sets; the model's weights, flags and mode untouched; the
    posterior over the LoRA + head parameters only, named; NLL on held-out rows within 0.01 of the model's."""
    model = tuned
    before = state_of(model)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    clf = LaplaceActiveSubspaceClassifier(module=model, prefit=True, random_state=0,
                                          posterior=LowRank(max_components=8), compute=Compute(padding_idx=PAD))
    clf.fit(*task["train"], X_cal=task["cal"][0], y_cal=task["cal"][1])
    X_test, y_test = task["test"]
    probs = clf.predict_proba(X_test)
    _, sets = clf.predict_set(X_test)
    assert_bit_identical(model, before)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert model.training  # left as the training loop left it

    trainable = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    assert clf.trainable_parameters_ == trainable
    assert all("lora_" in n or "modules_to_save" in n for n in trainable)
    assert clf.n_weights_ == sum(math.prod(s) for s in trainable.values()) == clf.posterior_.n_weights
    assert clf.n_weights_ < sum(p.numel() for p in model.parameters()) / 10
    assert isinstance(clf.module_, ModelAdapter) and clf.module_.model is model

    # the fine-tuned model's own probabilities, from its logits
    reference = torch.softmax(own_logits(model, X_test).double(), -1).numpy()
    assert probs.shape == reference.shape and sets.shape[0] == len(X_test)
    assert mean_nll(probs, y_test) <= mean_nll(reference, y_test) + 0.01
    assert np.mean(probs.argmax(1) == y_test) > 0.7  # the task was learnt (10 % of the labels are flipped)
    restored = pickle.loads(pickle.dumps(clf))  # pickles with the model (and its adapter)
    np.testing.assert_array_equal(restored.predict_proba(X_test), probs)


def test_bert_lora_regressor_head(task):
    """A regression head (num_labels=1) through the regressor: intervals in y's units, base untouched."""
    X, _ = marker_task(160, seed=3, flip=0.0)
    y = (X == MARKER).sum(1) + 0.1 * np.random.default_rng(3).standard_normal(len(X))
    with torch.random.fork_rng():
        model = fine_tune(tiny_bert(num_labels=1, seed=1), X[:100], y[:100], epochs=8, regression=True)
    before = state_of(model)
    reg = LaplaceActiveSubspaceRegressor(module=model, prefit=True, random_state=0, posterior=LowRank(max_components=5),
                                         compute=Compute(padding_idx=PAD))
    reg.fit(X[:100], y[:100], X_cal=X[100:130], y_cal=y[100:130])
    mean, std = reg.predict(X[130:], return_std=True)
    _, intervals = reg.predict_interval(X[130:])
    assert_bit_identical(model, before)
    assert mean.shape == std.shape == (30,) and np.all(std > 0)
    assert np.all(intervals[:, 0, 0] < mean) and np.all(mean < intervals[:, 1, 0])
    np.testing.assert_allclose(mean, own_logits(model, X[130:])[:, 0].numpy(), rtol=1e-5, atol=1e-5)
    assert reg.n_weights_ == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_predictions_never_copy_the_model(tuned, task, monkeypatch):
    """After fit, predictions (sampled and linearised) neither deep-copy the model nor hold more than the
    trainable weights per sample: the frozen base is read in place by functional_call."""
    clf = LaplaceActiveSubspaceClassifier(module=tuned, prefit=True, calibration="coverage", random_state=0,
                                          posterior=Subspace(max_components=4, n_samples=20),
                                          compute=Compute(padding_idx=PAD))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the coverage target may or may not be reached on 80 rows
        clf.fit(*task["train"], X_cal=task["cal"][0], y_cal=task["cal"][1])
    fm = clf.posterior_.functional_model
    frozen = {n: p for n, p in fm.module.named_parameters() if not p.requires_grad}
    user = dict(tuned.named_parameters())
    assert all(p.data_ptr() == user[n].data_ptr() for n, p in frozen.items())  # shared, not copied
    assert fm.params0.keys() == clf.trainable_parameters_.keys()

    def refuse(*args, **kwargs):
        raise AssertionError("a deep copy during prediction")

    monkeypatch.setattr(copy, "deepcopy", refuse)
    probs = clf.predict_proba(task["test"][0])
    assert probs.shape == (len(task["test"][0]), 2) and np.allclose(probs.sum(1), 1.0)


# ------------------------------------------------------------------------------ the adapter's outputs
def test_adapter_logits_equal_the_models_own(tuned, task):
    """The adapter (plain and through functional_call) returns the model's .logits, with the attention mask
    built from the padding id equal to the one passed by hand; without the mask the logits differ."""
    X = torch.as_tensor(task["test"][0][:16])
    model = copy.deepcopy(tuned).eval()
    adapter = ModelAdapter(model, padding_idx=PAD)
    assert adapter.input_keyword == "input_ids" and adapter.passes_attention_mask
    with torch.no_grad():
        expected = model(input_ids=X, attention_mask=(X != PAD).long()).logits
        unmasked = model(input_ids=X).logits
        assert torch.equal(adapter(X), expected)
        functional = FunctionalModel(model)(X)
    # functional_call runs the same operations on the same tensors: equal up to the kernels' rounding
    torch.testing.assert_close(functional, expected, rtol=0, atol=1e-6)
    assert (unmasked - expected).abs().max() > 1e-3  # the mask matters on these padded rows


def test_mask_from_the_config_pad_token_id():
    """With padding_idx None the mask comes from config.pad_token_id; a config without one gets no mask."""
    model = tiny_bert(pad_token_id=3).eval()
    X = torch.tensor([[5, 6, 7, 3, 3], [8, 9, 3, 3, 3]])
    adapter = ModelAdapter(model)
    assert adapter.mask_token_id == 3 and adapter.passes_attention_mask
    with torch.no_grad():
        torch.testing.assert_close(adapter(X), model(input_ids=X, attention_mask=(X != 3).long()).logits,
                                   rtol=0, atol=0)
    assert ModelAdapter(model, padding_idx=0).mask_token_id == 0  # the explicit id wins
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2,
                                                               n_positions=LENGTH))
    assert gpt.config.pad_token_id is None and not ModelAdapter(gpt).passes_attention_mask


class _Keyword(nn.Module):
    """input_ids / attention_mask keywords, and a configurable raw output."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.emb = nn.EmbeddingBag(VOCAB, 3, mode="sum")

    def forward(self, input_ids=None, attention_mask=None):
        weights = torch.ones(input_ids.shape) if attention_mask is None else attention_mask.to(torch.float32)
        logits = self.emb(input_ids, per_sample_weights=weights)
        hidden = logits.detach() * 2
        if self.kind == "dict":
            return {"hidden": hidden, "logits": logits}
        if self.kind == "tuple1":
            return (logits,)
        if self.kind == "tuple2":
            return (logits, hidden)
        return {"start_logits": logits, "end_logits": hidden}


class _Wrapper(nn.Module):
    """A forward(*args, **kwargs) wrapper, as peft's PeftModel: the signature is read from the wrapped model."""

    def __init__(self, inner):
        super().__init__()
        self.model = inner

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


@pytest.mark.parametrize("kind, output", [("dict", None), ("tuple1", None), ("tuple2", 0),
                                          ("qa", "start_logits"), ("qa", lambda out: out["start_logits"])])
def test_dict_and_tuple_outputs(kind, output):
    torch.manual_seed(0)
    inner = _Keyword(kind)
    X = torch.tensor([[4, 5, 0, 0], [6, 7, 8, 0], [9, 9, 9, 9]])
    expected = inner.emb(X, per_sample_weights=(X != 0).float())
    for model in (inner, _Wrapper(inner)):
        adapter = ModelAdapter(model, output=output, padding_idx=0)
        assert adapter.input_keyword == "input_ids" and adapter.passes_attention_mask
        assert torch.equal(adapter(X), expected)
        torch.testing.assert_close(FunctionalModel(adapter)(X), expected, rtol=0, atol=0)


@pytest.mark.parametrize("kind, names", [("qa", ["'start_logits': Tensor(1, 3)", "'end_logits'"]),
                                         ("tuple2", ["[0] Tensor(1, 3)", "[1] Tensor(1, 3)", "output=0"])])
def test_undetermined_output_is_refused_naming_the_entries(kind, names):
    X = np.random.default_rng(0).integers(1, VOCAB, (30, 4))
    y = np.arange(30) % 3
    clf = LaplaceActiveSubspaceClassifier(module=_Keyword(kind), prefit=True, posterior=LowRank(max_components=2),
                                          compute=Compute(padding_idx=0))
    with pytest.raises(ValueError, match="ModelAdapter") as err:
        clf.fit(X[:20], y[:20], X_cal=X[20:], y_cal=y[20:])
    assert all(name in str(err.value) for name in names)
    with pytest.raises(ValueError, match="name the prediction"):
        fit_laplace_subspace(_Keyword(kind), torch.as_tensor(X), loss="cross_entropy", n_components=2)
    missing = "nope" if kind == "qa" else 5
    with pytest.raises(ValueError, match=f"has no output {missing!r}"):
        ModelAdapter(_Keyword(kind), output=missing, padding_idx=0)(torch.as_tensor(X))


def test_adapter_refuses_bad_settings():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ModelAdapter(lambda x: x)
    with pytest.raises(ValueError, match="padding_idx"):
        ModelAdapter(nn.Linear(2, 2), padding_idx=-1)
    with pytest.raises(TypeError, match="output"):
        ModelAdapter(nn.Linear(2, 2), output=1.5)


# ------------------------------------------------------------------------------ per-token outputs
def tiny_gpt2_lora(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=LENGTH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: Conv1D layers use fan_in_fan_out
        return peft.get_peft_model(transformers.GPT2LMHeadModel(cfg),
                                   peft.LoraConfig(task_type="CAUSAL_LM", r=2, target_modules=["c_attn"],
                                                   init_lora_weights=False))


def dense_masked_ggn(model, X: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(1/N) Σ over unmasked tokens of Jᵀ (diag p − p pᵀ) J, from full Jacobians of the model's own logits
    (called by hand, through the math attention kernel), in float64."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    theta = torch.cat([params[n].detach().reshape(-1) for n in names])
    sizes = [params[n].numel() for n in names]

    def logits(flat):
        parts = {n: t.view(params[n].shape) for n, t in zip(names, flat.split(sizes), strict=True)}
        return functional_call(model, parts, (), {"input_ids": X, "use_cache": False}).logits

    model.eval()  # the dropout of GPT-2 off, as the GGN evaluates the model
    with sdpa_kernel([SDPBackend.MATH]):
        J = torch.autograd.functional.jacobian(logits, theta)  # (n, T, V, D)
        p = torch.softmax(logits(theta), -1)
    H = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (n, T, V, V)
    G = torch.einsum("ntvd,ntvw,ntwe->ntde", J, H, J)
    return (G * mask[..., None, None]).sum((0, 1)) / mask.sum()


def test_causal_lm_ggn_with_mask_matches_dense(task):
    """A GPT-2 LM head with LoRA, as it comes, through fit_laplace_subspace with a padding mask: records are
    the unmasked tokens; G V equals the dense float64 oracle; the base weights stay bit-identical."""
    model = tiny_gpt2_lora().double()
    X = torch.as_tensor(task["train"][0][:6])
    mask = X != PAD
    before = state_of(model)
    op = GGNOperator(model, X, loss="cross_entropy", mask=mask)
    assert op.n_records == int(mask.sum()) and op.output_shape == (LENGTH, VOCAB)
    G = dense_masked_ggn(model, X, mask)
    V = torch.randn(op.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    scale = float(G.abs().max())
    torch.testing.assert_close(op @ V, G @ V, rtol=1e-8, atol=1e-10 * scale * op.shape[0])
    fit = fit_laplace_subspace(model, X, loss="cross_entropy", mask=mask, n_components=3, random_state=0, tol=1e-8)
    torch.testing.assert_close(fit.eigen.eigenvalues, torch.linalg.eigvalsh(G).flip(0)[:3], rtol=1e-6, atol=0)
    assert fit.posterior.layout.names == tuple(n for n, p in model.named_parameters() if p.requires_grad)
    # posterior weight samples fit the model itself: per-token predictive under sampled LoRA weights
    params = next(iter(sample_parameters(fit.posterior, d=3, n_samples=1, random_state=0)))
    sampled = functional_call(model, params, (), {"input_ids": X}).logits
    assert sampled.shape == (6, LENGTH, VOCAB)
    assert_bit_identical(model, before)


def test_perturbed_copy_shares_the_frozen_base():
    """perturbed_copy gives the copy new trainable tensors and shares the frozen ones (never copied per
    sample); a write into a shared frozen tensor inside the block is detected."""
    model = tiny_gpt2_lora()
    X = torch.as_tensor(marker_task(4, seed=1)[0])
    fit = fit_laplace_subspace(model, X, loss="cross_entropy", mask=X != PAD, n_components=2, random_state=0)
    z = fit.posterior.sample(1, d=2, random_state=0)[0]
    user = dict(model.named_parameters())
    with perturbed_copy(model, fit.posterior, z) as sampled:
        copied = dict(sampled.named_parameters())
        frozen = [n for n, p in user.items() if not p.requires_grad]
        assert all(copied[n].data_ptr() == user[n].data_ptr() for n in frozen)
        assert all(copied[n].data_ptr() != user[n].data_ptr() for n in fit.posterior.layout.names)
        expected = fit.posterior.parameters(z)
        assert all(torch.equal(copied[n], expected[n]) for n in expected)
    before = state_of(model)
    with pytest.raises(RuntimeError, match="frozen"):
        with perturbed_copy(model, fit.posterior, z) as sampled:
            with torch.no_grad():
                sampled.base_model.model.transformer.wte.weight.mul_(1.0)
    with perturbed_copy(model, fit.posterior, z, share_frozen=False) as sampled:
        with torch.no_grad():
            sampled.base_model.model.transformer.wte.weight.add_(1.0)
    assert_bit_identical(model, before)


class _TableNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x)))


def test_peft_on_a_plain_module_and_a_generic_peft_wrapper():
    """peft's generic PeftModel (forward(*args, **kwargs)): over a plain table network it stays as it is (called
    positionally, no adapter), the posterior over LoRA + head only; over BERT the signature is read through it."""
    torch.manual_seed(0)
    model = peft.get_peft_model(_TableNet(), peft.LoraConfig(r=2, target_modules=["lin"], modules_to_save=["head"]))
    assert ModelAdapter(model).is_trivial
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 4))
    y = (X[:, 0] > 0).astype(int)
    before = state_of(model)
    clf = LaplaceActiveSubspaceClassifier(module=model, prefit=True, random_state=0,
                                          posterior=LowRank(max_components=4))
    clf.fit(X[:80], y[:80], X_cal=X[80:], y_cal=y[80:])
    clf.predict_proba(X[80:85])
    assert clf.module_ is model  # a module called as model(X) returning a tensor is not wrapped
    assert clf.trainable_parameters_ == {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n or "modules_to_save" in n for n in clf.trainable_parameters_)
    assert_bit_identical(model, before)

    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=LENGTH)
    generic = peft.get_peft_model(transformers.BertForSequenceClassification(cfg),
                                  peft.LoraConfig(r=2, target_modules=["query"])).eval()
    adapter = ModelAdapter(generic)
    assert adapter.input_keyword == "input_ids" and adapter.passes_attention_mask and adapter.mask_token_id == 0
    ids = torch.tensor([[3, 4, 5, 0, 0]])
    with torch.no_grad():
        assert torch.equal(adapter(ids), generic(input_ids=ids, attention_mask=(ids != 0).long()).logits)


def test_bfloat16_base_with_float32_adapters():
    """peft keeps LoRA matrices in float32 over a bfloat16 base, and copies the head in bfloat16: the flat weights
    are float32 (each parameter cast back to its own dtype in the call); G V equals a dense oracle built from the
    model's own mixed-precision forward, within bfloat16 rounding; predictions are the model's own logits."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=LENGTH)
    base = transformers.BertForSequenceClassification(cfg).to(torch.bfloat16)
    model = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=2, target_modules=["query", "value"],
                                                      init_lora_weights=False))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert {p.dtype for p in trainable.values()} == {torch.float32, torch.bfloat16}
    X = torch.as_tensor(marker_task(12, seed=2)[0])
    before = state_of(model)
    op = GGNOperator(model, X, loss="cross_entropy")
    assert op.dtype == torch.float32 and op.layout.param_dtypes == tuple(p.dtype for p in trainable.values())

    names, sizes = list(trainable), [p.numel() for p in trainable.values()]
    theta = torch.cat([p.detach().reshape(-1).float() for p in trainable.values()])

    def logits(flat):
        parts = {n: t.view(trainable[n].shape).to(trainable[n].dtype)
                 for n, t in zip(names, flat.split(sizes), strict=True)}
        return functional_call(model, parts, (), {"input_ids": X, "attention_mask": (X != PAD).long()}).logits.float()

    model.eval()
    with sdpa_kernel([SDPBackend.MATH]):
        J = torch.autograd.functional.jacobian(logits, theta).double()  # (n, C, D)
        p = torch.softmax(logits(theta).double(), -1)
    model.train()
    H = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    G = torch.einsum("ncd,nce,nef->df", J, H, J) / len(X)
    V = torch.randn(op.shape[0], 2, generator=torch.Generator().manual_seed(1))
    GV = (op @ V).double()
    expected = G @ V.double()
    eps = torch.finfo(torch.bfloat16).eps
    assert (GV - expected).abs().max() <= 2 * eps * expected.abs().max()  # measured 1.8e-3 relative
    clf = LaplaceActiveSubspaceClassifier(module=model, prefit=True, random_state=0,
                                          posterior=LowRank(max_components=3), compute=Compute(padding_idx=PAD))
    y = np.arange(len(X)) % 2
    X_cal = marker_task(12, seed=5)[0]
    clf.fit(X.numpy(), y, X_cal=X_cal, y_cal=y)
    assert clf.posterior_.eigenvectors.dtype == torch.float32
    mean = clf.posterior_.predict_mean(X)
    model.eval()
    with torch.no_grad():
        own = model(input_ids=X, attention_mask=(X != PAD).long()).logits
    assert torch.equal(mean, own.float())
    assert_bit_identical(model, before)
