"""The CUDA paths against the CPU ones (skipped without a GPU), and the CPU fallback when there is none.

On a GPU the same float64 model and data are evaluated on both devices: products, Lanczos eigenpairs and
posterior samples must agree within round-off (different kernels sum in different orders), and the Lanczos
loop must not synchronise with the host more than its stopping test needs. ``benchmarks/gpu_check.sh`` runs
this file on a CUDA machine.
"""

import copy
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from glas_sklearn import Compute, LaplaceActiveSubspaceRegressor, LowRank, Training
from glas_sklearn.eigen import top_eigenpairs
from glas_sklearn.ggn import GGNOperator
from glas_sklearn.posterior import ActiveSubspacePosterior

from .reference import TinyLSTM, mlp

ROOT = Path(__file__).resolve().parents[1]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _randn(*shape, seed, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _rel(a, b):
    return float((a.cpu() - b.cpu()).norm() / b.cpu().norm())


def _on(net, device):
    return copy.deepcopy(net).to(device)


@cuda
@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ggn_products_on_cuda_match_cpu(reuse, dtype):
    net = mlp(n_out=2, hidden=16, dtype=dtype)
    X = _randn(64, 3, seed=1, dtype=dtype)
    cpu = GGNOperator(net, X, batch_size=20, reuse_linearization=reuse)
    gpu = GGNOperator(_on(net, "cuda"), X.cuda(), batch_size=20, reuse_linearization=reuse)
    V = _randn(cpu.shape[0], 7, seed=2, dtype=dtype)
    # Different summation orders on each device: a relative error of a few hundred ulps per record sum.
    tol = 50 * torch.finfo(dtype).eps * math.sqrt(cpu.shape[0]) * (10 if dtype == torch.float32 else 1)
    assert _rel(gpu.matvec(V[:, 0].cuda()), cpu.matvec(V[:, 0])) < tol
    block = gpu.matmat(V.cuda())
    assert block.device.type == "cuda"
    assert _rel(block, cpu.matmat(V)) < tol


@cuda
def test_masked_sequence_block_products_on_cuda_match_cpu():
    torch.manual_seed(0)
    net = TinyLSTM().double()
    tokens = torch.randint(0, 6, (9, 6))
    mask = torch.ones(9, 6, dtype=torch.bool)
    mask[0, 2:] = False
    mask[4, 3:] = False
    kw = dict(loss="cross_entropy", batch_size=4, trim_padding=True)
    cpu = GGNOperator(net, tokens, mask=mask, **kw)
    gpu = GGNOperator(_on(net, "cuda"), tokens.cuda(), mask=mask.cuda(), **kw)
    V = _randn(cpu.shape[0], 3, seed=3)
    assert _rel(gpu @ V.cuda(), cpu @ V) < 1e-10


@cuda
def test_lanczos_on_cuda_matches_cpu_and_keeps_to_one_sync_per_step():
    net = mlp(n_out=2, hidden=12)
    X = _randn(80, 3, seed=4)
    cpu_op = GGNOperator(net, X)
    gpu_op = GGNOperator(_on(net, "cuda"), X.cuda())
    a = top_eigenpairs(cpu_op, 6, random_state=0, tol=1e-9)
    b = top_eigenpairs(gpu_op, 6, random_state=0, tol=1e-9)
    assert a.converged and b.converged
    assert b.eigenvectors.device.type == "cuda" and b.eigenvalues.device.type == "cuda"
    np.testing.assert_allclose(b.eigenvalues.cpu().numpy(), a.eigenvalues.numpy(), rtol=1e-8)
    overlap = (b.eigenvectors.cpu().T @ a.eigenvectors).abs().diagonal()
    assert float(overlap.min()) > 1 - 1e-6
    # Host synchronisations inside the solver, on a dense device matrix (products of their own do not sync):
    # one transfer per step (two after a second Gram-Schmidt pass) plus a bounded number outside the loop.
    G = torch.randn(300, 300, dtype=torch.float64, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    G = G @ G.T
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            res = top_eigenpairs(G, 5, random_state=0)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    assert syncs <= 2 * res.n_matvecs + 20, (syncs, res.n_matvecs)


@cuda
def test_posterior_samples_on_cuda_match_cpu():
    net = mlp(n_out=1, hidden=10)
    D = sum(p.numel() for p in net.parameters())
    P, _ = torch.linalg.qr(_randn(D, 4, seed=5))
    lam = torch.tensor([4.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    cpu = ActiveSubspacePosterior(net, lam, P, beta=20.0)
    gpu = ActiveSubspacePosterior(_on(net, "cuda"), lam.cuda(), P.cuda(), beta=20.0)
    X = _randn(30, 3, seed=6)
    a = cpu.predict_samples(X, 3, n_samples=200, random_state=7)
    b = gpu.predict_samples(X.cuda(), 3, n_samples=200, random_state=7)
    assert b.device.type == "cuda"
    assert _rel(b, a) < 1e-10  # same draws on both devices (drawn on the CPU), different kernels
    assert _rel(gpu.linearized_variance(X.cuda(), 3), cpu.linearized_variance(X, 3)) < 1e-10


@cuda
@pytest.mark.filterwarnings("ignore::glas_sklearn.calibration.CalibrationWarning")
def test_estimator_fits_on_cuda():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=120)
    est = LaplaceActiveSubspaceRegressor(random_state=0,
                                         training=Training(module_kwargs=dict(hidden_layer_sizes=(16,)), max_epochs=30),
                                         posterior=LowRank(max_components=5, n_samples=50),
                                         compute=Compute(device="cuda")).fit(X, y)
    assert est.posterior_.device.type == "cuda"
    mean, pis = est.predict_interval(X[:10])
    assert np.isfinite(mean).all() and np.isfinite(pis).all() and (pis[:, 0] <= pis[:, 1]).all()


@cuda
def test_networks_trained_together_on_cuda_match_one_by_one():
    """An ensemble's networks trained together on CUDA (stacked weights, batched products, each with its own shadow
    copy) against the same networks trained one by one on CUDA: float64, the same epochs and weights to rounding."""
    from glas_sklearn.likelihoods import Categorical

    rng = np.random.default_rng(1)
    X = torch.as_tensor(rng.normal(size=(90, 2)), device="cuda")
    y = torch.as_tensor((X[:, 0] * X[:, 1] > 0).long().cpu().numpy(), device="cuda")
    training = Training(max_epochs=40, lr=0.03, n_iter_no_change=1, early_stopping="shadow")
    seeds = [3, 4, 5]
    nets = [mlp(2, 8, 2, seed=s).cuda() for s in seeds]
    alone = [copy.deepcopy(n) for n in nets]
    together = training.fit_together(nets, X, y, Categorical(), seeds=seeds, owners=["a", "b", "c"])
    one_by_one = [training.fit(n, X, y, Categorical(), seed=s) for n, s in zip(alone, seeds, strict=True)]
    assert [r.n_iter for r in together] == [r.n_iter for r in one_by_one]
    eps = np.finfo(np.float64).eps
    for a, b in zip(nets, alone, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert p.device.type == "cuda"
            np.testing.assert_allclose(p.detach().cpu(), q.detach().cpu(), rtol=0,
                                       atol=1e4 * eps * max(1.0, float(q.detach().abs().max())))


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_gpu_check_script_stops_cleanly_without_cuda(tmp_path):
    """The CPU fallback of benchmarks/gpu_check.sh: with no visible CUDA device it says so and exits with 2,
    before running anything."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable, OUT=str(tmp_path))
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torch.cuda.is_available() is False" in proc.stdout
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written
