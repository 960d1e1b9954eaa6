"""``pollux-agent``: run one agent process.

Configuration comes from defaults, then ``--config FILE`` (TOML), then ``POLLUX_AGENT_*``
environment variables, then the command-line flags; every problem is reported at once and the
process exits 2 before touching anything. On SIGTERM or SIGINT the agent deregisters (revokes
its lease, so launchers and other agents stop routing its jobs to it at once), lets in-flight
RPCs finish, and exits 0. It writes only logs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any, TypeVar

import structlog

from pollux.agent.agent import Agent
from pollux.agent.config import AgentConfig
from pollux.agent.servicer import SERVICE_NAME, AgentServicer
from pollux.service import logging as service_logging
from pollux.service.config import ConfigError, load
from pollux.service.server import ServiceHost, wait_for_signal
from pollux.service.store import Store, StoreError
from pollux.v1 import agent_service_pb2_grpc as api_grpc

log = structlog.get_logger(__name__)

D = TypeVar("D")
EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; flags left out keep the file or environment value."""
    parser = argparse.ArgumentParser(
        prog="pollux-agent", description="Pollux agent: fits job models, tunes batch sizes."
    )
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument("--etcd", help="etcd endpoint host:port (etcd.endpoint)")
    parser.add_argument("--listen", help="gRPC bind address host:port (server.listen)")
    parser.add_argument("--advertise", help="address others dial, host:port (server.advertise)")
    parser.add_argument("--id", dest="agent_id", help="unique agent id (agent_id)")
    parser.add_argument(
        "--metrics-listen", help="Prometheus endpoint host:port (server.metrics_listen)"
    )
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> AgentConfig:
    """Defaults < file < environment < flags, validated as a whole.

    Raises:
        ConfigError: With every problem found.
    """
    problems: list[str] = []
    try:
        config = load(AgentConfig, args.config, "POLLUX_AGENT")
    except ConfigError as error:
        # Keep going on the defaults so that bad flags are reported in the same breath.
        problems.extend(error.problems)
        config = AgentConfig()
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
        agent_id=args.agent_id,
    )
    problems.extend(p for p in _problems(config, "") if p not in problems)
    if problems:
        raise ConfigError(problems)
    return config


def _replace(value: D, **changes: Any) -> D:
    kept = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(value, **kept)  # type: ignore[type-var]


def _problems(value: Any, where: str) -> list[str]:
    """Every `problems()` of a config tree with dotted paths (flags bypass `load`'s checks)."""
    out = [f"{where}{p}" for p in value.problems()]
    for f in dataclasses.fields(value):
        child = getattr(value, f.name)
        if dataclasses.is_dataclass(child):
            out.extend(_problems(child, f"{where}{f.name}."))
    return out


async def serve(config: AgentConfig) -> int:
    """Run the agent until SIGTERM/SIGINT; returns the exit status."""
    try:
        store = await Store.connect(
            config.etcd.endpoint, config.etcd.root, timeout_s=config.etcd.timeout_s
        )
    except StoreError as error:
        log.error("agent_etcd_unreachable", endpoint=config.etcd.endpoint, error=str(error))
        return EXIT_FAILED
    host = ServiceHost("agent", config.server.listen, config.server.metrics_listen or None)
    agent = Agent(store, config)
    servicer = AgentServicer(agent)
    status = EXIT_OK
    # Handlers go in before start-up, so a SIGTERM that arrives while registering is a
    # graceful stop afterwards rather than the default (abrupt) termination.
    signalled = asyncio.create_task(wait_for_signal())
    await asyncio.sleep(0)
    try:
        await host.start(
            lambda server: api_grpc.add_AgentServiceServicer_to_server(servicer, server),
            [SERVICE_NAME],
        )
        await agent.start(config.server.advertise or host.address)
        log.info("agent_ready", agent_id=agent.id, address=config.server.advertise or host.address)
        log.info("agent_stopping", signal=await signalled)
    except (StoreError, OSError) as error:
        log.error("agent_failed", error=str(error))
        status = EXIT_FAILED
    finally:
        signalled.cancel()
        await agent.stop()
        await host.stop(config.server.grace_s)
        await store.close()
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pollux-agent``; returns the process exit status."""
    args = parse_args(argv)
    service_logging.configure("agent")
    try:
        config = load_config(args)
    except ConfigError as error:
        log.error("agent_invalid_configuration", problems=error.problems)
        return EXIT_BAD_CONFIG
    service_logging.configure("agent", config.server.log_level)
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
