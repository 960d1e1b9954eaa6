"""Scheduler configuration (TOML + POLLUX_SCHEDULER_* environment overrides)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from pollux.policy.registry import (
    DEFAULT_POLICY,
    JCT_RESTARTS,
    TENANT_SHARES,
    PolicySpec,
    PolicySpecError,
)
from pollux.scheduler.limits import LimitsConfig
from pollux.service.config import EtcdConfig, ServerConfig, TlsConfig
from pollux.service.maintenance import MaintenanceSettings

EVENT_ROUNDS = ("place", "full")


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    """How and when rounds run, and by which policy (docs/configuration.md)."""

    policy: str = DEFAULT_POLICY
    """The scheduling policy (pollux.policy.registry.POLICY_NAMES): "pollux-jct" (the
    default: Pollux with each job weighted by its declared remaining work, lower mean JCT at
    every measured load), "pollux" (Pollux as published), "optimus" (with model-predicted
    step times) or "tiresias"."""
    interval_s: float = 60.0
    """Seconds between periodic rounds (the paper's 60 s)."""
    debounce_s: float = 1.0
    """Events (submit, completion, cancel, node change) trigger a round after this quiet
    period, which saves each new job the wait for the next periodic round. The simulator runs
    the same timing with `SimConfig.event_delay`."""
    event_rounds: str = "place"
    """What an event-triggered round does. "place" (the default): place jobs that never ran
    on the GPUs no job holds, and leave every other job to the periodic rounds, which keep
    their own clock (pollux.policy.placement; but a user of a tenant holding no GPU takes
    one from a user holding two or more). "full": re-plan every job, the periodic timer
    restarting from the round; an arrival and a departure in the same minute then move the
    running jobs twice (more restarts per job on the simulator: docs/results.md, "The jct
    mode: further runs and discussion"). With tenants every round is a full one."""
    restart_delay_s: float = 30.0
    """Expected cost of a re-allocation, for the Pollux policies' restart penalty."""
    seed: int = 0
    """Seed of the policy's random generator (rounds are replayable)."""
    decision_history: int = 1000
    """Decision records kept in etcd."""
    forecast_interval_s: float = 60.0
    """Seconds between each replica's completion-time forecasts (0: none; then a job's
    estimate is its time left on its current GPUs): scheduler/forecaster.py."""
    forecast_round_s: float = 300.0
    """Seconds per round of a forecast: coarser than `interval_s` bounds its cost."""
    jct_restart: str = JCT_RESTARTS[0]
    """Of "pollux-jct": how a re-allocation's lifetime is taken when its restart pause is
    priced (pollux.policy.jct.JctParams.restart): "ramp" (the default: "holding" while a job
    has only grown, then "expected"), "holding" (the job's mean holding time) or "expected"
    (the mean over an exponential lifetime of that mean)."""
    tenant_shares: str = TENANT_SHARES[0]
    """Of "pollux-jct" and "pollux", with tenants: how busy tenants get their shares
    (pollux.policy.tenant_shares): "isolation" (the default), "deficits", "weights" or
    "budgets"."""
    seed_profiles: bool = False
    """Start each submission from the step times and throughput fit of its owner's newest
    earlier job of the same name (pollux.service.seeding), so a re-run is sized from what was
    measured instead of growing from its first allocation. Off by default: on the simulator
    it raised "pollux-jct"'s mean JCT at every load (docs/results.md, "Seeded re-runs")."""

    def policy_spec(self) -> PolicySpec:
        """The policy these settings name, parsed (`problems` lists what would stop it).

        Raises:
            PolicySpecError: The policy settings are invalid.
        """
        return PolicySpec(
            name=self.policy,
            restart_delay_s=self.restart_delay_s,
            jct_restart=self.jct_restart,
            tenant_shares=self.tenant_shares,
        )

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        try:
            self.policy_spec()
        except PolicySpecError as error:
            out.extend(error.problems)
        if self.interval_s <= 0:
            out.append("interval_s: must be > 0")
        if self.debounce_s < 0:
            out.append("debounce_s: must be >= 0")
        if self.event_rounds not in EVENT_ROUNDS:
            out.append(
                f"event_rounds: {self.event_rounds!r} is not one of {', '.join(EVENT_ROUNDS)}"
            )
        if self.decision_history < 1:
            out.append("decision_history: must be >= 1")
        if self.forecast_interval_s < 0:
            out.append("forecast_interval_s: must be >= 0 (0 turns forecasts off)")
        if self.forecast_round_s <= 0:
            out.append("forecast_round_s: must be > 0")
        return out


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Who may call the scheduler (with TLS on; pollux.service.auth)."""

    client_certificates: bool = False
    """Require a client certificate of the cluster CA on the public port as well as accepting
    tokens (gRPC Python cannot ask for an optional one): for sites that give people
    certificates. Off: people authenticate with API tokens over server-verified TLS."""


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """How long finished jobs stay in etcd (pollux.scheduler.retention)."""

    finished_grace_s: float = 600.0
    """A finished job's replica statuses, model, profile, allocation and idempotency key are
    deleted this long after it ends."""
    retention_days: float = 30.0
    """A finished job's record is deleted this long after it ends (GetJob: NOT_FOUND)."""
    profile_days: float = 7.0
    """The model and observation profile of each owner's newest finished run of a name outlive
    finished_grace_s by this long (never the record), so a later re-run is seeded from its
    step times and `estimate` can use its goodput; a newer run of the name supersedes them at
    once (0 = they go with the rest of the side state)."""
    profile_max_jobs: int = 1000
    """At most this many finished runs keep their model and profile so (the latest finished
    win), which bounds what names used once cost etcd."""
    sweep_interval_s: float = 60.0
    """How often the leader looks for finished jobs to clean up."""
    audit_days: float = 90.0
    """Audit records are deleted this long after they were written."""
    audit_max_records: int = 100_000
    """At most this many audit records are kept (the oldest go first)."""
    usage_days: float = 400.0
    """Per-day usage records (pollux-cli usage) are kept this long: over a year of accounting."""

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        if self.audit_days <= 0 or self.usage_days <= 0:
            out.append("audit_days, usage_days: must be > 0")
        if self.audit_max_records < 1:
            out.append("audit_max_records: must be >= 1")
        if self.finished_grace_s < 0:
            out.append("finished_grace_s: must be >= 0")
        if self.retention_days * 86400 < self.finished_grace_s:
            out.append("retention_days: must cover at least finished_grace_s")
        if self.sweep_interval_s <= 0:
            out.append("sweep_interval_s: must be > 0")
        if self.profile_days < 0:
            out.append("profile_days: must be >= 0 (0 = not kept)")
        if self.profile_max_jobs < 0:
            out.append("profile_max_jobs: must be >= 0 (0 = not kept)")
        return out


def _default_id() -> str:
    return f"scheduler-{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Everything a scheduler replica needs."""

    id: str = field(default_factory=_default_id)
    """Unique replica id (shown as the leader id)."""
    lease_ttl_s: int = 5
    """Leadership lease TTL: a dead leader is replaced within about this long."""
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    """Cluster state store."""
    server: ServerConfig = field(default_factory=lambda: ServerConfig(listen="127.0.0.1:7070"))
    """gRPC endpoint and logging."""
    tls: TlsConfig = field(default_factory=TlsConfig)
    """TLS and authentication of its ports and of its etcd connection."""
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    """Round timing and policy."""
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    """How long finished jobs, audit and usage records stay."""
    auth: AuthConfig = field(default_factory=AuthConfig)
    """Authentication of people."""
    maintenance: MaintenanceSettings = field(default_factory=MaintenanceSettings)
    """etcd compaction, defragmentation and NOSPACE recovery (pollux.service.maintenance)."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """What one principal, tenant and replica may hold: streams, PENDING jobs, submit rate
    (pollux.scheduler.limits)."""
    dashboard_listen: str = ""
    """host:port of the read-only web dashboard (pollux.scheduler.dashboard; port 0: a free
    one); empty: none. HTTPS with API tokens when TLS is on, like the gRPC port; without TLS
    loopback only, unless `tls.insecure`."""
    dashboard_sample_s: float = 10.0
    """Seconds between the dashboard's utilisation samples (kept in memory per replica)."""
    dashboard_samples: int = 8640
    """Utilisation samples each replica keeps (8640 at 10 s: a day); Prometheus keeps more."""

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        if not self.id:
            out.append("id: must not be empty")
        if self.dashboard_listen and not self.dashboard_listen.rpartition(":")[2].isdigit():
            out.append(f"dashboard_listen: {self.dashboard_listen!r} is not host:port")
        if not 0 < self.dashboard_sample_s <= 3600:
            out.append("dashboard_sample_s: must be > 0 and at most 3600")
        if not 1 <= self.dashboard_samples <= 1_000_000:
            out.append("dashboard_samples: must be between 1 and 1000000")
        if not 2 <= self.lease_ttl_s <= 300:
            out.append("lease_ttl_s: must be between 2 and 300 seconds")
        return out
