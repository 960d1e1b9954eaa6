"""Usage sampling (pollux.scheduler.accounting.sample): pure, no etcd."""

from __future__ import annotations

from pollux.scheduler.accounting import day_of, sample
from pollux.v1 import types_pb2 as pb

DAY = 86400.0 * 20_000  # 2024-10-04 00:00 UTC


def job(job_id: str, owner: str, tenant: str, gpus: int, *, since: float, state: int) -> pb.Job:
    record = pb.Job(id=job_id, owner=owner, tenant=tenant, state=state)  # type: ignore[arg-type]
    record.allocation.nodes.extend(["n1"] * gpus)
    record.allocation.time.FromNanoseconds(int(since * 1e9))
    return record


def test_gpu_seconds_count_held_gpus_since_the_later_of_sample_and_allocation():
    jobs = [
        job("a", "alice", "vision", 4, since=DAY, state=pb.JOB_STATE_RUNNING),
        job("b", "alice", "vision", 2, since=DAY + 30, state=pb.JOB_STATE_RUNNING),
        job("c", "bob", "", 1, since=DAY, state=pb.JOB_STATE_RESCALING),
        job("d", "bob", "", 8, since=DAY, state=pb.JOB_STATE_SUCCEEDED),  # finished: nothing
    ]
    used = sample(jobs, {"a": 3.0}, since=DAY, now=DAY + 60)
    day = day_of(DAY + 60)
    assert set(used) == {(day, "vision", "alice"), (day, "", "bob")}
    alice = used[(day, "vision", "alice")]
    assert alice.gpu_seconds == 4 * 60 + 2 * 30
    # a: the agent's predicted speedup of 3 (of 4 GPUs); b: linear before a model is fitted.
    assert alice.goodput_seconds == 3.0 * 60 + 2 * 30
    assert used[(day, "", "bob")].gpu_seconds == 60


def test_goodput_never_exceeds_the_gpus_held():
    jobs = [job("a", "alice", "", 2, since=DAY, state=pb.JOB_STATE_RUNNING)]
    used = sample(jobs, {"a": 50.0}, since=DAY, now=DAY + 10)
    assert next(iter(used.values())).goodput_seconds == 20.0


def test_nothing_is_counted_twice_or_backwards():
    jobs = [job("a", "alice", "", 2, since=DAY + 100, state=pb.JOB_STATE_RUNNING)]
    assert sample(jobs, {}, since=DAY, now=DAY + 50) == {}, "allocated after this sample"
    assert sample(jobs, {}, since=DAY + 200, now=DAY + 200) == {}
