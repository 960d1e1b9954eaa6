"""What the fault suite counts, and the figures it prints from the counts (pure)."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

MUST_BE_ZERO = (
    "lost",
    "stuck",
    "overlapping_generations",
    "corrupted_checkpoints",
    "leaked_slots",
    "failed_jobs",
    "bad_specs_accepted",
    "unhealed_disk_faults",
)
"""The figures (keys of `report`'s result) the suite fails on unless 0."""


@dataclass
class Tally:
    """What the suite counts."""

    cycles: int = 0
    lost: int = 0
    stuck: int = 0
    overlaps: int = 0
    corrupted: int = 0
    leaked: int = 0
    failed: int = 0
    bad_accepted: int = 0
    unhealed: int = 0
    disk_failed: int = 0
    """Jobs failed by a full checkpoint disk, saying so (what must happen: not a problem)."""
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    findings: list[str] = field(default_factory=list)

    def problems(self) -> int:
        """Every count that must be 0, summed."""
        counts = (self.lost, self.stuck, self.overlaps, self.corrupted, self.leaked)
        return sum(counts) + self.failed + self.bad_accepted + self.unhealed

    def note(self, what: str) -> None:
        """Record and print one finding."""
        self.findings.append(what)
        print(f"  FINDING: {what}", flush=True)


def overlapping_generations(ticks: bytes) -> list[tuple[int, int, float]]:
    """(older, newer, seconds) for each pair of consecutive generations that ticked at once.

    Generation g and g+k overlap when g's last tick is later than g+k's first; ticks are a
    few hundred ms apart, so any overlap longer than that shows.
    """
    spans: dict[int, tuple[int, int]] = {}
    for line in ticks.splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue  # a line cut short by a kill
        generation, stamp = int(parts[0]), int(parts[3])
        first, last = spans.get(generation, (stamp, stamp))
        spans[generation] = (min(first, stamp), max(last, stamp))
    found = []
    ordered = sorted(spans.items())
    for (old, (_, old_last)), (new, (new_first, _)) in itertools.pairwise(ordered):
        if old_last > new_first:
            found.append((old, new, (old_last - new_first) / 1e9))
    return found


def report(tally: Tally, wall_s: float) -> dict[str, object]:
    """Print the figures; returns them (for --json)."""
    every = [s for values in tally.recovery.values() for s in values]
    figures: dict[str, object] = {
        "cycles": tally.cycles,
        "lost": tally.lost,
        "stuck": tally.stuck,
        "overlapping_generations": tally.overlaps,
        "corrupted_checkpoints": tally.corrupted,
        "leaked_slots": tally.leaked,
        "failed_jobs": tally.failed,
        "bad_specs_accepted": tally.bad_accepted,
        "unhealed_disk_faults": tally.unhealed,
        "disk_failed_jobs": tally.disk_failed,
        "recovery_p50_s": round(statistics.median(every), 2) if every else None,
        "recovery_max_s": round(max(every), 2) if every else None,
        "wall_s": round(wall_s, 1),
        "by_fault": {
            kind: {
                "cycles": len(values),
                "p50_s": round(statistics.median(values), 2),
                "max_s": round(max(values), 2),
            }
            for kind, values in sorted(tally.recovery.items())
        },
        "findings": tally.findings,
    }
    print()
    for key in list(figures)[:13]:
        print(f"{key:26s} {figures[key]}")
    print(f"{'fault':20s} {'cycles':>6s} {'p50 s':>7s} {'max s':>7s}")
    for kind, row in figures["by_fault"].items():  # type: ignore[attr-defined]
        print(f"{kind:20s} {row['cycles']:6d} {row['p50_s']:7.2f} {row['max_s']:7.2f}")
    return figures
