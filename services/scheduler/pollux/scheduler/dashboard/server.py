"""`Dashboard`: the read-only web dashboard a scheduler replica serves (`dashboard_listen`).

An HTTP/1.1 server on the replica's own asyncio loop (`asyncio.start_server`, stdlib only;
`protocol` parses, `routes` maps paths) serving a static single page and JSON under
``/api/v1/``. The JSON comes from the replica's `SchedulerServicer`, called in-process, so a
page sees exactly what the gRPC API answers, checked by the same code. With TLS it serves HTTPS
with the replica's certificate and every ``/api/`` request carries ``Authorization: Bearer
<API token>``, verified by the replica's `Authenticator`; without TLS every caller is
`auth.LOCAL` and a loopback dashboard answers only a loopback Host (no DNS rebinding). The
servicer's typed errors map through `errors.status_of` to an HTTP status (`HTTP_STATUS`) and
``{"error": message, "code": "NOT_FOUND"}``; every answer carries a strict
Content-Security-Policy, ``nosniff``, no framing, no referrer, and API answers ``no-store``.
The static files hold no data and are public (docs/architecture.md §5, "Dashboard").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import grpc
import prometheus_client
import structlog

from pollux.scheduler.dashboard import protocol, routes, views
from pollux.scheduler.dashboard.protocol import HttpError, Request, Response
from pollux.scheduler.dashboard.sampler import DEFAULT_POINTS, UtilisationRing, sample_forever
from pollux.scheduler.servicer import Context, SchedulerServicer
from pollux.service import auth
from pollux.service.config import ConfigError
from pollux.service.errors import InvalidArgument, NotFound, status_of
from pollux.service.store import cancel_and_wait
from pollux.service.tls import TlsFiles, is_loopback
from pollux.v1 import scheduler_service_pb2 as spb

log = structlog.get_logger(__name__)

REQUESTS = prometheus_client.Counter(
    "pollux_dashboard_requests",
    "Dashboard HTTP requests, by endpoint (static for the page's files) and status code.",
    ["endpoint", "code"],
)

MAX_CONNECTIONS = 128
"""Connections served at once; more are answered 503 and closed."""
READ_TIMEOUT_S = 10.0
"""A request head must arrive within this long after the connection opens."""
HANDLER_TIMEOUT_S = 30.0
"""An API answer taking longer is 504."""
WRITE_TIMEOUT_S = 30.0
HANDSHAKE_TIMEOUT_S = 10.0

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""The HTTP status of each gRPC status an RPC can end with; anything else is 500."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; object-src 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
"""Sent with every answer."""
API_HEADERS = {"Cache-Control": "no-store"}
STATIC_HEADERS = {"Cache-Control": "no-cache"}
JSON = "application/json"


def json_response(status: int, data: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer of the API."""
    body = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    return Response(status, body, JSON, {**API_HEADERS, **(headers or {})})


def error_response(status: int, message: str, code: str = "", *, api: bool) -> Response:
    """An error: ``{"error": ...}`` under /api/, plain text elsewhere."""
    headers = {"Allow": "GET, HEAD"} if status == 405 else {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="pollux"'
    if api:
        data = {"error": message, **({"code": code} if code else {})}
        return json_response(status, data, headers)
    return Response(status, (message + "\n").encode(), headers={**STATIC_HEADERS, **headers})


def loopback_host(host_header: str) -> bool:
    """Whether a Host header names this machine by a loopback name or address."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rpartition(":")[0]
    return host == "localhost" or is_loopback(f"{host}:0")


class _HttpCall:
    """What the authenticator and the servicer read of a call, for an HTTP request.

    The authenticator reads the bearer credential from the metadata (the ``Authorization``
    header) and finds no client certificate; the read-only RPCs set nothing on it.
    """

    def __init__(self, request: Request, peer: str) -> None:
        self._authorization = request.headers.get("authorization")
        self._peer = peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", self._authorization),) if self._authorization else ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: object) -> None:
        return None

    async def send_initial_metadata(self, metadata: object) -> None:
        return None  # which job a shared name meant: the page shows the job itself


class _Certificates:
    """The HTTPS context, swapped for one of renewed files at the next handshake."""

    def __init__(self, tls: TlsFiles) -> None:
        self.tls = tls
        self.generation = tls.generation
        self.served = self._context()
        """The context handshakes start with; its callback may hand them a newer one."""
        self.served.sni_callback = self._handshake
        self.current = self.served

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _, cert, key = self.tls.paths
        context.load_cert_chain(cert, key)
        return context

    def _handshake(self, connection: Any, server_name: str | None, context: Any) -> None:
        if self.tls.changed(self.generation):
            generation = self.tls.generation
            try:
                self.current = self._context()
                self.generation = generation
                log.info("dashboard_tls_reloaded", generation=generation)
            except (OSError, ssl.SSLError) as error:
                log.warning("dashboard_tls_reload_failed", error=str(error))
        connection.context = self.current


class Dashboard:
    """The dashboard of one scheduler replica (see the module doc).

    Args:
        servicer: The replica's SchedulerService implementation (called in-process).
        listen: host:port to bind (port 0: a free one).
        tls: The replica's TLS files: HTTPS and token authentication; None: plaintext, LOCAL.
        authenticator: Proves callers (required with `tls`): the replica's own.
        insecure: Allow plaintext on a non-loopback address (as `tls.insecure`).
        sample_interval_s: Seconds between utilisation samples.
        samples: Utilisation samples kept (the ring's capacity).
        static_root: The page's files.

    Raises:
        ConfigError: Plaintext on a non-loopback address without `insecure`.
    """

    def __init__(
        self,
        servicer: SchedulerServicer,
        listen: str,
        *,
        tls: TlsFiles | None = None,
        authenticator: auth.Authenticator | None = None,
        insecure: bool = False,
        sample_interval_s: float = 10.0,
        samples: int = 8640,
        static_root: Path = routes.STATIC_ROOT,
    ) -> None:
        if tls is None and not is_loopback(listen) and not insecure:
            raise ConfigError(
                [
                    f"dashboard_listen: {listen} is reachable from other machines, and this "
                    "scheduler has no TLS: set tls.ca_file, tls.cert_file and tls.key_file, "
                    "bind 127.0.0.1, or pass --insecure to serve it without authentication"
                ]
            )
        if tls is not None and authenticator is None:
            raise ValueError("a TLS dashboard authenticates its callers: pass an authenticator")
        self.servicer = servicer
        self.listen = listen
        self.tls = tls
        self.insecure = insecure
        self._authenticator = authenticator if tls is not None else None
        self._loopback_only = tls is None and is_loopback(listen)
        self.sample_interval_s = sample_interval_s
        self.ring = UtilisationRing(samples)
        self._files = {
            path: (file.read_bytes(), routes.content_type(file.name))
            for path, file in routes.static_files(static_root).items()
        }
        self._server: asyncio.Server | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """The page's address (the hostname for a wildcard bind)."""
        host = self.listen.rpartition(":")[0]
        if host in ("", "0.0.0.0", "[::]", "::"):
            host = socket.gethostname()
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}/"

    async def start(self) -> None:
        """Bind, serve, and start sampling utilisation."""
        host, _, port = self.listen.rpartition(":")
        context = _Certificates(self.tls).served if self.tls is not None else None
        if self.tls is None and not self._loopback_only:
            log.warning(
                "dashboard_without_tls",
                listen=self.listen,
                detail="plaintext, no authentication: anyone who reaches it sees every job",
            )
        self._server = await asyncio.start_server(
            self._connection,
            host.strip("[]") or None,
            int(port),
            ssl=context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if context is not None else None,
            limit=protocol.MAX_HEADER_BYTES,
            reuse_address=True,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._sampler = asyncio.create_task(
            sample_forever(self.ring, self._cluster_status, self.sample_interval_s),
            name="dashboard-sampler",
        )
        log.info("dashboard_started", url=self.url, tls=self.tls is not None)

    async def stop(self) -> None:
        """Stop listening, end open connections and sampling (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._sampler is not None:
            await cancel_and_wait(self._sampler)
            self._sampler = None
        for task in list(self._connections):
            await cancel_and_wait(task)
        if server is not None:
            await server.wait_closed()
            log.info("dashboard_stopped")

    async def _cluster_status(self) -> spb.ClusterStatusResponse:
        call = cast(Context, _HttpCall(Request("GET", "/", "/"), "dashboard-sampler"))
        bound = auth.bind(auth.LOCAL)  # the replica itself samples, as LOCAL
        try:
            return await self.servicer.ClusterStatus(spb.ClusterStatusRequest(), call)
        finally:
            auth.unbind(bound)

    # -- connections -------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._connections) >= MAX_CONNECTIONS or task is None:
            with contextlib.suppress(ConnectionError, TimeoutError, ssl.SSLError):
                await self._send(writer, error_response(503, "busy", api=False), head=False)
            writer.close()
            return
        self._connections.add(task)
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the peer went away or stalled: nothing to answer
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started = time.perf_counter()
        endpoint = "none"
        try:
            request = await asyncio.wait_for(protocol.read_request(reader), READ_TIMEOUT_S)
        except HttpError as error:
            response = error_response(error.status, error.message, api=False)
            REQUESTS.labels(endpoint, str(response.status)).inc()
            await self._send(writer, response, head=False)
            return
        if request is None:
            return
        peer = writer.get_extra_info("peername")
        try:
            found = routes.route(request.path, self._files)
        except routes.NoRoute as missing:
            response = error_response(404, str(missing), "NOT_FOUND", api=missing.api)
        else:
            if found.endpoint is None:
                endpoint = "static"
                body, kind = self._files[found.static]
                response = Response(200, body, kind, dict(STATIC_HEADERS))
            else:
                endpoint = found.endpoint.value
                response = await self._api(found, request, str(peer))
        REQUESTS.labels(endpoint, str(response.status)).inc()
        log.debug(
            "dashboard_request",
            method=request.method,
            path=request.path[:200],
            status=response.status,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        await self._send(writer, response, head=request.method == "HEAD")

    async def _send(self, writer: asyncio.StreamWriter, response: Response, *, head: bool) -> None:
        writer.write(protocol.encode(response, head=head, extra=SECURITY_HEADERS))
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)

    # -- the API -----------------------------------------------------------------------------

    async def _api(self, found: routes.Route, request: Request, peer: str) -> Response:
        if self._loopback_only and not loopback_host(request.headers.get("host", "localhost")):
            return error_response(
                403,
                "this dashboard has no TLS and answers only to a loopback host name "
                "(localhost, 127.0.0.1, [::1])",
                "PERMISSION_DENIED",
                api=True,
            )
        call = cast(Context, _HttpCall(request, peer))
        try:
            principal = (
                await self._authenticator.authenticate(call)
                if self._authenticator is not None
                else auth.LOCAL
            )
            bound = auth.bind(principal)
            try:
                data = await asyncio.wait_for(
                    self._endpoint(found, request.query, call), HANDLER_TIMEOUT_S
                )
            finally:
                auth.unbind(bound)
        except TimeoutError:
            return error_response(504, "the scheduler did not answer in time", api=True)
        except Exception as error:
            code, message, _ = status_of(error)
            status = HTTP_STATUS.get(code, 500)
            if status == 500:
                log.error("dashboard_internal_error", path=request.path[:200], exc_info=error)
            return error_response(status, message, code.name, api=True)
        return json_response(200, data)

    async def _endpoint(self, found: routes.Route, query: dict[str, str], call: Context) -> Any:
        servicer = self.servicer
        job_id = found.job_id
        handlers: dict[routes.Endpoint, Callable[[], Awaitable[Any]]] = {
            routes.Endpoint.CLUSTER: lambda: self._cluster(call),
            routes.Endpoint.UTILISATION: lambda: self._utilisation(query),
            routes.Endpoint.JOBS: lambda: self._jobs(query, call),
            routes.Endpoint.JOB: lambda: servicer.GetJob(spb.GetJobRequest(job_id=job_id), call),
            routes.Endpoint.TIMELINE: lambda: self._timeline(job_id, call),
            routes.Endpoint.EXPLAIN: lambda: servicer.Explain(
                spb.ExplainRequest(job_id=job_id), call
            ),
            routes.Endpoint.LOGS: lambda: self._logs(job_id, query, call),
        }
        assert found.endpoint is not None
        answer = await handlers[found.endpoint]()
        return answer if isinstance(answer, dict) else views.to_dict(answer)

    async def _cluster(self, call: Context) -> dict[str, Any]:
        status = await self.servicer.ClusterStatus(spb.ClusterStatusRequest(), call)
        return views.cluster_view(status)

    async def _utilisation(self, query: dict[str, str]) -> dict[str, Any]:
        # Who may see it: whoever ClusterStatus answers (any authenticated caller).
        unknown = [name for name in query if name != "points"]
        text = query.get("points", "")
        problems = [(name[:32], "unknown parameter (known: points)") for name in unknown]
        capacity = self.ring.samples.maxlen or 1
        points = DEFAULT_POINTS
        if text:
            if text.isdigit() and 1 <= int(text) <= capacity:
                points = int(text)
            else:
                problems.append(("points", f"{text[:16]!r} must be a number from 1 to {capacity}"))
        if problems:
            raise InvalidArgument(problems)
        return {"interval_s": self.sample_interval_s, **self.ring.view(points)}

    async def _jobs(self, query: dict[str, str], call: Context) -> spb.ListJobsResponse:
        return await self.servicer.ListJobs(views.jobs_request(query), call)

    async def _logs(self, job_id: str, query: dict[str, str], call: Context) -> dict[str, Any]:
        """The newest replica's last lines (views.logs_request bounds the query)."""
        request = views.logs_request(job_id, query)
        lines: list[str] = []
        generation = 0
        try:
            async for chunk in self.servicer.StreamLogs(request, call):
                generation = int(chunk.generation)
                lines.extend(chunk.lines)
        except NotFound as missing:
            job = (await self.servicer.GetJob(spb.GetJobRequest(job_id=job_id), call)).job
            return views.logs_view(job, request.rank, 0, [], note=str(missing))
        job = (await self.servicer.GetJob(spb.GetJobRequest(job_id=job_id), call)).job
        return views.logs_view(job, request.rank, generation, lines[-request.tail_lines :])

    async def _timeline(self, job_id: str, call: Context) -> dict[str, Any]:
        job = (await self.servicer.GetJob(spb.GetJobRequest(job_id=job_id), call)).job
        answer = await self.servicer.GetJobTimeline(spb.GetJobTimelineRequest(job_id=job.id), call)
        return views.timeline_view(job, answer.timeline)
