"""Finished jobs leave etcd (pollux.scheduler.retention), with a real scheduler and real etcd."""

from __future__ import annotations

import time
from dataclasses import replace

import grpc
import pytest

from pollux.scheduler.accounting import day_of
from pollux.scheduler.config import RetentionConfig
from pollux.scheduler.retention import SweepPlan, Swept, sweep
from pollux.service.bootstrap import create_token
from pollux.service.keys import Kind
from pollux.service.store import Entry, Fence, FenceLost, Store
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.integration.test_scheduler import Replica, add_node, config, spec
from tests.waiting import eventually


async def side_state(store: Store, job: pb.Job) -> list[bytes]:
    """Keys still stored for a job besides its record."""
    k = store.keys
    found = [
        key
        for key in (k.request(job.request_id), k.model(job.id), k.observations(job.id))
        if await store.list_keys(key)
    ]
    return found + await store.list_keys(k.replicas_of(job.id))


async def run_to_success(replica: Replica, store: Store, request_id: str) -> pb.Job:
    """Submit a one-GPU job and report its replica running, then exited 0."""
    job = (
        await replica.stub.SubmitJob(
            spb.SubmitJobRequest(spec=spec(replicas=1), request_id=request_id)
        )
    ).job

    async def allocated() -> pb.Job | None:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got if got.allocation.nodes else None

    got = await eventually(allocated)
    status = pb.ReplicaStatus(
        job_id=job.id,
        node="n1",
        rank=0,
        generation=got.allocation.generation,
        phase=pb.REPLICA_PHASE_EXITED,
        exit_code=0,
    )
    await store.put_replica_status(status)
    await store.put(store.keys.model(job.id), pb.JobModel(job_id=job.id))
    await store.put(store.keys.observations(job.id), pb.ObservationProfile(job_id=job.id))
    await store.put(store.keys.timeline(job.id), pb.JobTimeline(job_id=job.id))
    return job


async def test_a_finished_jobs_side_state_goes_after_the_grace_and_its_record_after_retention(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    retention = RetentionConfig(
        finished_grace_s=0.5, retention_days=4.0 / 86400, sweep_interval_s=0.2
    )
    replica = await Replica(store, replace(config(etcd, root, "s-1"), retention=retention)).start()
    try:
        await add_node(store, "n1", 2)
        done = await run_to_success(replica, store, "done")
        running = (
            await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="live"))
        ).job
        await store.put(store.keys.model(running.id), pb.JobModel(job_id=running.id))
        assert await side_state(store, done)

        async def swept() -> bool:
            return not await side_state(store, done)

        await eventually(swept, 15, "the finished job's side state to go")
        kept = (await replica.stub.GetJob(spb.GetJobRequest(job_id=done.id))).job
        assert kept.state == pb.JOB_STATE_SUCCEEDED, "the record stays queryable until retention"
        assert await store.get_timeline(done.id) is not None, "and so does its timeline"

        async def record_gone() -> bool:
            try:
                await replica.stub.GetJob(spb.GetJobRequest(job_id=done.id))
            except grpc.aio.AioRpcError as error:
                return error.code() == grpc.StatusCode.NOT_FOUND
            return False

        await eventually(record_gone, 15, "the record to expire")
        assert await store.get_timeline(done.id) is None
        assert await store.get(store.keys.job(running.id), pb.Job) is not None
        assert await store.list_keys(store.keys.model(running.id)), "a live job keeps its state"
    finally:
        await replica.stop()


async def test_a_deposed_leaders_sweep_deletes_nothing(store: Store) -> None:
    record = pb.Job(id="j-old", request_id="r-old", state=pb.JOB_STATE_SUCCEEDED)
    await store.put(store.keys.job(record.id), record)
    await store.put(store.keys.model(record.id), pb.JobModel(job_id=record.id))
    entry = await store.get(store.keys.job(record.id), pb.Job)
    assert entry is not None
    stale = Fence(key=store.keys.leader(0xDEAD), revision=1)  # no such election key
    with pytest.raises(FenceLost):
        await sweep(store, SweepPlan(expired=[entry]), stale, Swept())
    assert await store.get(store.keys.job(record.id), pb.Job) is not None
    assert await store.list_keys(store.keys.model(record.id))


async def test_a_record_changed_since_the_sweep_read_it_is_skipped_alone(store: Store) -> None:
    lease = await store.grant_lease(30)
    leader = store.keys.leader(lease)
    revision = await store.put(leader, pb.Job(), lease=lease)
    fence = Fence(key=leader, revision=revision)
    entries: list[Entry[pb.Job]] = []
    for name in ("a", "b"):
        await store.put(store.keys.job(name), pb.Job(id=name, request_id=f"r-{name}"))
        got = await store.get(store.keys.job(name), pb.Job)
        assert got is not None
        entries.append(got)
    await store.put(store.keys.job("b"), pb.Job(id="b", request_id="r-b", restarts=1))
    assert await sweep(store, SweepPlan(expired=entries), fence, Swept()) == (0, 1)
    assert await store.get(store.keys.job("a"), pb.Job) is None
    assert await store.get(store.keys.job("b"), pb.Job) is not None


async def test_usage_is_accounted_per_user_and_survives_the_jobs_deletion(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    retention = RetentionConfig(
        finished_grace_s=0.2, retention_days=1.0 / 86400, sweep_interval_s=0.2
    )
    replica = await Replica(store, replace(config(etcd, root, "s-1"), retention=retention)).start()
    try:
        await add_node(store, "n1", 2)
        job = (
            await replica.stub.SubmitJob(
                spb.SubmitJobRequest(spec=spec(replicas=1), request_id="used")
            )
        ).job

        async def accounted() -> list[pb.UsageRecord]:
            entries, _ = await store.scan(store.keys.prefix(Kind.USAGE), pb.UsageRecord)
            return [e.value for e in entries if e.value.gpu_seconds > 0]

        records = await eventually(accounted, 15, "the allocated job's GPU time to be booked")
        assert [(r.user, r.tenant) for r in records] == [("local", "")]
        done = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        await store.put_replica_status(
            pb.ReplicaStatus(
                job_id=job.id,
                node="n1",
                rank=0,
                generation=done.allocation.generation,
                phase=pb.REPLICA_PHASE_EXITED,
                exit_code=0,
            )
        )

        async def record_gone() -> bool:
            return await store.get_job(done.id) is None

        await eventually(record_gone, 15, "the job record to expire")
        assert await accounted(), "usage outlives the job"
    finally:
        await replica.stop()


async def test_old_audit_and_usage_records_and_expired_tokens_are_deleted(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    k = store.keys
    now = time.time()
    old, recent = now - 200 * 86400, now - 60
    await store.put(k.audit(int(old * 1e9), "a"), pb.AuditRecord(action="SubmitJob"))
    await store.put(k.audit(int(recent * 1e9), "b"), pb.AuditRecord(action="CancelJob"))
    await store.put(k.usage(day_of(old - 300 * 86400), "t", "u"), pb.UsageRecord(gpu_seconds=1))
    await store.put(k.usage(day_of(now), "t", "u"), pb.UsageRecord(gpu_seconds=2))
    expired = pb.ApiToken(id="0123456789ab", user="x")
    expired.expire_time.FromNanoseconds(int((now - 1) * 1e9))
    await store.put(k.token(expired.id), expired)
    live = await create_token(store, "y")
    retention = RetentionConfig(sweep_interval_s=0.2, audit_max_records=10)
    replica = await Replica(store, replace(config(etcd, root, "s-1"), retention=retention)).start()
    try:

        async def pruned() -> bool:
            return await store.count(k.prefix(Kind.AUDIT)) == 1 and (
                await store.count(k.prefix(Kind.TOKENS)) == 1
            )

        await eventually(pruned, 15, "the old records to go")
        kept = await store.newest(k.prefix(Kind.AUDIT), pb.AuditRecord, limit=5)
        assert [e.value.action for e in kept] == ["CancelJob"]
        usage, _ = await store.scan(k.prefix(Kind.USAGE), pb.UsageRecord)
        assert [e.value.gpu_seconds for e in usage] == [2]
        token_id = live.split("_")[1]
        assert await store.get(k.token(token_id), pb.ApiToken) is not None
    finally:
        await replica.stop()
