"""NodeLauncher configuration: a frozen tree, loaded by `pollux.service.config`.

TOML sections ``[etcd]`` and ``[server]`` plus the top-level settings below; environment
overrides use the prefix ``POLLUX_LAUNCHER`` (``POLLUX_LAUNCHER_GPUS=2``,
``POLLUX_LAUNCHER_ETCD__ENDPOINT=10.0.0.5:2379``). Command-line flags are applied on top by
pollux.service.entry, which then reports every problem of the tree at once.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

from pollux.launcher.containers import RUNTIMES
from pollux.launcher.job_policy import JobPolicy
from pollux.service.config import EtcdConfig, ServerConfig, TlsConfig

_NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}")
_LABEL_KEY = re.compile(r"[A-Za-z0-9._/-]{1,253}")


@dataclasses.dataclass(frozen=True, slots=True)
class LauncherConfig:
    """Everything one node's launcher needs."""

    etcd: EtcdConfig = dataclasses.field(default_factory=EtcdConfig)
    """Where the cluster state lives."""
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    """The launcher's gRPC endpoint (logs, replica table), health and metrics."""
    tls: TlsConfig = dataclasses.field(default_factory=TlsConfig)
    """TLS and authentication of its ports and of its etcd connection."""
    node_name: str = dataclasses.field(default_factory=socket.gethostname)
    """Unique node name the scheduler allocates to; the hostname by default."""
    gpus: int | None = None
    """Serve this many CPU slots instead of GPUs; unset means detect GPUs with nvidia-smi."""
    labels: tuple[str, ...] = ()
    """Node labels as "key=value" entries; "host=<addr>" sets the address peers use as
    MASTER_ADDR when it differs from the host of the advertised gRPC address."""
    lease_ttl_s: int = 10
    """TTL of the node's registration lease: a silent node is gone after this long."""
    checkpoint_root: Path = Path("/var/lib/pollux/checkpoints")
    """Replicas checkpoint under <checkpoint_root>/<job_id>; shared storage for multi-node
    clusters, since a job's next generation may run on other nodes."""
    log_root: Path = Path("/var/log/pollux/replicas")
    """Replica output goes to <log_root>/<job_id>/<generation>-<rank>.log."""
    scratch_root: Path = Path("/var/lib/pollux/scratch")
    """Node-local: <scratch_root>/<job_id> holds the replicas' private HOME and TMPDIR and a
    copy of the CA certificate (job_files.py)."""
    log_max_bytes: int = 64 * 1024 * 1024
    """A replica's log file is rotated at this size (replica_log.py)."""
    log_rotations: int = 2
    """Rotated log files kept per replica (.1, .2, ...); 0 truncates instead."""
    file_retention_s: float = 7 * 24 * 3600.0
    """A finished job's checkpoint, log and scratch directories are removed this long after
    it finished (job_files.py); its uid is released then too."""
    sweep_s: float = 300.0
    """How often finished jobs' files are looked for, and free space checked."""
    default_working_dir: Path | None = None
    """Working directory of replicas whose spec names none; unset means the launcher's own."""
    default_stop_grace_s: float = 30.0
    """Seconds between SIGTERM and SIGKILL when the job spec sets no stop_grace_s."""
    port_range: tuple[int, ...] = (29500, 29999)
    """Inclusive [low, high] range MASTER_PORT is chosen from (see placement.master_ports)."""
    log_ring_lines: int = 10_000
    """Output lines kept in memory per replica for StreamLogs (the file keeps everything)."""
    resync_s: float = 5.0
    """Full reconcile period, healing anything an event did not trigger."""
    barrier_poll_s: float = 0.5
    """Re-check period while a new generation waits for the old one to exit on other nodes."""
    replica_history: int = 256
    """Exited replicas kept for ListReplicas and StreamLogs."""
    job_policy: JobPolicy = dataclasses.field(default_factory=JobPolicy)
    """What a job may ask of this node: directories, environment, user (job_policy.py)."""
    runtime: str = "process"
    """How replicas run: "process" (plain processes; a job naming an image is refused) or
    "podman" / "docker" (a job naming an image runs in a container, others stay processes;
    containers.py)."""
    runtime_flags: tuple[str, ...] = ()
    """Extra arguments of every ``<runtime> run``, one argv element each, placed right after
    ``run`` (e.g. ["--runtime", "runc", "--ulimit", "nofile=1024:1024"])."""
    runtime_global_flags: tuple[str, ...] = ()
    """Arguments of every runtime command, placed before the subcommand (``run``, ``kill``,
    ``rm``, ``ps``, ``info``): a launcher in a container drives the node's runtime through its
    socket with ["--remote", "--url", "unix:///run/podman/podman.sock"] (docker: ["-H",
    "unix:///var/run/docker.sock"]); it must then see the checkpoint root, the CA file and
    the allowed mounts at the node's paths."""
    container_mounts_allowed: tuple[Path, ...] = ()
    """Host path prefixes a job's ``mounts`` may name (resolved; none by default: a job's
    container sees only its checkpoint directory of the host)."""

    def label_map(self) -> dict[str, str]:
        """Labels as a dict (entries validated by `problems`)."""
        return dict(entry.split("=", 1) for entry in self.labels if "=" in entry)

    def problems(self) -> list[str]:
        """Every invalid top-level value, as "field: problem"."""
        out = self._identity_problems()
        if self.lease_ttl_s < 2:
            out.append("lease_ttl_s: must be >= 2 (keep-alives are sent every ttl/3)")
        for name in ("checkpoint_root", "log_root", "scratch_root"):
            if not str(getattr(self, name)):
                out.append(f"{name}: must be a directory path")
        if self.log_max_bytes < 4096:
            out.append("log_max_bytes: must be >= 4096")
        if not 0 <= self.log_rotations <= 100:
            out.append("log_rotations: must be in [0, 100]")
        if self.file_retention_s < 0:
            out.append("file_retention_s: must be >= 0")
        if self.default_stop_grace_s < 0:
            out.append("default_stop_grace_s: must be >= 0")
        low_high = self.port_range
        if len(low_high) != 2:
            out.append(f"port_range: {list(low_high)} must be [low, high]")
        elif not 1024 <= low_high[0] <= low_high[1] <= 65535:
            out.append(f"port_range: {list(low_high)} must satisfy 1024 <= low <= high <= 65535")
        positive = {
            "log_ring_lines": self.log_ring_lines,
            "resync_s": self.resync_s,
            "barrier_poll_s": self.barrier_poll_s,
            "sweep_s": self.sweep_s,
        }
        out.extend(f"{name}: must be > 0" for name, value in positive.items() if value <= 0)
        if self.replica_history < 0:
            out.append("replica_history: must be >= 0")
        return out + self._runtime_problems()

    def _runtime_problems(self) -> list[str]:
        out = []
        if self.runtime not in RUNTIMES:
            out.append(f"runtime: {self.runtime!r} must be one of {', '.join(RUNTIMES)}")
        for name in ("runtime_flags", "runtime_global_flags"):
            for flag in getattr(self, name):
                if not flag or "\0" in flag:
                    out.append(f"{name}: {flag!r} must be a non-empty argument without NUL")
        for prefix in self.container_mounts_allowed:
            if not prefix.is_absolute():
                out.append(f"container_mounts_allowed: {str(prefix)!r} must be an absolute path")
        return out

    def _identity_problems(self) -> list[str]:
        out = []
        if not _NODE_NAME.fullmatch(self.node_name):
            out.append(f"node_name: {self.node_name!r} must be 1-253 characters of [A-Za-z0-9._-]")
        if self.gpus is not None and self.gpus < 1:
            out.append(f"gpus: {self.gpus} CPU slots; must be >= 1 (or unset to detect GPUs)")
        for entry in self.labels:
            key, sep, _ = entry.partition("=")
            if not sep or not _LABEL_KEY.fullmatch(key):
                out.append(f"labels: {entry!r} is not key=value with key of [A-Za-z0-9._/-]")
        return out
