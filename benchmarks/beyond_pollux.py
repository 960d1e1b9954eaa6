"""Beyond Pollux: faithful Pollux against "pollux-jct" and its ablations, as a Pareto table.

For each variant and job load (the published workloads, or fresh ones re-sampled from their
job mix) it simulates every workload and prints mean and p99 JCT, makespan, restarts per job,
GPU-hours and finish-time fairness. The variants that are not policies of the registry
(`pollux.policy.registry`) are ablations: they live here only. docs/results.md ("The jct
mode") defines every column and option and holds the measured tables.

    python benchmarks/beyond_pollux.py --loads 0.5,1.0,1.5 --processes 2
    python benchmarks/beyond_pollux.py --loads 1.0 --restart-delays random:1
    python benchmarks/beyond_pollux.py --loads 1.0 --interval 480
    python benchmarks/beyond_pollux.py --loads 1.0,1.3 --fresh 8
    python benchmarks/beyond_pollux.py --variants faithful,jct-place --processes 2
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pollux.goodput import SyncModel
from pollux.policy.goodput_policy import PolluxParams, PolluxPolicy
from pollux.policy.jct import JctParams
from pollux.policy.registry import JCT_RESTARTS, PolicySpec, make_policy
from pollux.policy.types import Policy
from pollux.sim.application import Application, load_published_applications
from pollux.sim.simulator import SimConfig, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob, load_workload

LOADS = ("0.5", "1.0", "1.5")
JOBS_AT_1X = 160  # jobs per published workload at load 1.0
SIA_DELAYS = (15.0, 250.0)  # the range of restart delays Sia measured, seconds

EVENT_DELAY = 1.0
"""Seconds after a submission or completion at which the live scheduler runs a round
(`scheduling.debounce_s`'s default): the "-events" and "-place" variants simulate it."""


@dataclass(frozen=True, slots=True)
class Variant:
    """A policy mode and how its rounds are timed.

    Attributes:
        jct: The jct mode's settings; None: faithful Pollux.
        event_rounds: Also run a round `EVENT_DELAY` after each submission and completion,
            as the live scheduler does (`SimConfig.event_delay`), that does this
            (`SimConfig.event_rounds`): "full" re-plans every job, "place" only places jobs
            that never ran on free GPUs. None: every `--interval` only, as published.
    """

    jct: JctParams | None
    event_rounds: str | None = None


VARIANTS: dict[str, Variant] = {
    "faithful": Variant(None),  # the published system
    "faithful-events": Variant(None, event_rounds="full"),  # ... with full event rounds
    "faithful-place": Variant(None, event_rounds="place"),  # ... with placement event rounds
    "jct": Variant(JctParams()),
    "jct-events": Variant(JctParams(), event_rounds="full"),
    "jct-place": Variant(JctParams(), event_rounds="place"),  # the live jct mode's default
    # Ablations: one part of the jct mode at a time.
    "jct-no-weights": Variant(JctParams(rank_weights=False)),
    "jct-age-restart": Variant(JctParams(restart="age")),
    "jct-remaining-restart": Variant(JctParams(restart="remaining")),
    "jct-p-1": Variant(JctParams(p=-1.0)),
    "jct-expected": Variant(JctParams(restart="expected")),  # a memoryless allocation lifetime
    "jct-no-reversals": Variant(JctParams(reversals=False)),  # a move priced at its own pause
    "jct-expected-no-reversals": Variant(JctParams(restart="expected", reversals=False)),
    "jct-holding": Variant(JctParams(restart="holding")),  # the holding time for every job
    "jct-doubling": Variant(JctParams(explore_growth=2)),  # Pollux's exploration step
    "jct-doubling-holding": Variant(JctParams(explore_growth=2, restart="holding")),
    "jct-explore-8": Variant(JctParams(explore_growth=8)),
    # A new job starts on one GPU, as in Pollux, and pays a restart to grow (the mode before
    # `JctParams.explore_first`).
    "jct-start-1": Variant(JctParams(explore_first=False)),
    "jct-start-1-place": Variant(JctParams(explore_first=False), event_rounds="place"),
}


def variant_policy(variant: str, restart_delay: float) -> Policy[Any]:
    """The policy of a variant, valuing restarts at `restart_delay`.

    Faithful Pollux and the jct mode come from the registry ("pollux", "pollux-jct"); an
    ablation (other `JctParams`) is built here, the one place it exists.
    """
    jct = VARIANTS[variant].jct
    if jct is None:
        return make_policy(PolicySpec("pollux", restart_delay_s=restart_delay))
    if jct.restart in JCT_RESTARTS and jct == JctParams(restart=jct.restart):
        spec = PolicySpec("pollux-jct", restart_delay_s=restart_delay, jct_restart=jct.restart)
        return make_policy(spec)
    return PolluxPolicy(PolluxParams(restart_delay=restart_delay), jct=jct)


# -- workloads ----------------------------------------------------------------------------------


def published(load: str) -> list[tuple[str, list[WorkloadJob]]]:
    """The eight published workloads of a load, by name."""
    folder = default_data_root() / ("workloads" if load == "1.0" else f"workloads-{load}")
    files = sorted(folder.glob("*.csv"), key=lambda p: int(p.stem.rsplit("-", 1)[-1]))
    return [(p.stem, load_workload(p)) for p in files]


def fresh(load: float, count: int, seed: int) -> list[tuple[str, list[WorkloadJob]]]:
    """`count` workloads re-sampled from the published 1.0x job mix at `load`.

    Each job: an (application, tuned replicas, tuned batch) drawn from the pooled jobs of the
    eight 1.0x workloads, and a submission time drawn from their pooled submission times (the
    same arrival profile over the day); round(load × 160) jobs per workload.
    """
    pool = [job for _, jobs in published("1.0") for job in jobs]
    times = np.array([job.submission_time for job in pool])
    out = []
    for w in range(count):
        rng = np.random.default_rng([seed, w, round(load * 1000)])
        n = max(1, round(load * JOBS_AT_1X))
        picks = rng.integers(0, len(pool), size=n)
        when = np.sort(rng.choice(times, size=n, replace=True))
        jobs = [
            WorkloadJob(
                f"{pool[p].application}-{i}",
                float(t),
                pool[p].application,
                pool[p].num_replicas,
                pool[p].batch_size,
            )
            for i, (p, t) in enumerate(zip(picks.tolist(), when.tolist(), strict=True))
        ]
        out.append((f"fresh-{seed}-{w + 1}", jobs))
    return out


def write_workload(path: Path, jobs: Sequence[WorkloadJob]) -> None:
    """Save a workload in the published CSV format (for `pollux-sim run`)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["name", "time", "application", "num_replicas", "batch_size"])
        for job in jobs:
            writer.writerow(
                [job.name, int(job.submission_time), job.application, job.num_replicas,
                 job.batch_size]
            )  # fmt: skip


def draw_delays(seed: int, apps: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """One restart delay per application, log-uniform in Sia's measured 15-250 s."""
    rng = np.random.default_rng(seed)
    low, high = (math.log(x) for x in SIA_DELAYS)
    return tuple((app, round(math.exp(rng.uniform(low, high)), 1)) for app in sorted(apps))


# -- one simulation -------------------------------------------------------------------------------

_APPS: dict[str, Application] = {}


def _apps() -> dict[str, Application]:
    if not _APPS:
        _APPS.update(load_published_applications(default_data_root() / "traces"))
    return _APPS


@dataclass(frozen=True, slots=True)
class Task:
    """One workload under one variant."""

    variant: str
    load: str
    name: str
    jobs: tuple[WorkloadJob, ...]
    config: SimConfig


def run_task(task: Task) -> dict[str, Any]:
    """Simulate one task; per-job JCT, restarts, GPU-seconds, and the makespan."""
    policy = variant_policy(task.variant, task.config.restart_delay)
    started = time.perf_counter()
    result = simulate(list(task.jobs), _apps(), policy, task.config)
    return {
        "variant": task.variant,
        "load": task.load,
        "workload": task.name,
        "makespan": result.makespan,
        "wall_s": time.perf_counter() - started,
        "jobs": [
            {
                "name": job.name,
                "app": job.application,
                "submitted": job.submission_time,
                "jct": result.jcts[job.name],
                "restarts": result.restarts[job.name],
                "gpu_s": result.gpu_seconds[job.name],
            }
            for job in task.jobs
        ],
    }


def alone_jct(app: str, gpus: int, config: SimConfig) -> float:
    """JCT of one `app` job by itself under faithful Pollux on a cluster of `gpus` GPUs."""
    if gpus <= config.gpus_per_node:
        nodes, per_node = 1, gpus
    else:
        nodes, per_node = max(1, round(gpus / config.gpus_per_node)), config.gpus_per_node
    cluster = replace(config, nodes=nodes, gpus_per_node=per_node, tenants=())
    job = WorkloadJob(f"{app}-alone", 0.0, app, 1, 1)
    policy = variant_policy("faithful", cluster.restart_delay)
    return simulate([job], _apps(), policy, cluster).jcts[job.name]


def _alone_entry(args: tuple[str, int, SimConfig]) -> tuple[tuple[str, int], float]:
    app, gpus, config = args
    return (app, gpus), alone_jct(app, gpus, config)


def contention(jobs: Sequence[dict[str, Any]]) -> list[float]:
    """Each job's time-averaged number of active jobs (itself included) over its lifetime."""
    start = np.array([j["submitted"] for j in jobs])
    end = start + np.array([j["jct"] for j in jobs])
    out = []
    for s, e in zip(start.tolist(), end.tolist(), strict=True):
        overlap = np.clip(np.minimum(end, e) - np.maximum(start, s), 0.0, None)
        out.append(float(overlap.sum() / max(e - s, 1e-9)))
    return out


# -- tables ----------------------------------------------------------------------------------------


def summarise(results: list[dict[str, Any]], alone: dict[tuple[str, int], float]) -> dict[str, Any]:
    """The table row of one (variant, load) from its workloads' results."""
    total_gpus = None
    every = [job for r in results for job in r["jobs"]]
    averages = [float(np.mean([j["jct"] for j in r["jobs"]])) for r in results]
    ratios = []
    for r in results:
        total_gpus = r["gpus"]
        for job, n in zip(r["jobs"], contention(r["jobs"]), strict=True):
            share = max(1, round(total_gpus / n))
            ratios.append(job["jct"] / alone[(job["app"], share)])
    return {
        "mean_jct": float(np.mean(averages)),
        "p99_jct": float(np.percentile([j["jct"] for j in every], 99)),
        "makespan": float(np.mean([r["makespan"] for r in results])),
        "restarts_per_job": float(np.mean([j["restarts"] for j in every])),
        "p90_restarts": float(np.percentile([j["restarts"] for j in every], 90)),
        "gpu_hours": float(np.mean([sum(j["gpu_s"] for j in r["jobs"]) for r in results])) / 3600.0,
        "worst_ftf": float(max(ratios)),
        "median_ftf": float(np.median(ratios)),
        "workloads": len(results),
    }


def print_table(rows: dict[tuple[str, str], dict[str, Any]], title: str) -> None:
    """The Pareto table, with each variant's change against faithful at the same load."""
    print(title)
    head = (
        f"{'mode':<18}{'load':>5}{'mean JCT':>10}{'Δ':>7}{'p99 JCT':>10}{'Δ':>7}"
        f"{'makespan':>10}{'restarts':>9}{'p90 rst':>8}{'GPU-h':>8}{'worst FTF':>10}"
        f"{'med FTF':>8}"
    )
    print(head)
    print("-" * len(head))
    for (variant, load), row in rows.items():
        base = rows.get(("faithful", load))

        def delta(key: str, row: dict[str, Any] = row, base: dict[str, Any] | None = base) -> str:
            if base is None or base[key] == 0:
                return "-"
            return f"{(row[key] / base[key] - 1) * 100:+.1f}%"

        print(
            f"{variant:<18}{load:>5}{row['mean_jct']:>10.1f}{delta('mean_jct'):>7}"
            f"{row['p99_jct']:>10.0f}{delta('p99_jct'):>7}{row['makespan']:>10.0f}"
            f"{row['restarts_per_job']:>9.2f}{row['p90_restarts']:>8.0f}{row['gpu_hours']:>8.1f}"
            f"{row['worst_ftf']:>10.2f}{row['median_ftf']:>8.2f}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default=",".join(LOADS), help="comma-separated job loads")
    parser.add_argument(
        "--variants", default="faithful,jct", help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--workloads", default="", help="published workload numbers, e.g. 1,2 (default: all)"
    )
    parser.add_argument("--interval", type=float, default=60.0, help="seconds per round")
    parser.add_argument(
        "--restart-delays",
        default="flat",
        help="flat: SimConfig.restart_delay (30 s) for every job; random:SEED: one per "
        "application, log-uniform in 15-250 s",
    )
    parser.add_argument(
        "--undeclared", type=float, default=0.0, help="fraction of jobs declaring no size"
    )
    parser.add_argument(
        "--fresh",
        type=int,
        default=0,
        help="use this many fresh workloads per load (re-sampled job mix) instead",
    )
    parser.add_argument("--fresh-seed", type=int, default=2024, help="seed of fresh workloads")
    parser.add_argument(
        "--write-fresh", type=Path, help="also save the fresh workloads as CSVs in this folder"
    )
    parser.add_argument(
        "--share-profiles",
        action="store_true",
        help="seed each job with the newest earlier run's step times (SimConfig)",
    )
    parser.add_argument("--processes", type=int, default=None, help="default: one per CPU")
    parser.add_argument("--json", type=Path, help="also write every result here")
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    args.loads = [x for x in args.loads.split(",") if x]
    args.workloads = sorted({int(x) for x in args.workloads.split(",") if x})
    if args.restart_delays != "flat" and not args.restart_delays.startswith("random:"):
        parser.error("--restart-delays must be 'flat' or 'random:SEED'")
    return args


def make_config(args: argparse.Namespace) -> SimConfig:
    """The simulator settings of the command line (published ones otherwise)."""
    config = SimConfig(
        sync_model=SyncModel.LINEAR,
        interval=args.interval,
        undeclared_fraction=args.undeclared,
        share_profiles=args.share_profiles,
    )
    if args.restart_delays.startswith("random:"):
        seed = int(args.restart_delays.split(":", 1)[1])
        config = replace(config, restart_delays=draw_delays(seed, list(_apps())))
    return config


def build_tasks(args: argparse.Namespace, config: SimConfig) -> list[Task]:
    """Every (variant, load, workload) to simulate."""
    tasks = []
    for load in args.loads:
        if args.fresh:
            workloads = fresh(float(load), args.fresh, args.fresh_seed)
            if args.write_fresh:
                args.write_fresh.mkdir(parents=True, exist_ok=True)
                for name, jobs in workloads:
                    write_workload(args.write_fresh / f"{name}-{load}.csv", jobs)
        else:
            workloads = [
                (name, jobs)
                for name, jobs in published(load)
                if not args.workloads or int(name.rsplit("-", 1)[-1]) in args.workloads
            ]
        for variant in args.variants:
            events = VARIANTS[variant].event_rounds
            timed = (
                config
                if events is None
                else replace(config, event_delay=EVENT_DELAY, event_rounds=events)
            )
            tasks += [Task(variant, load, name, tuple(jobs), timed) for name, jobs in workloads]
    return tasks


def simulate_all(
    tasks: list[Task], config: SimConfig, processes: int | None
) -> tuple[list[dict[str, Any]], dict[tuple[str, int], float]]:
    """Every task's result, and the alone JCT of every (application, GPUs) they need."""
    workers = max(1, min(processes or os.cpu_count() or 1, len(tasks)))
    # One process per workload fills the CPUs; BLAS threads in each would spin against
    # each other (as in `pollux.sim.runner.run`).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    results: list[dict[str, Any]] = []
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        # Longest first: the 1.5x workloads dominate the wall time.
        order = sorted(tasks, key=lambda t: -len(t.jobs))
        for result in pool.imap_unordered(run_task, order):
            result["gpus"] = config.nodes * config.gpus_per_node
            results.append(result)
            avg = np.mean([j["jct"] for j in result["jobs"]])
            print(
                f"  {result['variant']} {result['load']}x {result['workload']}: "
                f"mean JCT {avg:.1f} s ({result['wall_s']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        needed = set()
        for r in results:
            for job, n in zip(r["jobs"], contention(r["jobs"]), strict=True):
                needed.add((job["app"], max(1, round(r["gpus"] / n))))
        alone = dict(pool.map(_alone_entry, [(a, g, config) for a, g in sorted(needed)]))
    return results, alone


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = make_config(args)
    started = time.perf_counter()
    results, alone = simulate_all(build_tasks(args, config), config, args.processes)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for variant in args.variants:
        for load in args.loads:
            mine = [r for r in results if r["variant"] == variant and r["load"] == load]
            mine.sort(key=lambda r: r["workload"])
            rows[(variant, load)] = summarise(mine, alone)
    delays = (
        ", ".join(f"{a} {d:g} s" for a, d in config.restart_delays)
        if config.restart_delays
        else f"{config.restart_delay:g} s for every job"
    )
    source = (
        f"{args.fresh} fresh workloads per load (seed {args.fresh_seed})"
        if args.fresh
        else "published workloads" + (f" {args.workloads}" if args.workloads else "")
    )
    print_table(
        rows,
        f"{source}; {args.interval:g} s rounds; restart delay {delays}; "
        f"{args.undeclared:.0%} of jobs declare no size",
    )
    print(f"total wall time: {time.perf_counter() - started:.0f} s")
    if args.json:
        payload = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "restart_delays": list(config.restart_delays),
            "rows": [{"variant": v, "load": lo, **row} for (v, lo), row in rows.items()],
            "results": results,
        }
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
