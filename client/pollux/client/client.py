"""The synchronous Pollux client: dataclasses in, dataclasses out, typed errors.

Why synchronous: its users are the CLI, scripts and notebooks, none of which run an event loop.

Failure handling happens at two levels, both only for RPCs the API documents as safe to retry
(all of SchedulerService's unary RPCs; SubmitJob because it carries a `request_id`):

1. Each channel carries a gRPC service config with a retry policy on UNAVAILABLE,
   so a transient failure of one server is retried by gRPC itself with backoff.
2. If a server stays UNAVAILABLE (down, lost leadership, etcd unreachable), the client moves on
   to the next target, or first to the leader the error named, and keeps using whichever
   answered. Streams fail over only before their first message, so nothing is seen twice.

Every `grpc.RpcError` leaves this module as a `PolluxError` subclass (see errors.py).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import grpc

from pollux.client import _convert
from pollux.client.config import parse_servers
from pollux.client.errors import (
    InvalidArgumentError,
    PolluxError,
    UnavailableError,
    UnreachableError,
    connect_failure_cause,
    from_rpc_error,
)
from pollux.client.types import (
    JOB_STATES,
    ClusterStatus,
    Explanation,
    Job,
    JobEstimate,
    JobSpec,
)
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc, scheduler_service_pb2_grpc
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

DEFAULT_TARGET = "127.0.0.1:7070"
SCHEDULER_SERVICE = "pollux.v1.SchedulerService"
ADMIN_SERVICE = "pollux.v1.AdminService"

# RPCs whose proto comment says "Safe to retry"; WatchJobs only reads. Only these are retried by
# gRPC and failed over to another target.
IDEMPOTENT_RPCS: frozenset[str] = frozenset(
    {
        "SubmitJob",
        "GetJob",
        "ListJobs",
        "CancelJob",
        "DeleteJob",
        "Explain",
        "EstimateJob",
        "ClusterStatus",
        "WatchJobs",
        "StreamLogs",
        "GetJobTimeline",
        "WhoAmI",
        "ListTokens",
        "ListTenants",
        "GetUsage",
        "ListAudit",
    }
)
_ADMIN_READS = {"WhoAmI", "ListTokens", "ListTenants", "GetUsage", "ListAudit"}
_UNARY_RETRIED = sorted(IDEMPOTENT_RPCS - {"WatchJobs", "StreamLogs"} - _ADMIN_READS)

R = TypeVar("R")


def service_config(max_attempts: int = 3) -> str:
    """The channel's service-config JSON: retry UNAVAILABLE, for idempotent RPCs only.

    gRPC retries only while no response message has arrived, so a retried call is never seen
    half-done; SubmitJob stays exactly-once because every attempt sends the same request_id.
    Backoff is 0.1 s, then doubling; gRPC accepts 2-5 attempts.
    """
    names = [{"service": SCHEDULER_SERVICE, "method": m} for m in _UNARY_RETRIED]
    names.extend({"service": ADMIN_SERVICE, "method": m} for m in sorted(_ADMIN_READS))
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": names,
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.1s",
                        "maxBackoff": "1s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


class LogChunk(NamedTuple):
    """Lines of a replica's log and the allocation generation of the replica that wrote them."""

    generation: int
    lines: tuple[str, ...]


class JobEvent(NamedTuple):
    """One WatchJobs event: the job after a change, and whether it was deleted."""

    job: Job
    deleted: bool


def parse_targets(targets: str | Sequence[str]) -> list[str]:
    """Split ``"h1:p1,h2:p2"`` (or a list) into distinct host:port targets, in order.

    Raises:
        ServerAddressError: No target given, or one without a port or with a bad one
            (`pollux.client.config.parse_servers`; a ValueError).
    """
    return list(parse_servers(targets if isinstance(targets, str) else ",".join(targets)))


class Client:
    """A connection to the Pollux schedulers (any replica can serve any request).

    Args:
        targets: host:port of one or more scheduler replicas, as a list or comma-separated.
        timeout_s: Deadline of each unary call, seconds (per target). Streams have none.
        retry_attempts: Attempts per target for a retryable call, 1-5 (1: no gRPC retry).
            With the default 3, a target that stays UNAVAILABLE costs 0.3 s before failover.
        credentials: TLS channel credentials; None for plaintext.
        token: An API token, sent with every call (needs `credentials`: never in plaintext).

    Use it as a context manager, or call `close`, to release its channels.
    """

    def __init__(
        self,
        targets: str | Sequence[str] = DEFAULT_TARGET,
        *,
        timeout_s: float = 10.0,
        retry_attempts: int = 3,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        if token and credentials is None:
            raise ValueError(
                "a token is only sent over TLS: give the CA that signed the scheduler's "
                "certificate (POLLUX_CA, or ca_file in the context pollux-up wrote)"
            )
        if token and credentials is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(token)
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if not 1 <= retry_attempts <= 5:
            raise ValueError(f"retry_attempts must be 1-5, got {retry_attempts}")
        self.retry_attempts = retry_attempts
        self.targets: tuple[str, ...] = tuple(parse_targets(targets))
        self.timeout_s = timeout_s
        self._credentials = credentials
        self._channels: dict[str, grpc.Channel] = {}
        self._current = self.targets[0]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every channel this client opened."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()

    # ---- scheduler RPCs ----------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, request_id: str | None = None) -> Job:
        """Submit a job; returns it as stored (PENDING on first submission).

        Args:
            spec: The job.
            request_id: Idempotency key; a fresh UUID when None. Every retry and failover of
                this call reuses it, so the job is created at most once. Pass your own to make
                resubmitting from a new process safe too.

        Raises:
            InvalidArgumentError: The spec is invalid; `violations` names each field.
            AlreadyExistsError: `request_id` was used before for a different spec.
        """
        request = spb.SubmitJobRequest(
            spec=_convert.spec_to_proto(spec), request_id=request_id or str(uuid.uuid4())
        )
        response: spb.SubmitJobResponse = self._unary("SubmitJob", request)
        return _convert.job_from_proto(response.job)

    def estimate(self, spec: JobSpec) -> JobEstimate:
        """When `spec` would complete if submitted now (nothing is submitted).

        Raises:
            InvalidArgumentError: The spec is invalid.
            FailedPreconditionError: No earlier job of that name (yours) has reported a model
                and a declared size, or the cluster is too busy to say.
        """
        request = spb.EstimateJobRequest(spec=_convert.spec_to_proto(spec))
        response: spb.EstimateJobResponse = self._unary("EstimateJob", request)
        return _convert.estimate_from_proto(response)

    def get_job(self, job_id: str) -> Job:
        """One job by id.

        Raises:
            NotFoundError: No such job.
        """
        response: spb.GetJobResponse = self._unary("GetJob", spb.GetJobRequest(job_id=job_id))
        return _convert.job_from_proto(response.job)

    def list_jobs(
        self,
        states: Sequence[str] | None = None,
        name_prefix: str = "",
        labels: Mapping[str, str] | None = None,
        page_size: int = 100,
        *,
        newest_first: bool = False,
        owner: str = "",
        limit: int | None = None,
    ) -> Iterator[Job]:
        """Every matching job, fetching pages as the iterator advances.

        Args:
            states: Only jobs in these states ("RUNNING", case-insensitive); None means all.
            name_prefix: Only jobs whose name starts with this.
            labels: Only jobs carrying all these labels.
            page_size: Jobs per RPC, 1-1000.
            newest_first: Newest first instead of creation order.
            owner: Only this user's jobs ("" = every job the caller may see).
            limit: Stop after this many jobs (None: all); pages are no larger than needed.

        Raises:
            InvalidArgumentError: An unknown state name (raised before any RPC).
        """
        numbers = _state_numbers(states or ())
        request = spb.ListJobsRequest(
            states=numbers,  # type: ignore[arg-type]
            name_prefix=name_prefix,
            labels=dict(labels or {}),
            page_size=page_size if limit is None else max(1, min(page_size, limit)),
            newest_first=newest_first,
            owner=owner,
        )
        return self._pages(request, limit)

    def _pages(self, request: spb.ListJobsRequest, limit: int | None = None) -> Iterator[Job]:
        left = limit
        while left is None or left > 0:
            response: spb.ListJobsResponse = self._unary("ListJobs", request)
            for job in response.jobs[:left]:
                yield _convert.job_from_proto(job)
            if left is not None:
                left -= len(response.jobs)
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    def cancel(self, job_id: str, reason: str = "") -> Job:
        """Ask for a job to stop; returns it with `cancel_requested` set.

        Cancelling a cancelled job succeeds.

        Raises:
            NotFoundError: No such job.
            FailedPreconditionError: The job already succeeded or failed.
        """
        request = spb.CancelJobRequest(job_id=job_id, reason=reason)
        response: spb.CancelJobResponse = self._unary("CancelJob", request)
        return _convert.job_from_proto(response.job)

    def delete(self, job_id: str) -> None:
        """Remove a finished job's record and model.

        Raises:
            NotFoundError: No such job (including a job this call deleted on an attempt whose
                reply was lost).
            FailedPreconditionError: The job has not finished; cancel it first.
        """
        self._unary("DeleteJob", spb.DeleteJobRequest(job_id=job_id))

    def watch(self, job_id: str = "") -> Iterator[JobEvent]:
        """The current jobs (or one job), then every change, until the iterator is closed.

        Closing the iterator (or leaving a ``for`` loop over it) cancels the stream.

        Args:
            job_id: Only this job; empty means every job.
        """
        for response in self._stream("WatchJobs", spb.WatchJobsRequest(job_id=job_id)):
            yield JobEvent(_convert.job_from_proto(response.job), response.deleted)

    def explain(self, job_id: str) -> Explanation:
        """Why a job has what it has: its last decision, that round, its model and batch.

        Raises:
            NotFoundError: No such job.
        """
        response: spb.ExplainResponse = self._unary("Explain", spb.ExplainRequest(job_id=job_id))
        return _convert.explanation_from_proto(response)

    def cluster_status(self) -> ClusterStatus:
        """Nodes, GPUs, allocations, agents and the current leader."""
        response: spb.ClusterStatusResponse = self._unary(
            "ClusterStatus", spb.ClusterStatusRequest()
        )
        return _convert.cluster_from_proto(response)

    # ---- logs --------------------------------------------------------------------------------

    def log_chunks(
        self,
        job_id: str,
        rank: int = 0,
        *,
        follow: bool = False,
        tail_lines: int = 0,
        min_generation: int = 0,
        since: datetime | None = None,
    ) -> Iterator[LogChunk]:
        """Log lines of one replica with the generation that wrote them (see `logs`).

        Args:
            job_id: The job (id, unique id prefix or unique name).
            rank: Global rank of the replica.
            follow: Keep streaming new lines until the replica exits.
            tail_lines: Retained lines to send first; 0 means all retained.
            min_generation: Only a replica of at least this generation (NotFoundError while
                none has started): how a follower asks for the next generation.
            since: Only lines that arrived at or after this time.
        """
        if rank < 0 or tail_lines < 0:
            raise InvalidArgumentError(
                "rank and tail_lines must be >= 0",
                None,
                violations=[("rank" if rank < 0 else "tail_lines", "must be >= 0")],
            )
        request = lpb.StreamLogsRequest(
            job_id=job_id,
            rank=rank,
            follow=follow,
            tail_lines=tail_lines,
            min_generation=min_generation,
        )
        if since is not None:
            request.since.FromDatetime(since)
        for response in self._stream("StreamLogs", request):
            yield LogChunk(response.generation, tuple(response.lines))

    def timeline(self, job_id: str) -> pb.JobTimeline:
        """The job's sampled life (GPUs, batch size, throughput, efficiency, goodput, progress).

        Raises:
            NotFoundError: No such job.
        """
        request = spb.GetJobTimelineRequest(job_id=job_id)
        response: spb.GetJobTimelineResponse = self._unary("GetJobTimeline", request)
        return response.timeline

    def logs(
        self, job_id: str, rank: int = 0, *, follow: bool = False, tail_lines: int = 0
    ) -> Iterator[str]:
        """Log lines of one replica, relayed by a scheduler from the node that runs (or ran) it.

        Args:
            job_id: The job.
            rank: Global rank of the replica.
            follow: Keep streaming new lines until the replica exits.
            tail_lines: Retained lines to send first; 0 means all retained.

        Raises:
            NotFoundError: No such job, or no launcher has a replica of that rank.
            UnavailableError: The node is not registered or its launcher does not answer.
        """
        for chunk in self.log_chunks(job_id, rank, follow=follow, tail_lines=tail_lines):
            yield from chunk.lines

    # ---- administration (admin role; WhoAmI and own usage for anyone) ------------------------

    def whoami(self) -> apb.WhoAmIResponse:
        """Who the scheduler takes this client for."""
        response: apb.WhoAmIResponse = self._unary("WhoAmI", apb.WhoAmIRequest(), admin=True)
        return response

    def create_token(
        self,
        user: str,
        *,
        role: str = "user",
        tenant: str = "",
        ttl_s: int = 0,
        description: str = "",
    ) -> apb.CreateTokenResponse:
        """Issue a token; its secret is in the response only."""
        request = apb.CreateTokenRequest(
            user=user, role=role, tenant=tenant, ttl_s=ttl_s, description=description
        )
        response: apb.CreateTokenResponse = self._unary("CreateToken", request, admin=True)
        return response

    def revoke_token(self, token_id: str) -> None:
        """Revoke a token (by id or text)."""
        self._unary("RevokeToken", apb.RevokeTokenRequest(token_id=token_id), admin=True)

    def list_tokens(self, user: str = "") -> list[pb.ApiToken]:
        """Tokens, without secrets."""
        return list(self._unary("ListTokens", apb.ListTokensRequest(user=user), admin=True).tokens)

    def put_tenant(
        self, name: str, *, guarantee_gpus: int = 0, weight: float = 1.0, cap_gpus: int = 0
    ) -> pb.Tenant:
        """Create or replace a tenant."""
        tenant = pb.Tenant(
            name=name, guarantee_gpus=guarantee_gpus, weight=weight, cap_gpus=cap_gpus
        )
        stored: pb.Tenant = self._unary(
            "PutTenant", apb.PutTenantRequest(tenant=tenant), admin=True
        ).tenant
        return stored

    def delete_tenant(self, name: str) -> None:
        """Remove a tenant."""
        self._unary("DeleteTenant", apb.DeleteTenantRequest(name=name), admin=True)

    def list_tenants(self) -> list[pb.Tenant]:
        """Every tenant."""
        return list(self._unary("ListTenants", apb.ListTenantsRequest(), admin=True).tenants)

    def usage(
        self, *, tenant: str = "", user: str = "", since: datetime | None = None
    ) -> list[pb.UsageRecord]:
        """GPU-seconds and goodput-seconds per (tenant, user) since a day."""
        request = apb.GetUsageRequest(tenant=tenant, user=user)
        if since is not None:
            request.since.FromDatetime(since)
        return list(self._unary("GetUsage", request, admin=True).usage)

    def audit(self, limit: int = 100) -> list[pb.AuditRecord]:
        """The newest audit records, newest first."""
        return list(self._unary("ListAudit", apb.ListAuditRequest(limit=limit), admin=True).records)

    # ---- transport ---------------------------------------------------------------------------

    def _open(self, target: str) -> grpc.Channel:
        options: list[tuple[str, Any]] = [("grpc.enable_retries", int(self.retry_attempts > 1))]
        if self.retry_attempts > 1:
            options.append(("grpc.service_config", service_config(self.retry_attempts)))
        if self._credentials is not None:
            return grpc.secure_channel(target, self._credentials, options=options)
        return grpc.insecure_channel(target, options=options)

    def _stub(self, target: str, admin: bool = False) -> Any:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = self._open(target)
        return _admin_stub(channel) if admin else _scheduler_stub(channel)

    def _order(self) -> list[str]:
        """Targets to try: the one that answered last, then the others in the given order."""
        return [self._current, *(t for t in self.targets if t != self._current)]

    def _unary(self, method: str, request: Any, *, admin: bool = False) -> Any:
        return self._failover(
            method,
            lambda stub: getattr(stub, method)(request, timeout=self.timeout_s),
            admin=admin,
        )

    def _failover(self, method: str, call: Callable[[Any], R], *, admin: bool = False) -> R:
        """Run `call` against each target in turn while the answer is UNAVAILABLE."""
        attempts = _Attempts(self._order())
        for target in attempts:
            try:
                result = call(self._stub(target, admin))
            except grpc.RpcError as error:
                failure = self._failure(target, error)
                if not isinstance(failure, UnavailableError) or method not in IDEMPOTENT_RPCS:
                    raise failure from error
                attempts.failed(failure)
                continue
            self._current = target
            return result
        raise attempts.exhausted()

    def _stream(self, method: str, request: Any) -> Iterator[Any]:
        """A server stream that fails over like `_failover` until its first message."""
        attempts = _Attempts(self._order())
        for target in attempts:
            call = getattr(self._stub(target), method)(request)
            received = False
            try:
                for response in call:
                    received = True
                    self._current = target
                    yield response
                return
            except grpc.RpcError as error:
                failure = self._failure(target, error)
                retry = not received and method in IDEMPOTENT_RPCS
                if not (retry and isinstance(failure, UnavailableError)):
                    raise failure from error
                attempts.failed(failure)
            finally:
                call.cancel()
        raise attempts.exhausted()

    def _failure(self, target: str, error: grpc.RpcError) -> PolluxError:
        """The typed error of a failed call: `UnreachableError` if it never reached a server.

        UNAVAILABLE or DEADLINE_EXCEEDED while the target's channel is not connected means no
        scheduler listens there (or the call waited for a connection until its deadline);
        otherwise a server answered and its reason is kept.
        """
        failure = from_rpc_error(error)
        channel = self._channels.get(target)
        if failure.code not in _CONNECT_CODES or channel is None or _connected(channel):
            return failure
        cause = connect_failure_cause(failure.code, failure.message, self.timeout_s)
        return UnreachableError(
            failure.message, failure.code, failure.details, targets=(target,), cause=cause
        )


_CONNECT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _connected(channel: grpc.Channel, wait_s: float = 5.0) -> bool:
    """Whether `channel` is connected (READY) now; True if gRPC does not say within `wait_s`.

    A new subscriber is first told the channel's current state (grpc's connectivity poller
    reports it at once), so this waits for that one report rather than sampling after a delay.
    """
    reports: list[grpc.ChannelConnectivity] = []
    reported = threading.Event()

    def note(state: grpc.ChannelConnectivity) -> None:
        reports.append(state)
        reported.set()

    channel.subscribe(note, try_to_connect=False)
    try:
        reported.wait(wait_s)
    finally:
        channel.unsubscribe(note)
    return not reports or reports[0] == grpc.ChannelConnectivity.READY


class _Attempts:
    """The targets one call tries, each at most once; a leader hint jumps the queue."""

    def __init__(self, targets: Sequence[str]) -> None:
        self.pending = list(targets)
        self.tried: list[str] = []
        self.failures: list[UnavailableError] = []

    def __iter__(self) -> Iterator[str]:
        while self.pending:
            target = self.pending.pop(0)
            if target not in self.tried:
                self.tried.append(target)
                yield target

    def failed(self, failure: UnavailableError) -> None:
        """Record an UNAVAILABLE answer; try the leader it names next, if not tried yet."""
        self.failures.append(failure)
        if failure.leader_address and failure.leader_address not in self.tried:
            self.pending.insert(0, failure.leader_address)

    def exhausted(self) -> UnavailableError:
        """One error for a call no target could serve: the last reason, every target tried."""
        last = self.failures[-1] if self.failures else None
        reason = last.message if last is not None else "no target to try"
        message = f"no Pollux scheduler could serve the request ({', '.join(self.tried)}): {reason}"
        details = last.details if last is not None else ()
        # Only when no target answered at all: then the caller may say "start one".
        if isinstance(last, UnreachableError) and all(
            isinstance(f, UnreachableError) for f in self.failures
        ):
            return UnreachableError(
                message, last.code, details, targets=self.tried, cause=last.cause
            )
        error = UnavailableError(message, details=details)
        # Keep the newest leader hint even if the hinted leader was the one that failed last.
        hints = [f.leader_address for f in self.failures if f.leader_address]
        error.leader_address = hints[-1] if hints else None
        return error


def _scheduler_stub(channel: grpc.Channel) -> Any:
    # The generated stubs are untyped; the methods' request and reply types are the pb2 ones.
    return scheduler_service_pb2_grpc.SchedulerServiceStub(channel)


def _admin_stub(channel: grpc.Channel) -> Any:
    return admin_service_pb2_grpc.AdminServiceStub(channel)


def _state_numbers(states: Sequence[str]) -> list[int]:
    numbers: list[int] = []
    bad: list[tuple[str, str]] = []
    for name in states:
        try:
            numbers.append(_convert.state_number(name))
        except KeyError:
            bad.append(("states", f"unknown job state {name!r}"))
    if bad:
        raise InvalidArgumentError(
            f"unknown job state; use one of {', '.join(JOB_STATES)}", None, violations=bad
        )
    return numbers
