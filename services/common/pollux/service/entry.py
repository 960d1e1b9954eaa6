"""The one entry point shape of every service: command line → configuration → run → exit code.

A service describes itself with a `ServiceSpec` (config class, environment prefix, flags, an
optional host check, how to build its `ServiceApp`); `run_service` does the rest alike for the
scheduler, the agent and the launcher: parse the flags (each maps to one dotted config field),
layer defaults < TOML file (``--config``) < ``<PREFIX>_*`` environment < flags, validate the
whole tree and run the host check (`prepare`), reporting every problem with its field path at
once, then connect to etcd, start the app, serve until SIGTERM/SIGINT and stop in reverse.

Exit codes: `EXIT_OK` (0) after a requested stop, `EXIT_FAILED` (1) when the service could not
run (etcd unreachable, a port taken, a store failure while starting), `EXIT_BAD_CONFIG` (2) for
invalid configuration or usage (argparse's own usage errors exit 2 as well).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import structlog

from pollux.service import logging as service_logging
from pollux.service.app import ServiceApp
from pollux.service.config import ConfigError, EtcdConfig, ServerConfig, TlsConfig, load
from pollux.service.server import wait_for_signal
from pollux.service.store import Store, StoreError, cancel_and_wait
from pollux.service.tls import TlsError, TlsFiles

log = structlog.get_logger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


class ServiceConfig(Protocol):
    """What the skeleton reads from every service's config tree."""

    @property
    def etcd(self) -> EtcdConfig:
        """Where the cluster state lives."""

    @property
    def server(self) -> ServerConfig:
        """The service's own endpoints and logging."""

    @property
    def tls(self) -> TlsConfig:
        """Its certificates (ports and etcd)."""


C = TypeVar("C", bound=ServiceConfig)
P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class Flag:
    """A command-line flag that sets one config field.

    Attributes:
        flag: The option, e.g. ``--etcd``.
        path: The dotted config field it sets, e.g. ``etcd.endpoint``.
        help: What it is (the field path is appended).
        type: Converts the argument (argparse's ``type``).
    """

    flag: str
    path: str
    help: str
    type: Callable[[str], Any] = str
    switch: bool = False
    """Takes no argument: present sets the field to true."""


COMMON_FLAGS = (
    Flag("--etcd", "etcd.endpoint", "etcd endpoint host:port"),
    Flag("--etcd-root", "etcd.root", "etcd key root (several clusters can share one etcd)"),
    Flag("--listen", "server.listen", "gRPC bind address host:port (port 0: any free port)"),
    Flag("--advertise", "server.advertise", "address other processes dial, host:port"),
    Flag("--metrics-listen", "server.metrics_listen", "Prometheus endpoint host:port"),
    Flag("--log-level", "server.log_level", "debug, info, warning or error"),
    Flag("--tls-ca", "tls.ca_file", "PEM bundle of the cluster CA", Path),
    Flag("--tls-cert", "tls.cert_file", "this service's certificate (PEM)", Path),
    Flag("--tls-key", "tls.key_file", "this service's private key (PEM)", Path),
    Flag(
        "--insecure",
        "tls.insecure",
        "serve plaintext without authentication on a non-loopback address",
        switch=True,
    ),
)
"""Flags every service takes; a service adds its own in `ServiceSpec.flags`."""


def _no_host_check(config: Any) -> None:
    return None


@dataclass(frozen=True)
class ServiceSpec(Generic[C, P]):
    """How one service plugs into the skeleton.

    Attributes:
        name: Short name for logs ("scheduler").
        prog: The console script ("pollux-scheduler").
        description: One line for ``--help``.
        config: The service's frozen config dataclass.
        env_prefix: Environment overrides are ``<env_prefix>_<SECTION>__<FIELD>``.
        app: Builds the app from the config, the host check's result and the store.
        flags: The service's own flags, after `COMMON_FLAGS`.
        prepare: The host check; raises `ConfigError` with every problem it finds.
    """

    name: str
    prog: str
    description: str
    config: type[C]
    env_prefix: str
    app: Callable[[C, P, Store], ServiceApp]
    flags: tuple[Flag, ...] = ()
    prepare: Callable[[C], P] = field(default=_no_host_check)  # type: ignore[assignment]


def build_parser(spec: ServiceSpec[Any, Any]) -> argparse.ArgumentParser:
    """The service's command line: ``--config`` plus every flag of `COMMON_FLAGS` and the spec."""
    parser = argparse.ArgumentParser(
        prog=spec.prog,
        description=spec.description,
        epilog=(
            "Settings: defaults < --config TOML file < "
            f"{spec.env_prefix}_<SECTION>__<FIELD> environment variables < flags."
        ),
    )
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    for flag in (*COMMON_FLAGS, *spec.flags):
        if flag.switch:  # None when absent, so a file's setting stands
            parser.add_argument(
                flag.flag, action="store_const", const=True, help=f"{flag.help} ({flag.path})"
            )
        else:
            parser.add_argument(flag.flag, type=flag.type, help=f"{flag.help} ({flag.path})")
    return parser


def load_config(spec: ServiceSpec[C, Any], argv: Sequence[str] | None) -> C:
    """Parse `argv` and build the validated config.

    Raises:
        ConfigError: With every problem found, each with its field path.
        SystemExit: On a usage error (argparse prints it; exit status 2).
    """
    args = build_parser(spec).parse_args(argv)
    overrides = {
        flag.path: getattr(args, flag.flag.lstrip("-").replace("-", "_"))
        for flag in (*COMMON_FLAGS, *spec.flags)
    }
    return load(spec.config, args.config, spec.env_prefix, overrides)


def run_service(spec: ServiceSpec[C, P], argv: Sequence[str] | None = None) -> int:
    """The console entry point of a service; returns its exit status."""
    service_logging.configure(spec.name)
    try:
        config = load_config(spec, argv)
        prepared = spec.prepare(config)
    except ConfigError as error:
        log.error("invalid_configuration", problems=error.problems)
        print(f"{spec.prog}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    service_logging.configure(spec.name, config.server.log_level)
    return asyncio.run(serve(spec, config, prepared))


async def serve(spec: ServiceSpec[C, P], config: C, prepared: P) -> int:
    """Run the service until SIGTERM/SIGINT; returns the exit status."""
    # Handlers go in first, so a signal that arrives while starting is a graceful stop
    # afterwards rather than the default (abrupt) termination.
    signalled = asyncio.create_task(wait_for_signal())
    await asyncio.sleep(0)
    etcd = config.etcd
    try:
        tls = TlsFiles.of(config.tls)
    except TlsError as error:
        log.error("invalid_configuration", problems=[f"tls: {error}"])
        signalled.cancel()
        return EXIT_BAD_CONFIG
    try:
        store = await Store.connect(etcd.endpoint, etcd.root, timeout_s=etcd.timeout_s, tls=tls)
    except StoreError as error:
        log.error("etcd_unreachable", endpoint=etcd.endpoint, error=str(error))
        signalled.cancel()
        return EXIT_FAILED
    try:
        app = spec.app(config, prepared, store)
    except ConfigError as error:
        log.error("invalid_configuration", problems=error.problems)
        print(f"{spec.prog}: {error}", file=sys.stderr)
        signalled.cancel()
        await store.close()
        return EXIT_BAD_CONFIG
    reload = asyncio.create_task(_reload_tls(store), name="tls-reload")
    status = EXIT_OK
    try:
        await app.start()
        log.info("service_ready", address=app.address)
        log.info("service_stopping", signal=await signalled)
    except ConfigError as error:
        log.error("invalid_configuration", problems=error.problems)
        status = EXIT_BAD_CONFIG
    except (StoreError, OSError) as error:
        log.error("service_failed", error=str(error))
        status = EXIT_FAILED
    finally:
        signalled.cancel()
        await cancel_and_wait(reload)
        await app.stop()
        await store.close()
    return status


TLS_RELOAD_INTERVAL_S = 30.0
"""How often the etcd connection checks its certificate files (ports check per handshake)."""


async def _reload_tls(store: Store) -> None:
    while store.tls is not None:
        await asyncio.sleep(TLS_RELOAD_INTERVAL_S)
        try:
            await store.reload_tls()
        except StoreError as error:
            log.warning("etcd_redial_failed", error=str(error))
