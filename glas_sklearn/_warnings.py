"""Where the package's warnings point: at the user's line, whichever public function led there.

A warning raised deep in a fit or a predict (a calibrator's quantile, the eigensolver, a prefit check) is about the
call the user made, so it names the user's file and line, not a file of this package. One rule for every warning
of the package: :func:`warn` (or ``warnings.warn(..., stacklevel=user_stacklevel())`` where a module already
imports ``warnings``) reports the first frame outside the package's files, the user's call or the library (such as
scikit-learn's ``cross_validate``) that made it. ``tests/test_warnings.py`` checks that every ``warnings.warn`` in
the package follows it.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["user_stacklevel", "warn"]

# The package's folder: frames of files inside it are the package's own.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _is_package_file(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the function that calls this: the first frame outside the
    package's files (the user's call, or the library that called the package), so that the warning points at the
    user's line whichever public method led there."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _is_package_file(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` at the first frame outside the package (:func:`user_stacklevel`).

    The message says what happened and names the parameter that changes it (e.g. ``calibration_size``)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
