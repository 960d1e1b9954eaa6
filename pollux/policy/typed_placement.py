"""Typed placement: each job's chosen option on nodes of its group, one GPU type per job.

Per node group, in this order: jobs keeping their allocation keep their nodes; jobs of
several nodes take whole free nodes (so no two distributed jobs share one); jobs of one node
go largest first to the fullest node with room (best fit), so sizes of 1, 2, 4, … fill nodes
exactly. When kept jobs fragment a group so that a chosen option finds no room, the group is
packed again with its kept single-node jobs movable (those displaced pay their restart
penalty), and the better of the two packings by the objective is kept; a job still without
room takes the best of its group's options that fits, or none. GPUs left idle then go to
unplaced jobs whose options fit, best gain first. Ties go to the earlier job and node.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pollux.policy.typed_problem import TypedProblem
from pollux.policy.types import Allocation

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Placed:
    """Where every job runs after placement.

    Attributes:
        allocations: Each job's allocation (() for none), replicas in node order.
        column: Each job's final option (−1: none; `TypedProblem.stay`: the GPUs it holds
            now, kept, or moved when `changed`).
        group: Each job's node group (−1: none).
        speed: Each job's speedup on its allocation (0: none).
        changed: Whether its allocation differs from its current one.
        blocked: Whether it did not get the option it was assigned (fragmentation).
    """

    allocations: Mapping[str, Allocation]
    column: IntArray
    group: IntArray
    speed: FloatArray
    changed: BoolArray
    blocked: BoolArray


class _Layout:
    """One group's nodes while it is packed.

    Free GPUs per node, the nodes by their free GPUs (each list ascending), and who holds
    what.
    """

    __slots__ = ("by_free", "free", "held", "per_node")

    def __init__(self, per_node: int, nodes: int) -> None:
        self.per_node = per_node
        self.free = [per_node] * nodes
        self.by_free: list[list[int]] = [[] for _ in range(per_node + 1)]
        self.by_free[per_node] = list(range(nodes))
        self.held: dict[int, dict[int, int]] = {}

    def whole(self) -> list[int]:
        """Nodes with every GPU free, in order."""
        return list(self.by_free[self.per_node])

    def _move(self, node: int, delta: int) -> None:
        before = self.free[node]
        self.by_free[before].remove(node)
        insort(self.by_free[before + delta], node)
        self.free[node] = before + delta

    def take(self, job: int, counts: Mapping[int, int]) -> None:
        for node, count in counts.items():
            self._move(node, -count)
        self.held[job] = dict(counts)

    def largest(self) -> int:
        """The most free GPUs on one node."""
        return next((f for f in range(self.per_node, 0, -1) if self.by_free[f]), 0)

    def best_fit(self, gpus: int) -> int | None:
        """The node with the fewest free GPUs that still has `gpus` (first of equals)."""
        for free in range(max(gpus, 1), self.per_node + 1):
            if self.by_free[free]:
                return self.by_free[free][0]
        return None

    def fits(self, nodes: int, gpus: int) -> bool:
        if nodes == 1:
            return self.largest() >= gpus
        return len(self.by_free[self.per_node]) >= nodes

    def place(self, job: int, nodes: int, gpus: int) -> bool:
        """Place `gpus` on one node (best fit) or on `nodes` whole free nodes."""
        if nodes == 1:
            node = self.best_fit(gpus)
            if node is None:
                return False
            self.take(job, {node: gpus})
            return True
        whole = self.by_free[self.per_node]
        if len(whole) < nodes:
            return False
        self.take(job, dict.fromkeys(whole[:nodes], self.per_node))
        return True


def place(
    problem: TypedProblem, column: IntArray, budgets: tuple[IntArray, FloatArray] | None = None
) -> Placed:
    """Place every job on the option `column` chose for it (module docstring).

    Args:
        problem: The round.
        column: Each job's chosen option (−1: none), one per job.
        budgets: Each job's tenant and each tenant's GPU budget, which the chosen options
            keep and filling idle GPUs must keep too; None: no tenants.
    """
    jobs = problem.state.jobs
    num = len(jobs)
    stay = problem.stay
    final = np.asarray(column, dtype=np.int64).copy()
    group = np.full(num, -1, dtype=np.int64)
    pick = final >= 0
    group[pick & (final < stay)] = problem.config_group[final[pick & (final < stay)]]
    group[final == stay] = problem.current_group[final == stay]
    blocked = np.zeros(num, dtype=bool)
    index = [{name: i for i, name in enumerate(g.nodes)} for g in problem.groups]
    layouts = []
    for g in range(len(problem.groups)):
        members = np.nonzero(group == g)[0].tolist()
        strict = _pack(problem, g, members, final, index[g], loose=False)
        if strict.blocked:
            loose = _pack(problem, g, members, final, index[g], loose=True)
            if loose.value > strict.value + 1e-12 * max(1.0, abs(strict.value)):
                strict = loose
        layouts.append(strict.layout)
        for j, col in strict.column.items():
            final[j] = col
            if col < 0:
                group[j] = -1
        for j in strict.blocked:
            blocked[j] = True
    _fill(problem, layouts, final, group, budgets)
    allocations: dict[str, Allocation] = {}
    changed = np.zeros(num, dtype=bool)
    on = group >= 0
    speed = np.where(on, problem.speedup[np.arange(num), np.maximum(final, 0)], 0.0)
    for j, (job, g) in enumerate(zip(jobs, group.tolist(), strict=True)):
        if g < 0:
            allocations[job.name] = ()
            changed[j] = bool(job.allocation)
            continue
        names = problem.groups[g].nodes
        counts = layouts[g].held[j]
        alloc = tuple(names[n] for n in sorted(counts) for _ in range(counts[n]))
        allocations[job.name] = alloc
        changed[j] = alloc != job.allocation and Counter(alloc) != Counter(job.allocation)
    return Placed(allocations, final, group, speed, changed, blocked)


@dataclass(slots=True)
class _Packing:
    """One group's packing as it is built: layout, each job's option, who lost it."""

    layout: _Layout
    column: dict[int, int]
    sticky: dict[int, dict[int, int]] = field(default_factory=dict)
    blocked: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    value: float = 0.0


def _pack(
    problem: TypedProblem,
    g: int,
    members: list[int],
    column: IntArray,
    index: Mapping[str, int],
    *,
    loose: bool,
) -> _Packing:
    """Pack group `g`'s jobs; `loose`: kept single-node jobs may be displaced."""
    group = problem.groups[g]
    layout = _Layout(group.gpus_per_node, len(group.nodes))
    stay = problem.stay
    jobs = problem.state.jobs
    packing = _Packing(layout, dict.fromkeys(members, -1))
    movers: list[tuple[int, int, int]] = []  # (job, nodes, gpus)
    for j in members:
        col = int(column[j])
        if col == stay:
            counts = dict(Counter(index[name] for name in jobs[j].allocation))
            if loose and len(counts) == 1:
                packing.sticky[j] = counts
            else:
                layout.take(j, counts)
                packing.column[j] = stay
        else:
            movers.append((j, int(problem.config_nodes[col]), int(problem.config_gpus[col])))
    for j, n, _ in sorted((m for m in movers if m[1] > 1), key=lambda m: (-m[2], m[0])):
        _distributed(packing, j, n, int(column[j]), loose=loose)
    for j, counts in packing.sticky.items():
        layout.take(j, counts)
        packing.column[j] = stay
    singles = [(j, 1, int(problem.current_gpus[j])) for j in packing.moved]
    singles += [m for m in movers if m[1] == 1]
    for j, _, k in sorted(singles, key=lambda m: (-m[2], m[0])):
        if layout.place(j, 1, k):
            packing.column[j] = stay if j in packing.moved else int(column[j])
        else:
            packing.blocked.append(j)
    # Blocked jobs, best first: the best option of the group that still fits, or none.
    worth = {j: float(problem.utility[j, int(column[j])]) for j in packing.blocked}
    for j in sorted(packing.blocked, key=lambda j: (-worth[j], j)):
        packing.column[j] = _shrink(problem, g, j, layout, displaced=j in packing.moved)
    packing.value = _value(problem, packing, members)
    return packing


def _value(problem: TypedProblem, packing: _Packing, members: list[int]) -> float:
    """Σ utility of the group's jobs as packed (displaced kept jobs pay their penalty)."""
    total, stay = 0.0, problem.stay
    for j in members:
        col = packing.column[j]
        if col < 0:
            total += float(problem.idle[j])
        elif col == stay:
            speed = float(problem.speedup[j, col])
            total += problem.value(j, speed, changed=j in packing.moved)
        else:
            total += float(problem.utility[j, col])
    return total


def _distributed(packing: _Packing, j: int, n: int, col: int, *, loose: bool) -> None:
    """Job j on `n` whole nodes, or blocked if there are not enough.

    Free nodes first, then (`loose`) those held least by kept single-node jobs, which are
    displaced.
    """
    layout, sticky = packing.layout, packing.sticky
    held = Counter(node for counts in sticky.values() for node in counts)
    empty = [i for i, f in enumerate(layout.free) if f == layout.per_node]
    clear = [i for i in empty if i not in held]
    if len(clear) < n and (not loose or len(empty) < n):
        packing.blocked.append(j)
        return
    chosen = (clear + sorted((i for i in empty if i in held), key=lambda i: (held[i], i)))[:n]
    for other in [o for o, counts in sticky.items() if set(counts) & set(chosen)]:
        del sticky[other]
        packing.moved.append(other)
    layout.take(j, dict.fromkeys(sorted(chosen), layout.per_node))
    packing.column[j] = col


def _shrink(problem: TypedProblem, g: int, j: int, layout: _Layout, *, displaced: bool) -> int:
    """Place job j on the best option of group `g` that fits `layout`; its column or −1."""
    stay = problem.stay
    best, best_value = -1, float(problem.idle[j])
    for col in np.nonzero(problem.config_group == g)[0].tolist():
        value = float(problem.utility[j, col])
        n, k = int(problem.config_nodes[col]), int(problem.config_gpus[col])
        if value > best_value and layout.fits(n, k):
            best, best_value = col, value
    if displaced:
        k = int(problem.current_gpus[j])
        value = problem.value(j, float(problem.speedup[j, stay]), changed=True)
        if value > best_value and layout.fits(1, k):
            best, best_value = stay, value
    if best < 0:
        return -1
    if best == stay:
        layout.place(j, 1, int(problem.current_gpus[j]))
    else:
        layout.place(j, int(problem.config_nodes[best]), int(problem.config_gpus[best]))
    return best


def _fill(
    problem: TypedProblem,
    layouts: list[_Layout],
    column: IntArray,
    group: IntArray,
    budgets: tuple[IntArray, FloatArray] | None,
) -> None:
    """Give idle GPUs to unplaced jobs, best gain first, while an option of theirs fits."""
    width = len(problem.configs)
    if not width:
        return
    c_group, c_nodes, c_gpus = problem.config_group, problem.config_nodes, problem.config_gpus
    room, of_job = None, np.zeros(0, dtype=np.int64)
    if budgets is not None:
        of_job, budget = budgets
        held = np.where(column == problem.stay, problem.current_gpus, 0)
        held = np.where(
            (column >= 0) & (column < width), c_gpus[np.clip(column, 0, width - 1)], held
        )
        room = budget - np.bincount(of_job, weights=held, minlength=budget.size)
    for _ in range(sum(sum(layout.free) for layout in layouts)):  # each pass places a job
        waiting = np.nonzero(column < 0)[0]
        if not waiting.size:
            return
        largest = np.array([layout.largest() for layout in layouts])
        whole = np.array([len(layout.by_free[layout.per_node]) for layout in layouts])
        fits = np.where(c_nodes == 1, c_gpus <= largest[c_group], c_nodes <= whole[c_group])
        ok = np.broadcast_to(fits, (waiting.size, width))
        if room is not None:
            ok = ok & (c_gpus[None, :] <= room[of_job[waiting]][:, None] + 1e-9)
        if not ok.any():
            return
        gain = np.where(ok, problem.utility[waiting, :width] - problem.idle[waiting, None], -np.inf)
        row, col = divmod(int(np.argmax(gain)), width)
        if not gain[row, col] > 0:
            return
        j = int(waiting[row])
        g = int(c_group[col])
        layouts[g].place(j, int(c_nodes[col]), int(c_gpus[col]))
        column[j] = col
        group[j] = g
        if room is not None:
            room[of_job[j]] -= c_gpus[col]
