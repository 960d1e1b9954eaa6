"""Inputs and outputs of the cluster autoscaler: node pools, their nodes, and the decision.

The autoscaler is a pure function of an `AutoscaleState` (the jobs with their goodput models,
the pools, each pool's nodes and when it last scaled, and the clock), so that the simulator and
a live provisioner get the same decision from the same inputs. Times are seconds on the
caller's clock; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pollux.policy.types import JobInfo


class AutoscaleInputError(ValueError):
    """An autoscaler input that cannot be acted on, naming the offending field.

    Attributes:
        field: The offending part of the input, e.g. ``"pools[gpu].max_nodes"``.
        problem: What is wrong with it.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class NodePool:
    """A group of identical nodes the autoscaler may grow and shrink (a cloud instance type).

    Attributes:
        name: Unique pool name.
        gpu_type: The GPU model of its nodes (e.g. "t4"); informational until the jobs' models
            distinguish GPU types.
        gpus_per_node: GPUs on each node, ≥ 1.
        min_nodes: Fewest nodes the pool keeps, ≥ 0.
        max_nodes: Most nodes it may have, ≥ max(min_nodes, 1).
        cost_per_node_hour: Price of one node for an hour (any currency), ≥ 0; pools are
            grown cheapest GPU first and shrunk dearest first.
        scale_up_cooldown_s: Seconds after a scale-up before the next one, ≥ 0.
        scale_down_cooldown_s: Seconds after any scale-up or scale-down before a scale-down,
            ≥ 0 (keeps a grown pool from shrinking before its new nodes were used).
        idle_timeout_s: Seconds a node must have held no replica before it is removed, ≥ 0.
    """

    name: str
    gpu_type: str = "gpu"
    gpus_per_node: int = 4
    min_nodes: int = 0
    max_nodes: int = 16
    cost_per_node_hour: float = 1.0
    scale_up_cooldown_s: float = 60.0
    scale_down_cooldown_s: float = 300.0
    idle_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        where = f"pools[{self.name}]"
        if not self.name:
            raise AutoscaleInputError("pools[].name", "must be a non-empty string")
        if self.gpus_per_node < 1:
            raise AutoscaleInputError(f"{where}.gpus_per_node", "must be ≥ 1")
        if self.min_nodes < 0 or self.max_nodes < max(self.min_nodes, 1):
            raise AutoscaleInputError(
                f"{where}.max_nodes",
                f"need 0 ≤ min_nodes ≤ max_nodes and max_nodes ≥ 1, got {self.min_nodes} "
                f"and {self.max_nodes}",
            )
        for name in ("cost_per_node_hour", "scale_up_cooldown_s", "scale_down_cooldown_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise AutoscaleInputError(f"{where}.{name}", f"must be finite and ≥ 0, got {value}")
        if not (math.isfinite(self.idle_timeout_s) and self.idle_timeout_s >= 0):
            raise AutoscaleInputError(f"{where}.idle_timeout_s", "must be finite and ≥ 0")

    @property
    def cost_per_gpu_hour(self) -> float:
        """Price of one of its GPUs for an hour."""
        return self.cost_per_node_hour / self.gpus_per_node


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A node of a pool as the provisioner sees it.

    Attributes:
        name: Unique node name.
        pool: Name of its pool.
        ready: Whether it has joined the cluster (False: requested, still provisioning).
        used_gpus: GPUs its replicas hold now.
        idle_since: When it last became empty (None while it holds replicas; a ready node
            that never held one: when it became ready).
        draining: Chosen for removal by an earlier decision: no new replicas go to it, and
            it is released once empty; it no longer counts towards its pool's size.
    """

    name: str
    pool: str
    ready: bool = True
    used_gpus: int = 0
    idle_since: float | None = None
    draining: bool = False


@dataclass(frozen=True, slots=True)
class PoolHistory:
    """When a pool last changed size (None: never), for the cooldowns."""

    last_scale_up: float | None = None
    last_scale_down: float | None = None


@dataclass(frozen=True, slots=True)
class AutoscaleState:
    """Everything one autoscaling decision reads.

    Attributes:
        now: The decision's time (seconds).
        jobs: Active jobs with their goodput models and replica limits (as a scheduling
            round's `ClusterState.jobs`).
        pools: The node pools.
        nodes: Every node of every pool, provisioning ones included.
        history: Each pool's last scale-up and scale-down (missing: never).
    """

    now: float
    jobs: tuple[JobInfo, ...]
    pools: tuple[NodePool, ...]
    nodes: tuple[NodeStatus, ...] = ()
    history: Mapping[str, PoolHistory] | None = None

    def pool_nodes(self, pool: str) -> tuple[NodeStatus, ...]:
        """The nodes of pool `pool`, in the state's order."""
        return tuple(n for n in self.nodes if n.pool == pool)

    def history_of(self, pool: str) -> PoolHistory:
        """Pool `pool`'s history (never scaled when missing)."""
        return (self.history or {}).get(pool, PoolHistory())


@dataclass(frozen=True, slots=True)
class PoolDecision:
    """What one pool should do now.

    Attributes:
        pool: The pool's name.
        current: Its nodes now (provisioning ones included).
        desired: Nodes it should have, in [min_nodes, max_nodes].
        add: Nodes to request now.
        remove: Nodes to release now (provisioning ones, and ones idle past the timeout).
        drain: Busy nodes to stop placing replicas on, so that they empty and go next.
        reason: One line a person can read: what changed and why, or why nothing did.
    """

    pool: str
    current: int
    desired: int
    add: int = 0
    remove: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class AutoscaleDecision:
    """The autoscaler's answer.

    Attributes:
        rule: Name of the rule that decided (`pollux.autoscale.rules`).
        pools: Per-pool decisions, keyed by pool name.
        utility: The rule's signal at the current size: predicted goodput (or throughput)
            per GPU as a fraction of ideal (1.0: every GPU as useful as a job's first);
            inf when jobs wait on a cluster with no GPU; NaN with no jobs.
        target_utility: The signal at the desired size.
        reason: One line for the whole cluster.
    """

    rule: str
    pools: Mapping[str, PoolDecision]
    utility: float
    target_utility: float
    reason: str

    @property
    def desired(self) -> dict[str, int]:
        """Desired node count per pool."""
        return {name: p.desired for name, p in self.pools.items()}
