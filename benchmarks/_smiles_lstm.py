"""REINVENT-style SMILES LSTM for the paper's third case (§2.4), a helper of paper_smiles.py: model, sampler, training.

Model: Embedding(34, 256) -> LSTM(256, 256, 3 layers, batch_first) -> Linear(256, 34), about 1.6 M weights.
It reads the token ids of a SMILES prefix (starting with the start token ``^``) and returns the
logits of the next token at every position.

Training (teacher forcing, masked cross-entropy over real target tokens incl. the stop token)::

    python benchmarks/_smiles_lstm.py train --max-epochs 6 --max-minutes 70

saves ``benchmarks/models/smiles_lstm.pt`` (weights + config + history) and
``benchmarks/models/smiles_lstm_vocab.json`` after every epoch, and logs per-epoch train/validation
loss and the share of valid SMILES among 1000 freshly generated ones.
``python benchmarks/_smiles_lstm.py estimate`` times a few batches to size a run.

The corpus is ``$GLAS_DATA_DIR/smiles/chembl_78k.smi`` (default ``../shared/data`` next to the repository).
Using the trained model in paper_smiles.py (``benchmarks/`` is on ``sys.path`` when a
script in it is run)::

    from _smiles_lstm import load_model, generate
    model, vocab = load_model()
    smiles = generate(model, vocab, 1000, generator=torch.Generator().manual_seed(0))
    # at perturbed weights (a name -> tensor dict; missing names keep the model's own weights):
    smiles = generate(model, vocab, 1000, params=theta_dict, generator=g)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import time
from typing import Mapping

import _common
import torch
from torch import nn
from torch.func import functional_call

from glas_sklearn.contrib.smiles import Vocabulary, encode_batch, load_smiles, tokenize

__all__ = ["SmilesLSTM", "generate", "load_model", "sequence_loss", "split_corpus", "PAPER_TABLE3_TOKENS"]

HERE = str(_common.HERE)
CORPUS = str(_common.data_dir("smiles") / "chembl_78k.smi")
MODEL_DIR = os.path.join(HERE, "models")
MODEL_PATH = os.path.join(MODEL_DIR, "smiles_lstm.pt")
VOCAB_PATH = os.path.join(MODEL_DIR, "smiles_lstm_vocab.json")
OPTIM_PATH = os.path.join(MODEL_DIR, "smiles_lstm_optim.pt")  # resume only; not for committing
LOG_PATH = os.path.join(MODEL_DIR, "smiles_lstm_training.log")

# The paper's Table 3, index 0..33 (index 1 is the start token, written "^" here).
PAPER_TABLE3_TOKENS = [
    "$", "^", "#", "%10", "(", ")", "-", "1", "2", "3", "4", "5", "6", "7", "8", "9", "=",
    "Br", "C", "Cl", "F", "N", "O", "S", "[N+]", "[N-]", "[O-]", "[S+]", "[n+]", "[nH]",
    "c", "n", "o", "s",
]


class SmilesLSTM(nn.Module):
    """Autoregressive token model: Embedding -> multi-layer LSTM -> Linear to logits.

    Parameters
    ----------
    vocab_size : int, default=34
    embedding_dim : int, default=256
    hidden_size : int, default=256
    num_layers : int, default=3
    dropout : float, default=0.0
        Dropout between LSTM layers (0 as in REINVENT's prior).
    """

    def __init__(
        self,
        vocab_size: int = 34,
        embedding_dim: int = 256,
        hidden_size: int = 256,
        num_layers: int = 3,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.config = dict(
            vocab_size=vocab_size,
            embedding_dim=embedding_dim,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
        )
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(
            embedding_dim, hidden_size, num_layers=num_layers, batch_first=True, dropout=dropout
        )
        self.linear = nn.Linear(hidden_size, vocab_size)

    def forward(
        self,
        tokens: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None = None,
        return_state: bool = False,
    ):
        """Next-token logits.

        Parameters
        ----------
        tokens : LongTensor of shape (n, T)
        state : (h, c), optional
            LSTM state to continue from, each of shape (num_layers, n, hidden_size).
        return_state : bool, default=False
            Also return the final LSTM state (used by the sampler).

        Returns
        -------
        logits : Tensor of shape (n, T, vocab_size)
        state : (h, c), only when ``return_state``
        """
        out, new_state = self.lstm(self.embedding(tokens), state)
        logits = self.linear(out)
        return (logits, new_state) if return_state else logits


def sequence_loss(
    model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, params: Mapping | None = None
) -> torch.Tensor:
    """Mean cross-entropy over real target tokens (teacher forcing; see ``encode_batch``)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if params is None:
        logits = model(inputs)
    else:
        logits = functional_call(model, dict(params), (inputs,))
    losses = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    )
    m = mask.reshape(-1).to(losses.dtype)
    return (losses * m).sum() / m.sum()


@torch.no_grad()
def generate(
    model: nn.Module,
    vocab: Vocabulary,
    n: int,
    *,
    params: Mapping[str, torch.Tensor] | None = None,
    max_len: int = 256,
    batch_size: int = 1000,
    generator: torch.Generator | None = None,
    return_lengths: bool = False,
):
    """Sample SMILES token by token from the softmax of the model's logits.

    Parameters
    ----------
    model : SmilesLSTM (or any module with the same ``forward(tokens, state, return_state)``)
        Never modified: it is called through ``torch.func.functional_call``, on an eval-mode copy when it is in
        training mode.
    vocab : Vocabulary
    n : int
        Number of SMILES to sample.
    params : mapping name -> Tensor, optional
        Weights to run the model at (e.g. one posterior sample θ0 + P z unflattened into a dict);
        names left out keep the model's own weights. Default None: the model's own weights.
    max_len : int, default=256
        Maximum number of tokens after the start token; a sequence that reaches it without a stop
        token is returned truncated (and is then usually invalid).
    batch_size : int, default=1000
        Sequences sampled in parallel.
    generator : torch.Generator, optional
        Source of randomness (on the model's device), for reproducible samples.
    return_lengths : bool, default=False
        Also return the number of tokens of each sequence (before the stop token).

    Returns
    -------
    smiles : list of str
    lengths : list of int, only when ``return_lengths``
    """
    view = model if not any(m.training for m in model.modules()) else copy.deepcopy(model).eval()
    device = next(view.parameters()).device
    call_params = {} if params is None else dict(params)
    smiles: list[str] = []
    lengths: list[int] = []
    for start in range(0, n, batch_size):
        b = min(batch_size, n - start)
        x = torch.full((b, 1), vocab.start_id, dtype=torch.long, device=device)
        state = None
        seqs = torch.full((b, max_len), vocab.stop_id, dtype=torch.long, device=device)
        finished = torch.zeros(b, dtype=torch.bool, device=device)
        for t in range(max_len):
            logits, state = functional_call(
                view, call_params, (x,), {"state": state, "return_state": True}, strict=False
            )
            probs = torch.softmax(logits[:, -1, :].float(), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            nxt = torch.where(finished, torch.full_like(nxt, vocab.stop_id), nxt)
            seqs[:, t] = nxt
            finished |= nxt == vocab.stop_id
            if bool(finished.all()):
                break
            x = nxt[:, None]
        for row in seqs.cpu().tolist():
            s = vocab.decode([vocab.start_id] + row, strict=False)
            smiles.append(s)
            lengths.append(row.index(vocab.stop_id) if vocab.stop_id in row else max_len)
    return (smiles, lengths) if return_lengths else smiles


def load_model(
    path: str = MODEL_PATH, vocab_path: str = VOCAB_PATH, map_location: str = "cpu"
) -> tuple[SmilesLSTM, Vocabulary]:
    """Trained model (eval mode) and its vocabulary from the files written by training."""
    ckpt = torch.load(path, map_location=map_location, weights_only=True)
    model = SmilesLSTM(**ckpt["config"])
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), Vocabulary.load(vocab_path)


# --------------------------------------------------------------------------------------- training


def _log(msg: str, fh) -> None:
    line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}"
    print(line, flush=True)
    if fh is not None:
        fh.write(line + "\n")
        fh.flush()


def _length_bucketed_batches(smiles: list[str], batch_size: int, rng: random.Random) -> list[list[str]]:
    """Shuffled batches of similar-length SMILES (less padding), in shuffled order."""
    order = smiles[:]
    rng.shuffle(order)
    chunk = batch_size * 50
    batches = []
    for i in range(0, len(order), chunk):
        part = sorted(order[i : i + chunk], key=len)
        batches += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def _valid_share(smiles: list[str]) -> float:
    from glas_sklearn.contrib.chem import is_valid

    return sum(is_valid(s) for s in smiles) / max(len(smiles), 1)


@torch.no_grad()
def _eval_loss(model: nn.Module, smiles: list[str], vocab: Vocabulary, batch_size: int = 256) -> float:
    total, count = 0.0, 0
    for i in range(0, len(smiles), batch_size):
        tokens, mask = encode_batch(smiles[i : i + batch_size], vocab)
        k = int(mask.sum())
        total += float(sequence_loss(model, tokens, mask)) * k
        count += k
    return total / count


def _atomic_save(obj, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def split_corpus(smiles: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """The training and validation SMILES of a seeded random split (the one training used: 0.05, seed 0)."""
    idx = list(range(len(smiles)))
    random.Random(seed).shuffle(idx)
    n_val = int(round(val_fraction * len(smiles)))
    return [smiles[i] for i in idx[n_val:]], [smiles[i] for i in idx[:n_val]]


def _prepare(args, fh):
    corpus = load_smiles(args.corpus)
    vocab = Vocabulary.from_smiles(corpus)
    same = vocab.tokens == PAPER_TABLE3_TOKENS
    _log(
        f"corpus {args.corpus}: {len(corpus)} SMILES; vocabulary of {len(vocab)} tokens "
        f"{'== the paper Table 3 (34 tokens, same order)' if same else '!= the paper Table 3'}",
        fh,
    )
    _log(f"vocabulary: {vocab.tokens}", fh)
    lengths = sorted(len(tokenize(s)) for s in corpus)
    _log(f"token lengths: median {lengths[len(lengths) // 2]}, max {lengths[-1]}", fh)
    train, val = split_corpus(corpus, args.val_fraction, args.seed)
    if args.train_size and args.train_size < len(train):
        train = train[: args.train_size]
    _log(f"split (seed {args.seed}): {len(train)} training, {len(val)} validation SMILES", fh)
    return vocab, train, val


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, mask: torch.Tensor,
                clip: float) -> torch.Tensor:
    """One teacher-forced step: masked cross-entropy, backward, gradient norm clipped to ``clip``, Adam step."""
    loss = sequence_loss(model, tokens, mask)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss


def estimate(args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vocab, train, val = _prepare(args, None)
    model = SmilesLSTM(vocab_size=len(vocab))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batches = _length_bucketed_batches(train, args.batch_size, random.Random(args.seed))
    n_time = args.estimate_batches
    t0 = time.perf_counter()
    ntok = 0
    for b in batches[:n_time]:
        tokens, mask = encode_batch(b, vocab)
        _train_step(model, opt, tokens, mask, args.clip)
        ntok += tokens.numel()
    dt = (time.perf_counter() - t0) / n_time
    t0 = time.perf_counter()
    vl = _eval_loss(model, val[:1000], vocab)
    t_val = (time.perf_counter() - t0) * len(val) / 1000
    t0 = time.perf_counter()
    gen = generate(model, vocab, 200, generator=torch.Generator().manual_seed(0))
    t_gen = (time.perf_counter() - t0) * args.n_generate / 200
    t0 = time.perf_counter()
    _valid_share(gen)
    t_valid = (time.perf_counter() - t0) * args.n_generate / 200
    print(
        f"{dt:.3f} s/batch ({ntok / n_time:.0f} padded tokens/batch); {len(batches)} batches/epoch -> "
        f"{dt * len(batches) / 60:.1f} min train; val {t_val / 60:.1f} min; generate "
        f"{args.n_generate} (untrained, long) {t_gen / 60:.1f} min; validity {t_valid:.1f} s; "
        f"val loss {vl:.3f}"
    )


def train(args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(MODEL_DIR, exist_ok=True)
    os.makedirs(os.path.dirname(args.log), exist_ok=True)
    fh = open(args.log, "a", encoding="utf-8")
    t_start = time.perf_counter()
    _log(f"training config: {vars(args)}", fh)
    vocab, train_set, val_set = _prepare(args, fh)
    model = SmilesLSTM(vocab_size=len(vocab))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    history: list[dict] = []
    first_epoch = 1
    if args.resume and os.path.exists(MODEL_PATH):
        ckpt = torch.load(MODEL_PATH, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["state_dict"])
        history = list(ckpt.get("history", []))
        first_epoch = int(ckpt["epoch"]) + 1
        if os.path.exists(OPTIM_PATH):
            opt.load_state_dict(torch.load(OPTIM_PATH, map_location="cpu", weights_only=True))
        _log(f"resumed from {MODEL_PATH} after epoch {first_epoch - 1}", fh)
    n_weights = sum(p.numel() for p in model.parameters())
    _log(f"model SmilesLSTM {model.config}: {n_weights} weights", fh)
    vocab.save(VOCAB_PATH)
    gen = torch.Generator().manual_seed(args.seed + 1)
    epoch_times: list[float] = []
    for epoch in range(first_epoch, args.max_epochs + 1):
        t_epoch = time.perf_counter()
        model.train()
        batches = _length_bucketed_batches(train_set, args.batch_size, random.Random(args.seed + epoch))
        run_loss, run_tok = 0.0, 0
        for k, b in enumerate(batches, 1):
            tokens, mask = encode_batch(b, vocab)
            loss = _train_step(model, opt, tokens, mask, args.clip)
            ntok = int(mask.sum())
            run_loss += float(loss.detach()) * ntok
            run_tok += ntok
            if k % args.log_every == 0:
                el = time.perf_counter() - t_epoch
                _log(
                    f"epoch {epoch} batch {k}/{len(batches)}: running train loss "
                    f"{run_loss / run_tok:.4f} ({el / 60:.1f} min, ~{el / k * len(batches) / 60:.1f} min/epoch)",
                    fh,
                )
        model.eval()
        train_loss = run_loss / run_tok
        val_loss = _eval_loss(model, val_set, vocab)
        sampled, lens = generate(model, vocab, args.n_generate, generator=gen, return_lengths=True)
        valid = _valid_share(sampled)
        dt = time.perf_counter() - t_epoch
        epoch_times.append(dt)
        history.append(
            dict(epoch=epoch, train_loss=train_loss, val_loss=val_loss, valid=valid,
                 mean_length=sum(lens) / len(lens), minutes=dt / 60)
        )
        _atomic_save(
            {"state_dict": model.state_dict(), "config": model.config, "epoch": epoch,
             "history": history, "vocab": vocab.tokens, "n_train": len(train_set),
             "n_val": len(val_set), "seed": args.seed},
            MODEL_PATH,
        )
        _atomic_save(opt.state_dict(), OPTIM_PATH)
        _log(
            f"EPOCH {epoch}: train loss {train_loss:.4f}, val loss {val_loss:.4f}, valid "
            f"{100 * valid:.1f} % of {args.n_generate} generated (mean length {history[-1]['mean_length']:.1f} "
            f"tokens), {dt / 60:.1f} min; saved {MODEL_PATH} ({os.path.getsize(MODEL_PATH) / 1e6:.1f} MB)",
            fh,
        )
        _log(f"examples: {sampled[:5]}", fh)
        if epoch >= args.min_epochs and valid >= args.target_valid:
            _log(f"stop: {100 * valid:.1f} % valid >= {100 * args.target_valid:.0f} % after {epoch} epochs", fh)
            break
        elapsed = (time.perf_counter() - t_start) / 60
        if args.max_minutes and elapsed + max(epoch_times) / 60 > args.max_minutes:
            _log(f"stop: another epoch would exceed the {args.max_minutes} min budget ({elapsed:.1f} min used)", fh)
            break
    else:
        _log(f"stop: epoch cap {args.max_epochs} reached", fh)
    _log(f"done in {(time.perf_counter() - t_start) / 60:.1f} min; history {json.dumps(history)}", fh)
    fh.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["train", "estimate"])
    p.add_argument("--corpus", default=CORPUS)
    p.add_argument("--log", default=LOG_PATH)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--train-size", type=int, default=0, help="use only the first K training SMILES (0 = all)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=5.0, help="max gradient norm")
    p.add_argument("--max-epochs", type=int, default=20)
    p.add_argument("--min-epochs", type=int, default=3)
    p.add_argument("--target-valid", type=float, default=0.8)
    p.add_argument("--max-minutes", type=float, default=0, help="wall-clock budget (0 = none)")
    p.add_argument("--n-generate", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--estimate-batches", type=int, default=20)
    args = p.parse_args(argv)
    if args.command == "train":
        train(args)
    else:
        estimate(args)


if __name__ == "__main__":
    main()
