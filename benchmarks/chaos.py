"""Fault suite: a local cluster running real jobs, hit by random faults, checked after each.

A `LocalCluster` on loopback (3 etcd members, 2 scheduler replicas, 2 agents, 2 launchers with
2 CPU slots each; agent and launcher leases of 4 s) runs `chaos_job.py` jobs submitted through
the API, kept at `--jobs` active at a time. Each cycle injects one fault, chosen at random:

    scheduler_kill     kill -9 a scheduler replica (the leader half the time), restart it
    agent_kill         kill -9 an agent, restart it (on a new port: replicas must follow)
    launcher_kill      kill -9 a launcher, restart it
    launcher_stop      SIGSTOP a launcher past its lease, then SIGCONT
    etcd_member_kill   kill -9 one of the 3 etcd members, restart it
    etcd_restart       kill -9 every etcd member, restart them
    etcd_then_leader   restart etcd as above, then kill -9 the leading scheduler
    log_disk_full      fill the replica-log filesystem for a while, then free it
    checkpoint_disk_full  fill the checkpoint filesystem for a while, then free it
    etcd_disk_full     fill the filesystem under one etcd member until it dies, then free it

The disk faults need root: the suite then runs on small tmpfs mounts (benchmarks/disk_full.py)
over the replica logs (64 MiB), the checkpoints (64 MiB) and the last etcd member's data dir
(256 MiB), and fills one with a ballast file for `DISK_HOLD_S`; as another user they are
skipped, saying so. What must hold: a full log disk costs log lines only (no job fails, logs are
written again once freed); a full checkpoint disk fails the jobs that write there with the
reason (counted as `disk_failed_jobs`, not `failed`: restarting them onto the full disk would
only crash again) and, once freed, new jobs run; a full etcd disk kills that member, which
`pollux-up`'s watch says in one line and starts again once freed, without losing quorum. In
every case no slot leaks and nothing is restarted by hand.

and, before each fault, submits an oversized spec and one with a NUL byte (both must be
refused with INVALID_ARGUMENT). After the fault is healed the cycle waits for recovery: a
scheduler leads and every job that was active has ticked again (or ended). Then it checks:

    lost        an accepted job the API no longer knows
    stuck       a job that neither ended nor progressed within `--stuck-after` seconds
    overlaps    two generations of one job that ticked at the same time (from the ticks files)
    corrupted   a checkpoint that failed its digest (the job writes CORRUPT)
    leaked      a replica alive on a node (by /proc, or by its launcher's ListReplicas)
                that is not part of its job's current allocation, after the stop grace
    failed      a job that ended FAILED (no fault should fail a job)
    bad_accepted an oversized or NUL-byte spec that was accepted
    unhealed    a disk fault the cluster did not recover from once space was freed

and prints the counts with recovery seconds (p50, max) per fault. Exit status 1 if any count
is not 0. Everything runs on loopback under `--workdir` and is stopped at the end.

    python benchmarks/chaos.py [--cycles 200] [--seed 1] [--jobs 3] [--short] [--json FILE]

`--short` runs each fault once, in order (the form the test suite runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from pollux.client import Client, Job, JobSpec
from pollux.client.errors import InvalidArgumentError, NotFoundError, PolluxError
from pollux.launcher.fence import FENCE_VAR
from pollux.service.local_cluster import LocalCluster
from pollux.service.store import Delete, Put, Store, StoreError
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lpb_grpc

try:
    from benchmarks import disk_full
except ImportError:  # run as a script (python benchmarks/chaos.py): this folder is on the path
    import disk_full  # type: ignore[import-not-found, no-redef]

T = TypeVar("T")
JOB = Path(__file__).resolve().parent / "chaos_job.py"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
REGISTRATION_TTL_S = 4
STOP_GRACE_S = 5
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


@dataclass
class Tally:
    """What the suite counts."""

    cycles: int = 0
    lost: int = 0
    stuck: int = 0
    overlaps: int = 0
    corrupted: int = 0
    leaked: int = 0
    failed: int = 0
    bad_accepted: int = 0
    unhealed: int = 0
    disk_failed: int = 0
    """Jobs failed by a full checkpoint disk, saying so (what must happen: not a problem)."""
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    findings: list[str] = field(default_factory=list)

    def problems(self) -> int:
        """Every count that must be 0, summed."""
        counts = (self.lost, self.stuck, self.overlaps, self.corrupted, self.leaked)
        return sum(counts) + self.failed + self.bad_accepted + self.unhealed

    def note(self, what: str) -> None:
        """Record and print one finding."""
        self.findings.append(what)
        print(f"  FINDING: {what}", flush=True)


class Suite:
    """The cluster, the jobs submitted to it, and the checks."""

    def __init__(self, cluster: LocalCluster, rng: random.Random, args: argparse.Namespace):
        self.cluster = cluster
        self.rng = rng
        self.args = args
        self.tally = Tally()
        self.accepted: dict[str, str] = {}
        """Job id -> last state seen."""
        self.checkpoints = cluster.workdir / "checkpoints"
        self.disk_targets: dict[str, Path] = {}
        """Each disk fault's filesystem (a small tmpfs), when the suite runs as root."""
        self.full_checkpoints = False
        """A full checkpoint disk is (or was, this cycle) injected: jobs may fail of it."""
        self.log_sizes: dict[Path, int] = {}

    # -- API ----------------------------------------------------------------------------------

    def client(self) -> Client:
        """A client of the scheduler replicas alive now (their ports change on restart)."""
        return self.cluster.client(timeout_s=5.0)

    def with_client(self, call: Callable[[Client], T], attempts: int = 30) -> T:
        """Call the API, retrying through failovers (UNAVAILABLE) for up to ~30 s."""
        for attempt in range(attempts):
            try:
                with self.client() as client:
                    return call(client)
            except PolluxError as error:
                if isinstance(error, InvalidArgumentError | NotFoundError):
                    raise
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def top_up(self) -> None:
        """Submit jobs until `--jobs` are active."""
        active = [j for j, state in self.accepted.items() if state not in TERMINAL]
        for _ in range(self.args.jobs - len(active)):
            steps = self.rng.randint(self.args.steps // 2, self.args.steps)
            spec = JobSpec(
                name="chaos",
                command=(sys.executable, str(JOB), str(steps)),
                initial_batch_size=64,
                max_batch_size=512,
                max_replicas=self.rng.choice((1, 2, 4)),
                stop_grace_s=STOP_GRACE_S,
            )
            job = self.submit(spec, uuid.uuid4().hex)
            self.accepted[job.id] = job.state

    def submit(self, spec: JobSpec, request_id: str) -> Job:
        """Submit through failovers (the request id makes retries create one job)."""

        def call(client: Client) -> Job:
            return client.submit(spec, request_id=request_id)

        job: Job = self.with_client(call)
        return job

    def bad_submits(self) -> None:
        """An oversized spec and a NUL-byte spec must both be refused."""
        bad = [
            JobSpec(
                name="oversized", command=("true",), initial_batch_size=8, env={"X": "x" * 70_000}
            ),
            JobSpec(name="nul", command=("true",), initial_batch_size=8, working_dir="/tmp\0x"),
        ]
        for spec in bad:
            try:
                job = self.submit(spec, uuid.uuid4().hex)
            except InvalidArgumentError:
                continue
            self.tally.bad_accepted += 1
            self.tally.note(f"bad spec {spec.name!r} accepted as {job.id}")

    def refresh(self) -> dict[str, Job]:
        """Every accepted job as the API lists it now (pages of ListJobs); counts lost ones.

        The bad specs' names are never listed: the suite's jobs are all named "chaos".
        """

        def call(client: Client) -> dict[str, Job]:
            return {job.id: job for job in client.list_jobs(name_prefix="chaos", page_size=500)}

        listed: dict[str, Job] = self.with_client(call)
        for job_id in list(self.accepted):
            job = listed.get(job_id)
            if job is None:
                self.tally.lost += 1
                self.tally.note(f"job {job_id} lost")
                del self.accepted[job_id]
                continue
            if job.state == "FAILED" and self.accepted[job_id] != "FAILED":
                reason = job.history[-1].reason
                if self.full_checkpoints and "on a full disk" in reason:
                    self.tally.disk_failed += 1
                    print(f"  job {job_id} failed as it should: {reason[:160]}", flush=True)
                else:
                    self.tally.failed += 1
                    self.tally.note(f"job {job_id} failed: {reason}")
            self.accepted[job_id] = job.state
        return {job_id: listed[job_id] for job_id in self.accepted}

    def leader(self) -> str:
        """The leading scheduler's id, or "" (none leads, or none answers)."""
        try:
            with self.client() as client:
                return client.cluster_status().leader_id
        except PolluxError:
            return ""

    # -- faults -------------------------------------------------------------------------------

    def fault(self, kind: str) -> None:
        """Inject one fault of `kind` and heal it (restart, SIGCONT)."""
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

    # -- disk faults ----------------------------------------------------------------------------

    def disk_fault(self, kind: str) -> None:
        """Fill the fault's filesystem, keep it full a while (etcd: until its member died)."""
        target = self.disk_targets[kind]
        if kind == "checkpoint_disk_full":
            self.full_checkpoints = True
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
        self.cluster.watch_etcd(lambda line: print(f"  {line}", flush=True))

    def heal_disk(self, kind: str) -> None:
        """After the space is freed: the cluster works again with nothing restarted by hand.

        etcd: pollux-up's watch starts the dead member again. Logs: a running job's log is
        written again. Checkpoints: new jobs start and tick there.
        """
        if kind == "etcd_disk_full":
            deadline = time.monotonic() + 60
            while any(m.process.poll() is not None for m in self.cluster.etcd_procs):
                self.cluster.watch_etcd(lambda line: print(f"  {line}", flush=True))
                if time.monotonic() > deadline:
                    self.tally.unhealed += 1
                    self.tally.note("an etcd member did not start again once space was freed")
                    return
                time.sleep(0.5)
        elif kind == "log_disk_full":
            deadline = time.monotonic() + 30
            while not any(
                size > self.log_sizes.get(path, 0)
                for path, size in self.replica_log_sizes().items()
            ):
                if time.monotonic() > deadline:
                    self.tally.unhealed += 1
                    self.tally.note("no replica log was written again once space was freed")
                    return
                time.sleep(0.5)
        elif kind == "checkpoint_disk_full":
            self.refresh()
            self.full_checkpoints = False
            self.top_up()
            fresh = [j for j, state in self.accepted.items() if state not in TERMINAL]
            if self.recover(fresh, time.time_ns()) is None:
                self.tally.unhealed += 1
                self.tally.note("jobs did not run again once the checkpoint disk was freed")

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

    # -- checks -------------------------------------------------------------------------------

    def last_ns(self, job_id: str, name: str) -> int:
        """Wall-clock ns of the newest line of the job's `name` file (ticks, reports); 0: none."""
        try:
            with (self.checkpoints / job_id / name).open("rb") as lines:
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

    def recover(self, active: list[str], healed_ns: int) -> float | None:
        """Seconds from the heal until the cluster works again; None if it did not in time.

        Works: a scheduler leads, and every job that was active has ended or has both ticked
        and had a metrics report taken by an agent since the heal.
        """
        start = time.monotonic()
        waiting = set(active)
        leader = ""
        refreshed = start
        while time.monotonic() - start < self.args.stuck_after:
            leader = leader or self.leader()
            waiting = {
                j
                for j in waiting
                if min(self.last_ns(j, "ticks"), self.last_ns(j, "reports")) <= healed_ns
            }
            if waiting and time.monotonic() - refreshed > 3.0:
                refreshed = time.monotonic()
                jobs = self.refresh()
                waiting = {j for j in waiting if j in jobs and self.accepted[j] not in TERMINAL}
            if leader and not waiting:
                return time.monotonic() - start
            time.sleep(0.2)
        if not leader:
            self.tally.stuck += 1
            self.tally.note("no scheduler leads")
        for job_id in sorted(waiting):
            self.tally.stuck += 1
            self.tally.note(f"job {job_id} stuck in {self.accepted.get(job_id)}")
        return None

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
        jobs = self.refresh()

        def current(job_id: str, generation: int) -> bool:
            job = jobs.get(job_id)
            if job is None or job.state in TERMINAL:
                return False
            allocation = job.allocation
            return allocation is not None and allocation.generation == generation

        processes = {p for p, (j, g) in self.replica_processes().items() if not current(j, g)}
        reported = {(n, j, g) for n, j, g in self.launcher_replicas() if not current(j, g)}
        return processes, reported

    def check_leaks(self) -> None:
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

    def check_files(self) -> None:
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

    # -- the loop -----------------------------------------------------------------------------

    def cycle(self, number: int, kind: str) -> None:
        """Top up the jobs, try bad specs, inject the fault, wait for recovery, check."""
        self.top_up()
        self.bad_submits()
        self.refresh()
        active = [j for j, state in self.accepted.items() if state not in TERMINAL]
        began = time.monotonic()
        self.fault(kind)
        healed_ns = time.time_ns()
        seconds = self.recover(active, healed_ns)
        if kind in DISK_FAULTS:
            self.heal_disk(kind)
            if seconds is not None:
                seconds = (time.time_ns() - healed_ns) / 1e9
        if seconds is not None:
            self.tally.recovery[kind].append(seconds)
        self.check_leaks()
        self.check_files()
        self.tally.cycles += 1
        shown = "stuck" if seconds is None else f"recovered in {seconds:.1f} s"
        print(
            f"cycle {number:3d} {kind:20s} {time.monotonic() - began:5.1f} s, {shown}; "
            f"jobs {len(self.accepted)}, problems {self.tally.problems()}",
            flush=True,
        )


def overlapping_generations(ticks: bytes) -> list[tuple[int, int, float]]:
    """(older, newer, seconds) for each pair of consecutive generations that ticked at once.

    Generation g and g+k overlap when g's last tick is later than g+k's first; ticks are a
    few hundred ms apart, so any overlap longer than that shows.
    """
    spans: dict[int, tuple[int, int]] = {}
    for line in ticks.splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue  # a line cut short by a kill
        generation, stamp = int(parts[0]), int(parts[3])
        first, last = spans.get(generation, (stamp, stamp))
        spans[generation] = (min(first, stamp), max(last, stamp))
    found = []
    ordered = sorted(spans.items())
    for (old, (_, old_last)), (new, (new_first, _)) in itertools.pairwise(ordered):
        if old_last > new_first:
            found.append((old, new, (old_last - new_first) / 1e9))
    return found


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


MUST_BE_ZERO = (
    "lost",
    "stuck",
    "overlapping_generations",
    "corrupted_checkpoints",
    "leaked_slots",
    "failed_jobs",
    "bad_specs_accepted",
    "unhealed_disk_faults",
)
"""The figures (keys of `report`'s result) the suite fails on unless 0."""


def report(tally: Tally, wall_s: float) -> dict[str, object]:
    """Print the figures; returns them (for --json)."""
    every = [s for values in tally.recovery.values() for s in values]
    figures: dict[str, object] = {
        "cycles": tally.cycles,
        "lost": tally.lost,
        "stuck": tally.stuck,
        "overlapping_generations": tally.overlaps,
        "corrupted_checkpoints": tally.corrupted,
        "leaked_slots": tally.leaked,
        "failed_jobs": tally.failed,
        "bad_specs_accepted": tally.bad_accepted,
        "unhealed_disk_faults": tally.unhealed,
        "disk_failed_jobs": tally.disk_failed,
        "recovery_p50_s": round(statistics.median(every), 2) if every else None,
        "recovery_max_s": round(max(every), 2) if every else None,
        "wall_s": round(wall_s, 1),
        "by_fault": {
            kind: {
                "cycles": len(values),
                "p50_s": round(statistics.median(values), 2),
                "max_s": round(max(values), 2),
            }
            for kind, values in sorted(tally.recovery.items())
        },
        "findings": tally.findings,
    }
    print()
    for key in list(figures)[:13]:
        print(f"{key:26s} {figures[key]}")
    print(f"{'fault':20s} {'cycles':>6s} {'p50 s':>7s} {'max s':>7s}")
    for kind, row in figures["by_fault"].items():  # type: ignore[attr-defined]
        print(f"{kind:20s} {row['cycles']:6d} {row['p50_s']:7.2f} {row['max_s']:7.2f}")
    return figures


def schedule(faults: tuple[str, ...], cycles: int, rng: random.Random) -> list[str]:
    """`cycles` faults drawn at random, every fault at least once when there are enough."""
    kinds = [rng.choice(faults) for _ in range(max(0, cycles - len(faults)))]
    kinds += list(faults) if cycles >= len(faults) else rng.sample(faults, cycles)
    rng.shuffle(kinds)
    return kinds


def disk_targets(cluster: LocalCluster) -> dict[str, Path]:
    """The directory each disk fault fills, made with the mode its owner gives it."""
    workdir = cluster.workdir
    targets = {
        "log_disk_full": (workdir / "replica-logs", 0o700),
        "checkpoint_disk_full": (workdir / "checkpoints", 0o711),
        "etcd_disk_full": (cluster.etcd_data_dir(cluster.etcd_members - 1), 0o700),
    }
    for directory, mode in targets.values():
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(mode)
    return {kind: directory for kind, (directory, _) in targets.items()}


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=3, help="jobs kept active")
    parser.add_argument("--steps", type=int, default=400, help="most steps of a job (0.2 s each)")
    parser.add_argument("--stuck-after", type=float, default=90.0, help="progress bound, s")
    parser.add_argument("--short", action="store_true", help="each fault once, in order")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pollux-chaos-"))
    rng = random.Random(args.seed)
    cluster = LocalCluster(
        workdir,
        nodes=2,
        gpus_per_node=2,
        schedulers=2,
        agents=2,
        interval_s=2.0,
        lease_ttl_s=3,
        restart_delay_s=1.0,
        etcd_members=3,
        registration_ttl_s=REGISTRATION_TTL_S,
    )
    skipped = disk_full.unavailable()
    faults = FAULTS if skipped else ALL_FAULTS
    kinds = list(faults) if args.short else schedule(faults, args.cycles, rng)
    began = time.monotonic()
    signal.signal(signal.SIGTERM, _terminate)  # stop the cluster on the way out
    print(f"fault suite: {len(kinds)} cycles in {workdir}", flush=True)
    if skipped:
        print(f"disk faults ({', '.join(DISK_FAULTS)}) skipped: {skipped}", flush=True)
    targets = {} if skipped else disk_targets(cluster)
    try:
        for kind, target in targets.items():
            disk_full.mount_small(target, DISK_SIZES[kind])
        with cluster:
            suite = Suite(cluster, rng, args)
            suite.disk_targets = targets
            for number, kind in enumerate(kinds, 1):
                suite.cycle(number, kind)
            suite.refresh()
            suite.check_files()
    finally:
        for target in targets.values():
            with contextlib.suppress(OSError, subprocess.CalledProcessError):
                disk_full.unmount(target)
    figures = report(suite.tally, time.monotonic() - began)
    figures["disk_faults_skipped"] = skipped
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if suite.tally.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
