"""benchmarks/_common.py: the UCI loader, the MLP factory, the Adam loop, the results writer, markdown helpers.

The module is loaded from its file (``benchmarks/`` is not a package: its scripts import it as ``_common``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def _load_common():
    """The module as the scripts see it (``import _common``), registered under that name (dataclasses need it)."""
    if "_common" in sys.modules:
        return sys.modules["_common"]
    spec = importlib.util.spec_from_file_location("_common", ROOT / "benchmarks" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_common"] = module
    spec.loader.exec_module(module)
    return module


common = _load_common()


# ------------------------------------------------------------------------------------------------ UCI loader
def _write_uci(folder: Path, data: np.ndarray, features, target: int, splits: list[tuple[list, list]]):
    folder.mkdir(parents=True)
    np.savetxt(folder / "data.txt", data)
    np.savetxt(folder / "index_features.txt", np.asarray(features), fmt="%d")
    np.savetxt(folder / "index_target.txt", np.asarray([target]), fmt="%d")
    for k, (train, test) in enumerate(splits):
        np.savetxt(folder / f"index_train_{k}.txt", np.asarray(train), fmt="%d")
        np.savetxt(folder / f"index_test_{k}.txt", np.asarray(test), fmt="%d")


def test_load_uci_reads_columns_and_splits(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((7, 4))
    _write_uci(tmp_path / "toy", data, [0, 2, 3], 1, [([0, 1, 2, 3, 4], [5, 6]), ([2, 3, 4, 5, 6], [0, 1])])
    X, y = common.load_uci(tmp_path / "toy")
    np.testing.assert_allclose(X, data[:, [0, 2, 3]], rtol=1e-15)  # savetxt's 18 significant digits round-trip
    np.testing.assert_allclose(y, data[:, 1], rtol=1e-15)
    X1, y1, train, test = common.load_uci(str(tmp_path / "toy"), split=1)
    np.testing.assert_array_equal(train, [2, 3, 4, 5, 6])
    np.testing.assert_array_equal(test, [0, 1])
    np.testing.assert_array_equal(X1, X)


def test_load_uci_single_feature_and_single_test_row(tmp_path):
    data = np.arange(12.0).reshape(4, 3)
    _write_uci(tmp_path / "one", data, [2], 0, [([0, 1, 2], [3])])
    X, y, train, test = common.load_uci(tmp_path / "one", 0)
    assert X.shape == (4, 1) and test.shape == (1,)
    np.testing.assert_array_equal(X[:, 0], data[:, 2])
    np.testing.assert_array_equal(y, data[:, 0])


def test_load_uci_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="No data.txt"):
        common.load_uci(tmp_path)
    _write_uci(tmp_path / "toy", np.ones((3, 2)), [0], 1, [([0, 1], [2])])
    with pytest.raises(ValueError, match=r"split=4 does not exist .* it has 1 splits \(0..0\)"):
        common.load_uci(tmp_path / "toy", 4)


def test_load_uci_on_the_shared_concrete_folder():
    folder = common.data_dir("uci") / "concrete"
    if not (folder / "data.txt").is_file():
        pytest.skip(f"the shared UCI data is not at {folder}")
    X, y, train, test = common.load_uci(folder, 0)
    assert X.shape == (1030, 8) and y.shape == (1030,)
    assert len(set(train) & set(test)) == 0 and len(train) + len(test) == 1030
    assert len(list(folder.glob("index_train_*.txt"))) == 20


def test_data_dir_default_and_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(common.DATA_ENV, raising=False)
    assert common.data_dir("uci") == ROOT.parent / "shared" / "data" / "uci"
    monkeypatch.setenv(common.DATA_ENV, str(tmp_path))
    assert common.data_dir() == tmp_path and common.data_dir("smiles") == tmp_path / "smiles"


# ---------------------------------------------------------------------------------------------- networks
def test_mlp_layout_and_weight_count():
    net = common.mlp(1, (50, 50))
    kinds = [type(m) for m in net]
    assert kinds == [nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]
    assert common.n_weights(net) == (1 * 50 + 50) + (50 * 50 + 50) + (50 + 1) == 2701  # the paper's D
    relu = common.mlp(3, (4,), n_out=2, activation=nn.ReLU)
    assert isinstance(relu[1], nn.ReLU) and relu[2].out_features == 2


def test_mlp_seed_fixes_the_weights():
    # the same construction replayed with the same seed: bitwise equal weights
    a, b, c = common.mlp(8, (16,), seed=3), common.mlp(8, (16,), seed=3), common.mlp(8, (16,), seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a[0].weight, c[0].weight)


# ---------------------------------------------------------------------------------------------- training
def _linear_problem(n=40, p=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, p, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64) + 0.3 + 0.1 * torch.randn(
        n, 1, generator=g, dtype=torch.float64)
    return X, y


def test_full_batch_adam_reaches_the_least_squares_solution():
    X, y = _linear_problem()
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    fit = common.train_adam(model, X, y, steps=4000, lr=0.05)
    A = np.hstack([X.numpy(), np.ones((len(X), 1))])
    coef, *_ = np.linalg.lstsq(A, y.numpy(), rcond=None)
    got = np.concatenate([model.weight.detach().numpy().ravel(), model.bias.detach().numpy()])
    np.testing.assert_allclose(got, coef.ravel(), atol=1e-6)
    assert fit.steps == 4000 and not model.training
    assert all(p.grad is None for p in model.parameters())


def test_stop_below_stops_at_the_first_step_under_the_threshold():
    X, y = _linear_problem()
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    threshold = 0.05
    fit = common.train_adam(model, X, y, steps=5000, lr=0.01, stop_below=threshold, record_every=1)
    assert 0 < fit.steps < 5000
    losses = [loss for _, loss in fit.history]
    assert [s for s, _ in fit.history] == list(range(1, fit.steps + 1))
    assert all(loss > threshold for loss in losses)  # never under it before the stop
    assert fit.last_loss <= threshold
    with torch.no_grad():  # the returned weights are those whose loss triggered the stop
        assert float(((model(X) - y) ** 2).mean()) == pytest.approx(fit.last_loss, rel=1e-12)


def test_snapshots_equal_shorter_runs():
    X, y = _linear_problem()
    torch.manual_seed(1)
    model = nn.Linear(3, 1).double()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    fit = common.train_adam(model, X, y, steps=30, lr=0.01, snapshot_steps={10, 20})
    assert sorted(fit.snapshots) == [10, 20]
    short = nn.Linear(3, 1).double()
    short.load_state_dict(init)
    common.train_adam(short, X, y, steps=10, lr=0.01)
    # the same first 10 steps replayed from the same initial weights: bitwise equal
    assert all(torch.equal(p, q) for p, q in zip(short.parameters(), fit.snapshots[10].parameters(), strict=True))
    assert not torch.equal(fit.snapshots[20].weight, fit.snapshots[10].weight)


class _Recorder(nn.Module):
    """A linear model that records which rows (first input column holds the row number) each step saw."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1).double()
        self.seen = []

    def forward(self, x):
        self.seen.append(x[..., 0].long().tolist())
        return self.lin(x)


def test_mini_batches_cover_every_row_once_per_epoch():
    n, bs, epochs = 10, 4, 3
    X = torch.stack([torch.arange(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)], 1)
    y = torch.zeros(n, 1, dtype=torch.float64)
    model = _Recorder()
    fit = common.train_adam(model, X, y, epochs=epochs, batch_size=bs, seed=5)
    assert fit.steps == epochs * math.ceil(n / bs) == len(model.seen)
    sizes = [len(b) for b in model.seen]
    assert sizes == [4, 4, 2] * epochs
    for e in range(epochs):
        rows = sum(model.seen[3 * e:3 * e + 3], [])
        assert sorted(rows) == list(range(n))
    assert model.seen[:3] != model.seen[3:6]  # reshuffled each epoch


class _BatchedLinear(nn.Module):
    """E linear models y = x W_e + b_e evaluated together on inputs (E, b, p)."""

    def __init__(self, W, b):
        super().__init__()
        self.W, self.b = nn.Parameter(W.clone()), nn.Parameter(b.clone())

    def forward(self, x):
        return torch.baddbmm(self.b, x, self.W)


def test_batched_members_train_as_independent_networks():
    """members=E: each member's trajectory is that of the same network trained alone on its own batch order."""
    X, y = _linear_problem(n=23)
    E, bs, epochs, seed, lr = 3, 5, 4, 11, 0.01
    g = torch.Generator().manual_seed(0)
    W, b = torch.randn(E, 3, 1, generator=g, dtype=torch.float64), torch.randn(E, 1, 1, generator=g,
                                                                                  dtype=torch.float64)
    ens = _BatchedLinear(W, b)

    def members_loss(pred, target):
        return ((pred - target) ** 2).mean(dim=(1, 2)).sum()

    common.train_adam(ens, X, y, epochs=epochs, batch_size=bs, members=E, seed=seed, lr=lr, loss=members_loss)
    # the reference: a plain Adam loop per member, on the permutations the ensemble drew (E per epoch, in order)
    gen = torch.Generator().manual_seed(seed)
    perms = [[torch.randperm(len(X), generator=gen) for _ in range(E)] for _ in range(epochs)]
    for e in range(E):
        w, c = W[e].clone().requires_grad_(True), b[e, 0].clone().requires_grad_(True)
        opt = torch.optim.Adam([w, c], lr=lr)
        for epoch in range(epochs):
            for i in range(0, len(X), bs):
                idx = perms[epoch][e][i:i + bs]
                opt.zero_grad()
                (((X[idx] @ w + c) - y[idx]) ** 2).mean().backward()
                opt.step()
        # float64, a few dozen steps: batched (baddbmm) and plain products differ by rounding only
        torch.testing.assert_close(ens.W[e].detach(), w.detach(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(ens.b[e, 0].detach(), c.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs", [{}, {"steps": 3, "epochs": 2, "batch_size": 4}, {"epochs": 2},
                                    {"steps": 3, "batch_size": 4},
                                    {"epochs": 2, "batch_size": 4, "stop_below": 0.1}])
def test_train_adam_rejects_unclear_budgets(kwargs):
    X, y = _linear_problem()
    with pytest.raises(ValueError, match="train_adam"):
        common.train_adam(nn.Linear(3, 1).double(), X, y, **kwargs)


# ------------------------------------------------------------------------------------------- results files
def test_write_results_adds_command_and_machine(tmp_path):
    path = tmp_path / "sub" / "r.json"
    payload = common.write_results(path, {"a": np.float32(0.5), "v": np.arange(3), "t": torch.tensor([1.5, 2.0]),
                                          "s": torch.tensor(3), "nan": float("nan"), "p": Path("x/y")},
                                   command="python benchmarks/x.py --quick", device="cpu")
    back = json.loads(path.read_text())
    assert list(back)[:2] == ["command", "machine"]
    assert back["command"] == "python benchmarks/x.py --quick"
    assert back["machine"]["threads"] == torch.get_num_threads() and back["machine"]["torch"] == torch.__version__
    assert back["a"] == 0.5 and back["v"] == [0, 1, 2] and back["t"] == [1.5, 2.0] and back["s"] == 3
    assert math.isnan(back["nan"]) and back["p"] == "x/y"
    assert payload["machine"] == back["machine"]
    assert common.read_results(path)["v"] == [0, 1, 2]
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        common.write_results(tmp_path / "bad.json", {"o": object()}, command="x")


def test_machine_line_names_what_is_known():
    info = {"machine": "x86_64", "cpu_count": 2, "threads": 1, "torch": "2.13.0+cpu", "device": "cpu"}
    assert common.machine_line(info) == "x86_64, 2 CPU cores, 1 torch thread(s), torch 2.13.0+cpu, device cpu"
    assert common.machine_line({"machine": "x86_64", "threads": 4}) == "x86_64, 4 torch thread(s)"


def test_command_line_and_repo_path():
    assert common.command_line("/any/where/uci.py", ["--quick", "--splits", "2"]) == \
        "python benchmarks/uci.py --quick --splits 2"
    # an argument with spaces and quotes (a JSON option) is quoted: the line splits back into the same arguments
    argv = ["--default-params", '{"n_networks": 2, "activation": "relu"}', "--tag", "x"]
    line = common.command_line("regional_coverage.py", argv)
    assert shlex.split(line) == ["python", "benchmarks/regional_coverage.py", *argv]
    assert common.repo_path(ROOT / "benchmarks" / "models" / "m.pt") == str(Path("benchmarks/models/m.pt"))
    assert common.repo_path("/elsewhere/m.pt") == "/elsewhere/m.pt"


def test_write_report_keeps_the_hand_written_discussion(tmp_path):
    path = tmp_path / "r.md"
    common.write_report(path, "# v1\n")
    assert path.read_text() == "# v1\n"
    path.write_text("# v1\n" + common.DISCUSSION_MARK + "\nwritten by hand\n")
    common.write_report(path, "# v2\n" + common.DISCUSSION_MARK + "\n")
    assert path.read_text() == "# v2\n" + common.DISCUSSION_MARK + "\nwritten by hand\n"


def test_markdown_table():
    lines = common.markdown_table(["a", "b", "c"], [[1, "x", 2.5], ["–", "y", 3]], align="lr")
    assert lines == ["| a | b | c |", "|---|---:|---|", "| 1 | x | 2.5 |", "| – | y | 3 |"]


def test_output_paths_keep_quick_runs_apart(tmp_path):
    import argparse
    full = common.output_paths(argparse.Namespace(out_dir=tmp_path, quick=False), "student_t")
    quick = common.output_paths(argparse.Namespace(out_dir=tmp_path, quick=True), "student_t")
    assert full == (tmp_path / "student_t.json", tmp_path / "student_t.md")
    assert quick == (tmp_path / "student_t_quick.json", tmp_path / "student_t_quick.md")
