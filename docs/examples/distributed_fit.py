"""A posterior fitted on two processes, each holding its own shard of the rows.

Run with ``torchrun --nproc_per_node=2 distributed_fit.py`` ("gloo" on CPU; "nccl" for CUDA devices).
"""

import torch

from glas_sklearn.distributed import DistributedGGNOperator
from glas_sklearn.eigen import top_eigenpairs
from glas_sklearn.laplace import fit_laplace_subspace

torch.distributed.init_process_group("gloo")
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()

torch.manual_seed(0)  # the same model and data on every process
model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
X = torch.randn(1000, 4)
y = X.sum(dim=1, keepdim=True) + 0.1 * torch.randn(1000, 1)
X_shard, y_shard = X[rank::world], y[rank::world]  # each process its own rows
fit = fit_laplace_subspace(model, X_shard, y_shard, n_components=20, distributed=True, random_state=0)

# the operator alone: its top eigenpairs, the same on every process
op = DistributedGGNOperator(model, X_shard)
res = top_eigenpairs(op, k=20, random_state=0)
if rank == 0:
    print(f"{world} processes: top eigenvalue {res.eigenvalues[0]:.4g}, converged: {res.converged}")
torch.distributed.destroy_process_group()
