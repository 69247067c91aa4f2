"""Data-parallel G v with ``torch.distributed``, for data that does not fit one machine (or one device).

Every process holds the same model and its own shard of the records. A product is the local
:class:`~glas_sklearn.ggn.GGNOperator` product, weighted by the shard's share of the records, summed over
the processes by one ``all_reduce``: G = Σ_r (N_r / N) G_r = (1/N) Σ_n J_nᵀ H_n J_n over all N records.
The result is the same on every process, so an eigen-solver started from the same seed runs in lockstep
everywhere (:func:`~glas_sklearn.eigen.top_eigenpairs` or ``eigsh`` on ``.to_scipy()``), and each process
ends with the same eigenpairs and posterior.

Errors raised while building a process's local operator (bad shapes, NaN, a different model) are
shared with all processes, so every process raises instead of waiting forever in a collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ._checks import numpy_rng
from ._functional import ParameterLayout, model_outputs
from .ggn import CurvatureOperator, GGNOperator
from .likelihoods import Likelihood, resolve_likelihood

__all__ = ["DistributedGGNOperator", "distributed_noise_variance", "shared_seed"]


def _check_initialized() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group(...) "
                           "in every process first (backend 'gloo' on CPU, 'nccl' on CUDA).")


def _comm_device(device: torch.device, group) -> torch.device:
    """Where collective buffers live: NCCL needs CUDA tensors, gloo takes CPU tensors."""
    backend = dist.get_backend(group)
    return device if backend == "nccl" else torch.device("cpu")


def _all_agree(local_error: BaseException | None, group, device: torch.device) -> None:
    """Raise on every process when any process failed; the failing process re-raises its own error."""
    flag = torch.tensor([0.0 if local_error is None else 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if local_error is not None:
        raise local_error
    if flag.item() > 0:
        raise RuntimeError("Building the distributed GGN failed on another process; see that process's error.")


class DistributedGGNOperator(CurvatureOperator):
    """The GGN of a model over data sharded across the processes of a ``torch.distributed`` group.

    Call it in every process of the group, with the same model (same weights) and that process's own rows. Its products
    (``matvec``, ``matmat``, ``@``, ``to_scipy()``, the :class:`~glas_sklearn.ggn.CurvatureOperator` protocol) are
    collective: every process must ask for the same vectors. A D×k block is one ``all_reduce``.

    Parameters
    ----------
    model : torch.nn.Module
        The trained network, identical on every process (checked). Never modified.
    X : torch.Tensor
        This process's rows, on the model's device. A process may hold no rows (``X.shape[0] == 0``).
    y : torch.Tensor, optional
        Targets of these rows (only checked; G does not depend on them).
    loss, batch_size, mask, trim_padding, reuse_linearization
        As for :class:`~glas_sklearn.ggn.GGNOperator`, applied to the local rows.
    group : ProcessGroup, optional
        The process group (default: the world).

    Attributes
    ----------
    shape : tuple of int
        (D, D).
    likelihood : Likelihood
        ``loss`` resolved to its object (the same on every process).
    n_records : int
        N over all processes.
    total_weight : float
        ``n_records`` as a float (records are unweighted here), G's normalisation.
    n_local_records : int
        N_r on this process.
    n_products : int
        Single-vector products computed so far (a D×k block counts k and costs one all_reduce).
    local : GGNOperator or None
        This process's operator (None without rows).

    Examples
    --------
    In each of the processes (e.g. started with ``torchrun``)::

        torch.distributed.init_process_group("gloo")
        op = DistributedGGNOperator(model, X_shard)
        res = top_eigenpairs(op, k=20, random_state=0)   # same seed everywhere: same eigenpairs everywhere
    """

    def __init__(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor | None = None, *,
                 loss: str | Likelihood = "mse", batch_size: int | None = None, mask: torch.Tensor | None = None,
                 trim_padding: bool = False, reuse_linearization: bool | str = "auto", group=None) -> None:
        _check_initialized()
        self.group = group
        self._layout = ParameterLayout.from_model(model)
        self._comm = _comm_device(self.device, group)
        self.local: GGNOperator | None = None
        error: BaseException | None = None
        try:
            likelihood = resolve_likelihood(loss, "loss")
            if not isinstance(X, torch.Tensor):
                raise TypeError(f"X must be a torch.Tensor, got {type(X).__name__}.")
            if X.shape[0] > 0:
                self.local = GGNOperator(model, X, y, loss=likelihood, batch_size=batch_size, mask=mask,
                                         trim_padding=trim_padding, reuse_linearization=reuse_linearization)
        except (ValueError, TypeError, RuntimeError) as err:
            error = err
        _all_agree(error, group, self._comm)
        self.likelihood = likelihood

        # Same model everywhere: D first (so the next collective has equal sizes), then the weights.
        theta0 = self.layout.parameters_of(model).detach().to(torch.float64)
        stats = torch.tensor([theta0.numel(), float(theta0.sum()), float(theta0.norm())], dtype=torch.float64,
                             device=self._comm)
        lo, hi = stats.clone(), stats.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
        if not torch.allclose(lo, hi, rtol=1e-12, atol=0.0):
            raise ValueError("The model differs between processes (number or values of the trainable weights); "
                             "every process must hold the same trained network.")

        n = torch.tensor([0.0 if self.local is None else float(self.local.n_records)], dtype=torch.float64,
                         device=self._comm)
        dist.all_reduce(n, group=group)
        self.n_local_records = 0 if self.local is None else int(self.local.n_records)
        self.n_records = int(n.item())
        self.total_weight = float(self.n_records)  # G's normalisation: every record counts once
        if self.n_records == 0:
            raise ValueError("No process holds a record: the distributed data set is empty.")
        self._share = self.n_local_records / self.n_records
        self.n_products = 0

    # the protocol's questions, answered from the model's layout
    @property
    def layout(self) -> ParameterLayout:
        """Names and shapes of the weights in the flat vector."""
        return self._layout

    @property
    def dtype(self) -> torch.dtype:
        return self._layout.dtype

    @property
    def device(self) -> torch.device:
        return self._layout.device

    def __repr__(self) -> str:
        return (f"DistributedGGNOperator(D={self.shape[0]}, N={self.n_records}, local N={self.n_local_records}, "
                f"processes={dist.get_world_size(self.group)}, likelihood={self.likelihood!r})")

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        if self.local is None:
            out = torch.zeros(V.shape, dtype=self.dtype, device=self.device)
        else:
            out = self.local.matmat(V) * self._share
        buf = out.to(self._comm)
        dist.all_reduce(buf, group=self.group)
        self.n_products += V.shape[1]
        return buf.to(self.device)

    def diagonal(self) -> torch.Tensor:
        """The exact diagonal of the pooled G (float64, shape (D,)): each process's
        :meth:`GGNOperator.diagonal` weighted by its share of the records, summed by one ``all_reduce``."""
        if self.local is None:
            out = torch.zeros(self.layout.size, dtype=torch.float64, device=self.device)
        else:
            out = self.local.diagonal() * self._share
        buf = out.to(self._comm)
        dist.all_reduce(buf, group=self.group)
        return buf.to(self.device)

    def release(self) -> None:
        """Drop the local cached linearisation."""
        if self.local is not None:
            self.local.release()


def distributed_noise_variance(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, batch_size: int | None = None,
                               group=None) -> float:
    """σ² = mean squared residual over the rows of all processes (collective; a process may hold none).

    Parameters
    ----------
    model : torch.nn.Module
        The trained network (eval mode, its own weights), the same on every process.
    X, y : torch.Tensor
        This process's rows and regression targets.
    batch_size : int, optional
        Rows per forward pass.
    group : ProcessGroup, optional

    Returns
    -------
    float
        The pooled σ², the same on every process.
    """
    _check_initialized()
    layout = ParameterLayout.from_model(model)
    comm = _comm_device(layout.device, group)
    sums = torch.zeros(2, dtype=torch.float64, device=comm)
    error = None
    try:
        if X.shape[0] != y.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}; they must match.")
        if X.shape[0] > 0:
            preds = model_outputs(model, X, batch_size)
            res = (y.reshape(preds.shape) - preds).double()
            if not bool(torch.isfinite(res).all()):
                raise ValueError("The residuals contain NaN or infinite values; clean the predictions or targets.")
            sums[0], sums[1] = (res**2).sum().to(comm), float(res.numel())
    except (ValueError, TypeError, RuntimeError) as err:
        error = err
    _all_agree(error, group, comm)
    dist.all_reduce(sums, group=group)
    if sums[1] == 0:
        raise ValueError("No process holds a row: the noise variance cannot be estimated.")
    return float(sums[0] / sums[1])


def shared_seed(random_state=None, group=None) -> int:
    """One integer seed, the same on every process: drawn from ``random_state`` on the group's first
    process and broadcast (so ``random_state=None`` cannot start the processes' eigen-solvers apart).

    Parameters
    ----------
    random_state : int, numpy Generator or None
    group : ProcessGroup, optional

    Returns
    -------
    int
    """
    _check_initialized()
    seed = torch.tensor([int(numpy_rng(random_state).integers(0, 2**62))], dtype=torch.int64)
    comm = _comm_device(torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl"
                        else torch.device("cpu"), group)
    seed = seed.to(comm)
    dist.broadcast(seed, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return int(seed.item())
