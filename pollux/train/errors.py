"""Typed errors of the training library.

Every error carries the offending data as attributes and a message that says what to fix, so a
launcher or a user reading a replica's log can act on it without reading this code. Invalid
arguments are `ValueError`s, misuse of the API is a `RuntimeError`, as Python code expects.
"""

from __future__ import annotations

from collections.abc import Callable

from pollux import checks


class TrainError(Exception):
    """Base class of every error raised by `pollux.train`."""


class InvalidValueError(TrainError, ValueError):
    """An argument or configuration value is invalid.

    Attributes:
        field: Name of the offending argument or field (e.g. ``"batch_config.local_bsz"``).
        problem: What is wrong with it, phrased so that the caller knows what to fix.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    @classmethod
    def of(cls, field: str) -> Callable[[checks.Problem], InvalidValueError]:
        """The error of `field` failing a shared check (`pollux.checks`'s ``error``)."""
        return lambda problem: cls(field, str(problem))


class EnvVarError(InvalidValueError):
    """An environment variable of the replica contract (docs/architecture.md §7) is malformed.

    Attributes:
        variable: Name of the environment variable.
        value: Its raw value.
    """

    def __init__(self, variable: str, value: str, problem: str) -> None:
        super().__init__(variable, f"{problem} (got {value!r})")
        self.variable = variable
        self.value = value


class CheckpointError(TrainError):
    """A checkpoint could not be written or the one on disk cannot be read.

    Attributes:
        path: The checkpoint file concerned.
        reason: What went wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"checkpoint {path}: {reason}")
        self.path = path
        self.reason = reason


class UsageError(TrainError, RuntimeError):
    """The training API was called in an order it does not support.

    Attributes:
        problem: What was done and what to do instead.
    """

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class Preempted(SystemExit):
    """Raised after a requested stop (SIGTERM) was checkpointed: the process exits with 143.

    It is a `SystemExit`, so an uncaught one ends the process with exit status 143, which the
    launcher reads as a planned restart rather than a failure (docs/architecture.md §7). Code
    that must run cleanup can catch it and re-raise.

    Attributes:
        checkpoint: Path of the checkpoint that was written, or None when checkpointing is off.
    """

    EXIT_CODE = 143

    def __init__(self, checkpoint: str | None) -> None:
        super().__init__(self.EXIT_CODE)
        self.checkpoint = checkpoint
