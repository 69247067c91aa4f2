# %% [markdown]
# # Transformers with LoRA adapters, as they come
#
# Most networks fine-tuned today are pretrained transformers with a few adapter weights trained on top: a Hugging
# Face `transformers` model with LoRA adapters from `peft`. This notebook passes such a model to the estimator
# exactly as the fine-tuning loop leaves it, with no wrapper: its forward takes `input_ids` / `attention_mask`
# keywords and returns a `SequenceClassifierOutput`. The estimator feeds the token ids as `input_ids`, builds the
# attention mask from `padding_idx`, reads `.logits`, and puts the posterior on the **trainable parameters only**:
# the LoRA matrices and the classification head (peft's `modules_to_save`). The frozen base is read in place by
# `torch.func.functional_call`, never copied or written.
#
# Everything runs offline: the models are built from small configs (random "pretrained" weights), and the task
# is generated here: **does a token sequence contain the marker token?** with 10 % of the labels flipped, so that
# a perfect fit is impossible and the probabilities have something to be calibrated for. A second part does the
# same for per-token outputs: a small GPT-2 language-model head with LoRA, through
# `glas_sklearn.laplace.fit_laplace_subspace` with a padding mask.

# %%
import os
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import peft
import torch
import transformers
from IPython.display import display
from torch.func import functional_call

from glas_sklearn import Compute, LaplaceActiveSubspaceClassifier, LowRank
from glas_sklearn.laplace import fit_laplace_subspace
from glas_sklearn.predictive import mean_set_size, prediction_sets, set_coverage
from glas_sklearn.sampling import sample_parameters

# %matplotlib inline
plt.rcParams["figure.dpi"] = 80
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
t_notebook = time.perf_counter()

# %% tags=["parameters"]
# GLAS_NOTEBOOK_QUICK=1 in the environment: a smoke run with small sizes (used by tests/test_notebooks.py);
# its numbers are not the ones discussed below. Unset (the default): the sizes the text below discusses.
QUICK = os.environ.get("GLAS_NOTEBOOK_QUICK", "0") == "1"

SEED = 0
N_TUNE, N_CAL, N_TEST = (200, 100, 200) if QUICK else (600, 300, 1000)  # fine-tuning / calibration / test rows
EPOCHS = 10 if QUICK else 8          # fine-tuning epochs (mini-batches of 32, Adam, lr 1e-2)
MAX_COMPONENTS = 8 if QUICK else 30  # eigenpairs = the subspace dimension d
LM_EPOCHS = 15 if QUICK else 30      # epochs of the language-model part
LEVEL = 0.9                          # prediction-set level
VOCAB, LENGTH, MARKER, PAD = 30, 16, 1, 0

# %% [markdown]
# ## The task and the model
#
# Sequences of 4–16 random tokens (ids 2–29), right-padded with id 0; in half of them one position holds the
# marker token 1. The model is a 2-layer BERT (hidden size 32) with a 2-class head; LoRA of rank 4 on the query
# and value projections. `get_peft_model` freezes the base and marks the LoRA matrices and the new head trainable.


# %%
def marker_task(n: int, seed: int, flip: float = 0.1):
    """Token ids (n, LENGTH) right-padded with PAD; label 1 when MARKER occurs, a share `flip` of labels flipped."""
    rng = np.random.default_rng(seed)
    X = rng.integers(2, VOCAB, (n, LENGTH))
    lengths = rng.integers(4, LENGTH + 1, n)
    y = rng.integers(0, 2, n)
    for i in range(n):
        if y[i]:
            X[i, rng.integers(0, lengths[i])] = MARKER
        X[i, lengths[i]:] = PAD
    return X, np.where(rng.random(n) < flip, 1 - y, y)


X_all, y_all = marker_task(N_TUNE + N_CAL + N_TEST, seed=SEED)
X_tune, y_tune = X_all[:N_TUNE], y_all[:N_TUNE]                                        # fine-tuning rows
X_cal, y_cal = X_all[N_TUNE:N_TUNE + N_CAL], y_all[N_TUNE:N_TUNE + N_CAL]              # never seen in training
X_test, y_test = X_all[N_TUNE + N_CAL:], y_all[N_TUNE + N_CAL:]

torch.manual_seed(SEED)
config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2)
model = peft.get_peft_model(transformers.BertForSequenceClassification(config),
                            peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"]))
model.print_trainable_parameters()

# %% [markdown]
# ## Fine-tuning, the usual way
#
# A plain loop over the fine-tuning rows, the Hugging Face way (`labels=` gives the loss). One epoch is timed,
# for comparison with the estimator's fit below.

# %%
opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
gen = torch.Generator().manual_seed(SEED)
Xt, yt = torch.as_tensor(X_tune), torch.as_tensor(y_tune)
epoch_seconds = []
model.train()
for _ in range(EPOCHS):
    t0 = time.perf_counter()
    for idx in torch.randperm(N_TUNE, generator=gen).split(32):
        loss = model(input_ids=Xt[idx], attention_mask=(Xt[idx] != PAD).long(), labels=yt[idx]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    epoch_seconds.append(time.perf_counter() - t0)
print(f"{EPOCHS} epochs, last loss {loss.item():.3f}, one epoch {np.mean(epoch_seconds):.2f} s")

# %% [markdown]
# ## Wrapped as it comes
#
# `prefit=True`: the model is θ0 as it is. `X, y` are its fine-tuning rows (the curvature is built on them);
# `X_cal, y_cal` are rows the fine-tuning never saw (split-conformal sets, and σ0 chosen by the calibration
# rows' NLL). `padding_idx=0` gives the attention mask; without it the config's `pad_token_id` would be used.

# %%
before = {k: v.detach().clone() for k, v in model.state_dict().items()}
t0 = time.perf_counter()
clf = LaplaceActiveSubspaceClassifier(module=model, prefit=True, confidence_level=LEVEL, random_state=SEED,
                                      posterior=LowRank(max_components=MAX_COMPONENTS),
                                      compute=Compute(padding_idx=PAD))
clf.fit(X_tune, y_tune, X_cal=X_cal, y_cal=y_cal)
fit_seconds = time.perf_counter() - t0
unchanged = all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
n_all = sum(p.numel() for p in model.parameters())
print(f"fit {fit_seconds:.1f} s = {fit_seconds / np.mean(epoch_seconds):.1f} fine-tuning epochs; "
      f"D = {clf.n_weights_} trainable of {n_all} weights ({clf.n_weights_ / n_all:.1%}); d = {clf.n_components_}; "
      f"sigma0 = {clf.sigma0_:.3g}; base weights bit-identical: {unchanged}")
print(f"module_: {type(clf.module_).__name__}({clf.module_.extra_repr()}) around the model itself "
      f"(module_.model is model: {clf.module_.model is model})")
pd.Series({name: shape for name, shape in clf.trainable_parameters_.items()}, name="shape").to_frame()

# %% [markdown]
# ## Test rows: GLAS vs the fine-tuned model
#
# The fine-tuned model's own probabilities (softmax of its `.logits`) against the estimator's; ECE over 15 bins of
# the top-class probability. The fine-tuned model's sets are the smallest whose probability reaches 90 %, GLAS's
# the split-conformal sets (`predict_set`).


# %%
def ece(probs, labels, bins=15):
    conf, pred = probs.max(1), probs.argmax(1)
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            total += inside.mean() * abs((pred[inside] == labels[inside]).mean() - conf[inside].mean())
    return float(total)


def nll(probs, labels):
    return float(-np.mean(np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None))))


model.eval()
with torch.no_grad():
    logits = model(input_ids=torch.as_tensor(X_test), attention_mask=torch.as_tensor(X_test != PAD).long()).logits
model.train()  # as the fine-tuning left it
p_map = torch.softmax(logits.double(), -1).numpy()
p_glas = clf.predict_proba(X_test)
rows = []
for name, p, sets in [("fine-tuned", p_map, prediction_sets(p_map, LEVEL)),
                      ("GLAS", p_glas, clf.predict_set(X_test)[1])]:
    rows.append({"model": name, "accuracy": float((p.argmax(1) == y_test).mean()), "NLL": nll(p, y_test),
                 "ECE": ece(p, y_test), f"{LEVEL:.0%} set coverage": float(set_coverage(y_test, sets)[0]),
                 f"{LEVEL:.0%} set size": float(mean_set_size(sets)[0])})
display(pd.DataFrame(rows).set_index("model").round(4))

# %%
fig, ax = plt.subplots(figsize=(6, 4))
edges = np.linspace(0.5, 1, 11)
for name, p in [("fine-tuned", p_map), ("GLAS", p_glas)]:
    conf, right = p.max(1), p.argmax(1) == y_test
    which = np.clip(np.digitize(conf, edges) - 1, 0, len(edges) - 2)
    acc = [right[which == b].mean() if (which == b).any() else np.nan for b in range(len(edges) - 1)]
    ax.plot((edges[:-1] + edges[1:]) / 2, acc, "o-", label=name)
ax.plot([0.5, 1], [0.5, 1], "k--", lw=0.8)
ax.set(xlabel="top-class probability", ylabel="accuracy", title="reliability on the test rows")
ax.legend()
plt.show()

# %% [markdown]
# **What we see** (full mode). The fine-tuned model gets 91 % of the 1000 test rows right (the 10 % of flipped
# labels cap it near 90 %), with NLL 0.295 and an ECE of 0.003: on this task it is already well calibrated.
# GLAS keeps its predictions (same accuracy) and its NLL within 0.001 (0.296; the target is + 0.01), with
# σ0 = 0.44 chosen on half of the calibration rows; the ECE rises to 0.014. Its split-conformal 90 % sets cover
# 0.95 of the test rows with 1.38 classes on average, more conservative than the fine-tuned model's smallest
# 90 %-mass sets (0.92 with 1.07), which carry no guarantee. The model's weights came back bit-identical. The
# fit's time is printed above in fine-tuning epochs: about 30 curvature products on the 600 fine-tuning rows
# (Lanczos for 30 eigenpairs) and the calibration rows' per-row Jacobians, each costing about as much as a pass
# of fine-tuning over those rows (timings on a shared machine vary). One seed on a toy task: a worked example;
# the measured rows are in `docs/benchmarks/studies.md#hf-lora`.
#
# ## Per-token outputs: a GPT-2 language-model head
#
# Next-token logits `(n, T, V)` are per-position predictions, not one per row, so they go through the lower-level
# `fit_laplace_subspace` with a padding mask: every real next token is one record. The task: after the marker
# token always comes token 2; elsewhere tokens are random. A 2-layer GPT-2 (its random "pretrained" weights drawn
# wider than GPT-2's default, so that the frozen tied embeddings can express a confident next token) with LoRA on
# its attention projection (`c_attn`) and its final layer norm trainable (`modules_to_save=["ln_f"]`), fine-tuned
# briefly; no attention mask is needed for a causal model with right padding (the config has no `pad_token_id`,
# so none is built).

# %%
rng = np.random.default_rng(SEED + 1)
n_lm = 200 if QUICK else 400
seqs = rng.integers(3, VOCAB, (n_lm, LENGTH + 1))
lengths = rng.integers(6, LENGTH + 2, n_lm)
for i in range(n_lm):
    at = rng.integers(0, lengths[i] - 1)
    seqs[i, at], seqs[i, at + 1] = MARKER, 2
    seqs[i, lengths[i]:] = PAD
inputs, targets = torch.as_tensor(seqs[:, :-1]), torch.as_tensor(seqs[:, 1:])
real = targets != PAD  # positions whose next token is real: the records

torch.manual_seed(SEED)
lm_config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=LENGTH,
                                    initializer_range=0.3)
lm = peft.get_peft_model(transformers.GPT2LMHeadModel(lm_config),
                         peft.LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["c_attn"], fan_in_fan_out=True,
                                         modules_to_save=["ln_f"]))
lm_opt = torch.optim.Adam([p for p in lm.parameters() if p.requires_grad], lr=1e-2)
lm.train()
for _ in range(LM_EPOCHS):
    for idx in torch.randperm(n_lm, generator=gen).split(32):
        out = lm(input_ids=inputs[idx]).logits
        loss = torch.nn.functional.cross_entropy(out[real[idx]], targets[idx][real[idx]])
        lm_opt.zero_grad()
        loss.backward()
        lm_opt.step()

fit = fit_laplace_subspace(lm, inputs, loss="cross_entropy", mask=real, n_components=10, random_state=SEED)
print(f"N = {fit.n_records} tokens as records (real next tokens), D = {fit.posterior.n_weights} LoRA + ln_f weights, "
      f"top eigenvalues {np.round(fit.eigen.eigenvalues[:4].numpy(), 4)}")

# %% [markdown]
# Posterior weight samples are parameter dicts over the LoRA weights (the model's own names), for
# `torch.func.functional_call` on the model itself: the predictive per token is the mean of the softmax over
# samples. After the marker the next token is certain, elsewhere it is uniform over 27 tokens; the per-token
# predictive should know the difference. (Full mode: about 1.03 nats after the marker, with P(next = 2) ≈ 0.82
# after 30 epochs, against 3.25 elsewhere, close to the uniform 3.30.)

# %%
lm.eval()
with torch.no_grad():
    p_tokens = torch.stack([torch.softmax(functional_call(lm, params, (inputs[:50],)).logits, -1)
                            for params in sample_parameters(fit.posterior, d=10, n_samples=30, random_state=SEED)])
lm.train()
p_mean = p_tokens.mean(0)
entropy = -(p_mean * p_mean.clamp_min(1e-12).log()).sum(-1)
after_marker = (inputs[:50] == MARKER) & real[:50]
elsewhere = real[:50] & ~after_marker
print(f"predictive entropy after the marker {entropy[after_marker].mean():.3f} nats, elsewhere "
      f"{entropy[elsewhere].mean():.3f} (uniform over 27 tokens: {np.log(27):.3f}); P(next = 2 | marker) "
      f"{p_mean[after_marker][:, 2].mean():.3f}")

# %%
print(f"notebook wall time: {time.perf_counter() - t_notebook:.0f} s ({'quick' if QUICK else 'full'} mode)")
