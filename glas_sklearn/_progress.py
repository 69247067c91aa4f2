"""Progress for long work: a live bar in a terminal, plain lines in a log, silent with ``verbose=0``.

In a terminal a tqdm bar is redrawn in place. In a file or pipe (CI, ``make demo 2> log``, a job scheduler) there
are no carriage returns: a long stage writes one plain line per ``LOG_INTERVAL`` seconds, and every finished
stage one line with its time and key figures (:func:`stage`), so a log reads top to bottom.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm import tqdm

__all__ = ["progress", "stage", "LOG_INTERVAL"]

LOG_INTERVAL = 30.0
"""Seconds between two lines of a stage still running, when the output is a file or pipe rather than a terminal."""


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _LogBar(tqdm):
    """A bar for a file or pipe: nothing at its start; while it runs one plain line, ending in a newline, per
    timed update (at most one per ``mininterval``), a new postfix or description shown with the next such line;
    at its end its final state as one more line with ``leave=True`` (tqdm's default), nothing with
    ``leave=False`` (whose caller reports the finished stage with :func:`stage`)."""

    def __init__(self, *args, **kwargs):
        self._final_line = kwargs.get("leave", True) is not False
        kwargs["leave"] = False  # tqdm's close then only asks to clear the line: see display
        known = kwargs.get("total") is not None or hasattr(args[0] if args else kwargs.get("iterable"), "__len__")
        kwargs["unit"] = " " + str(kwargs.get("unit", "it")).strip()  # "3/5 it", "97 products"
        kwargs.setdefault("bar_format", "{desc}: {n_fmt}/{total_fmt}{unit} [{elapsed}<{remaining}{postfix}]"
                          if known else "{desc}: {n_fmt}{unit} [{elapsed}{postfix}]")
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        closing = msg == ""
        if self.n == 0 or (closing and not self._final_line) or (msg and not closing):
            return False  # the opening state, or a bar closing without a final line
        self.fp.write(self.__str__() + "\n")
        self.fp.flush()
        return not closing  # True at close would make tqdm write a carriage return

    def set_postfix(self, ordered_dict=None, refresh=False, **kwargs):
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s="", refresh=False):
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc=None, refresh=False):
        super().set_description_str(desc, refresh=False)  # the line format adds the colon

    def set_description_str(self, desc=None, refresh=False):
        super().set_description_str(desc, refresh=False)


def progress(iterable=None, *, verbose: int | bool = 1, **kwargs: Any) -> tqdm:
    """A tqdm bar that stays readable in non-interactive logs.

    In a terminal the bar updates live (tqdm's defaults). When the stream (standard error unless ``file=`` is
    given) is a file or a pipe, no carriage return is ever written and nothing at the bar's start: while it
    runs, one plain line per ``LOG_INTERVAL`` seconds (``set_postfix`` / ``set_description`` show with the next
    one), and at its end one line with its final state, unless ``leave=False``, whose caller reports the
    finished stage with :func:`stage`. ``verbose=0`` (or False) silences it.

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


def stage(message: str, *, verbose: int | bool = 1, logger: logging.Logger | None = None, file=None) -> None:
    """One line for a finished stage (e.g. ``"lanczos: 50 eigenpairs in 97 products, 1.2 s, converged"``).

    Written to the stream (standard error unless ``file`` is given) when ``verbose`` is truthy, above any live
    bar in a terminal, and logged at INFO level on ``logger`` whatever ``verbose`` (shown only where the
    application configures logging).

    Parameters
    ----------
    message : str
        The line, without a trailing newline.
    verbose : int or bool, default=1
        0 or False: not written (still logged).
    logger : logging.Logger, optional
        Where to log it.
    file : file-like, optional
        The stream (default ``sys.stderr``, looked up at each call).
    """
    if logger is not None:
        logger.info("%s", message)
    if verbose:
        tqdm.write(message, file=sys.stderr if file is None else file)
