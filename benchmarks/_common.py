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
import math
import os
import platform
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
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



class BatchedMLP(nn.Module):
    """E independent tanh MLPs ``n_in → hidden → n_out`` evaluated together: member e sees its own inputs x[e].

    ``hidden`` is one width (one hidden layer) or a sequence of widths. The weights are drawn as
    ``torch.nn.Linear``'s default initialisation, layer by layer (W then b), from a generator seeded with ``seed``.
    """

    def __init__(self, n_members: int, n_in: int, hidden: int | Sequence[int], seed: int, n_out: int = 1):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.widths = [n_in, *((hidden,) if isinstance(hidden, int) else tuple(hidden)), n_out]

        def uniform(shape, fan_in):  # torch.nn.Linear's default initialisation
            bound = 1.0 / math.sqrt(fan_in)
            return nn.Parameter((torch.rand(shape, generator=g) * 2 - 1) * bound)

        for i, (a, b) in enumerate(zip(self.widths[:-1], self.widths[1:], strict=True), start=1):
            setattr(self, f"W{i}", uniform((n_members, a, b), a))
            setattr(self, f"b{i}", uniform((n_members, 1, b), a))

    def forward(self, x):  # x: (E, n, p) -> (E, n, n_out)
        n_layers = len(self.widths) - 1
        for i in range(1, n_layers + 1):
            x = torch.baddbmm(getattr(self, f"b{i}"), x, getattr(self, f"W{i}"))
            if i < n_layers:
                x = torch.tanh(x)
        return x

    def member(self, e: int) -> nn.Sequential:
        """Member e as a plain ``nn.Sequential`` (:func:`mlp`), in eval mode."""
        net = mlp(self.widths[0], self.widths[1:-1], self.widths[-1])
        linears = [m for m in net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for i, lin in enumerate(linears, start=1):
                lin.weight.copy_(getattr(self, f"W{i}")[e].T)
                lin.bias.copy_(getattr(self, f"b{i}")[e, 0])
        return net.eval()


def members_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The sum of the members' mean squared errors (pred, target: (E, b, 1))."""
    return ((pred - target) ** 2).mean(dim=(1, 2)).sum()


def het_members_loss(likelihood):
    """The sum of the members' mean (β-)NLL of a ``HeteroscedasticGaussian`` likelihood (outputs (E, b, 2):
    mean and log-variance)."""
    def loss(pred, target):
        terms = likelihood.nll_terms(pred, target)
        if likelihood.beta_nll > 0:
            terms = terms * likelihood.noise_variance(pred).detach() ** likelihood.beta_nll
        return terms.mean(dim=(1, 2)).sum()
    return loss


def pinball_loss(quantiles: Sequence[float]):
    """The members' summed mean pinball loss of outputs (E, b, len(quantiles)), one column per quantile (the mean
    over the columns times their number: each quantile's loss at full weight)."""
    def loss(pred, target):
        q = torch.tensor(quantiles, dtype=pred.dtype)
        r = target - pred
        return torch.maximum(q * r, (q - 1) * r).mean(dim=(1, 2)).sum() * len(quantiles)
    return loss


class InOriginalUnits(nn.Module):
    """A network trained on standardised data, seen in the original units: x ↦ net((x − mx)/sx)·sy + my.
    The standardisation is held in buffers, so the weights (and D) are those of ``net``."""

    def __init__(self, net: nn.Module, mx, sx, my: float, sy: float):
        super().__init__()
        self.net = net
        self.register_buffer("mx", torch.as_tensor(mx, dtype=torch.float32))
        self.register_buffer("sx", torch.as_tensor(sx, dtype=torch.float32))
        self.register_buffer("my", torch.tensor(float(my), dtype=torch.float32))
        self.register_buffer("sy", torch.tensor(float(sy), dtype=torch.float32))

    def forward(self, x):
        return self.net((x - self.mx) / self.sx) * self.sy + self.my


class HetInOriginalUnits(nn.Module):
    """A mean/log-variance network trained on standardised data, in the original units: μ·sy + my, s + 2 log sy."""

    def __init__(self, net, mx, sx, my, sy):
        super().__init__()
        self.net = net
        self.register_buffer("mx", torch.as_tensor(mx, dtype=torch.float32))
        self.register_buffer("sx", torch.as_tensor(sx, dtype=torch.float32))
        self.register_buffer("shift", torch.tensor([float(my), 2 * math.log(sy)], dtype=torch.float32))
        self.register_buffer("scale", torch.tensor([float(sy), 1.0], dtype=torch.float32))

    def forward(self, x):
        return self.net((x - self.mx) / self.sx) * self.scale + self.shift


def predict_module(module: nn.Module, X: np.ndarray) -> np.ndarray:
    """Output 0 of a float32 torch module on numpy rows, as float64 numpy."""
    with torch.no_grad():
        return module(torch.as_tensor(X, dtype=torch.float32))[:, 0].double().numpy()


def het_outputs(net: nn.Module, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of a mean/log-variance network (:class:`HetInOriginalUnits`) on numpy rows."""
    with torch.no_grad():
        out = net(torch.as_tensor(X, dtype=torch.float32)).double().numpy()
    return out[:, 0], np.exp(np.clip(out[:, 1], -30, 30))


def mixture_moments(nets: Sequence[nn.Module], X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the equal mixture of the members' Gaussians N(μ_e, σ_e²) (a deep ensemble of
    mean/log-variance networks, Lakshminarayanan et al. 2017): mean of μ_e, mean of (σ_e² + μ_e²) − mean²."""
    outs = [het_outputs(n, X) for n in nets]
    mus = np.stack([m for m, _ in outs])
    mu = mus.mean(0)
    return mu, np.maximum(np.mean([v + m ** 2 for m, v in outs], axis=0) - mu ** 2, 1e-300)


class TorchPrefitRegressor(RegressorMixin, BaseEstimator):
    """The smallest scikit-learn regressor around an already-trained torch module (for MAPIE, prefit)."""

    def __init__(self, module=None):
        self.module = module

    def fit(self, X, y):  # never called with prefit=True
        raise NotImplementedError("TorchPrefitRegressor wraps an already trained network.")

    def predict(self, X):
        return predict_module(self.module, np.asarray(X, dtype=np.float64))

    def __sklearn_is_fitted__(self):
        return True


class OutputColumn(RegressorMixin, BaseEstimator):
    """One output column of a trained torch module in original units, as a fitted scikit-learn regressor."""

    def __init__(self, module=None, column=0, mx=None, sx=None, my=0.0, sy=1.0):
        self.module, self.column, self.mx, self.sx, self.my, self.sy = module, column, mx, sx, my, sy

    def fit(self, X, y):
        raise NotImplementedError("OutputColumn wraps an already trained network.")

    def predict(self, X):
        x = torch.as_tensor((np.asarray(X, dtype=np.float64) - self.mx) / self.sx, dtype=torch.float32)
        with torch.no_grad():
            return self.module(x)[:, self.column].double().numpy() * self.sy + self.my

    def __sklearn_is_fitted__(self):
        return True


# ------------------------------------------------------------------------------------------------- peers
def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def import_laplace_torch():
    """laplace-torch's ``Laplace``, or None. torchmetrics (which laplace-torch imports) imports torchvision whenever
    its distribution is installed, and a torchvision built for another torch fails at import with a RuntimeError;
    torchvision is not needed here, so it is hidden from that availability check before importing."""
    try:
        if "torchvision" not in sys.modules:
            try:
                import torchvision  # noqa: F401
            except Exception:  # noqa: BLE001 - a broken build: hide it
                sys.modules["torchvision"] = None  # later `import torchvision` raises ImportError
                try:
                    import lightning_utilities.core.imports as lui
                    original = lui.RequirementCache.__bool__

                    def _without_torchvision(self, _orig=original):
                        name = str(getattr(self, "requirement", None) or getattr(self, "module", None) or "")
                        return False if name.startswith("torchvision") else _orig(self)

                    lui.RequirementCache.__bool__ = _without_torchvision
                except ImportError:
                    pass
        import laplace  # noqa: F401
        from laplace import Laplace
        return Laplace
    except Exception as err:  # noqa: BLE001
        print(f"laplace-torch not available ({type(err).__name__}: {err}); skipping it.", flush=True)
        return None


def laplace_kron(Laplace, net: nn.Module, X_fit: np.ndarray, y_fit: np.ndarray, noise_std: float):
    """laplace-torch's full-network Kronecker-factored GGN Laplace on ``net`` (a copy), σ fixed to ``noise_std``,
    prior precision by marginal likelihood; returns ``predict(X) -> (mean, variance of f)`` (GLM predictive) and
    the fitted prior precision (mean over its entries)."""
    from torch.utils.data import DataLoader, TensorDataset
    model = copy.deepcopy(net)  # laplace-torch may hook into the model; keep ours untouched
    loader = DataLoader(TensorDataset(torch.as_tensor(X_fit, dtype=torch.float32),
                                      torch.as_tensor(y_fit, dtype=torch.float32)[:, None]), batch_size=128)
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure="kron", sigma_noise=noise_std)
    la.fit(loader)
    la.optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")

    def predict(X, chunk=128):  # in chunks: laplace-torch's GLM predictive grows faster than linearly in the rows
        mus, variances = [], []
        for i in range(0, len(X), chunk):
            f_mu, f_var = la(torch.as_tensor(X[i:i + chunk], dtype=torch.float32), pred_type="glm")
            mus.append(f_mu.detach().reshape(-1).double().numpy())
            variances.append(f_var.detach().reshape(-1).double().numpy())
        return np.concatenate(mus), np.concatenate(variances)

    return predict, float(torch.as_tensor(la.prior_precision).mean())

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
    best_epochs: list[int] = field(default_factory=list)


def train_adam(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, lr: float = 1e-3, steps: int | None = None,
               epochs: int | None = None, batch_size: int | None = None, members: int | None = None,
               seed: int = 0, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = mse,
               stop_below: float | None = None, record_every: int = 0, snapshot_steps: Iterable[int] = (),
               log: Callable[[str], None] | None = None, log_every: int = 0,
               validation: tuple[torch.Tensor, torch.Tensor] | None = None,
               validation_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
               n_iter_no_change: int = 10) -> Training:
    """Train ``model`` in place with Adam on ``loss(model(X_batch), y_batch)``; the model ends in eval mode.

    Full batch (``batch_size=None``): ``steps`` steps on all of ``(X, y)``. Mini-batches: ``epochs`` passes over
    the rows, shuffled by a ``torch.Generator`` seeded with ``seed``, in batches of ``batch_size`` (the last one
    smaller). ``members=E`` trains a batched ensemble whose forward maps inputs of shape (E, b, p) to (E, b, k):
    each member gets its own permutation of the rows every epoch, and ``loss`` should sum the members' losses.

    ``stop_below``: stop at the first step whose loss (of the weights before that step's update) is at most this
    value (full batch only). ``record_every=k``: record ``(step, loss)`` after every k-th step.
    ``snapshot_steps``: keep an eval-mode deep copy of the model after these steps. ``log(text)`` is called every
    ``log_every`` steps.

    Early stopping (mini-batches with ``members`` only): ``validation=(X_val, y_val)`` and ``validation_loss``
    mapping the batched outputs (E, n_val, k) and targets to the members' held-out losses (E,); after every epoch
    each member whose held-out loss improved has its weights kept; training stops once no member has improved for
    ``n_iter_no_change`` epochs, and every member ends with its best weights (``Training.best_epochs``).
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
    steps_per_epoch = None if full_batch else -(-n // batch_size)
    early = validation is not None
    if early and (full_batch or members is None or validation_loss is None):
        raise ValueError("train_adam: early stopping needs mini-batches, members and a validation_loss.")
    if early:
        best_loss = torch.full((members,), float("inf"))
        best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        best_epoch = torch.zeros(members, dtype=torch.long)
        since = 0
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
        if early and out.steps % steps_per_epoch == 0:
            with torch.no_grad():
                model.eval()
                held = validation_loss(model(validation[0].expand(members, *validation[0].shape)),
                                       validation[1].expand(members, *validation[1].shape)).detach().reshape(members)
                model.train()
            better = held < best_loss
            if bool(better.any()):
                since = 0
                best_loss = torch.where(better, held, best_loss)
                best_epoch[better] = out.steps // steps_per_epoch
                for k, v in model.state_dict().items():  # every parameter has the members on its first axis
                    best_state[k][better] = v.detach()[better]
            else:
                since += 1
                if since >= n_iter_no_change:
                    break
    if early:
        model.load_state_dict(best_state)
        out.best_epochs = best_epoch.tolist()
    model.eval()
    for p in model.parameters():
        p.grad = None
    return out


# -------------------------------------------------------------------------------------------- command line
def synthetic_rows(kind: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of 8 normal features and a smooth target: noise growing with |x4| ("regressor"), or the target cut
    into 3 classes ("classifier"); the table the serving and serialization benchmarks fit on."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 8))
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] - 0.3 * X[:, 2] * X[:, 3]
    if kind == "classifier":
        return X, (f > 0).astype(int) + (f > 1)
    return X, f + 0.1 * (1 + np.abs(X[:, 4])) * rng.standard_normal(n)


def train_or_load(net: nn.Module, X: torch.Tensor, y: torch.Tensor, *, steps: int, cache: Path | None) -> bool:
    """Train ``net`` in place by full-batch Adam on the half MSE (lr 1e-3), or load the weights a previous run
    cached in ``cache`` (written after training; None: no cache); the network is left in eval mode. Returns
    whether the weights were loaded."""
    if cache is not None and cache.exists():
        net.load_state_dict(torch.load(cache, weights_only=True))
        net.eval()
        return True
    train_adam(net, X, y, steps=steps, lr=1e-3, loss=half_mse)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(net.state_dict(), cache)
    net.eval()
    return False


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


def title_tag(command: str) -> str:
    """" (tag)" for a report title when ``command`` is one run with ``--tag``, so that a tagged run's report does
    not share the untagged one's title; "" otherwise (no tag, or several runs merged)."""
    tags = re.findall(r"--tag (\S+)", command)
    return f" ({tags[0]})" if len(tags) == 1 and " ; " not in command else ""


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """``python benchmarks/<script> <arguments>`` as the user typed them (``sys.argv`` when argv is None), quoted
    for a POSIX shell where an argument needs it (a JSON option), so that the line runs when pasted."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", f"benchmarks/{Path(script).name}", *args])


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


def output_paths(args: argparse.Namespace, stem: str) -> tuple[Path, Path]:
    """The results JSON and the markdown report of ``stem`` in ``args.out_dir``; ``--quick`` runs write
    ``<stem>_quick.*`` so that they never overwrite the committed full runs."""
    stem = stem + ("_quick" if args.quick else "")
    return args.out_dir / f"{stem}.json", args.out_dir / f"{stem}.md"


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


#: Settings the estimators take inside their settings objects, by object.
_TRAINING = tuple(__import__("glas_sklearn").Training().get_params(deep=False))  # every Training setting
_POSTERIOR = ("max_components", "eigen_method", "subsample", "predictive", "n_samples", "include_noise")
_COMPUTE = ("device", "dtype", "n_threads", "working_memory", "padding_idx")


def training_before_shadow(n_train: int) -> dict:
    """The training settings of the defaults before ``Training(early_stopping="auto")`` chose a shadow copy below
    2,000 training rows (027d2e6): held-out early stopping from 2,000 training rows, none below, 500 epochs at most,
    a tenth held out. For the rows that pin an earlier default."""
    return {"max_epochs": 500, "validation_fraction": 0.1, "early_stopping": n_train >= 2000}


def grouped(**settings) -> dict:
    """Estimator keyword arguments from one flat dict of settings, as the benchmarks' configurations hold them: the
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


# ------------------------------------------------------------------------------------------- tabular peers
#: The tabular peers of the UCI benchmark and the shift study, by name: (the distribution it needs, what it is). Each
#: is fitted on the fitting rows and calibrated on the calibration rows that every method of a run shares, raw
#: features; :func:`tabular_peer` gives its intervals.
TABULAR_PEERS = {
    "split_hgb": ("mapie", "MAPIE split conformal (absolute residual) around HistGradientBoosting"),
    "cqr_hgb": ("mapie", "MAPIE CQR around HistGradientBoosting quantile regressors (5 %, 95 %, median)"),
    "qrf": ("quantile-forest", "quantile regression forest (`RandomForestQuantileRegressor()`, 100 trees): its raw "
                               "5 % and 95 % quantiles, not conformalised"),
    "qrf_cqr": ("quantile-forest", "the same quantile forest's 5 % / 95 % / median, CQR (MAPIE) on the calibration "
                                   "rows"),
    "crepes_norm_hgb": ("crepes", "crepes normalised conformal around HistGradientBoosting (`WrapRegressor`, "
                                  "`calibrate(de=...)`), difficulty the std of the targets of the 25 nearest fitting "
                                  "rows (`DifficultyEstimator().fit(X_fit, y=y_fit)`; inputs standardised, which "
                                  "leaves the boosted trees unchanged)"),
    "crepes_mondrian_hgb": ("crepes", "crepes Mondrian conformal around HistGradientBoosting: categories equal-count "
                                      "bins of that k-NN difficulty on the calibration rows "
                                      "(`MondrianCategorizer().fit(X_cal, de=de, no_bins=n_cal // 20)`, at most 20)"),
    "ngboost": ("ngboost", "NGBoost, Normal (`NGBRegressor(Dist=Normal)`, 500 stages): μ ± 1.645 σ, not "
                           "conformalised"),
    "ngboost_cp": ("ngboost", "the same NGBoost, std-normalised split conformal (|y − μ| / σ, MAPIE) on the "
                              "calibration rows"),
}
#: crepes' Mondrian categories hold at least this many calibration rows (a 90 % quantile needs 9 or more).
MONDRIAN_ROWS_PER_BIN = 20


def tabular_peers_missing(names: Iterable[str] | None = None) -> dict[str, str]:
    """The peers among ``names`` (default: all of :data:`TABULAR_PEERS`) whose package is not installed, each with
    the note to print and record: ``{name: "quantile-forest not installed"}``."""
    names = list(TABULAR_PEERS) if names is None else list(names)
    return {n: f"{TABULAR_PEERS[n][0]} not installed (pip install -c benchmarks/constraints.txt -e '.[bench]')"
            for n in names if package_version(TABULAR_PEERS[n][0]) is None}


class _QuantileColumn(RegressorMixin, BaseEstimator):
    """One quantile of a fitted quantile forest as a fitted regressor (for MAPIE's prefit CQR)."""

    def __init__(self, forest=None, quantile=0.5):
        self.forest, self.quantile = forest, quantile

    def fit(self, X, y):
        raise NotImplementedError("_QuantileColumn wraps an already fitted forest.")

    def predict(self, X):
        return np.asarray(self.forest.predict(X, quantiles=[self.quantile]), dtype=float).reshape(len(X))

    def __sklearn_is_fitted__(self):
        return True


class _PrefitMoments(RegressorMixin, BaseEstimator):
    """``predict(X, return_std=True)`` of fitted moments, for MAPIE's prefit ``std_normalized`` score."""

    def __init__(self, moments=None):
        self.moments = moments

    def fit(self, X, y):
        raise NotImplementedError("_PrefitMoments wraps an already fitted model.")

    def predict(self, X, return_std=False):
        mu, sd = self.moments(np.asarray(X, dtype=np.float64))
        return (mu, sd) if return_std else mu

    def __sklearn_is_fitted__(self):
        return True


def _conformalised_quantiles(estimators, X_cal, y_cal, X_te, level):
    """MAPIE's prefit CQR on three fitted regressors (lower, upper, median): the (n, 2) intervals, crossing
    quantiles taken as the interval between them."""
    from mapie.regression import ConformalizedQuantileRegressor
    for e in estimators:
        e.n_features_in_ = X_cal.shape[1]
    cqr = ConformalizedQuantileRegressor(list(estimators), confidence_level=level, prefit=True)
    cqr.conformalize(X_cal, y_cal)
    pis = cqr.predict_interval(X_te)[1][:, :, 0]
    return np.stack([pis.min(1), pis.max(1)], axis=1)


def _split_conformal(model, X_cal, y_cal, X_te, level, score="absolute"):
    from mapie.regression import SplitConformalRegressor
    model.n_features_in_ = X_cal.shape[1]
    scr = SplitConformalRegressor(model, confidence_level=level, conformity_score=score, prefit=True)
    scr.conformalize(X_cal, y_cal)
    return scr.predict_interval(X_te)[1][:, :, 0]


def _cached(cache: dict | None, key: str, fit: Callable):
    if cache is None:
        return fit()
    if key not in cache:
        cache[key] = fit()
    return cache[key]


def tabular_peer(name: str, X_fit: np.ndarray, y_fit: np.ndarray, X_cal: np.ndarray, y_cal: np.ndarray,
                 X_te: np.ndarray, seed: int, level: float = 0.9,
                 cache: dict | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The intervals of peer ``name`` (:data:`TABULAR_PEERS`) for ``X_te``.

    Parameters
    ----------
    name : str
        A key of :data:`TABULAR_PEERS`.
    X_fit, y_fit : ndarray
        The rows the peer's model is fitted on (raw features).
    X_cal, y_cal : ndarray
        The rows it is calibrated on (the conformal rows; unused by the raw ``qrf`` and ``ngboost``).
    X_te : ndarray
        The rows to give intervals for.
    seed : int
        The models' ``random_state``.
    level : float
        The intervals' nominal coverage.
    cache : dict, optional
        Models fitted by an earlier call on the same rows and seed, by family (the quantile forest, crepes' boosted
        trees and difficulty, NGBoost): pass one new dict per set of rows to fit each family once for its raw and
        its calibrated row.

    Returns
    -------
    intervals : ndarray of shape (n_test, 2)
        Lower and upper bounds.
    std : ndarray of shape (n_test,) or None
        The peer's own scale per row where it has one (NGBoost's σ, crepes' difficulty), else None.
    """
    if name not in TABULAR_PEERS:
        raise ValueError(f"unknown tabular peer {name!r}; expected one of {sorted(TABULAR_PEERS)}")
    from sklearn.ensemble import HistGradientBoostingRegressor
    alpha = 1 - level
    if name == "split_hgb":
        mean = HistGradientBoostingRegressor(random_state=seed).fit(X_fit, y_fit)
        return _split_conformal(mean, X_cal, y_cal, X_te, level), None
    if name == "cqr_hgb":
        qs = [HistGradientBoostingRegressor(loss="quantile", quantile=q, random_state=seed).fit(X_fit, y_fit)
              for q in (alpha / 2, 1 - alpha / 2, 0.5)]
        return _conformalised_quantiles(qs, X_cal, y_cal, X_te, level), None
    if name in ("qrf", "qrf_cqr"):
        from quantile_forest import RandomForestQuantileRegressor
        forest = _cached(cache, "qrf", lambda: RandomForestQuantileRegressor(random_state=seed).fit(X_fit, y_fit))
        if name == "qrf":
            return np.asarray(forest.predict(X_te, quantiles=[alpha / 2, 1 - alpha / 2]), dtype=float), None
        cols = [_QuantileColumn(forest, q) for q in (alpha / 2, 1 - alpha / 2, 0.5)]
        return _conformalised_quantiles(cols, X_cal, y_cal, X_te, level), None
    if name in ("crepes_norm_hgb", "crepes_mondrian_hgb"):
        from crepes import WrapRegressor
        from crepes.extras import DifficultyEstimator, MondrianCategorizer
        mx, sx = X_fit.mean(0), X_fit.std(0)
        sx = np.where(sx > 0, sx, 1.0)
        Z_fit, Z_cal, Z_te = ((A - mx) / sx for A in (X_fit, X_cal, X_te))  # k-NN on comparable scales

        def fit():
            wrapped = WrapRegressor(HistGradientBoostingRegressor(random_state=seed))
            wrapped.fit(Z_fit, y_fit)  # (returns None)
            return wrapped, DifficultyEstimator().fit(Z_fit, y=y_fit)
        learner, de = _cached(cache, "crepes", fit)  # calibrate() below replaces the conformal part only
        if name == "crepes_norm_hgb":
            learner.calibrate(Z_cal, y_cal, de=de)
        else:
            n_bins = int(min(20, max(1, len(y_cal) // MONDRIAN_ROWS_PER_BIN)))
            learner.calibrate(Z_cal, y_cal, mc=MondrianCategorizer().fit(Z_cal, de=de, no_bins=n_bins))
        return np.asarray(learner.predict_int(Z_te, confidence=level), dtype=float), de.apply(Z_te)
    from ngboost import NGBRegressor
    from ngboost.distns import Normal
    ngb = _cached(cache, "ngboost",
                  lambda: NGBRegressor(Dist=Normal, random_state=seed, verbose=False).fit(X_fit, y_fit))

    def moments(X):
        d = ngb.pred_dist(X)
        return np.asarray(d.params["loc"], dtype=float), np.asarray(d.params["scale"], dtype=float)

    mu, sd = moments(X_te)
    if name == "ngboost":
        z = float(__import__("scipy.stats").stats.norm.ppf(1 - alpha / 2))
        return np.stack([mu - z * sd, mu + z * sd], axis=1), sd
    return _split_conformal(_PrefitMoments(moments), X_cal, y_cal, X_te, level, score="std_normalized"), sd


def default_on_hgb_residuals(X_fit: np.ndarray, y_fit: np.ndarray, X_cal: np.ndarray, y_cal: np.ndarray,
                             X_te: np.ndarray, seed: int, level: float = 0.9):
    """A prototype mean for the tables where trees win (issue 65): the default estimator fitted to the out-of-fold
    residuals of HistGradientBoosting, its intervals shifted by the boosted trees' prediction.

    ``h`` = ``HistGradientBoostingRegressor(random_state=seed)`` fitted on the fitting rows; the default regressor
    (``LaplaceActiveSubspaceRegressor(random_state=seed)``, nothing changed) is fitted on ``y − h_oof(x)`` of the
    fitting rows (``h_oof``: 5-fold ``cross_val_predict`` of the same trees, so that the network sees residuals of
    rows the trees did not fit) and calibrated on ``y − h(x)`` of the calibration rows, which ``h`` never saw; the
    interval for ``y`` is ``h(x)`` + the residual's interval (its conformal guarantee carries over, ``h`` being
    fixed given the fitting rows). The Laplace posterior stays over the network, so its intervals still widen off
    the data.

    Returns
    -------
    y_pred : ndarray of shape (n_test,)
    intervals : ndarray of shape (n_test, 2)
    """
    import warnings

    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.model_selection import KFold, cross_val_predict

    from glas_sklearn import LaplaceActiveSubspaceRegressor
    trees = HistGradientBoostingRegressor(random_state=seed)
    oof = cross_val_predict(trees, X_fit, y_fit, cv=KFold(5, shuffle=True, random_state=seed))
    trees.fit(X_fit, y_fit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LaplaceActiveSubspaceRegressor(confidence_level=level, random_state=seed)
        est.fit(X_fit, y_fit - oof, X_cal=X_cal, y_cal=y_cal - trees.predict(X_cal))
    r_pred, r_pis = est.predict_interval(X_te)
    base = trees.predict(X_te)
    return base + r_pred, base[:, None] + r_pis[:, :, 0]
