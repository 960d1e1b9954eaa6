"""Fault suite: a local cluster running real jobs, hit by random faults, checked after each.

A `LocalCluster` (3 etcd members, 2 schedulers, 2 agents, 2 launchers with 2 CPU slots, leases
of 4 s) runs `chaos_job.py` jobs, `--jobs` active at a time. Each cycle submits two bad specs
(must be refused), injects one fault drawn at random (chaos_suite/inject.py: kill -9 or SIGSTOP
of a service, etcd member loss or restart, and as root full log, checkpoint and etcd disks on
small tmpfs mounts), heals it, waits for recovery and checks that no job was lost, stuck, run
twice at once, corrupted or failed, no slot leaked and every disk fault healed
(chaos_suite/checks.py). It prints the counts with recovery seconds (p50, max) per fault and
exits 1 if any count is not 0; docs/architecture.md §6 says what each fault shows.

    python benchmarks/chaos.py [--cycles 200] [--seed 1] [--jobs 3] [--short] [--json FILE]

`--short` runs each fault once, in order (the form the test suite runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pollux.service.local_cluster import LocalCluster

try:
    from benchmarks import disk_full
    from benchmarks.chaos_suite.checks import Checks
    from benchmarks.chaos_suite.inject import ALL_FAULTS, DISK_FAULTS, DISK_SIZES, FAULTS, Faults
    from benchmarks.chaos_suite.jobs import REGISTRATION_TTL_S, Jobs
    from benchmarks.chaos_suite.tally import MUST_BE_ZERO, Tally, report
except ImportError:  # run as a script (python benchmarks/chaos.py): this folder is on the path
    import disk_full  # type: ignore[import-not-found, no-redef]
    from chaos_suite.checks import Checks  # type: ignore[import-not-found, no-redef]
    from chaos_suite.inject import (  # type: ignore[import-not-found, no-redef]
        ALL_FAULTS,
        DISK_FAULTS,
        DISK_SIZES,
        FAULTS,
        Faults,
    )
    from chaos_suite.jobs import REGISTRATION_TTL_S, Jobs  # type: ignore[import-not-found, no-redef]
    from chaos_suite.tally import MUST_BE_ZERO, Tally, report  # type: ignore[import-not-found, no-redef]

__all__ = ["ALL_FAULTS", "DISK_FAULTS", "FAULTS", "MUST_BE_ZERO", "Suite", "main", "schedule"]


class Suite:
    """The cluster, the jobs submitted to it, the faults and the checks: one cycle at a time.

    Args:
        cluster: The started cluster.
        rng: Draws the jobs and the faults' victims.
        args: The command line (`--jobs`, `--steps`, `--stuck-after`).
        disk_targets: Each disk fault's filesystem (a small tmpfs), when run as root.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        rng: random.Random,
        args: argparse.Namespace,
        disk_targets: dict[str, Path],
    ) -> None:
        self.tally = Tally()
        self.jobs = Jobs(cluster, rng, self.tally, active=args.jobs, steps=args.steps)
        self.faults = Faults(
            cluster, rng, self.tally, leader=self.jobs.leader, disk_targets=disk_targets
        )
        self.checks = Checks(cluster, self.jobs, self.tally, stuck_after=args.stuck_after)

    def cycle(self, number: int, kind: str) -> None:
        """Top up the jobs, try bad specs, inject the fault, wait for recovery, check."""
        self.jobs.top_up()
        self.jobs.bad_submits()
        self.jobs.refresh()
        active = self.jobs.running()
        began = time.monotonic()
        if kind == "checkpoint_disk_full":
            self.jobs.full_checkpoints = True
        self.faults.inject(kind)
        healed_ns = time.time_ns()
        seconds = self.checks.recover(active, healed_ns)
        if kind in DISK_FAULTS:
            self.heal_disk(kind)
            if seconds is not None:
                seconds = (time.time_ns() - healed_ns) / 1e9
        if seconds is not None:
            self.tally.recovery[kind].append(seconds)
        self.checks.leaks()
        self.checks.files()
        self.tally.cycles += 1
        shown = "stuck" if seconds is None else f"recovered in {seconds:.1f} s"
        print(
            f"cycle {number:3d} {kind:20s} {time.monotonic() - began:5.1f} s, {shown}; "
            f"jobs {len(self.jobs.accepted)}, problems {self.tally.problems()}",
            flush=True,
        )

    def heal_disk(self, kind: str) -> None:
        """After the space is freed: the cluster works again with nothing restarted by hand.

        etcd: pollux-up's watch starts the dead member again. Logs: a running job's log is
        written again. Checkpoints: new jobs start and tick there.
        """
        cluster = self.faults.cluster
        if kind == "etcd_disk_full":
            deadline = time.monotonic() + 60
            while any(m.process.poll() is not None for m in cluster.etcd_procs):
                cluster.watch_etcd(lambda line: print(f"  {line}", flush=True))
                if time.monotonic() > deadline:
                    self.tally.unhealed += 1
                    self.tally.note("an etcd member did not start again once space was freed")
                    return
                time.sleep(0.5)
        elif kind == "log_disk_full":
            deadline = time.monotonic() + 30
            while not any(
                size > self.faults.log_sizes.get(path, 0)
                for path, size in self.faults.replica_log_sizes().items()
            ):
                if time.monotonic() > deadline:
                    self.tally.unhealed += 1
                    self.tally.note("no replica log was written again once space was freed")
                    return
                time.sleep(0.5)
        elif kind == "checkpoint_disk_full":
            self.jobs.refresh()
            self.jobs.full_checkpoints = False
            self.jobs.top_up()
            if self.checks.recover(self.jobs.running(), time.time_ns()) is None:
                self.tally.unhealed += 1
                self.tally.note("jobs did not run again once the checkpoint disk was freed")


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
            suite = Suite(cluster, rng, args, targets)
            for number, kind in enumerate(kinds, 1):
                suite.cycle(number, kind)
            suite.jobs.refresh()
            suite.checks.files()
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
