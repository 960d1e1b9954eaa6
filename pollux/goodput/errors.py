"""Typed errors of the goodput model.

Every invalid input raises `InvalidInputError` naming the offending field and what is wrong with
it, so a service can turn it into INVALID_ARGUMENT with a message the user can act on. NaN and
infinity are rejected at the boundary; they never propagate into a result silently.
"""

from __future__ import annotations


class GoodputError(Exception):
    """Base class of every error raised by `pollux.goodput`."""


class InvalidInputError(GoodputError, ValueError):
    """An input to the goodput model is invalid.

    Attributes:
        field: Name of the offending argument or dataclass field (e.g. ``"grad.sqr"``).
        problem: What is wrong with it, phrased so that the caller knows what to fix.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class FitError(GoodputError):
    """Fitting the throughput model failed from every starting point.

    Attributes:
        attempts: Number of optimiser starts that were tried.
        reason: The last optimiser message.
    """

    def __init__(self, attempts: int, reason: str) -> None:
        super().__init__(f"throughput fit failed after {attempts} start(s): {reason}")
        self.attempts = attempts
        self.reason = reason
