"""AgentService on real etcd and real grpc.aio servers on 127.0.0.1:0.

Each test runs one or two agents (each with its own store connection, as separate processes
would) over the test's key root, and talks to them through the generated stub.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
import pytest
import structlog
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from pollux.agent.agent import Agent
from pollux.agent.batch_config import choose
from pollux.agent.config import AgentConfig
from pollux.agent.main import AgentApp
from pollux.agent.profile import goodput_model
from pollux.goodput import PerfParams, goodput, step_times
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.keys import Kind
from pollux.service.store import Store
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import agent_service_pb2_grpc as api_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)

LIMITS = pb.BatchLimits(
    initial_batch_size=128, max_batch_size=2048, min_local_batch_size=16, max_local_batch_size=256
)
PERF = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Running:
    agent: Agent
    stub: api_grpc.AgentServiceStub
    address: str


@contextlib.asynccontextmanager
async def running_agent(
    etcd: EtcdServer,
    root: str,
    agent_id: str,
    *,
    clock: Callable[[], float] | None = None,
    refit_min_interval_s: float = 30.0,
    lease_ttl_s: int = 5,
) -> AsyncIterator[Running]:
    """An agent process's app (gRPC server and agent) with its own etcd connection."""
    store = await Store.connect(etcd.endpoint, root)
    config = AgentConfig(
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(grace_s=0),
        agent_id=agent_id,
        lease_ttl_s=lease_ttl_s,
        refit_min_interval_s=refit_min_interval_s,
    )
    app = AgentApp(config, store, clock=clock or FakeClock())
    try:
        await app.start()
        async with grpc.aio.insecure_channel(app.address) as channel:
            yield Running(app.agent, api_grpc.AgentServiceStub(channel), app.address)
    finally:
        await app.stop()
        await store.close()


async def make_job(store: Store, job_id: str = "j-1") -> None:
    await store.create_job(
        pb.Job(
            id=job_id,
            request_id=f"req-{job_id}",
            state=pb.JOB_STATE_RUNNING,
            spec=pb.JobSpec(name="train", command=["true"], batch=LIMITS),
        )
    )


def observation(nodes: int, replicas: int, local: int, count: int = 5) -> pb.StepObservation:
    accum, optim = step_times(PERF, nodes, replicas, local)
    return pb.StepObservation(
        num_nodes=nodes,
        num_replicas=replicas,
        local_batch_size=local,
        accum_steps=1,
        accum_step_time_s=float(accum),
        optim_step_time_s=float(optim),
        count=count,
    )


def report(
    seq: int, *observations: pb.StepObservation, rank: int = 0, job_id: str = "j-1"
) -> api.ReportMetricsRequest:
    return api.ReportMetricsRequest(
        job_id=job_id,
        generation=1,
        rank=rank,
        seq=seq,
        observations=observations,
        gradient=pb.GradientStats(sqr=1.0, var=20.0),
    )


def violations(error: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(error)
    assert status is not None
    fields = []
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        assert detail.Unpack(bad)
        fields.extend(v.field for v in bad.field_violations)
    return fields


async def test_reports_build_a_model_that_batch_configs_follow(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        for seq, obs in enumerate(
            [observation(1, 1, 64), observation(1, 4, 128), observation(2, 8, 64)], start=1
        ):
            reply = await a.stub.ReportMetrics(report(seq, obs))
            assert reply.applied
            assert reply.observations == 5 * seq
        model = (await a.stub.GetModel(api.GetModelRequest(job_id="j-1"))).model
        assert model.HasField("throughput")
        assert (model.observations, model.max_profiled_replicas) == (15, 8)
        assert (model.grad_sqr, model.grad_var) == (1.0, 20.0)
        assert model.batch == LIMITS
        assert model.agent_id == "agent-a"

        config = (
            await a.stub.GetBatchConfig(
                api.GetBatchConfigRequest(job_id="j-1", num_nodes=1, num_replicas=4)
            )
        ).config
        assert 16 <= config.local_batch_size <= 256
        assert config.total_batch_size == config.local_batch_size * config.accum_steps * 4
        assert config.total_batch_size <= 2048
        assert config.predicted_speedup > 1.0
        profile = await store.get_profile("j-1")
        assert profile is not None
        assert profile.value.last_configs["1/4"].local_batch_size == config.local_batch_size


async def test_rank_0_reports_record_a_timeline_point_per_interval_and_generation(
    etcd, root, store
):
    await make_job(store)
    clock = FakeClock()
    async with running_agent(etcd, root, "agent-a", clock=clock) as a:
        await a.stub.ReportMetrics(report(1, observation(1, 1, 64)))
        await a.stub.ReportMetrics(report(1, observation(1, 2, 64), rank=1))  # not rank 0
        clock.now += 5  # within the 15 s interval: no point
        await a.stub.ReportMetrics(report(2, observation(1, 1, 64)))
        clock.now += 20
        await a.stub.ReportMetrics(report(3, observation(1, 2, 64)))
        rescaled = report(4, observation(1, 4, 64))
        rescaled.generation = 2  # a new generation is recorded at once
        await a.stub.ReportMetrics(rescaled)
    timeline = await store.get_timeline("j-1")
    assert timeline is not None
    points = list(timeline.value.points)
    assert [(p.generation, p.gpus) for p in points] == [(1, 1), (1, 2), (2, 4)]
    first = points[0]
    _, optim = step_times(PERF, 1, 1, 64)
    assert first.batch_size == 64
    assert first.throughput == pytest.approx(64 / float(optim))
    assert 0 < first.efficiency <= 1
    assert first.goodput == pytest.approx(first.throughput * first.efficiency)
    assert points[-1].predicted_goodput > 0  # the model was fitted by then
    assert points[0].time.ToSeconds() == 1_700_000_000


async def test_a_batch_config_before_any_report_splits_the_initial_batch(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        request = api.GetBatchConfigRequest(job_id="j-1", num_nodes=1, num_replicas=4)
        config = (await a.stub.GetBatchConfig(request)).config
        assert (config.local_batch_size, config.accum_steps, config.total_batch_size) == (
            32,
            1,
            128,
        )
        assert config.predicted_speedup == 0.0
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.stub.GetModel(api.GetModelRequest(job_id="j-1"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no model yet" in (caught.value.details() or "")


async def test_hysteresis_state_is_read_from_etcd_so_any_agent_keeps_a_close_choice(
    etcd, root, store
):
    await make_job(store)
    shape = api.GetBatchConfigRequest(job_id="j-1", num_nodes=1, num_replicas=4)
    async with running_agent(etcd, root, "agent-a") as a:
        for seq, obs in enumerate([observation(1, 1, 64), observation(1, 4, 128)], start=1):
            await a.stub.ReportMetrics(report(seq, obs))
    model = await store.get_model("j-1")
    assert model is not None
    gm = goodput_model(model.value, LIMITS)
    best = choose(LIMITS, model.value, 1, 4, last=None, hysteresis=0.0)
    top = float(goodput(gm, 1, 4, best.local_batch_size, best.accum_steps - 1))
    close = next(
        local
        for local in range(best.local_batch_size - 1, 15, -1)
        if 0.97 < float(goodput(gm, 1, 4, local, best.accum_steps - 1)) / top < 0.995
    )
    # What agent-a would have stored had it handed out `close` earlier for this shape.
    profile = await store.get_profile("j-1")
    assert profile is not None
    previous = pb.BatchConfig(
        local_batch_size=close,
        accum_steps=best.accum_steps,
        total_batch_size=close * best.accum_steps * 4,
    )
    profile.value.last_configs["1/4"].CopyFrom(previous)
    await store.save_profile_and_model(profile.value, None, expected=profile.mod_revision)

    async with running_agent(etcd, root, "agent-b") as b:
        config = (await b.stub.GetBatchConfig(shape)).config
    assert (config.local_batch_size, config.accum_steps) == (close, best.accum_steps)


async def test_an_allocation_too_large_for_the_limits_is_a_failed_precondition(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        request = api.GetBatchConfigRequest(job_id="j-1", num_nodes=4, num_replicas=256)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.stub.GetBatchConfig(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "fewer replicas" in (caught.value.details() or "")


async def test_an_invalid_report_names_every_field_and_stores_nothing(etcd, root, store):
    await make_job(store)
    bad = report(1, pb.StepObservation(num_nodes=2, num_replicas=1, optim_step_time_s=-1))
    bad.gradient.sqr = float("nan")
    async with running_agent(etcd, root, "agent-a") as a:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.stub.ReportMetrics(bad)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(caught.value) == [
        "observations[0].num_replicas",
        "observations[0].local_batch_size",
        "observations[0].accum_steps",
        "observations[0].optim_step_time_s",
        "observations[0].count",
        "gradient.sqr",
    ]
    assert await store.get_profile("j-1") is None
    assert await store.get_model("j-1") is None


async def test_a_report_without_a_job_id_is_invalid_and_stores_nothing(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.stub.ReportMetrics(report(1, observation(1, 1, 64), job_id=""))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(caught.value) == ["job_id"]
    assert await store.list_keys(store.keys.prefix(Kind.OBSERVATIONS)) == []


async def test_an_impossible_shape_is_invalid(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.stub.GetBatchConfig(api.GetBatchConfigRequest(job_id="j-1", num_nodes=0))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(caught.value) == ["num_nodes", "num_replicas"]


async def test_unknown_jobs_are_not_found_and_nothing_is_stored(etcd, root, store):
    async with running_agent(etcd, root, "agent-a") as a:
        calls = [
            a.stub.ReportMetrics(report(1, observation(1, 1, 64), job_id="nope")),
            a.stub.GetBatchConfig(
                api.GetBatchConfigRequest(job_id="nope", num_nodes=1, num_replicas=1)
            ),
            a.stub.GetModel(api.GetModelRequest(job_id="nope")),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert await store.list_keys(store.keys.prefix(Kind.OBSERVATIONS)) == []
    assert await store.list_keys(store.keys.prefix(Kind.MODELS)) == []


async def test_reports_for_a_deleted_job_are_not_found_and_do_not_resurrect_it(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        await a.stub.ReportMetrics(report(1, observation(1, 1, 64)))
        job = await store.get_job("j-1")
        assert job is not None
        await store.delete_job(job.value, expected=job.mod_revision)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.stub.ReportMetrics(report(2, observation(1, 1, 64)))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert await store.get_profile("j-1") is None
    assert await store.get_model("j-1") is None


async def test_a_retried_report_is_applied_once(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        request = report(1, observation(1, 2, 64))
        first = await a.stub.ReportMetrics(request)
        retry = await a.stub.ReportMetrics(request)
    assert (first.applied, first.observations) == (True, 5)
    assert (retry.applied, retry.observations) == (False, 5)
    profile = await store.get_profile("j-1")
    assert profile is not None
    assert [o.count for o in profile.value.observations] == [5]


async def test_a_replacement_agent_resumes_the_same_profile_and_model(etcd, root, store):
    await make_job(store)
    shape = api.GetBatchConfigRequest(job_id="j-1", num_nodes=1, num_replicas=4)
    async with running_agent(etcd, root, "agent-a") as a:
        for seq, obs in enumerate([observation(1, 1, 64), observation(1, 4, 128)], start=1):
            await a.stub.ReportMetrics(report(seq, obs))
        model_a = (await a.stub.GetModel(api.GetModelRequest(job_id="j-1"))).model
        config_a = (await a.stub.GetBatchConfig(shape)).config
        profile_a = await store.get_profile("j-1")
    assert profile_a is not None
    assert await store.list_keys(store.keys.prefix(Kind.AGENTS)) == []  # a deregistered

    async with running_agent(etcd, root, "agent-b") as b:
        assert (await b.stub.GetModel(api.GetModelRequest(job_id="j-1"))).model == model_a
        assert (await b.stub.GetBatchConfig(shape)).config == config_a
        profile_b = await store.get_profile("j-1")
        assert profile_b is not None
        assert profile_b.value == profile_a.value  # nothing to change: no write
        retry = await b.stub.ReportMetrics(report(2, observation(1, 4, 128)))
        assert (retry.applied, retry.observations) == (False, 10)
        more = await b.stub.ReportMetrics(report(3, observation(1, 4, 128)))
        assert (more.applied, more.observations) == (True, 15)
        model_b = (await b.stub.GetModel(api.GetModelRequest(job_id="j-1"))).model
    assert model_b.agent_id == "agent-b"
    assert model_b.throughput.alpha_c == pytest.approx(model_a.throughput.alpha_c, rel=0.05)


async def test_concurrent_reports_through_two_agents_are_all_counted(etcd, root, store):
    await make_job(store)
    async with (
        running_agent(etcd, root, "agent-a") as a,
        running_agent(etcd, root, "agent-b") as b,
    ):
        await eventually(
            lambda: a.agent.live_agents == b.agent.live_agents == {"agent-a", "agent-b"}
        )

        async def replica(rank: int, stub: api_grpc.AgentServiceStub) -> None:
            for seq in range(1, 9):
                reply = await stub.ReportMetrics(report(seq, observation(1, 2, 64, 1), rank=rank))
                assert reply.applied

        await asyncio.gather(replica(0, a.stub), replica(1, b.stub))
    profile = await store.get_profile("j-1")
    assert profile is not None
    assert dict(profile.value.applied_seq) == {"1/0": 8, "1/1": 8}
    assert [o.count for o in profile.value.observations] == [16]
    model = await store.get_model("j-1")
    assert model is not None
    assert model.value.observations == 16


async def test_refits_follow_new_configurations_and_the_interval(etcd, root, store):
    await make_job(store)
    clock = FakeClock()
    async with running_agent(etcd, root, "agent-a", clock=clock, refit_min_interval_s=60) as a:
        first = await a.agent.report_metrics(report(1, observation(1, 1, 64)))
        same = await a.agent.report_metrics(report(2, observation(1, 1, 64)))
        new = await a.agent.report_metrics(report(3, observation(1, 2, 64)))
        clock.now += 61
        late = await a.agent.report_metrics(report(4, observation(1, 2, 64)))
    assert first.fit_seconds is not None
    assert same.fit_seconds is None
    assert new.fit_seconds is not None
    assert late.fit_seconds is not None
    model = await store.get_model("j-1")
    assert model is not None
    assert model.value.update_time.seconds == int(clock.now)


async def test_agents_register_watch_each_other_and_deregister(etcd, root, store):
    async with running_agent(etcd, root, "agent-a") as a:
        agents, _ = await store.list_agents()
        assert [(e.value.id, e.value.address) for e in agents] == [("agent-a", a.address)]
        assert a.agent.owns("any-job")
        async with running_agent(etcd, root, "agent-b"):
            await eventually(lambda: a.agent.live_agents == {"agent-a", "agent-b"})
            owners = {a.agent.owns(f"j-{i}") for i in range(20)}
            assert owners == {True, False}
        await eventually(lambda: a.agent.live_agents == {"agent-a"})
    assert await store.list_keys(store.keys.prefix(Kind.AGENTS)) == []


async def test_a_lost_lease_is_replaced_and_the_agent_registers_again(etcd, root, store):
    async with running_agent(etcd, root, "agent-a", lease_ttl_s=3):
        agents, _ = await store.list_agents()
        (entry,) = agents
        await store.revoke_lease(entry.lease)  # as if etcd had expired it

        async def registered_again() -> bool:
            again, _ = await store.list_agents()
            return len(again) == 1 and again[0].lease != entry.lease

        await eventually(registered_again, 10, "the agent to register again")


async def test_each_rpc_logs_one_canonical_line_with_its_job(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        with structlog.testing.capture_logs(
            processors=[structlog.contextvars.merge_contextvars]
        ) as logs:
            await a.stub.ReportMetrics(report(1, observation(1, 1, 64)))
            with pytest.raises(grpc.aio.AioRpcError):
                await a.stub.GetModel(api.GetModelRequest(job_id="missing"))
    lines = [entry for entry in logs if entry["event"] == "rpc"]
    assert [(e["rpc"], e["job_id"], e["code"]) for e in lines] == [
        ("ReportMetrics", "j-1", "OK"),
        ("GetModel", "missing", "NOT_FOUND"),
    ]
    assert lines[0]["applied"] is True
    assert all(e["duration_ms"] >= 0 for e in lines)
