"""What every attempt of the security check shares: where the cluster is, and how to ask it.

`Target` names the cluster's doors and the operator's keys; `Session` holds the credentials the
check issues itself (a service and a user certificate of the cluster CA, and one of a rogue
CA), makes channels and calls, records each `Attempt` (one printed line: PASS or FAIL), and
cancels and revokes what the check made. The attempts are grouped by concern in the sibling
modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pollux.service import auth, pki
from pollux.service.job_credentials import JobKeyring
from pollux.service.keys import DEFAULT_ROOT
from pollux.service.local import job_reach
from pollux.service.local_cluster import LocalCluster
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import launcher_service_pb2 as lpb
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


def code_of(error: grpc.aio.AioRpcError) -> tuple[str, str]:
    """(status name, details) of a refused call."""
    return error.code().name, str(error.details() or "")


async def unary_status(call: Awaitable[Any]) -> tuple[str, str, Any]:
    """(status, message, response) of a unary call, never raising for a status."""
    try:
        response = await call
    except grpc.aio.AioRpcError as error:
        return (*code_of(error), None)
    return OK, "answered", response


async def stream_status(call: Any) -> tuple[str, str]:
    """Status of a server stream: refused, or OK once its first message (or its end) came."""
    try:
        async for _ in call:
            call.cancel()
            return OK, "streamed"
    except grpc.aio.AioRpcError as error:
        return code_of(error)
    return OK, "the stream ended"


class Session:
    """What every attempt shares: the target, the credentials the check made, the outcomes.

    Args:
        target: The cluster.
        scratch: A directory for the certificates it issues itself (removed by the caller).
    """

    def __init__(self, target: Target, scratch: Path) -> None:
        self.target = target
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

    def record(self, name: str, expected: str, got: str, message: str) -> Attempt:
        """Note an outcome."""
        attempt = Attempt(name, expected, got, message)
        self.attempts.append(attempt)
        return attempt

    async def expect(self, name: str, expected: str, call: Awaitable[Any]) -> Any:
        """Make a unary call, record its outcome, return the response (None if refused)."""
        got, message, response = await unary_status(call)
        self.record(name, expected, got, message)
        return response

    async def expect_stream(self, name: str, expected: str, call: Any) -> None:
        """Open a server stream, record whether it was refused."""
        got, message = await stream_status(call)
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
        return spb_grpc.SchedulerServiceStub(self.channel(self.target.schedulers[0], token=token))

    def admin(self, token: str | None) -> apb_grpc.AdminServiceStub:
        """The AdminService of the first scheduler, as the holder of `token`."""
        return apb_grpc.AdminServiceStub(self.channel(self.target.schedulers[0], token=token))

    async def close(self) -> None:
        """Close every channel made."""
        for made in self.channels:
            await made.close()

    def service_tls(self) -> TlsFiles:
        """TLS files for etcd under the check's own service certificate."""
        return TlsFiles(self.target.pki_dir / "ca.pem", self.service.cert, self.service.key)

    async def job_credential(self, job_id: str) -> str:
        """The job's credential, made with the cluster's key as a launcher makes it."""
        store = await Store.connect(self.target.etcd, self.target.etcd_root, tls=self.service_tls())
        try:
            key = await JobKeyring(store).key()
        finally:
            await store.close()
        return auth.job_credential(key, job_id)

    async def submit(self, token: str, name: str, **secret: str) -> pb.Job:
        """A one-replica job of `token`'s user that passes at once (`secret` its secret_env)."""
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

    async def running(self, token: str, name: str, code: str) -> pb.Job:
        """A job of `token`'s user running `python -c code`, submitted now."""
        spec = pb.JobSpec(
            name=name, command=["python", "-c", code], batch=pb.BatchLimits(initial_batch_size=1)
        )
        request = spb.SubmitJobRequest(spec=spec, request_id=f"check-{secrets.token_hex(8)}")
        reply = await self.jobs(token).SubmitJob(request, timeout=CALL_TIMEOUT_S)
        self.cleanup_jobs.append(reply.job.id)
        return reply.job  # type: ignore[no-any-return]

    async def until(self, token: str, job_id: str, states: set[int]) -> pb.Job | None:
        """Poll the job until it is in one of `states` (None if it is not within the wait)."""
        stub = self.jobs(token)
        deadline = time.monotonic() + JOB_WAIT_S
        while time.monotonic() < deadline:
            reply = await stub.GetJob(spb.GetJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)
            if reply.job.state in states:
                return reply.job  # type: ignore[no-any-return]
            await asyncio.sleep(0.2)
        return None

    async def log_text(self, token: str, reference: str) -> tuple[str, str]:
        """(status, the lines) of a log read by reference without following."""
        call = self.jobs(token).StreamLogs(
            lpb.StreamLogsRequest(job_id=reference), timeout=CALL_TIMEOUT_S
        )
        lines: list[str] = []
        try:
            async for chunk in call:
                lines.extend(chunk.lines)
        except grpc.aio.AioRpcError as error:
            return code_of(error)
        return OK, "\n".join(lines)

    def job_python(self) -> str:
        """The interpreter the check's Python jobs run: this one as the job uids can run it.

        On a cluster of this machine (its work dir known) `job_reach.job_python` (its job
        environment where the job uids cannot run this interpreter); elsewhere this one.
        """
        workdir = self.target.workdir
        return sys.executable if workdir is None else job_reach.job_python(workdir)

    async def run_job(self, token: str, name: str, script: str, argv: list[str]) -> pb.Job | None:
        """Submit a one-replica Python job and wait for it to end; None if it never did."""
        return await self.run_command(token, name, [self.job_python(), "-c", script, *argv])

    async def run_command(
        self,
        token: str,
        name: str,
        command: list[str],
        env: dict[str, str] | None = None,
        *,
        max_failures: int = 0,
    ) -> pb.Job | None:
        """Submit a one-replica job of `command` and wait for it to end; None if it never did.

        `max_failures`: restarts before the job fails (0: the scheduler's default).
        """
        spec = pb.JobSpec(
            name=name,
            command=command,
            env=env,
            max_failures=max_failures,
            batch=pb.BatchLimits(initial_batch_size=1),
        )
        request = spb.SubmitJobRequest(spec=spec, request_id=f"check-{secrets.token_hex(8)}")
        reply = await self.jobs(token).SubmitJob(request, timeout=CALL_TIMEOUT_S)
        self.cleanup_jobs.append(reply.job.id)
        admin = self.jobs(self.target.admin_token)
        deadline = time.monotonic() + JOB_WAIT_S
        while time.monotonic() < deadline:
            got = await admin.GetJob(spb.GetJobRequest(job_id=reply.job.id), timeout=CALL_TIMEOUT_S)
            if got.job.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED):
                return got.job  # type: ignore[no-any-return]
            await asyncio.sleep(0.2)
        self.record(f"job {name} ran to its end", OK, "TIMEOUT", f"not done in {JOB_WAIT_S} s")
        return None

    async def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel these jobs as the admin (best effort: one that ended stays as it is)."""
        jobs = self.jobs(self.target.admin_token)
        for job_id in job_ids:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await jobs.CancelJob(spb.CancelJobRequest(job_id=job_id), timeout=CALL_TIMEOUT_S)

    async def clean_up(self) -> None:
        """Cancel the jobs and revoke the tokens this check made (best effort)."""
        if not self.target.schedulers:
            return
        admin = self.admin(self.target.admin_token)
        await self.cancel(self.cleanup_jobs)
        for token_id in self.cleanup_tokens:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await admin.RevokeToken(
                    apb.RevokeTokenRequest(token_id=token_id), timeout=CALL_TIMEOUT_S
                )
