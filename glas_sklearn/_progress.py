"""Progress bars for long work: live in a terminal, a few lines in a log, silent with ``verbose=0``."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

__all__ = ["progress", "LOG_INTERVAL"]

LOG_INTERVAL = 30.0
"""Seconds between two updates when the bar writes to a file or pipe rather than a terminal."""


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _LogBar(tqdm):
    """A bar for a file or pipe: a new postfix or description is shown with the next timed update (at most one
    per ``mininterval``) and at close, instead of redrawing the bar on every call."""

    def set_postfix(self, ordered_dict=None, refresh=False, **kwargs):
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s="", refresh=False):
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc=None, refresh=False):
        super().set_description(desc, refresh=False)

    def set_description_str(self, desc=None, refresh=False):
        super().set_description_str(desc, refresh=False)


def progress(iterable=None, *, verbose: int | bool = 1, **kwargs: Any) -> tqdm:
    """A tqdm bar that stays readable in non-interactive logs.

    In a terminal the bar updates live (tqdm's defaults). When the stream (standard error unless ``file=`` is
    given) is a file or a pipe (CI, ``make demo 2> log``), the bar is redrawn at most every ``LOG_INTERVAL``
    seconds and ``set_postfix`` / ``set_description`` do not redraw it, so a log holds its first and last state
    and one line per half minute instead of one per update. ``verbose=0`` (or False) silences it.

    Parameters
    ----------
    iterable : iterable, optional
        What to iterate over (or None for a manually updated bar).
    verbose : int or bool, default=1
        0 or False: no bar.
    **kwargs
        Passed to ``tqdm`` (``desc``, ``total``, ``unit``, ``leave`` …); an explicit ``mininterval`` wins.

    Returns
    -------
    tqdm
        The bar (disabled when ``verbose`` is falsy).
    """
    file = kwargs.get("file", sys.stderr)
    if _is_terminal(file):
        return tqdm(iterable, disable=not verbose, **kwargs)
    kwargs.setdefault("mininterval", LOG_INTERVAL)
    kwargs.setdefault("maxinterval", max(LOG_INTERVAL, kwargs["mininterval"]))
    return _LogBar(iterable, disable=not verbose, **kwargs)
