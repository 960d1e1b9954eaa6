"""Who may do what on a scheduler with TLS: a real replica over real TLS, real etcd.

The replica serves TLS with a certificate of a test CA; people authenticate with API tokens
(`pollux.scheduler.tokens`), which an admin issues through the AdminService.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from pollux.scheduler.config import AuthConfig, SchedulerConfig, SchedulingConfig
from pollux.scheduler.main import SchedulerApp
from pollux.service import pki
from pollux.service.bootstrap import create_token
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.keys import Kind
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer


class Secure:
    """A TLS scheduler replica, its CA, and stubs per token."""

    def __init__(self, app: SchedulerApp, ca: Path) -> None:
        self.app = app
        self.ca = ca.read_bytes()
        self.channels: list[grpc.aio.Channel] = []

    def channel(self, token: str | None) -> grpc.aio.Channel:
        credentials = grpc.ssl_channel_credentials(self.ca)
        if token is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(token)
            )
        channel = grpc.aio.secure_channel(self.app.address, credentials)
        self.channels.append(channel)
        return channel

    def jobs(self, token: str | None) -> spb_grpc.SchedulerServiceStub:
        return spb_grpc.SchedulerServiceStub(self.channel(token))

    def admin(self, token: str | None) -> apb_grpc.AdminServiceStub:
        return apb_grpc.AdminServiceStub(self.channel(token))


@pytest.fixture
async def secure(
    etcd: EtcdServer, root: str, store: Store, tmp_path: Path
) -> AsyncIterator[Secure]:
    ca = pki.create_ca(tmp_path)
    identity = pki.issue(ca, tmp_path, "scheduler", "service", hosts=("127.0.0.1",))
    store.tls = TlsFiles(ca.cert, identity.cert, identity.key)  # this process's identity
    cfg = SchedulerConfig(
        id="s-1",
        lease_ttl_s=2,
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(grace_s=0),
        scheduling=SchedulingConfig(interval_s=0.5, debounce_s=0.05),
    )
    app = SchedulerApp(store=store, config=replace(cfg))
    await app.start()
    s = Secure(app, ca.cert)
    try:
        yield s
    finally:
        for channel in s.channels:
            await channel.close()
        await app.stop()
        store.tls = None


def spec(name: str = "job", **secret: str) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        command=["python", "-c", "pass"],
        batch=pb.BatchLimits(initial_batch_size=8),
        secret_env=secret,
    )


async def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await call  # type: ignore[misc]
    return failure.value.code()


async def test_calls_without_a_valid_token_are_unauthenticated(
    secure: Secure, store: Store
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await secure.jobs(None).ListJobs(spb.ListJobsRequest())
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no credential" in str(missing.value.details())
    wrong = "pollux_0123456789ab_" + "x" * 43
    assert await code_of(secure.jobs(wrong).ListJobs(spb.ListJobsRequest())) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert await code_of(secure.jobs("nonsense").ListJobs(spb.ListJobsRequest())) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    # Nothing about a request is said, or done, before the caller is known.
    assert await code_of(secure.jobs(None).SubmitJob(spb.SubmitJobRequest())) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert await store.count(store.keys.prefix(Kind.JOBS)) == 0


async def test_users_act_on_their_own_jobs_and_admins_on_all(secure: Secure, store: Store) -> None:
    admin = await create_token(store, "root")
    made = {}
    for user in ("alice", "bob"):
        reply = await secure.admin(admin).CreateToken(apb.CreateTokenRequest(user=user))
        assert reply.token.user == user
        assert not reply.token.secret_sha256, "digests never leave the scheduler"
        made[user] = reply.secret
    alice, bob = secure.jobs(made["alice"]), secure.jobs(made["bob"])
    job = (await alice.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="r-a"))).job
    assert (job.owner, job.tenant) == ("alice", "")

    assert [j.id for j in (await bob.ListJobs(spb.ListJobsRequest())).jobs] == []
    assert [j.id for j in (await alice.ListJobs(spb.ListJobsRequest())).jobs] == [job.id]
    everyone = await secure.jobs(admin).ListJobs(spb.ListJobsRequest())
    assert [j.id for j in everyone.jobs] == [job.id]
    for call in (
        bob.GetJob(spb.GetJobRequest(job_id=job.id)),
        bob.CancelJob(spb.CancelJobRequest(job_id=job.id)),
        bob.DeleteJob(spb.DeleteJobRequest(job_id=job.id)),
        bob.Explain(spb.ExplainRequest(job_id=job.id)),
    ):
        assert await code_of(call) == grpc.StatusCode.NOT_FOUND
    logs = bob.StreamLogs(lpb.StreamLogsRequest(job_id=job.id))
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        async for _ in logs:
            pass
    assert denied.value.code() == grpc.StatusCode.NOT_FOUND
    assert "alice" not in str(denied.value.details())
    assert await code_of(bob.GetJobTimeline(spb.GetJobTimelineRequest(job_id=job.id))) == (
        grpc.StatusCode.NOT_FOUND
    )
    # Word for word what an id of no job gets: neither the id nor its owner can be probed.
    made_up = "j-" + "0" * (len(job.id) - 2)
    answers = []
    for reference in (job.id, made_up):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await bob.GetJob(spb.GetJobRequest(job_id=reference))
        answers.append((refused.value.code(), refused.value.details().replace(reference, "ID")))
    assert answers[0] == answers[1]
    # Names and prefixes resolve among the caller's own jobs only: bob learns nothing of
    # alice's job by guessing its name or a prefix of its id.
    for reference in (job.spec.name, job.id[:6]):
        assert await code_of(bob.GetJob(spb.GetJobRequest(job_id=reference))) == (
            grpc.StatusCode.NOT_FOUND
        )
    named = await alice.GetJob(spb.GetJobRequest(job_id=job.spec.name))
    assert named.job.id == job.id
    assert await code_of(bob.ListJobs(spb.ListJobsRequest(owner="alice"))) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    theirs = await secure.jobs(admin).ListJobs(spb.ListJobsRequest(owner="alice"))
    assert [j.id for j in theirs.jobs] == [job.id]
    stored = await store.get_job(job.id)
    assert stored is not None
    assert not stored.value.cancel_requested, "bob's cancel changed nothing"

    await alice.CancelJob(spb.CancelJobRequest(job_id=job.id))
    # Users may not manage tokens or tenants.
    user_admin = secure.admin(made["alice"])
    assert await code_of(user_admin.CreateToken(apb.CreateTokenRequest(user="eve"))) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert await code_of(user_admin.PutTenant(apb.PutTenantRequest())) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    me = await user_admin.WhoAmI(apb.WhoAmIRequest())
    assert (me.name, me.role, me.via) == ("alice", "user", "token")


async def test_secret_environment_is_never_returned(secure: Secure, store: Store) -> None:
    admin = await create_token(store, "root")
    jobs = secure.jobs(admin)
    job = (
        await jobs.SubmitJob(spb.SubmitJobRequest(spec=spec(TOKEN="hunter2"), request_id="r-s"))
    ).job
    assert dict(job.spec.secret_env) == {"TOKEN": "<secret>"}
    again = (await jobs.GetJob(spb.GetJobRequest(job_id=job.id))).job
    listed = (await jobs.ListJobs(spb.ListJobsRequest())).jobs[0]
    for shown in (again, listed):
        assert dict(shown.spec.secret_env) == {"TOKEN": "<secret>"}
    stored = await store.get_job(job.id)
    assert stored is not None
    assert dict(stored.value.spec.secret_env) == {"TOKEN": "hunter2"}, "launchers read it"


async def test_revoked_and_expired_tokens_are_refused(secure: Secure, store: Store) -> None:
    admin = await create_token(store, "root")
    reply = await secure.admin(admin).CreateToken(apb.CreateTokenRequest(user="carol"))
    carol = secure.jobs(reply.secret)
    await carol.ListJobs(spb.ListJobsRequest())
    await secure.admin(admin).RevokeToken(apb.RevokeTokenRequest(token_id=reply.token.id))
    with pytest.raises(grpc.aio.AioRpcError) as revoked:
        await carol.ListJobs(spb.ListJobsRequest())
    assert revoked.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unknown or revoked" in str(revoked.value.details())

    short = await secure.admin(admin).CreateToken(apb.CreateTokenRequest(user="dave", ttl_s=1))
    dave = secure.jobs(short.secret)
    await dave.ListJobs(spb.ListJobsRequest())
    await asyncio.sleep(1.2)
    with pytest.raises(grpc.aio.AioRpcError) as expired:
        await dave.ListJobs(spb.ListJobsRequest())
    assert expired.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in str(expired.value.details())


async def test_tenants_scope_tokens_and_jobs(secure: Secure, store: Store) -> None:
    admin = secure.admin(await create_token(store, "root"))
    missing = admin.CreateToken(apb.CreateTokenRequest(user="erin", tenant="vision"))
    assert await code_of(missing) == grpc.StatusCode.NOT_FOUND
    bad = admin.PutTenant(
        apb.PutTenantRequest(tenant=pb.Tenant(name="Vision", cap_gpus=1, guarantee_gpus=2))
    )
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await bad
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tenant.name" in str(invalid.value.details())
    assert "tenant.cap_gpus" in str(invalid.value.details())
    await admin.PutTenant(apb.PutTenantRequest(tenant=pb.Tenant(name="vision", guarantee_gpus=2)))
    reply = await admin.CreateToken(apb.CreateTokenRequest(user="erin", tenant="vision"))
    job = (
        await secure.jobs(reply.secret).SubmitJob(
            spb.SubmitJobRequest(spec=spec(), request_id="r-t")
        )
    ).job
    assert (job.owner, job.tenant) == ("erin", "vision")
    tenants = await admin.ListTenants(apb.ListTenantsRequest())
    assert [(t.name, t.weight) for t in tenants.tenants] == [("vision", 1.0)]


async def test_every_mutation_is_audited_with_who_what_and_outcome(
    secure: Secure, store: Store
) -> None:
    root = await create_token(store, "root")
    reply = await secure.admin(root).CreateToken(apb.CreateTokenRequest(user="frank"))
    frank = secure.jobs(reply.secret)
    job = (await frank.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="r-x"))).job
    with pytest.raises(grpc.aio.AioRpcError):
        await secure.jobs(None).CancelJob(spb.CancelJobRequest(job_id=job.id))
    await frank.CancelJob(spb.CancelJobRequest(job_id=job.id))

    async def records() -> list[tuple[str, str, str, str]]:
        listed = await secure.admin(root).ListAudit(apb.ListAuditRequest(limit=10))
        return [(r.principal, r.action, r.target, r.outcome) for r in listed.records]

    expected = [
        ("frank", "CancelJob", job.id, "OK"),
        ("anonymous", "CancelJob", job.id, "UNAUTHENTICATED"),
        ("frank", "SubmitJob", job.id, "OK"),
        ("root", "CreateToken", "frank", "OK"),
    ]
    for _ in range(50):  # records reach etcd a moment after the calls return
        if await records() == expected:
            break
        await asyncio.sleep(0.1)
    assert await records() == expected


async def test_the_leader_keeps_each_tenant_within_its_cap(secure: Secure, store: Store) -> None:
    admin = secure.admin(await create_token(store, "root"))
    await admin.PutTenant(apb.PutTenantRequest(tenant=pb.Tenant(name="small", cap_gpus=1)))
    await admin.PutTenant(apb.PutTenantRequest(tenant=pb.Tenant(name="big", weight=3)))
    tokens = {
        tenant: (
            await admin.CreateToken(apb.CreateTokenRequest(user=f"{tenant}-user", tenant=tenant))
        ).secret
        for tenant in ("small", "big")
    }
    lease = await store.grant_lease(30)
    await store.register_node(pb.Node(name="n1", gpus=4, address="127.0.0.1:1"), lease=lease)
    jobs: dict[str, list[str]] = {"small": [], "big": []}
    for tenant, token in tokens.items():
        stub = secure.jobs(token)
        for i in range(2):
            wide = spec(f"{tenant}-{i}")
            wide.max_replicas = 4
            wide.batch.max_batch_size = 512
            reply = await stub.SubmitJob(
                spb.SubmitJobRequest(spec=wide, request_id=f"{tenant}-{i}")
            )
            jobs[tenant].append(reply.job.id)

    async def held(tenant: str) -> int:
        total = 0
        for job_id in jobs[tenant]:
            entry = await store.get_job(job_id)
            assert entry is not None
            total += len(entry.value.allocation.nodes)
        return total

    # Unprofiled jobs grow one step per round (at most twice what they were seen on), so
    # every job runs after a few rounds; the small tenant's two stay within its one GPU.
    for _ in range(100):
        if await held("big") >= 2 and await held("small") >= 1:
            break
        await asyncio.sleep(0.1)
    for _ in range(10):  # and they stay within it, round after round
        assert await held("small") == 1, "the cap binds although the small tenant wants more"
        await asyncio.sleep(0.2)
    assert await held("big") >= 2


async def test_a_site_may_require_client_certificates_for_people(
    etcd: EtcdServer, root: str, store: Store, tmp_path: Path
) -> None:
    ca = pki.create_ca(tmp_path)
    identity = pki.issue(ca, tmp_path, "scheduler", "service", hosts=("127.0.0.1",))
    alice = pki.issue(ca, tmp_path, "alice", "user")
    store.tls = TlsFiles(ca.cert, identity.cert, identity.key)
    cfg = SchedulerConfig(
        id="s-1",
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(grace_s=0),
        auth=AuthConfig(client_certificates=True),
    )
    app = SchedulerApp(store=store, config=cfg)
    await app.start()
    try:
        mine = grpc.ssl_channel_credentials(
            ca.cert.read_bytes(), alice.key.read_bytes(), alice.cert.read_bytes()
        )
        async with grpc.aio.secure_channel(app.address, mine) as channel:
            me = await apb_grpc.AdminServiceStub(channel).WhoAmI(apb.WhoAmIRequest())
            assert (me.name, me.role, me.via) == ("alice", "user", "certificate")
            job = await spb_grpc.SchedulerServiceStub(channel).SubmitJob(
                spb.SubmitJobRequest(spec=spec(), request_id="r-c")
            )
            assert job.job.owner == "alice"
        anonymous = grpc.ssl_channel_credentials(ca.cert.read_bytes())
        async with grpc.aio.secure_channel(app.address, anonymous) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await apb_grpc.AdminServiceStub(channel).WhoAmI(apb.WhoAmIRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, "no certificate, no TLS"
    finally:
        await app.stop()
        store.tls = None
