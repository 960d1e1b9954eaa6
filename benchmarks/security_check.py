"""Try to break into a secure Pollux cluster, and say which doors held.

Every attempt an outsider, a user or a compromised job could make against the cluster's ports
is made for real, and each prints one line: ``PASS refused as expected: <attempt> -> <STATUS>:
<message>`` when the cluster refused it with the status a careful server gives, ``FAIL ...``
otherwise. A few attempts that must succeed (a control per kind of door: the admin lists jobs,
a service certificate reads etcd, a launcher answers a service) print ``PASS accepted as
expected``; without them a cluster that is simply down would pass every refusal. The process
exits 1 if any attempt failed.

What is tried:

- plaintext to every port (schedulers, agents, launchers: the TLS handshake fails, so
  UNAVAILABLE) and to etcd through a plaintext `Store`;
- a launcher dialled over TLS without a client certificate (handshake refused) and with a
  *user* certificate of the cluster CA (PERMISSION_DENIED: launchers serve services only);
- the scheduler with no token, a well-formed unknown one, a revoked one, an expired one, a job
  credential (UNAUTHENTICATED);
- one user cancelling, deleting, reading and reading the logs of another's job, and calling
  admin RPCs (PERMISSION_DENIED; the victim's job is unchanged afterwards);
- an agent given a job's valid credential for *another* job's ReportMetrics and GetBatchConfig
  (PERMISSION_DENIED), a made-up credential, none, or a person's token (UNAUTHENTICATED);
- etcd over TLS with no client certificate and with one from a different CA (refused);
- secret environment values: SubmitJob, GetJob, ListJobs and WatchJobs show ``<secret>``;
- a job whose output writes terminal escapes (clear screen, OSC 52, title, link, C1, bidi):
  `pollux-cli` submit --follow, logs and describe print them as visible text;
- a job (bob's) that tries to read, from its replica, every credential but its own: the admin's
  ``pollux-cli`` context (``~/.config/pollux``), the work dir's ``pki/`` (its listing, the CA key,
  the kept admin token, the launcher's and etcd's keys), and another user's job's checkpoint
  and log (REFUSED; a control reads its own checkpoint). Made where the check can see the
  cluster's files (its own cluster, or ``--pki-dir`` inside a `pollux-up` work dir);
- a job named after another user's (deleted) job id: refused at submit (INVALID_ARGUMENT), and
  logs, describe and cancel by that id reach nothing (NOT_FOUND), never the other's log;
- a FAILED job's credential on GetBatchConfig and ReportMetrics (UNAUTHENTICATED: it died
  with its job);
- one user's open streams past their cap, and submits past their rate (RESOURCE_EXHAUSTED),
  while another user still streams and submits; a revoked token's open stream (it ends,
  UNAUTHENTICATED).

With no target it starts its own `LocalCluster(secure=True)` (1 scheduler, 1 agent, 1 node)
in ``--workdir`` (default: a temporary directory) and stops it afterwards. Against a running
cluster it needs a scheduler address, etcd, the CA directory (``ca.pem`` and ``ca-key.pem``,
as `pollux-up` writes to ``<workdir>/pki``: the check issues itself a service and a user
certificate) and an admin token; agents and launchers are found through ClusterStatus. The
users, tokens and jobs it makes are cancelled and revoked at the end.

    python benchmarks/security_check.py [--workdir DIR]
    python benchmarks/security_check.py --scheduler HOST:PORT --etcd HOST:PORT
        --pki-dir DIR --token pollux_... [--etcd-root /pollux/v1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd.rpc
import grpc

from pollux.client.config import config_path
from pollux.service import auth, pki
from pollux.service.job_credentials import JobKeyring
from pollux.service.keys import DEFAULT_ROOT, Kind
from pollux.service.local_cluster import LocalCluster
from pollux.service.store import Store, StoreError, StoreUnavailable
from pollux.service.tls import TlsFiles
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import agent_service_pb2 as agpb
from pollux.v1 import agent_service_pb2_grpc as agpb_grpc
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lpb_grpc
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb

CALL_TIMEOUT_S = 10.0
"""Per call: a refusal comes at once; a hang is a failure, not a pass."""
REFUSAL_WAIT_S = 15.0
"""How long a revoked or expiring token may take to be refused (replicas cache tokens 2 s)."""
JOB_WAIT_S = 60.0
"""How long a job the check runs may take to finish (it prints a line or exits 3)."""
MAX_STREAMS_TRIED = 200
"""Streams one user opens at once, looking for the cap (the default is 32)."""
MAX_SUBMITS_TRIED = 300
"""Submits one user sends in a burst, looking for the limit (the default burst is 50)."""
SECRET = "<secret>"
OK = "OK"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One thing tried and how the cluster answered.

    Attributes:
        name: What was tried, in words.
        expected: The status a secure cluster answers ("OK" for a control that must work).
        got: The status it answered ("OK" when it did what was asked).
        message: The status message, or what was seen.
    """

    name: str
    expected: str
    got: str
    message: str

    @property
    def passed(self) -> bool:
        """Whether the cluster answered as it should."""
        return self.got == self.expected

    def line(self) -> str:
        """The one line printed for it."""
        message = " ".join(self.message.split())[:200]
        if self.passed:
            verb = "accepted" if self.expected == OK else "refused"
            if self.expected not in grpc.StatusCode.__members__:
                verb = "held"  # a property, not a status: a secret withheld, a job unchanged
            return f"PASS {verb} as expected: {self.name} -> {self.got}: {message}"
        return f"FAIL expected {self.expected}: {self.name} -> {self.got}: {message}"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the cluster's doors are, and the operator's keys to it.

    Attributes:
        schedulers: Scheduler addresses (host:port).
        agents: Agent addresses.
        launchers: Launcher addresses.
        etcd: etcd endpoint(s), comma-separated.
        etcd_root: The cluster's key root in etcd.
        pki_dir: The cluster CA (``ca.pem`` and ``ca-key.pem``).
        admin_token: An admin's API token.
        workdir: A `pollux-up` work dir on this machine (its replicas' files), if known.
        admin_context: The admin's ``pollux-cli`` context file on this machine, if known.
    """

    schedulers: tuple[str, ...]
    agents: tuple[str, ...]
    launchers: tuple[str, ...]
    etcd: str
    etcd_root: str
    pki_dir: Path
    admin_token: str
    workdir: Path | None = None
    admin_context: Path | None = None

    @classmethod
    def of_cluster(cls, cluster: LocalCluster) -> Target:
        """The doors of a started secure `LocalCluster`."""
        if not cluster.secure or cluster.admin_token is None:
            raise ValueError("the security check needs a secure, started cluster")

        def addresses(prefix: str) -> tuple[str, ...]:
            return tuple(
                p.address for n, p in sorted(cluster.procs.items()) if n.startswith(prefix)
            )

        return cls(
            schedulers=addresses("scheduler"),
            agents=addresses("agent"),
            launchers=addresses("node"),
            etcd=cluster.etcd_endpoint,
            etcd_root=DEFAULT_ROOT,
            pki_dir=cluster.pki_dir,
            admin_token=cluster.admin_token,
            workdir=cluster.workdir,
            admin_context=cluster.workdir / "admin-home" / ".config" / "pollux" / "config.toml",
        )


def _code(error: grpc.aio.AioRpcError) -> tuple[str, str]:
    return error.code().name, str(error.details() or "")


async def _status(call: Awaitable[Any]) -> tuple[str, str, Any]:
    """(status, message, response) of a unary call, never raising for a status."""
    try:
        response = await call
    except grpc.aio.AioRpcError as error:
        return (*_code(error), None)
    return OK, "answered", response


async def _stream_status(call: Any) -> tuple[str, str]:
    """Status of a server stream: refused, or OK once its first message (or its end) came."""
    try:
        async for _ in call:
            call.cancel()
            return OK, "streamed"
    except grpc.aio.AioRpcError as error:
        return _code(error)
    return OK, "the stream ended"


class Checker:
    """Runs the attempts against one `Target`, with credentials it makes for itself.

    Args:
        target: The cluster.
        scratch: A directory for the certificates it issues itself (removed by the caller).
    """

    def __init__(self, target: Target, scratch: Path) -> None:
        self.t = target
        self.scratch = scratch
        self.ca_pem = (target.pki_dir / "ca.pem").read_bytes()
        ca = pki.Issued(target.pki_dir / "ca.pem", target.pki_dir / "ca-key.pem")
        self.service = pki.issue(ca, scratch, "security-check", "service", basename="service")
        self.user_cert = pki.issue(ca, scratch, "security-check-user", "user", basename="user")
        rogue_ca = pki.create_ca(scratch / "rogue", "rogue CA")
        self.rogue = pki.issue(rogue_ca, scratch / "rogue", "security-check", "service")
        self.attempts: list[Attempt] = []
        self.channels: list[grpc.aio.Channel] = []
        self.suffix = secrets.token_hex(3)
        self.cleanup_tokens: list[str] = []
        self.cleanup_jobs: list[str] = []

    # -- bookkeeping ---------------------------------------------------------------------------

    def record(self, name: str, expected: str, got: str, message: str) -> Attempt:
        """Note an outcome."""
        attempt = Attempt(name, expected, got, message)
        self.attempts.append(attempt)
        return attempt

    async def expect(self, name: str, expected: str, call: Awaitable[Any]) -> Any:
        """Make a unary call, record its outcome, return the response (None if refused)."""
        got, message, response = await _status(call)
        self.record(name, expected, got, message)
        return response

    async def expect_stream(self, name: str, expected: str, call: Any) -> None:
        """Open a server stream, record whether it was refused."""
        got, message = await _stream_status(call)
        self.record(name, expected, got, message)

    def channel(
        self,
        address: str,
        *,
        tls: bool = True,
        token: str | None = None,
        cert: pki.Issued | None = None,
    ) -> grpc.aio.Channel:
        """A channel: plaintext, or TLS trusting the cluster CA, with a token and/or a cert."""
        if not tls:
            made = grpc.aio.insecure_channel(address)
        else:
            key_pem = cert.key.read_bytes() if cert is not None else None
            cert_pem = cert.cert.read_bytes() if cert is not None else None
            credentials = grpc.ssl_channel_credentials(self.ca_pem, key_pem, cert_pem)
            if token is not None:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.access_token_call_credentials(token)
                )
            made = grpc.aio.secure_channel(address, credentials)
        self.channels.append(made)
        return made

    def jobs(self, token: str | None) -> spb_grpc.SchedulerServiceStub:
        """The SchedulerService of the first scheduler, as the holder of `token`."""
        return spb_grpc.SchedulerServiceStub(self.channel(self.t.schedulers[0], token=token))

    def admin(self, token: str | None) -> apb_grpc.AdminServiceStub:
        """The AdminService of the first scheduler, as the holder of `token`."""
        return apb_grpc.AdminServiceStub(self.channel(self.t.schedulers[0], token=token))

    async def close(self) -> None:
        """Close every channel made."""
        for made in self.channels:
            await made.close()

    # -- the attempts --------------------------------------------------------------------------

    async def run(self) -> list[Attempt]:
        """Every attempt, in order; cleans up what it made on the way out."""
        try:
            await self.plaintext()
            await self.launcher_certificates()
            await self.etcd_certificates()
            users = await self.people()
            await self.tokens(users)
            await self.other_users_jobs(users)
            await self.secrets(users)
            await self.forged_agent_reports(users)
            await self.terminal_escapes(users)
            await self.jobs_named_after_ids(users)
            await self.dead_job_credentials(users)
            await self.revoked_token_streams()
            await self.stream_caps(users)
            await self.submit_caps(users)
            await self.replica_reads(users)  # replica isolation
        finally:
            await self.clean_up()
            await self.close()
        return self.attempts

    async def plaintext(self) -> None:
        """No port speaks plaintext: the TLS handshake fails (UNAVAILABLE)."""
        for address in self.t.schedulers:
            stub = spb_grpc.SchedulerServiceStub(self.channel(address, tls=False))
            call = stub.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
            await self.expect(f"plaintext ListJobs to scheduler {address}", "UNAVAILABLE", call)
        for address in self.t.agents:
            agent = agpb_grpc.AgentServiceStub(self.channel(address, tls=False))
            call = agent.GetModel(agpb.GetModelRequest(job_id="j-x"), timeout=CALL_TIMEOUT_S)
            await self.expect(f"plaintext GetModel to agent {address}", "UNAVAILABLE", call)
        for address in self.t.launchers:
            launcher = lpb_grpc.LauncherServiceStub(self.channel(address, tls=False))
            call = launcher.ListReplicas(lpb.ListReplicasRequest(), timeout=CALL_TIMEOUT_S)
            await self.expect(f"plaintext ListReplicas to launcher {address}", "UNAVAILABLE", call)
        got, message = await self._etcd_store_read(None)
        self.record(f"plaintext Store read of etcd {self.t.etcd}", "UNAVAILABLE", got, message)

    async def launcher_certificates(self) -> None:
        """Launchers take services only: no certificate, a user's, or the operator's (control)."""
        for address in self.t.launchers:
            request = lpb.ListReplicasRequest()
            bare = lpb_grpc.LauncherServiceStub(self.channel(address))
            await self.expect(
                f"TLS without client certificate to launcher {address}",
                "UNAVAILABLE",
                bare.ListReplicas(request, timeout=CALL_TIMEOUT_S),
            )
            user = lpb_grpc.LauncherServiceStub(self.channel(address, cert=self.user_cert))
            await self.expect(
                f"ListReplicas with a user certificate of the cluster CA to launcher {address}",
                "PERMISSION_DENIED",
                user.ListReplicas(request, timeout=CALL_TIMEOUT_S),
            )
            logs = user.StreamLogs(lpb.StreamLogsRequest(job_id="j-x"), timeout=CALL_TIMEOUT_S)
            await self.expect_stream(
                f"StreamLogs with a user certificate to launcher {address}",
                "PERMISSION_DENIED",
                logs,
            )
            service = lpb_grpc.LauncherServiceStub(self.channel(address, cert=self.service))
            await self.expect(
                f"(control) ListReplicas with a service certificate to launcher {address}",
                OK,
                service.ListReplicas(request, timeout=CALL_TIMEOUT_S),
            )

    async def _etcd_store_read(self, tls: TlsFiles | None) -> tuple[str, str]:
        """Status of one read through a `Store` (UNAVAILABLE when etcd will not talk)."""
        try:
            store = await Store.connect(self.t.etcd, self.t.etcd_root, timeout_s=5.0, tls=tls)
        except StoreUnavailable as error:
            return "UNAVAILABLE", str(error)
        try:
            await store.count(store.keys.prefix(Kind.JOBS))
        except StoreUnavailable as error:
            return "UNAVAILABLE", str(error)
        except StoreError as error:
            return "REFUSED", str(error)
        finally:
            await store.close()
        return OK, "read the cluster state"

    async def _etcd_raw_read(self, cert: pki.Issued | None) -> tuple[str, str]:
        """Status of an etcd Range over TLS trusting the cluster CA, with `cert` or none."""
        first = self.t.etcd.split(",")[0]
        key_pem = cert.key.read_bytes() if cert is not None else None
        cert_pem = cert.cert.read_bytes() if cert is not None else None
        credentials = grpc.ssl_channel_credentials(self.ca_pem, key_pem, cert_pem)
        async with aetcd.rpc.secure_channel(first, credentials) as channel:
            request = aetcd.rpc.RangeRequest(key=self.t.etcd_root.encode(), count_only=True)
            try:
                await aetcd.rpc.KVStub(channel).Range(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                return _code(error)
        return OK, "read the cluster state"

    async def etcd_certificates(self) -> None:
        """Only holders of a certificate of the cluster CA reach etcd."""
        got, message = await self._etcd_raw_read(None)
        self.record(
            f"TLS without client certificate to etcd {self.t.etcd}", "UNAVAILABLE", got, message
        )
        got, message = await self._etcd_raw_read(self.rogue)
        self.record(
            f"TLS with a certificate of a different CA to etcd {self.t.etcd}",
            "UNAVAILABLE",
            got,
            message,
        )
        rogue = TlsFiles(self.t.pki_dir / "ca.pem", self.rogue.cert, self.rogue.key)
        got, message = await self._etcd_store_read(rogue)
        self.record(
            "Store with a certificate of a different CA to etcd", "UNAVAILABLE", got, message
        )
        tls = TlsFiles(self.t.pki_dir / "ca.pem", self.service.cert, self.service.key)
        got, message = await self._etcd_store_read(tls)
        self.record(
            "(control) Store with a service certificate of the cluster CA", OK, got, message
        )

    async def people(self) -> dict[str, str]:
        """Two users made by the admin (their tokens, by name); the admin works (control)."""
        admin = self.admin(self.t.admin_token)
        users = {}
        for who in ("alice", "bob"):
            user = f"check-{who}-{self.suffix}"
            reply = await self.expect(
                f"(control) admin CreateToken for {user}",
                OK,
                admin.CreateToken(apb.CreateTokenRequest(user=user), timeout=CALL_TIMEOUT_S),
            )
            if reply is None:
                raise RuntimeError("the admin token cannot create users: nothing more to try")
            self.cleanup_tokens.append(reply.token.id)
            users[who] = reply.secret
        return users

    async def tokens(self, users: dict[str, str]) -> None:
        """Tokens missing, malformed, unknown, revoked or expired are UNAUTHENTICATED."""
        admin = self.admin(self.t.admin_token)
        request = spb.ListJobsRequest()
        await self.expect(
            "ListJobs with no token",
            "UNAUTHENTICATED",
            self.jobs(None).ListJobs(request, timeout=CALL_TIMEOUT_S),
        )
        unknown = f"{auth.TOKEN_PREFIX}{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
        await self.expect(
            "ListJobs with a well-formed unknown token",
            "UNAUTHENTICATED",
            self.jobs(unknown).ListJobs(request, timeout=CALL_TIMEOUT_S),
        )
        parsed = auth.parse_token(users["alice"])
        assert parsed is not None
        guessed = f"{auth.TOKEN_PREFIX}{parsed[0]}_{secrets.token_urlsafe(32)}"
        await self.expect(
            "ListJobs with alice's token id and a wrong secret",
            "UNAUTHENTICATED",
            self.jobs(guessed).ListJobs(request, timeout=CALL_TIMEOUT_S),
        )
        await self.expect(
            "ListJobs with a job credential instead of a token",
            "UNAUTHENTICATED",
            self.jobs(f"{auth.JOB_CREDENTIAL_PREFIX}j-x.{'0' * 64}").ListJobs(
                request, timeout=CALL_TIMEOUT_S
            ),
        )
        short = await admin.CreateToken(
            apb.CreateTokenRequest(user=f"check-carol-{self.suffix}", ttl_s=1),
            timeout=CALL_TIMEOUT_S,
        )
        doomed = await admin.CreateToken(
            apb.CreateTokenRequest(user=f"check-dave-{self.suffix}"), timeout=CALL_TIMEOUT_S
        )
        self.cleanup_tokens += [short.token.id, doomed.token.id]
        await self.expect(
            "(control) ListJobs with a fresh user token",
            OK,
            self.jobs(doomed.secret).ListJobs(request, timeout=CALL_TIMEOUT_S),
        )
        await admin.RevokeToken(
            apb.RevokeTokenRequest(token_id=doomed.token.id), timeout=CALL_TIMEOUT_S
        )
        await self._refused_soon("ListJobs with a revoked token", doomed.secret)
        await self._refused_soon("ListJobs with an expired token (ttl 1 s)", short.secret)

    async def _refused_soon(self, name: str, token: str) -> None:
        """Poll until the token is refused (caches and expiry take a moment), or give up."""
        stub = self.jobs(token)
        deadline = time.monotonic() + REFUSAL_WAIT_S
        while True:
            got, message, _ = await _status(
                stub.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
            )
            if got != OK or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        self.record(name, "UNAUTHENTICATED", got, message)

    async def _submit(self, token: str, name: str, **secret: str) -> pb.Job:
        spec = pb.JobSpec(
            name=name,
            command=["python", "-c", "pass"],
            batch=pb.BatchLimits(initial_batch_size=1),
            secret_env=secret,
        )
        request = spb.SubmitJobRequest(spec=spec, request_id=f"check-{secrets.token_hex(8)}")
        reply = await self.jobs(token).SubmitJob(request, timeout=CALL_TIMEOUT_S)
        self.cleanup_jobs.append(reply.job.id)
        return reply.job  # type: ignore[no-any-return]

    async def other_users_jobs(self, users: dict[str, str]) -> None:
        """A user may not see, change or stream another user's job, nor administer."""
        victim = await self._submit(users["alice"], "check-victim")
        bob = self.jobs(users["bob"])
        for name, call in (
            ("GetJob", bob.GetJob(spb.GetJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S)),
            (
                "CancelJob",
                bob.CancelJob(spb.CancelJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
            ),
            (
                "DeleteJob",
                bob.DeleteJob(spb.DeleteJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
            ),
            ("Explain", bob.Explain(spb.ExplainRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S)),
        ):
            await self.expect(f"bob {name} of alice's job", "PERMISSION_DENIED", call)
        await self.expect_stream(
            "bob StreamLogs of alice's job",
            "PERMISSION_DENIED",
            bob.StreamLogs(lpb.StreamLogsRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
        )
        await self.expect_stream(
            "bob WatchJobs of alice's job",
            "PERMISSION_DENIED",
            bob.WatchJobs(spb.WatchJobsRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
        )
        listed = await bob.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
        seen = [j.id for j in listed.jobs if j.id == victim.id]
        self.record(
            "bob ListJobs includes alice's job",
            "HIDDEN",
            "SHOWN" if seen else "HIDDEN",
            "bob's listing has only his own jobs" if not seen else f"bob sees {victim.id}",
        )
        after = await self.jobs(self.t.admin_token).GetJob(
            spb.GetJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S
        )
        self.record(
            "alice's job after bob's attempts",
            "UNCHANGED",
            "CHANGED" if after.job.cancel_requested else "UNCHANGED",
            f"cancel_requested={after.job.cancel_requested}; the job still exists",
        )
        user_admin = self.admin(users["bob"])
        for name, call in (
            (
                "CreateToken",
                user_admin.CreateToken(
                    apb.CreateTokenRequest(user=f"check-eve-{self.suffix}", role=auth.ADMIN),
                    timeout=CALL_TIMEOUT_S,
                ),
            ),
            (
                "PutTenant",
                user_admin.PutTenant(
                    apb.PutTenantRequest(tenant=pb.Tenant(name="check-tenant", guarantee_gpus=1)),
                    timeout=CALL_TIMEOUT_S,
                ),
            ),
            (
                "RevokeToken",
                user_admin.RevokeToken(
                    apb.RevokeTokenRequest(token_id=self.t.admin_token), timeout=CALL_TIMEOUT_S
                ),
            ),
            ("ListAudit", user_admin.ListAudit(apb.ListAuditRequest(), timeout=CALL_TIMEOUT_S)),
            ("ListTokens", user_admin.ListTokens(apb.ListTokensRequest(), timeout=CALL_TIMEOUT_S)),
        ):
            await self.expect(f"user bob calls admin {name}", "PERMISSION_DENIED", call)

    async def secrets(self, users: dict[str, str]) -> None:
        """Secret environment values are stored for launchers, never returned to anyone."""
        value = f"s3cret-{secrets.token_hex(8)}"
        alice = self.jobs(users["alice"])
        reply = await alice.SubmitJob(
            spb.SubmitJobRequest(
                spec=pb.JobSpec(
                    name="check-secret",
                    command=["python", "-c", "pass"],
                    batch=pb.BatchLimits(initial_batch_size=1),
                    secret_env={"CHECK_SECRET": value},
                ),
                request_id=f"check-{secrets.token_hex(8)}",
            ),
            timeout=CALL_TIMEOUT_S,
        )
        job_id = reply.job.id
        self.cleanup_jobs.append(job_id)
        shown: list[tuple[str, pb.Job | None]] = [("SubmitJob", reply.job)]
        for who, token in (("alice", users["alice"]), ("admin", self.t.admin_token)):
            stub = self.jobs(token)
            got = await stub.GetJob(spb.GetJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)
            shown.append((f"{who} GetJob", got.job))
            listed = await stub.ListJobs(spb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
            shown.append(
                (f"{who} ListJobs", next((j for j in listed.jobs if j.id == job_id), None))
            )
        watch = self.jobs(users["alice"]).WatchJobs(
            spb.WatchJobsRequest(job_id=job_id), timeout=CALL_TIMEOUT_S
        )
        async for event in watch:
            shown.append(("alice WatchJobs", event.job))
            watch.cancel()
            break
        for where, job in shown:
            values = dict(job.spec.secret_env) if job is not None else {}
            leaked = value in str(job)
            self.record(
                f"secret_env value in the {where} response",
                "WITHHELD",
                "LEAKED" if leaked or values != {"CHECK_SECRET": SECRET} else "WITHHELD",
                f"secret_env shows {values}",
            )

    async def forged_agent_reports(self, users: dict[str, str]) -> None:
        """A job's credential speaks for that job only, and only ours are credentials."""
        mine = await self._submit(users["alice"], "check-job-a")
        theirs = await self._submit(users["bob"], "check-job-b")
        tls = TlsFiles(self.t.pki_dir / "ca.pem", self.service.cert, self.service.key)
        store = await Store.connect(self.t.etcd, self.t.etcd_root, tls=tls)
        try:
            key = await JobKeyring(store).key()
        finally:
            await store.close()
        credential = auth.job_credential(key, mine.id)
        made_up = f"{auth.JOB_CREDENTIAL_PREFIX}{theirs.id}.{secrets.token_hex(32)}"
        report = agpb.ReportMetricsRequest(
            job_id=theirs.id,
            generation=1,
            seq=1,
            observations=[
                pb.StepObservation(
                    num_nodes=1,
                    num_replicas=1,
                    local_batch_size=1,
                    accum_steps=1,
                    accum_step_time_s=0.1,
                    optim_step_time_s=0.1,
                    count=1,
                )
            ],
            gradient=pb.GradientStats(sqr=1.0, var=1.0),
        )
        batch = agpb.GetBatchConfigRequest(job_id=theirs.id, num_nodes=1, num_replicas=1)
        for address in self.t.agents:
            forged = agpb_grpc.AgentServiceStub(self.channel(address, token=credential))
            where = f"agent {address}"
            await self.expect(
                f"job A's credential on ReportMetrics for job B at {where}",
                "PERMISSION_DENIED",
                forged.ReportMetrics(report, timeout=CALL_TIMEOUT_S),
            )
            await self.expect(
                f"job A's credential on GetBatchConfig for job B at {where}",
                "PERMISSION_DENIED",
                forged.GetBatchConfig(batch, timeout=CALL_TIMEOUT_S),
            )
            await self.expect(
                f"job A's credential on GetModel for job B at {where}",
                "PERMISSION_DENIED",
                forged.GetModel(agpb.GetModelRequest(job_id=theirs.id), timeout=CALL_TIMEOUT_S),
            )
            got, message, _ = await _status(
                forged.GetModel(agpb.GetModelRequest(job_id=mine.id), timeout=CALL_TIMEOUT_S)
            )
            # Its own job may have no model yet: anything but an auth refusal is acceptance.
            if got not in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
                message, got = f"{got}: {message}", OK
            self.record(
                f"(control) job A's credential on GetModel for job A at {where}", OK, got, message
            )
            for name, token in (
                ("a made-up job credential", made_up),
                ("a person's API token", users["bob"]),
                ("no credential", None),
            ):
                stub = agpb_grpc.AgentServiceStub(self.channel(address, token=token))
                await self.expect(
                    f"{name} on ReportMetrics at {where}",
                    "UNAUTHENTICATED",
                    stub.ReportMetrics(report, timeout=CALL_TIMEOUT_S),
                )

    # -- terminal safety: a job's output shown by pollux-cli -----------------------------------

    async def terminal_escapes(self, users: dict[str, str]) -> None:
        r"""A job's output with escape sequences is shown by `pollux-cli` as text, not obeyed.

        alice's job writes a screen clear, an OSC 52 clipboard write, a window title, a
        hyperlink, a C1 CSI and a bidi override to stdout, one more OSC 52 to stderr, and fails
        (its output tail becomes a history reason). The real CLI (a subprocess, as alice) follows
        it, prints its log and describes it: no output may hold a control character but
        newlines and tabs, and the escapes must be there as text (``\x1b]52;``). ``describe
        --raw`` too, since the history stores reasons escaped; ``logs --raw`` (the control)
        must show the escapes as written, or the job never wrote them.
        """
        script = (
            r"printf 'clear\033[2J\033[H clip\033]52;c;cHduZWQ=\007 title\033]0;pwned\007 "
            r"link\033]8;;https://evil.example/\033\\docs\033]8;;\033\\ "
            r"c1\302\2332J bidi\342\200\256cod.exe\n'; "
            r"printf 'boom\033]52;c;cHduZWQ=\007\n' >&2; exit 1"
        )
        wait_s = 120.0  # for the job: two short runs, behind the check's other jobs
        shown, written = r"\x1b]52;c;cHduZWQ=", "\x1b]52;c;cHduZWQ="
        env = {
            **os.environ,
            "POLLUX_CONFIG": str(self.scratch / "no-config.toml"),
            "POLLUX_CA": str(self.t.pki_dir / "ca.pem"),
            "POLLUX_TOKEN": users["alice"],
        }

        async def cli(*args: str) -> tuple[int | None, str]:
            """Run pollux-cli as alice; its exit code (None: it hung) and its output."""
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pollux.client.cli",
                "--server",
                self.t.schedulers[0],
                *args,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                out, _ = await asyncio.wait_for(process.communicate(), wait_s)
            except TimeoutError:
                process.kill()
                out, _ = await process.communicate()
                return None, out.decode(errors="replace")
            return process.returncode, out.decode(errors="replace")

        def verdict(code: int | None, out: str, want_code: int, text: str) -> tuple[str, str]:
            """ESCAPED, RAW (a control character reached the terminal), or what went wrong."""
            raw = sorted(
                {f"U+{ord(c):04X}" for c in out if not c.isprintable() and c not in "\n\t"}
            )
            if code != want_code:
                return "ERROR", f"exit {code}: {out[-300:]}"
            if raw:
                return "RAW", f"control characters {', '.join(raw)} printed as they are"
            if text not in out:
                return "MISSING", f"{text!r} is not in the output: {out[-300:]}"
            return "ESCAPED", f"{text!r} shown as text, no control character"

        code, out = await cli(
            *("submit", "--follow", "--name", "check-terminal", "--initial-batch-size", "1"),
            *("--max-failures", "1", "--", "sh", "-c", script),
        )
        job_id = out.split("\t", 1)[0].strip() if code is not None else ""
        if job_id.startswith("j-"):
            self.cleanup_jobs.append(job_id)
        name = "a job that writes terminal escapes"
        self.record(
            f"`pollux-cli submit --follow` of {name}", "ESCAPED", *verdict(code, out, 3, shown)
        )
        code, out = await cli("logs", job_id)
        self.record(f"`pollux-cli logs` of {name}", "ESCAPED", *verdict(code, out, 0, shown))
        code, out = await cli("describe", job_id)
        self.record(
            f"`pollux-cli describe` of {name} (a failure reason quotes its output)",
            "ESCAPED",
            *verdict(code, out, 0, "boom"),
        )
        code, out = await cli("describe", "--raw", job_id)
        self.record(
            f"`pollux-cli describe --raw` of {name} (histories store reasons escaped)",
            "ESCAPED",
            *verdict(code, out, 0, "boom"),
        )
        code, out = await cli("logs", "--raw", job_id)
        got, message = verdict(code, out, 0, written)
        if got == "RAW" and written in out:
            got, message = OK, "the job's escapes, printed as written (it did write them)"
        self.record(f"(control) `pollux-cli logs --raw` of {name}", OK, got, message)

    # -- job references, dead credentials, per-user bounds (issue 28) -----------------------

    async def _until(self, token: str, job_id: str, states: set[int]) -> pb.Job | None:
        """Poll the job until it is in one of `states` (None if it is not within the wait)."""
        stub = self.jobs(token)
        deadline = time.monotonic() + JOB_WAIT_S
        while time.monotonic() < deadline:
            reply = await stub.GetJob(spb.GetJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)
            if reply.job.state in states:
                return reply.job  # type: ignore[no-any-return]
            await asyncio.sleep(0.2)
        return None

    async def _running(self, token: str, name: str, code: str) -> pb.Job:
        """A job of `token`'s user running `python -c code`, submitted now."""
        spec = pb.JobSpec(
            name=name, command=["python", "-c", code], batch=pb.BatchLimits(initial_batch_size=1)
        )
        request = spb.SubmitJobRequest(spec=spec, request_id=f"check-{secrets.token_hex(8)}")
        reply = await self.jobs(token).SubmitJob(request, timeout=CALL_TIMEOUT_S)
        self.cleanup_jobs.append(reply.job.id)
        return reply.job  # type: ignore[no-any-return]

    async def _log_text(self, token: str, reference: str) -> tuple[str, str]:
        """(status, the lines) of a log read by reference without following."""
        call = self.jobs(token).StreamLogs(
            lpb.StreamLogsRequest(job_id=reference), timeout=CALL_TIMEOUT_S
        )
        lines: list[str] = []
        try:
            async for chunk in call:
                lines.extend(chunk.lines)
        except grpc.aio.AioRpcError as error:
            return _code(error)
        return OK, "\n".join(lines)

    async def jobs_named_after_ids(self, users: dict[str, str]) -> None:
        """A job named after another user's job id reaches neither that job nor its log."""
        secret = f"check-log-{secrets.token_hex(6)}"
        victim = await self._running(users["alice"], "check-diary", f"print({secret!r})")
        done = await self._until(users["alice"], victim.id, {pb.JOB_STATE_SUCCEEDED})
        got, text = await self._log_text(users["alice"], "check-diary")
        self.record(
            "(control) alice reads her finished job's log by its name",
            OK,
            got if got != OK or secret in text else "WRONG LOG",
            text[:100] if done is not None else "the job did not finish in time",
        )
        await self.jobs(users["alice"]).DeleteJob(
            spb.DeleteJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S
        )
        bob = self.jobs(users["bob"])
        for name in (victim.id[:8], victim.id):
            # It runs a while: a cluster that accepts it would relay its node's log.
            spec = pb.JobSpec(
                name=name,
                command=["python", "-c", "import time; time.sleep(60)"],
                batch=pb.BatchLimits(initial_batch_size=1),
            )
            request = spb.SubmitJobRequest(spec=spec, request_id=f"check-{secrets.token_hex(8)}")
            reply = await self.expect(
                f"bob submits a job named {'after' if name == victim.id else 'a prefix of'} "
                "alice's job id",
                "INVALID_ARGUMENT",
                bob.SubmitJob(request, timeout=CALL_TIMEOUT_S),
            )
            if reply is not None:
                self.cleanup_jobs.append(reply.job.id)
                if name == victim.id:
                    await self._until(users["bob"], reply.job.id, {pb.JOB_STATE_RUNNING})
        got, text = await self._log_text(users["bob"], victim.id)
        self.record(
            "bob reads logs by alice's (deleted) job id",
            "NOT_FOUND",
            "LEAKED" if secret in text else got,
            text[:100] if got == OK else text,
        )
        await self.expect(
            "bob describes by alice's (deleted) job id",
            "NOT_FOUND",
            bob.GetJob(spb.GetJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
        )
        await self.expect(
            "bob cancels by alice's (deleted) job id",
            "NOT_FOUND",
            bob.CancelJob(spb.CancelJobRequest(job_id=victim.id), timeout=CALL_TIMEOUT_S),
        )

    async def dead_job_credentials(self, users: dict[str, str]) -> None:
        """A FAILED job's credential gets no batch configuration and no report in."""
        job = await self._running(users["alice"], "check-failing", "raise SystemExit(3)")
        failed = await self._until(users["alice"], job.id, {pb.JOB_STATE_FAILED})
        tls = TlsFiles(self.t.pki_dir / "ca.pem", self.service.cert, self.service.key)
        store = await Store.connect(self.t.etcd, self.t.etcd_root, tls=tls)
        try:
            key = await JobKeyring(store).key()
        finally:
            await store.close()
        credential = auth.job_credential(key, job.id)
        report = agpb.ReportMetricsRequest(
            job_id=job.id,
            generation=1,
            seq=1,
            observations=[
                pb.StepObservation(
                    num_nodes=1,
                    num_replicas=1,
                    local_batch_size=1,
                    accum_steps=1,
                    accum_step_time_s=0.1,
                    optim_step_time_s=0.1,
                    count=1,
                )
            ],
            gradient=pb.GradientStats(sqr=1.0, var=1.0),
        )
        batch = agpb.GetBatchConfigRequest(job_id=job.id, num_nodes=1, num_replicas=1)
        state = "FAILED" if failed is not None else "not FAILED in time"
        for address in self.t.agents:
            stub = agpb_grpc.AgentServiceStub(self.channel(address, token=credential))
            await self.expect(
                f"a {state} job's credential on GetBatchConfig at agent {address}",
                "UNAUTHENTICATED",
                stub.GetBatchConfig(batch, timeout=CALL_TIMEOUT_S),
            )
            await self.expect(
                f"a {state} job's credential on ReportMetrics at agent {address}",
                "UNAUTHENTICATED",
                stub.ReportMetrics(report, timeout=CALL_TIMEOUT_S),
            )

    async def revoked_token_streams(self) -> None:
        """A token revoked while its stream is open ends that stream."""
        admin = self.admin(self.t.admin_token)
        made = await admin.CreateToken(
            apb.CreateTokenRequest(user=f"check-erin-{self.suffix}"), timeout=CALL_TIMEOUT_S
        )
        self.cleanup_tokens.append(made.token.id)
        job = await self._submit(made.secret, "check-erin")
        call = self.jobs(made.secret).WatchJobs(
            spb.WatchJobsRequest(job_id=job.id), timeout=REFUSAL_WAIT_S * 4
        )
        await call.read()
        await admin.RevokeToken(
            apb.RevokeTokenRequest(token_id=made.token.id), timeout=CALL_TIMEOUT_S
        )
        got, message = "OPEN", f"still streaming {REFUSAL_WAIT_S:.0f} s after the revocation"
        try:
            async with asyncio.timeout(REFUSAL_WAIT_S):
                while await call.read() is not grpc.aio.EOF:
                    pass
            got, message = OK, "the stream ended without a status"
        except grpc.aio.AioRpcError as error:
            got, message = _code(error)
        except TimeoutError:
            call.cancel()
        self.record("a stream open while its token is revoked", "UNAUTHENTICATED", got, message)

    async def stream_caps(self, users: dict[str, str]) -> None:
        """One user's open streams hit a cap; another user still streams meanwhile."""
        own = await self._submit(users["bob"], "check-streams")
        bob = self.jobs(users["bob"])
        calls: list[Any] = []
        got, message = "OPEN", f"{MAX_STREAMS_TRIED} streams opened, none refused"
        try:
            for _ in range(MAX_STREAMS_TRIED):
                call = bob.WatchJobs(
                    spb.WatchJobsRequest(job_id=own.id), timeout=CALL_TIMEOUT_S * 6
                )
                calls.append(call)
                try:
                    await call.read()
                except grpc.aio.AioRpcError as error:
                    got, message = _code(error)
                    break
            others = self.jobs(users["alice"]).WatchJobs(
                spb.WatchJobsRequest(), timeout=CALL_TIMEOUT_S
            )
            await self.expect_stream(
                "(control) alice opens a stream while bob holds his cap", OK, others
            )
        finally:
            for call in calls:
                call.cancel()
        self.record(f"bob opens stream {len(calls)} at once", "RESOURCE_EXHAUSTED", got, message)

    async def submit_caps(self, users: dict[str, str]) -> None:
        """One user's flood of submits is refused past their rate; another user submits."""
        got, message, sent = "ACCEPTED", f"{MAX_SUBMITS_TRIED} submits accepted", 0
        while got == "ACCEPTED" and sent < MAX_SUBMITS_TRIED:
            sent += 1
            try:
                await self._submit(users["bob"], "check-flood")
            except grpc.aio.AioRpcError as error:
                got, message = _code(error)
        self.record(f"bob's submit {sent} in a burst", "RESOURCE_EXHAUSTED", got, message)
        await self.expect(
            "(control) alice submits while bob is refused",
            OK,
            self.jobs(users["alice"]).SubmitJob(
                spb.SubmitJobRequest(
                    spec=pb.JobSpec(
                        name="check-after-flood",
                        command=["python", "-c", "pass"],
                        batch=pb.BatchLimits(initial_batch_size=1),
                    ),
                    request_id=f"check-{secrets.token_hex(8)}",
                ),
                timeout=CALL_TIMEOUT_S,
            ),
        )

    # -- a job reading what is not its own (replica isolation) -----------------------------------

    async def replica_reads(self, users: dict[str, str]) -> None:
        """Bob's job tries to read every credential but its own from its replica: all refused.

        Alice's job first leaves a checkpoint and a log line; bob's job then tries each path
        and prints ``READ`` or ``REFUSED`` per path (its log is read back from the work dir).
        """
        workdir = self.t.workdir
        if workdir is None:
            return
        victim_script = (
            "import os, pathlib\n"
            "d = pathlib.Path(os.environ['POLLUX_CHECKPOINT_DIR'])\n"
            "(d / 'weights').write_text('alice-weights')\n"
            "print('alice-log-line', flush=True)\n"
        )
        victim = await self._run_job(users["alice"], "check-victim-files", victim_script, [])
        if victim is None:
            return
        pki_dir = self.t.pki_dir
        targets = {
            "the admin's pollux-cli context (~/.config/pollux/config.toml)": self.t.admin_context,
            "the work dir's pki/ listing": pki_dir,
            "the CA key (pki/ca-key.pem)": pki_dir / "ca-key.pem",
            "the kept admin token (pki/admin-token)": pki_dir / "admin-token",
            "etcd's key (pki/etcd-key.pem)": pki_dir / "etcd-key.pem",
            **{
                f"the launcher's key (pki/{key.name})": key
                for key in sorted(pki_dir.glob("node-*-key.pem"))
            },
            "another user's job's checkpoint dir": workdir / "checkpoints" / victim.id,
            "another user's job's checkpoint": workdir / "checkpoints" / victim.id / "weights",
            "another user's job's log": workdir / "replica-logs" / victim.id / "1-0.log",
        }
        tried = {name: path for name, path in targets.items() if path is not None}
        thief_script = (
            "import os, sys\n"
            "for i, path in enumerate(sys.argv[1:]):\n"
            "    if path == 'OWN':\n"
            "        path = os.path.join(os.environ['POLLUX_CHECKPOINT_DIR'], 'mine')\n"
            "        open(path, 'w').write('x')\n"
            "    try:\n"
            "        if os.path.isdir(path):\n"
            "            got = ' '.join(sorted(os.listdir(path)))\n"
            "        else:\n"
            "            got = open(path, 'rb').read(64).hex()\n"
            "        print(f'ATTEMPT {i} READ {got[:40]}', flush=True)\n"
            "    except OSError as error:\n"
            "        print(f'ATTEMPT {i} REFUSED {error.strerror}', flush=True)\n"
        )
        argv = [str(path) for path in tried.values()] + ["OWN"]
        thief = await self._run_job(users["bob"], "check-thief-files", thief_script, argv)
        if thief is None:
            return
        answers = self._attempt_lines(workdir / "replica-logs" / thief.id)
        for index, (name, path) in enumerate(tried.items()):
            got, message = answers.get(index, ("NOT_TRIED", "the job printed nothing for it"))
            self.record(f"a job reads {name} ({path})", "REFUSED", got, message)
        got, message = answers.get(len(tried), ("NOT_TRIED", "the job printed nothing for it"))
        self.record("(control) a job reads a file in its own checkpoint dir", "READ", got, message)

    async def _run_job(self, token: str, name: str, script: str, argv: list[str]) -> pb.Job | None:
        """Submit a one-replica Python job and wait for it to end; None if it never did."""
        spec = pb.JobSpec(
            name=name,
            command=[sys.executable, "-c", script, *argv],
            batch=pb.BatchLimits(initial_batch_size=1),
        )
        request = spb.SubmitJobRequest(spec=spec, request_id=f"check-{secrets.token_hex(8)}")
        reply = await self.jobs(token).SubmitJob(request, timeout=CALL_TIMEOUT_S)
        self.cleanup_jobs.append(reply.job.id)
        admin = self.jobs(self.t.admin_token)
        deadline = time.monotonic() + JOB_WAIT_S
        while time.monotonic() < deadline:
            got = await admin.GetJob(spb.GetJobRequest(job_id=reply.job.id), timeout=CALL_TIMEOUT_S)
            if got.job.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED):
                return got.job  # type: ignore[no-any-return]
            await asyncio.sleep(0.2)
        self.record(f"job {name} ran to its end", OK, "TIMEOUT", f"not done in {JOB_WAIT_S} s")
        return None

    @staticmethod
    def _attempt_lines(logs: Path) -> dict[int, tuple[str, str]]:
        """``ATTEMPT <i> <READ|REFUSED> <detail>`` lines of a job's logs, by i."""
        out: dict[int, tuple[str, str]] = {}
        for log in sorted(logs.glob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[0] == "ATTEMPT" and parts[1].isdigit():
                    out[int(parts[1])] = (parts[2], parts[3] if len(parts) > 3 else "")
        return out

    # -- end of the replica isolation block ------------------------------------------------------

    async def clean_up(self) -> None:
        """Cancel the jobs and revoke the tokens this check made (best effort)."""
        if not self.t.schedulers:
            return
        jobs, admin = self.jobs(self.t.admin_token), self.admin(self.t.admin_token)
        for job_id in self.cleanup_jobs:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await jobs.CancelJob(spb.CancelJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)
        for token_id in self.cleanup_tokens:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await admin.RevokeToken(
                    apb.RevokeTokenRequest(token_id=token_id), timeout=CALL_TIMEOUT_S
                )


async def run_checks(target: Target) -> list[Attempt]:
    """Every attempt against `target` (see the module doc), in the order made."""
    scratch = Path(tempfile.mkdtemp(prefix="pollux-security-check-"))
    try:
        return await Checker(target, scratch).run()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def discover(
    schedulers: Sequence[str], etcd: str, etcd_root: str, pki_dir: Path, token: str
) -> Target:
    """A running cluster's agents and launchers, as its scheduler reports them."""
    credentials = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials((pki_dir / "ca.pem").read_bytes()),
        grpc.access_token_call_credentials(token),
    )
    async with grpc.aio.secure_channel(schedulers[0], credentials) as channel:
        status = await spb_grpc.SchedulerServiceStub(channel).ClusterStatus(
            spb.ClusterStatusRequest(), timeout=CALL_TIMEOUT_S
        )
    context = config_path(os.environ)
    return Target(
        schedulers=tuple(schedulers),
        agents=tuple(a.address for a in status.agents),
        launchers=tuple(n.node.address for n in status.nodes),
        etcd=etcd,
        etcd_root=etcd_root,
        pki_dir=pki_dir,
        admin_token=token,
        # A pollux-up work dir on this machine: its replicas' files can be pointed at.
        workdir=pki_dir.parent if (pki_dir.parent / "replica-logs").is_dir() else None,
        admin_context=context if context.exists() else None,
    )


@contextlib.contextmanager
def own_cluster(workdir: Path) -> Iterator[LocalCluster]:
    """A fresh secure LocalCluster: 1 scheduler, 1 agent, 1 node with 1 CPU slot."""
    cluster = LocalCluster(
        workdir, nodes=1, gpus_per_node=1, schedulers=1, agents=1, interval_s=1.0, secure=True
    )
    with cluster:
        # What `pollux-up` writes for the admin, here in a home of its own.
        cluster.write_cli_context(workdir / "admin-home" / ".config" / "pollux" / "config.toml")
        yield cluster


def report(attempts: Sequence[Attempt], out: Callable[[str], None] = print) -> int:
    """Print one line per attempt and a summary; the exit status (1 if any failed)."""
    for attempt in attempts:
        out(attempt.line())
    failed = sum(not a.passed for a in attempts)
    out(f"{len(attempts) - failed}/{len(attempts)} attempts answered as a secure cluster should")
    return 1 if failed else 0


async def _checked(args: argparse.Namespace) -> list[Attempt]:
    target = await discover(
        args.scheduler.split(","), args.etcd, args.etcd_root, args.pki_dir, args.token
    )
    return await run_checks(target)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where the own cluster lives (default: temp)")
    parser.add_argument("--scheduler", help="check a running cluster: scheduler host:port(s)")
    parser.add_argument("--etcd", help="its etcd endpoint(s)")
    parser.add_argument("--etcd-root", default=DEFAULT_ROOT, help="its etcd key root")
    parser.add_argument("--pki-dir", type=Path, help="its CA: ca.pem and ca-key.pem")
    parser.add_argument("--token", help="an admin token")
    args = parser.parse_args(argv)
    if args.scheduler:
        missing = [f"--{n}" for n in ("etcd", "pki_dir", "token") if not getattr(args, n)]
        if missing:
            parser.error(f"checking a running cluster needs {', '.join(missing)}")
        attempts = asyncio.run(_checked(args))
        return report(attempts)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pollux-security-"))
    print(f"starting a secure local cluster in {workdir} ...", flush=True)
    with own_cluster(workdir) as cluster:
        attempts = asyncio.run(run_checks(Target.of_cluster(cluster)))
    return report(attempts)


if __name__ == "__main__":
    sys.exit(main())
