"""Scheduler on real etcd and real gRPC: submit paths, bad input, rounds, election, fencing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from prometheus_client import REGISTRY

from pollux.client.errors import JobSpecError
from pollux.client.types import JobSpec
from pollux.jobspec import file_path_of
from pollux.policy.goodput_policy import JCT_OBJECTIVE, PolluxPolicy
from pollux.policy.registry import DEFAULT_POLICY
from pollux.policy.tenant_shares import Ledger
from pollux.scheduler import lifecycle
from pollux.scheduler.config import SchedulerConfig, SchedulingConfig
from pollux.scheduler.leader import Election, current_leader
from pollux.scheduler.main import LEADER_HEALTH, SchedulerApp
from pollux.scheduler.scheduler import Scheduler
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.etcd import kv as etcd_kv
from pollux.service.keys import Kind
from pollux.service.session import LeaseSession
from pollux.service.store import Expect, Fence, FenceLost, Put, Store, cancel_and_wait
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

SERVICE = "pollux.v1.SchedulerService"


def spec(name: str = "train", **batch: int) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        command=["python", "-c", "pass"],
        batch=pb.BatchLimits(
            initial_batch_size=batch.get("m0", 64), max_batch_size=batch.get("max", 0)
        ),
        max_replicas=batch.get("replicas", 0),
    )


def config(etcd: EtcdServer, root: str, name: str, policy: str = DEFAULT_POLICY) -> SchedulerConfig:
    return SchedulerConfig(
        id=name,
        lease_ttl_s=2,
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        scheduling=SchedulingConfig(policy=policy, interval_s=0.5, debounce_s=0.05),
    )


class Replica:
    """An in-process scheduler replica (the service's own app) with a client stub."""

    def __init__(self, store: Store, cfg: SchedulerConfig) -> None:
        self.store = store
        self.app = SchedulerApp(store=store, config=replace(cfg, server=ServerConfig(grace_s=0)))
        self.scheduler = self.app.scheduler
        self.channel: grpc.aio.Channel | None = None
        self.stub: spb_grpc.SchedulerServiceStub

    async def start(self) -> Replica:
        await self.app.start()
        self.channel = grpc.aio.insecure_channel(self.app.address)
        self.stub = spb_grpc.SchedulerServiceStub(self.channel)
        return self

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        await self.app.stop()


async def placing_decision(store: Store, job_id: str) -> pb.Decision:
    """The record of the round that gave the job GPUs, once written.

    A round writes its decision after its jobs' records, so a job can be seen placed a moment
    before the decision that placed it is there.
    """

    async def written() -> pb.Decision | None:
        for decision in sorted(await store.latest_decisions(100), key=lambda d: d.round):
            if any(d.job_id == job_id and d.nodes for d in decision.jobs):
                return decision
        return None

    found: pb.Decision = await eventually(written, what=f"the decision that placed {job_id}")
    return found


async def add_node(store: Store, name: str, gpus: int) -> int:
    lease = await store.grant_lease(30)
    await store.register_node(pb.Node(name=name, gpus=gpus, address="127.0.0.1:1"), lease=lease)
    return lease


async def test_submit_is_idempotent_on_request_id(replica: Replica) -> None:
    request = spb.SubmitJobRequest(spec=spec(), request_id="r-1")
    first = await replica.stub.SubmitJob(request)
    again = await replica.stub.SubmitJob(request)
    assert first.created
    assert not again.created
    assert again.job.id == first.job.id
    listed = await replica.stub.ListJobs(spb.ListJobsRequest())
    assert [j.id for j in listed.jobs] == [first.job.id]
    assert first.job.spec.batch.max_batch_size == 64  # defaults made explicit
    assert first.job.history[0].reason == "submitted"


async def test_bad_spec_is_rejected_with_every_field_and_nothing_stored(
    replica: Replica, store: Store
) -> None:
    bad = pb.JobSpec(
        name="Bad Name", batch=pb.BatchLimits(initial_batch_size=0), env={"POLLUX_X": "1"}
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=bad, request_id="r-2"))
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error)
    assert status is not None
    detail = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(detail)
    fields = {v.field for v in detail.field_violations}
    assert {
        "spec.name",
        "spec.command",
        "spec.batch.initial_batch_size",
        "spec.env[POLLUX_X]",
    } <= fields
    jobs, _ = await store.list_jobs()
    assert jobs == []


async def test_the_server_refuses_a_raw_spec_in_the_words_the_client_uses(
    replica: Replica, store: Store
) -> None:
    file = {
        "name": "train",
        "command": ["python", "t.py"],
        "initial_batch_size": 64,
        "max_batch_size": 32,
        "env": {"POLLUX_X": "1"},
        "shm_size_mb": 64,
    }
    with pytest.raises(JobSpecError) as client:
        JobSpec.from_mapping(file)
    raw = pb.JobSpec(
        name="train",
        command=["python", "t.py"],
        batch=pb.BatchLimits(initial_batch_size=64, max_batch_size=32),
        env={"POLLUX_X": "1"},
        shm_size_mb=64,
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=raw, request_id="r-3"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(caught.value)
    assert status is not None
    detail = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(detail)
    fields = [v.field for v in detail.field_violations]
    assert fields == ["spec.env[POLLUX_X]", "spec.batch.max_batch_size", "spec.shm_size_mb"]
    assert [(file_path_of(v.field), v.description) for v in detail.field_violations] == [
        tuple(v) for v in client.value.violations
    ]
    assert (await store.list_jobs())[0] == []


async def test_an_oversized_spec_is_refused_and_nothing_stored(
    replica: Replica, store: Store
) -> None:
    # 1.5 MB of environment: one such job made every round exceed etcd's request limit.
    big = spec("big")
    big.env.update({f"V{i}": "x" * 15_000 for i in range(100)})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=big, request_id="r-big"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 65536" in (caught.value.details() or "")
    assert (await store.list_jobs())[0] == []


async def test_list_pages_are_bounded_in_bytes(replica: Replica) -> None:
    ids = []
    for i in range(40):  # 40 jobs of ~60 KB: 2.4 MB, more than one page may carry
        heavy = spec(f"heavy-{i}")
        heavy.env["PAYLOAD"] = "x" * 60_000
        reply = await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=heavy, request_id=f"h-{i}"))
        ids.append(reply.job.id)
    first = await replica.stub.ListJobs(spb.ListJobsRequest(page_size=1000))
    assert 1 <= len(first.jobs) < 40
    assert first.ByteSize() <= 2 * 1024 * 1024 + 64 * 1024
    seen = [j.id for j in first.jobs]
    token = first.next_page_token
    while token:
        page = await replica.stub.ListJobs(spb.ListJobsRequest(page_size=1000, page_token=token))
        seen.extend(j.id for j in page.jobs)
        token = page.next_page_token
    assert seen == ids


async def test_unknown_job_is_not_found_and_empty_id_invalid(replica: Replica) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.GetJob(spb.GetJobRequest(job_id="j-nope"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.CancelJob(spb.CancelJobRequest(job_id=""))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.ListJobs(spb.ListJobsRequest(page_token="!!", page_size=5000))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_pagination_filters_and_order(replica: Replica) -> None:
    ids = []
    for i in range(5):
        r = await replica.stub.SubmitJob(
            spb.SubmitJobRequest(spec=spec(f"job-{i % 2}"), request_id=f"p-{i}")
        )
        ids.append(r.job.id)
    seen: list[str] = []
    token = ""
    while True:
        page = await replica.stub.ListJobs(spb.ListJobsRequest(page_size=2, page_token=token))
        seen.extend(j.id for j in page.jobs)
        token = page.next_page_token
        if not token:
            break
    assert seen == ids
    odd = await replica.stub.ListJobs(spb.ListJobsRequest(name_prefix="job-1"))
    assert [j.id for j in odd.jobs] == [ids[1], ids[3]]


async def test_round_allocates_cancel_releases_delete_removes(
    replica: Replica, store: Store
) -> None:
    await add_node(store, "n1", 4)
    job = (await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="a"))).job

    async def allocated() -> bool:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got.state == pb.JOB_STATE_ALLOCATED and len(got.allocation.nodes) >= 1

    await eventually(allocated)
    allocations, _ = await store.list_allocations()
    # The default policy (pollux-jct) starts a job that measured nothing on up to 4 GPUs.
    assert list(allocations[job.id].value.nodes) == ["n1"] * 4
    explain = await replica.stub.Explain(spb.ExplainRequest(job_id=job.id))
    assert explain.decision.job_id == job.id
    assert explain.round.round >= 1
    assert explain.round.policy == "pollux-jct"
    # The counterfactuals, evaluated on the live state: a job with no profile yet may use
    # only the 4 GPUs it explores on, and without a model its goodput is unknown.
    assert explain.last_change.state == pb.JOB_STATE_ALLOCATED
    assert [(a.gpus, a.nodes) for a in explain.alternatives] == [(3, 1), (4, 1)]
    assert all(a.speedup > 0 for a in explain.alternatives)
    assert all(a.goodput == 0 for a in explain.alternatives)
    assert list(explain.holders) == []  # no other job holds a GPU
    assert explain.objective == JCT_OBJECTIVE
    assert (explain.queue_position, explain.pending_jobs) == (0, 0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.DeleteJob(spb.DeleteJobRequest(job_id=job.id))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    await replica.stub.CancelJob(spb.CancelJobRequest(job_id=job.id, reason="test"))

    async def cancelled() -> bool:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got.state == pb.JOB_STATE_CANCELLED

    await eventually(cancelled)
    allocations, _ = await store.list_allocations()
    assert job.id not in allocations
    await replica.stub.DeleteJob(spb.DeleteJobRequest(job_id=job.id))
    assert await store.get_job(job.id) is None


async def test_a_job_that_declares_its_size_gets_an_estimated_completion(
    replica: Replica, store: Store
) -> None:
    await add_node(store, "n1", 4)
    job = (await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="e"))).job

    async def allocated() -> bool:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return len(got.allocation.nodes) >= 1

    await eventually(allocated)
    got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
    assert not got.HasField("estimated_completion")  # no model, no declared size yet
    # Its agent publishes a model with a throughput fit and 1000 M0-steps declared left.
    perf = pb.ThroughputParams(
        alpha_c=0.02, beta_c=0.0007, alpha_n=0.15, beta_n=0.01, alpha_r=0.03, beta_r=0.004,
        gamma=2.0,
    )  # fmt: skip
    model = pb.JobModel(
        job_id=job.id, throughput=perf, work=pb.WorkStatus(progress=5.0, remaining=1000.0)
    )
    await store.put(store.keys.model(job.id), model)
    asked = time.time()

    async def estimated() -> bool:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got.HasField("estimated_completion")

    await eventually(estimated)  # the mirror sees the model within a watch delivery
    got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
    assert got.estimated_completion.ToNanoseconds() / 1e9 > asked
    listed = (await replica.stub.ListJobs(spb.ListJobsRequest())).jobs
    assert next(j for j in listed if j.id == job.id).HasField("estimated_completion")
    stored = await store.get_job(job.id)
    assert stored is not None
    assert not stored.value.HasField("estimated_completion")  # computed at read, not stored

    # The replica's forecast (the cluster played forward with the policy) refines it.
    forecaster = replica.app.forecaster
    forecaster.interval_s = 0.2
    await forecaster.stop()
    forecaster.start()
    await eventually(lambda: job.id in forecaster.completion)
    await forecaster.stop()  # no newer forecast between the read and the comparison
    got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
    assert got.estimated_completion.ToNanoseconds() == int(forecaster.completion[job.id] * 1e9)


async def test_an_estimate_borrows_the_newest_earlier_run_of_the_same_name(
    replica: Replica, store: Store
) -> None:
    await add_node(store, "n1", 4)
    request = spb.EstimateJobRequest(spec=spec("resnet"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.EstimateJob(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "run it once" in str(caught.value.details())
    submitted = spb.SubmitJobRequest(spec=spec("resnet"), request_id="est-1")
    earlier = (await replica.stub.SubmitJob(submitted)).job
    perf = pb.ThroughputParams(
        alpha_c=0.02, beta_c=0.0007, alpha_n=0.15, beta_n=0.01, alpha_r=0.03, beta_r=0.004,
        gamma=2.0,
    )  # fmt: skip
    model = pb.JobModel(
        job_id=earlier.id, throughput=perf, work=pb.WorkStatus(progress=300.0, remaining=200.0)
    )
    await store.put(store.keys.model(earlier.id), model)

    async def allocated() -> bool:  # the replica has seen the node (and the model)
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=earlier.id))).job
        return len(got.allocation.nodes) >= 1

    await eventually(allocated)
    found = await replica.stub.EstimateJob(request)
    assert found.reference_job_id == earlier.id
    assert found.work == 500.0  # the earlier run's progress + remaining work
    assert found.predicted_jct_s > 0
    assert found.rounds >= 1
    bad = await _status_of(replica.stub.EstimateJob(spb.EstimateJobRequest()))
    assert bad == grpc.StatusCode.INVALID_ARGUMENT


async def _status_of(call: Any) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_the_jct_mode_schedules_live_with_declared_sizes(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    r = await Replica(store, config(etcd, root, "s-jct", policy="pollux-jct")).start()
    try:
        assert isinstance(r.scheduler.policy, PolluxPolicy)
        assert r.scheduler.policy.jct is not None
        await add_node(store, "n1", 4)
        ids = []
        for i, work in enumerate((50.0, 5000.0)):
            submitted = spb.SubmitJobRequest(spec=spec(f"job-{i}"), request_id=f"jct-{i}")
            job = (await r.stub.SubmitJob(submitted)).job
            model = pb.JobModel(job_id=job.id, work=pb.WorkStatus(progress=0, remaining=work))
            await store.put(store.keys.model(job.id), model)
            ids.append(job.id)

        async def both_allocated() -> bool:
            jobs = [(await r.stub.GetJob(spb.GetJobRequest(job_id=i))).job for i in ids]
            return all(len(j.allocation.nodes) >= 1 for j in jobs)

        await eventually(both_allocated)
        explain = await r.stub.Explain(spb.ExplainRequest(job_id=ids[0]))
        assert explain.round.policy == "pollux-jct"
        assert explain.objective == JCT_OBJECTIVE  # not faithful Pollux's power mean
    finally:
        await r.stop()


@pytest.mark.parametrize("kind", ["place", "full"])
async def test_an_event_round_places_a_new_job_at_once(
    etcd: EtcdServer, root: str, store: Store, kind: str
) -> None:
    # Periodic rounds 30 s apart: within the test every round but the term's first one is an
    # event's. A placement round (the default) moves no running job; a full one may.
    cfg = config(etcd, root, f"s-{kind}")
    cfg = replace(cfg, scheduling=replace(cfg.scheduling, interval_s=30.0, event_rounds=kind))
    r = await Replica(store, cfg).start()
    try:
        await eventually(lambda: r.scheduler.last_round >= 1)  # the term's full round
        await add_node(store, "n1", 8)  # room for both: the default starts each on up to 4
        ids = []
        for name in ("first", "second"):
            submitted = spb.SubmitJobRequest(spec=spec(name), request_id=name)
            job_id = (await r.stub.SubmitJob(submitted)).job.id
            ids.append(job_id)

            async def placed(job_id: str = job_id) -> bool:
                got = (await r.stub.GetJob(spb.GetJobRequest(job_id=job_id))).job
                return len(got.allocation.nodes) >= 1

            await eventually(placed, timeout=10.0)
            await placing_decision(store, job_id)
            if name == "first":
                first = (await r.stub.GetJob(spb.GetJobRequest(job_id=ids[0]))).job
        decisions = sorted(await store.latest_decisions(100), key=lambda d: d.round)
        assert decisions[0].round == 1
        assert not decisions[0].placement  # a term starts with a full round
        assert {record.placement for record in decisions[1:]} == {kind == "place"}
        if kind == "place":
            again = (await r.stub.GetJob(spb.GetJobRequest(job_id=ids[0]))).job
            assert again.allocation == first.allocation  # not moved to make room or grown
    finally:
        await r.stop()


@pytest.mark.parametrize(("mode", "gpus"), [("pollux", 1), ("pollux-jct", 4)])
async def test_a_new_job_starts_on_its_modes_first_step(
    etcd: EtcdServer, root: str, store: Store, mode: str, gpus: int
) -> None:
    # Pollux starts a job that has measured nothing on one GPU; the jct mode on up to its
    # exploration step (4), since a first allocation pays its start-up pause at any size.
    cfg = config(etcd, root, f"s-start-{mode}", policy=mode)
    r = Replica(store, replace(cfg, scheduling=replace(cfg.scheduling, interval_s=30.0)))
    await r.start()
    try:
        await eventually(lambda: r.scheduler.last_round >= 1)  # the term's full round
        await add_node(store, "n1", 8)
        request = spb.SubmitJobRequest(spec=spec(), request_id=f"start-{mode}")
        job_id = (await r.stub.SubmitJob(request)).job.id

        async def placed() -> bool:
            got = (await r.stub.GetJob(spb.GetJobRequest(job_id=job_id))).job
            return len(got.allocation.nodes) >= 1

        await eventually(placed, timeout=10.0)
        got = (await r.stub.GetJob(spb.GetJobRequest(job_id=job_id))).job
        assert list(got.allocation.nodes) == ["n1"] * gpus
        assert got.restarts == 0
        placing = await placing_decision(store, job_id)
        assert placing.placement, "placed by the submission's placement round"
    finally:
        await r.stop()


async def test_with_tenants_an_event_round_is_a_full_one_and_restarts_the_periodic_clock(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    # A placement round cannot see the GPUs a tenant holds elsewhere, so it runs full.
    await store.put(store.keys.tenant("team"), pb.Tenant(name="team", guarantee_gpus=1))
    cfg = config(etcd, root, "s-tenants")
    r = Replica(store, replace(cfg, scheduling=replace(cfg.scheduling, interval_s=30.0)))
    await r.start()
    try:
        await eventually(lambda: r.scheduler.last_round >= 1)
        first_due = r.scheduler._next_full
        await add_node(store, "n1", 4)
        job_id = (await r.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="t"))).job.id

        async def placed() -> bool:
            got = (await r.stub.GetJob(spb.GetJobRequest(job_id=job_id))).job
            return len(got.allocation.nodes) >= 1

        await eventually(placed)
        await placing_decision(store, job_id)
        decisions = await store.latest_decisions(100)
        assert len(decisions) >= 2
        assert not any(d.placement for d in decisions)
        assert r.scheduler._next_full > first_due  # the event's full round restarted it
        # The default tenant mode's ledger of shares owed is carried to the next round.
        ledger = r.scheduler._memory
        assert isinstance(ledger, Ledger)
        assert "team" in ledger.deficit
    finally:
        await r.stop()


async def test_replica_reports_drive_running_and_success(replica: Replica, store: Store) -> None:
    await add_node(store, "n1", 2)
    job = (await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="b"))).job

    async def state_is(state: int) -> bool:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got.state == state

    await eventually(lambda: state_is(pb.JOB_STATE_ALLOCATED))
    got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
    # The default policy starts a new job on up to 4 GPUs: here both of n1's, one replica each.
    assert list(got.allocation.nodes) == ["n1", "n1"]
    statuses = [
        pb.ReplicaStatus(
            job_id=job.id,
            node="n1",
            rank=rank,
            generation=got.allocation.generation,
            phase=pb.REPLICA_PHASE_RUNNING,
        )
        for rank in range(2)
    ]
    for status in statuses:
        await store.put_replica_status(status)
    await eventually(lambda: state_is(pb.JOB_STATE_RUNNING))
    for status in statuses:
        status.phase, status.exit_code = pb.REPLICA_PHASE_EXITED, 0
        await store.put_replica_status(status)
    await eventually(lambda: state_is(pb.JOB_STATE_SUCCEEDED))
    done = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
    assert [pb.JobState.Name(h.state) for h in done.history] == [
        "JOB_STATE_PENDING",
        "JOB_STATE_ALLOCATED",
        "JOB_STATE_RUNNING",
        "JOB_STATE_SUCCEEDED",
    ]


async def test_failed_replica_restarts_then_fails_the_job(replica: Replica, store: Store) -> None:
    await add_node(store, "n1", 1)
    failing = replace_spec(spec(), max_failures=1)
    job = (await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=failing, request_id="c"))).job

    async def current() -> pb.Job:
        return (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job

    async def has_generation(gen: int) -> bool:
        return (await current()).allocation.generation == gen

    await eventually(lambda: has_generation(1))
    await store.put_replica_status(
        pb.ReplicaStatus(
            job_id=job.id,
            node="n1",
            rank=0,
            generation=1,
            phase=pb.REPLICA_PHASE_EXITED,
            exit_code=1,
        )
    )
    await eventually(lambda: has_generation(2))
    assert (await current()).failures == 1
    await store.put_replica_status(
        pb.ReplicaStatus(
            job_id=job.id,
            node="n1",
            rank=0,
            generation=2,
            phase=pb.REPLICA_PHASE_EXITED,
            exit_code=1,
            output_tail="Traceback (most recent call last): | ValueError: lr must be > 0",
        )
    )

    async def failed() -> bool:
        return (await current()).state == pb.JOB_STATE_FAILED

    await eventually(failed)
    # Why it failed is in its history, for describe: the replica's last lines.
    assert (await current()).history[-1].reason == (
        "replica 0 on n1 exited 1; 2 failures: Traceback (most recent call last): | "
        "ValueError: lr must be > 0"
    )


async def test_a_job_restarted_by_many_rounds_keeps_its_first_and_latest_history(
    replica: Replica, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "MAX_RECENT_HISTORY", 4)  # the bound, reached in few rounds
    await add_node(store, "n1", 1)
    job = (await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="h"))).job

    async def current() -> pb.Job:
        return (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job

    async def at(state: int, generation: int) -> bool:
        got = await current()
        return got.state == state and got.allocation.generation == generation

    def status(generation: int, phase: int, exit_code: int = 0) -> pb.ReplicaStatus:
        return pb.ReplicaStatus(
            job_id=job.id,
            node="n1",
            rank=0,
            generation=generation,
            phase=phase,
            exit_code=exit_code,
        )

    await eventually(lambda: at(pb.JOB_STATE_ALLOCATED, 1))
    for generation in range(1, 7):  # every planned stop restarts it: RESCALING, then RUNNING
        await store.put_replica_status(status(generation, pb.REPLICA_PHASE_RUNNING))
        await eventually(lambda g=generation: at(pb.JOB_STATE_RUNNING, g))
        await store.put_replica_status(status(generation, pb.REPLICA_PHASE_EXITED, 143))
        await eventually(lambda g=generation: at(pb.JOB_STATE_RESCALING, g + 1))
    history = (await current()).history
    assert len(history) == 1 + 4
    assert (history[0].state, history[0].reason) == (pb.JOB_STATE_PENDING, "submitted")
    assert [h.state for h in history[1:]] == [pb.JOB_STATE_RUNNING, pb.JOB_STATE_RESCALING] * 2
    assert "exit 143" in history[-1].reason


def too_large_rounds() -> float:
    value = REGISTRY.get_sample_value("pollux_scheduler_rounds_total", {"outcome": "too_large"})
    return value or 0.0


async def test_a_write_over_the_store_bound_keeps_the_leader_and_is_resource_exhausted(
    replica: Replica, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    heavy = spec("heavy")
    heavy.env["PAYLOAD"] = "x" * 20_000
    job = (await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=heavy, request_id="t"))).job
    await eventually(lambda: replica.scheduler.leadership.leading, what="leadership")
    fence = replica.scheduler.leadership.fence
    # As if a bound elsewhere were broken: the stored record is now over the store's bound.
    monkeypatch.setattr(etcd_kv, "MAX_VALUE_BYTES", 10_000)
    before = too_large_rounds()
    await add_node(store, "n1", 1)  # the next round would allocate it: a write of the record
    await eventually(lambda: too_large_rounds() > before, what="a refused round")
    assert replica.scheduler.leadership.leading
    assert replica.scheduler.leadership.fence == fence  # refused, not a lost leadership
    # A refused round is followed by the next periodic one, not retried in a tight loop.
    seen = too_large_rounds()
    await asyncio.sleep(1.5)
    assert too_large_rounds() - seen <= 10  # 0.5 s rounds: about three in 1.5 s
    stored = await store.get_job(job.id)
    assert stored is not None
    assert stored.value.state == pb.JOB_STATE_PENDING
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.CancelJob(spb.CancelJobRequest(job_id=job.id))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = caught.value.details() or ""
    assert store.keys.job(job.id).decode() in details
    assert "10000" in details


def replace_spec(s: pb.JobSpec, **fields: int) -> pb.JobSpec:
    out = pb.JobSpec()
    out.CopyFrom(s)
    for k, v in fields.items():
        setattr(out, k, v)
    return out


async def test_standby_takes_over_and_deposed_leader_cannot_write(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    first = await Replica(store, config(etcd, root, "s-a")).start()
    await eventually(lambda: _leads(store, "s-a"))
    second_store = await Store.connect(etcd.endpoint, root)
    second = await Replica(second_store, config(etcd, root, "s-b")).start()
    try:
        fence = first.scheduler.leadership.fence
        assert fence is not None
        await first.stop()
        await eventually(lambda: _leads(store, "s-b"), timeout=10)
        # The old fence must not be able to write any more.
        with pytest.raises(FenceLost):
            await store.txn([Put(store.keys.job("ghost"), b"")], fence=fence)
        assert await store.get_job("ghost") is None
        status = await second.stub.ClusterStatus(spb.ClusterStatusRequest())
        assert status.leader_id == "s-b"
    finally:
        await second.stop()
        await second_store.close()


async def _health(replica: Replica, service: str) -> int:
    assert replica.channel is not None
    reply = await health_pb2_grpc.HealthStub(replica.channel).Check(
        health_pb2.HealthCheckRequest(service=service)
    )
    return int(reply.status)


async def test_leader_health_is_serving_only_on_the_replica_that_leads(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    first = await Replica(store, config(etcd, root, "s-a")).start()
    await eventually(lambda: _leads(store, "s-a"))
    second_store = await Store.connect(etcd.endpoint, root)
    second = await Replica(second_store, config(etcd, root, "s-b")).start()
    try:

        async def serves(replica: Replica) -> bool:
            return await _health(replica, LEADER_HEALTH) == serving

        await eventually(lambda: serves(first), 10, "the leader to report SERVING")
        assert await _health(second, LEADER_HEALTH) == not_serving
        for replica in (first, second):  # every replica serves reads and submits
            assert await _health(replica, SERVICE) == serving
        await first.stop()
        await eventually(lambda: serves(second), 10, "the new leader to report SERVING")
    finally:
        await second.stop()
        await second_store.close()


async def _leads(store: Store, member_id: str) -> bool:
    leader = await current_leader(store)
    return leader is not None and leader.id == member_id


async def test_expired_lease_fences_a_paused_leader(store: Store) -> None:
    session = LeaseSession(store, 2, holder="leader")
    await session.start()
    fence = await Election(session, pb.Member(id="paused")).campaign()
    await store.txn([Put(store.keys.job("ok"), b"")], fence=fence)
    # Simulate a long pause: stop refreshing and let etcd expire the lease (which deletes the
    # election key with it).
    assert session._task is not None
    # cancel_and_wait: a single cancel that lands in aetcd's keep-alive `wait_for` is
    # swallowed (cpython#86296), and the lease would then be refreshed on for good.
    await cancel_and_wait(session._task)

    async def key_expired() -> bool:
        return await store.get(store.keys.leader(session.lease_id), pb.Member) is None

    await eventually(key_expired, 10, "etcd to expire the paused leader's lease")
    with pytest.raises(FenceLost):
        await store.txn([Put(store.keys.job("late"), b"")], fence=fence)
    assert await store.get_job("late") is None
    await session.close(revoke=False)


async def test_a_standby_whose_watch_never_fires_still_takes_over_within_two_ttls(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    # After an etcd restart aetcd can attach a watch to the wrong request, so the delete of the
    # leader key never arrives; the standby must find out from etcd itself.
    first = LeaseSession(store, 2, holder="leader")
    await first.start()
    await Election(first, pb.Member(id="first")).campaign()
    standby_store = await Store.connect(etcd.endpoint, root)

    async def deaf_watch(prefix: bytes, *, start_revision: int) -> AsyncIterator[Any]:
        await asyncio.Event().wait()  # never delivers anything
        yield  # pragma: no cover - makes this an async generator

    standby_store.watch = deaf_watch  # type: ignore[method-assign]
    second = LeaseSession(standby_store, 2, holder="leader")
    await second.start()
    try:
        campaign = asyncio.create_task(Election(second, pb.Member(id="second")).campaign())
        await eventually(lambda: _has_two_candidates(store), 5, "the standby to campaign")
        assert not campaign.done()
        started = asyncio.get_running_loop().time()
        await first.close(revoke=True)  # the leader goes away
        fence = await asyncio.wait_for(campaign, timeout=10)
        assert fence.key == store.keys.leader(second.lease_id)
        assert asyncio.get_running_loop().time() - started <= 2 * second.ttl_s + 1
    finally:
        await second.close()
        await standby_store.close()


async def _has_two_candidates(store: Store) -> bool:
    entries, _ = await store.scan(store.keys.prefix(Kind.LEADER), pb.Member)
    return len(entries) == 2


async def test_a_job_changed_during_a_commit_is_left_out_not_the_whole_round(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    # A burst of cancels changes records while a round commits; re-planning the round at each
    # conflict kept rounds from finishing for as long as the burst lasted.
    scheduler = Scheduler(store, config(etcd, root, "s-1"), address="")
    lease = await store.grant_lease(30)
    leader = store.keys.leader(lease)
    fence = Fence(leader, await store.put(leader, pb.Member(id="s-1"), lease=lease))
    read = {}
    for name in ("a", "b", "c"):
        read[name] = await store.put(store.keys.job(name), pb.Job(id=name))
    await store.put(store.keys.job("b"), pb.Job(id="b", cancel_requested=True))  # meanwhile
    chunk = [
        (
            [Put(store.keys.job(n), pb.Job(id=n, restarts=1).SerializeToString())],
            [Expect(store.keys.job(n), read[n])],
        )
        for n in ("a", "b", "c")
    ]
    await scheduler._commit_chunk(chunk, fence)
    stored = {}
    for name in ("a", "b", "c"):
        entry = await store.get(store.keys.job(name), pb.Job)
        assert entry is not None
        stored[name] = entry.value
    assert (stored["a"].restarts, stored["c"].restarts) == (1, 1)
    assert stored["b"].cancel_requested, "the user's change stays"
    assert stored["b"].restarts == 0
