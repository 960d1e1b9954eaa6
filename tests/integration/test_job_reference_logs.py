"""Logs by job reference reach only the job the reference resolved to: real TLS end to end.

A real scheduler replica (API tokens over TLS) and a real launcher (mTLS, services only) on one
real etcd; jobs are real processes. A job reference (id, prefix or name) is resolved once, by
the scheduler, and only the resolved job's id goes to the launcher: a job *named* after
another user's job id must never print that user's log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from pollux.launcher.gpus import detect
from pollux.launcher.main import LauncherApp
from pollux.scheduler.config import SchedulerConfig, SchedulingConfig
from pollux.scheduler.main import SchedulerApp
from pollux.service import pki
from pollux.service.bootstrap import create_token
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.integration.test_launcher import make_config
from tests.job_python import job_python
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(90)


@dataclass
class Cluster:
    scheduler: SchedulerApp
    ca: bytes
    channels: list[grpc.aio.Channel]

    def jobs(self, token: str) -> spb_grpc.SchedulerServiceStub:
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(self.ca), grpc.access_token_call_credentials(token)
        )
        channel = grpc.aio.secure_channel(self.scheduler.address, credentials)
        self.channels.append(channel)
        return spb_grpc.SchedulerServiceStub(channel)


@pytest.fixture
async def cluster(
    etcd: EtcdServer, root: str, store: Store, tmp_path: Path
) -> AsyncIterator[Cluster]:
    ca = pki.create_ca(tmp_path / "pki")
    identity = pki.issue(ca, tmp_path / "pki", "service", "service", hosts=("127.0.0.1",))
    store.tls = TlsFiles(ca.cert, identity.cert, identity.key)
    launcher = LauncherApp(replace(make_config(etcd, root, tmp_path), gpus=1), detect(1), store)
    scheduler = SchedulerApp(
        store=store,
        config=SchedulerConfig(
            id="s-1",
            lease_ttl_s=2,
            etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
            server=ServerConfig(grace_s=0),
            scheduling=SchedulingConfig(interval_s=0.5, debounce_s=0.05),
        ),
    )
    await launcher.start()
    await scheduler.start()
    made = Cluster(scheduler, ca.cert.read_bytes(), [])
    try:
        yield made
    finally:
        for channel in made.channels:
            await channel.close()
        await scheduler.stop()
        await launcher.stop()
        store.tls = None


def printing(name: str, line: str) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        command=[job_python(), "-c", f"print({line!r})"],
        batch=pb.BatchLimits(initial_batch_size=8),
    )


async def finished(stub: spb_grpc.SchedulerServiceStub, job_id: str) -> None:
    async def done() -> bool:
        reply = await stub.GetJob(spb.GetJobRequest(job_id=job_id))
        return bool(reply.job.state == pb.JOB_STATE_SUCCEEDED)

    await eventually(done, 60, f"job {job_id} to succeed")


async def lines(stub: spb_grpc.SchedulerServiceStub, reference: str) -> list[str]:
    out: list[str] = []
    async for chunk in stub.StreamLogs(lpb.StreamLogsRequest(job_id=reference)):
        out.extend(chunk.lines)
    return out


async def alices_finished_job(cluster: Cluster, store: Store) -> tuple[Any, pb.Job]:
    alice = cluster.jobs(await create_token(store, "alice", role="user"))
    reply = await alice.SubmitJob(
        spb.SubmitJobRequest(spec=printing("diary", "alice-secret-line"), request_id="a-1")
    )
    await finished(alice, reply.job.id)
    return alice, reply.job


async def test_logs_by_name_or_prefix_are_the_jobs_own(cluster: Cluster, store: Store) -> None:
    alice, job = await alices_finished_job(cluster, store)
    # `pollux-cli logs NAME` (no --follow): the name is resolved, the log is the job's.
    assert await lines(alice, "diary") == ["alice-secret-line"]
    assert await lines(alice, job.id[2:8]) == ["alice-secret-line"]
    assert await lines(alice, job.id) == ["alice-secret-line"]


async def test_a_job_named_after_another_users_job_id_shows_only_its_own_log(
    cluster: Cluster, store: Store
) -> None:
    alice, victim = await alices_finished_job(cluster, store)
    bob = cluster.jobs(await create_token(store, "bob", role="user"))
    # Alice deletes her job; its replica's log is still on the node. Bob holds a job *named*
    # after her job's id: one from before such names were refused at submit.
    await alice.DeleteJob(spb.DeleteJobRequest(job_id=victim.id))
    legacy = pb.Job(
        id="j-b0b0b0b0b0",
        request_id="b-legacy",
        spec=printing(victim.id, "bob-own-line"),
        state=pb.JOB_STATE_PENDING,
        owner="bob",
    )
    legacy.create_time.GetCurrentTime()
    legacy.history.add(state=pb.JOB_STATE_PENDING, reason="submitted")
    await store.create_job(legacy)
    await finished(bob, legacy.id)

    # Bob names alice's id: it resolves to his own job, and the launcher is asked for his.
    assert await lines(bob, victim.id) == ["bob-own-line"]
    described = await bob.GetJob(spb.GetJobRequest(job_id=victim.id))
    assert described.job.id == legacy.id
