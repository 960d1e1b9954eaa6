"""The one RPC wrapper of every service: status mapping, one log line and one histogram per call.

`RpcObserver` is a server interceptor every `ServiceHost` installs, so servicers stay thin
adapters that raise typed errors (pollux.service.errors) and never touch status codes, timers
or logging. For each call of a `pollux.*` service it binds ``rpc`` and the request's
``job_id`` / ``node_id`` in the log context; maps an escaping exception to a status with
`errors.status_of` (the only table), and an undecodable request to INVALID_ARGUMENT; emits one
canonical ``rpc`` line (method, code, duration, what the handler `annotate`d; info for
outcomes the caller caused, else warning); observes ``pollux_rpc_seconds{service, method,
code}``; and admits a server stream through the host's `StreamGate` (pollux.service.streams),
re-proving its caller's credential every `STREAM_RECHECK_S`, so a revoked token ends its
streams. Health checks and reflection pass unobserved: frequent probes carry no work.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc
import prometheus_client
import structlog

from pollux.service import auth
from pollux.service.audit import AuditLog
from pollux.service.errors import InvalidArgument, Unauthenticated, abort, status_of
from pollux.service.streams import StreamGate

log = structlog.get_logger(__name__)

RPC_SECONDS = prometheus_client.Histogram(
    "pollux_rpc_seconds",
    "Server-side RPC latency (streams: their lifetime), by service, method and status code.",
    ["service", "method", "code"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
)

CALLER_CODES = frozenset(
    {
        "OK",
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "FAILED_PRECONDITION",
        "CANCELLED",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
    }
)
"""Outcomes the caller caused: logged at info. Anything else is the service's problem."""

STREAM_RECHECK_S = 0.5
"""How often an open stream's credential is proved again."""
STREAM_CREDENTIAL_AGE_S = 1.5
"""Oldest token record a re-check may trust (a token is cached up to 2 s): a revoked or
expired token ends its open streams within this plus `STREAM_RECHECK_S`, 2 s."""

MAX_ID_CHARS = 64
"""Request ids bound into the log context are cut to this length (input is not yet validated)."""

_line: ContextVar[dict[str, Any] | None] = ContextVar("pollux_rpc_line", default=None)


def annotate(**fields: Any) -> None:
    """Add fields to the current RPC's canonical log line (no-op outside an RPC)."""
    line = _line.get()
    if line is not None:
        line.update(fields)


class _Undecodable:
    """What a request that failed to decode becomes, so the call can answer INVALID_ARGUMENT."""

    def __init__(self, kind: str, error: Exception) -> None:
        self.problem = f"not a valid {kind} message ({type(error).__name__})"


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    kind = getattr(getattr(deserializer, "__self__", None), "__name__", "request")

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:  # DecodeError, or whatever the parser raises
            return _Undecodable(kind, error)

    return parse


def _check_decoded(request: Any) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument([("request", request.problem)])


def _ids(request: Any) -> dict[str, str]:
    ids = {}
    for name in ("job_id", "node_id"):
        value = getattr(request, name, None)
        if isinstance(value, str) and value:
            ids[name] = value[:MAX_ID_CHARS]
    return ids


def _target(request: Any) -> str:
    """What an audited call acts on, as its request names it."""
    for name in ("job_id", "token_id", "user", "name"):
        value = getattr(request, name, None)
        if isinstance(value, str) and value:
            return value[:MAX_ID_CHARS]
    tenant = getattr(request, "tenant", None)
    return str(getattr(tenant, "name", ""))[:MAX_ID_CHARS]


class _Call:
    """The bookkeeping of one observed call."""

    def __init__(
        self,
        service: str,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        audit: AuditLog | None,
    ) -> None:
        self.service = service
        self.method = method
        self.ids = _ids(request)
        self.line: dict[str, Any] = {}
        self.code = "OK"
        self.finished = False
        self.started = time.perf_counter()
        self.principal = auth.ANONYMOUS
        self.audit = audit if audit is not None and method in audit.actions else None
        self.target = _target(request) if self.audit is not None else ""
        self.peer = str(context.peer() or "") if self.audit is not None else ""

    def answered(self, response: Any) -> None:
        """Note what a successful call created (a submitted job's id) for the audit."""
        job_id = getattr(getattr(response, "job", None), "id", None)
        if self.audit is not None and not self.target and isinstance(job_id, str):
            self.target = job_id

    async def fail(self, context: grpc.aio.ServicerContext[Any, Any], error: BaseException) -> None:
        """Record the outcome of an exception and end the call with its status."""
        if isinstance(error, asyncio.CancelledError):
            self.code = "CANCELLED"
            return
        if isinstance(error, grpc.aio.AbortError):
            code = context.code()
            self.code = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            return
        if not isinstance(error, Exception):
            self.code = "CANCELLED"
            return
        code, message, _ = status_of(error)
        self.code = code.name
        self.line["error"] = message
        if code == grpc.StatusCode.INTERNAL:
            log.error("rpc_internal_error", rpc=self.method, exc_info=error, **self.ids)
        # Recorded before the status goes out: the caller may look at metrics or logs as soon
        # as it has its answer.
        self.finish()
        await abort(context, error)

    def finish(self) -> None:
        """Observe the histogram and emit the canonical line (once)."""
        if self.finished:
            return
        self.finished = True
        seconds = time.perf_counter() - self.started
        RPC_SECONDS.labels(self.service, self.method, self.code).observe(seconds)
        if self.audit is not None:
            self.audit.record(
                principal=self.principal.name,
                role=self.principal.role,
                action=self.method,
                target=self.target,
                peer=self.peer,
                outcome=self.code,
                detail=str(self.line.get("error", "")),
            )
        emit = log.info if self.code in CALLER_CODES else log.warning
        emit(
            "rpc",
            service=self.service,
            code=self.code,
            duration_ms=round(seconds * 1000, 2),
            **self.line,
        )


Authenticate = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[auth.Principal]]
Recheck = Callable[[], Awaitable[None]]


async def _nobody(context: grpc.aio.ServicerContext[Any, Any]) -> auth.Principal:
    return auth.LOCAL


def _recheck(
    authenticator: auth.Authenticator | None,
    context: grpc.aio.ServicerContext[Any, Any],
    admitted: auth.Principal,
) -> Recheck | None:
    """Proves a stream's caller again, as who it was admitted as (None: nothing to prove)."""
    if authenticator is None or admitted is auth.LOCAL:
        return None

    async def again() -> None:
        now = await authenticator.authenticate(context, max_age_s=STREAM_CREDENTIAL_AGE_S)
        if (now.name, now.role) != (admitted.name, admitted.role):
            raise Unauthenticated(
                f"the credential of this stream now proves {now.name} ({now.role}), not "
                f"{admitted.name} ({admitted.role}): open the stream again"
            )

    return again


async def _rechecked(items: AsyncIterator[Any], recheck: Recheck | None) -> AsyncIterator[Any]:
    """`items`, with `recheck` awaited every `STREAM_RECHECK_S`, also while none comes.

    A failed re-check (it raises) ends the stream with its error; the producer is cancelled.
    """
    if recheck is None:
        async for item in items:
            yield item
        return
    loop = asyncio.get_running_loop()
    due = loop.time() + STREAM_RECHECK_S
    waiting: asyncio.Future[Any] | None = None
    try:
        while True:
            if waiting is None:
                waiting = asyncio.ensure_future(anext(items))
            done, _ = await asyncio.wait({waiting}, timeout=max(0.0, due - loop.time()))
            if loop.time() >= due:
                await recheck()
                due = loop.time() + STREAM_RECHECK_S
            if not done:
                continue
            finished, waiting = waiting, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if waiting is not None:
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting
        closing = getattr(items, "aclose", None)
        if closing is not None:
            with contextlib.suppress(Exception):
                await closing()


class RpcObserver(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Observes every call of the `pollux.*` services of one process (see the module doc).

    Args:
        authenticator: Proves each caller before its handler runs (`pollux.service.auth`);
            None on a service without TLS, whose every caller is `auth.LOCAL`.
    """

    def __init__(
        self,
        authenticator: auth.Authenticator | None = None,
        audit: AuditLog | None = None,
        streams: StreamGate | None = None,
    ) -> None:
        self._authenticator = authenticator
        self._authenticate: Authenticate = (
            authenticator.authenticate if authenticator is not None else _nobody
        )
        self._audit = audit
        self._streams = streams

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The method's handler, wrapped when it belongs to a `pollux.*` service."""
        handler = await continuation(handler_call_details)
        full = str(handler_call_details.method)
        service, _, method = full.lstrip("/").partition("/")
        if handler is None or not service.startswith("pollux."):
            return handler
        short = service.rpartition(".")[2]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(short, method, handler.unary_unary, self._authenticate, self._audit),
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _stream(
                    short,
                    method,
                    handler.unary_stream,
                    self._authenticate,
                    self._audit,
                    self._authenticator,
                    self._streams,
                ),
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler


async def _admit(
    call: _Call,
    request: Any,
    context: grpc.aio.ServicerContext[Any, Any],
    authenticate: Authenticate,
) -> Any:
    """Authenticate the caller, then check the request decoded; returns the `auth.bind` token.

    Authentication comes first, so nothing about the request is said to an unknown caller.
    """
    principal = await authenticate(context)
    call.principal = principal
    auth.require_own_job(principal, getattr(request, "job_id", "") or "", call.method)
    if principal is not auth.LOCAL:
        call.line["principal"] = principal.name
    bound = auth.bind(principal)
    _check_decoded(request)
    return bound


def _unary(
    service: str,
    method: str,
    inner: Callable[..., Awaitable[Any]],
    authenticate: Authenticate,
    audit: AuditLog | None,
) -> Callable[..., Awaitable[Any]]:
    async def observed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        call = _Call(service, method, request, context, audit)
        token = _line.set(call.line)
        bound = None
        try:
            with structlog.contextvars.bound_contextvars(rpc=method, **call.ids):
                try:
                    bound = await _admit(call, request, context, authenticate)
                    response = await inner(request, context)
                    call.answered(response)
                    return response
                except BaseException as error:
                    await call.fail(context, error)
                    raise
                finally:
                    call.finish()
        finally:
            if bound is not None:
                auth.unbind(bound)
            _line.reset(token)

    return observed


def _stream(
    service: str,
    method: str,
    inner: Callable[..., Any],
    authenticate: Authenticate,
    audit: AuditLog | None,
    authenticator: auth.Authenticator | None = None,
    streams: StreamGate | None = None,
) -> Callable[..., AsyncIterator[Any]]:
    async def observed(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        call = _Call(service, method, request, context, audit)
        token = _line.set(call.line)
        sent = 0
        bound = None
        try:
            with structlog.contextvars.bound_contextvars(rpc=method, **call.ids):
                try:
                    bound = await _admit(call, request, context, authenticate)
                    with (
                        streams.admit(call.principal, method)
                        if streams is not None
                        else contextlib.nullcontext()
                    ):
                        if inspect.isasyncgenfunction(inner):
                            recheck = _recheck(authenticator, context, call.principal)
                            async for item in _rechecked(inner(request, context), recheck):
                                sent += 1
                                yield item
                        else:  # a coroutine that writes with context.write
                            await inner(request, context)
                except BaseException as error:
                    call.line["messages"] = sent
                    await call.fail(context, error)
                    raise
                finally:
                    call.line.setdefault("messages", sent)
                    call.finish()
        finally:
            # A stream's body may resume in another context than the one it started in.
            if bound is not None:
                auth.unbind(bound)
            with contextlib.suppress(ValueError):
                _line.reset(token)

    return observed
