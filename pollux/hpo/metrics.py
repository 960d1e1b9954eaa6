"""How a trial reports metrics: one line of its rank-0 log per value, read back by the sweep.

The training library reports step times and gradient statistics to its agent, not user
metrics, so a trial prints them: a line ``pollux-metric {"name": ..., "value": ..., "step":
...}`` on its standard output (rank 0's log, which the API serves). `report_metric` writes one;
`parse_metric_line` reads one back and ignores every other line. The last value of the
sweep's objective metric is the trial's result; earlier ones (with increasing steps) feed the
pruner. Any language can print the line; docs/hpo.md gives the format.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import TextIO

PREFIX = "pollux-metric "
"""What starts a metric line."""


@dataclass(frozen=True, slots=True)
class MetricReport:
    """One reported value.

    Attributes:
        name: The metric's name.
        value: Its value (finite).
        step: The step it was measured at (e.g. the epoch); None: the report's position.
    """

    name: str
    value: float
    step: int | None = None


def format_metric_line(name: str, value: float, step: int | None = None) -> str:
    """The log line that reports `value` of metric `name` (at `step`).

    Raises:
        ValueError: An empty name, a non-finite value or a negative step.
    """
    if not name or not math.isfinite(value) or (step is not None and step < 0):
        raise ValueError("need a name, a finite value and a step ≥ 0 (or none)")
    body: dict[str, object] = {"name": name, "value": float(value)}
    if step is not None:
        body["step"] = int(step)
    return PREFIX + json.dumps(body, separators=(",", ":"))


def report_metric(
    name: str, value: float, step: int | None = None, *, file: TextIO | None = None
) -> None:
    """Print a metric line (to stdout, flushed, so the sweep sees it at once)."""
    print(format_metric_line(name, value, step), file=file or sys.stdout, flush=True)


def parse_metric_line(line: str) -> MetricReport | None:
    """The report on `line`, or None when it is not a well-formed metric line."""
    text = line.strip()
    if not text.startswith(PREFIX):
        return None
    try:
        body = json.loads(text[len(PREFIX) :])
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    name, value, step = body.get("name"), body.get("value"), body.get("step")
    if not isinstance(name, str) or not name:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        return None
    return MetricReport(name, float(value), step)
