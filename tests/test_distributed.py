"""Data-parallel GGN over two CPU processes (gloo): products, eigenpairs, σ² and the posterior equal the
single-process results on all the data, and errors on one process reach every process."""

from __future__ import annotations

import os
import traceback

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from glas_sklearn.eigen import top_eigenpairs
from glas_sklearn.laplace import fit_laplace_subspace, residual_noise_variance
from tests.reference import dense_ggn, mlp

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

N_ROWS = 30


def _data():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N_ROWS, 3, generator=gen, dtype=torch.float64)
    y = torch.sin(X[:, :1]) + 0.1 * torch.randn(N_ROWS, 1, generator=gen, dtype=torch.float64)
    return X, y


def _shard(rank: int, case: str) -> slice:
    cut = N_ROWS if case == "empty_rank" else 11  # uneven shards; or everything on rank 0
    return slice(0, cut) if rank == 0 else slice(cut, N_ROWS)


def _worker(rank: int, world: int, init_file: str, out_dir: str, case: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out: dict = {}
    try:
        from glas_sklearn.distributed import DistributedGGNOperator, distributed_noise_variance

        net = mlp(seed=1 if (case == "other_model" and rank == 1) else 0)
        X, y = _data()
        sl = _shard(rank, case)
        Xs, ys = X[sl].clone(), y[sl].clone()
        if case == "nan" and rank == 1:
            Xs[0, 0] = float("nan")
        try:
            op = DistributedGGNOperator(net, Xs, ys)
        except (ValueError, RuntimeError) as err:
            out["error"] = f"{type(err).__name__}: {err}"
            return
        V = torch.randn(op.shape[0], 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        out["GV"] = op @ V
        out["n_products"] = op.n_products  # the block: 2 single-vector products, in one all_reduce
        out["Gv"] = op.matvec(V[:, 1])
        out["n_records"] = op.n_records
        out["diag"] = op.diagonal()
        out["n_local"] = op.n_local_records
        eig = top_eigenpairs(op, 3, random_state=0)
        out["eigenvalues"] = eig.eigenvalues
        out["eigenvectors"] = eig.eigenvectors
        out["noise_var"] = distributed_noise_variance(net, Xs, ys)
        # random_state=None: each process would draw its own start vector; the shared seed keeps them in step
        fresh = fit_laplace_subspace(net, Xs, ys, n_components=3, distributed=True, random_state=None)
        out["fresh_eigenvectors"] = fresh.eigen.eigenvectors
        out["fresh_sigma0"] = [fresh.posterior.fit_sigma0(d) for d in (1, 2, 3)]
        fit = fit_laplace_subspace(net, Xs, ys, n_components=3, distributed=True, random_state=0)
        out["fit_eigenvalues"] = fit.eigen.eigenvalues
        out["fit_noise_var"] = fit.noise_var
        out["fit_sigma0"] = [fit.posterior.fit_sigma0(d) for d in (1, 2, 3)]
        out["beta"] = fit.beta
    except Exception:  # noqa: BLE001 - reported to the parent
        out["crash"] = traceback.format_exc()
    finally:
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _run(tmp_path, case: str) -> list[dict]:
    init_file = str(tmp_path / f"init_{case}")  # a fresh rendezvous file per run
    mp.start_processes(_worker, args=(2, init_file, str(tmp_path), case), nprocs=2, join=True,
                       start_method="spawn")
    outs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r in range(2):
        os.remove(tmp_path / f"rank{r}.pt")
    for o in outs:
        assert "crash" not in o, o.get("crash")
    return outs


@pytest.mark.parametrize("case", ["uneven", "empty_rank"])
def test_distributed_ggn_equals_the_single_process_one(tmp_path, case):
    outs = _run(tmp_path, case)
    net = mlp(seed=0)
    X, y = _data()
    G = dense_ggn(net, X)
    V = torch.randn(G.shape[0], 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    evals = np.linalg.eigvalsh(G.numpy())[::-1][:3]
    for o in outs:
        assert o["n_records"] == N_ROWS
        torch.testing.assert_close(o["GV"], G @ V, rtol=1e-11, atol=1e-13)
        torch.testing.assert_close(o["Gv"], G @ V[:, 1], rtol=1e-11, atol=1e-13)
        assert o["n_products"] == 2
        torch.testing.assert_close(o["diag"], torch.diagonal(G), rtol=1e-11, atol=1e-14)
        np.testing.assert_allclose(o["eigenvalues"].numpy(), evals, rtol=1e-8)
        assert o["noise_var"] == pytest.approx(residual_noise_variance(net, X, y), rel=1e-12)
    assert outs[0]["n_local"] + outs[1]["n_local"] == N_ROWS
    # Every process holds the same eigenpairs and posterior, bit for bit. This is exact, not a coincidence of
    # round-off: Lanczos sees the operator only through the products, and every product is an all_reduce,
    # which hands every rank the identical summed tensor (gloo reduces each chunk once and broadcasts the
    # result; with two ranks the sum a + b is also commutative). From the same seed, Lanczos then runs the
    # same deterministic float operations (one thread per process) on identical inputs on every rank, and
    # σ0 is a function of those eigenpairs and of θ0 (checked equal on all ranks).
    torch.testing.assert_close(outs[0]["eigenvectors"], outs[1]["eigenvectors"], rtol=0, atol=0)
    torch.testing.assert_close(outs[0]["fresh_eigenvectors"], outs[1]["fresh_eigenvectors"], rtol=0, atol=0)
    assert outs[0]["fresh_sigma0"] == outs[1]["fresh_sigma0"]
    assert outs[0]["fit_sigma0"] == outs[1]["fit_sigma0"]
    # random_state=0 reaches Lanczos as the seed shared_seed(0) broadcasts: the same start vector as here
    shared = int(np.random.default_rng(0).integers(0, 2**62))
    single = fit_laplace_subspace(net, X, y, n_components=3, random_state=shared)
    np.testing.assert_allclose(outs[0]["fit_eigenvalues"].numpy(), single.eigen.eigenvalues.numpy(), rtol=1e-8)
    # same start vector, products equal up to summation order: the same eigenvectors, so the same σ0
    np.testing.assert_allclose(outs[0]["fit_sigma0"], [single.posterior.fit_sigma0(d) for d in (1, 2, 3)],
                               rtol=1e-8)
    assert outs[0]["beta"] == pytest.approx(single.beta, rel=1e-12)


def test_errors_reach_every_process(tmp_path):
    outs = _run(tmp_path, "nan")
    assert "NaN" in outs[1]["error"]  # the process with the bad row names the problem
    assert "another process" in outs[0]["error"]  # the other one does not hang, and says why it stops
    outs = _run(tmp_path, "other_model")
    assert all("model differs between processes" in o["error"] for o in outs)


def test_not_initialised_is_a_clear_error():
    from glas_sklearn.distributed import DistributedGGNOperator

    if dist.is_initialized():  # pragma: no cover
        pytest.skip("a process group is already initialised")
    X, _ = _data()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedGGNOperator(mlp(), X)
    with pytest.raises(ValueError, match="subsample"):
        fit_laplace_subspace(mlp(), X, n_components=2, noise_var=0.1, distributed=True, subsample=5)
