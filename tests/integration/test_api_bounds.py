"""What one user may hold of a scheduler: streams, PENDING jobs, submit rate; real TLS and etcd.

A real replica over real TLS with API tokens (as tests/integration/test_scheduler_auth.py) and
small limits (pollux.scheduler.limits); the watches' etcd cost is read from etcd's own metrics.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from pollux.client import Client
from pollux.client.errors import ResourceExhaustedError
from pollux.client.sweep import ClusterTrials, trial_spec
from pollux.scheduler.config import SchedulerConfig, SchedulingConfig
from pollux.scheduler.limits import LimitsConfig
from pollux.scheduler.main import SchedulerApp
from pollux.service import pki
from pollux.service.bootstrap import create_token
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Delete, Store
from pollux.service.tls import TlsFiles
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)

STREAM_WAIT_S = 15.0
"""Guard against a hang only: a stream that should end and does not fails the test."""


class Secure:
    """A TLS replica with `limits`, and stubs per token."""

    def __init__(self, app: SchedulerApp, ca: bytes) -> None:
        self.app = app
        self.ca = ca
        self.channels: list[grpc.aio.Channel] = []

    def channel(self, token: str) -> grpc.aio.Channel:
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(self.ca), grpc.access_token_call_credentials(token)
        )
        channel = grpc.aio.secure_channel(self.app.address, credentials)
        self.channels.append(channel)
        return channel

    def jobs(self, token: str) -> spb_grpc.SchedulerServiceStub:
        return spb_grpc.SchedulerServiceStub(self.channel(token))

    def admin(self, token: str) -> apb_grpc.AdminServiceStub:
        return apb_grpc.AdminServiceStub(self.channel(token))


Start = Callable[[LimitsConfig], Awaitable[Secure]]


@pytest.fixture
async def start(etcd: EtcdServer, root: str, store: Store, tmp_path: Path) -> AsyncIterator[Start]:
    """Starts the replica with the given limits (once per test)."""
    ca = pki.create_ca(tmp_path)
    identity = pki.issue(ca, tmp_path, "scheduler", "service", hosts=("127.0.0.1",))
    store.tls = TlsFiles(ca.cert, identity.cert, identity.key)
    started: list[Secure] = []

    async def run(limits: LimitsConfig) -> Secure:
        cfg = SchedulerConfig(
            id="s-1",
            lease_ttl_s=2,
            etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
            server=ServerConfig(grace_s=0),
            scheduling=SchedulingConfig(interval_s=0.5, debounce_s=0.05),
            limits=limits,
        )
        app = SchedulerApp(store=store, config=replace(cfg))
        await app.start()
        secure = Secure(app, ca.cert.read_bytes())
        started.append(secure)
        return secure

    try:
        yield run
    finally:
        for secure in started:
            for channel in secure.channels:
                await channel.close()
            await secure.app.stop()
        store.tls = None


def spec(name: str) -> pb.JobSpec:
    return pb.JobSpec(
        name=name, command=["python", "-c", "pass"], batch=pb.BatchLimits(initial_batch_size=8)
    )


async def submit(stub: spb_grpc.SchedulerServiceStub, name: str, request_id: str) -> Any:
    return await stub.SubmitJob(spb.SubmitJobRequest(spec=spec(name), request_id=request_id))


async def refusal(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def opened(call: Any) -> Any:
    """A stream whose first message arrived (it was admitted and is open)."""
    await asyncio.wait_for(call.read(), STREAM_WAIT_S)
    return call


async def ended(call: Any) -> grpc.aio.AioRpcError:
    """The status a stream ends with (read until it ends; hang-guarded)."""

    async def drain() -> None:
        while await call.read() is not grpc.aio.EOF:
            pass

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(drain(), STREAM_WAIT_S)
    return caught.value


def etcd_watchers(etcd: EtcdServer) -> int:
    """Watchers etcd holds now, from its own metrics."""
    text = urllib.request.urlopen(f"http://{etcd.endpoint}/metrics", timeout=5).read().decode()
    line = next(x for x in text.splitlines() if x.startswith("etcd_debugging_mvcc_watcher_total"))
    return int(float(line.split()[1]))


async def test_streams_are_capped_per_principal_and_per_replica(start: Start, store: Store) -> None:
    secure = await start(LimitsConfig(streams_per_principal=2, streams_per_replica=3))
    alice = secure.jobs(await create_token(store, "alice", role="user"))
    bob = secure.jobs(await create_token(store, "bob", role="user"))
    job = (await submit(alice, "train", "r-1")).job
    await submit(bob, "train", "r-2")  # a watch's first message: the jobs it lists

    first = await opened(alice.WatchJobs(spb.WatchJobsRequest()))
    await opened(alice.WatchJobs(spb.WatchJobsRequest(job_id=job.id)))
    error = await ended(alice.WatchJobs(spb.WatchJobsRequest()))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limits.streams_per_principal = 2" in (error.details() or "")
    logs = await ended(alice.StreamLogs(lpb.StreamLogsRequest(job_id=job.id)))
    assert logs.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, "log streams count too"

    # Another user has streams of their own, up to the replica's cap.
    await opened(bob.WatchJobs(spb.WatchJobsRequest()))
    error = await ended(bob.WatchJobs(spb.WatchJobsRequest()))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limits.streams_per_replica = 3" in (error.details() or "")

    # A closed stream gives its slot back.
    first.cancel()
    await eventually(lambda: secure.app.streams.open == 2, 10, "the closed stream released")
    await opened(alice.WatchJobs(spb.WatchJobsRequest()))


async def test_watches_share_one_etcd_watch_and_see_only_their_owners_jobs(
    start: Start, store: Store, etcd: EtcdServer
) -> None:
    secure = await start(LimitsConfig(streams_per_principal=50, streams_per_replica=100))
    alice = secure.jobs(await create_token(store, "alice", role="user"))
    bob = secure.jobs(await create_token(store, "bob", role="user"))
    mine = (await submit(alice, "alices", "r-a")).job
    await submit(bob, "first", "r-b0")  # each watch's first message
    before = etcd_watchers(etcd)

    streams = [await opened(bob.WatchJobs(spb.WatchJobsRequest())) for _ in range(20)]
    theirs = (await submit(bob, "bobs", "r-b")).job
    for call in streams:
        seen = await asyncio.wait_for(call.read(), STREAM_WAIT_S)
        assert seen.job.id == theirs.id, "bob's own new job reaches every one of his watches"
    assert etcd_watchers(etcd) - before < len(streams), "no etcd watch per stream"

    # Alice's changes never reach bob's streams: the next event each sees is his own.
    await alice.CancelJob(spb.CancelJobRequest(job_id=mine.id))
    await bob.CancelJob(spb.CancelJobRequest(job_id=theirs.id))
    for call in streams:
        seen = await asyncio.wait_for(call.read(), STREAM_WAIT_S)
        assert seen.job.owner == "bob"
        call.cancel()


async def test_a_revoked_or_expired_token_ends_its_open_streams(start: Start, store: Store) -> None:
    secure = await start(LimitsConfig())
    admin = await create_token(store, "root")
    reply = await secure.admin(admin).CreateToken(apb.CreateTokenRequest(user="carol"))
    carol = secure.jobs(reply.secret)
    job = (await submit(carol, "train", "r-1")).job
    everything = await opened(carol.WatchJobs(spb.WatchJobsRequest()))
    one = await opened(carol.WatchJobs(spb.WatchJobsRequest(job_id=job.id)))

    # Revoked as another replica would: the record goes from etcd, this replica's cache ages.
    await store.txn([Delete(store.keys.token(reply.token.id))])
    for call in (everything, one):
        error = await ended(call)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (error.details() or "")

    # Expiry (ttl 2 s) ends a stream the same way; it may already be refused at its start on
    # a slow machine, which says the same.
    short = await secure.admin(admin).CreateToken(apb.CreateTokenRequest(user="dave", ttl_s=2))
    error = await ended(secure.jobs(short.secret).WatchJobs(spb.WatchJobsRequest()))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in (error.details() or "")


async def test_pending_jobs_are_capped_per_user_and_per_tenant(start: Start, store: Store) -> None:
    secure = await start(
        LimitsConfig(pending_jobs_per_user=2, pending_jobs_per_tenant=3, submits_per_s_per_user=0)
    )
    alice = secure.jobs(await create_token(store, "alice", role="user", tenant="vision"))
    bob = secure.jobs(await create_token(store, "bob", role="user", tenant="vision"))
    carol = secure.jobs(await create_token(store, "carol", role="user", tenant="nlp"))
    admin = secure.jobs(await create_token(store, "root"))

    first = await submit(alice, "train", "a-1")
    await submit(alice, "train", "a-2")
    error = await refusal(submit(alice, "train", "a-3"))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limits.pending_jobs_per_user = 2" in (error.details() or "")
    again = await submit(alice, "train", "a-1")
    assert not again.created, "a retry of an accepted submit is answered, not refused"
    assert again.job.id == first.job.id

    await submit(bob, "train", "b-1")
    error = await refusal(submit(bob, "train", "b-2"))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'vision'" in (error.details() or "")
    assert "limits.pending_jobs_per_tenant = 3" in (error.details() or "")
    await submit(carol, "train", "c-1")  # another tenant
    await submit(admin, "train", "root-1")  # admins operate the cluster: not limited

    # Cancelling a PENDING job frees its place.
    await alice.CancelJob(spb.CancelJobRequest(job_id=first.job.id))

    async def accepted() -> bool:
        try:
            await submit(alice, "train", "a-4")
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return False
        return True

    await eventually(accepted, 20, "a submit once the cancelled job left the queue")


async def test_submits_are_rate_limited_per_user(start: Start, store: Store) -> None:
    secure = await start(
        LimitsConfig(
            submits_per_s_per_user=0.01,
            submit_burst_per_user=3,
            submits_per_s_per_tenant=0,
            pending_jobs_per_user=0,
        )
    )
    alice = secure.jobs(await create_token(store, "alice", role="user"))
    bob = secure.jobs(await create_token(store, "bob", role="user"))
    for i in range(3):
        await submit(alice, "train", f"a-{i}")
    error = await refusal(submit(alice, "train", "a-9"))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    message = error.details() or ""
    assert "limits.submits_per_s_per_user" in message
    assert "retry in" in message
    await submit(bob, "train", "b-1")
    listed = await alice.ListJobs(spb.ListJobsRequest())
    assert len(listed.jobs) == 3, "nothing of the refused submit was stored"


async def test_a_name_that_reads_as_a_job_id_is_refused(start: Start, store: Store) -> None:
    secure = await start(LimitsConfig())
    alice = secure.jobs(await create_token(store, "alice", role="user"))
    victim = (await submit(alice, "train", "r-1")).job
    bob = secure.jobs(await create_token(store, "bob", role="user"))
    for name in (victim.id, victim.id[:6], victim.id[2:8], "cafe"):
        error = await refusal(submit(bob, name, f"r-{name}"))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert "reads as a job id" in (error.details() or "")


async def test_a_sweep_waits_out_the_submit_rate_and_submits_every_trial_once(
    start: Start, store: Store
) -> None:
    secure = await start(
        LimitsConfig(
            submits_per_s_per_user=4.0,
            submit_burst_per_user=1,
            submits_per_s_per_tenant=0,
            pending_jobs_per_user=0,
        )
    )
    token = await create_token(store, "alice", role="user")
    said: list[str] = []

    def sweep() -> tuple[list[str], int, float | None]:
        with Client(
            secure.app.address,
            credentials=grpc.ssl_channel_credentials(secure.ca),
            token=token,
        ) as client:
            trials = ClusterTrials(client, "lr", say=said.append)
            job = {"command": ["python", "-c", "pass"], "initial_batch_size": 8}
            ids = [trials.start(n, {}, job) for n in range(4)]
            # Without the sweep's patience: the bucket is empty, so a second submit is refused.
            for extra, n in enumerate((9, 10)):
                try:
                    client.submit(trial_spec("lr", n, job))
                except ResourceExhaustedError as refused:
                    return ids, extra, refused.retry_after_s
            pytest.fail("two submits at once passed a 1-submit burst")

    ids, extra, retry_after = await asyncio.to_thread(sweep)
    assert len(set(ids)) == 4, "every trial is one job, however often it was refused"
    assert said, "the sweep said it waited"
    for line in said:
        assert "submitted faster than 4 jobs/s" in line
        assert "submitting again in" in line
    assert retry_after is not None, "the server names the wait"
    assert 0 < retry_after <= 0.5, "one token at 4/s"
    listed = await secure.jobs(token).ListJobs(spb.ListJobsRequest())
    assert len(listed.jobs) == 4 + extra
