"""structlog set-up, once per process.

JSON lines when stderr is not a terminal (what log collectors want), a readable console format
when it is. Context (job_id, node_id, round, role) is bound at the edges with
`structlog.contextvars.bound_contextvars`, so every line of a unit of work carries it.

A line that cannot be written (stderr is a file on a full disk) is dropped and counted, never
raised: logging must not stop the code that logs (a launcher reporting a replica's exit, a
service stopping on SIGTERM). The first line written again says how many were lost.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

import structlog


class DroppingLogger(structlog.PrintLogger):
    """structlog's PrintLogger, except that a failed write drops the line (see module doc)."""

    def __init__(self, file: TextIO | None = None) -> None:
        super().__init__(file)
        self.dropped = 0
        self.last_error = ""

    def msg(self, message: str) -> None:
        """Print `message`; if that fails, count it as dropped."""
        try:
            if self.dropped:
                lost = {
                    "event": "log_lines_dropped",
                    "count": self.dropped,
                    "error": self.last_error,
                    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                super().msg(json.dumps(lost))
                self.dropped = 0
            super().msg(message)
        except OSError as error:
            self.dropped += 1
            self.last_error = error.strerror or str(error)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _dropping_logger(*args: Any) -> DroppingLogger:
    return DroppingLogger(sys.stderr)


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
        logger_factory=_dropping_logger,
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
