"""Predicted completion times: the cluster simulated forward with the policy's own rounds.

A job's time left on its current GPUs ignores that other jobs finish and free GPUs, and that
the policy then re-allocates. `forecast` plays the rounds forward from one `ClusterState`
with the policy the scheduler runs: each round it asks the policy for allocations, charges
every moved job its restart pause, advances every job by the goodput its model predicts
(``goodput / M0`` M0-steps per second, at the batch it would choose) and removes the jobs
that finish. No future arrivals are assumed, so a busy cluster's predictions are optimistic.
A job's replica limit grows as the policy's `replica_limit` lets it, up to its hard cap
(`caps`), the cluster and its batch limits. Only jobs that declare their size and have a
goodput model get a prediction; the others still hold and take GPUs but never finish.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from pollux.goodput import best_batch
from pollux.policy.jct import has_held_gpus, resize_history
from pollux.policy.types import Allocation, ClusterState, JobInfo, M, Policy

HORIZON_S = 14 * 86400.0
"""How far ahead a forecast looks: a job not done by then gets no prediction."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """What `forecast` predicted.

    Attributes:
        completion: Predicted completion time per job (the state's clock, seconds), for the
            jobs that declare their size, have a model and finish within the horizon.
        rounds: Rounds simulated.
    """

    completion: dict[str, float]
    rounds: int


def progress_rate(job: JobInfo, allocation: Allocation) -> float:
    """M0-steps per second `job` makes on `allocation` (0 without a model or GPUs)."""
    model = job.model
    if model is None or not allocation:
        return 0.0
    choice = best_batch(model, len(set(allocation)), len(allocation))
    return float(choice.goodput) / model.init_batch_size


def forecast(
    state: ClusterState,
    policy: Policy[M],
    *,
    round_s: float,
    restart_delay_s: float,
    horizon_s: float = HORIZON_S,
    max_rounds: int = 10_000,
    seed: int = 0,
    caps: Mapping[str, int] | None = None,
    until: str | None = None,
) -> Forecast:
    """Play the policy's rounds forward from `state` (module docstring).

    Args:
        state: The cluster now.
        policy: The policy the scheduler runs.
        round_s: Seconds between rounds in the forecast (the scheduler's interval, or coarser
            to bound the cost: a round is one call of the policy).
        restart_delay_s: Pause charged to a re-allocated job that measured none.
        horizon_s: Stop looking further ahead than this.
        max_rounds: Stop after this many rounds whatever the horizon.
        seed: Seed of the policy's random generator.
        caps: Most replicas per job whatever it explores (the spec's max_replicas); a job
            not named is bounded by the cluster and its batch limits only.
        until: Stop once this job has completed (the only one the caller asks about).
    """
    if not round_s > 0:
        raise ValueError(f"round_s must be > 0, got {round_s}")
    rng = np.random.default_rng(seed)
    total = sum(node.gpus for node in state.nodes)
    jobs = list(state.jobs)
    now, end = state.now, state.now + horizon_s
    memory: M | None = None
    completion: dict[str, float] = {}
    rounds = 0
    while rounds < max_rounds and now < end and any(_predictable(j) for j in jobs):
        if until is not None and until in completion:
            break
        current = ClusterState(now=now, nodes=state.nodes, jobs=tuple(jobs), tenants=state.tenants)
        decision = policy.allocate(current, memory, rng)
        memory = decision.memory
        rounds += 1
        left: list[JobInfo] = []
        for job in jobs:
            allocation = tuple(decision.allocations.get(job.name, ()))
            moved = bool(allocation) and Counter(allocation) != Counter(job.allocation)
            pause = _pause(job, restart_delay_s) if moved else 0.0
            rate = progress_rate(job, allocation)
            remaining = job.remaining_work
            if remaining is not None and rate > 0:
                run = max(0.0, round_s - pause)
                if remaining <= rate * run:
                    completion[job.name] = now + pause + remaining / rate
                    continue
                remaining -= rate * run
            grown = policy.replica_limit(len(allocation), 0, _limit(job, total, caps))
            explored = max(job.max_replicas, grown)
            after = replace(
                job,
                allocation=allocation,
                max_replicas=explored,
                remaining_work=remaining,
                restarts=job.restarts + int(moved and bool(job.allocation)),
                attained_service=job.attained_service + len(allocation) * round_s,
            )
            left.append(_resized(job, after))
        jobs = left
        now += round_s
    return Forecast(completion=completion, rounds=rounds)


def _resized(before: JobInfo, after: JobInfo) -> JobInfo:
    """`after` with the resize record of going from `before`'s GPUs to its own.

    A first allocation (a job that has never held GPUs) is not a resize.
    """
    if not has_held_gpus(before):
        return after
    resizes, reversals, last = resize_history(
        before.resizes,
        before.reversals,
        before.last_resize,
        len(before.allocation),
        len(after.allocation),
    )
    return replace(after, resizes=resizes, reversals=reversals, last_resize=last)


def _limit(job: JobInfo, total: int, caps: Mapping[str, int] | None) -> int:
    """Most replicas exploration may reach: the cap, the cluster, the batch limits."""
    limit = total
    if caps is not None and job.name in caps:
        limit = min(limit, caps[job.name])
    model = job.model
    if model is not None:
        limit = min(limit, model.max_batch_size // max(model.min_atomic_bsz, 1))
    return max(limit, 1)


def _predictable(job: JobInfo) -> bool:
    return job.remaining_work is not None and job.model is not None


def _pause(job: JobInfo, default: float) -> float:
    pause = job.restart_pause_s
    return pause if pause is not None and math.isfinite(pause) and pause >= 0 else default
