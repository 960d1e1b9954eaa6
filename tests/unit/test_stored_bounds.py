"""Every message the scheduler stores is bounded: job history, decision records, transactions."""

from __future__ import annotations

import grpc
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pollux.policy.types import AllocationDecision, ClusterState, JobExplain
from pollux.scheduler.cycle import MAX_DECISION_BYTES, plan_round
from pollux.scheduler.lifecycle import MAX_REASON_CHARS, MAX_RECENT_HISTORY, transition
from pollux.service.errors import status_of
from pollux.service.store import (
    MAX_VALUE_BYTES,
    Delete,
    Entry,
    Expect,
    Fence,
    Put,
    Snapshot,
    ValueTooLarge,
    txn_bytes,
)
from pollux.v1 import types_pb2 as pb
from tests.unit.policy_builders import ScriptedPolicy


def submitted(job_id: str = "j-1", at: float = 0.0) -> pb.Job:
    job = pb.Job(id=job_id, state=pb.JOB_STATE_PENDING)
    job.create_time.FromNanoseconds(int(at * 1e9))
    first = job.history.add(state=pb.JOB_STATE_PENDING, reason="submitted")
    first.time.CopyFrom(job.create_time)
    return job


# -- job history ------------------------------------------------------------------------------


def test_history_keeps_the_first_transition_and_the_latest_ones():
    job = submitted()
    transition(job, pb.JOB_STATE_ALLOCATED, 1.0, "started")
    transition(job, pb.JOB_STATE_RUNNING, 2.0, "running")
    for i in range(500):  # a job rescaled every round
        transition(job, pb.JOB_STATE_RESCALING, 3.0 + 2 * i, f"rescale {i}")
        transition(job, pb.JOB_STATE_RUNNING, 4.0 + 2 * i, f"running {i}")
        assert len(job.history) <= 1 + MAX_RECENT_HISTORY
    assert len(job.history) == 1 + MAX_RECENT_HISTORY
    assert job.history[0].reason == "submitted"
    assert job.history[-1].reason == "running 499"
    assert job.history[1].reason == f"rescale {500 - MAX_RECENT_HISTORY // 2}"
    times = [h.time.ToNanoseconds() for h in job.history]
    assert times == sorted(times)


def test_a_long_reason_is_clipped_with_an_ellipsis():
    job = submitted()
    transition(job, pb.JOB_STATE_ALLOCATED, 1.0, "n" * 10_000)
    reason = job.history[-1].reason
    assert len(reason) == MAX_REASON_CHARS
    assert reason.endswith("…")
    transition(job, pb.JOB_STATE_RUNNING, 2.0, "short")
    assert job.history[-1].reason == "short"


# -- decision records -------------------------------------------------------------------------


class GiveFirstJobs(ScriptedPolicy):
    """A policy that gives one GPU each to the first `holders` jobs, with a very long reason."""

    name = "test"

    def __init__(self, holders: int) -> None:
        self.holders = holders

    def allocate(
        self, state: ClusterState, memory: object | None, rng: np.random.Generator
    ) -> AllocationDecision:
        slots = [n.name for n in state.nodes for _ in range(n.gpus)]
        allocations = {
            j.name: (slots[i],) if i < min(self.holders, len(slots)) else ()
            for i, j in enumerate(state.jobs)
        }
        why = "x" * 5000
        explain = {j: JobExplain(1.0, 1.0, why) for j in allocations}
        return AllocationDecision(allocations, explain, objective=1.0)


def test_a_decision_record_is_bounded_and_records_every_job_holding_gpus():
    jobs = {f"j-{i:06d}": Entry(submitted(f"j-{i:06d}", at=i), 1, 1) for i in range(6000)}
    nodes = {f"node-{i:03d}": pb.Node(name=f"node-{i:03d}", gpus=8) for i in range(64)}
    snapshot = Snapshot(revision=1, jobs=jobs, nodes=nodes, agents=[], models={}, replicas=[])
    plan = plan_round(
        snapshot,
        GiveFirstJobs(holders=512),
        None,
        np.random.default_rng(0),
        now=10.0,
        round_number=1,
        scheduler_id="s",
    )
    record = plan.decision
    holders = [d for d in record.jobs if d.nodes]
    assert len(holders) == 512
    assert record.ByteSize() <= MAX_DECISION_BYTES + 1024
    assert len(record.jobs) + record.pending_not_recorded == 6000
    assert record.pending_not_recorded > 0
    assert all(len(d.reason) == MAX_REASON_CHARS for d in record.jobs)
    assert [d.job_id for d in record.jobs] == sorted(d.job_id for d in record.jobs)
    assert all(len(job.history) == 2 for job, _ in plan.jobs)
    assert all(len(job.history[-1].reason) <= MAX_REASON_CHARS for job, _ in plan.jobs)


# -- store requests ---------------------------------------------------------------------------

ops_strategy = st.lists(
    st.one_of(
        st.builds(Put, st.binary(min_size=1, max_size=40), st.binary(max_size=3000)),
        st.builds(Delete, st.binary(min_size=1, max_size=40), st.booleans()),
    ),
    max_size=5,
)
expect_strategy = st.lists(
    st.builds(Expect, st.binary(min_size=1, max_size=40), st.integers(0, 2**40)), max_size=3
)


@given(a=ops_strategy, ea=expect_strategy, b=ops_strategy, eb=expect_strategy)
def test_request_sizes_add_up_so_a_round_can_be_chunked_exactly(a, ea, b, eb):
    fence = Fence(b"/pollux/v1/leader/694d8d3b2a1c", 12345)
    whole = txn_bytes([*a, *b], [*ea, *eb], fence)
    assert whole == txn_bytes(a, ea) + txn_bytes(b, eb) + txn_bytes((), fence=fence)


def test_an_oversized_write_is_resource_exhausted_naming_the_key_and_limit():
    error = ValueTooLarge("the value", b"/pollux/v1/jobs/j-1", MAX_VALUE_BYTES + 1, MAX_VALUE_BYTES)
    code, message, _ = status_of(error)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "/pollux/v1/jobs/j-1" in message
    assert str(MAX_VALUE_BYTES) in message
