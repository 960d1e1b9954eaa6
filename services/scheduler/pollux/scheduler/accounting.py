"""Usage accounting: GPU-seconds and goodput-seconds per user and tenant, per UTC day.

The leader samples the jobs that hold GPUs once per retention tick (a minute by default) and
adds, for the time since its previous sample, each job's GPUs (GPU-seconds) and its predicted
goodput relative to one GPU at the initial batch (goodput-seconds: useful progress, in
single-GPU seconds), as the job's agent last predicted it for the job's current shape; before
the agent has a fitted model, goodput is counted as linear in GPUs, the policy's own
assumption. Records are keyed by day, tenant and user, so they outlive the jobs (and their
deletion by retention); the retention sweep deletes days older than `usage_days`.

Sampling loses at most one tick per leader change (the new leader starts counting from its
first tick) and books a tick that spans midnight to the later day.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import prometheus_client

from pollux.scheduler.lifecycle import ACTIVE
from pollux.service.store import Conflict, Expect, Fence, Put, Store
from pollux.v1 import types_pb2 as pb

GPU_SECONDS = prometheus_client.Counter(
    "pollux_gpu_seconds_total", "GPU-seconds held by jobs, by tenant and user.", ["tenant", "user"]
)
GOODPUT_SECONDS = prometheus_client.Counter(
    "pollux_goodput_seconds_total",
    "Goodput-seconds (useful progress in single-GPU seconds), by tenant and user.",
    ["tenant", "user"],
)


@dataclass
class Usage:
    """What one (day, tenant, user) used in a sample."""

    gpu_seconds: float = 0.0
    goodput_seconds: float = 0.0


def day_of(seconds: float) -> str:
    """The UTC day of a time, as usage records name it."""
    return time.strftime("%Y-%m-%d", time.gmtime(seconds))


def shape_of(job: pb.Job) -> str:
    """The agent's name for a job's current shape: "<nodes>/<replicas>"."""
    nodes = job.allocation.nodes
    return f"{len(set(nodes))}/{len(nodes)}"


def sample(
    jobs: Iterable[pb.Job],
    speedups: Mapping[str, float],
    *,
    since: float,
    now: float,
) -> dict[tuple[str, str, str], Usage]:
    """Usage of the jobs holding GPUs between `since` and `now`, by (day, tenant, user).

    Args:
        jobs: Current job records.
        speedups: Predicted goodput (relative to one GPU) of a job's current shape, where the
            agent has one; missing jobs count as linear in GPUs.
        since: The previous sample's time.
        now: This sample's time.
    """
    out: dict[tuple[str, str, str], Usage] = {}
    day = day_of(now)
    for job in jobs:
        held = len(job.allocation.nodes)
        if job.state not in ACTIVE or held == 0:
            continue
        start = max(since, job.allocation.time.ToNanoseconds() / 1e9)
        seconds = max(0.0, now - start)
        if seconds == 0:
            continue
        speedup = speedups.get(job.id, 0.0) or float(held)
        row = out.setdefault((day, job.tenant, job.owner), Usage())
        row.gpu_seconds += held * seconds
        row.goodput_seconds += min(speedup, float(held)) * seconds
    return out


async def speedups_of(store: Store, jobs: list[pb.Job]) -> dict[str, float]:
    """The agents' predicted goodput of each job's current shape (where they have one)."""
    holding = [j for j in jobs if j.allocation.nodes and j.state in ACTIVE]
    profiles = await store.get_many(
        [store.keys.observations(j.id) for j in holding], pb.ObservationProfile
    )
    out = {}
    for job, entry in zip(holding, profiles, strict=True):
        if entry is None:
            continue
        config = entry.value.last_configs.get(shape_of(job))
        if config is not None and config.predicted_speedup > 0:
            out[job.id] = config.predicted_speedup
    return out


async def record(store: Store, usage: dict[tuple[str, str, str], Usage], fence: Fence) -> None:
    """Add a sample to the stored per-day records (and the Prometheus counters)."""
    for (day, tenant, user), used in sorted(usage.items()):
        GPU_SECONDS.labels(tenant or "-", user).inc(used.gpu_seconds)
        GOODPUT_SECONDS.labels(tenant or "-", user).inc(used.goodput_seconds)
        key = store.keys.usage(day, tenant, user)
        for _ in range(5):
            entry = await store.get(key, pb.UsageRecord)
            total = (
                entry.value
                if entry is not None
                else pb.UsageRecord(tenant=tenant, user=user, day=day)
            )
            total.gpu_seconds += used.gpu_seconds
            total.goodput_seconds += used.goodput_seconds
            expected = entry.mod_revision if entry is not None else 0
            try:
                await store.txn(
                    [Put(key, total.SerializeToString())],
                    expect=[Expect(key, expected)],
                    fence=fence,
                )
                break
            except Conflict:
                continue
