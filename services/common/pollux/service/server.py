"""A gRPC aio server with what every Pollux service ships.

The RPC observer (pollux.service.rpc: status mapping, one log line and one latency observation
per call), health (grpcio-health-checking, per-service status), server reflection, a Prometheus
metrics endpoint, and graceful shutdown: on SIGTERM/SIGINT the health status turns NOT_SERVING,
new RPCs are refused and in-flight ones get `grace_s` to finish.
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

from pollux.service.config import ServerConfig
from pollux.service.rpc import RpcObserver

log = structlog.get_logger(__name__)


class ServiceHost:
    """One process's gRPC server, health service and metrics endpoint.

    Args:
        name: Service name for logs ("scheduler", "agent", "launcher").
        listen: host:port to bind (port 0 picks a free one).
        metrics_listen: host:port of the Prometheus endpoint, or None for none (port 0 = free).
    """

    def __init__(self, name: str, listen: str, metrics_listen: str | None = None) -> None:
        self.name = name
        self.listen = listen
        self.metrics_listen = metrics_listen
        self.server = grpc.aio.server(
            interceptors=[RpcObserver()], options=[("grpc.so_reuseport", 0)]
        )
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.metrics_port: int | None = None
        self._metrics_server: Any = None
        self._services: list[str] = []
        self._started = False

    @classmethod
    def for_config(cls, name: str, server: ServerConfig) -> ServiceHost:
        """The host of a service's `[server]` settings."""
        return cls(name, server.listen, server.metrics_listen or None)

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
        self.port = self.server.add_insecure_port(self.listen)
        if self.port == 0:
            raise OSError(f"{self.name}: cannot bind {self.listen}")
        await self.server.start()
        self._started = True
        for service in ("", *service_names):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.metrics_listen is not None:
            host, _, port = self.metrics_listen.rpartition(":")
            self._metrics_server, _ = prometheus_client.start_http_server(int(port), host or "")
            self.metrics_port = int(self._metrics_server.server_port)
        log.info(
            "server_started", listen=self.listen, port=self.port, metrics_port=self.metrics_port
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
