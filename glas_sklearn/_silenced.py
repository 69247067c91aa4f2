"""Warnings a caller has already given, or does not want, silenced for its own thread (and asyncio task) only.

``warnings.catch_warnings`` swaps the process-global filter list: two threads inside it at once restore each other's
filters, so one thread's "ignore" can leak to the whole process or vanish under another (the warnings documentation
calls it not thread-safe). A fitted estimator is shared by serving threads, so the library never silences its own
warnings that way: the code that would warn asks :func:`is_silenced` for a named kind, and :func:`silenced` switches
kinds off in a :class:`contextvars.ContextVar`, which every thread (and task) holds on its own.

Kinds:

- ``"few_calibration_rows"``: :func:`~glas_sklearn.calibration.conformal_quantile`'s ConformalWarning that the rows
  are too few for a finite quantile (the estimators warn before training instead, once).
- ``"coverage_not_reached"``: :func:`~glas_sklearn.calibration.choose_dimension`'s CalibrationWarning (a d the user
  fixed, or a whole curve asked for).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

# The package's one rule for where a warning points (glas_sklearn/_warnings.py), here for the modules that import
# it with silenced.
from ._warnings import user_stacklevel

__all__ = ["is_silenced", "silenced", "user_stacklevel"]

KINDS = frozenset({"few_calibration_rows", "coverage_not_reached"})

_SILENCED: contextvars.ContextVar[frozenset] = contextvars.ContextVar("glas_sklearn_silenced", default=frozenset())


@contextlib.contextmanager
def silenced(*kinds: str) -> Iterator[None]:
    """Within the block, and in this thread only, the warnings of ``kinds`` (see the module's text) are not given."""
    unknown = set(kinds) - KINDS
    if unknown:
        raise ValueError(f"unknown warning kind(s) {sorted(unknown)}; known: {sorted(KINDS)}.")
    token = _SILENCED.set(_SILENCED.get() | frozenset(kinds))
    try:
        yield
    finally:
        _SILENCED.reset(token)


def is_silenced(kind: str) -> bool:
    """Whether this thread is inside :func:`silenced` for ``kind``."""
    return kind in _SILENCED.get()
