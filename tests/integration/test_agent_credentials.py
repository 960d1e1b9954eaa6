"""A job credential dies with its job: a real agent over real TLS, real etcd.

Replicas prove their job to an agent with a job credential (an HMAC of the job id under the
cluster key, pollux.service.auth). The HMAC alone never expires, so the agent also asks
whether the job lives (pollux.service.job_credentials.JobLiveness): once the job has
SUCCEEDED, FAILED or been CANCELLED (or deleted), its credential gets nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from pollux.agent.config import AgentConfig
from pollux.agent.main import AgentApp
from pollux.service import auth, pki
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.job_credentials import JobKeyring
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import agent_service_pb2_grpc as api_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)

LIMITS = pb.BatchLimits(initial_batch_size=128, max_batch_size=1024)


class Agent:
    def __init__(self, app: AgentApp, ca: bytes, store: Store) -> None:
        self.app = app
        self.ca = ca
        self.store = store
        self.channels: list[grpc.aio.Channel] = []

    async def as_job(self, job_id: str) -> api_grpc.AgentServiceStub:
        credential = auth.job_credential(await JobKeyring(self.store).key(), job_id)
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(self.ca), grpc.access_token_call_credentials(credential)
        )
        channel = grpc.aio.secure_channel(self.app.address, credentials)
        self.channels.append(channel)
        return api_grpc.AgentServiceStub(channel)


@pytest.fixture
async def agent(etcd: EtcdServer, root: str, store: Store, tmp_path: Path) -> AsyncIterator[Agent]:
    ca = pki.create_ca(tmp_path)
    identity = pki.issue(ca, tmp_path, "agent", "service", hosts=("127.0.0.1",))
    store.tls = TlsFiles(ca.cert, identity.cert, identity.key)
    config = AgentConfig(
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(grace_s=0),
        agent_id="agent-1",
    )
    app = AgentApp(config, store)
    await app.start()
    made = Agent(app, ca.cert.read_bytes(), store)
    try:
        yield made
    finally:
        for channel in made.channels:
            await channel.close()
        await app.stop()
        store.tls = None


async def make_job(store: Store, job_id: str) -> None:
    await store.create_job(
        pb.Job(
            id=job_id,
            request_id=f"req-{job_id}",
            state=pb.JOB_STATE_RUNNING,
            spec=pb.JobSpec(name="train", command=["true"], batch=LIMITS),
        )
    )


async def end(store: Store, job_id: str, state: int) -> None:
    entry = await store.get_job(job_id)
    assert entry is not None
    entry.value.state = state  # type: ignore[assignment]
    await store.update_job(entry.value, expected=entry.mod_revision)


def report(job_id: str) -> api.ReportMetricsRequest:
    return api.ReportMetricsRequest(
        job_id=job_id,
        generation=1,
        seq=1,
        observations=[
            pb.StepObservation(
                num_nodes=1,
                num_replicas=1,
                local_batch_size=128,
                accum_steps=1,
                accum_step_time_s=0.1,
                optim_step_time_s=0.1,
                count=5,
            )
        ],
        gradient=pb.GradientStats(sqr=1.0, var=20.0),
    )


def batch(job_id: str) -> api.GetBatchConfigRequest:
    return api.GetBatchConfigRequest(job_id=job_id, num_nodes=1, num_replicas=1)


async def code_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize(
    "state", [pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED]
)
async def test_a_finished_jobs_credential_gets_nothing(
    agent: Agent, store: Store, state: int
) -> None:
    await make_job(store, "j-1")
    stub = await agent.as_job("j-1")
    assert (await code_of(stub.GetBatchConfig(batch("j-1"))))[0] == grpc.StatusCode.OK
    assert (await code_of(stub.ReportMetrics(report("j-1"))))[0] == grpc.StatusCode.OK

    await end(store, "j-1", state)

    async def refused() -> bool:
        code, _ = await code_of(stub.GetBatchConfig(batch("j-1")))
        return code == grpc.StatusCode.UNAUTHENTICATED

    await eventually(refused, 20, "the ended job's credential to be refused")
    ended = pb.JobState.Name(state).removeprefix("JOB_STATE_")
    for call in (
        stub.GetBatchConfig(batch("j-1")),
        stub.ReportMetrics(report("j-1")),
        stub.GetModel(api.GetModelRequest(job_id="j-1")),
    ):
        code, message = await code_of(call)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert f"died with its job: the job ended {ended}" in message
    # A job that lives keeps its credential meanwhile.
    await make_job(store, "j-2")
    other = await agent.as_job("j-2")
    assert (await code_of(other.GetBatchConfig(batch("j-2"))))[0] == grpc.StatusCode.OK


async def test_a_deleted_jobs_credential_gets_nothing(agent: Agent, store: Store) -> None:
    stub = await agent.as_job("j-gone")
    code, message = await code_of(stub.GetBatchConfig(batch("j-gone")))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "the job was deleted" in message
