"""The torch intra-op thread count during the estimators' own calls: chosen for the work, scoped, restored.

A small network gains nothing from intra-op threads: each operation is too short to be split, and when the
cores are shared with other work, a thread that the operating system has descheduled holds up the others at
every operation's barrier (the README example took 7–10× its one-thread time on two busy cores). A large
network's operations are long enough to split. :func:`auto_threads` chooses by the work of one training step,
the number of trainable weights times the rows of a batch (docs/benchmarks/studies.md#threads-under-load); the
estimators apply it with :func:`torch_threads` around ``fit``, ``predict``, ``predict_interval`` and their other
public methods, and ``n_threads=`` overrides it.

``torch.set_num_threads`` changes a process-wide setting (and, with OpenMP, the calling thread's own), while a
fitted estimator may be called from several threads at once (one estimator served by a thread pool, or several
estimators). The scope is therefore shared and reference-counted under a lock: the first call to enter sets the
count and the last to leave restores the count that was there before; calls that enter while others run use
the count already set (a call on another thread sets it for its own thread, to the same value, so nothing
changes under the running calls); nested calls (``GridSearchCV`` → ``fit`` → ``score``) simply nest. Only a
call that is alone in the scope may change the count (:func:`adjust_threads`, used by ``fit`` once the network's
size is known).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

import torch

__all__ = ["AUTO_WORK_PER_THREAD", "adjust_threads", "auto_threads", "available_threads", "scoped_threads",
           "torch_threads"]

AUTO_WORK_PER_THREAD = 2**26
"""Weights × rows per batch of work per thread for ``n_threads="auto"``: below it one thread (measured in
docs/benchmarks/studies.md#threads-under-load, where a second thread starts to pay off on an idle machine)."""

_lock = threading.Lock()
_state = {"depth": 0, "saved": None, "active": None}
_local = threading.local()


def auto_threads(n_weights: int, rows_per_batch: int, available: int | None = None) -> int:
    """The intra-op thread count for ``n_threads="auto"``: one per whole ``AUTO_WORK_PER_THREAD`` (2²⁶) of
    weights × rows per batch, at least 1 and at most ``available`` (one thread below 2²⁷: about two million
    weights at 64 rows per batch).

    Parameters
    ----------
    n_weights : int
        Trainable weights of the network.
    rows_per_batch : int
        Rows the network takes per step (the training batch).
    available : int, optional
        The most threads to use (default: :func:`available_threads`, torch's count before the scope began, so a
        count the user lowered, e.g. with ``OMP_NUM_THREADS`` or ``torch.set_num_threads``, is never raised).

    Returns
    -------
    int

    Examples
    --------
    >>> auto_threads(3_000, 64, available=8)       # the default MLP on a table: one thread
    1
    >>> auto_threads(3_000_000, 64, available=8)   # three million weights: two threads
    2
    >>> auto_threads(10**8, 64, available=8)       # a hundred million: every thread available
    8
    """
    available = available_threads() if available is None else available
    work = max(0, int(n_weights)) * max(1, int(rows_per_batch))
    return int(max(1, min(int(available), work // AUTO_WORK_PER_THREAD)))


def available_threads() -> int:
    """torch's intra-op thread count outside the estimators' scope: the count saved by the scope's first call
    while one runs, ``torch.get_num_threads()`` otherwise.

    Returns
    -------
    int
    """
    with _lock:
        saved = _state["saved"]
    return int(saved) if saved is not None else torch.get_num_threads()


def _own_count(n: int) -> None:
    """Set the calling thread's count to the active n (writes the same value to the process-wide setting)."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` inside the block and restored after it, safely under
    concurrent and nested use (see the module's description).

    Parameters
    ----------
    n : int or None
        Threads while the block runs; None leaves torch's setting alone. When other calls are already inside a
        scope, theirs is kept.

    Examples
    --------
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> with torch_threads(1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
    """
    if n is None:
        yield
        return
    with _lock:
        if _state["depth"] == 0:
            _state["saved"], _state["active"] = torch.get_num_threads(), int(n)
        _state["depth"] += 1
        _local.depth = getattr(_local, "depth", 0) + 1
        _own_count(_state["active"])
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            _local.depth -= 1
            if _state["depth"] == 0:
                torch.set_num_threads(_state["saved"])
                _state["saved"] = _state["active"] = None


def adjust_threads(n: int) -> bool:
    """Change the count of the scope the caller is in, when no other call shares it.

    Parameters
    ----------
    n : int

    Returns
    -------
    bool
        Whether the count was changed (False when other calls are inside the scope, or the caller is not in
        one).
    """
    with _lock:
        if _state["depth"] != 1 or getattr(_local, "depth", 0) != 1:
            return False
        _state["active"] = int(n)
        _own_count(int(n))
        return True


def scoped_threads(method: Callable) -> Callable:
    """Decorate an estimator method to run under :func:`torch_threads` with the estimator's
    ``_thread_count()``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with torch_threads(self._thread_count()):
            return method(self, *args, **kwargs)

    return wrapper
