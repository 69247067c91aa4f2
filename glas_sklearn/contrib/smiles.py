"""SMILES tokenisation and vocabulary for autoregressive sequence models (REINVENT style).

A SMILES string is split into tokens the way REINVENT does it: bracket atoms (``[nH]``,
``[N+]``, ...) are one token, two-digit ring closures ``%NN`` are one token, the two-letter
halogens ``Br`` and ``Cl`` are one token, and every other character is a token of its own.
Two special tokens frame every sequence: the start token ``^`` and the stop token ``$``, which
also serves as padding. The vocabulary puts ``$`` at index 0 and ``^`` at index 1, followed by the
remaining tokens in sorted order; on the ChEMBL corpus of the paper this gives exactly its
34-token vocabulary (its Table 3).

For teacher forcing, :func:`encode_batch` returns a padded ``(n, T)`` token tensor whose rows start
with the start token; the network reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``, and the
returned mask marks the real target positions (every SMILES token plus its stop token).
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable, Sequence

import torch

__all__ = [
    "START_TOKEN",
    "STOP_TOKEN",
    "Vocabulary",
    "tokenize",
    "encode_batch",
    "load_smiles",
]

START_TOKEN = "^"
STOP_TOKEN = "$"

# Alternatives are tried left to right at each position: a bracket atom first, then a two-digit
# ring closure, then the two-letter halogens, else one character.
_TOKEN_PATTERN = re.compile(r"\[[^\]]*\]|%\d{2}|Br|Cl|.", re.DOTALL)


def tokenize(smiles: str) -> list[str]:
    """Split one SMILES string into REINVENT tokens.

    Parameters
    ----------
    smiles : str
        A SMILES string, without start or stop tokens.

    Returns
    -------
    list of str
        The tokens; ``"".join(tokenize(s)) == s`` always holds.

    Raises
    ------
    TypeError
        If ``smiles`` is not a string.
    ValueError
        If ``smiles`` contains an unclosed ``[`` (the bracket atom would be split into characters).

    Examples
    --------
    >>> tokenize("Clc1cc[nH]c1C%10Br")
    ['Cl', 'c', '1', 'c', 'c', '[nH]', 'c', '1', 'C', '%10', 'Br']
    """
    if not isinstance(smiles, str):
        raise TypeError(f"Expected a SMILES string, got {type(smiles).__name__}.")
    tokens = _TOKEN_PATTERN.findall(smiles)
    if "[" in tokens:
        raise ValueError(
            f"The SMILES {smiles!r} has an unclosed '[' bracket atom; fix or drop this string."
        )
    return tokens


class Vocabulary:
    """Bidirectional map between SMILES tokens and integer ids.

    Index 0 is the stop/padding token ``$`` and index 1 the start token ``^``; the other tokens follow
    in the order given (sorted when built by :meth:`from_smiles`).

    Parameters
    ----------
    tokens : sequence of str
        The ordinary tokens (without ``$`` and ``^``), in id order starting at 2.

    Attributes
    ----------
    tokens : list of str
        All tokens in id order, ``tokens[0] == "$"`` and ``tokens[1] == "^"``.
    start_id : int
        Id of the start token (1).
    stop_id : int
        Id of the stop/padding token (0).

    Examples
    --------
    >>> vocab = Vocabulary.from_smiles(["CCO", "c1ccccc1Cl"])
    >>> vocab.tokens
    ['$', '^', '1', 'C', 'Cl', 'O', 'c']
    >>> vocab.encode("CCO")
    [1, 3, 3, 5, 0]
    >>> vocab.decode([1, 3, 3, 5, 0])
    'CCO'
    """

    def __init__(self, tokens: Sequence[str]) -> None:
        tokens = list(tokens)
        for special in (STOP_TOKEN, START_TOKEN):
            if special in tokens:
                raise ValueError(
                    f"The special token {special!r} is added by Vocabulary itself; "
                    "pass only the ordinary SMILES tokens."
                )
        if len(set(tokens)) != len(tokens):
            raise ValueError("The tokens given to Vocabulary contain duplicates.")
        self.tokens = [STOP_TOKEN, START_TOKEN] + tokens
        self._index = {tok: i for i, tok in enumerate(self.tokens)}
        self.stop_id = 0
        self.start_id = 1

    @classmethod
    def from_smiles(cls, smiles: Iterable[str]) -> "Vocabulary":
        """Build the vocabulary of every token found in a corpus.

        Parameters
        ----------
        smiles : iterable of str
            The SMILES corpus.

        Returns
        -------
        Vocabulary
            ``$``, ``^``, then the corpus tokens in sorted order.
        """
        found: set[str] = set()
        for s in smiles:
            found.update(tokenize(s))
        return cls(sorted(found))

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.tokens == other.tokens

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens)"

    def token_to_id(self, token: str) -> int:
        """Id of one token; raises ``KeyError`` naming the token when it is not in the vocabulary."""
        try:
            return self._index[token]
        except KeyError:
            raise KeyError(
                f"Token {token!r} is not in this {len(self)}-token vocabulary; build the vocabulary "
                "from a corpus that contains it (Vocabulary.from_smiles) or drop the SMILES."
            ) from None

    def encode(self, smiles: str, add_special: bool = True) -> list[int]:
        """Token ids of one SMILES string.

        Parameters
        ----------
        smiles : str
            A SMILES string.
        add_special : bool, default=True
            Frame the ids with the start id (first) and the stop id (last).

        Returns
        -------
        list of int
        """
        ids = [self.token_to_id(t) for t in tokenize(smiles)]
        if add_special:
            ids = [self.start_id] + ids + [self.stop_id]
        return ids

    def decode(self, ids: Iterable[int], strict: bool = True) -> str:
        """SMILES string of a sequence of ids.

        A leading start id is skipped and decoding ends at the first stop id, so both a framed
        sequence from :meth:`encode` and a padded row of :func:`encode_batch` decode to the SMILES.

        Parameters
        ----------
        ids : iterable of int
            Token ids (a list, or a 1-D tensor/array).
        strict : bool, default=True
            Raise ``ValueError`` on a start id after the first position. With ``strict=False`` it is
            written as ``^`` (a sampler may emit it; the string is then not a valid SMILES).

        Returns
        -------
        str
        """
        ids = [int(i) for i in ids]
        if ids and ids[0] == self.start_id:
            ids = ids[1:]
        out = []
        for i in ids:
            if i == self.stop_id:
                break
            if not 0 <= i < len(self.tokens) or (strict and i == self.start_id):
                raise ValueError(
                    f"Id {i} cannot appear inside a SMILES (vocabulary of {len(self)} tokens, "
                    f"start id {self.start_id})."
                )
            out.append(self.tokens[i])
        return "".join(out)

    def to_json(self) -> str:
        """JSON text of the vocabulary (the full token list in id order)."""
        return json.dumps({"tokens": self.tokens})

    @classmethod
    def from_json(cls, text: str) -> "Vocabulary":
        """Vocabulary from the JSON text written by :meth:`to_json`."""
        tokens = json.loads(text)["tokens"]
        if tokens[:2] != [STOP_TOKEN, START_TOKEN]:
            raise ValueError(
                f"Expected the token list to start with {STOP_TOKEN!r}, {START_TOKEN!r}; "
                f"got {tokens[:2]!r}."
            )
        return cls(tokens[2:])

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        """Read a vocabulary written by :meth:`save`."""
        with open(path, encoding="utf-8") as fh:
            return cls.from_json(fh.read())


def encode_batch(
    smiles_list: Sequence[str], vocab: Vocabulary
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded token tensor and target mask of a batch of SMILES, for teacher forcing.

    Parameters
    ----------
    smiles_list : sequence of str
        ``n`` SMILES strings.
    vocab : Vocabulary

    Returns
    -------
    tokens : torch.LongTensor of shape (n, T)
        Row ``i`` is ``[start, t_1, ..., t_L, stop, pad, ...]`` with pad = the stop id;
        ``T = max_i L_i + 2``.
    mask : torch.BoolTensor of shape (n, T - 1)
        ``mask[i, t]`` is True where ``tokens[i, t + 1]`` is a real target: the ``L_i`` SMILES tokens
        and the stop token. Use ``inputs = tokens[:, :-1]``, ``targets = tokens[:, 1:]``.

    Examples
    --------
    >>> vocab = Vocabulary.from_smiles(["CCO", "C"])
    >>> tokens, mask = encode_batch(["CCO", "C"], vocab)
    >>> tokens.tolist()
    [[1, 2, 2, 3, 0], [1, 2, 0, 0, 0]]
    >>> mask.tolist()
    [[True, True, True, True], [True, True, False, False]]
    """
    if isinstance(smiles_list, str):
        raise TypeError("Expected a sequence of SMILES strings, got a single string.")
    if len(smiles_list) == 0:
        raise ValueError("encode_batch needs at least one SMILES string.")
    encoded = [vocab.encode(s) for s in smiles_list]
    lengths = torch.tensor([len(e) for e in encoded])
    T = int(lengths.max())
    tokens = torch.full((len(encoded), T), vocab.stop_id, dtype=torch.long)
    for i, e in enumerate(encoded):
        tokens[i, : len(e)] = torch.tensor(e, dtype=torch.long)
    # A framed sequence of length L + 2 has L + 1 targets (the tokens and the stop token).
    mask = torch.arange(T - 1)[None, :] < (lengths - 1)[:, None]
    return tokens, mask


def load_smiles(path: str | os.PathLike) -> list[str]:
    """Read a ``.smi`` file: one SMILES per line (first whitespace-separated field), blanks skipped.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    list of str
    """
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if fields:
                out.append(fields[0])
    return out
