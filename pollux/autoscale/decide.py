"""One autoscaling decision: desired nodes per pool, what to add, release and drain, and why.

`autoscale(state, rule)` is the whole API. Its steps:

1. The sizes the cluster may take, smallest first: every pool at its minimum, then one node at
   a time from the pool whose GPUs are cheapest and that has room (`size_ladder`).
2. The jobs' curves under the rule's signal and S(G), their best total speedup on G GPUs
   (`pollux.autoscale.curves`); the utility at the current size and at each rung.
3. The rule (`pollux.autoscale.rules.BandRule`): grow above `upper`, shrink below `lower`, to
   the largest rung whose utility is ≥ `lower` and that does not pass the first rung with
   every GPU the jobs can use (more would idle); hold inside the band. No jobs: the minimum.
4. Per pool: the cooldowns, then which nodes go: provisioning ones first, then nodes idle
   past the pool's idle timeout; nodes idle for less are waited for; only what idle nodes
   cannot cover is drained, the least used nodes first.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from pollux.autoscale.curves import job_curve, total_speedup, utility
from pollux.autoscale.rules import GOODPUT_RULE, BandRule
from pollux.autoscale.types import (
    AutoscaleDecision,
    AutoscaleInputError,
    AutoscaleState,
    NodePool,
    NodeStatus,
    PoolDecision,
)


def size_ladder(pools: tuple[NodePool, ...]) -> list[dict[str, int]]:
    """Node counts per pool, smallest cluster first, each rung one node more than the last.

    Rung 0 has every pool at its minimum; each next rung adds a node to the pool with the
    lowest cost per GPU-hour that is below its maximum (ties: the earlier pool).
    """
    counts = {p.name: p.min_nodes for p in pools}
    ladder = [dict(counts)]
    order = sorted(pools, key=lambda p: p.cost_per_gpu_hour)
    for pool in order:
        while counts[pool.name] < pool.max_nodes:
            counts[pool.name] += 1
            ladder.append(dict(counts))
    return ladder


def autoscale(state: AutoscaleState, rule: BandRule = GOODPUT_RULE) -> AutoscaleDecision:
    """Decide how many nodes each pool should have now (see the module docstring).

    Raises:
        AutoscaleInputError: Duplicate pool or node names, or a node of an unknown pool.
    """
    _validate(state)
    pools = state.pools
    gpus = {p.name: p.gpus_per_node for p in pools}
    staying = [n for n in state.nodes if not n.draining]
    current = Counter(n.pool for n in staying)
    ladder = size_ladder(pools)
    sizes = [sum(c[p] * gpus[p] for p in c) for c in ladder]
    now_gpus = sum(current[p] * gpus[p] for p in gpus)
    cheapest = min(pools, key=lambda p: p.cost_per_gpu_hour)
    top = max(sizes[-1], now_gpus, 1)
    curves = [job_curve(j, rule.signal, cheapest.gpus_per_node, top) for j in state.jobs]
    total = total_speedup(curves, top)
    now_u = utility(total, now_gpus)
    # GPUs past the point where S(G) stops growing would sit idle: never grow past the first
    # rung that covers them, whatever the average utility.
    useful = int(np.argmax(total >= total[-1] - 1e-9))
    rung = max(
        (
            i
            for i, size in enumerate(sizes)
            if size > 0 and utility(total, size) >= rule.lower and (i == 0 or sizes[i - 1] < useful)
        ),
        default=0,
    )
    target_u = utility(total, sizes[rung])
    if not state.jobs:
        target, direction = ladder[0], "down"
        why = "no active jobs"
    elif now_u > rule.upper and sizes[rung] > now_gpus:
        target, direction = ladder[rung], "up"
        why = (
            f"{rule.signal.value} per GPU {_fraction(now_u)} of ideal at {now_gpus} GPUs is "
            f"above {rule.upper:.2f}; {_fraction(target_u)} at {sizes[rung]} GPUs, the largest "
            f"size at or above {rule.lower:.2f}"
        )
    elif now_u < rule.lower and sizes[rung] < now_gpus:
        target, direction = ladder[rung], "down"
        why = (
            f"{rule.signal.value} per GPU {_fraction(now_u)} of ideal at {now_gpus} GPUs is "
            f"below {rule.lower:.2f}; {_fraction(target_u)} at {sizes[rung]} GPUs"
        )
    else:
        target, direction = {p.name: current[p.name] for p in pools}, "hold"
        why = (
            f"{rule.signal.value} per GPU {_fraction(now_u)} of ideal at {now_gpus} GPUs is "
            f"within [{rule.lower:.2f}, {rule.upper:.2f}]"
        )
    decisions = {
        p.name: _pool_decision(state, p, current[p.name], target[p.name], direction, why)
        for p in pools
    }
    return AutoscaleDecision(
        rule=rule.name,
        pools=decisions,
        utility=now_u,
        target_utility=target_u,
        reason=f"{direction}: {why}",
    )


def _pool_decision(
    state: AutoscaleState, pool: NodePool, current: int, wanted: int, direction: str, why: str
) -> PoolDecision:
    """Bounds, cooldowns and node choice for one pool."""
    history = state.history_of(pool.name)
    nodes = state.pool_nodes(pool.name)
    drained_empty = tuple(n.name for n in nodes if n.draining and n.used_gpus == 0)
    desired = min(max(wanted, pool.min_nodes), pool.max_nodes)
    if desired > current:
        since = _since(state.now, history.last_scale_up)
        if since < pool.scale_up_cooldown_s and current >= pool.min_nodes:
            return PoolDecision(
                pool.name,
                current,
                current,
                remove=drained_empty,
                reason=(
                    f"hold: scale-up cooldown ({since:.0f} s of {pool.scale_up_cooldown_s:.0f} s)"
                ),
            )
        return PoolDecision(
            pool.name,
            current,
            desired,
            add=desired - current,
            remove=drained_empty,
            reason=f"up {current} → {desired} nodes: {why}",
        )
    if desired < current:
        last = max(
            (t for t in (history.last_scale_up, history.last_scale_down) if t is not None),
            default=None,
        )
        since = _since(state.now, last)
        if current <= pool.max_nodes and since < pool.scale_down_cooldown_s:
            return PoolDecision(
                pool.name,
                current,
                current,
                remove=drained_empty,
                reason=(
                    f"hold: scale-down cooldown ({since:.0f} s of "
                    f"{pool.scale_down_cooldown_s:.0f} s)"
                ),
            )
        remove, drain, waiting = _choose_removals(state.now, pool, nodes, current - desired)
        note = f"; {waiting} idle node(s) wait for the idle timeout" if waiting else ""
        return PoolDecision(
            pool.name,
            current,
            desired,
            remove=drained_empty + remove,
            drain=drain,
            reason=f"down {current} → {desired} nodes: {why}{note}",
        )
    return PoolDecision(
        pool.name,
        current,
        current,
        remove=drained_empty,
        reason=f"hold at {current} nodes" + (f": {why}" if direction == "hold" else ""),
    )


def _choose_removals(
    now: float, pool: NodePool, nodes: tuple[NodeStatus, ...], count: int
) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """Nodes to release now, nodes to drain, and idle nodes still waiting for the timeout."""
    staying = [n for n in nodes if not n.draining]
    provisioning = [n for n in reversed(staying) if not n.ready]
    idle = [n for n in staying if n.ready and n.used_gpus == 0]
    since = {n.name: now if n.idle_since is None else n.idle_since for n in idle}
    idle.sort(key=lambda n: since[n.name])
    expired = [n for n in idle if now - since[n.name] >= pool.idle_timeout_s]
    young = [n for n in idle if n not in expired]
    remove = [n.name for n in provisioning[:count]]
    remove += [n.name for n in expired[: count - len(remove)]]
    left = count - len(remove)
    waiting = min(left, len(young))
    left -= waiting
    busy = sorted((n for n in staying if n.ready and n.used_gpus > 0), key=lambda n: n.used_gpus)
    drain = tuple(n.name for n in busy[:left])
    return tuple(remove), drain, waiting


def _since(now: float, when: float | None) -> float:
    return math.inf if when is None else now - when


def _fraction(value: float) -> str:
    return "∞" if math.isinf(value) else ("n/a" if math.isnan(value) else f"{value:.2f}")


def _validate(state: AutoscaleState) -> None:
    names = [p.name for p in state.pools]
    if not names:
        raise AutoscaleInputError("pools", "need at least one node pool")
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        raise AutoscaleInputError("pools", f"pool name {dup[0]!r} appears more than once")
    nodes = [n.name for n in state.nodes]
    dup = [n for n, c in Counter(nodes).items() if c > 1]
    if dup:
        raise AutoscaleInputError("nodes", f"node name {dup[0]!r} appears more than once")
    known = set(names)
    for node in state.nodes:
        if node.pool not in known:
            raise AutoscaleInputError(f"nodes[{node.name}].pool", f"unknown pool {node.pool!r}")
