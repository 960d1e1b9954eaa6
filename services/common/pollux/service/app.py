"""`ServiceApp`: one service process's parts, started and stopped in one order.

Every service is the same sandwich: a `ServiceHost` (gRPC server with the RPC observer, health,
reflection, metrics) serving some servicers, around a component (the scheduler's election and
rounds, the agent, the node's launcher). Start serves gRPC first, so the component can register
the address it is reached at; stop stops the component first (a launcher's replicas checkpoint
while their logs stay readable, an agent deregisters while in-flight reports finish), then the
server. A service only says what its component and servicers are.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import structlog

from pollux.service.config import ServerConfig
from pollux.service.server import ServiceHost


class Component(Protocol):
    """What a service process runs beside its gRPC server."""

    async def start(self, address: str) -> None:
        """Start, reachable at `address`."""

    async def stop(self) -> None:
        """Stop (idempotent; also called after a failed start)."""


@dataclass(frozen=True, slots=True)
class Servicer:
    """A servicer to serve and the generated function that adds it.

    Attributes:
        add: The generated ``add_<Service>Servicer_to_server`` function.
        implementation: The servicer object.
        name: Full service name, for health and reflection.
    """

    add: Callable[[Any, grpc.aio.Server], None]
    implementation: object
    name: str


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


class ServiceApp:
    """A service process: its `ServiceHost`, the servicers it serves and its component.

    Args:
        host: The gRPC host (`ServiceHost.for_config`).
        server: The service's endpoints.
        component: What runs beside the server.
        servicers: What the server serves.
        identity: Log context every line of the process carries (``node_id=...``).
    """

    def __init__(
        self,
        host: ServiceHost,
        server: ServerConfig,
        component: Component,
        servicers: Sequence[Servicer],
        **identity: str,
    ) -> None:
        self.host = host
        self.server_config = server
        self.component = component
        self.servicers = tuple(servicers)
        self.identity = identity
        self.address = ""

    def _register(self, server: grpc.aio.Server) -> list[str]:
        for servicer in self.servicers:
            servicer.add(servicer.implementation, server)
        return [s.name for s in self.servicers]

    async def start(self) -> None:
        """Serve gRPC, then start the component under the advertised address."""
        # Bound before the server starts: its RPC tasks and the component's copy this context.
        structlog.contextvars.bind_contextvars(**self.identity)
        await self.host.start(self._register)
        self.address = advertised_address(self.server_config, self.host.port)
        await self.component.start(self.address)

    async def stop(self) -> None:
        """Stop the component, then the server (in-flight RPCs get the configured grace)."""
        await self.component.stop()
        await self.host.stop(self.server_config.grace_s)
