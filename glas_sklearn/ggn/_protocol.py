"""The curvature protocol: a symmetric D×D operator known through its products with torch blocks
(:class:`CurvatureOperator`), with checked torch products and a scipy adapter around one ``_matmat``."""

from __future__ import annotations

import abc

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator

from .._checks import check_vector

__all__ = ["CurvatureOperator"]


class CurvatureOperator(abc.ABC):
    """A symmetric D×D operator known through its products with torch blocks (the curvature protocol).

    A subclass answers the protocol's questions ``dtype`` and ``device`` (properties, or attributes it sets),
    either ``layout`` (:class:`~glas_sklearn._functional.ParameterLayout`, giving D) or its own ``shape``, and
    implements :meth:`_matmat`; the package's operators answer them with properties over their own state. It then
    gets checked torch products (:meth:`matvec`, :meth:`matmat`, ``@``) and a scipy ``LinearOperator``
    (:meth:`to_scipy`), and works with :func:`~glas_sklearn.eigen.top_eigenpairs`.

    Examples
    --------
    >>> import torch
    >>> class Diagonal(CurvatureOperator):
    ...     def __init__(self, d):
    ...         self.d, self.dtype, self.device = d, d.dtype, d.device
    ...     @property
    ...     def shape(self):
    ...         return (self.d.numel(), self.d.numel())
    ...     def _matmat(self, V):
    ...         return self.d[:, None] * V
    >>> op = Diagonal(torch.tensor([1.0, 2.0, 3.0]))
    >>> op @ torch.ones(3)
    tensor([1., 2., 3.])
    >>> op.to_scipy().matmat(np.eye(3)).diagonal()
    array([1., 2., 3.])
    """

    dtype: torch.dtype
    device: torch.device

    @property
    def shape(self) -> tuple[int, int]:
        """(D, D), with D from ``self.layout`` (subclasses without a layout override this)."""
        D = self.layout.size
        return (D, D)

    @abc.abstractmethod
    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        """A V for a detached (D, k) block V, k ≥ 1, in the operator's dtype and on its device; returns (D, k)."""

    def _products(self, V: torch.Tensor) -> torch.Tensor:
        """The one path to :meth:`_matmat`: a detached (D, k) block in, its checked (D, k) product out."""
        out = self._matmat(V.detach())
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(V.shape):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise RuntimeError(f"{type(self).__name__}._matmat returned {got} for a block of shape "
                               f"{tuple(V.shape)}; it must return a tensor of the block's shape.")
        return out

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """A v for a torch vector of length D (the operator's dtype and device)."""
        check_vector("v", v, self.shape[0], self.dtype, self.device, allow_matrix=False)
        return self._products(v.unsqueeze(1))[:, 0]

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        """A V for a D×k torch block (or a vector of length D, giving a vector)."""
        check_vector("V", V, self.shape[0], self.dtype, self.device)
        if V.ndim == 1:
            return self._products(V.unsqueeze(1))[:, 0]
        return self._products(V)

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        return self.matmat(v)

    def to_scipy(self, dtype=np.float64) -> LinearOperator:
        """A symmetric ``scipy.sparse.linalg.LinearOperator`` on numpy arrays: each of its products (a vector
        or a whole block) is one call of :meth:`_matmat`, computed in the operator's dtype and device."""
        np_dtype = np.dtype(dtype)

        def mm(x: np.ndarray) -> np.ndarray:
            x = np.asarray(x)
            t = torch.as_tensor(x.reshape(x.shape[0], -1), dtype=self.dtype).to(self.device)
            out = self._products(t)
            return out.cpu().numpy().astype(np_dtype, copy=False).reshape(x.shape)

        return LinearOperator(self.shape, matvec=mm, rmatvec=mm, matmat=mm, rmatmat=mm, dtype=np_dtype)
