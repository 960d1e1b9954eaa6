"""After each fault: wait for the cluster to work again, then look for what must not be.

Recovery is seen in the jobs' own files (each job's checkpoint dir holds its `ticks` and the
agent `reports` it got), so a job counts as running again only once it has both ticked and
reported since the heal. Leaks are replica processes (by /proc) or launcher-reported replicas
of no current allocation that outlive the stop grace; overlaps and corruption come from the
jobs' `ticks` and `CORRUPT` files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc

from pollux.launcher.fence import FENCE_VAR
from pollux.service.local_cluster import LocalCluster
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lpb_grpc

from .jobs import REGISTRATION_TTL_S, STOP_GRACE_S, TERMINAL, Jobs
from .tally import Tally, overlapping_generations


def last_ns(directory: Path, name: str) -> int:
    """Wall-clock ns of the newest line of a job's `name` file (ticks, reports); 0: none."""
    try:
        with (directory / name).open("rb") as lines:
            lines.seek(0, os.SEEK_END)
            lines.seek(max(0, lines.tell() - 200))
            tail = lines.read().splitlines()
    except OSError:
        return 0
    for line in reversed(tail):
        parts = line.split()
        if name == "ticks" and len(parts) == 5:
            return int(parts[3])
        if name == "reports" and len(parts) == 2:
            return int(parts[0])
    return 0


class Checks:
    """The suite's checks of one cluster and its jobs.

    Args:
        cluster: The cluster.
        jobs: The suite's jobs.
        tally: Where problems are counted.
        stuck_after: Seconds a job may go without progress before it counts as stuck.
    """

    def __init__(self, cluster: LocalCluster, jobs: Jobs, tally: Tally, *, stuck_after: float):
        self.cluster = cluster
        self.jobs = jobs
        self.tally = tally
        self.stuck_after = stuck_after
        self.checkpoints = cluster.workdir / "checkpoints"

    def recover(self, active: list[str], healed_ns: int) -> float | None:
        """Seconds from the heal until the cluster works again; None if it did not in time.

        Works: a scheduler leads, and every job that was active has ended or has both ticked
        and had a metrics report taken by an agent since the heal.
        """
        start = time.monotonic()
        waiting = set(active)
        leader = ""
        refreshed = start
        while time.monotonic() - start < self.stuck_after:
            leader = leader or self.jobs.leader()
            waiting = {j for j in waiting if self.progress_ns(j) <= healed_ns}
            if waiting and time.monotonic() - refreshed > 3.0:
                refreshed = time.monotonic()
                listed = self.jobs.refresh()
                accepted = self.jobs.accepted
                waiting = {j for j in waiting if j in listed and accepted[j] not in TERMINAL}
            if leader and not waiting:
                return time.monotonic() - start
            time.sleep(0.2)
        if not leader:
            self.tally.stuck += 1
            self.tally.note("no scheduler leads")
        for job_id in sorted(waiting):
            self.tally.stuck += 1
            self.tally.note(f"job {job_id} stuck in {self.jobs.accepted.get(job_id)}")
        return None

    def progress_ns(self, job_id: str) -> int:
        """When the job last both ticked and had a report taken (wall-clock ns; 0: never)."""
        directory = self.checkpoints / job_id
        return min(last_ns(directory, "ticks"), last_ns(directory, "reports"))

    def replica_processes(self) -> dict[int, tuple[str, int]]:
        """Map pid -> (job, generation) of every live replica process of this cluster, by /proc."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = dict(
                    item.split(b"=", 1)
                    for item in (entry / "environ").read_bytes().split(b"\0")
                    if b"=" in item
                )
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, ValueError):
                continue
            if FENCE_VAR.encode() not in environ or state == "Z":
                continue
            directory = environ.get(b"POLLUX_CHECKPOINT_DIR", b"").decode()
            if not directory.startswith(str(self.checkpoints)):
                continue
            found[int(entry.name)] = (
                environ[b"POLLUX_JOB_ID"].decode(),
                int(environ[b"POLLUX_ALLOCATION_GEN"]),
            )
        return found

    def launcher_replicas(self) -> set[tuple[str, str, int]]:
        """(node, job, generation) of every replica a launcher reports as running."""
        out = set()
        for name, proc in self.cluster.procs.items():
            if not name.startswith("node") or proc.process.poll() is not None:
                continue
            with self.cluster.service_channel(proc.address) as channel:
                try:
                    reply = lpb_grpc.LauncherServiceStub(channel).ListReplicas(
                        lpb.ListReplicasRequest(), timeout=5.0
                    )
                except grpc.RpcError:
                    continue
            for status in reply.replicas:
                if status.phase == 1:  # REPLICA_PHASE_RUNNING
                    out.add((name, status.job_id, status.generation))
        return out

    def stale(self) -> tuple[set[int], set[tuple[str, str, int]]]:
        """Replica processes, and launcher-reported replicas, of no current allocation."""
        jobs = self.jobs.refresh()

        def current(job_id: str, generation: int) -> bool:
            job = jobs.get(job_id)
            if job is None or job.state in TERMINAL:
                return False
            allocation = job.allocation
            return allocation is not None and allocation.generation == generation

        processes = {p for p, (j, g) in self.replica_processes().items() if not current(j, g)}
        reported = {(n, j, g) for n, j, g in self.launcher_replicas() if not current(j, g)}
        return processes, reported

    def leaks(self) -> None:
        """Stale replicas still there after the stop grace (stops in flight are not leaks).

        Re-checked every second; what is stale at the first look and still stale once
        `STOP_GRACE_S` + a lease ttl have passed is a leak.
        """
        processes, reported = self.stale()
        deadline = time.monotonic() + STOP_GRACE_S + REGISTRATION_TTL_S
        while (processes or reported) and time.monotonic() < deadline:
            time.sleep(1.0)
            now_processes, now_reported = self.stale()
            processes &= now_processes
            reported &= now_reported
        for pid in sorted(processes):
            self.tally.leaked += 1
            self.tally.note(f"replica process {pid} outlived its allocation")
        for node, job_id, generation in sorted(reported):
            self.tally.leaked += 1
            self.tally.note(f"{node} holds a slot for {job_id} generation {generation}")

    def files(self) -> None:
        """Overlapping generations and corrupted checkpoints, from every job's directory."""
        self.tally.overlaps = 0
        self.tally.corrupted = 0
        for directory in sorted(self.checkpoints.glob("*")):
            if (directory / "CORRUPT").exists():
                self.tally.corrupted += 1
                self.tally.note(f"{directory.name}: {(directory / 'CORRUPT').read_text().strip()}")
            try:
                ticks = (directory / "ticks").read_bytes()
            except OSError:
                continue
            for old, new, seconds in overlapping_generations(ticks):
                self.tally.overlaps += 1
                self.tally.note(
                    f"{directory.name}: generations {old} and {new} overlapped {seconds:.2f} s"
                )
