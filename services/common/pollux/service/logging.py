"""structlog set-up, once per process.

JSON lines when stderr is not a terminal (what log collectors want), a readable console format
when it is. Context (job_id, node_id, round, role) is bound at the edges with
`structlog.contextvars.bound_contextvars`, so every line of a unit of work carries it.

A line that cannot be written (stderr is a file on a full disk: ENOSPC) is dropped, never
raised into the code that logged it: a full log disk must not fail RPCs or rounds. The drop is
surfaced instead: `pollux_log_lines_dropped{reason}`, a warning in `LOG_HEALTH.warnings()`
(scheduler replicas put it in ClusterStatus), and one ``log_lines_dropped`` line once writing
works again.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import sys
from typing import Any, TextIO

import prometheus_client
import structlog

DROPPED = prometheus_client.Counter(
    "pollux_log_lines_dropped",
    "Log lines this process could not write (a full disk: ENOSPC), by error.",
    ["reason"],
)


class LogHealth:
    """Whether this process's log lines are being written, and how many were dropped."""

    def __init__(self) -> None:
        self.dropped = 0
        """Lines dropped since writing last worked."""
        self.reason = ""
        """The error of the last failed write ("ENOSPC")."""
        self.since = ""
        """When the first of the dropped lines was (ISO 8601, UTC)."""

    def failed(self, error: OSError) -> None:
        """Count a line that could not be written."""
        reason = errno.errorcode.get(error.errno or 0, type(error).__name__)
        DROPPED.labels(reason).inc()
        if not self.dropped:
            self.since = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.dropped += 1
        self.reason = reason

    def warnings(self) -> list[str]:
        """One line while lines are being dropped (for a status's warnings); else none."""
        if not self.dropped:
            return []
        cause = "its disk is full" if self.reason == "ENOSPC" else "the write failed"
        return [
            f"this process cannot write its log ({self.reason}: {cause}): {self.dropped} lines "
            f"dropped since {self.since} (pollux_log_lines_dropped); free space where its "
            "standard error goes"
        ]

    def notice(self) -> dict[str, Any]:
        """The fields of the one line that says how many lines were dropped."""
        return {
            "event": "log_lines_dropped",
            "level": "warning",
            "count": self.dropped,
            "reason": self.reason,
            "since": self.since,
        }

    def reset(self) -> None:
        """Writing works again: the dropped lines have been reported."""
        self.dropped, self.reason, self.since = 0, "", ""


LOG_HEALTH = LogHealth()
"""This process's log health."""


class SafeLogger:
    """structlog's print logger, dropping (and counting) lines the stream will not take."""

    def __init__(self, file: TextIO, health: LogHealth = LOG_HEALTH) -> None:
        self._file = file
        self._health = health

    def msg(self, message: str) -> None:
        """Write one rendered line (after the notice of lines dropped before it, if any)."""
        reporting = self._health.dropped > 0
        text = message + "\n"
        if reporting:
            text = json.dumps(self._health.notice()) + "\n" + text
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as error:
            self._health.failed(error)
            return
        if reporting:
            self._health.reset()

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class SafeLoggerFactory:
    """Makes `SafeLogger`s writing to `file` (structlog's ``logger_factory``)."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> SafeLogger:
        """A logger (structlog passes the logger's name, unused)."""
        return SafeLogger(self._file)


def configure(service: str, level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog (and stdlib logging, for grpc's own lines) for a service process."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"log level {level!r} is not one of debug, info, warning, error")
    as_json = not sys.stderr.isatty() if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if as_json:
        processors.append(structlog.processors.dict_tracebacks)
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=SafeLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
