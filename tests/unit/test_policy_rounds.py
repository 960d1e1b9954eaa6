"""One round decision, shared by the live scheduler and the simulator: placement or full."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pollux.policy import rounds
from pollux.policy.rounds import decide_round, runs_full
from pollux.policy.types import AllocationDecision, ClusterState, JobExplain, TenantSpec
from pollux.scheduler import cycle
from pollux.sim import simulator
from tests.unit.policy_builders import ScriptedPolicy, job, nodes, state

RNG = np.random.default_rng(0)


class OneEach(ScriptedPolicy):
    """One GPU to each job on the first node with room; remembers what it saw and was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[ClusterState, object]] = []

    def allocate(
        self, state: ClusterState, memory: object, rng: np.random.Generator
    ) -> AllocationDecision[object]:
        self.seen.append((state, memory))
        room = {n.name: n.gpus for n in state.nodes}
        out: dict[str, tuple[str, ...]] = {}
        for j in state.jobs:
            node = next((n for n, free in room.items() if free), None)
            out[j.name] = () if node is None else (node,)
            if node is not None:
                room[node] -= 1
        explain = {name: JobExplain(1.0, 1.0, "") for name in out}
        return AllocationDecision(out, explain, memory=f"memory after {len(self.seen)}")


def busy() -> ClusterState:
    """n0 full (a holds 4), n1 with 3 free (b holds 1); c never ran, d ran before."""
    return state(
        [
            job("a", on=("n0",) * 4),
            job("b", on=("n1",)),
            job("c"),
            job("d", restarts=1, attained=600.0),
        ],
        nodes(2),
    )


@pytest.mark.parametrize(
    ("placement", "tenants", "full"),
    [(False, False, True), (True, False, False), (True, True, True)],
)
def test_a_round_is_full_unless_asked_to_place_and_free_of_tenants(
    placement: bool, tenants: bool, full: bool
) -> None:
    st_ = replace(busy(), tenants=(TenantSpec("t"),) if tenants else ())
    assert runs_full(st_, placement) is full


def test_a_full_round_plans_every_job_and_its_memory_is_the_policys_new_one() -> None:
    policy = OneEach()
    decided = decide_round(busy(), policy, "warm", RNG, placement=False)
    assert decided.full
    assert decided.planned is None
    assert policy.seen[0] == (busy(), "warm")
    assert decided.memory == "memory after 1"
    assert set(decided.decision.allocations) == {"a", "b", "c", "d"}


def test_a_placement_round_places_new_jobs_on_free_gpus_and_keeps_the_memory() -> None:
    policy = OneEach()
    decided = decide_round(busy(), policy, "warm", RNG, placement=True)
    assert not decided.full
    assert decided.planned == frozenset({"c"}), "d ran before: it waits for a full round"
    ((seen, memory),) = policy.seen
    assert memory is None, "a placement round starts from no memory"
    assert [(n.name, n.gpus) for n in seen.nodes] == [("n1", 3)], "only the free GPUs"
    assert decided.memory == "warm", "the last full round's memory is kept"
    assert decided.decision.allocations == {"c": ("n1",)}


def test_a_placement_round_with_nothing_to_place_does_not_call_the_policy() -> None:
    policy = OneEach()
    full_cluster = state([job("a", on=("n0",) * 4), job("c")], nodes(1))
    decided = decide_round(full_cluster, policy, "warm", RNG, placement=True)
    assert policy.seen == []
    assert decided.planned == frozenset({"c"})
    assert decided.memory == "warm"
    assert dict(decided.decision.allocations) == {}


def test_with_tenants_a_placement_round_runs_full() -> None:
    policy = OneEach()
    st_ = replace(busy(), tenants=(TenantSpec("t", guarantee_gpus=1),))
    decided = decide_round(st_, policy, "warm", RNG, placement=True)
    assert decided.full
    assert decided.memory == "memory after 1"


def test_the_live_scheduler_and_the_simulator_decide_rounds_with_the_same_function() -> None:
    assert cycle.decide_round is simulator.decide_round is rounds.decide_round
    assert simulator.runs_full is rounds.runs_full
