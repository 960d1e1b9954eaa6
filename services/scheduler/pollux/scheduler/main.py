"""`pollux-scheduler`: one scheduler replica (run several; one leads).

    pollux-scheduler [--config scheduler.toml] [--etcd HOST:PORT] [--listen HOST:PORT]
                     [--id ID] [--policy pollux|optimus|tiresias] [--interval S]

Settings come from defaults, then the TOML file, then POLLUX_SCHEDULER_* variables
(e.g. POLLUX_SCHEDULER_SCHEDULING__INTERVAL_S=30), then flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog

from pollux.scheduler.config import SchedulerConfig
from pollux.scheduler.scheduler import Scheduler
from pollux.scheduler.servicer import SchedulerServicer
from pollux.service import logging as service_logging
from pollux.service.config import ConfigError, load, validate
from pollux.service.server import ServiceHost, wait_for_signal
from pollux.service.store import Store, StoreUnavailable
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc

log = structlog.get_logger(__name__)
SERVICE = "pollux.v1.SchedulerService"


def parse_config(argv: Sequence[str] | None) -> SchedulerConfig:
    """Flags over environment over file over defaults; raises ConfigError with every problem."""
    parser = argparse.ArgumentParser(prog="pollux-scheduler", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument("--etcd", help="etcd endpoint host:port")
    parser.add_argument("--etcd-root", help="etcd key root (default /pollux/v1)")
    parser.add_argument("--listen", help="gRPC bind address host:port")
    parser.add_argument("--advertise", help="address other processes dial")
    parser.add_argument("--metrics-listen", help="Prometheus endpoint host:port")
    parser.add_argument("--id", help="replica id")
    parser.add_argument("--policy", help="pollux, optimus or tiresias")
    parser.add_argument("--interval", type=float, help="seconds between rounds")
    parser.add_argument("--lease-ttl", type=int, help="leadership lease TTL in seconds")
    parser.add_argument("--restart-delay", type=float, help="re-allocation cost in seconds")
    args = parser.parse_args(argv)
    config = load(SchedulerConfig, args.config, "POLLUX_SCHEDULER")
    etcd = dataclasses.replace(
        config.etcd,
        **{k: v for k, v in (("endpoint", args.etcd), ("root", args.etcd_root)) if v},
    )
    server = dataclasses.replace(
        config.server,
        **{
            k: v
            for k, v in (
                ("listen", args.listen),
                ("advertise", args.advertise),
                ("metrics_listen", args.metrics_listen),
            )
            if v
        },
    )
    scheduling = dataclasses.replace(
        config.scheduling,
        **{
            k: v
            for k, v in (
                ("policy", args.policy),
                ("interval_s", args.interval),
                ("restart_delay_s", args.restart_delay),
            )
            if v is not None
        },
    )
    config = dataclasses.replace(
        config,
        etcd=etcd,
        server=server,
        scheduling=scheduling,
        **{k: v for k, v in (("id", args.id), ("lease_ttl_s", args.lease_ttl)) if v},
    )
    problems = validate(config)
    if problems:
        raise ConfigError(problems)
    return config


async def serve(config: SchedulerConfig) -> int:
    """Run one replica until SIGTERM/SIGINT."""
    service_logging.configure("scheduler", config.server.log_level)
    structlog.contextvars.bind_contextvars(scheduler_id=config.id)
    try:
        store = await Store.connect(
            config.etcd.endpoint, config.etcd.root, timeout_s=config.etcd.timeout_s
        )
    except StoreUnavailable as error:
        log.error("etcd_unreachable", error=str(error))
        return 1
    host = ServiceHost("scheduler", config.server.listen, config.server.metrics_listen or None)
    scheduler: Scheduler | None = None

    def register(server: object) -> None:
        assert scheduler is not None
        servicer = SchedulerServicer(
            store, config.id, scheduler.trigger, lambda: scheduler.last_round if scheduler else 0
        )
        spb_grpc.add_SchedulerServiceServicer_to_server(servicer, server)

    scheduler = Scheduler(store, config, address="")
    await host.start(register, [SERVICE])
    scheduler.member.address = config.server.advertise or host.address
    task = asyncio.create_task(scheduler.run(), name="scheduler")
    print(f"pollux-scheduler {config.id} serving on {host.address}", file=sys.stderr, flush=True)
    await wait_for_signal()
    log.info("shutting_down")
    await scheduler.stop()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await host.stop(config.server.grace_s)
    await store.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    try:
        config = parse_config(argv)
    except ConfigError as error:
        print(f"pollux-scheduler: {error}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
