"""Typed service errors and their one mapping to gRPC status codes.

Handlers validate the whole request first, collecting every problem in `Violations`, and raise
`InvalidArgument` before touching etcd, so a bad request changes nothing. `status_of` is the one
table from typed errors (ours and the store's) to status codes, with a message that says what to
fix; INVALID_ARGUMENT also carries a `google.rpc.BadRequest` detail naming each field. Handlers
never map errors themselves: `pollux.service.rpc.RpcObserver` applies the table to whatever
escapes a handler of any service.
"""

from __future__ import annotations

from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from pollux.service.store import (
    Conflict,
    FenceLost,
    StoreError,
    StoreFull,
    StoreUnavailable,
    ValueTooLarge,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")


MAX_MESSAGE_CHARS = 1024
"""A status message is cut to this length: it travels in a trailer (8 KiB by default)."""
MAX_VIOLATIONS = 12
"""At most this many field violations are detailed (the message says how many more)."""
MAX_FIELD_CHARS = 100
MAX_PROBLEM_CHARS = 200


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ServiceError(Exception):
    """An error to return to the client with a status code."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ServiceError):
    """The request is malformed; `violations` lists (field, problem) pairs."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(
        self, violations: list[tuple[str, str]], headline: str = "invalid request"
    ) -> None:
        text = "; ".join(f"{f}: {p}" for f, p in violations)
        super().__init__(f"{headline}: {text}")
        self.violations = violations


class NotFound(ServiceError):
    """The named object does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    """The object exists but is in the wrong state for the request."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(ServiceError):
    """A different object already exists under the given key."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Unavailable(ServiceError):
    """Try again later (or elsewhere)."""

    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(ServiceError):
    """The caller presented no credential, or one that is wrong, revoked or expired."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    """The caller is known but may not do this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(ServiceError):
    """The caller is over one of its limits (streams, pending jobs, submit rate).

    The message names the limit, its value and the setting that configures it; where the
    server knows when a retry will pass (a rate limit), `retry_after_s` goes to the client as
    a ``google.rpc.RetryInfo`` detail.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Violations:
    """Collects every problem of a request before any is reported."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, field: str, problem: str) -> None:
        """Record that `field` is wrong and how to fix it."""
        self.items.append((field, problem))

    def check(self, ok: bool, field: str, problem: str) -> None:
        """Record a problem unless `ok`."""
        if not ok:
            self.add(field, problem)

    def raise_if_any(self) -> None:
        """Raise `InvalidArgument` with every recorded problem."""
        if self.items:
            raise InvalidArgument(list(self.items))


def status_of(error: Exception) -> tuple[grpc.StatusCode, str, list[Any]]:
    """The status code, message and `google.rpc` details a failed RPC returns for `error`.

    A lost fence is UNAVAILABLE (retry: another replica leads now), a lost compare ABORTED
    (re-read and retry), a write over the store's size bounds or into a full etcd
    RESOURCE_EXHAUSTED (retrying the same write cannot help until something changes); anything
    untyped is INTERNAL, named but never hidden. The message and details are bounded whatever
    the error holds, so echoing user input can never exceed gRPC's metadata limit.
    """
    code, message, details = _status_of(error)
    return code, _cut(message, MAX_MESSAGE_CHARS), details


def _status_of(error: Exception) -> tuple[grpc.StatusCode, str, list[Any]]:
    if isinstance(error, InvalidArgument):
        violations = error.violations[:MAX_VIOLATIONS]
        detail = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=_cut(f, MAX_FIELD_CHARS), description=_cut(p, MAX_PROBLEM_CHARS)
                )
                for f, p in violations
            ]
        )
        text = "; ".join(
            f"{_cut(f, MAX_FIELD_CHARS)}: {_cut(p, MAX_PROBLEM_CHARS)}" for f, p in violations
        )
        more = len(error.violations) - len(violations)
        suffix = f" (and {more} more)" if more else ""
        return error.code, f"invalid request: {text}{suffix}", [detail]
    if isinstance(error, ResourceExhausted) and error.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(error.retry_after_s * 1e9))
        return error.code, error.message, [error_details_pb2.RetryInfo(retry_delay=delay)]
    if isinstance(error, ServiceError):
        return error.code, error.message, []
    if isinstance(error, StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE, f"cluster state store unavailable: {error}", []
    if isinstance(error, FenceLost):
        return grpc.StatusCode.UNAVAILABLE, "this replica lost leadership; retry", []
    if isinstance(error, Conflict):
        return grpc.StatusCode.ABORTED, f"{error}", []
    if isinstance(error, ValueTooLarge):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"cluster state store refused: {error}", []
    if isinstance(error, StoreFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error), []
    if isinstance(error, StoreError):
        return grpc.StatusCode.INTERNAL, f"store error: {error}", []
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}", []


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: Exception) -> None:
    """End the RPC with the status of `error`."""
    code, message, details = status_of(error)
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    status = status_pb2.Status(code=code_pb2.Code.Value(code.name), message=message, details=packed)
    await context.abort_with_status(rpc_status.to_status(status))
