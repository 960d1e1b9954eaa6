"""One scheduling round's decision: a placement round or a full one, as both callers run it.

The live scheduler (`pollux.scheduler.cycle`) and the simulator (`pollux.sim.simulator`) both
decide a round here. A round asked to be a *placement* round (an event's, under
`event_rounds = "place"`) plans only the jobs that never ran, on the GPUs no job holds
(`pollux.policy.placement`), and leaves the policy's memory as the last full round left it.
It runs as a full round instead when the round's own state has tenants: a tenant's budget
counts the GPUs it holds elsewhere, which a state of free GPUs cannot see. A full round
re-plans every job and its memory is the policy's new one; the caller then restarts its
periodic clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic

import numpy as np

from pollux.policy.placement import placement_state
from pollux.policy.types import AllocationDecision, ClusterState, JobExplain, M, Policy


def runs_full(state: ClusterState, placement: bool) -> bool:
    """Whether a round over `state`, asked to be a placement round or not, runs full."""
    return not placement or bool(state.tenants)


@dataclass(frozen=True, slots=True)
class RoundDecision(Generic[M]):
    """What one round decided.

    Attributes:
        decision: The policy's answer for the jobs it planned.
        planned: The jobs the round planned; None: every job (a full round).
        memory: The policy's memory for the next round.
    """

    decision: AllocationDecision[M]
    planned: frozenset[str] | None
    memory: M | None

    @property
    def full(self) -> bool:
        """Whether the round re-planned every job."""
        return self.planned is None


def decide_round(
    state: ClusterState,
    policy: Policy[M],
    memory: M | None,
    rng: np.random.Generator,
    *,
    placement: bool,
) -> RoundDecision[M]:
    """Run the policy for one round (module docstring); `placement`: asked to only place."""
    if runs_full(state, placement):
        decision = policy.allocate(state, memory, rng)
        return RoundDecision(decision, None, decision.memory)
    placed = placement_state(state)
    planned = frozenset(info.name for info in placed.jobs)
    if not placed.nodes:  # nothing to ask the policy: say why each new job waits
        why = "no nodes in the cluster" if not state.nodes else "every GPU is held"
        waits = JobExplain(0.0, 1.0, f"pending: {why}")
        return RoundDecision(AllocationDecision({}, dict.fromkeys(planned, waits)), planned, memory)
    if not placed.jobs:
        return RoundDecision(AllocationDecision({}, {}), planned, memory)
    return RoundDecision(policy.allocate(placed, None, rng), planned, memory)
