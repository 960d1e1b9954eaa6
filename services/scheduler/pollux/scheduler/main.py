"""`pollux-scheduler`: one scheduler replica (run several; one leads).

    pollux-scheduler [--config scheduler.toml] [--etcd HOST:PORT] [--listen HOST:PORT]
                     [--id ID] [--policy pollux|optimus|tiresias] [--interval S]
                     [--dashboard-listen HOST:PORT] ...

Settings come from defaults, then the TOML file, then POLLUX_SCHEDULER_* variables
(e.g. POLLUX_SCHEDULER_SCHEDULING__INTERVAL_S=30), then flags (pollux.service.entry).

Health: every replica serves reads and submits, so ``pollux.v1.SchedulerService`` is SERVING
on all of them; ``pollux.v1.SchedulerService/leader`` is SERVING only on the replica that leads
(the one whose rounds write allocations), so a load balancer or probe can find it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from pollux.policy.registry import POLICY_NAMES
from pollux.scheduler.admin import ACTIONS, AdminServicer
from pollux.scheduler.config import SchedulerConfig
from pollux.scheduler.dashboard.server import Dashboard
from pollux.scheduler.forecaster import Forecaster
from pollux.scheduler.scheduler import Scheduler
from pollux.scheduler.servicer import SchedulerServicer
from pollux.scheduler.tokens import TokenBook
from pollux.service.app import ServiceApp, Servicer
from pollux.service.audit import AuditLog
from pollux.service.auth import Authenticator
from pollux.service.entry import Flag, ServiceSpec, run_service
from pollux.service.logging import LOG_HEALTH
from pollux.service.maintenance import EtcdMaintainer
from pollux.service.server import ServiceHost
from pollux.service.store import Store, cancel_and_wait
from pollux.service.streams import StreamGate
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc

SERVICE = spb.DESCRIPTOR.services_by_name["SchedulerService"].full_name
"""Fully qualified service name, for health and reflection."""
ADMIN_SERVICE = apb.DESCRIPTOR.services_by_name["AdminService"].full_name
LEADER_HEALTH = f"{SERVICE}/leader"
"""Health service name that is SERVING only while this replica leads."""


class Campaign:
    """The component of a scheduler replica: election, rounds and etcd's maintenance.

    The leader health follows the election; the maintenance loop runs on every replica
    (pollux.service.maintenance: under etcd's NOSPACE alarm no replica can become leader).

    Args:
        store: The cluster state (owned by the caller).
        config: The replica's configuration.
        host: The replica's gRPC host, whose `LEADER_HEALTH` this reports.
    """

    def __init__(self, store: Store, config: SchedulerConfig, host: ServiceHost) -> None:
        self.scheduler = Scheduler(store, config, address="", on_leadership=self._leadership)
        self.maintainer = EtcdMaintainer(
            config.etcd.endpoint,
            timeout_s=config.etcd.timeout_s,
            settings=config.maintenance,
            leading=lambda: self._leading,
        )
        self._host = host
        self._leading = False
        self._health_changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, address: str) -> None:
        """Report NOT_SERVING for the leader health, then campaign and run rounds."""
        await self._host.set_serving(LEADER_HEALTH, False)
        self.scheduler.member.address = address
        self._tasks = [
            asyncio.create_task(self._follow_leadership(), name="scheduler-health"),
            asyncio.create_task(self.scheduler.run(), name="scheduler"),
            asyncio.create_task(self.maintainer.run(), name="etcd-maintenance"),
        ]

    async def stop(self) -> None:
        """Resign (a standby takes over at once) and stop the rounds."""
        await self.scheduler.stop()
        for task in reversed(self._tasks):
            await cancel_and_wait(task)
        self._tasks = []
        await self._host.set_serving(LEADER_HEALTH, False)

    def _leadership(self, leading: bool) -> None:
        self._leading = leading
        self._health_changed.set()

    async def _follow_leadership(self) -> None:
        # One writer applies the latest state, so the reported health never lags behind a
        # quick lose-then-win sequence out of order.
        while True:
            await self._health_changed.wait()
            self._health_changed.clear()
            await self._host.set_serving(LEADER_HEALTH, self._leading)


class SchedulerApp(ServiceApp):
    """A scheduler replica: its `Campaign` and the SchedulerService every replica serves.

    Args:
        config: The validated configuration.
        store: The cluster state (owned by the caller).
    """

    def __init__(self, config: SchedulerConfig, store: Store) -> None:
        tokens = TokenBook(store)
        self.audit = AuditLog(store, ACTIONS)
        authenticator = Authenticator(tokens=tokens.verify)
        limits = config.limits
        self.streams = StreamGate(
            limits.streams_per_principal,
            limits.streams_per_replica,
            principal_setting="limits.streams_per_principal",
            total_setting="limits.streams_per_replica",
        )
        """The caps on open WatchJobs and StreamLogs streams (pollux.scheduler.limits)."""
        host = ServiceHost.for_config(
            "scheduler",
            config.server,
            tls=store.tls,
            authenticator=authenticator,
            require_client_certificate=config.auth.client_certificates,
            insecure=config.tls.insecure,
            audit=self.audit,
            streams=self.streams,
        )
        campaign = Campaign(store, config, host)
        self.scheduler = campaign.scheduler
        scheduling = config.scheduling
        self.forecaster = Forecaster(
            self.scheduler.mirror,
            self.scheduler.policy,
            interval_s=scheduling.forecast_interval_s,
            round_s=scheduling.forecast_round_s,
            restart_delay_s=scheduling.restart_delay_s,
            live_round_s=scheduling.interval_s,
        )
        servicer = SchedulerServicer(
            store,
            config.id,
            self.scheduler.trigger,
            lambda: self.scheduler.last_round,
            warnings=lambda: [*campaign.maintainer.warnings(), *LOG_HEALTH.warnings()],
            mirror=self.scheduler.mirror,
            policy=self.scheduler.policy,
            forecaster=self.forecaster,
            seed_profiles=scheduling.seed_profiles,
            limits=limits,
        )
        self.servicer = servicer
        self.dashboard = (
            Dashboard(
                servicer,
                config.dashboard_listen,
                tls=store.tls,
                authenticator=authenticator,
                insecure=config.tls.insecure,
                sample_interval_s=config.dashboard_sample_s,
                samples=config.dashboard_samples,
            )
            if config.dashboard_listen
            else None
        )
        """The read-only web dashboard (`dashboard_listen`), same checks as the API."""
        super().__init__(
            host,
            config.server,
            campaign,
            [
                Servicer(spb_grpc.add_SchedulerServiceServicer_to_server, servicer, SERVICE),
                Servicer(
                    apb_grpc.add_AdminServiceServicer_to_server,
                    AdminServicer(store, tokens),
                    ADMIN_SERVICE,
                ),
            ],
            scheduler_id=config.id,
        )

    async def start(self) -> None:
        """Serve and campaign, then forecast in the background, then serve the dashboard."""
        await super().start()
        self.forecaster.start()
        if self.dashboard is not None:
            await self.dashboard.start()
            self.servicer.dashboard_url = self.dashboard.url

    async def stop(self) -> None:
        """Stop the dashboard, forecasting and serving, then write the queued audit records."""
        if self.dashboard is not None:
            await self.dashboard.stop()
        await self.forecaster.stop()
        await super().stop()
        await self.audit.close()


SPEC: ServiceSpec[SchedulerConfig, None] = ServiceSpec(
    name="scheduler",
    prog="pollux-scheduler",
    description="Pollux scheduler replica: leader election and goodput-maximising rounds.",
    config=SchedulerConfig,
    env_prefix="POLLUX_SCHEDULER",
    app=lambda config, _, store: SchedulerApp(config, store),
    flags=(
        Flag("--id", "id", "replica id (shown as the leader id)"),
        Flag("--policy", "scheduling.policy", f"one of {', '.join(POLICY_NAMES)}"),
        Flag("--interval", "scheduling.interval_s", "seconds between rounds", float),
        Flag("--lease-ttl", "lease_ttl_s", "leadership lease TTL in seconds", int),
        Flag("--restart-delay", "scheduling.restart_delay_s", "re-allocation cost, s", float),
        Flag(
            "--dashboard-listen",
            "dashboard_listen",
            "read-only web dashboard host:port (HTTPS with TLS on; empty: none)",
        ),
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    return run_service(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
