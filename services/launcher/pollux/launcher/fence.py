"""The launcher-side fence: no replica runs on a node past its launcher's right to run it.

A launcher's right to run replicas is its node registration's lease. Once that lease may have
expired at etcd, the scheduler re-places the node's jobs, so a replica still running here would
train beside the next generation on the same checkpoint directory. Three mechanisms close that
window: a launcher that dies takes its replicas with it (their parent-death signal, replica.py);
one that stops acting but lives is covered by its watchdog process (watchdog.py), which kills
the replicas a margin before etcd can expire the lease; and a restarted launcher kills every
process still marked as this node's replica before it registers again (`kill_fenced`).

Replicas are found by their environment: each carries `FENCE_VAR`, a token derived from the
cluster (etcd endpoint and key root) and the node name, so other nodes' and other clusters'
replicas on the host are never touched, and a replica's children are found with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
from pathlib import Path

FENCE_VAR = "POLLUX_NODE_FENCE"
"""Environment variable marking a process as a replica of one node of one cluster."""


def fence_token(etcd_endpoint: str, root: str, node_name: str) -> str:
    """The marker of this node's replicas: readable node name plus a digest of the cluster."""
    digest = hashlib.sha256(f"{etcd_endpoint}\0{root}".encode()).hexdigest()[:16]
    return f"{node_name}@{digest}"


def fence_margin(ttl_s: float) -> float:
    """How long before a lease may expire its replicas are killed.

    The scheduler re-places a node's jobs only after etcd has expired its lease and the other
    launchers have seen that; killing a tenth of a ttl earlier (at least half a second) leaves
    time for the kill to complete before anything else can start.
    """
    return max(0.5, ttl_s / 10)


def fenced_processes(token: str, *, proc: Path = Path("/proc")) -> list[int]:
    """Pids of live processes whose environment carries `token`, other than this one."""
    marker = f"{FENCE_VAR}={token}".encode()
    own = {os.getpid(), os.getppid()}
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def kill_fenced(token: str, *, proc: Path = Path("/proc")) -> list[int]:
    """SIGKILL every process carrying `token`, and the process groups they lead; their pids.

    Killing the group as well reaches a replica's children that cleared their environment.
    """
    pids = fenced_processes(token, proc=proc)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids
