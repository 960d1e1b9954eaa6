"""Node groups and the configurations a job may take on a cluster of several GPU types.

A node group is the nodes of one GPU type and one size (GPUs per node). With several types a
job runs on one group only (a synchronous step runs at its slowest replica's pace, so mixing
types wastes the fast GPUs), in one of the group's configurations: 1, 2, 4, … GPUs up to a
node (powers of two on one node) and whole nodes above (2, 3, … nodes of it). Powers of two
pack a node exactly, whole nodes never share one with another distributed job, so per-group
GPU counts are all the solver needs; docs/policy.md ("Several GPU types") says what the
restriction costs. A job's current allocation, whatever its shape, is kept as one more option
(`pollux.policy.typed_problem`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pollux.policy.types import ClusterState, NodeInfo


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """The nodes of one GPU type and size, in the state's node order.

    Attributes:
        gpu_type: Their `NodeInfo.gpu_type`.
        gpus_per_node: GPUs on each of them, ≥ 1.
        nodes: Their names.
    """

    gpu_type: str
    gpus_per_node: int
    nodes: tuple[str, ...]

    @property
    def capacity(self) -> int:
        """All the group's GPUs."""
        return self.gpus_per_node * len(self.nodes)


@dataclass(frozen=True, slots=True)
class Config:
    """One shape a job may run in: GPUs on whole or part of a group's nodes.

    Attributes:
        group: Index of its `NodeGroup`.
        gpu_type: The group's GPU type.
        nodes: Nodes it spans (1, or the whole nodes it takes).
        gpus: GPUs it holds (a power of two ≤ a node on one node, else nodes × GPUs/node).
    """

    group: int
    gpu_type: str
    nodes: int
    gpus: int


def node_groups(nodes: Sequence[NodeInfo]) -> tuple[NodeGroup, ...]:
    """The groups of `nodes` by (GPU type, GPUs per node), in order of first appearance."""
    members: dict[tuple[str, int], list[str]] = {}
    for node in nodes:
        members.setdefault((node.gpu_type, node.gpus), []).append(node.name)
    return tuple(NodeGroup(t, g, tuple(names)) for (t, g), names in members.items())


def configs(
    groups: Sequence[NodeGroup], *, max_gpus: int, max_nodes: int | None = None
) -> tuple[Config, ...]:
    """Every configuration of every group with at most `max_gpus` GPUs and `max_nodes` nodes.

    Per group: 1, 2, 4, … ≤ a node, then n whole nodes for 2 ≤ n ≤ its nodes (and
    `max_nodes`; None: no cap). Ordered by group, then size.
    """
    out = []
    for index, group in enumerate(groups):
        g = group.gpus_per_node
        k = 1
        while k <= min(g, max_gpus):
            out.append(Config(index, group.gpu_type, 1, k))
            k *= 2
        top = len(group.nodes) if max_nodes is None else min(len(group.nodes), max_nodes)
        for n in range(2, top + 1):
            if n * g > max_gpus:
                break
            out.append(Config(index, group.gpu_type, n, n * g))
    return tuple(out)


def is_typed(state: ClusterState) -> bool:
    """Whether a round over `state` needs the typed allocation.

    True when its nodes carry two GPU types or more, or a job restricts the types it may
    run on; otherwise the single-type policy decides exactly as it always has.
    """
    if any(job.gpu_types is not None for job in state.jobs):
        return True
    types = {node.gpu_type for node in state.nodes}
    return len(types) >= 2


def on_one_type(state: ClusterState) -> ClusterState:
    """`state` with each job's `model` its model on the nodes' one GPU type, where it has one.

    For the single-type path: a job's `model` is its current type's, which need not be the
    type of the nodes of this round (a placement round sees only free GPUs). Jobs without
    per-type models, or without one for that type, are left as they are.
    """
    types = {node.gpu_type for node in state.nodes}
    if len(types) != 1:
        return state
    (gpu_type,) = types
    jobs = tuple(
        replace(job, model=job.models[gpu_type])
        if gpu_type in job.models and job.models[gpu_type] is not job.model
        else job
        for job in state.jobs
    )
    if all(a is b for a, b in zip(jobs, state.jobs, strict=True)):
        return state
    return replace(state, jobs=jobs)
