"""`pollux-cli` pieces for following and listing jobs.

Rendering `follow` events, ``--since`` times, and how many jobs fit a screen.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from datetime import UTC, datetime, timedelta

from pollux.client.client import Client
from pollux.client.follow import Finished, Line, Marker, exit_code, follow
from pollux.client.format import for_terminal, plural
from pollux.terminal import escape_controls

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DEFAULT_SCREEN_LINES = 24


def since_time(text: str, now: datetime | None = None) -> datetime:
    """Parse ``--since`` (an argparse type).

    A duration back from now (``90s``, ``10m``, ``1h30m``, ``2d``) or an ISO 8601 time
    (``2026-11-24T09:00``, local time unless it names a zone).
    """
    now = now or datetime.now(UTC)
    compact = text.strip().lower()
    if compact and _DURATION.sub("", compact) == "":
        seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(compact))
        return now - timedelta(seconds=seconds)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (90s, 10m, 2h, 1d) nor an ISO 8601 time "
            "(2026-11-24T09:00)"
        ) from None
    return when if when.tzinfo is not None else when.astimezone()


def screenful() -> int:
    """Jobs that fit the terminal with the header and the "more" line (at least 5)."""
    lines = shutil.get_terminal_size((80, DEFAULT_SCREEN_LINES)).lines
    return max(5, lines - 4)


def more_jobs_hint(limit: int) -> str:
    """What `ls` says when it left jobs out."""
    return (
        f"(showing {plural(limit, 'job')}: active ones first, then the newest finished; "
        "--limit N or --all for more, --state/--mine to narrow)"
    )


def follow_job(
    client: Client,
    job_ref: str,
    *,
    rank: int = 0,
    logs: bool = True,
    history_from: int | None = None,
    tail_lines: int = 0,
    since: datetime | None = None,
    raw: bool = False,
) -> int:
    """Print a job's state changes (and logs) until it ends; returns the result's exit code.

    Log lines go to stdout as they are but for control characters, which are escaped
    visibly unless `raw` (tabs and newlines stay); markers (state changes, each generation's
    start) are framed ``==> … <==`` as `tail` frames file names, so they stand out and are easy
    to filter, and are one line each (a reason's newlines escaped too, unless `raw`).
    """
    for event in follow(
        client,
        job_ref,
        rank=rank,
        logs=logs,
        history_from=history_from,
        tail_lines=tail_lines,
        since=since,
    ):
        if isinstance(event, Line):
            print(for_terminal(event.text, raw=raw), flush=True)
        elif isinstance(event, Marker):
            text = event.text if raw else escape_controls(event.text)
            print(f"==> {text} <==", flush=True)
        elif isinstance(event, Finished):
            job = event.job
            print(f"==> job {job.id} {job.state} <==", flush=True, file=sys.stdout)
            return exit_code(job)
    return 0
