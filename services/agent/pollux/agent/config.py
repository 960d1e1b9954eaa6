"""The agent's configuration: one frozen dataclass tree.

Loaded with `pollux.service.config.load(AgentConfig, path, "POLLUX_AGENT")`, so
``POLLUX_AGENT_ETCD__ENDPOINT=10.0.0.5:2379`` or ``POLLUX_AGENT_HYSTERESIS=0.1`` override the
TOML file, and every invalid value is reported at once before the process starts.
"""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field

from pollux.service.config import EtcdConfig, ServerConfig, TlsConfig

_AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def default_agent_id() -> str:
    """``<hostname>-<pid>``: unique per process on a cluster, readable in logs and etcd."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "agent"
    return f"{host}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything an agent process needs; defaults suit a single-machine cluster."""

    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    """Where the cluster state lives."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """The agent's gRPC and metrics endpoints."""
    tls: TlsConfig = field(default_factory=TlsConfig)
    """TLS and authentication of its ports and of its etcd connection."""
    agent_id: str = field(default_factory=default_agent_id)
    """Unique id of this agent (its etcd registration key); ``hostname-pid`` by default."""
    lease_ttl_s: int = 10
    """Seconds the registration outlives a silent agent; its jobs move to others after that."""
    refit_min_interval_s: float = 30.0
    """Seconds between throughput refits of a job unless a new configuration was observed.

    Fitting costs tens of milliseconds of CPU; reports arrive every few seconds per replica,
    and the model changes little between them once a configuration has been seen.
    """
    hysteresis: float = 0.05
    """Relative predicted-goodput gain needed to change a shape's batch config (0.05 = 5 %).

    The published agent uses 5 %: smaller gains are within the model's error and not worth
    changing the batch (and its learning-rate schedule) for.
    """

    timeline_interval_s: float = 15.0
    """Seconds between two points of a job's timeline (a new generation always adds one).

    The timeline is written with the profile, so a point costs no extra etcd write; the
    interval bounds how fast its fixed number of points is used up.
    """

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem" (nested sections check themselves)."""
        out = []
        if not _AGENT_ID.fullmatch(self.agent_id):
            out.append(
                f"agent_id: {self.agent_id!r} must be 1-253 characters of [A-Za-z0-9._-] "
                "starting with a letter or digit"
            )
        if self.lease_ttl_s < 2:
            out.append(
                f"lease_ttl_s: must be >= 2 (keep-alives run every ttl/3), got {self.lease_ttl_s}"
            )
        if not math.isfinite(self.refit_min_interval_s) or self.refit_min_interval_s < 0:
            out.append(
                f"refit_min_interval_s: must be finite and >= 0, got {self.refit_min_interval_s}"
            )
        if not math.isfinite(self.timeline_interval_s) or self.timeline_interval_s < 0:
            out.append(
                f"timeline_interval_s: must be finite and >= 0, got {self.timeline_interval_s}"
            )
        if not math.isfinite(self.hysteresis) or not 0 <= self.hysteresis < 1:
            out.append(f"hysteresis: must be in [0, 1), got {self.hysteresis}")
        return out
