"""The faults the suite injects into a running local cluster, each undone before it returns.

Process faults kill (SIGKILL of the service's process group: never its replicas) or stop a
service and start it again; etcd faults kill one member or all of them. Disk faults (root only,
small tmpfs mounts from benchmarks/disk_full.py) fill a filesystem for `DISK_HOLD_S` and free
it; an etcd member on a full disk is pressed with writes until it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pollux.service.local_cluster import LocalCluster
from pollux.service.store import Delete, Put, Store, StoreError

from .jobs import REGISTRATION_TTL_S
from .tally import Tally

try:
    from benchmarks import disk_full
except ImportError:  # run as a script (python benchmarks/chaos.py): its folder is on the path
    import disk_full  # type: ignore[import-not-found, no-redef]

FAULTS = (
    "scheduler_kill",
    "agent_kill",
    "launcher_kill",
    "launcher_stop",
    "etcd_member_kill",
    "etcd_restart",
    "etcd_then_leader",
)
DISK_FAULTS = ("log_disk_full", "checkpoint_disk_full", "etcd_disk_full")
"""Faults that fill a filesystem (root only: they run on small tmpfs mounts)."""
ALL_FAULTS = (*FAULTS, *DISK_FAULTS)
DISK_HOLD_S = 6.0
"""How long a disk fault keeps its filesystem full."""
DISK_SIZES = {
    "log_disk_full": 64 << 20,
    "checkpoint_disk_full": 64 << 20,
    "etcd_disk_full": 256 << 20,
}
"""Size of the tmpfs each disk fault fills."""
ETCD_DEATH_S = 60.0
"""How long etcd is pressed with writes for its member on the full disk to die."""


def say(line: str) -> None:
    """Print a line of the cluster's (pollux-up's etcd watch), indented under the cycle."""
    print(f"  {line}", flush=True)


class Faults:
    """Injects faults into one cluster.

    Args:
        cluster: The cluster.
        rng: Chooses the victims and how long a fault lasts.
        tally: Notes an etcd member that outlived its full disk.
        leader: The leading scheduler's id now ("" if none).
        disk_targets: Each disk fault's filesystem (a small tmpfs), when run as root.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        rng: random.Random,
        tally: Tally,
        *,
        leader: Callable[[], str],
        disk_targets: dict[str, Path],
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.tally = tally
        self.leader = leader
        self.disk_targets = disk_targets
        self.log_sizes: dict[Path, int] = {}
        """Every replica log's size just before the last disk fault freed its space."""

    def inject(self, kind: str) -> None:
        """Inject one fault of `kind` and undo it (restart, SIGCONT, free the space)."""
        cluster, rng = self.cluster, self.rng
        if kind in ("scheduler_kill", "etcd_then_leader"):
            if kind == "etcd_then_leader":
                self.restart_etcd()
            names = sorted(n for n in cluster.procs if n.startswith("scheduler"))
            leader = self.leader()
            victim = leader if leader in names and rng.random() < 0.5 else rng.choice(names)
            if kind == "etcd_then_leader" and leader in names:
                victim = leader
            self.kill(victim)
            cluster.start_scheduler(victim)
        elif kind == "agent_kill":
            victim = rng.choice(sorted(n for n in cluster.procs if n.startswith("agent")))
            self.kill(victim)
            cluster.start_agent(victim)
        elif kind == "launcher_kill":
            victim = rng.choice(sorted(n for n in cluster.procs if n.startswith("node")))
            self.kill(victim)
            cluster.start_launcher(victim)
        elif kind == "launcher_stop":
            victim = rng.choice(sorted(n for n in cluster.procs if n.startswith("node")))
            pid = cluster.procs[victim].process.pid
            os.kill(pid, signal.SIGSTOP)
            time.sleep(REGISTRATION_TTL_S + 2 + rng.random() * 2)
            os.kill(pid, signal.SIGCONT)
        elif kind == "etcd_member_kill":
            index = rng.randrange(len(cluster.etcd_procs))
            member = cluster.etcd_procs[index].process
            member.kill()
            member.wait()
            time.sleep(1 + rng.random() * 2)
            cluster.restart_etcd_member(index)
        elif kind == "etcd_restart":
            self.restart_etcd()
        elif kind in DISK_FAULTS:
            self.disk_fault(kind)
        else:
            raise ValueError(kind)

    def disk_fault(self, kind: str) -> None:
        """Fill the fault's filesystem, keep it full a while (etcd: until its member died)."""
        target = self.disk_targets[kind]
        disk_full.fill(target)
        if kind == "etcd_disk_full":
            self.press_etcd_until_a_member_dies()
        time.sleep(DISK_HOLD_S)
        self.log_sizes = self.replica_log_sizes()
        disk_full.free(target)

    def press_etcd_until_a_member_dies(self) -> None:
        """Write to etcd until the member on the full disk dies, and let pollux-up's watch say so.

        The cluster's own writes would kill it too, more slowly.
        """
        index = len(self.cluster.etcd_procs) - 1
        member = self.cluster.etcd_procs[index].process

        async def press() -> None:
            store = await Store.connect(
                self.cluster.etcd_endpoint, timeout_s=5.0, tls=self.cluster.etcd_tls()
            )
            prefix = b"/pollux-chaos/pressure/"
            try:
                deadline = time.monotonic() + ETCD_DEATH_S
                count = 0
                while member.poll() is None and time.monotonic() < deadline:
                    key = prefix + str(count % 200).encode()
                    with contextlib.suppress(StoreError):
                        await store.txn([Put(key, os.urandom(4096))])
                    count += 1
                with contextlib.suppress(StoreError):
                    await store.txn([Delete(prefix, prefix=True)])
            finally:
                await store.close()

        asyncio.run(press())
        if member.poll() is None:
            self.tally.note(f"etcd member {index} lived on a full disk for {ETCD_DEATH_S:.0f} s")
        self.cluster.watch_etcd(say)

    def replica_log_sizes(self) -> dict[Path, int]:
        """Size of every replica log file now."""
        sizes = {}
        for path in (self.cluster.workdir / "replica-logs").glob("*/*.log"):
            with contextlib.suppress(OSError):
                sizes[path] = path.stat().st_size
        return sizes

    def kill(self, name: str) -> None:
        """SIGKILL a service process (its process group: never its replicas or watchdog)."""
        process = self.cluster.procs[name].process
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def restart_etcd(self) -> None:
        """SIGKILL every etcd member, then start them all again."""
        for member in self.cluster.etcd_procs:
            member.process.kill()
            member.process.wait()
        time.sleep(0.5 + self.rng.random())
        self.cluster.restart_etcd()
