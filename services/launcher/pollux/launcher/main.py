"""``pollux-launcher``: run one node's launcher.

Configuration comes from defaults, then ``--config FILE`` (TOML), then ``POLLUX_LAUNCHER_*``
environment variables, then the command-line flags; every problem (including a node with
neither GPUs nor a ``--gpus`` slot count, or an unwritable checkpoint or log root) is reported
at once and the process exits 2 before registering anything. On SIGTERM or SIGINT the launcher
stops its replicas gracefully (they checkpoint and exit 143), reports their exits, revokes its
lease (the node disappears from the cluster), stops its gRPC server and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import structlog

from pollux.launcher.config import LauncherConfig, validate
from pollux.launcher.gpus import GpuDetectionError, Inventory, detect
from pollux.launcher.launcher import Launcher, NodeNameInUseError
from pollux.launcher.servicer import SERVICE_NAME, LauncherServicer
from pollux.service import logging as service_logging
from pollux.service.config import ConfigError, load
from pollux.service.server import ServiceHost, wait_for_signal
from pollux.service.store import Store, StoreError
from pollux.v1 import launcher_service_pb2_grpc as api_grpc

log = structlog.get_logger(__name__)

D = TypeVar("D")
EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; flags left out keep the file or environment value."""
    parser = argparse.ArgumentParser(
        prog="pollux-launcher",
        description="Pollux node launcher: registers the node and runs job replicas.",
    )
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument("--etcd", help="etcd endpoint host:port (etcd.endpoint)")
    parser.add_argument("--node-name", help="unique node name (node_name; default hostname)")
    parser.add_argument(
        "--gpus", type=int, help="serve N CPU slots instead of detected GPUs (gpus)"
    )
    parser.add_argument("--listen", help="gRPC bind address host:port (server.listen)")
    parser.add_argument("--advertise", help="address others dial, host:port (server.advertise)")
    parser.add_argument(
        "--metrics-listen", help="Prometheus endpoint host:port (server.metrics_listen)"
    )
    parser.add_argument("--checkpoint-root", type=Path, help="replica checkpoint root")
    parser.add_argument("--log-root", type=Path, help="replica log root")
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> LauncherConfig:
    """Defaults < file < environment < flags, validated as a whole.

    Raises:
        ConfigError: With every problem found.
    """
    config = load(LauncherConfig, args.config, "POLLUX_LAUNCHER")
    server = _replace(
        config.server,
        listen=args.listen,
        advertise=args.advertise,
        metrics_listen=args.metrics_listen,
    )
    config = _replace(
        config,
        etcd=_replace(config.etcd, endpoint=args.etcd),
        server=server,
        node_name=args.node_name,
        gpus=args.gpus,
        checkpoint_root=args.checkpoint_root,
        log_root=args.log_root,
    )
    problems = validate(config)
    if problems:
        raise ConfigError(problems)
    return config


def prepare(config: LauncherConfig) -> Inventory:
    """Check what only the machine can tell: the GPU inventory and the writable roots.

    Raises:
        ConfigError: With every problem found.
    """
    problems = []
    inventory = None
    try:
        inventory = detect(config.gpus)
    except GpuDetectionError as error:
        problems.append(str(error))
    for name in ("checkpoint_root", "log_root"):
        path: Path = getattr(config, name)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            problems.append(f"{name}: cannot create {path}: {error.strerror}")
    if problems or inventory is None:
        raise ConfigError(problems)
    return inventory


def advertised(config: LauncherConfig, port: int) -> str:
    """The address other processes dial: the configured one, else the bound one.

    A wildcard bind advertises the hostname, not loopback: peers on other nodes use this
    host as MASTER_ADDR (unless the node's "host" label says otherwise).
    """
    if config.server.advertise:
        return config.server.advertise
    host = config.server.listen.rpartition(":")[0]
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


_add: Callable[[LauncherServicer, grpc.aio.Server], None] = (
    api_grpc.add_LauncherServiceServicer_to_server
)
"""The generated registration function, typed (grpc's generated code carries no types)."""


def _replace(value: D, **changes: Any) -> D:
    kept = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(value, **kept)  # type: ignore[type-var]


class LauncherApp:
    """One launcher process's parts, started and stopped in the right order.

    Args:
        config: The validated configuration.
        inventory: The node's GPUs or CPU slots.
        store: The cluster state (owned by the caller).
    """

    def __init__(self, config: LauncherConfig, inventory: Inventory, store: Store) -> None:
        self.config = config
        self.host = ServiceHost(
            "launcher", config.server.listen, config.server.metrics_listen or None
        )
        self.launcher = Launcher(config, store, inventory, advertise="")
        self._servicer = LauncherServicer(self.launcher)

    @property
    def address(self) -> str:
        """The advertised gRPC address (after `start`)."""
        return self.launcher.advertise

    async def start(self) -> None:
        """Serve gRPC first (the registration names its port), then register and run."""
        await self.host.start(lambda server: _add(self._servicer, server), [SERVICE_NAME])
        self.launcher.advertise = advertised(self.config, self.host.port)
        await self.launcher.start()

    async def stop(self) -> None:
        """Stop replicas and deregister, then stop serving (logs stay readable meanwhile)."""
        await self.launcher.stop()
        await self.host.stop(self.config.server.grace_s)


async def serve(config: LauncherConfig, inventory: Inventory) -> int:
    """Run the launcher until SIGTERM/SIGINT; returns the exit status."""
    try:
        store = await Store.connect(
            config.etcd.endpoint, config.etcd.root, timeout_s=config.etcd.timeout_s
        )
    except StoreError as error:
        log.error("launcher_etcd_unreachable", endpoint=config.etcd.endpoint, error=str(error))
        return EXIT_FAILED
    app = LauncherApp(config, inventory, store)
    status = EXIT_OK
    try:
        await app.start()
        log.info("launcher_ready", address=app.address, gpus=inventory.count)
        signum = await wait_for_signal()
        log.info("launcher_stopping", signal=signum)
    except NodeNameInUseError as error:
        log.error("launcher_invalid_configuration", problems=[str(error)])
        status = EXIT_BAD_CONFIG
    except (StoreError, OSError) as error:
        log.error("launcher_failed", error=str(error))
        status = EXIT_FAILED
    finally:
        await app.stop()
        await store.close()
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pollux-launcher``; returns the process exit status."""
    args = parse_args(argv)
    service_logging.configure("launcher")
    try:
        config = load_config(args)
        inventory = prepare(config)
    except ConfigError as error:
        log.error("launcher_invalid_configuration", problems=error.problems)
        return EXIT_BAD_CONFIG
    service_logging.configure("launcher", config.server.log_level)
    with structlog.contextvars.bound_contextvars(node_id=config.node_name):
        return asyncio.run(serve(config, inventory))


if __name__ == "__main__":
    sys.exit(main())
