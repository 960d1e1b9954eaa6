"""`ServiceApp`: one service process's parts, started and stopped in one order.

Every service is the same sandwich: a `ServiceHost` (gRPC server with the RPC observer, health,
reflection, metrics) around a component (the scheduler's election and rounds, the agent, the
node's launcher). Start serves gRPC first, so the component can register the address it is
reached at; stop stops the component first (a launcher's replicas checkpoint while their logs
stay readable, an agent deregisters while in-flight reports finish), then the server.
"""

from __future__ import annotations

import abc
import socket
from collections.abc import Sequence

import grpc
import structlog

from pollux.service.config import ServerConfig
from pollux.service.server import ServiceHost


def advertised_address(server: ServerConfig, port: int) -> str:
    """The address other processes dial: the configured one, else the bound one.

    A wildcard bind advertises the hostname, not loopback: peers on other machines dial it
    (launchers also hand it to replicas as MASTER_ADDR).
    """
    if server.advertise:
        return server.advertise
    host = server.listen.rpartition(":")[0]
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


class ServiceApp(abc.ABC):
    """A service process: its `ServiceHost` and the component it serves.

    Args:
        name: Short service name for logs ("scheduler", "agent", "launcher").
        server: The service's endpoints.
        identity: Log context every line of the process carries (``node_id=...``).
    """

    def __init__(self, name: str, server: ServerConfig, **identity: str) -> None:
        self.server_config = server
        self.identity = identity
        self.host = ServiceHost(name, server.listen, server.metrics_listen or None)
        self.address = ""

    @abc.abstractmethod
    def register(self, server: grpc.aio.Server) -> Sequence[str]:
        """Add the servicers; returns their full service names (for health and reflection)."""

    @abc.abstractmethod
    async def start_component(self, address: str) -> None:
        """Start the component, reachable at `address`."""

    @abc.abstractmethod
    async def stop_component(self) -> None:
        """Stop the component (idempotent; also called after a failed start)."""

    async def start(self) -> None:
        """Serve gRPC, then start the component under the advertised address."""
        # Bound before the server starts: its RPC tasks and the component's copy this context.
        structlog.contextvars.bind_contextvars(**self.identity)
        await self.host.start(self.register)
        self.address = advertised_address(self.server_config, self.host.port)
        await self.start_component(self.address)

    async def stop(self) -> None:
        """Stop the component, then the server (in-flight RPCs get the configured grace)."""
        await self.stop_component()
        await self.host.stop(self.server_config.grace_s)
