"""The training library's AgentLink against a real agent on real etcd and gRPC.

The link is synchronous (it runs in training processes), so the tests drive it from a worker
thread while the agent's grpc.aio server runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpc
import pytest
import structlog

from pollux.train.agent_link import AgentLink
from pollux.train.data import BatchConfig
from pollux.train.gns import GradStats
from pollux.train.metrics import MetricsBatch, StepObservation
from pollux.v1 import agent_service_pb2 as api
from tests.integration.test_agent_service import make_job, running_agent
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def dead_address() -> str:
    """A loopback port with nothing listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def metrics(seq: int, replicas: int, local: int, job_id: str = "j-1") -> MetricsBatch:
    return MetricsBatch(
        job_id=job_id,
        generation=1,
        rank=0,
        seq=seq,
        observations=(
            StepObservation(
                num_nodes=1,
                num_replicas=replicas,
                local_bsz=local,
                accum_steps=1,
                accum_step_time_s=0.02 + 0.0005 * local,
                optim_step_time_s=0.03 + 0.0005 * local + 0.01 * (replicas - 1),
                count=5,
            ),
        ),
        grad=GradStats(sqr=1.0, var=40.0),
        created_at=0.0,
    )


async def test_reports_reach_the_agent_past_a_dead_address_and_configs_come_back(etcd, root, store):
    await make_job(store)
    async with running_agent(etcd, root, "agent-a") as a:
        # Deadlines are not under test: generous ones keep a loaded machine from failing it.
        link = AgentLink([dead_address(), a.address], "j-1", timeout_s=10.0, refresh_s=0.2)
        try:
            for seq, (k, m) in enumerate([(1, 64), (2, 64), (2, 128)], start=1):
                await asyncio.to_thread(link.send, metrics(seq, k, m))
            model = (await a.stub.GetModel(api.GetModelRequest(job_id="j-1"))).model
            assert model.observations == 15
            assert model.HasField("throughput")
            assert (model.grad_sqr, model.grad_var) == (1.0, 40.0)

            # The first call for a shape asks the agent (a replica does so when it starts);
            # run it off the event loop, which serves the agent.
            config: BatchConfig | None = await asyncio.to_thread(
                link.batch_config, num_nodes=1, num_replicas=2
            )
            assert config is not None
            assert 16 <= config.local_bsz <= 256
            assert config.total(2) <= 2048
        finally:
            link.close()


async def test_a_report_refused_for_good_is_dropped_with_a_warning(etcd, root, store):
    # NOT_FOUND (the job is gone) will never succeed: raising would make the trainer's
    # reporter retry it forever and hold up every report behind it.
    async with running_agent(etcd, root, "agent-a") as a:
        # A generous deadline: on a loaded machine the first call (connect, etcd read) can take
        # over a second, and DEADLINE_EXCEEDED is rightly retried, not dropped.
        link = AgentLink([a.address], "j-missing", timeout_s=10.0)
        try:
            with structlog.testing.capture_logs() as logs:
                await asyncio.to_thread(link.send, metrics(1, 1, 64, job_id="j-missing"))
            rejected = [e for e in logs if e["event"] == "metrics_rejected"]
            assert [e["code"] for e in rejected] == ["NOT_FOUND"]
        finally:
            link.close()


async def test_an_unreachable_agent_raises_so_the_report_is_retried(etcd, root, store):
    link = AgentLink([dead_address()], "j-1", timeout_s=0.5)
    try:
        with pytest.raises(grpc.RpcError) as raised:
            await asyncio.to_thread(link.send, metrics(1, 1, 64))
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        link.close()


async def test_a_link_follows_its_job_to_another_agent_without_a_restart(etcd, root, store):
    await make_job(store)
    first = contextlib.AsyncExitStack()
    a = await first.enter_async_context(running_agent(etcd, root, "agent-a"))
    async with first, running_agent(etcd, root, "agent-b") as b:
        await eventually(lambda: a.agent.live_agents == {"agent-a", "agent-b"}, 10, "a to see b")
        # Started when only agent-a was known (as POLLUX_AGENT_ADDR would say).
        link = AgentLink([a.address], "j-1", timeout_s=10.0, refresh_s=60.0)
        try:
            await asyncio.to_thread(link.send, metrics(1, 1, 64))
            assert sorted(link.addresses) == sorted([a.address, b.address])

            await first.aclose()  # agent-a goes away for good
            await eventually(lambda: b.agent.live_agents == {"agent-b"}, 10, "b alone")
            await asyncio.to_thread(link.send, metrics(2, 1, 64))  # reaches agent-b
            assert link.addresses == [b.address]
            model = (await b.stub.GetModel(api.GetModelRequest(job_id="j-1"))).model
            assert model.observations == 10  # both reports, whichever agent took them
        finally:
            link.close()
