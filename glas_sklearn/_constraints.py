"""Declarative hyperparameter constraints, checked by one function at fit.

Each estimator class holds ``_parameter_constraints``, a dict parameter name → list of allowed forms (any one
suffices): ``None``, an :class:`Options` of values, an :class:`Interval` of numbers, an :class:`InstanceOf` or a
:class:`Satisfies` predicate. :func:`validate_hyperparameters` checks every constructor parameter against it
and names the parameter, the allowed forms and the value it got.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.utils import check_scalar

__all__ = ["BOOLEAN", "InstanceOf", "Interval", "NO_VALIDATION", "Options", "Satisfies", "check_settings",
           "validate_hyperparameters"]


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@dataclass(frozen=True, init=False)
class Options:
    """One of the given values (strings, usually)."""

    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", tuple(values))

    def is_satisfied_by(self, value) -> bool:
        return isinstance(value, str) and value in self.values

    def __str__(self) -> str:
        return _join([repr(v) for v in self.values])


@dataclass(frozen=True)
class Interval:
    """A finite number of ``kind`` (``numbers.Integral`` or ``numbers.Real``, never a bool) between ``low`` and
    ``high`` (None: unbounded); ``closed`` as ``include_boundaries`` of :func:`sklearn.utils.check_scalar`."""

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "both"

    def is_satisfied_by(self, value) -> bool:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, self.kind):
            return False
        if not isinstance(value, numbers.Integral) and not np.isfinite(value):
            return False
        try:
            check_scalar(value, "value", self.kind, min_val=self.low, max_val=self.high,
                         include_boundaries=self.closed)
        except (TypeError, ValueError):
            return False
        return True

    def __str__(self) -> str:
        kind = "an int" if self.kind is numbers.Integral else "a finite float"
        left = self.closed in ("left", "both")
        right = self.closed in ("right", "both")
        if self.low is not None and self.high is not None:
            return f"{kind} in {'[' if left else '('}{self.low}, {self.high}{']' if right else ')'}"
        if self.low is not None:
            return f"{kind} {'>=' if left else '>'} {self.low}"
        if self.high is not None:
            return f"{kind} {'<=' if right else '<'} {self.high}"
        return kind


@dataclass(frozen=True)
class InstanceOf:
    """An instance of ``types``, described as ``description``."""

    types: type | tuple
    description: str

    def is_satisfied_by(self, value) -> bool:
        return isinstance(value, self.types)

    def __str__(self) -> str:
        return self.description


@dataclass(frozen=True)
class Satisfies:
    """Any value for which ``predicate`` returns True, described as ``description``."""

    predicate: Callable[[object], bool]
    description: str

    def is_satisfied_by(self, value) -> bool:
        return bool(self.predicate(value))

    def __str__(self) -> str:
        return self.description


BOOLEAN = InstanceOf((bool, np.bool_), "True or False")
# The parameter is checked where it is used (e.g. ``module`` when the network is built).
NO_VALIDATION = "no_validation"


def _satisfied(constraint, value) -> bool:
    return value is None if constraint is None else constraint.is_satisfied_by(value)


def check_settings(obj, owner: str | None = None, prefix: str = "") -> None:
    """Check every constructor parameter of ``obj`` (an estimator or a settings object) against its class's
    ``_parameter_constraints``.

    Raises
    ------
    ValueError
        Naming ``owner`` (default: the class), the parameter (after ``prefix``, e.g. ``training__lr``), what is
        allowed and the value received, for the first parameter (as ``get_params`` lists them) that satisfies none
        of its constraints.
    RuntimeError
        When a constructor parameter has no entry in the table (a programming error).
    """
    name = type(obj).__name__ if owner is None else owner
    table = type(obj)._parameter_constraints
    for param, value in obj.get_params(deep=False).items():
        if param not in table:
            raise RuntimeError(f"{name}: the constructor parameter {param!r} has no entry in _parameter_constraints.")
        constraints = table[param]
        if constraints == NO_VALIDATION or any(_satisfied(c, value) for c in constraints):
            continue
        words = []  # one flat list, so that options and other forms read "'a', 'b' or an int >= 1"
        for c in constraints:
            words += [repr(v) for v in c.values] if isinstance(c, Options) else ["None" if c is None else str(c)]
        allowed = _join(words)
        raise ValueError(f"{name}: {prefix}{param} must be {allowed}, got {value!r}.")


def validate_hyperparameters(estimator) -> None:
    """:func:`check_settings` of an estimator, named by its class."""
    check_settings(estimator)
