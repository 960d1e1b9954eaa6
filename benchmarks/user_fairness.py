"""One user floods the simulated cluster: what fairness between users changes for the others.

The jobs of published workloads belong to "user-0" (or, with `--owners N`, round-robin to
N users: the regular users); another user, "flood", submits a backlog at once
(`pollux.sim.workload.Flood`: copies of the workload's jobs, all at one time). Each policy
runs with fairness between users (`pollux.policy.owners`, the default) and without it (every
job alike, the ablation). Per policy it prints the regular users' mean JCT, their jobs' wait
for a first GPU, the flood's and every job's mean JCT, and the regular users' share of the
held GPUs while a flood job waits. Figures: docs/results.md ("Fairness between users").

    python benchmarks/user_fairness.py [--load 1.0] [--workloads 1,2,...] [--flood 100@3600]
        [--owners 1] [--policies pollux-jct,pollux,optimus,tiresias] [--processes 2]
    python benchmarks/user_fairness.py --flood none --owners 4   # no flood: what it costs
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from pollux.policy.registry import POLICY_NAMES, PolicySpec, make_policy
from pollux.policy.types import Policy
from pollux.sim.application import Application, load_published_applications
from pollux.sim.simulator import SimConfig, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import Flood, WorkloadJob, assign_owners, load_workload

EVENT_DELAY = 1.0
"""The live scheduler's debounce: every policy runs placement event rounds, as live."""
REGULAR, FLOOD = "regular", "flood"


@dataclass(frozen=True, slots=True)
class Task:
    """One workload under one policy, with or without fairness between users."""

    policy: str
    fair: bool
    workload: str
    jobs: tuple[WorkloadJob, ...]
    config: SimConfig


_APPS: dict[str, Application] = {}


def _apps() -> dict[str, Application]:
    if not _APPS:
        _APPS.update(load_published_applications(default_data_root() / "traces"))
    return _APPS


def group(owner: str) -> str:
    """The flooding user, or one of the regular ones."""
    return FLOOD if owner == FLOOD else REGULAR


class Observer:
    """Per-round bookkeeping: first allocations and GPU shares while the flood waits."""

    def __init__(self, owners: dict[str, str]) -> None:
        self.owners = owners
        self.seen: dict[str, int] = {}  # rounds that saw the job before it first held GPUs
        self.first: dict[str, float] = {}
        self.user_gpus = 0.0
        self.all_gpus = 0.0
        self.user_jobs = 0.0
        self.all_jobs = 0.0
        self.waiting_rounds = 0

    def __call__(self, record: dict[str, Any]) -> None:
        """Take in one round's record (`pollux.sim.simulator.RoundHook`)."""
        now = record["timestamp"]
        flood_waits = False
        held = {REGULAR: 0, FLOOD: 0}
        active = {REGULAR: 0, FLOOD: 0}
        for job in record["submitted_jobs"]:
            if job["completion_time"] is not None and job["completion_time"] <= now:
                continue
            name, owner, gpus = job["name"], self.owners[job["name"]], len(job["allocation"])
            active[owner] += 1
            held[owner] += gpus
            if name not in self.first:
                self.seen[name] = self.seen.get(name, 0) + 1
                if gpus:
                    self.first[name] = now
            if owner == FLOOD and not gpus:
                flood_waits = True
        if flood_waits and active[REGULAR]:
            self.waiting_rounds += 1
            self.user_gpus += held[REGULAR]
            self.all_gpus += held[REGULAR] + held[FLOOD]
            self.user_jobs += active[REGULAR]
            self.all_jobs += active[REGULAR] + active[FLOOD]


def every_job_alike(policy: Policy[Any]) -> Policy[Any]:
    """`policy` without fairness between users (the ablation: `user_fairness=False`)."""
    return cast(Policy[Any], dataclasses.replace(cast(Any, policy), user_fairness=False))


def run_task(task: Task) -> dict[str, Any]:
    """Simulate one task; per-job JCT, wait for the first GPU and rounds that saw it waiting."""
    policy = make_policy(PolicySpec(task.policy, restart_delay_s=task.config.restart_delay))
    if not task.fair:
        policy = every_job_alike(policy)
    observer = Observer({job.name: group(job.owner) for job in task.jobs})
    started = time.perf_counter()
    result = simulate(list(task.jobs), _apps(), policy, task.config, on_round=observer)
    return {
        "policy": task.policy,
        "fair": task.fair,
        "workload": task.workload,
        "wall_s": time.perf_counter() - started,
        "user_gpu_share": observer.user_gpus / max(observer.all_gpus, 1.0),
        "user_job_share": observer.user_jobs / max(observer.all_jobs, 1.0),
        "waiting_rounds": observer.waiting_rounds,
        "jobs": [
            {
                "owner": group(job.owner),
                "jct": result.jcts[job.name],
                "wait": observer.first[job.name] - job.submission_time,
                "rounds": observer.seen[job.name],
            }
            for job in task.jobs
        ],
    }


def summarise(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One row: over every workload of a (policy, fair) pair."""
    jobs = [job for r in results for job in r["jobs"]]
    mine = [job for job in jobs if job["owner"] == REGULAR]
    flood = [job for job in jobs if job["owner"] == FLOOD] or [{"jct": math.nan}]
    waits = np.array([job["wait"] for job in mine])
    rounds = np.array([job["rounds"] for job in mine])
    return {
        "user_jct": float(np.mean([job["jct"] for job in mine])),
        "wait_mean": float(waits.mean()),
        "wait_p90": float(np.percentile(waits, 90)),
        "wait_max": float(waits.max()),
        "rounds_p90": float(np.percentile(rounds, 90)),
        "rounds_max": float(rounds.max()),
        "flood_jct": float(np.mean([job["jct"] for job in flood])),
        "all_jct": float(np.mean([job["jct"] for job in jobs])),
        "gpu_share": float(np.mean([r["user_gpu_share"] for r in results])),
        "job_share": float(np.mean([r["user_job_share"] for r in results])),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", default="1.0", help="published job load: 0.5, 1.0 or 1.5")
    parser.add_argument("--workloads", default="6", help="published workload numbers, e.g. 1,6")
    parser.add_argument(
        "--flood",
        type=lambda text: None if text == "none" else Flood.parse(text),
        default=Flood(100, 3600.0),
        help="COUNT[@SECONDS], or none",
    )
    parser.add_argument("--owners", type=int, default=1, help="regular users (default 1)")
    parser.add_argument(
        "--policies",
        default="pollux-jct,pollux",
        help=f"comma-separated registry names, of {', '.join(POLICY_NAMES)}",
    )
    parser.add_argument("--processes", type=int, default=None, help="default: one per CPU")
    args = parser.parse_args(argv)
    args.policies = [p for p in args.policies.split(",") if p]
    unknown = sorted(set(args.policies) - set(POLICY_NAMES))
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {', '.join(POLICY_NAMES)}")
    args.workloads = sorted({int(x) for x in args.workloads.split(",") if x})
    return args


def build_tasks(args: argparse.Namespace) -> list[Task]:
    """Every (policy, fair, workload) to simulate."""
    folder = default_data_root() / ("workloads" if args.load == "1.0" else f"workloads-{args.load}")
    tasks = []
    config = SimConfig(event_delay=EVENT_DELAY, event_rounds="place")
    for number in args.workloads:
        workload = assign_owners(load_workload(folder / f"workload-{number}.csv"), args.owners)
        jobs = tuple(args.flood.added_to(workload) if args.flood else workload)
        for policy in args.policies:
            for fair in (True, False):
                tasks.append(Task(policy, fair, f"workload-{number}", jobs, config))
    return tasks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    tasks = build_tasks(args)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    workers = max(1, min(args.processes or os.cpu_count() or 1, len(tasks)))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = []
        for result in pool.imap_unordered(run_task, tasks):
            results.append(result)
            print(
                f"  {result['policy']} fair={result['fair']} {result['workload']}: "
                f"{result['wall_s']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    flood = args.flood
    what = f"{flood.jobs} copies of their jobs at {flood.at:g} s" if flood else "nothing"
    print(
        f"published {args.load}x workloads {args.workloads} as {args.owners} regular user(s); "
        f"'flood' submits {what}; 64 GPUs; 60 s rounds and placement event rounds "
        f"({EVENT_DELAY:g} s after each event), as live"
    )
    header = (
        "policy      users  regular JCT  wait mean/p90/max (s)   rounds p90/max  "
        "flood JCT   all JCT  GPU share (jobs)"
    )
    print(header)
    print("-" * len(header))
    for policy in args.policies:
        for fair in (True, False):
            mine = [r for r in results if r["policy"] == policy and r["fair"] == fair]
            row = summarise(mine)
            print(
                f"{policy:<11} {'fair' if fair else 'alike':<6} {row['user_jct']:>9.1f} s  "
                f"{row['wait_mean']:>6.0f} / {row['wait_p90']:>6.0f} / {row['wait_max']:>6.0f}"
                f"   {row['rounds_p90']:>5.0f} / {row['rounds_max']:>4.0f}  "
                f"{row['flood_jct']:>9.1f} s {row['all_jct']:>8.1f} s  "
                f"{row['gpu_share']:.2f} ({row['job_share']:.2f})"
            )
    print(f"total wall time: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
