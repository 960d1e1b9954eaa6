"""Fairness between the users of a tenant: queueing more jobs buys a user no more of it.

A policy that values every job alike gives a user with 200 queued jobs 200 times the say of
a user with one, and ties broken by submission order put the second user's job behind all
200. Two pure functions give every user of a tenant the same say, whatever their job counts:

- `owner_factor`, a factor of each job's weight (`pollux.policy.weights`): each user's jobs
  share one equal part of their tenant's total weight, which stays what it was;
- `turns`, the order in which equal claims are served: within a tenant, every user's first
  job, then every user's second, ..., each user's jobs in their own order.

Both are the identity when each tenant's jobs have one owner (the published workloads), so
no published figure changes. A job's tenant is resolved as the tenant shares resolve it (a
name no `TenantSpec` defines is the default tenant), so inventing tenant names gains nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np
import numpy.typing as npt

from pollux.policy.quota import DEFAULT_TENANT
from pollux.policy.types import ClusterState

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
    """Each job's factor n_t / (U_t · n_u), scaled to a largest of 1; None if it changes nothing.

    n_t: the jobs of the job's tenant t, U_t: that tenant's owners, n_u: the jobs of the
    job's owner u in t. So every owner of t holds n_t / U_t of the tenant's weight, however
    many jobs it queues, and the tenant holds n_t, as with every job alike (tenant shares
    see the tenant they saw before). None when no tenant has two owners.
    """
    keys = owners_of(state)
    jobs_of = Counter(keys)
    owners_in = Counter(tenant for tenant, _ in jobs_of)
    if all(count == 1 for count in owners_in.values()):
        return None
    tenant_jobs = Counter(tenant for tenant, _ in keys)
    factor = np.array(
        [tenant_jobs[t] / (owners_in[t] * jobs_of[(t, u)]) for t, u in keys], dtype=np.float64
    )
    scaled: FloatArray = factor / factor.max()
    return scaled


def round_robin(keys: Sequence[Hashable]) -> list[int]:
    """Positions of `keys` in round-robin order over their values, each value's own order kept.

    Every value's first position comes first (in position order), then every value's second,
    and so on. With one value (or all distinct) the order is unchanged.
    """
    seen: Counter[Hashable] = Counter()
    turn = []
    for key in keys:
        turn.append(seen[key])
        seen[key] += 1
    return sorted(range(len(keys)), key=lambda i: (turn[i], i))


def turns(owners: Sequence[Owner]) -> list[int]:
    """Positions of jobs with `owners` in turn order: round-robin over the owners of a tenant.

    Each tenant's jobs keep the positions they hold (tenants are not interleaved with each
    other) and are ordered among them by `round_robin` over their owners, so the order is
    unchanged when every tenant has one owner.
    """
    order = list(range(len(owners)))
    positions: dict[str, list[int]] = {}
    for i, (tenant, _) in enumerate(owners):
        positions.setdefault(tenant, []).append(i)
    for held in positions.values():
        for slot, k in zip(held, round_robin([owners[i] for i in held]), strict=True):
            order[slot] = held[k]
    return order


def by_owner_turns(state: ClusterState) -> ClusterState:
    """`state` with its jobs in `turns` order (the same state when that changes nothing).

    A search that breaks ties by job order then serves the user with fewer jobs ahead first.
    """
    order = turns(owners_of(state))
    if order == list(range(len(order))):
        return state
    jobs = tuple(state.jobs[i] for i in order)
    return ClusterState(state.now, state.nodes, jobs, state.tenants)
