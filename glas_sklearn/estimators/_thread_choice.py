"""The estimators' torch intra-op thread count: the one a method runs with (``n_threads``, or what fit chose), and
fit's choice for "auto" from the network's size and the rows per batch."""

from __future__ import annotations

import numbers

from torch import nn

from .._threads import adjust_threads, auto_threads

__all__ = ["ThreadChoiceMixin"]


class ThreadChoiceMixin:
    """``n_threads`` resolved, for ``LaplaceActiveSubspaceBase`` (whose methods run under
    :func:`~glas_sklearn._threads.scoped_threads`, which asks :meth:`_thread_count`)."""

    def _thread_count(self) -> int | None:
        """torch's intra-op threads for the current call (see ``n_threads``): the given count, None (torch's
        setting left alone), or for "auto" the count the last fit chose (``n_threads_``), one before fit has seen
        the network."""
        n = getattr(self, "n_threads", "auto")  # estimators pickled before n_threads: "auto"
        if n is None or (isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1):
            return n
        return getattr(self, "n_threads_", None) or 1

    def _choose_threads(self, module: nn.Module, n_rows: int) -> None:
        """``n_threads_`` for the network about to be trained (or used, prefit), and the running fit's count set to
        it: "auto" by :func:`~glas_sklearn._threads.auto_threads` of the trainable weights × rows per batch."""
        if self.n_threads == "auto":
            n_weights = sum(p.numel() for p in module.parameters() if p.requires_grad)
            self.n_threads_ = auto_threads(n_weights, min(self._batch_size(n_rows) or n_rows, n_rows))
        else:
            self.n_threads_ = self.n_threads
        if self.n_threads_ is not None:
            adjust_threads(self.n_threads_)
