"""The REINVENT-style SMILES LSTM of the paper's third case (§2.4), a helper of paper_smiles.py: the model, its
sampler, and the corpus split it was trained on.

Model: Embedding(34, 256) -> LSTM(256, 256, 3 layers, batch_first) -> Linear(256, 34), about 1.6 M weights.
It reads the token ids of a SMILES prefix (starting with the start token ``^``) and returns the
logits of the next token at every position. The trained weights and vocabulary are committed in
``benchmarks/models/`` with the training log (``smiles_lstm_training.log``); they were trained (teacher forcing,
masked cross-entropy over real target tokens incl. the stop token, on 95 % of
``$GLAS_DATA_DIR/smiles/chembl_78k.smi``) by ``python benchmarks/smiles_lstm.py train --max-epochs 6
--max-minutes 70`` at commit 2f6cef6 (``git show 2f6cef6:benchmarks/smiles_lstm.py``).

Use::

    from _smiles_lstm import load_model, generate
    model, vocab = load_model()
    smiles = generate(model, vocab, 1000, generator=torch.Generator().manual_seed(0))
    # at perturbed weights (a name -> tensor dict; missing names keep the model's own weights):
    smiles = generate(model, vocab, 1000, params=theta_dict, generator=g)
"""

from __future__ import annotations

import copy
import os
import random
from typing import Mapping

import _common
import torch
from torch import nn
from torch.func import functional_call

from glas_sklearn.contrib.smiles import Vocabulary

__all__ = ["SmilesLSTM", "generate", "load_model", "split_corpus"]

HERE = str(_common.HERE)
CORPUS = str(_common.data_dir("smiles") / "chembl_78k.smi")
MODEL_DIR = os.path.join(HERE, "models")
MODEL_PATH = os.path.join(MODEL_DIR, "smiles_lstm.pt")
VOCAB_PATH = os.path.join(MODEL_DIR, "smiles_lstm_vocab.json")

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


def split_corpus(smiles: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """The training and validation SMILES of a seeded random split (the one training used: 0.05, seed 0)."""
    idx = list(range(len(smiles)))
    random.Random(seed).shuffle(idx)
    n_val = int(round(val_fraction * len(smiles)))
    return [smiles[i] for i in idx[n_val:]], [smiles[i] for i in idx[:n_val]]
