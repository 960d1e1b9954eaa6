"""Placement rounds: what an event-triggered round may decide without moving anyone.

A submission wants GPUs at once, not at the next periodic round (up to an interval away). A
full round run at every event, though, also re-plans every running job, so an arrival and a
departure in the same minute become two moves of the long jobs that soak up spare GPUs. A
*placement round* does only the urgent part: it places jobs that have never run on the GPUs no
job holds, and leaves every running job (and every job that ran before and waits to resume)
to the periodic round, which alone grows, shrinks and moves jobs.

Tenants are not handled here: a tenant's cap and guarantee count the GPUs it holds elsewhere,
which a state of free GPUs alone cannot see, so with tenants every round is a full one.
"""

from __future__ import annotations

from collections import Counter

from pollux.policy.types import ClusterState, JobInfo, NodeInfo


def never_ran(job: JobInfo) -> bool:
    """Whether the job holds nothing and has never held a GPU (a fresh submission)."""
    return not job.allocation and job.attained_service == 0 and job.restarts == 0


def placement_state(state: ClusterState) -> ClusterState:
    """The part of `state` a placement round plans: free GPUs and jobs that never ran.

    Each node keeps only the GPUs no active job holds (nodes with none are left out); the
    jobs are those that `never_ran`, in the state's order. A policy's answer for this state
    changes no other job, so it can be applied on top of the current allocations as is.

    Raises:
        ValueError: `state` has tenants (a placement round cannot respect their quotas).
    """
    if state.tenants:
        raise ValueError("a placement round cannot respect tenant quotas; run a full round")
    held = Counter(node for job in state.jobs for node in job.allocation)
    nodes = tuple(
        NodeInfo(node.name, node.gpus - held[node.name], node.gpu_type)
        for node in state.nodes
        if node.gpus > held[node.name]
    )
    jobs = tuple(job for job in state.jobs if never_ran(job))
    return ClusterState(state.now, nodes, jobs)
