"""Time of one Pollux policy round on synthetic clusters, and greedy vs published NSGA-II.

Clusters of 64, 512 and 2048 GPUs (4 per node) with 16, 160 and 1000 active jobs. Each job has
a goodput model drawn from the ranges the published traces fit to, an age, a restart count
and a replica cap; about 97 % are running on random feasible allocations and the rest just
arrived. The states do not depend on the policy, so both optimisers see the same ones. A
round's time includes building every job's speedups from its model.

NSGA-II (population 100, 100 generations, as published) runs on the cases where it finishes
in reasonable time; the objective column is the power mean the policy maximises.

Faithful Pollux ("pollux") is timed: the objective must match NSGA-II's.

Usage: python benchmarks/policy_latency.py [--rounds N] [--no-nsga]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

try:
    from benchmarks.nsga2 import NsgaPolicy
except ImportError:  # run as a script: this folder is on the path
    from nsga2 import NsgaPolicy  # type: ignore[import-not-found, no-redef]
from pollux.goodput import GoodputModel, GradParams, PerfParams, SyncModel
from pollux.policy import ClusterState, JobInfo, NodeInfo
from pollux.policy.registry import PolicySpec, make_policy
from pollux.policy.types import Policy

GPUS_PER_NODE = 4
CLUSTERS = (64, 512, 2048)
JOB_COUNTS = (16, 160, 1000)
NSGA_CASES = {(64, 16), (64, 160)}


def random_model(rng: np.random.Generator) -> GoodputModel:
    """A model within the ranges fitted to the six published applications."""
    m0 = int(rng.choice([8, 12, 20, 128, 200, 256]))
    perf = PerfParams(
        alpha_c=float(rng.uniform(0.005, 0.3)),
        beta_c=float(rng.uniform(1e-5, 0.06)),
        alpha_n=float(rng.uniform(0.01, 1.5)),
        beta_n=float(rng.uniform(1e-4, 0.2)),
        alpha_r=float(rng.uniform(0.005, 0.3)),
        beta_r=float(rng.uniform(1e-4, 0.05)),
        gamma=float(rng.uniform(1.0, 2.5)),
        sync_model=SyncModel.LINEAR,
    )
    return GoodputModel(
        perf,
        GradParams(sqr=1.0, var=float(rng.uniform(0.1, 500))),
        init_batch_size=m0,
        max_batch_size=m0 * 32,
        min_atomic_bsz=max(1, m0 // 4),
        max_atomic_bsz=m0 * 4,
        accumulation=True,
    )


def new_job(rng: np.random.Generator, name: str, now: float) -> JobInfo:
    return JobInfo(
        name=name,
        submission_time=now - float(rng.uniform(30, 20000)),
        restarts=int(rng.integers(0, 6)),
        max_replicas=int(rng.choice([1, 4, 16, 64])),
        model=random_model(rng) if rng.random() < 0.9 else None,
    )


def random_allocation(
    rng: np.random.Generator, job: JobInfo, free: dict[str, int], names: list[str]
) -> tuple[str, ...]:
    """A random feasible allocation for a running job, packed onto nodes with room."""
    size = int(rng.integers(1, max(job.max_replicas, 1) + 1))
    alloc: list[str] = []
    for name in rng.permutation(names):
        take = min(free[name], size - len(alloc))
        if take > 0:
            alloc += [str(name)] * take
            free[str(name)] -= take
        if len(alloc) == size:
            break
    return tuple(sorted(alloc, key=names.index))


def rounds_for(gpus: int, num_jobs: int, count: int, seed: int = 0) -> list[ClusterState]:
    """`count` states of one cluster: random running allocations, about 3 % new arrivals.

    The states do not depend on any policy, so every optimiser is measured on the same ones.
    """
    rng = np.random.default_rng(seed)
    nodes = tuple(NodeInfo(f"n{i}", GPUS_PER_NODE) for i in range(gpus // GPUS_PER_NODE))
    names = [n.name for n in nodes]
    now = 100000.0
    states = []
    for r in range(count):
        free = {n.name: n.gpus for n in nodes}
        jobs = []
        for i in range(num_jobs):
            job = new_job(rng, f"j{r}-{i}", now)
            if rng.random() > 0.03:  # running, except the new arrivals
                job = JobInfo(
                    name=job.name,
                    submission_time=job.submission_time,
                    allocation=random_allocation(rng, job, free, names),
                    restarts=job.restarts,
                    max_replicas=job.max_replicas,
                    model=job.model,
                )
            jobs.append(job)
        states.append(ClusterState(now, nodes, tuple(jobs)))
        now += 60.0
    return states


def time_rounds(policy: Policy[Any], states: list[ClusterState]) -> tuple[np.ndarray, np.ndarray]:
    """Seconds and objective of each round."""
    times, objectives = [], []
    for state in states:
        start = time.perf_counter()
        decision = policy.allocate(state, None, np.random.default_rng(0))
        times.append(time.perf_counter() - start)
        objectives.append(decision.objective)
    return np.array(times), np.array(objectives)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds per case")
    parser.add_argument(
        "--nsga-rounds",
        type=int,
        default=3,
        help="rounds also solved by NSGA-II (it takes seconds each)",
    )
    parser.add_argument("--no-nsga", action="store_true", help="skip the NSGA-II baseline")
    args = parser.parse_args()
    print(
        f"{'GPUs':>5} {'jobs':>5} | {'greedy p50 (ms)':>15} {'p95':>8} | "
        f"{'NSGA-II p50 (ms)':>16} | objective on the same rounds: greedy / NSGA-II "
        "(greedy higher in k of n)"
    )
    for gpus in CLUSTERS:
        for num_jobs in JOB_COUNTS:
            states = rounds_for(gpus, num_jobs, args.rounds)
            times, objectives = time_rounds(make_policy(PolicySpec("pollux")), states)
            line = (
                f"{gpus:>5} {num_jobs:>5} | {np.median(times) * 1e3:>15.1f} "
                f"{np.percentile(times, 95) * 1e3:>8.1f} |"
            )
            if not args.no_nsga and (gpus, num_jobs) in NSGA_CASES:
                count = min(args.nsga_rounds, len(states))
                nsga_times, nsga = time_rounds(NsgaPolicy(), states[:count])
                ours = objectives[:count]
                wins = int(np.sum(ours >= nsga - 1e-12))
                line += (
                    f" {np.median(nsga_times) * 1e3:>16.1f} | {ours.mean():.4f} / "
                    f"{nsga.mean():.4f} ({wins} of {count})"
                )
            print(line, flush=True)


if __name__ == "__main__":
    main()
