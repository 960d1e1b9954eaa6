"""Typed exceptions of the Pollux client, mapped from gRPC status codes by one table.

Servers report every failure as a gRPC status; users of the client should not have
to know that. `from_rpc_error` turns a `grpc.RpcError` into the `PolluxError` subclass of its
code (the `_BY_CODE` table, after aetcd's `_EXCEPTIONS_BY_CODE`) and decodes the rich status
details the server attached: `google.rpc.BadRequest` field violations become
`InvalidArgumentError.violations`, and a `google.rpc.ErrorInfo` with a `leader_address` entry
becomes `UnavailableError.leader_address`, so callers can fix a request or redirect without
touching protobuf.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

# Key of a google.rpc.ErrorInfo metadata entry naming the leading scheduler's address.
LEADER_ADDRESS_KEY = "leader_address"

_DETAIL_TYPES = (
    error_details_pb2.BadRequest,
    error_details_pb2.ErrorInfo,
    error_details_pb2.RetryInfo,
    error_details_pb2.ResourceInfo,
    error_details_pb2.PreconditionFailure,
    error_details_pb2.DebugInfo,
)


class FieldViolation(NamedTuple):
    """One problem with one field of a request."""

    field: str
    """Dotted path of the field, e.g. ``spec.batch.initial_batch_size``."""
    description: str
    """What is wrong and how to fix it."""


class PolluxError(Exception):
    """Root of every error the Pollux client raises.

    Args:
        message: The server's (or the client's) explanation, meant for people.
        code: The gRPC status code it came with; None for errors raised by the client itself.
        details: Decoded ``google.rpc`` detail messages the server attached (BadRequest,
            ErrorInfo, ...); undecodable details are left out.
    """

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        details: Sequence[Any] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = tuple(details)

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(PolluxError):
    """The request was rejected as malformed; nothing was changed.

    Attributes:
        violations: Every offending field with what to fix, from the server's
            ``google.rpc.BadRequest`` detail (or the client's own checks).
    """

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.INVALID_ARGUMENT,
        details: Sequence[Any] = (),
        violations: Iterable[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message, code, details)
        found = [
            FieldViolation(v.field, v.description)
            for d in self.details
            if isinstance(d, error_details_pb2.BadRequest)
            for v in d.field_violations
        ]
        found.extend(FieldViolation(f, d) for f, d in violations)
        self.violations: tuple[FieldViolation, ...] = tuple(found)


class JobSpecError(InvalidArgumentError, ValueError):
    """A job file or mapping could not be turned into a `JobSpec` (raised before any RPC).

    Its violations name the offending keys, e.g. ``("max_batch_size", "expected an integer")``.
    """

    def __init__(self, message: str, violations: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message, None, (), violations)


class NotFoundError(PolluxError):
    """The named job (or replica) does not exist."""


class AlreadyExistsError(PolluxError):
    """A different object exists under the same key (e.g. a request_id reused for another spec)."""


class FailedPreconditionError(PolluxError):
    """The object is in the wrong state for the request (e.g. deleting a running job)."""


class UnavailableError(PolluxError):
    """No server could serve the request now; retrying later, or at the leader, may succeed.

    Attributes:
        leader_address: host:port of the leading scheduler when the server named it, else None.
    """

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE,
        details: Sequence[Any] = (),
    ) -> None:
        super().__init__(message, code, details)
        self.leader_address: str | None = next(
            (
                d.metadata[LEADER_ADDRESS_KEY]
                for d in self.details
                if isinstance(d, error_details_pb2.ErrorInfo) and d.metadata.get(LEADER_ADDRESS_KEY)
            ),
            None,
        )


class ResourceExhaustedError(PolluxError):
    """The caller is over one of its limits (open streams, PENDING jobs, submit rate).

    Attributes:
        retry_after_s: When a retry will pass, from the server's ``google.rpc.RetryInfo``
            (a rate limit); None when it cannot say (a queue limit: wait for jobs to start).
    """

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.RESOURCE_EXHAUSTED,
        details: Sequence[Any] = (),
    ) -> None:
        super().__init__(message, code, details)
        self.retry_after_s: float | None = next(
            (
                d.retry_delay.ToNanoseconds() / 1e9
                for d in self.details
                if isinstance(d, error_details_pb2.RetryInfo) and d.HasField("retry_delay")
            ),
            None,
        )


class UnreachableError(UnavailableError):
    """No scheduler answered at all: nothing listens at the addresses, or they do not resolve.

    Raised instead of a plain UNAVAILABLE or DEADLINE_EXCEEDED when the call's channel never
    got connected, so that a caller (the CLI) can say "start one, or fix the address" rather
    than relay a server's reason; an UNAVAILABLE that a server sent (no leader, a launcher not
    answering) stays an `UnavailableError` with its own message.

    Attributes:
        targets: The addresses tried, in order.
        cause: Short reason in words ("connection refused"), or "" when gRPC gave none known.
    """

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE,
        details: Sequence[Any] = (),
        *,
        targets: Sequence[str] = (),
        cause: str = "",
    ) -> None:
        super().__init__(message, code, details)
        self.targets = tuple(targets)
        self.cause = cause


def connect_failure_cause(code: grpc.StatusCode | None, message: str, timeout_s: float) -> str:
    """A few words on why a channel could not connect, from gRPC's status (or "")."""
    text = message.lower()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout_s:g} s"
    if "connection refused" in text:
        return "connection refused"
    if "resolv" in text or "dns" in text or "domain name" in text:
        return "the host name does not resolve"
    if "timed out" in text or "timeout" in text:
        return "connecting timed out"
    return ""


class DeadlineExceededError(PolluxError):
    """The call did not finish within its timeout; it may or may not have taken effect."""


class AbortedError(PolluxError):
    """A concurrent change won a conflicting write; retrying the request is safe."""


class UnauthenticatedError(PolluxError):
    """The request carried no valid credentials."""


class PermissionDeniedError(PolluxError):
    """The caller may not do this."""


class UnimplementedError(PolluxError):
    """The server does not implement this RPC (client and server versions differ)."""


class InternalError(PolluxError):
    """The server failed unexpectedly; its logs have the cause."""


class CancelledError(PolluxError):
    """The call was cancelled (usually by this client)."""


_BY_CODE: dict[grpc.StatusCode, type[PolluxError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
    grpc.StatusCode.DATA_LOSS: InternalError,
    grpc.StatusCode.CANCELLED: CancelledError,
}


def _unpack_details(error: grpc.RpcError) -> list[Any]:
    """Decode the ``google.rpc.Status`` details of a failed call, if the server sent any."""
    try:
        status = rpc_status.from_call(error)
    except (ValueError, AttributeError):
        # A mismatch between the status trailer and the call's code, or an error object that is
        # not a call: the code and message still say enough.
        return []
    if status is None:
        return []
    out: list[Any] = []
    for packed in status.details:
        for kind in _DETAIL_TYPES:
            if packed.Is(kind.DESCRIPTOR):
                message = kind()
                packed.Unpack(message)
                out.append(message)
                break
    return out


def from_rpc_error(error: grpc.RpcError) -> PolluxError:
    """The typed exception for a failed gRPC call (the one place codes become classes)."""
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code: grpc.StatusCode = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    message = (details_fn() if callable(details_fn) else None) or code.name.lower()
    kind = _BY_CODE.get(code, PolluxError)
    return kind(message, code, _unpack_details(error))
