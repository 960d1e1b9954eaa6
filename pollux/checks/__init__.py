"""Checks of single values, worded once: whole numbers, finite real numbers, strings.

Every module that takes a number or a string from a caller, a file or the network checks it
here and raises its own error with the `Problem` found (the `error` argument), so that one
mistake reads the same wherever it is made: `Problem.requirement` says what the value must be
("must be a whole number ≥ 1"), and ``str(problem)`` adds what it was ("…, got str '4'").
A boolean is never a number (``True`` is an int to Python, and a mistake to a user).
Array checks of the goodput model live beside it (`pollux.goodput._validate`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import NoReturn

from pollux.terminal import quoted


class Problem(ValueError):
    """What a value must be, and the value that is not."""

    def __init__(self, requirement: str, value: object) -> None:
        super().__init__(f"{requirement}, got {described(value)}")
        self.requirement = requirement
        self.value = value


ErrorOf = Callable[[Problem], Exception]
"""Makes the caller's own error of a problem (``lambda p: InvalidInputError(field, str(p))``)."""


def described(value: object) -> str:
    """``str '4'``, ``float 1.5``, ``bool True``, ``list``, ``nothing``: a value in a message."""
    if value is None:
        return "nothing"
    kind = type(value).__name__
    if isinstance(value, str):
        return f"{kind} {quoted(value)}"
    if isinstance(value, numbers.Number):
        return f"{kind} {value!r}"
    return kind


def _fail(requirement: str, value: object, error: ErrorOf | None) -> NoReturn:
    problem = Problem(requirement, value)
    raise problem if error is None else error(problem) from None


def _requirement(what: str, least: float | None, most: float | None, above: float | None) -> str:
    bounds = [
        f"> {above:g}" if above is not None else "",
        f"≥ {least:g}" if least is not None else "",
    ]
    bounds.append(f"≤ {most:g}" if most is not None else "")
    said = " and ".join(b for b in bounds if b)
    return f"must be {what}" + (f" {said}" if said else "")


def whole_number(
    value: object,
    *,
    least: int | None = None,
    most: int | None = None,
    reals: bool = False,
    error: ErrorOf | None = None,
) -> int:
    """`value` as an int, in [`least`, `most`] where given.

    Args:
        value: What was given.
        least: The smallest value allowed.
        most: The largest value allowed.
        reals: Take any integer-valued real number too (``2.0``, ``numpy.int64(2)``), for
            values computed rather than typed.
        error: Makes the error raised; `Problem` itself when None.
    """
    number: int | None = None
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
        number = int(value)
    elif reals and not isinstance(value, bool):
        if isinstance(value, numbers.Integral):
            number = int(value)
        elif isinstance(value, numbers.Real) and float(value).is_integer():
            number = int(float(value))
    if (
        number is None
        or (least is not None and number < least)
        or (most is not None and number > most)
    ):
        _fail(_requirement("a whole number", least, most, None), value, error)
    return number


def real_number(
    value: object,
    *,
    above: float | None = None,
    least: float | None = None,
    most: float | None = None,
    error: ErrorOf | None = None,
) -> float:
    """`value` as a finite float, > `above`, ≥ `least` and ≤ `most` where given."""
    if type(value) is float or type(value) is int:  # the common case, without ABC checks
        real = float(value)
    else:
        real = math.nan if isinstance(value, bool) else _as_float(value)
    if (
        not math.isfinite(real)
        or (above is not None and real <= above)
        or (least is not None and real < least)
        or (most is not None and real > most)
    ):
        _fail(_requirement("a finite number", least, most, above), value, error)
    return real


def _as_float(value: object) -> float:
    return float(value) if isinstance(value, numbers.Real) else math.nan


def text(value: object, *, non_empty: bool = False, error: ErrorOf | None = None) -> str:
    """`value` as a string (not empty, when `non_empty`)."""
    requirement = "must be a non-empty string" if non_empty else "must be a string"
    if not isinstance(value, str) or (non_empty and not value):
        _fail(requirement, value, error)
    return value
