"""A gRPC aio server with what every Pollux service ships.

The RPC observer (pollux.service.rpc: authentication, status mapping, one log line and one
latency observation per call), TLS with certificates re-read on change (pollux.service.tls),
health (grpcio-health-checking, per-service status), server reflection, a Prometheus metrics
endpoint, and graceful shutdown: on SIGTERM/SIGINT the health status turns NOT_SERVING, new
RPCs are refused and in-flight ones get `grace_s` to finish.

Secure by default: a host without TLS binds only a loopback address, unless the operator says
`insecure` — and then it warns on every start.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import prometheus_client
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pollux.service.audit import AuditLog
from pollux.service.auth import Authenticator
from pollux.service.config import ConfigError, ServerConfig
from pollux.service.rpc import RpcObserver
from pollux.service.streams import StreamGate
from pollux.service.tls import TlsFiles, is_loopback

log = structlog.get_logger(__name__)


class ServiceHost:
    """One process's gRPC server, health service and metrics endpoint.

    Args:
        name: Service name for logs ("scheduler", "agent", "launcher").
        listen: host:port to bind (port 0 picks a free one).
        metrics_listen: host:port of the Prometheus endpoint, or None for none (port 0 = free).
        tls: The TLS files; None serves plaintext without authentication.
        authenticator: Proves callers (required with `tls`).
        require_client_certificate: Refuse connections without a certificate of our CA.
        insecure: Allow plaintext on a non-loopback address.
        streams: Caps on the open server streams of its callers (None: none).

    Raises:
        ConfigError: Plaintext on a non-loopback address without `insecure`.
    """

    def __init__(
        self,
        name: str,
        listen: str,
        metrics_listen: str | None = None,
        *,
        tls: TlsFiles | None = None,
        authenticator: Authenticator | None = None,
        require_client_certificate: bool = False,
        insecure: bool = False,
        audit: AuditLog | None = None,
        streams: StreamGate | None = None,
    ) -> None:
        self.name = name
        self.listen = listen
        self.metrics_listen = metrics_listen
        self.tls = tls
        self.require_client_certificate = require_client_certificate
        self.insecure = insecure
        exposed = [a for a in (listen, metrics_listen) if tls is None and a and not is_loopback(a)]
        if exposed and not insecure:
            raise ConfigError(
                [
                    f"server: {', '.join(exposed)} is reachable from other machines, and this "
                    "service has no TLS: set tls.ca_file, tls.cert_file and tls.key_file "
                    "(pollux-up makes them), or bind 127.0.0.1, or pass --insecure to serve "
                    "plaintext without authentication anyway"
                ]
            )
        if tls is not None and authenticator is None:
            raise ValueError("a TLS host authenticates its callers: pass an authenticator")
        self.server = grpc.aio.server(
            interceptors=[RpcObserver(authenticator if tls is not None else None, audit, streams)],
            options=[("grpc.so_reuseport", 0)],
        )
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.metrics_port: int | None = None
        self._metrics_server: Any = None
        self._services: list[str] = []
        self._started = False

    @classmethod
    def for_config(
        cls,
        name: str,
        server: ServerConfig,
        *,
        tls: TlsFiles | None = None,
        authenticator: Authenticator | None = None,
        require_client_certificate: bool = False,
        insecure: bool = False,
        audit: AuditLog | None = None,
        streams: StreamGate | None = None,
    ) -> ServiceHost:
        """The host of a service's `[server]` settings."""
        return cls(
            name,
            server.listen,
            server.metrics_listen or None,
            tls=tls,
            authenticator=authenticator,
            require_client_certificate=require_client_certificate,
            insecure=insecure,
            audit=audit,
            streams=streams,
        )

    async def start(self, register: Callable[[grpc.aio.Server], Sequence[str]]) -> int:
        """Register servicers, health and reflection; bind; start. Returns the bound port.

        Args:
            register: Adds the servicers and returns their full service names.
        """
        service_names = list(register(self.server))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._services = service_names
        reflection.enable_server_reflection(
            [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        if self.tls is not None:
            credentials = self.tls.server_credentials(
                require_client_certificate=self.require_client_certificate
            )
            self.port = self.server.add_secure_port(self.listen, credentials)
        else:
            if self.insecure:
                log.warning(
                    "serving_without_tls",
                    listen=self.listen,
                    detail="plaintext, no authentication: anyone who reaches this port "
                    "acts as an admin (--insecure)",
                )
            self.port = self.server.add_insecure_port(self.listen)
        if self.port == 0:
            raise OSError(f"{self.name}: cannot bind {self.listen}")
        await self.server.start()
        self._started = True
        for service in ("", *service_names):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.metrics_listen is not None:
            host, _, port = self.metrics_listen.rpartition(":")
            tls: dict[str, Any] = {}
            if self.tls is not None:
                # HTTPS for scrapers holding a certificate of the cluster CA (files read once:
                # a renewed certificate reaches this endpoint at the next restart).
                ca, cert, key = (str(path) for path in self.tls.paths)
                tls = {
                    "certfile": cert,
                    "keyfile": key,
                    "client_cafile": ca,
                    "client_auth_required": True,
                }
            self._metrics_server, _ = prometheus_client.start_http_server(
                int(port), host or "", **tls
            )
            self.metrics_port = int(self._metrics_server.server_port)
        log.info(
            "server_started",
            listen=self.listen,
            port=self.port,
            metrics_port=self.metrics_port,
            tls=self.tls is not None,
        )
        return self.port

    async def set_serving(self, service: str, serving: bool) -> None:
        """Report one service SERVING or NOT_SERVING (the scheduler's writes follow leadership)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(service, status)

    async def stop(self, grace_s: float) -> None:
        """Graceful shutdown: NOT_SERVING, refuse new RPCs, let in-flight ones finish."""
        if self._started:
            self._started = False
            await self.health.enter_graceful_shutdown()
            await self.server.stop(grace_s)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        log.info("server_stopped")


async def wait_for_signal() -> int:
    """Wait for SIGTERM or SIGINT; returns the signal number."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[int] = loop.create_future()

    def deliver(number: int) -> None:
        if not received.done():
            received.set_result(number)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, deliver, int(sig))
    try:
        return await received
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
