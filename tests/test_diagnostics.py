"""glas_sklearn.diagnostics: eigenvector alignment, and the subsampling study against dense GGN eigenvectors.

The sequence-model (LSTM, padding, trim_padding) cases of subsample_alignment are in test_sequence.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from glas_sklearn.diagnostics import eigenvector_alignment, subsample_alignment

from .reference import assert_unchanged, dense_ggn, mlp, snapshot

N_ROWS = 120


@pytest.fixture(scope="module")
def problem():
    net = mlp(n_in=3, hidden=5, n_out=1)  # D = 56, float64
    X = torch.randn(N_ROWS, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return net, X


def _dense_top(net, X, k):
    """Top-k eigenpairs of the GGN built explicitly (descending)."""
    vals, vecs = torch.linalg.eigh(dense_ggn(net, X))
    return vals.flip(0)[:k], vecs.flip(1)[:, :k]


def test_eigenvector_alignment():
    gen = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(30, 4, dtype=torch.float64, generator=gen))
    p = Q[:, 0]
    other = Q[:, 1]
    mixed = (p + 0.1 * other) / (p + 0.1 * other).norm()
    A = eigenvector_alignment([Q, -Q, other, mixed])
    assert A.shape == (4, 4)
    np.testing.assert_allclose(np.diag(A), 1.0)
    assert A[0, 1] == pytest.approx(1.0)  # sign does not matter
    assert A[0, 2] == pytest.approx(0.0, abs=1e-12)
    assert A[0, 3] == pytest.approx(1 / np.sqrt(1.01))
    ref = eigenvector_alignment([Q, other], reference=p)
    np.testing.assert_allclose(ref, [1.0, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match="same length"):
        eigenvector_alignment([Q, torch.ones(5)])
    # the compared column is chosen by index; vectors of any scale are normalised first
    np.testing.assert_allclose(eigenvector_alignment([Q, 3 * other], index=1), [[1, 1], [1, 1]], atol=1e-12)
    with pytest.raises(ValueError, match="at least one"):
        eigenvector_alignment([])


def test_subsample_alignment_against_dense_eigenvectors(problem):
    # Every run is checked against the dense GGN of exactly the rows it reports: its eigenvalues, its row
    # count, and the alignments, which must equal |<p_i, p_j>| of the dense leading eigenvectors.
    net, X = problem
    before = snapshot(net)
    res = subsample_alignment(net, X, loss="mse", subsample_sizes=[30, 60], n_replicas=3, reference_size=N_ROWS,
                              n_components=2, tol=1e-10, return_eigen=True, random_state=0)
    np.testing.assert_array_equal(res["indices"]["reference"], np.arange(N_ROWS))  # all rows
    dense = {}
    for key, rows in res["indices"].items():
        size = N_ROWS if key == "reference" else key[0]
        assert len(rows) == size and len(np.unique(rows)) == size and np.all(np.diff(rows) > 0)
        lam, P = _dense_top(net, X[torch.as_tensor(rows)], 2)
        # well separated (λ1/λ2 > 2 on every subsample), so p1 is determined to about residual / gap
        assert float(lam[0]) > 2 * float(lam[1])
        eig = res["reference_eigen"] if key == "reference" else res["eigen"][key]
        torch.testing.assert_close(eig.eigenvalues, lam, rtol=1e-8, atol=0)
        dense[key] = P[:, 0]
        table = res["table"]
        run = (table.run == "reference") if key == "reference" else (
            (table.run == "replica") & (table.subsample_size == key[0]) & (table.replica == key[1]))
        assert table[run].iloc[0]["n_records"] == size  # one record per row for an MLP
    for size in (30, 60):
        ps = [dense[(size, r)] for r in range(3)]
        expected = np.array([[abs(float(a @ b)) for b in ps] for a in ps])
        np.testing.assert_allclose(res["replica_alignment"][size], expected, atol=1e-6)
        np.testing.assert_allclose(res["reference_alignment"][size],
                                   [abs(float(p @ dense["reference"])) for p in ps], atol=1e-6)
        off = expected[~np.eye(3, dtype=bool)]
        summary = res["summary"].set_index("subsample_size").loc[size]
        assert summary["min_replica_alignment"] == pytest.approx(off.min(), abs=1e-6)
        assert summary["mean_replica_alignment"] == pytest.approx(off.mean(), abs=1e-6)
    # the subsamples of one size are not all the same rows
    assert not np.array_equal(res["indices"][(30, 0)], res["indices"][(30, 1)])
    assert_unchanged(net, before)


def test_identical_subsamples_align_to_one(problem):
    # Subsamples of all N rows are the same data; only the Lanczos start vectors differ. With a clear
    # spectral gap and converged runs (relative residual 1e-10), every pair of p1 must agree to 1e-8.
    net, X = problem
    lam, _ = _dense_top(net, X, 2)
    assert float(lam[0]) > 2 * float(lam[1])
    res = subsample_alignment(net, X, loss="mse", subsample_sizes=[N_ROWS], n_replicas=3, n_components=2,
                              tol=1e-10, random_state=1)
    assert res["table"]["converged"].all()
    np.testing.assert_allclose(res["replica_alignment"][N_ROWS], np.ones((3, 3)), atol=1e-8)
    assert res["reference_alignment"] == {}
    assert res["table"]["alignment_to_reference"].isna().all()


def test_subsample_alignment_is_reproducible(problem):
    # The same seed replays the same path (same rows, same start vectors): bitwise equal results.
    net, X = problem
    kw = dict(loss="mse", subsample_sizes=[20], n_replicas=2, n_components=1, tol=1e-6)
    a = subsample_alignment(net, X, random_state=3, **kw)
    b = subsample_alignment(net, X, random_state=3, **kw)
    c = subsample_alignment(net, X, random_state=4, **kw)
    for key in a["indices"]:
        np.testing.assert_array_equal(a["indices"][key], b["indices"][key])
    np.testing.assert_array_equal(a["replica_alignment"][20], b["replica_alignment"][20])
    assert not np.array_equal(a["indices"][(20, 0)], c["indices"][(20, 0)])


def test_subsample_alignment_argument_errors(problem):
    net, X = problem
    with pytest.raises(ValueError, match="loss"):  # checked by the GGN operator of the first run
        subsample_alignment(net, X, loss="hinge", subsample_sizes=[10])
    with pytest.raises(ValueError, match="non-empty sequence"):
        subsample_alignment(net, X, loss="mse", subsample_sizes=10)
    with pytest.raises(ValueError, match="duplicates"):
        subsample_alignment(net, X, loss="mse", subsample_sizes=[10, 10])
    with pytest.raises(ValueError, match="reference_size 500 is larger than"):
        subsample_alignment(net, X, loss="mse", subsample_sizes=[10], reference_size=500)
    with pytest.raises(ValueError, match="k must be < D"):  # the eigen-solver's check: 56 weights
        subsample_alignment(net, X, loss="mse", subsample_sizes=[10], n_components=56)
    with pytest.raises(TypeError, match="torch.Tensor"):
        subsample_alignment(net, X.numpy(), loss="mse", subsample_sizes=[10])

