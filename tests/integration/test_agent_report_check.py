"""Report bounds on a real agent: gRPC server on 127.0.0.1:0 and real etcd.

A forged report is clipped to a bounded weight and then outweighed by honest ones; implausible
reports are INVALID_ARGUMENT naming the field and the bound, and leave etcd as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
import structlog
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from pollux.agent.config import AgentConfig
from pollux.agent.main import AgentApp
from pollux.agent.profile import MAX_REPORT_STEPS
from pollux.agent.report_check import MAX_REPORT_SPAN_S
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Store
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import agent_service_pb2_grpc as api_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)

LIMITS = pb.BatchLimits(initial_batch_size=128, max_batch_size=1024)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def agent_stub(
    etcd: EtcdServer, root: str, clock: Clock
) -> AsyncIterator[api_grpc.AgentServiceStub]:
    store = await Store.connect(etcd.endpoint, root)
    config = AgentConfig(
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(grace_s=0),
        agent_id="agent-a",
        lease_ttl_s=5,
    )
    app = AgentApp(config, store, clock=clock)
    try:
        await app.start()
        async with grpc.aio.insecure_channel(app.address) as channel:
            yield api_grpc.AgentServiceStub(channel)
    finally:
        await app.stop()
        await store.close()


async def make_job(store: Store) -> None:
    spec = pb.JobSpec(name="train", command=["true"], batch=LIMITS, max_replicas=4)
    await store.create_job(pb.Job(id="j-1", request_id="req-j-1", spec=spec))


def report(
    seq: int, *, count: int, optim_s: float, replicas: int = 2, local: int = 64, rank: int = 0
) -> api.ReportMetricsRequest:
    return api.ReportMetricsRequest(
        job_id="j-1",
        generation=1,
        rank=rank,
        seq=seq,
        observations=[
            pb.StepObservation(
                num_nodes=1,
                num_replicas=replicas,
                local_batch_size=local,
                accum_steps=1,
                accum_step_time_s=optim_s / 2,
                optim_step_time_s=optim_s,
                count=count,
            )
        ],
    )


def violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    status = rpc_status.from_call(error)
    assert status is not None
    out = {}
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        assert detail.Unpack(bad)
        out.update((v.field, v.description) for v in bad.field_violations)
    return out


async def refused(stub: api_grpc.AgentServiceStub, request: api.ReportMetricsRequest) -> dict:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ReportMetrics(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return violations(caught.value)


async def test_a_forged_report_is_clipped_then_outweighed(etcd, root, store):
    await make_job(store)
    clock = Clock()
    async with agent_stub(etcd, root, clock) as stub:
        with structlog.testing.capture_logs() as logs:
            forged = await stub.ReportMetrics(report(1, count=10**6, optim_s=1e-4))
        assert forged.applied
        assert forged.observations == MAX_REPORT_STEPS
        clipped = [e for e in logs if e["event"] == "agent_report_clipped"]
        assert clipped == [
            {
                "event": "agent_report_clipped",
                "log_level": "info",
                "job_id": "j-1",
                "generation": 1,
                "rank": 0,
                "seq": 1,
                "claimed_steps": 10**6,
                "kept_steps": MAX_REPORT_STEPS,
            }
        ]
        for seq in range(2, 202):  # a report of fifty 0.1 s steps every 5 s
            clock.now += 5.0
            assert (await stub.ReportMetrics(report(seq, count=50, optim_s=0.1))).applied
        model = (await stub.GetModel(api.GetModelRequest(job_id="j-1"))).model
    assert model.observations == MAX_REPORT_STEPS + 200 * 50
    profile = await store.get_profile("j-1")
    assert profile is not None
    (row,) = profile.value.observations
    assert row.optim_step_time_s == pytest.approx(0.1, rel=0.05)


async def test_implausible_reports_are_refused_and_store_nothing(etcd, root, store):
    await make_job(store)
    clock = Clock()
    async with agent_stub(etcd, root, clock) as stub:
        too_long = await refused(stub, report(1, count=1, optim_s=3600))
        assert too_long == {
            "observations[0].accum_step_time_s": "1800 s; at most 600 s",
            "observations[0].optim_step_time_s": "3600 s; at most 600 s",
        }
        too_wide = await refused(stub, report(1, count=1, optim_s=0.1, replicas=8))
        assert too_wide == {"observations[0].num_replicas": "8 exceeds the job's max_replicas (4)"}
        too_big = await refused(stub, report(1, count=1, optim_s=0.1, local=1024))
        assert "max_batch_size 1024" in too_big["observations[0].local_batch_size"]
        assert await store.get_profile("j-1") is None
        assert await store.get_model("j-1") is None

        # The replica's time budget: a full backlog at once, then wall time only.
        full = int(MAX_REPORT_SPAN_S / 0.5)
        assert (await stub.ReportMetrics(report(1, count=full, optim_s=0.5))).applied
        before = await store.get_profile("j-1")
        over = await refused(stub, report(2, count=100, optim_s=0.5))
        assert "replica 1/0 may claim at most 0 s more now" in over["observations"]
        assert await store.get_profile("j-1") == before
        clock.now += 50.0  # 50 s later, 50 s of steps are plausible again
        assert (await stub.ReportMetrics(report(2, count=100, optim_s=0.5))).applied
        # Another replica has its own budget; a retry of an applied report is no claim.
        assert (await stub.ReportMetrics(report(1, count=100, optim_s=0.5, rank=1))).applied
        retry = await stub.ReportMetrics(report(2, count=100, optim_s=0.5))
        assert not retry.applied
