"""Tests of the REINVENT-style SMILES tokenizer, vocabulary and teacher-forcing batches."""

from __future__ import annotations

import os

import pytest
import torch

from glas_sklearn.contrib.smiles import (
    START_TOKEN,
    STOP_TOKEN,
    Vocabulary,
    encode_batch,
    load_smiles,
    tokenize,
)

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "smiles_sample.smi")

# The paper's Table 3 (index 1, the start token, is written "^").
PAPER_TABLE3 = [
    "$", "^", "#", "%10", "(", ")", "-", "1", "2", "3", "4", "5", "6", "7", "8", "9", "=",
    "Br", "C", "Cl", "F", "N", "O", "S", "[N+]", "[N-]", "[O-]", "[S+]", "[n+]", "[nH]",
    "c", "n", "o", "s",
]


@pytest.fixture(scope="module")
def sample() -> list[str]:
    return load_smiles(FIXTURE)


@pytest.fixture(scope="module")
def vocab(sample) -> Vocabulary:
    return Vocabulary.from_smiles(sample)


@pytest.mark.parametrize(
    "smiles, expected",
    [
        ("CCO", ["C", "C", "O"]),
        ("CCl", ["C", "Cl"]),
        ("BrC(Br)Cl", ["Br", "C", "(", "Br", ")", "Cl"]),
        ("c1cc[nH]c1", ["c", "1", "c", "c", "[nH]", "c", "1"]),
        ("C[N+](C)(C)[O-]", ["C", "[N+]", "(", "C", ")", "(", "C", ")", "[O-]"]),
        ("c1ccc%10cc1%10", ["c", "1", "c", "c", "c", "%10", "c", "c", "1", "%10"]),
        ("Sc1ccsc1", ["S", "c", "1", "c", "c", "s", "c", "1"]),
        ("[Cl-]", ["[Cl-]"]),
        ("C#N", ["C", "#", "N"]),
        ("", []),
    ],
)
def test_tokenize_known(smiles, expected):
    assert tokenize(smiles) == expected


def test_tokenize_errors():
    with pytest.raises(TypeError, match="SMILES string"):
        tokenize(123)
    with pytest.raises(ValueError, match="unclosed"):
        tokenize("C[nH")


def test_fixture_round_trip(sample, vocab):
    assert len(sample) >= 200
    for s in sample:
        assert "".join(tokenize(s)) == s
        ids = vocab.encode(s)
        assert ids[0] == vocab.start_id and ids[-1] == vocab.stop_id
        assert vocab.stop_id not in ids[1:-1] and vocab.start_id not in ids[1:]
        assert vocab.decode(ids) == s
        assert vocab.decode(ids[1:]) == s  # without the start id as well
        assert vocab.decode(vocab.encode(s, add_special=False)) == s


def test_vocabulary_from_fixture(vocab):
    # The fixture was chosen to contain every token of the corpus: the paper's 34-token vocabulary.
    assert len(vocab) == 34
    assert vocab.tokens == PAPER_TABLE3
    assert vocab.tokens[0] == STOP_TOKEN and vocab.stop_id == 0
    assert vocab.tokens[1] == START_TOKEN and vocab.start_id == 1
    assert vocab.tokens[2:] == sorted(vocab.tokens[2:])
    assert "Cl" in vocab and "l" not in vocab


def test_vocabulary_errors(vocab):
    with pytest.raises(KeyError, match="'B'"):
        vocab.encode("BC")
    with pytest.raises(ValueError, match="special token"):
        Vocabulary(["C", "$"])
    with pytest.raises(ValueError, match="duplicates"):
        Vocabulary(["C", "C"])
    with pytest.raises(ValueError, match="cannot appear"):
        vocab.decode([1, 18, 1, 18, 0])
    assert vocab.decode([1, 18, 1, 18, 0], strict=False) == "C^C"


def test_vocabulary_json_round_trip(vocab, tmp_path):
    assert Vocabulary.from_json(vocab.to_json()) == vocab
    path = tmp_path / "vocab.json"
    vocab.save(path)
    assert Vocabulary.load(path) == vocab
    with pytest.raises(ValueError, match="start with"):
        Vocabulary.from_json('{"tokens": ["C", "O"]}')


def test_encode_batch_padding_and_mask(sample, vocab):
    batch = sample[:37]
    tokens, mask = encode_batch(batch, vocab)
    lengths = [len(tokenize(s)) for s in batch]
    n, T = tokens.shape
    assert tokens.dtype == torch.long and mask.dtype == torch.bool
    assert (n, T) == (len(batch), max(lengths) + 2)
    assert mask.shape == (n, T - 1)
    assert torch.all(tokens[:, 0] == vocab.start_id)
    targets = tokens[:, 1:]
    for i, (s, L) in enumerate(zip(batch, lengths, strict=True)):
        # real targets: the L tokens and the stop token, as one leading run
        assert mask[i].tolist() == [True] * (L + 1) + [False] * (T - 2 - L)
        assert targets[i, L].item() == vocab.stop_id
        assert torch.all(targets[i, L:] == vocab.stop_id)  # padding is the stop id
        assert vocab.decode(targets[i, :L].tolist()) == s
        assert vocab.decode(tokens[i].tolist()) == s
    assert int(mask.sum()) == sum(lengths) + len(batch)


def test_encode_batch_small_example():
    vocab = Vocabulary.from_smiles(["CCO", "C"])
    tokens, mask = encode_batch(["CCO", "C"], vocab)
    assert tokens.tolist() == [[1, 2, 2, 3, 0], [1, 2, 0, 0, 0]]
    assert mask.tolist() == [[True, True, True, True], [True, True, False, False]]


def test_encode_batch_errors(vocab):
    with pytest.raises(TypeError, match="single string"):
        encode_batch("CCO", vocab)
    with pytest.raises(ValueError, match="at least one"):
        encode_batch([], vocab)


def test_load_smiles(tmp_path):
    path = tmp_path / "x.smi"
    path.write_text("CCO ethanol\n\n  c1ccccc1\nCl\n")
    assert load_smiles(path) == ["CCO", "c1ccccc1", "Cl"]
