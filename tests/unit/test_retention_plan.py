"""Which finished jobs lose their side state and which their record (retention.plan_sweep)."""

from __future__ import annotations

from pollux.scheduler.retention import plan_sweep
from pollux.service.store import Entry
from pollux.v1 import types_pb2 as pb

NOW = 10_000_000.0


def job(job_id: str, state: int, ended_ago: float | None) -> Entry[pb.Job]:
    record = pb.Job(id=job_id, state=state)  # type: ignore[arg-type]
    if ended_ago is not None:
        record.finish_time.FromNanoseconds(int((NOW - ended_ago) * 1e9))
    return Entry(value=record, mod_revision=7, create_revision=1, lease=0)


def ids(entries: list[Entry[pb.Job]]) -> list[str]:
    return [e.value.id for e in entries]


def test_only_finished_jobs_past_their_grace_lose_side_state_and_past_retention_records() -> None:
    jobs = [
        job("running", pb.JOB_STATE_RUNNING, None),
        job("fresh", pb.JOB_STATE_SUCCEEDED, 5),
        job("graced", pb.JOB_STATE_FAILED, 700),
        job("old", pb.JOB_STATE_CANCELLED, 40 * 86400),
        job("no-finish-time", pb.JOB_STATE_SUCCEEDED, None),
    ]
    plan = plan_sweep(jobs, NOW, grace_s=600, retention_s=30 * 86400, swept=set())
    assert ids(plan.side_state) == ["graced"]
    assert ids(plan.expired) == ["old"]


def test_jobs_already_swept_are_not_swept_again_but_still_expire() -> None:
    jobs = [job("graced", pb.JOB_STATE_SUCCEEDED, 700), job("old", pb.JOB_STATE_SUCCEEDED, 9e6)]
    plan = plan_sweep(jobs, NOW, grace_s=600, retention_s=30 * 86400, swept={"graced", "old"})
    assert ids(plan.side_state) == []
    assert ids(plan.expired) == ["old"]
