"""Placement rounds: what an event-triggered round may decide without moving anyone.

A submission wants GPUs at once, not at the next periodic round (up to an interval away). A
full round run at every event, though, also re-plans every running job, so an arrival and a
departure in the same minute become two moves of the long jobs that soak up spare GPUs. A
*placement round* does only the urgent part: it places jobs that have never run on the GPUs no
job holds, and leaves every running job (and every job that ran before and waits to resume)
to the periodic round, which alone grows, shrinks and moves jobs.

Free GPUs go first to the waiting jobs of the users holding the fewest (`owners`); a user
holding none while another holds two or more is owed a first GPU (`owed_first_gpus`), for
which the round may preempt one job of the user holding the most (`owed_moves`), its only
move. With tenants every round is a full one (caps count GPUs held elsewhere).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from pollux.policy.owners import Owner, next_in_turn, owners_of
from pollux.policy.types import ClusterState, JobInfo, NodeInfo


def never_ran(job: JobInfo) -> bool:
    """Whether the job holds nothing and has never held a GPU (a fresh submission)."""
    return not job.allocation and job.attained_service == 0 and job.restarts == 0


def owed_first_gpus(state: ClusterState) -> frozenset[Owner]:
    """The users waiting for a first GPU that only moving another user's job can give.

    Users holding no GPU with a job that `never_ran`, each in a tenant where another user
    holds two GPUs or more, when they outnumber the free GPUs (empty otherwise: the free
    GPUs go to them first, `next_in_turn`). Empty with one user per tenant.
    """
    owners = owners_of(state)
    held = _held(state, owners)
    seconds = {tenant for (tenant, _), gpus in held.items() if gpus >= 2}
    starved = frozenset(
        owner
        for job, owner in zip(state.jobs, owners, strict=True)
        if owner[0] in seconds and not held[owner] and never_ran(job)
    )
    free = sum(node.gpus for node in state.nodes) - sum(held.values())
    return starved if len(starved) > free else frozenset()


def owed_moves(state: ClusterState) -> frozenset[str]:
    """Running jobs to preempt so that each user `owed_first_gpus` can get a GPU.

    One at a time until the free GPUs cover the owed users: a job of the user of an owed
    user's tenant holding the most GPUs (two or more; ties: the user queueing more, then
    by name), its job holding the fewest GPUs, then the one that has run least (the least
    work to lose), then the newest. Turns put every user's first job before anyone's
    second (`pollux.policy.owners.turns`); this is that rule where the round would
    otherwise move no one. Empty when nobody is owed a GPU.
    """
    owed = owed_first_gpus(state)
    if not owed:
        return frozenset()
    owners = owners_of(state)
    held = _held(state, owners)
    queued = Counter(o for job, o in zip(state.jobs, owners, strict=True) if not job.allocation)
    tenants = {tenant for tenant, _ in owed}
    free = sum(node.gpus for node in state.nodes) - sum(held.values())
    running = [(job, o) for job, o in zip(state.jobs, owners, strict=True) if job.allocation]
    moved: set[str] = set()
    while free < len(owed):
        donors = [o for o in held if o[0] in tenants and held[o] >= 2]
        if not donors:
            break
        donor = max(donors, key=lambda o: (held[o], queued[o], o))
        job = min(
            (job for job, o in running if o == donor and job.name not in moved),
            key=lambda job: (len(job.allocation), job.attained_service, -job.submission_time),
        )
        moved.add(job.name)
        held[donor] -= len(job.allocation)
        free += len(job.allocation)
    return frozenset(moved)


def _held(state: ClusterState, owners: list[Owner]) -> Counter[Owner]:
    held = Counter[Owner]()
    for job, owner in zip(state.jobs, owners, strict=True):
        held[owner] += len(job.allocation)
    return held


def placement_state(
    state: ClusterState, *, by_turn: bool = True, freeing: Collection[str] = ()
) -> ClusterState:
    """The part of `state` a placement round plans: free GPUs and jobs that never ran.

    Each node keeps only the GPUs no active job holds (nodes with none are left out), the
    GPUs of the jobs `freeing` (preempted by the round) counted free; the jobs are those
    that `never_ran` and, `by_turn`, are offered the free GPUs (`next_in_turn`, counting
    what each user holds once `freeing` is preempted: all of them with one user), in the
    state's order. A policy's answer for this state changes no other job, so it can be
    applied on top of the current allocations (and the preemptions) as is.

    Raises:
        ValueError: `state` has tenants (a placement round cannot respect their quotas).
    """
    if state.tenants:
        raise ValueError("a placement round cannot respect tenant quotas; run a full round")
    kept = tuple(job for job in state.jobs if job.name not in freeing)
    held = Counter(node for job in kept for node in job.allocation)
    nodes = tuple(
        NodeInfo(node.name, node.gpus - held[node.name], node.gpu_type)
        for node in state.nodes
        if node.gpus > held[node.name]
    )
    waiting = [job for job in kept if never_ran(job)]
    if by_turn:
        after = ClusterState(state.now, state.nodes, kept)
        waiting = next_in_turn(after, waiting, sum(node.gpus for node in nodes))
    return ClusterState(state.now, nodes, tuple(waiting))
