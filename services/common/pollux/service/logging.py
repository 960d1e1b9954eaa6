"""structlog set-up, once per process.

JSON lines when stderr is not a terminal (what log collectors want), a readable console format
when it is. Context (job_id, node_id, round, role) is bound at the edges with
`structlog.contextvars.bound_contextvars`, so every line of a unit of work carries it.
"""

from __future__ import annotations

import logging
import sys

import structlog


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
