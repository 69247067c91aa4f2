"""Top eigenpairs of a symmetric positive semi-definite operator from matrix-vector products alone.

Two solvers share one result type:

- ``method="lanczos"``: thick-restart Lanczos in torch whose basis stays on the operator's device. It is
  kept orthonormal by full re-orthogonalisation (classical Gram-Schmidt, with a second pass when the first
  cancelled much of the vector); the small projected problem is solved on the host in float64 while the
  products may run in float32, so a step moves only its new column of that matrix to the host.
- ``method="eigsh"``: scipy's ARPACK ``eigsh`` on ``op.to_scipy()``.

Both reach the operator only through the :class:`~glas_sklearn.ggn.CurvatureOperator` protocol (a dense
torch matrix is wrapped in one). Either way the residual norms ‖G p − λ p‖ are reported, and scikit-learn's
``ConvergenceWarning`` is raised when they are not below ``tol · λ_1``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh
from sklearn.exceptions import ConvergenceWarning

from ._checks import check_choice, check_positive_int, make_generator
from ._progress import progress, stage
from ._warnings import warn
from .ggn import CurvatureOperator

__all__ = ["EigenResult", "roundoff_tolerance", "top_eigenpairs"]

logger = logging.getLogger(__name__)


# roundoff_tolerance: the multiple of ε √D λ_max that an eigenvalue computed from products may be off by.
_ROUNDOFF_FACTOR = 10.0


def roundoff_tolerance(largest: float, size: int, dtype: torch.dtype) -> float:
    """How far round-off may move an eigenvalue of a symmetric operator computed from products in ``dtype``.

    ``10 · ε · √size · largest``, with ε the machine epsilon of ``dtype`` (the products' dtype: float32 for a
    float32 network even when the eigenvalues are returned in float64) and ``largest`` the
    largest eigenvalue magnitude: a product of the operator with a vector of length ``size`` carries an error of
    about ε √size ‖A‖ (random round-off in sums of ``size`` terms), and by Weyl's inequality so does every
    eigenvalue of the projected matrix. An eigenvalue of a positive semi-definite operator above
    ``-roundoff_tolerance(...)`` is 0 up to round-off.

    Examples
    --------
    >>> import torch
    >>> f"{roundoff_tolerance(1.0, 10_000, torch.float32):.2e}"
    '1.19e-04'
    """
    return _ROUNDOFF_FACTOR * torch.finfo(dtype).eps * math.sqrt(max(int(size), 1)) * abs(float(largest))


@dataclass
class EigenResult:
    """Leading eigenpairs of a symmetric operator.

    Attributes
    ----------
    eigenvalues : torch.Tensor of shape (k,)
        Descending, float64, on the operator's device.
    eigenvectors : torch.Tensor of shape (D, k)
        Orthonormal columns in the operator's dtype and device; column j belongs to eigenvalue j.
    residual_norms : torch.Tensor of shape (k,)
        ‖A p_j − λ_j p_j‖ (Lanczos: the exact-arithmetic estimate ``|β_m y_mj|``; eigsh: measured).
    n_matvecs : int
        Number of operator products used.
    converged : bool
        Whether every residual is at most ``tol · λ_1``.
    method : str
    tol : float
    """

    eigenvalues: torch.Tensor
    eigenvectors: torch.Tensor
    residual_norms: torch.Tensor
    n_matvecs: int
    converged: bool
    method: str
    tol: float
    history: list = field(default_factory=list, repr=False)

    @property
    def relative_residuals(self) -> torch.Tensor:
        """Residual norms divided by the largest eigenvalue."""
        scale = float(self.eigenvalues[0].abs()) if len(self.eigenvalues) else 1.0
        return self.residual_norms / (scale if scale > 0 else 1.0)


class _DenseMatrix(CurvatureOperator):
    """A dense symmetric torch matrix behind the operator protocol."""

    def __init__(self, A: torch.Tensor) -> None:
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"A dense operator must be square, got shape {tuple(A.shape)}.")
        self.A = A.detach()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.A.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.A.dtype

    @property
    def device(self) -> torch.device:
        return self.A.device

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        return self.A @ V


def _as_operator(op) -> CurvatureOperator:
    """The operator itself, or a dense square torch matrix wrapped in the protocol."""
    if isinstance(op, CurvatureOperator):
        shape = op.shape
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(f"The operator must have a square .shape, got {shape!r}.")
        return op
    if isinstance(op, torch.Tensor):
        return _DenseMatrix(op)
    raise TypeError(
        f"op must be a CurvatureOperator (e.g. a GGNOperator) or a square torch matrix, got {type(op).__name__}; "
        "wrap other operators in a subclass of glas_sklearn.ggn.CurvatureOperator that implements _matmat."
    )


def _warn_unconverged(result: EigenResult, k: int) -> None:
    rel = result.relative_residuals
    worst = int(torch.argmax(rel))
    warn(
        f"{result.method}: the top-{k} eigenpairs did not converge after {result.n_matvecs} products: "
        f"the largest relative residual ‖Gp−λp‖/λ1 is {float(rel[worst]):.2e} (pair {worst + 1}), above "
        f"tol={result.tol:.1e}. Raise max_matvecs, ask for fewer eigenpairs (k; the estimators' "
        "posterior=LowRank(max_components=...)), or treat the trailing eigenpairs with caution.",
        ConvergenceWarning,
    )


# DGKS criterion: a second Gram-Schmidt pass only when the first removed more than 1 − 1/√2 of the norm.
_REORTH = 2.0 ** -0.5


def _orthogonalize(w: torch.Tensor, B: list[torch.Tensor]) -> tuple[torch.Tensor, np.ndarray, float]:
    """Remove from w its components along the orthonormal rows of B (blocks of rows, in order): classical
    Gram-Schmidt, repeated once when the first pass cancelled much of w (Daniel-Gragg-Kaufman-Stewart), which is
    when round-off would otherwise leave w visibly non-orthogonal to B.

    The basis is stored one vector per row, so both products read contiguous memory. The coefficients and
    the final norm are the only things that reach the host: one transfer (two after a second pass).

    Returns
    -------
    w : torch.Tensor
        The orthogonalised vector (on the device).
    coeff : numpy.ndarray of float64
        Bw summed over the passes.
    norm : float
        ‖w‖ after orthogonalisation.
    """
    def project_out(v):
        parts = [b @ v for b in B]
        for b, part in zip(B, parts, strict=True):
            v = v - b.T @ part
        return torch.cat(parts), v

    h, w1 = project_out(w)
    stats = torch.cat([h.to(torch.float64), torch.stack([torch.linalg.vector_norm(w).to(torch.float64),
                                                         torch.linalg.vector_norm(w1).to(torch.float64)])]).cpu()
    coeff, before, after = stats[:-2].numpy().copy(), float(stats[-2]), float(stats[-1])
    if after < _REORTH * before:
        h, w1 = project_out(w1)
        stats = torch.cat([h.to(torch.float64), torch.linalg.vector_norm(w1).to(torch.float64).view(1)]).cpu()
        coeff += stats[:-1].numpy()
        after = float(stats[-1])
    return w1, coeff, after


def _ritz(T: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ritz values (descending), the eigenvectors y of T and the residual norms ``|β y_last|`` (host, float64)."""
    theta, y = np.linalg.eigh(T)
    theta, y = theta[::-1].copy(), y[:, ::-1].copy()
    return theta, y, np.abs(beta * y[-1, :])


# Bytes of basis columns rotated at once in a restart (the rotation's only temporary).
_ROTATE_BYTES = 16 << 20


def _column_blocks(D: int, rows: int, element: int) -> list[slice]:
    """Slices of the D columns of a (rows, D) basis, each holding at most ``_ROTATE_BYTES``."""
    width = max(1, _ROTATE_BYTES // max(1, rows * element))
    return [slice(i, min(i + width, D)) for i in range(0, D, width)]


class _Basis:
    """The Lanczos basis, one vector per row, held in two blocks: the first k rows, where the eigenvectors are
    formed in place at the end, and the others, freed then; so the solver never holds the basis and the
    eigenvectors beside it."""

    def __init__(self, rows: int, k: int, D: int, dtype, device) -> None:
        self.k = k
        self.blocks = [torch.zeros(k, D, dtype=dtype, device=device),
                       torch.zeros(rows - k, D, dtype=dtype, device=device)]

    def __getitem__(self, j: int) -> torch.Tensor:
        return self.blocks[0][j] if j < self.k else self.blocks[1][j - self.k]

    def __setitem__(self, j: int, value: torch.Tensor) -> None:
        self[j].copy_(value)

    def leading(self, n: int) -> list[torch.Tensor]:
        """Rows 0 … n − 1, as views of the blocks."""
        return [self.blocks[0][:min(n, self.k)], self.blocks[1][:max(0, n - self.k)]]

    def rotate(self, Y: torch.Tensor, size: int) -> None:
        """Rows 0 … n − 1 ← Yᵀ (rows 0 … size − 1) for the (size, n) Ritz coefficients Y, a block of columns at a
        time (the temporary is one block of n rows)."""
        n = Y.shape[1]
        first = self.leading(size)
        coeffs = [c.T for c in torch.split(Y, [b.shape[0] for b in first])]
        blocks = _column_blocks(self.blocks[0].shape[1], n, self.blocks[0].element_size())
        buffer = torch.empty(n, blocks[0].stop, dtype=Y.dtype, device=Y.device)  # the one temporary, reused
        for cols in blocks:
            new = buffer[:, :cols.stop - cols.start]
            torch.mm(coeffs[0], first[0][:, cols], out=new)
            if first[1].shape[0]:
                new.addmm_(coeffs[1], first[1][:, cols])
            for b, part in zip(self.leading(n), torch.split(new, [min(n, self.k), max(0, n - self.k)]), strict=True):
                b[:, cols] = part

    def eigenvectors(self, Y: torch.Tensor, size: int) -> torch.Tensor:
        """The Ritz vectors Yᵀ (rows 0 … size − 1), k at most, formed in place in the first block, as columns of a
        (D, n) view; the other block is freed."""
        self.rotate(Y, size)
        head = self.blocks[0][:Y.shape[1]]
        self.blocks = [head, head[:0]]
        return head.T


def _lanczos(matvec, D: int, k: int, dtype, device, *, tol: float, max_matvecs: int, ncv: int,
             generator: torch.Generator, v0: torch.Tensor | None, bar=None) -> EigenResult:
    """Thick-restart Lanczos for the k largest eigenpairs of a symmetric PSD operator.

    The basis lives on the operator's device; the small projected matrix T lives on the host in float64,
    so each step moves only the j + 1 new entries of T and β there (the stopping test needs them), and the
    vectors never leave the device. Memory: the basis, ncv + 1 vectors of length D in the operator's dtype,
    rotated in place at a restart (in column blocks of at most 16 MiB); at the end the k eigenvectors are
    formed in place in its first k rows and the others freed, so the peak is (ncv + 1) D entries plus the
    product's own few D-vectors."""
    m = min(ncv, D)
    B = _Basis(m + 1, k, D, dtype, device)  # basis vectors as rows, plus the residual direction
    T = np.zeros((m, m))  # projected matrix VᵀAV (host, float64)

    def random_direction():
        r = torch.randn(D, generator=generator, dtype=torch.float64, device=generator.device)
        return r.to(device, dtype)

    v = random_direction() if v0 is None else v0.to(device, dtype).clone()
    B[0] = v / torch.linalg.vector_norm(v)
    n_matvecs = 0
    history = []
    beta = 0.0
    j = 0
    tiny = np.finfo(np.float64).tiny
    while True:
        # Extend the basis from column j to m by Lanczos steps with full re-orthogonalisation.
        while j < m:
            w = matvec(B[j])
            n_matvecs += 1
            if bar is not None:
                bar.update(1)
            w, h, beta = _orthogonalize(w, B.leading(j + 1))
            T[: j + 1, j] = h
            T[j, : j + 1] = h
            if j + 1 >= D:  # the basis spans the whole space: the projection is exact
                beta = 0.0
            elif beta <= 1e-12 * max(1.0, float(np.abs(np.diag(T)[: j + 1]).max())):
                # Invariant subspace found: continue from a fresh random direction.
                r, _, r_norm = _orthogonalize(random_direction(), B.leading(j + 1))
                B[j + 1] = r / r_norm
                beta = 0.0
            else:
                B[j + 1] = w / beta
            j += 1
            if n_matvecs >= max_matvecs:
                break
            if j >= k:
                theta, _, res = _ritz(T[:j, :j], beta)
                if (res[:k] <= tol * max(abs(theta[0]), tiny)).all():
                    break
        size = j
        theta, y, res = _ritz(T[:size, :size], beta)
        kk = min(k, size)
        scale = max(abs(theta[0]), tiny)
        done = bool((res[:kk] <= tol * scale).all()) and kk == k
        history.append((n_matvecs, float(res[:kk].max() / scale)))
        if done or n_matvecs >= max_matvecs or size >= D or beta == 0.0 and size >= m:
            break
        # Thick restart: keep the leading Ritz vectors, continue from the residual direction.
        n_kept = min(size - 1, max(k + (m - k) // 2, k + 1))
        Y = torch.as_tensor(y[:, :n_kept], dtype=dtype, device=device)
        B.rotate(Y, size)
        B[n_kept] = B[size]
        T[:] = 0.0
        T[:n_kept, :n_kept] = np.diag(theta[:n_kept])
        # The coupling of the kept vectors to column n_kept is recomputed by its own product.
        j = n_kept
    kk = min(k, size)
    Y = torch.as_tensor(y[:, :kk], dtype=dtype, device=device)
    vecs = B.eigenvectors(Y, size)  # (D, k), each eigenvector contiguous in memory
    return EigenResult(
        eigenvalues=torch.as_tensor(theta[:kk].copy(), dtype=torch.float64, device=device),
        eigenvectors=vecs,
        residual_norms=torch.as_tensor(res[:kk].copy(), dtype=torch.float64, device=device),
        n_matvecs=n_matvecs,
        converged=bool((res[:kk] <= tol * max(abs(theta[0]), 1e-300)).all()) and kk == k,
        method="lanczos",
        tol=tol,
        history=history,
    )


def _eigsh(op: CurvatureOperator, D: int, k: int, dtype, device, *, tol: float, max_matvecs: int, ncv: int,
           generator: torch.Generator, v0: torch.Tensor | None, bar=None) -> EigenResult:
    lin = op.to_scipy()
    counter = {"n": 0}

    def mv(x):
        step = 1 if x.ndim == 1 else x.shape[1]
        counter["n"] += step
        if bar is not None:
            bar.update(step)
        return lin.matvec(x)

    counted = LinearOperator((D, D), matvec=mv, rmatvec=mv, dtype=np.float64)
    if v0 is None:
        v0 = torch.randn(D, generator=generator, dtype=torch.float64, device=generator.device)
    start = v0.detach().cpu().double().numpy()
    # ARPACK's own tolerance is relative to each Ritz value; ask for a bit more than we check.
    try:
        vals, vecs = eigsh(counted, k=k, which="LA", tol=tol / 10, ncv=min(D, ncv), v0=start,
                           maxiter=max(1, max_matvecs))
    except ArpackNoConvergence as err:
        vals, vecs = err.eigenvalues, err.eigenvectors
        if len(vals) == 0:
            vals, vecs = np.zeros(0), np.zeros((D, 0))
    n_solver = counter["n"]
    order = np.argsort(vals)[::-1]
    vals, vecs = vals[order], vecs[:, order]
    P = torch.as_tensor(np.ascontiguousarray(vecs), dtype=dtype, device=device)
    # Residuals are measured (k extra products, not counted in n_matvecs: ARPACK reports none).
    if P.shape[1]:
        AP = lin.matmat(vecs)
        res = np.linalg.norm(AP - vecs * vals, axis=0)
    else:
        res = np.zeros(0)
    lam = torch.as_tensor(vals.copy(), dtype=torch.float64, device=device)
    scale = max(abs(vals[0]), 1e-300) if len(vals) else 1.0
    return EigenResult(
        eigenvalues=lam,
        eigenvectors=P,
        residual_norms=torch.as_tensor(res, dtype=torch.float64, device=device),
        n_matvecs=n_solver,
        converged=len(vals) == k and bool((res <= tol * scale).all()),
        method="eigsh",
        tol=tol,
    )


def _finished_line(result: EigenResult, k: int, D: int, seconds: float) -> str:
    """The solver's one line, e.g. "lanczos: 50 eigenpairs of a 2,951-dimensional operator in 97 products,
    1.2 s, converged (largest relative residual 3.1e-06)"."""
    worst = float(result.relative_residuals.max()) if len(result.eigenvalues) else 0.0
    state = "converged" if result.converged else f"NOT converged (tol {result.tol:.0e})"
    found = len(result.eigenvalues)
    pairs = f"{found} eigenpairs" if found == k else f"{found} of {k} eigenpairs"
    return (f"{result.method}: {pairs} of a {D:,}-dimensional operator in {result.n_matvecs} products, "
            f"{seconds:.1f} s, {state} (largest relative residual {worst:.1e})")


def top_eigenpairs(op, k: int, *, method: str = "lanczos", tol: float = 1e-5,
                   max_matvecs: int | None = None, ncv: int | None = None, random_state=None,
                   v0: torch.Tensor | None = None, verbose: int = 0) -> EigenResult:
    """The ``k`` largest eigenpairs of a symmetric positive semi-definite operator.

    Parameters
    ----------
    op : CurvatureOperator or torch.Tensor
        A :class:`~glas_sklearn.ggn.CurvatureOperator` of shape (D, D) (e.g. a GGNOperator or a
        DistributedGGNOperator), or a dense symmetric torch matrix. Lanczos calls ``op.matvec``, eigsh
        ``op.to_scipy()``.
    k : int
        Number of eigenpairs, 1 ≤ k < D (for the GGN, D is the number of trainable weights).
    method : {"lanczos", "eigsh"}, default="lanczos"
    tol : float, default=1e-5
        Converged when every residual ‖A p − λ p‖ ≤ tol · λ_1.
    max_matvecs : int, optional
        Budget of products (default: max(20 k, 200)).
    ncv : int, optional
        Largest basis size between restarts (default: max(2k + 10, k + 20) for Lanczos, ARPACK's
        max(2k + 1, 20) for eigsh; capped at D). It bounds the solver's memory: Lanczos holds at most
        ncv + 1 vectors of length D in the operator's dtype (the parameters' dtype for a GGN: float32 for
        LoRA adapters), max(2k + 11, k + 21) of them by default, and forms the eigenvectors in place among them;
        the projected problem is solved in float64 on the
        host. eigsh keeps its own float64 basis of ncv vectors on the host.
    random_state : int, Generator or None
        Seeds the start vector.
    v0 : torch.Tensor, optional
        Start vector (overrides ``random_state``).
    verbose : int, default=0
        ≥ 1 shows a progress bar counting operator products (in a file or pipe: a line every 30 s) and, at the
        end, one line with the eigenpairs found, the products, the time and convergence (logged at INFO level
        whatever ``verbose``).

    Returns
    -------
    EigenResult
        Eigenvalues (descending), orthonormal eigenvectors, residual norms, number of products and a
        convergence flag. A ``sklearn.exceptions.ConvergenceWarning`` is issued when not converged.

    Examples
    --------
    >>> import torch
    >>> A = torch.diag(torch.arange(1.0, 101.0, dtype=torch.float64))
    >>> res = top_eigenpairs(A, 3, random_state=0)
    >>> [round(float(x), 6) for x in res.eigenvalues]
    [100.0, 99.0, 98.0]
    """
    method = check_choice("method", method, ("lanczos", "eigsh"))
    op = _as_operator(op)
    D, dtype, device = op.shape[0], op.dtype, op.device
    k = check_positive_int("k", k)
    if k >= D:
        raise ValueError(
            f"k={k} eigenpairs requested (n_components={k} in fit_laplace_subspace and the estimators), but the "
            f"operator has dimension D={D} (the number of trainable weights); k must be < D: ask for at most "
            f"{D - 1} eigenpairs, or use a larger network."
        )
    if not (isinstance(tol, (int, float)) and 0 < tol < 1):
        raise ValueError(f"tol must be a float in (0, 1), got {tol!r}.")
    max_matvecs = check_positive_int("max_matvecs", max_matvecs if max_matvecs is not None else max(20 * k, 200))
    if ncv is None:  # ARPACK's own default for eigsh, a wider basis for our Lanczos
        ncv = max(2 * k + 1, 20) if method == "eigsh" else max(2 * k + 10, k + 20)
    ncv = min(check_positive_int("ncv", ncv, minimum=k + 1), D)
    gen = make_generator(random_state, "cpu")
    solver = _lanczos if method == "lanczos" else _eigsh
    target = op.matvec if method == "lanczos" else op
    t0 = time.perf_counter()
    with progress(desc=f"{method}: top-{k} eigenpairs", unit=" products", verbose=verbose, leave=False) as bar:
        result = solver(target, D, k, dtype, device, tol=tol, max_matvecs=max_matvecs, ncv=ncv,
                        generator=gen, v0=v0, bar=bar)
    stage(_finished_line(result, k, D, time.perf_counter() - t0), verbose=verbose, logger=logger)
    if not result.converged:
        _warn_unconverged(result, k)
    return result
