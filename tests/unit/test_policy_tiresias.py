"""Tiresias: two-queue least-attained-service with backfill, preemption and sticky placement."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.policy import (
    AllocationDecision,
    ClusterState,
    JobInfo,
    NodeInfo,
    PolicyInputError,
)
from pollux.policy.allocation import canonical
from pollux.policy.tiresias import TiresiasJob, TiresiasMemory, TiresiasPolicy, TiresiasStatus

RNG = np.random.default_rng(0)
POLICY = TiresiasPolicy()
HOUR = 3600.0
RUNNING, PENDING = TiresiasStatus.RUNNING, TiresiasStatus.PENDING

Round = tuple[float, Sequence[tuple[str, int]]]
"""A round's time and its active jobs as (name, GPU demand), in submission order."""


def cluster(*gpus: int) -> tuple[NodeInfo, ...]:
    """Nodes n0, n1, ... with the given GPU counts."""
    return tuple(NodeInfo(f"n{i}", g) for i, g in enumerate(gpus))


def job(name: str, gpus: int, alloc: tuple[str, ...] = ()) -> JobInfo:
    return JobInfo(
        name=name,
        submission_time=0.0,
        allocation=alloc,
        max_replicas=gpus,
        target_replicas=gpus,
    )


def run(
    nodes: tuple[NodeInfo, ...], rounds: Sequence[Round], policy: TiresiasPolicy = POLICY
) -> list[AllocationDecision]:
    """Call the policy once per round, feeding back its allocations and memory."""
    memory: object | None = None
    allocations: dict[str, tuple[str, ...]] = {}
    decisions = []
    for now, active in rounds:
        jobs = tuple(job(name, gpus, allocations.get(name, ())) for name, gpus in active)
        decision = policy.allocate(ClusterState(now=now, nodes=nodes, jobs=jobs), memory, RNG)
        decisions.append(decision)
        memory, allocations = decision.memory, dict(decision.allocations)
    return decisions


def counts(decision: AllocationDecision) -> dict[str, int]:
    return {name: len(alloc) for name, alloc in decision.allocations.items()}


def memory_of(decision: AllocationDecision) -> TiresiasMemory:
    assert isinstance(decision.memory, TiresiasMemory)
    return decision.memory


@pytest.mark.parametrize(
    ("nodes", "rounds", "want_counts"),
    [
        (cluster(4), [(0, [("a", 2), ("b", 2), ("c", 2)])], {"a": 2, "b": 2, "c": 0}),
        (cluster(4), [(0, [("a", 3), ("b", 2), ("c", 1)])], {"a": 3, "b": 0, "c": 1}),
        (cluster(2), [(0, [("a", 4), ("b", 1)])], {"a": 0, "b": 1}),
        (cluster(2, 2), [(0, [("a", 4)])], {"a": 4}),
        (
            cluster(4),
            [(0, [("a", 4)]), (4 * HOUR, [("a", 4), ("b", 4)])],
            {"a": 0, "b": 4},
        ),
        (
            cluster(4),
            [(0, [("a", 4)]), (4 * HOUR - 1, [("a", 4), ("b", 4)])],
            {"a": 4, "b": 0},
        ),
        (
            cluster(4),
            [(0, [("a", 4)]), (4 * HOUR, [("a", 4)]), (4 * HOUR + 60, [("a", 4), ("b", 2)])],
            {"a": 0, "b": 2},
        ),
        (
            cluster(4),
            [(0, [("a", 4), ("b", 4)]), (60, [("b", 4)])],
            {"b": 4},
        ),
        (
            cluster(4),
            [(0, [("a", 4), ("b", 4)]), (4 * HOUR, [("a", 4), ("b", 4)])],
            {"a": 0, "b": 4},
        ),
    ],
    ids=[
        "queue 0 runs jobs first come first served",
        "a smaller later job backfills GPUs an earlier job cannot use",
        "a job larger than the cluster waits and lets smaller ones run",
        "GPUs are counted over the whole cluster, not per node",
        "a job that has used 16 GPU-hours drops behind a newer job",
        "a job just under 16 GPU-hours keeps its place",
        "a queue-0 arrival preempts a running queue-1 job",
        "a finished job's GPUs go to the next job in line",
        "time spent pending is not service, so the waiting job now runs",
    ],
)
def test_admission(
    nodes: tuple[NodeInfo, ...], rounds: list[Round], want_counts: dict[str, int]
) -> None:
    assert counts(run(nodes, rounds)[-1]) == want_counts


@pytest.mark.parametrize(
    ("nodes", "rounds", "want"),
    [
        (cluster(2, 4), [(0, [("a", 3)])], {"a": ("n1", "n1", "n1")}),
        (cluster(2, 2, 2), [(0, [("a", 5)])], {"a": ("n0", "n0", "n1", "n1", "n2")}),
        (
            cluster(2, 2),
            [(0, [("a", 1), ("b", 3)]), (60, [("b", 3), ("c", 1)])],
            {"b": ("n0", "n1", "n1"), "c": ("n0",)},
        ),
    ],
    ids=[
        "a new job packs onto the node with the most free GPUs",
        "a job larger than any node fills the freest nodes in node order",
        "a running job keeps its spread placement and newcomers fill around it",
    ],
)
def test_placement(
    nodes: tuple[NodeInfo, ...], rounds: list[Round], want: dict[str, tuple[str, ...]]
) -> None:
    assert run(nodes, rounds)[-1].allocations == want


def remembered(*running: str, pending: Sequence[str] = ()) -> TiresiasMemory:
    """Memory of a previous round at t = 0 with every job in queue 0."""
    jobs = {name: TiresiasJob(RUNNING, 0.0) for name in running}
    jobs.update({name: TiresiasJob(PENDING, 0.0) for name in pending})
    return TiresiasMemory(queue_0=tuple(jobs), queue_1=(), jobs=jobs, last_check_time=0.0)


@pytest.mark.parametrize(
    ("nodes", "memory", "jobs", "want"),
    [
        (
            cluster(4, 4),
            remembered("a"),
            [job("a", 2, alloc=("n1", "n0"))],
            {"a": ("n0", "n1")},
        ),
        (
            cluster(4),
            remembered("a"),
            [job("a", 2, alloc=("n0",))],
            {"a": ("n0", "n0")},
        ),
        (
            cluster(2, 2),
            remembered("a"),
            [job("a", 2, alloc=())],
            {"a": ("n0", "n0")},
        ),
        (
            cluster(2, 2),
            remembered("a", pending=["b"]),
            [job("a", 2, alloc=("n0", "n1")), job("b", 2)],
            {"a": ("n0", "n1"), "b": ("n0", "n1")},
        ),
    ],
    ids=[
        "a running job keeps its nodes, returned in canonical order",
        "a running job holding the wrong number of GPUs is placed afresh",
        "a running job that lost its GPUs outside the policy is placed again",
        "a job admitted from pending is placed around running ones",
    ],
)
def test_placement_from_remembered_state(
    nodes: tuple[NodeInfo, ...],
    memory: TiresiasMemory,
    jobs: list[JobInfo],
    want: dict[str, tuple[str, ...]],
) -> None:
    state = ClusterState(now=60.0, nodes=nodes, jobs=tuple(jobs))
    assert POLICY.allocate(state, memory, RNG).allocations == want


@pytest.mark.parametrize(
    ("nodes", "rounds", "want_reasons"),
    [
        (
            cluster(4),
            [(0, [("a", 3), ("b", 2), ("c", 1)])],
            {
                "a": "started on 3 GPUs (queue 0)",
                "b": "pending: queue 0, needs 2 GPUs, 1 free",
                "c": "started on 1 GPU (queue 0)",
            },
        ),
        (
            cluster(4),
            [(0, [("a", 4)]), (60, [("a", 4)])],
            {"a": "unchanged (queue 0)"},
        ),
        (
            cluster(4),
            [(0, [("a", 4)]), (4 * HOUR, [("a", 4), ("b", 2)])],
            {"a": "preempted: queue 1, needs 4 GPUs, 2 free", "b": "started on 2 GPUs (queue 0)"},
        ),
    ],
    ids=[
        "started and pending jobs say where they stand",
        "a job that keeps running is unchanged",
        "a demoted job that loses its GPUs is preempted",
    ],
)
def test_explain(
    nodes: tuple[NodeInfo, ...], rounds: list[Round], want_reasons: dict[str, str]
) -> None:
    decision = run(nodes, rounds)[-1]
    assert {name: e.reason for name, e in decision.explain.items()} == want_reasons
    for name, alloc in decision.allocations.items():
        assert decision.explain[name].speedup == float(len(alloc))
        assert decision.explain[name].penalty == 1.0
    assert math.isnan(decision.objective)


def test_explain_names_a_resize_to_the_fixed_demand() -> None:
    state = ClusterState(now=60.0, nodes=cluster(4), jobs=(job("a", 2, alloc=("n0",)),))
    decision = POLICY.allocate(state, remembered("a"), RNG)
    assert decision.explain["a"].reason == "scaled 1 → 2 GPUs to match target_replicas (queue 0)"


def test_memory_accrues_running_time_across_rounds() -> None:
    rounds = [
        (0.0, [("a", 4), ("b", 4)]),
        (60.0, [("a", 4), ("b", 4), ("c", 1)]),
        (180.0, [("a", 4), ("b", 4), ("c", 1)]),
    ]
    memory = memory_of(run(cluster(4), rounds)[-1])
    assert memory == TiresiasMemory(
        queue_0=("a", "b", "c"),
        queue_1=(),
        jobs={
            "a": TiresiasJob(RUNNING, 180.0),
            "b": TiresiasJob(PENDING, 0.0),
            "c": TiresiasJob(PENDING, 0.0),
        },
        last_check_time=180.0,
    )


def test_jobs_demoted_together_keep_their_order_behind_earlier_demotions() -> None:
    rounds = [
        (0.0, [("a", 2)]),
        (8 * HOUR, [("a", 2), ("b", 2), ("c", 2)]),
        (16 * HOUR, [("a", 2), ("b", 2), ("c", 2), ("d", 4)]),
    ]
    memory = memory_of(run(cluster(4), rounds)[-1])
    assert memory.queue_0 == ("d",)
    assert memory.queue_1 == ("a", "b", "c")


def test_finished_jobs_are_forgotten() -> None:
    rounds = [(0.0, [("a", 2), ("b", 2)]), (4 * HOUR, [("b", 2)])]
    memory = memory_of(run(cluster(4), rounds)[-1])
    assert memory.queue_0 + memory.queue_1 == ("b",)
    assert set(memory.jobs) == {"b"}


def test_custom_threshold_demotes_sooner() -> None:
    policy = TiresiasPolicy(queue_threshold=120.0)
    rounds = [(0.0, [("a", 2)]), (60.0, [("a", 2)])]
    assert memory_of(run(cluster(4), rounds, policy)[-1]).queue_1 == ("a",)


def test_no_jobs_gives_an_empty_decision_and_clock() -> None:
    decision = POLICY.allocate(ClusterState(now=5.0, nodes=cluster(4), jobs=()), None, RNG)
    assert decision.allocations == {}
    assert decision.explain == {}
    assert memory_of(decision) == TiresiasMemory((), (), {}, last_check_time=5.0)


@pytest.mark.parametrize(
    ("memory", "now", "jobs", "want_field"),
    [
        (
            None,
            0.0,
            [job("a", 1), JobInfo(name="b", submission_time=0.0)],
            "jobs[b].target_replicas",
        ),
        (remembered("a"), -1.0, [job("a", 1)], "now"),
    ],
    ids=[
        "a job without a fixed GPU demand",
        "a round earlier than the remembered one",
    ],
)
def test_bad_input_is_rejected_naming_the_field(
    memory: TiresiasMemory | None, now: float, jobs: list[JobInfo], want_field: str
) -> None:
    state = ClusterState(now=now, nodes=cluster(4), jobs=tuple(jobs))
    with pytest.raises(PolicyInputError) as err:
        POLICY.allocate(state, memory, RNG)
    assert err.value.field == want_field


@pytest.mark.parametrize("threshold", [0.0, -1.0, math.nan], ids=["zero", "negative", "NaN"])
def test_threshold_must_be_positive(threshold: float) -> None:
    with pytest.raises(PolicyInputError) as err:
        TiresiasPolicy(queue_threshold=threshold)
    assert err.value.field == "queue_threshold"


@pytest.mark.parametrize(
    ("queue_0", "queue_1", "names"),
    [(("a",), ("a",), {"a"}), (("a",), (), {"a", "b"}), (("a", "b"), (), {"a"})],
    ids=["a job in both queues", "an entry for an unqueued job", "a queued job without an entry"],
)
def test_inconsistent_memory_cannot_be_built(
    queue_0: tuple[str, ...], queue_1: tuple[str, ...], names: set[str]
) -> None:
    with pytest.raises(PolicyInputError) as err:
        TiresiasMemory(queue_0, queue_1, {n: TiresiasJob(PENDING, 0.0) for n in names}, 0.0)
    assert err.value.field == "memory"


@st.composite
def workloads(draw: st.DrawFn) -> tuple[tuple[NodeInfo, ...], list[Round]]:
    """A cluster and rounds in which jobs arrive, run and finish at random."""
    nodes = cluster(*draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    num_rounds = draw(st.integers(1, 6))
    interval = draw(st.sampled_from([60.0, HOUR, 8 * HOUR]))
    pool = [
        (f"j{i}", draw(st.integers(1, 8)), draw(st.integers(0, num_rounds - 1)))
        for i in range(draw(st.integers(1, 10)))
    ]
    pool.sort(key=lambda spec: spec[2])  # submission order
    lifetimes = {name: draw(st.integers(1, num_rounds)) for name, _, _ in pool}
    rounds: list[Round] = [
        (
            r * interval,
            [(n, g) for n, g, start in pool if start <= r < start + lifetimes[n]],
        )
        for r in range(num_rounds)
    ]
    return nodes, rounds


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_every_round_is_complete_canonical_within_capacity_and_repeatable(
    workload: tuple[tuple[NodeInfo, ...], list[Round]],
) -> None:
    nodes, rounds = workload
    order = [n.name for n in nodes]
    total = sum(n.gpus for n in nodes)
    memory: object | None = None
    allocations: dict[str, tuple[str, ...]] = {}
    for now, active in rounds:
        jobs = tuple(job(name, gpus, allocations.get(name, ())) for name, gpus in active)
        state = ClusterState(now=now, nodes=nodes, jobs=jobs)
        decision = POLICY.allocate(state, memory, RNG)

        assert list(decision.allocations) == [j.name for j in jobs]
        assert list(decision.explain) == [j.name for j in jobs]
        used = Counter(node for alloc in decision.allocations.values() for node in alloc)
        assert all(used[n.name] <= n.gpus for n in nodes)
        idle = total - sum(used.values())
        for j in jobs:
            alloc = decision.allocations[j.name]
            assert alloc == canonical(alloc, order)
            assert len(alloc) in (0, j.target_replicas)
            if alloc:
                assert len(j.allocation) != len(alloc) or alloc == j.allocation
            else:
                assert j.target_replicas is not None
                assert j.target_replicas > idle, "a pending job would fit the idle GPUs"
        again = POLICY.allocate(state, memory, RNG)
        assert again.allocations == decision.allocations
        assert again.explain == decision.explain
        assert again.memory == decision.memory
        memory, allocations = decision.memory, dict(decision.allocations)
