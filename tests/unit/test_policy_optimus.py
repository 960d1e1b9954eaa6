"""Optimus+Oracle: first GPUs by arrival, extra GPUs by marginal gain, freest-first placement."""

from __future__ import annotations

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
    OracleInfo,
    PolicyInputError,
)
from pollux.policy.allocation import canonical
from pollux.policy.optimus import OptimusPolicy

RNG = np.random.default_rng(0)
POLICY = OptimusPolicy()


def cluster(*gpus: int) -> tuple[NodeInfo, ...]:
    """Nodes n0, n1, ... with the given GPU counts."""
    return tuple(NodeInfo(f"n{i}", g) for i, g in enumerate(gpus))


def job(
    name: str,
    *,
    max_replicas: int = 64,
    steps: Sequence[float] | None = None,
    remaining: float = 1000.0,
    alloc: tuple[str, ...] = (),
) -> JobInfo:
    """A job whose step time is T(K) = `steps[K-1]`, or 1/K (perfect scaling) up to K = 64."""
    if steps is None:
        steps = [1.0 / k for k in range(1, 65)]
    # Entry 0 is NaN to prove the policy never reads it.
    oracle = OracleInfo(np.array([np.nan, *steps]), remaining_iterations=remaining)
    return JobInfo(
        name=name, submission_time=0.0, allocation=alloc, max_replicas=max_replicas, oracle=oracle
    )


def decide(nodes: tuple[NodeInfo, ...], *jobs: JobInfo) -> AllocationDecision:
    return POLICY.allocate(ClusterState(now=0.0, nodes=nodes, jobs=jobs), None, RNG)


def counts(decision: AllocationDecision) -> dict[str, int]:
    return {name: len(alloc) for name, alloc in decision.allocations.items()}


@pytest.mark.parametrize(
    ("nodes", "jobs", "want_counts"),
    [
        (cluster(2), [job("a"), job("b"), job("c")], {"a": 1, "b": 1, "c": 0}),
        (
            cluster(3),
            [job("a", steps=[1.0, 0.5], remaining=100), job("b", steps=[1.0, 0.9])],
            {"a": 1, "b": 2},
        ),
        (cluster(3), [job("a"), job("b")], {"a": 2, "b": 1}),
        (cluster(4), [job("a"), job("b")], {"a": 2, "b": 2}),
        (cluster(4), [job("a", max_replicas=2)], {"a": 2}),
        (cluster(4), [job("a", steps=[1.0, 0.5])], {"a": 2}),
        (cluster(4), [job("a", steps=[1.0, 1.0, 1.2])], {"a": 1}),
        (cluster(4), [job("a", remaining=0), job("b")], {"a": 1, "b": 3}),
        (cluster(2), [job("a", max_replicas=0), job("b")], {"a": 0, "b": 2}),
    ],
    ids=[
        "jobs outnumbering GPUs get one each in arrival order and the last waits",
        "the extra GPU goes to the biggest step-time drop times remaining iterations",
        "equal gains give the extra GPU to the earlier job",
        "diminishing returns spread GPUs evenly between equal jobs",
        "max_replicas caps a job even when GPUs stay idle",
        "no job grows beyond the replica counts its oracle evaluated",
        "a job that stops speeding up gets no more GPUs",
        "a job with no iterations left keeps only its first GPU",
        "a job with max_replicas 0 is never started",
    ],
)
def test_gpu_counts(
    nodes: tuple[NodeInfo, ...], jobs: list[JobInfo], want_counts: dict[str, int]
) -> None:
    assert counts(decide(nodes, *jobs)) == want_counts


@pytest.mark.parametrize(
    ("nodes", "jobs", "want"),
    [
        (
            cluster(2, 2),
            [job("a", max_replicas=2, alloc=("n0", "n1")), job("b", max_replicas=2)],
            {"a": ("n0", "n1"), "b": ("n0", "n1")},
        ),
        (
            cluster(2, 2),
            [job("a", max_replicas=2, alloc=("n0", "n0")), job("b", max_replicas=2)],
            {"a": ("n0", "n0"), "b": ("n1", "n1")},
        ),
        (
            cluster(2, 2),
            [job("a", max_replicas=3, alloc=("n1", "n0", "n1"))],
            {"a": ("n0", "n1", "n1")},
        ),
        (cluster(2, 4), [job("a", max_replicas=3)], {"a": ("n1", "n1", "n1")}),
        (cluster(4, 4), [job("a", max_replicas=6)], {"a": ("n0",) * 4 + ("n1",) * 2}),
        (
            cluster(3, 3),
            [job("a", max_replicas=4), job("b", max_replicas=2)],
            {"a": ("n0", "n1", "n1", "n1"), "b": ("n0", "n0")},
        ),
        (cluster(4, 4), [job("a", max_replicas=3, alloc=("n1",))], {"a": ("n0", "n0", "n0")}),
    ],
    ids=[
        "a job whose count is unchanged keeps its exact nodes even when spread",
        "a kept allocation's GPUs are not given to anyone else",
        "a kept allocation comes back in canonical node order",
        "a new job packs onto the node with the most free GPUs",
        "a job larger than any node fills the freest node then the next",
        "smaller jobs are placed before larger ones",
        "a job whose count changes is placed afresh",
    ],
)
def test_placement(
    nodes: tuple[NodeInfo, ...], jobs: list[JobInfo], want: dict[str, tuple[str, ...]]
) -> None:
    assert decide(nodes, *jobs).allocations == want


@pytest.mark.parametrize(
    ("nodes", "jobs", "want_reasons"),
    [
        (cluster(4), [job("a", max_replicas=1, alloc=("n0",))], {"a": "unchanged"}),
        (cluster(4), [job("a", max_replicas=3, alloc=("n0",))], {"a": "scaled 1 → 3 GPUs"}),
        (cluster(4), [job("a", max_replicas=1)], {"a": "started on 1 GPU"}),
        (
            cluster(1),
            [job("a"), job("b")],
            {"a": "started on 1 GPU", "b": "pending: every GPU went to earlier jobs"},
        ),
        (
            cluster(1),
            [job("a"), job("b", alloc=("n0",))],
            {"a": "started on 1 GPU", "b": "preempted: every GPU went to earlier jobs"},
        ),
        (cluster(4), [job("a", max_replicas=0)], {"a": "pending: max_replicas is 0"}),
    ],
    ids=[
        "a job that keeps its GPUs is unchanged",
        "a job that grows says by how much",
        "a new job says how many GPUs it got",
        "a job left without GPUs blames earlier jobs",
        "a job that loses its GPUs to an earlier job is preempted",
        "a job that may not run says why",
    ],
)
def test_explain(
    nodes: tuple[NodeInfo, ...], jobs: list[JobInfo], want_reasons: dict[str, str]
) -> None:
    decision = decide(nodes, *jobs)
    assert {name: e.reason for name, e in decision.explain.items()} == want_reasons
    for name, alloc in decision.allocations.items():
        assert decision.explain[name].speedup == float(len(alloc))
        assert decision.explain[name].penalty == 1.0


def test_objective_is_estimated_remaining_seconds_of_jobs_with_gpus() -> None:
    decision = decide(
        cluster(3),
        job("a", steps=[2.0, 1.0], remaining=10),
        job("b", steps=[5.0], remaining=99),
        job("c", steps=[5.0], remaining=7),
    )
    assert counts(decision) == {"a": 1, "b": 1, "c": 1}
    assert decision.objective == pytest.approx(10 * 2.0 + 99 * 5.0 + 7 * 5.0)
    assert decision.memory is None


def test_objective_leaves_out_jobs_without_gpus() -> None:
    decision = decide(cluster(1), job("a", steps=[2.0], remaining=10), job("b", remaining=99))
    assert counts(decision) == {"a": 1, "b": 0}
    assert decision.objective == pytest.approx(10 * 2.0)


def test_no_jobs_gives_an_empty_decision() -> None:
    decision = decide(cluster(4))
    assert decision.allocations == {}
    assert decision.explain == {}
    assert decision.objective == 0.0


@pytest.mark.parametrize(
    ("bad_job", "want_field"),
    [
        (JobInfo(name="b", submission_time=0.0), "jobs[b].oracle"),
        (
            JobInfo(name="b", submission_time=0.0, oracle=OracleInfo(np.array([np.nan]), 1.0)),
            "jobs[b].oracle.step_time",
        ),
        (job("b", steps=[1.0, -0.5]), "jobs[b].oracle.step_time"),
        (job("b", steps=[1.0, np.nan]), "jobs[b].oracle.step_time"),
        (job("b", remaining=-1.0), "jobs[b].oracle.remaining_iterations"),
        (job("b", remaining=np.inf), "jobs[b].oracle.remaining_iterations"),
    ],
    ids=[
        "a job without an oracle",
        "step times that cover no replica count",
        "a negative step time",
        "a NaN step time",
        "negative remaining iterations",
        "infinite remaining iterations",
    ],
)
def test_unusable_oracle_is_rejected_naming_the_field(bad_job: JobInfo, want_field: str) -> None:
    with pytest.raises(PolicyInputError) as err:
        decide(cluster(4), job("a"), bad_job)
    assert err.value.field == want_field


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[tuple[NodeInfo, ...], list[JobInfo], list[JobInfo]]:
    """A cluster, a first round of jobs, and a second round with new oracles and some churn."""
    nodes = cluster(*draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))

    def random_job(name: str) -> JobInfo:
        steps = draw(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=12))
        return job(
            name,
            steps=steps,
            remaining=draw(st.floats(0.0, 1e6)),
            max_replicas=draw(st.integers(0, 16)),
        )

    first = [random_job(f"j{i}") for i in range(draw(st.integers(0, 8)))]
    kept = [j for j in first if draw(st.booleans())]
    second = [random_job(j.name) for j in kept] + [random_job(f"new{i}") for i in range(3)]
    return nodes, first, second


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_every_decision_is_complete_canonical_within_capacity_and_repeatable(
    scenario: tuple[tuple[NodeInfo, ...], list[JobInfo], list[JobInfo]],
) -> None:
    nodes, first, second = scenario
    order = [n.name for n in nodes]
    previous = decide(nodes, *first).allocations
    jobs = [
        JobInfo(
            name=j.name,
            submission_time=0.0,
            allocation=previous.get(j.name, ()),
            max_replicas=j.max_replicas,
            oracle=j.oracle,
        )
        for j in second
    ]
    state = ClusterState(now=60.0, nodes=nodes, jobs=tuple(jobs))
    decision = POLICY.allocate(state, None, RNG)

    assert list(decision.allocations) == [j.name for j in jobs]
    assert list(decision.explain) == [j.name for j in jobs]
    used = Counter(node for alloc in decision.allocations.values() for node in alloc)
    assert all(used[n.name] <= n.gpus for n in nodes)
    for j in jobs:
        alloc = decision.allocations[j.name]
        assert alloc == canonical(alloc, order)
        assert j.oracle is not None
        assert len(alloc) <= min(j.max_replicas, j.oracle.step_time.size - 1)
        if len(alloc) == len(j.allocation):
            assert alloc == j.allocation
    again = POLICY.allocate(state, None, RNG)
    assert again.allocations == decision.allocations
    assert again.explain == decision.explain
    assert again.objective == decision.objective
