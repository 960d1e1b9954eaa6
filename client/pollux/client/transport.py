"""How the client reaches a scheduler: channels, retries and failover between replicas.

Both only for RPCs the API documents as safe to retry (all of SchedulerService's unary RPCs;
SubmitJob because it carries a `request_id`): each channel carries a gRPC service config with
a retry policy on UNAVAILABLE, so gRPC itself retries a transient failure with backoff; a
server that stays UNAVAILABLE (down, lost leadership, etcd unreachable) makes the call move on
to the next target, or first to the leader the error named, and the client keeps using
whichever answered. Streams fail over only before their first message, so nothing is seen
twice. Every `grpc.RpcError` leaves as a `PolluxError` subclass (errors.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self, TypeVar

import grpc

from pollux.client.config import parse_servers
from pollux.client.errors import (
    PolluxError,
    UnavailableError,
    UnreachableError,
    connect_failure_cause,
    from_rpc_error,
)
from pollux.v1 import admin_service_pb2_grpc, scheduler_service_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:7070"

RESOLVED_NOTE_KEY = "pollux-resolved-job"
"""Response metadata: which job a name shared by several jobs meant, in words (the server's
`pollux.scheduler.api.base.RESOLVED_NOTE_KEY`)."""

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


def parse_targets(targets: str | Sequence[str]) -> list[str]:
    """Split ``"h1:p1,h2:p2"`` (or a list) into distinct host:port targets, in order.

    Raises:
        ServerAddressError: No target given, or one without a port or with a bad one
            (`pollux.client.config.parse_servers`; a ValueError).
    """
    return list(parse_servers(targets if isinstance(targets, str) else ",".join(targets)))


class Transport:
    """Channels to the Pollux schedulers and the calls over them, with failover.

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
        self.on_notice: Callable[[str], None] | None = None
        """Called with the server's notes for the user: which job a name shared by several
        jobs meant (`pollux-cli` prints them on stderr)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every channel this client opened."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()

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
        def call(stub: Any) -> Any:
            response, done = getattr(stub, method).with_call(request, timeout=self.timeout_s)
            self._notice(done)
            return response

        return self._failover(method, call, admin=admin)

    def _notice(self, call: Any) -> None:
        """Pass the server's note on which job a shared name meant to `on_notice`."""
        if self.on_notice is None:
            return
        for key, value in call.initial_metadata() or ():
            if key == RESOLVED_NOTE_KEY and isinstance(value, str):
                self.on_notice(value)

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
                    if not received:
                        self._notice(call)
                    received = True
                    self._current = target
                    yield response
                if not received:
                    self._notice(call)
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
