"""The values a job logs for people to see (loss, accuracy, …): the one set of rules.

`ElasticTrainer.log` checks them as the job logs them; the agent checks every report against
the same rules before it keeps them on the job's timeline, where the dashboard plots them. A
name is what a person reads on a chart, so it is short and plain; a value is a finite number.
They are the job's own figures: nothing in Pollux decides anything from them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-/]{0,31}")
"""A metric's name: a letter, then up to 31 letters, digits, ``_ . - /`` (``val/loss``)."""
MAX_METRICS = 16
"""Most distinct names one report (and so one timeline point) carries."""
MAX_ABS = 1e30
"""Largest magnitude kept: beyond it a loss has diverged, and a chart shows nothing useful."""


def metric_problems(values: Mapping[str, float], at: str = "user_metrics") -> list[tuple[str, str]]:
    """Every problem of a set of logged values, as (field, what to fix); empty when valid."""
    out: list[tuple[str, str]] = []
    if len(values) > MAX_METRICS:
        out.append((at, f"{len(values)} names; at most {MAX_METRICS} (log fewer values)"))
    for name, value in values.items():
        shown = name[:40].encode("unicode_escape").decode()
        if not NAME.fullmatch(name):
            out.append(
                (
                    f"{at}[{shown}]",
                    "a name is a letter then up to 31 of letters, digits, _ . - / (e.g. val/loss)",
                )
            )
        elif not (isinstance(value, int | float) and math.isfinite(value)):
            out.append((f"{at}[{shown}]", f"{value!r} is not a finite number"))
        elif abs(value) > MAX_ABS:
            out.append((f"{at}[{shown}]", f"{value:g}; must be within ±{MAX_ABS:g}"))
    return out
