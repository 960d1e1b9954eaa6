"""One scheduling round's decision: a placement round or a full one, as both callers run it.

The live scheduler (`pollux.scheduler.cycle`) and the simulator (`pollux.sim.simulator`) both
decide a round here. A round asked to be a *placement* round (an event's, under
`event_rounds = "place"`) plans only the jobs that never ran, on the GPUs no job holds
(`pollux.policy.placement`; with several users, offered first to those holding the fewest,
and freed by preempting a job of the user holding most for a user owed a first GPU, if the
policy then gives one to such a user), and leaves the policy's memory as the last full
round left it.
It runs as a full round instead when the round's own state has tenants: a tenant's budget
counts the GPUs it holds elsewhere, which a state of free GPUs cannot see. A full round
re-plans every job and its memory is the policy's new one; the caller then restarts its
periodic clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generic

import numpy as np

from pollux.policy.owners import owners_of
from pollux.policy.placement import never_ran, owed_first_gpus, owed_moves, placement_state
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
    freeing = owed_moves(state) if policy.user_fairness else frozenset()
    if freeing:
        decision, planned = _place(state, policy, rng, freeing)
        owed = owed_first_gpus(state)
        owner_of = dict(zip((job.name for job in state.jobs), owners_of(state), strict=True))
        if any(on and owner_of[name] in owed for name, on in decision.allocations.items()):
            return RoundDecision(decision, planned, memory)
    decision, planned = _place(state, policy, rng, frozenset())
    return RoundDecision(decision, planned, memory)


def _place(
    state: ClusterState, policy: Policy[M], rng: np.random.Generator, freeing: frozenset[str]
) -> tuple[AllocationDecision[M], frozenset[str]]:
    """A placement round's decision and the jobs it planned, `freeing` preempted."""
    placed = placement_state(state, by_turn=policy.user_fairness, freeing=freeing)
    planned = frozenset(info.name for info in state.jobs if never_ran(info)) - freeing
    if not placed.nodes:  # nothing to ask the policy: say why each new job waits
        why = "no nodes in the cluster" if not state.nodes else "every GPU is held"
        waits = JobExplain(0.0, 1.0, f"pending: {why}")
        return AllocationDecision({}, dict.fromkeys(planned, waits)), planned
    if not placed.jobs:
        return AllocationDecision({}, {}), planned
    decision = policy.allocate(placed, None, rng)
    others = planned - {info.name for info in placed.jobs}
    if others:  # waiting jobs of users who hold more: the free GPUs were not theirs to take
        turn = JobExplain(0.0, 1.0, "pending: the free GPUs went to users holding fewer")
        explain = {**dict.fromkeys(others, turn), **decision.explain}
        decision = replace(decision, explain=explain)
    if freeing:
        gave = JobExplain(0.0, 1.0, "preempted: a user of its tenant holding no GPU took one")
        allocations = {**decision.allocations, **dict.fromkeys(freeing, ())}
        explain = {**decision.explain, **dict.fromkeys(freeing, gave)}
        decision = replace(decision, allocations=allocations, explain=explain)
    return decision, planned | freeing
