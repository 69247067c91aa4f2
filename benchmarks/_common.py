"""What the benchmark scripts share: data folders, the MLP factory, one Adam training loop, machine info, the
results writer and markdown helpers.

A script in ``benchmarks/`` imports it as ``import _common`` (running ``python benchmarks/x.py`` puts
``benchmarks/`` on ``sys.path``). Each script computes, writes its results as JSON through
:func:`write_results` (with the command line and the machine it ran on), and renders its markdown report from
that JSON alone, so that ``--report-only`` re-creates the report from the committed JSON.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
#: Environment variable naming the folder that holds the shared data sets (``uci/``, ``smiles/``).
DATA_ENV = "GLAS_DATA_DIR"
#: Text after this line of a report is written by hand; :func:`write_report` keeps it when it rewrites the file.
DISCUSSION_MARK = "<!-- discussion -->"


# ------------------------------------------------------------------------------------------------------- data
def data_dir(name: str = "") -> Path:
    """The shared data folder ``$GLAS_DATA_DIR/name``, by default ``<repo>/../shared/data/name``."""
    root = os.environ.get(DATA_ENV)
    base = Path(root) if root else REPO.parent / "shared" / "data"
    return base / name if name else base


def load_uci(path: str | Path, split: int | None = None):
    """A UCI regression set in the standard split format (``data.txt``, ``index_*.txt``).

    Parameters
    ----------
    path : str or Path
        The data set's folder (e.g. ``data_dir("uci") / "concrete"``).
    split : int, optional
        When given, also return the train and test row indices of that standard split.

    Returns
    -------
    X : ndarray of shape (n, p)
    y : ndarray of shape (n,)
    train, test : ndarray of int
        Only with ``split``.
    """
    path = Path(path)
    if not (path / "data.txt").is_file():
        raise FileNotFoundError(f"No data.txt in {path}; expected a UCI folder with data.txt and index_*.txt.")
    data = np.loadtxt(path / "data.txt")
    features = np.atleast_1d(np.loadtxt(path / "index_features.txt", dtype=int))
    target = int(np.loadtxt(path / "index_target.txt", dtype=int))
    X, y = data[:, features], data[:, target]
    if split is None:
        return X, y
    train_file, test_file = path / f"index_train_{split}.txt", path / f"index_test_{split}.txt"
    if not train_file.is_file():
        n = len(list(path.glob("index_train_*.txt")))
        raise ValueError(f"split={split} does not exist in {path}: it has {n} splits (0..{n - 1}).")
    train = np.atleast_1d(np.loadtxt(train_file, dtype=int))
    test = np.atleast_1d(np.loadtxt(test_file, dtype=int))
    return X, y, train, test


# ------------------------------------------------------------------------------------------------- networks
def mlp(n_in: int, hidden: Sequence[int], n_out: int = 1, *, activation: type[nn.Module] = nn.Tanh,
        seed: int | None = None) -> nn.Sequential:
    """``Linear(n_in, h1), act, ..., Linear(h_last, n_out)`` with PyTorch's default initialisation.

    With ``seed``, the global torch RNG is seeded first (``torch.manual_seed(seed)``), so that the weights are a
    function of the seed.
    """
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [nn.Linear(width, h), activation()]
        width = h
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


def n_weights(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------- training
def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error."""
    return ((pred - target) ** 2).mean()


def half_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Half the mean squared error (the Gaussian negative log-likelihood up to constants, σ = 1)."""
    return 0.5 * ((pred - target) ** 2).mean()


@dataclass
class Training:
    """What :func:`train_adam` did: the Adam steps taken, the recorded ``(step, loss)`` pairs, the loss of the
    last step (of the weights before its update), and the copies kept at ``snapshot_steps``."""

    steps: int
    history: list[tuple[int, float]] = field(default_factory=list)
    last_loss: float = float("nan")
    snapshots: dict[int, nn.Module] = field(default_factory=dict)


def train_adam(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, lr: float = 1e-3, steps: int | None = None,
               epochs: int | None = None, batch_size: int | None = None, members: int | None = None,
               seed: int = 0, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = mse,
               stop_below: float | None = None, record_every: int = 0, snapshot_steps: Iterable[int] = (),
               log: Callable[[str], None] | None = None, log_every: int = 0) -> Training:
    """Train ``model`` in place with Adam on ``loss(model(X_batch), y_batch)``; the model ends in eval mode.

    Full batch (``batch_size=None``): ``steps`` steps on all of ``(X, y)``. Mini-batches: ``epochs`` passes over
    the rows, shuffled by a ``torch.Generator`` seeded with ``seed``, in batches of ``batch_size`` (the last one
    smaller). ``members=E`` trains a batched ensemble whose forward maps inputs of shape (E, b, p) to (E, b, k):
    each member gets its own permutation of the rows every epoch, and ``loss`` should sum the members' losses.

    ``stop_below``: stop at the first step whose loss (of the weights before that step's update) is at most this
    value (full batch only). ``record_every=k``: record ``(step, loss)`` after every k-th step.
    ``snapshot_steps``: keep an eval-mode deep copy of the model after these steps. ``log(text)`` is called every
    ``log_every`` steps.
    """
    full_batch = batch_size is None
    if full_batch == (steps is None) or full_batch == (epochs is not None):
        raise ValueError("train_adam: give steps (full batch) or epochs and batch_size (mini-batches).")
    if stop_below is not None and not full_batch:
        raise ValueError("train_adam: stop_below needs full-batch training.")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    snapshot_steps = set(snapshot_steps)
    out = Training(steps=0)
    n = X.shape[0]
    g = torch.Generator().manual_seed(seed)

    def batches():
        if full_batch:
            for _ in range(steps):
                yield None
            return
        for _ in range(epochs):
            if members is None:
                perm = torch.randperm(n, generator=g)
            else:
                perm = torch.stack([torch.randperm(n, generator=g) for _ in range(members)])  # (E, n)
            for i in range(0, n, batch_size):
                yield perm[..., i:i + batch_size]

    total = steps if full_batch else epochs * -(-n // batch_size)
    model.train()
    for idx in batches():
        opt.zero_grad(set_to_none=True)
        value = loss(model(X), y) if idx is None else loss(model(X[idx]), y[idx])
        out.last_loss = float(value.detach())
        if stop_below is not None and out.last_loss <= stop_below:
            break
        value.backward()
        opt.step()
        out.steps += 1
        if record_every and out.steps % record_every == 0:
            out.history.append((out.steps, out.last_loss))
        if out.steps in snapshot_steps:
            out.snapshots[out.steps] = copy.deepcopy(model).eval()
        if log is not None and log_every and out.steps % log_every == 0:
            log(f"  step {out.steps}/{total}: loss {out.last_loss:.5f}")
    model.eval()
    for p in model.parameters():
        p.grad = None
    return out


def train_or_load(net: nn.Module, X: torch.Tensor, y: torch.Tensor, *, steps: int, cache: Path | None,
                  time_key: str = "train_s", map_location: str | torch.device | None = None,
                  announce: str | None = None) -> tuple[float, bool]:
    """Train ``net`` by full-batch Adam on the half MSE (lr 1e-3), or load the weights a previous run cached.

    Parameters
    ----------
    net : nn.Module
        The freshly built network; its weights are replaced in place (loaded or trained), then it is put in
        eval mode.
    X, y : torch.Tensor
        The training inputs and targets (``y`` of shape (n, 1)).
    steps : int
        Adam steps when training.
    cache : Path or None
        File of ``{"state": state_dict, time_key: seconds}``: loaded when it exists, written after training
        otherwise; None trains without caching.
    time_key : str, default="train_s"
        The key of the training time in the cache file (the scripts' existing caches use their own).
    map_location : str or torch.device, optional
        Passed to ``torch.load``.
    announce : str, optional
        Printed (flushed) before training; nothing is printed when the weights are loaded.

    Returns
    -------
    train_seconds : float
        The time training took, here or in the run that wrote the cache.
    loaded : bool
        Whether the weights came from ``cache``.
    """
    if cache is not None and cache.exists():
        saved = torch.load(cache, map_location=map_location)
        net.load_state_dict(saved["state"])
        net.eval()
        return saved[time_key], True
    if announce is not None:
        print(announce, flush=True)
    t0 = time.perf_counter()
    train_adam(net, X, y, steps=steps, lr=1e-3, loss=half_mse)
    train_s = time.perf_counter() - t0
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state": net.state_dict(), time_key: train_s}, cache)
    return train_s, False


# -------------------------------------------------------------------------------------------- command line
def ece(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error over equal-width bins ``(lo, hi]`` of the top probability (class scores).

    Shared by the classification benchmarks (digits_ood, hf_lora).
    """
    conf, pred = probs.max(1), probs.argmax(1)
    edges = np.linspace(0.0, 1.0, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            total += m.mean() * abs((pred[m] == labels[m]).mean() - conf[m].mean())
    return float(total)


def add_common_arguments(parser: argparse.ArgumentParser, *, threads: int | None = 1,
                         quick: str = "a small smoke run") -> argparse.ArgumentParser:
    """``--threads``, ``--quick``, ``--out-dir`` and ``--report-only``, the options every script has."""
    parser.add_argument("--threads", type=int, default=threads, help=f"torch threads (default {threads})")
    parser.add_argument("--quick", action="store_true", help=quick + "; writes *_quick outputs")
    parser.add_argument("--out-dir", type=Path, default=RESULTS,
                        help="folder of the JSON, report and figures (default benchmarks/results)")
    parser.add_argument("--report-only", action="store_true",
                        help="no computation: re-render the report (and figures) from the JSON in --out-dir")
    return parser


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """``python benchmarks/<script> <arguments>`` as the user typed them (``sys.argv`` when argv is None)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python", f"benchmarks/{Path(script).name}", *args])


# ----------------------------------------------------------------------------------------------- results
def new_results(args: argparse.Namespace) -> dict:
    """The head of a results dict: the run's date and its options (``vars(args)``, non-JSON values as strings)."""
    return {"date": _dt.datetime.now().isoformat(timespec="seconds"),
            "config": {k: str(v) if not isinstance(v, (int, float, bool, type(None))) else v
                       for k, v in vars(args).items()}}


def machine_info(device: str | torch.device = "cpu") -> dict:
    """Where a run happened: CPU, cores, torch threads and version, device, Python."""
    return {"machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device),
            "python": platform.python_version()}


def machine_line(info: dict) -> str:
    """One line for a report, e.g. ``x86_64, 2 CPU cores, 1 torch thread(s), torch 2.13.0+cpu, device cpu``
    (the fields a results file lacks are left out)."""
    parts = [info.get("machine")]
    if info.get("cpu_count"):
        parts.append(f"{info['cpu_count']} CPU cores")
    if info.get("threads"):
        parts.append(f"{info['threads']} torch thread(s)")
    if info.get("torch"):
        parts.append(f"torch {info['torch']}")
    if info.get("device"):
        parts.append(f"device {info['device']}")
    return ", ".join(p for p in parts if p)


def _to_json(obj):
    if isinstance(obj, (np.generic, torch.Tensor)) and getattr(obj, "ndim", 0) == 0:
        return obj.item()
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def write_results(path: str | Path, results: dict, *, command: str, device: str | torch.device = "cpu") -> dict:
    """Write ``{"command": ..., "machine": machine_info(device), **results}`` as JSON to ``path``; return it.

    numpy / torch scalars and arrays and paths are converted; NaN is kept (as JSON's ``NaN``).
    """
    payload = {"command": command, "machine": machine_info(device), **results}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=_to_json) + "\n")
    return payload


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures are written to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def repo_path(path: str | Path) -> str:
    """``path`` relative to the repository when it lies inside it (for results files that travel), else as given."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def read_results(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def write_report(path: str | Path, text: str) -> None:
    """Write a markdown report; a hand-written section after :data:`DISCUSSION_MARK` in the existing file is kept."""
    path = Path(path)
    if path.exists() and DISCUSSION_MARK in (old := path.read_text()):
        text = text.split(DISCUSSION_MARK, 1)[0] + DISCUSSION_MARK + old.split(DISCUSSION_MARK, 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_results_and_report(json_path: str | Path, md_path: str | Path, results: dict,
                             render: Callable[[dict], str], *, command: str,
                             device: str | torch.device = "cpu") -> tuple[dict, str]:
    """Write the results JSON (:func:`write_results`), render the report from what was written, write it.

    Parameters
    ----------
    json_path, md_path : str or Path
        The results file and the markdown report.
    results : dict
        What the run measured.
    render : callable
        The script's renderer: the written payload → markdown text.
    command, device
        As for :func:`write_results`.

    Returns
    -------
    payload : dict
        What was written to ``json_path``.
    text : str
        The rendered report (the hand-written discussion of an existing report is kept in the file only).
    """
    payload = write_results(json_path, results, command=command, device=device)
    text = render(payload)
    write_report(md_path, text)
    return payload, text


def report_from_results(json_path: str | Path, md_path: str | Path,
                        render: Callable[[dict], str]) -> tuple[dict, str]:
    """``--report-only``: read the results JSON, render the report from it and write it.

    Parameters
    ----------
    json_path, md_path : str or Path
        The results file and the markdown report.
    render : callable
        The script's renderer: the payload → markdown text.

    Returns
    -------
    payload : dict
        What ``json_path`` holds.
    text : str
        The rendered report.
    """
    payload = read_results(json_path)
    text = render(payload)
    write_report(md_path, text)
    return payload, text


def markdown_table(header: Sequence[str], rows: Iterable[Sequence], align: str = "") -> list[str]:
    """Lines of a markdown table; ``align`` has one letter per column, ``l`` (default) or ``r``."""
    align = align.ljust(len(header), "l")
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines
