"""How far a job may grow past the sizes it has measured: its exploration limit.

A job's throughput model predicts sizes it has not run from the ones it has, optimistically
where its measurements cannot identify the sync parameters yet (`pollux.goodput.fit`), so a
policy that trusted the extrapolation would hand a job measured on one GPU the whole
cluster. Pollux bounds it: at most twice the replicas a job has measured (reference §4.1,
`FAITHFUL`). The jct mode grows by `JctParams.explore_growth` (4) and lets a job that has
measured nothing start on up to that many GPUs (`Exploration.start`): a first allocation
pays its start-up pause at any size. docs/policy.md ("Exploration") says why; the step was
chosen on the simulator (docs/results.md, "The jct mode").
"""

from __future__ import annotations

from dataclasses import dataclass

FAITHFUL_GROWTH = 2
"""Pollux's rule: at most twice the largest measured size."""


def exploration_limit(
    profiled: int, held: int, growth: int = FAITHFUL_GROWTH, start: int = 1
) -> int:
    """Most replicas a job may be given this round, before its caps and batch limits.

    Args:
        profiled: The most replicas the job has measured a step time on (0: none yet).
        held: The replicas it holds now (never taken away by this rule).
        growth: How many times its largest measured size a job may reach, ≥ 2.
        start: Most replicas a job that has measured nothing may be given, 1 to `growth`.
    """
    return max(start, growth * profiled, held)


@dataclass(frozen=True, slots=True)
class Exploration:
    """A policy's exploration rule, as the simulator, the scheduler and the forecasts apply it.

    Attributes:
        growth: How many times its largest measured size a job may be given in one round.
        start: How many replicas a job that has measured nothing may start on.

    Raises:
        ValueError: `growth` < 2, or `start` outside 1..`growth`.
    """

    growth: int = FAITHFUL_GROWTH
    start: int = 1

    def __post_init__(self) -> None:
        if self.growth < 2:
            raise ValueError(f"exploration growth must be ≥ 2, got {self.growth}")
        if not 1 <= self.start <= self.growth:
            raise ValueError(f"exploration start must be 1..{self.growth}, got {self.start}")

    def limit(self, profiled: int, held: int) -> int:
        """`exploration_limit` under this rule."""
        return exploration_limit(profiled, held, self.growth, self.start)


FAITHFUL = Exploration()
"""Pollux's rule: a job starts on one GPU and may double its largest measured size a round."""
