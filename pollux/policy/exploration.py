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
"""

from __future__ import annotations

FAITHFUL_GROWTH = 2
"""Pollux's rule: at most twice the largest measured size."""


def exploration_limit(profiled: int, held: int, growth: int = FAITHFUL_GROWTH) -> int:
    """Most replicas a job may be given this round, before its caps and batch limits.

    Args:
        profiled: The most replicas the job has measured a step time on (0: none yet).
        held: The replicas it holds now (never taken away by this rule).
        growth: How many times its largest measured size a job may reach, ≥ 2.
    """
    return max(1, growth * profiled, held)
