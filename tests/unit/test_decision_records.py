"""Decision records list what changed (and every job now and then), so they stay small."""

from __future__ import annotations

import numpy as np

from pollux.policy.types import AllocationDecision, ClusterState
from pollux.scheduler.cycle import REFRESH_ROUNDS, KnownJob, RoundPlan, plan_round
from pollux.service.store import Entry, Snapshot
from pollux.v1 import types_pb2 as pb
from tests.unit.policy_builders import Fixed


def snapshot(jobs: list[pb.Job]) -> Snapshot:
    return Snapshot(
        revision=1,
        jobs={j.id: Entry(j, mod_revision=2, create_revision=1) for j in jobs},
        nodes={"n1": pb.Node(name="n1", gpus=4)},
        agents=[],
        models={},
        replicas=[],
    )


def pending(job_id: str) -> pb.Job:
    job = pb.Job(id=job_id, state=pb.JOB_STATE_PENDING)
    job.create_time.FromNanoseconds(int(1e9))
    return job


def plan(jobs: list[pb.Job], policy: Fixed, number: int, previous: RoundPlan | None) -> RoundPlan:
    return plan_round(
        snapshot(jobs),
        policy,
        None,
        np.random.default_rng(0),
        now=float(number),
        round_number=number,
        scheduler_id="s",
        recorded=previous.recorded if previous else None,
    )


def plan_at(
    jobs: list[pb.Job], policy: Fixed, number: int, *, known: dict[str, KnownJob] | None
) -> RoundPlan:
    """Round `number` at time number × 100 s, with or without the last round's JobInfos."""
    return plan_round(
        snapshot(jobs),
        policy,
        None,
        np.random.default_rng(0),
        now=number * 100.0,
        round_number=number,
        scheduler_id="s",
        known=known,
    )


def test_a_record_lists_what_changed_and_every_job_again_after_the_refresh_period() -> None:
    policy = Fixed({"a": ("n1",), "b": (), "c": ("n1", "n1")})
    jobs = [pending("a"), pending("b"), pending("c")]
    first = plan(jobs, policy, 1, None)
    assert sorted(d.job_id for d in first.decision.jobs) == ["a", "b", "c"]

    # The allocations are committed; the next rounds decide the same: nothing to record.
    committed = {job.id: job for job, _ in first.jobs}
    jobs = [committed.get(j.id, j) for j in jobs]
    second = plan(jobs, policy, 2, first)
    assert list(second.decision.jobs) == []
    assert second.decision.unchanged_not_recorded == 3
    assert (first.held_gpus, second.held_gpus) == (3, 3), "logged whatever was recorded"

    # A change is recorded at once, alone.
    moved = plan(jobs, Fixed({"a": ("n1",), "b": ("n1",), "c": ("n1", "n1")}), 3, second)
    assert [d.job_id for d in moved.decision.jobs] == ["b"]

    # An unchanged job is recorded again once the refresh period has passed.
    late = plan(jobs, policy, 1 + REFRESH_ROUNDS, second)
    assert sorted(d.job_id for d in late.decision.jobs) == ["a", "b", "c"]


def test_job_infos_reused_from_the_last_round_plan_exactly_as_fresh_ones() -> None:
    class Recording(Fixed):
        def allocate(
            self, state: ClusterState, memory: object | None, rng: np.random.Generator
        ) -> AllocationDecision:
            self.seen = state.jobs
            return super().allocate(state, memory, rng)

    policy = Recording({"a": ("n1",), "b": (), "c": ("n1", "n1")})
    jobs = [pending("a"), pending("b"), pending("c")]
    first = plan(jobs, policy, 1, None)
    committed = {job.id: job for job, _ in first.jobs}
    jobs = [committed.get(j.id, j) for j in jobs]
    for later in (2, 3):  # the same record objects: reused, with the held GPU time moved on
        reused = plan_at(jobs, policy, later, known=first.known)
        seen_reused = policy.seen
        plan_at(jobs, policy, later, known=None)
        assert seen_reused == policy.seen
        assert seen_reused[0].attained_service > 0, "time held moved on"
        assert reused.known["b"].info is first.known["b"].info, "an idle job's info is reused"
