"""Fairness between the users of a tenant: queueing more jobs buys a user no more of it.

Valuing every job alike gives a user with 200 queued jobs 200 times the say of a user with
one. Pure functions give every user of a tenant the same say, whatever their job counts:

- `owner_factor`, a factor of each job's weight (`pollux.policy.weights`): the jobs each user
  of a tenant can run on its share of the cluster weigh one equal part of the tenant's weight;
- `turns`, the order in which equal claims are served: within a tenant, every user's first
  job, then every user's second, ..., the user with fewer jobs first in each turn;
- `next_in_turn`, the waiting jobs a placement round offers the free GPUs to: those of the
  users holding the fewest GPUs first.

All are the identity when each tenant's jobs have one owner (the published workloads). A
job's tenant is resolved as the tenant shares resolve it: inventing names gains nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pollux.policy.quota import DEFAULT_TENANT
from pollux.policy.types import ClusterState, JobInfo

FloatArray = npt.NDArray[np.float64]

Owner = tuple[str, str]
"""A job's (tenant, owner) after tenant resolution: the unit that is treated alike."""


def owners_of(state: ClusterState) -> list[Owner]:
    """Each job's (tenant, owner), its tenant resolved against the state's tenants."""
    defined = {spec.name for spec in state.tenants}
    return [
        (job.tenant if job.tenant in defined else DEFAULT_TENANT, job.owner) for job in state.jobs
    ]


def owner_factor(state: ClusterState) -> FloatArray | None:
    """Each job's factor c_t / min(n_u, S_t), scaled to a largest of 1; None if it changes nothing.

    n_u: the jobs of the job's owner u in its tenant t. S_t: the jobs one user's share of
    the cluster runs at once, its G / U_t GPUs (G: the round's GPUs, U_t: the tenant's
    owners) over the GPUs a running job of the round holds on average (1 with none),
    rounded, at least 1. So the jobs of each user of t that its share can run weigh alike
    together (one user's part), however many it queues: its further jobs weigh as much
    each, not more, and a backlog never dilutes its running jobs to nothing. Per job, a user
    queueing fewer weighs more. c_t keeps the tenant's total weight n_t, as with every job
    alike (tenant shares see the tenant they saw before). None when no tenant has two owners.
    """
    keys = owners_of(state)
    jobs_of = Counter(keys)
    owners_in = Counter(tenant for tenant, _ in jobs_of)
    if all(count == 1 for count in owners_in.values()):
        return None
    gpus = sum(node.gpus for node in state.nodes)
    held = [len(job.allocation) for job in state.jobs if job.allocation]
    per_job = max(1.0, sum(held) / len(held)) if held else 1.0
    share = {t: max(1, round(gpus / (owners * per_job))) for t, owners in owners_in.items()}
    counted = {(t, u): min(n, share[t]) for (t, u), n in jobs_of.items()}
    tenant_jobs = Counter(tenant for tenant, _ in keys)
    parts = dict.fromkeys(owners_in, 0.0)
    for key, count in jobs_of.items():
        parts[key[0]] += count / counted[key]
    factor = np.array(
        [tenant_jobs[t] / (parts[t] * counted[(t, u)]) for t, u in keys], dtype=np.float64
    )
    scaled: FloatArray = factor / factor.max()
    return scaled


def turns(owners: Sequence[Owner]) -> list[int]:
    """Positions of jobs with `owners` in turn order: round-robin over the owners of a tenant.

    Each tenant's jobs keep the positions they hold (tenants are not interleaved with each
    other) and are ordered among them in turns: every owner's first job, then every owner's
    second, and so on, each owner's jobs in their own order. Within a turn the owner with
    fewer jobs goes first (ties: whose job comes first), so a backlog puts its owner behind
    the others. With one owner per tenant the order is unchanged.
    """
    jobs_of = Counter(owners)
    seen: Counter[Owner] = Counter()
    key = []
    for i, owner in enumerate(owners):
        key.append((seen[owner], jobs_of[owner], i))
        seen[owner] += 1
    order = list(range(len(owners)))
    positions: dict[str, list[int]] = {}
    for i, (tenant, _) in enumerate(owners):
        positions.setdefault(tenant, []).append(i)
    for held in positions.values():
        for slot, i in zip(held, sorted(held, key=key.__getitem__), strict=True):
            order[slot] = i
    return order


def by_owner_turns(state: ClusterState) -> ClusterState:
    """`state` with its jobs in `turns` order (the same state when that changes nothing).

    A search that breaks ties by job order then serves the users in turns.
    """
    order = turns(owners_of(state))
    if order == list(range(len(order))):
        return state
    jobs = tuple(state.jobs[i] for i in order)
    return ClusterState(state.now, state.nodes, jobs, state.tenants)


def next_in_turn(state: ClusterState, waiting: Sequence[JobInfo], free: int) -> list[JobInfo]:
    """The `waiting` jobs of `state` to offer `free` GPUs to, in their order in `waiting`.

    A waiting job's turn is the GPUs its owner's jobs hold in `state` plus the owner's
    waiting jobs before it; the first `free` jobs by turn are offered (each needs a GPU, so
    no more can start), ties going to the owner with fewer waiting jobs, then to the earlier
    job. So free GPUs go first to the users of a tenant holding the fewest, whoever queued
    more. All of `waiting` when no tenant has two owners.
    """
    owners = owners_of(state)
    tenants = Counter(tenant for tenant, _ in set(owners))
    if all(count == 1 for count in tenants.values()) or len(waiting) <= free:
        return list(waiting)
    owner_of = dict(zip((job.name for job in state.jobs), owners, strict=True))
    held = Counter[Owner]()
    for job in state.jobs:
        held[owner_of[job.name]] += len(job.allocation)
    queued = Counter(owner_of[job.name] for job in waiting)
    seen: Counter[Owner] = Counter()
    turn = []
    for i, job in enumerate(waiting):
        owner = owner_of[job.name]
        turn.append((held[owner] + seen[owner], queued[owner], i))
        seen[owner] += 1
    offered = sorted(sorted(range(len(waiting)), key=turn.__getitem__)[: max(free, 0)])
    return [waiting[i] for i in offered]
