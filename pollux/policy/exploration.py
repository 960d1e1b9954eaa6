"""How far a job may grow past the sizes it has measured: its exploration limit.

A job's throughput model predicts sizes it has not run from the ones it has, and the sync
parameters its measurements cannot identify yet are pinned optimistically
(`pollux.goodput.fit`): a job measured on one GPU looks as if it scaled perfectly. A policy
that trusted the extrapolation would hand such a job the whole cluster. Pollux bounds it: a
job may be given at most twice the replicas it has measured (reference §4.1), so it reaches
K GPUs in log2 K rounds, paying a restart per round. That is the faithful rule
(`FAITHFUL_GROWTH`).

The jct mode grows by `JctParams.explore_growth` (4: two doublings a round). A restart per
doubling is what short jobs pay most: at half load, where most GPUs would be idle anyway, a
job that runs a quarter of an hour pays four restarts and four rounds growing
1 → 2 → 4 → 8 → 16 GPUs, where growing by 4 pays two. The cost
of the larger step is the extrapolation it trusts: a job whose scaling disappoints is shrunk
back once it has measured it. Unbounded growth costs more than it saves, so the bound stays;
the mode's restart pricing and its reversal odds decide whether a job moves at all, this only
how far one move may reach. The step is the one setting of the mode that is chosen, not
derived: among 2, 4, 8 and unbounded on one published workload at half load (4 fills a
4-GPU node before a job crosses nodes, where nothing has been measured), then checked on the
other workloads, at every load and on workloads not used to choose it (README, "Beyond
Pollux").

**The first step starts from nothing** (`Exploration.start`; the jct mode's
`JctParams.explore_first`). Pollux starts every job on one GPU and grows it from there, so a
job that scales pays a restart for its first growth, 1 → 4, one round after it starts. That
restart buys nothing the start could not: a job's first allocation pays its start-up pause
whatever its size (it is not a move, and nothing is undone), the policy values a job without
a model as scaling linearly (reference §3) whether it is bounded at 1 or at 4, and a first
measurement on 4 GPUs of one node identifies the compute time and the node's sync time, where
one on 1 GPU identifies only the first (Pollux's placement puts a job on as few nodes as it
can, so on 4-GPU nodes with one free it is one node; nothing forces it). So the jct mode lets
a job that has measured nothing start on up to `growth` GPUs, the step a job measured on one
GPU may take anyway. What it risks
is the same extrapolation every step risks: a job that does not scale is shrunk once it has
measured that, for the restart its growth would have cost. On the published workloads this
takes 0.4–0.6 restarts per job off (the 1 → 4 growth was 0.77 a job at 1.0× load) and
lowers mean JCT at half load, where the GPUs a new job starts on would be idle (README).
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
