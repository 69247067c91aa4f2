import copy

import numpy as np
import pytest
import torch
from scipy.linalg import subspace_angles
from sklearn.exceptions import ConvergenceWarning

from glas_sklearn import eigen
from glas_sklearn.eigen import top_eigenpairs
from glas_sklearn.ggn import GGNOperator

from .reference import dense_ggn, mlp
from .test_ggn import DenseCurvature, spd_matrix


@pytest.fixture(scope="module")
def problem():
    net = mlp(hidden=8, n_out=2)
    X = torch.randn(60, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    G = dense_ggn(net, X).numpy()
    vals, vecs = np.linalg.eigh(G)
    return net, X, vals[::-1], vecs[:, ::-1]


@pytest.mark.parametrize("method", ["lanczos", "eigsh"])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_matches_dense_eigh(problem, method, k):
    net, X, vals, vecs = problem
    op = GGNOperator(net, X)
    res = top_eigenpairs(op, k, method=method, random_state=0, tol=1e-8)
    assert res.converged
    assert res.eigenvalues.shape == (k,) and res.eigenvectors.shape == (op.shape[0], k)
    np.testing.assert_allclose(res.eigenvalues.numpy(), vals[:k], rtol=1e-7, atol=1e-12 * vals[0])
    P = res.eigenvectors.numpy()
    np.testing.assert_allclose(P.T @ P, np.eye(k), atol=1e-10)
    # The subspace spanned agrees with the exact one (tiny principal angles).
    assert subspace_angles(P, vecs[:, :k]).max() < 1e-5
    # Reported residuals are the real ones.
    G = dense_ggn(net, X).numpy()
    true_res = np.linalg.norm(G @ P - P * res.eigenvalues.numpy(), axis=0)
    assert np.all(true_res <= 1e-8 * vals[0] + 1e-12)
    np.testing.assert_allclose(res.residual_norms.numpy(), true_res, atol=1e-9 * vals[0])


def test_float32_operator_stable(problem):
    net, X, vals, _ = problem
    op = GGNOperator(copy.deepcopy(net).float(), X.float())
    res = top_eigenpairs(op, 5, random_state=1, tol=1e-5)
    assert res.converged and res.eigenvectors.dtype == torch.float32
    assert res.eigenvalues.dtype == torch.float64
    np.testing.assert_allclose(res.eigenvalues.numpy(), vals[:5], rtol=1e-4)


def test_dense_tensor_operator_and_reproducibility():
    gen = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(80, 80, dtype=torch.float64, generator=gen))
    lam = torch.logspace(1, -6, 80, dtype=torch.float64)
    A = Q @ torch.diag(lam) @ Q.T
    a = top_eigenpairs(A, 6, random_state=3)
    b = top_eigenpairs(A, 6, random_state=3)
    assert torch.equal(a.eigenvectors, b.eigenvectors)
    np.testing.assert_allclose(a.eigenvalues.numpy(), lam[:6].numpy(), rtol=1e-8)


def test_lanczos_uses_no_more_products_than_arpack(problem):
    net, X, _, _ = problem
    op = GGNOperator(net, X)
    ours = top_eigenpairs(op, 5, method="lanczos", random_state=0)
    arpack = top_eigenpairs(op, 5, method="eigsh", random_state=0)
    assert ours.converged and arpack.converged
    assert ours.n_matvecs <= arpack.n_matvecs


def test_unconverged_warns_loudly(problem):
    net, X, _, _ = problem
    op = GGNOperator(net, X)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        res = top_eigenpairs(op, 8, max_matvecs=9, random_state=0)
    assert not res.converged
    assert res.n_matvecs == 9


def test_bad_arguments(problem):
    net, X, _, _ = problem
    op = GGNOperator(net, X)
    D = op.shape[0]
    with pytest.raises(ValueError, match="k must be < D"):
        top_eigenpairs(op, D)
    with pytest.raises(ValueError, match=rf"k={D + 3} eigenpairs requested .*D={D} .*at most {D - 1}"):
        top_eigenpairs(op, D + 3)
    with pytest.raises(ValueError, match="k must be"):
        top_eigenpairs(op, 0)
    with pytest.raises(ValueError, match="method"):
        top_eigenpairs(op, 2, method="power")
    with pytest.raises(ValueError, match="tol"):
        top_eigenpairs(op, 2, tol=0)
    with pytest.raises(ValueError, match="square"):
        top_eigenpairs(torch.zeros(3, 4), 1)
    with pytest.raises(TypeError, match="CurvatureOperator"):
        top_eigenpairs(np.eye(5), 1)


def test_convergence_warning_is_sklearns_and_not_reexported():
    assert "ConvergenceWarning" not in eigen.__all__
    from glas_sklearn.eigen import ConvergenceWarning as plain_import  # still importable, as a plain name

    assert plain_import is ConvergenceWarning


@pytest.mark.parametrize("method", ["lanczos", "eigsh"])
def test_any_curvature_operator_works(method):
    """A user-defined CurvatureOperator goes through the same protocol as the GGN: its eigenpairs are those
    of its dense matrix (λ spread over [1, 100]: tolerances relative to λ1 from float64 and D)."""
    D, k = 50, 4
    A64, _ = spd_matrix(D, seed=40)
    op = DenseCurvature(A64)
    res = top_eigenpairs(op, k, method=method, random_state=0, tol=1e-10)
    assert res.converged
    vals, vecs = np.linalg.eigh(A64.numpy())
    tol = 50 * np.finfo(np.float64).eps * np.sqrt(D) * vals[-1]
    np.testing.assert_allclose(res.eigenvalues.numpy(), vals[::-1][:k], rtol=0, atol=tol + 1e-9 * vals[-1])
    assert subspace_angles(res.eigenvectors.numpy(), vecs[:, ::-1][:, :k]).max() < 1e-6
    if method == "lanczos":
        assert set(op.blocks) == {(D, 1)} and len(op.blocks) == res.n_matvecs  # Lanczos: one matvec per step
    else:
        assert op.blocks  # eigsh reached the operator through to_scipy()


def test_fit_laplace_subspace_passes_the_lanczos_budget(problem):
    from glas_sklearn.laplace import fit_laplace_subspace

    net, X, _, _ = problem
    y = torch.zeros(X.shape[0], 2, dtype=torch.float64)
    with pytest.warns(ConvergenceWarning):
        fitted = fit_laplace_subspace(net, X, y, n_components=6, noise_var=0.1, max_matvecs=7, ncv=7,
                                      tol=1e-12, random_state=0)
    assert fitted.eigen.n_matvecs == 7 and not fitted.eigen.converged


def test_roundoff_tolerance_bounds_float32_eigenvalues_of_a_rank_deficient_ggn():
    """float32 products on a GGN of rank < D: every eigenvalue (the zero ones included, which come out of either
    sign) lies within roundoff_tolerance of the dense float64 decomposition's, for Lanczos over the whole space and
    for a dense float32 eigh; and the posterior takes these eigenpairs, setting the negatives to 0."""
    from glas_sklearn.posterior import ActiveSubspacePosterior

    net = mlp(hidden=6, n_out=3, seed=0)
    X = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    G = dense_ggn(net, X, loss="cross_entropy")
    D = G.shape[0]
    exact = torch.linalg.eigvalsh(G).flip(0)  # float64 reference; rank ≤ 5 rows × 2 < D
    net32 = copy.deepcopy(net).float()
    tol = eigen.roundoff_tolerance(float(exact[0]), D, torch.float32)
    assert tol < 1e-4 * float(exact[0])  # a tolerance of round-off, not of the eigenvalues' size
    lanczos = top_eigenpairs(GGNOperator(net32, X.float(), loss="cross_entropy"), D - 1, random_state=0)
    dense32 = torch.linalg.eigh(dense_ggn(net32, X.float(), loss="cross_entropy"))
    for vals, vecs in ((lanczos.eigenvalues, lanczos.eigenvectors),
                       (dense32.eigenvalues.flip(0)[: D - 1], dense32.eigenvectors.flip(1)[:, : D - 1])):
        err = (vals.double() - exact[: D - 1]).abs().max()
        assert float(err) <= tol
        post = ActiveSubspacePosterior(net32, vals, vecs, beta=1.0)
        assert float(post.eigenvalues.min()) == 0.0
        assert float((post.eigenvalues.double() - exact[: D - 1]).abs().max()) <= tol
    # the round-off shows: zero eigenvalues come out below 0 in float32, Lanczos's beyond √ε64 λ_1 though float64
    assert float(lanczos.eigenvalues.min()) < -torch.finfo(torch.float64).eps ** 0.5 * float(exact[0])


def test_roundoff_tolerance_scales_with_dtype_size_and_largest_eigenvalue():
    t = eigen.roundoff_tolerance(2.0, 400, torch.float32)
    assert t == pytest.approx(10 * torch.finfo(torch.float32).eps * 20 * 2.0, rel=1e-12)
    assert eigen.roundoff_tolerance(2.0, 400, torch.float64) / t == pytest.approx(2.0**-52 / 2.0**-23)
    assert eigen.roundoff_tolerance(-2.0, 1600, torch.float32) == pytest.approx(2 * t)


def test_the_eigenvectors_are_stored_once():
    """Lanczos forms the eigenvectors in place in its basis and frees the rest: they hold k × D entries and no
    more, and the posterior built from them holds the same tensor (no copy)."""
    from glas_sklearn.laplace import fit_laplace_subspace

    model = mlp(n_out=1, hidden=12).float()
    X = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    fitted = fit_laplace_subspace(model, X, torch.sin(X[:, :1]), n_components=6, random_state=0)
    P = fitted.eigen.eigenvectors
    D = sum(p.numel() for p in model.parameters())
    assert P.shape == (D, 6) and P.untyped_storage().nbytes() == 6 * D * P.element_size()
    assert fitted.posterior.eigenvectors.data_ptr() == P.data_ptr()
