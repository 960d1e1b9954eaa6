"""Allocation helpers shared by the policies: validation and per-node counting."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from pollux.policy.params import PolicyInputError
from pollux.policy.types import Allocation, ClusterState


def validate_state(state: ClusterState) -> None:
    """Reject a snapshot no policy can act on, naming the offending field.

    Checks: unique node, tenant and job names, positive GPU counts, replica bounds, allowed
    GPU types (None or non-empty), and that current allocations name known nodes without
    exceeding any node's GPUs. (Each `TenantSpec`
    checks its own fields when it is built.)
    """
    names = [n.name for n in state.nodes]
    if len(set(names)) != len(names):
        dup = next(n for n, c in Counter(names).items() if c > 1)
        raise PolicyInputError("nodes", f"node name {dup!r} appears more than once")
    capacity = {n.name: n.gpus for n in state.nodes}
    for node in state.nodes:
        if not isinstance(node.gpus, int) or node.gpus < 1:
            raise PolicyInputError(f"nodes[{node.name}].gpus", f"must be ≥ 1, got {node.gpus}")
    tenants = [t.name for t in state.tenants]
    if len(set(tenants)) != len(tenants):
        dup = next(n for n, c in Counter(tenants).items() if c > 1)
        raise PolicyInputError("tenants", f"tenant name {dup!r} appears more than once")
    jobs = [j.name for j in state.jobs]
    if len(set(jobs)) != len(jobs):
        dup = next(n for n, c in Counter(jobs).items() if c > 1)
        raise PolicyInputError("jobs", f"job name {dup!r} appears more than once")
    used: Counter[str] = Counter()
    for job in state.jobs:
        where = f"jobs[{job.name}]"
        if job.min_replicas < 0 or job.max_replicas < job.min_replicas:
            raise PolicyInputError(
                f"{where}.max_replicas",
                f"need 0 ≤ min_replicas ≤ max_replicas, got {job.min_replicas} and "
                f"{job.max_replicas}",
            )
        if job.target_replicas is not None and job.target_replicas < 1:
            raise PolicyInputError(
                f"{where}.target_replicas", f"must be ≥ 1, got {job.target_replicas}"
            )
        if job.gpu_types is not None and (
            not isinstance(job.gpu_types, frozenset) or not job.gpu_types
        ):
            raise PolicyInputError(
                f"{where}.gpu_types",
                f"must be a non-empty frozenset of GPU types or None (any type), "
                f"got {job.gpu_types!r}",
            )
        unknown = [n for n in job.allocation if n not in capacity]
        if unknown:
            raise PolicyInputError(f"{where}.allocation", f"names unknown node {unknown[0]!r}")
        used.update(job.allocation)
    for name, count in used.items():
        if count > capacity[name]:
            raise PolicyInputError(
                f"nodes[{name}]", f"current allocations use {count} GPUs of {capacity[name]}"
            )


def node_counts(allocation: Allocation) -> Counter[str]:
    """Replicas per node of an allocation."""
    return Counter(allocation)


def num_nodes(allocation: Allocation) -> int:
    """N: distinct nodes an allocation uses."""
    return len(set(allocation))


def make_allocation(counts: Mapping[str, int], node_order: Iterable[str]) -> Allocation:
    """Allocation with `counts[node]` replicas per node, nodes in `node_order`."""
    return tuple(node for node in node_order for _ in range(counts.get(node, 0)))


def canonical(allocation: Allocation, node_order: Iterable[str]) -> Allocation:
    """The same multiset of nodes, ordered by `node_order` (replicas of a node adjacent)."""
    return make_allocation(node_counts(allocation), node_order)


def free_gpus(state: ClusterState, allocations: Mapping[str, Allocation]) -> dict[str, int]:
    """GPUs left on each node under `allocations`."""
    free = {n.name: n.gpus for n in state.nodes}
    for alloc in allocations.values():
        for node in alloc:
            free[node] -= 1
    return free


def place_on_freest(need: int, free: dict[str, int], order: Sequence[str]) -> Allocation:
    """Take GPUs from the node with the most free GPUs (ties: `order`) until `need` are held.

    Shared by Optimus and Tiresias, whose published placements both work this way. The GPUs
    taken are subtracted from `free` in place.

    Raises:
        ValueError: Fewer than `need` GPUs are free (the callers' counts rule this out).
    """
    if need > sum(free.values()):
        raise ValueError(f"cannot place {need} GPUs: only {sum(free.values())} are free")
    taken: dict[str, int] = {}
    while need > 0:
        node = max(order, key=free.__getitem__)  # first maximum: ties in node order
        take = min(need, free[node])
        taken[node] = take
        free[node] -= take
        need -= take
    return make_allocation(taken, order)


def gpus(count: int) -> str:
    """A GPU count for an explanation: "1 GPU", "4 GPUs"."""
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
