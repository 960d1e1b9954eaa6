"""Placement rounds (pollux.policy.placement): free GPUs and jobs that never ran, nothing else."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.placement import never_ran, placement_state
from pollux.policy.types import ClusterState, JobInfo, NodeInfo, TenantSpec

NODES = (NodeInfo("a", 4), NodeInfo("b", 4), NodeInfo("c", 2))


def test_nodes_keep_only_the_gpus_no_job_holds_and_full_nodes_drop_out():
    jobs = (
        JobInfo("big", 0.0, allocation=("a", "a", "a", "a", "b"), attained_service=50.0),
        JobInfo("small", 1.0, allocation=("c",), attained_service=5.0),
    )
    reduced = placement_state(ClusterState(9.0, NODES, jobs))
    assert reduced.nodes == (NodeInfo("b", 3), NodeInfo("c", 1))
    assert reduced.now == 9.0


def test_only_jobs_that_never_ran_are_placed():
    fresh = JobInfo("fresh", 5.0, max_replicas=4)
    running = JobInfo("running", 0.0, allocation=("a",), attained_service=10.0)
    suspended = JobInfo("suspended", 0.0, attained_service=30.0, restarts=1)  # waits to resume
    evicted = JobInfo("evicted", 0.0, restarts=1)  # lost its GPUs before any service counted
    state = ClusterState(9.0, NODES, (running, fresh, suspended, evicted))
    assert placement_state(state).jobs == (fresh,)
    assert [never_ran(j) for j in state.jobs] == [False, True, False, False]


def test_a_state_with_tenants_is_refused_because_quotas_count_gpus_held_elsewhere():
    state = ClusterState(0.0, NODES, (JobInfo("j", 0.0),), (TenantSpec("t", 2),))
    with pytest.raises(ValueError, match="tenant quotas"):
        placement_state(state)


@st.composite
def states(draw):
    nodes = tuple(
        NodeInfo(f"n{i}", draw(st.integers(1, 4))) for i in range(draw(st.integers(1, 4)))
    )
    free = [slot for node in nodes for slot in [node.name] * node.gpus]
    jobs = []
    for i in range(draw(st.integers(0, 6))):
        take = draw(st.integers(0, min(2, len(free))))
        allocation, free = tuple(free[:take]), free[take:]
        served = draw(st.sampled_from([0.0, 12.0])) if not allocation else 12.0
        jobs.append(JobInfo(f"j{i}", float(i), allocation, attained_service=served, max_replicas=4))
    return ClusterState(100.0, nodes, tuple(jobs))


@given(states())
def test_a_placement_merged_onto_the_current_allocations_overfills_no_node(state):
    reduced = placement_state(state)
    decision = PolluxPolicy().allocate(reduced, None, np.random.default_rng(0))
    merged = {job.name: job.allocation for job in state.jobs}
    merged.update({name: tuple(nodes) for name, nodes in decision.allocations.items()})
    for node in state.nodes:
        assert sum(a.count(node.name) for a in merged.values()) <= node.gpus
    # Nobody but the jobs that never ran is planned.
    assert set(decision.allocations) <= {job.name for job in state.jobs if never_ran(job)}
