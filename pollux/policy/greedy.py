"""Pollux's greedy marginal-gain optimiser over a `Problem` (replaces the paper's NSGA-II, §4.4).

1. **Counts**: GPUs go to the jobs that gain most per GPU, one jump at a time, placements
   assumed consolidated; comparing jumps by gain per GPU handles non-concave speedup curves
   and the bonus for an unchanged allocation.
2. **Placement**: jobs that keep their count keep their nodes (no restart); the rest are placed
   largest first, on one node (best fit) or across nodes with no other distributed job.
3. **Fill**: GPUs stranded by fragmentation go to the growth moves with the best exact gain.

Deterministic: ties go to the earlier job and node of the snapshot. With tenants
(`quota.Quota`) no phase takes a tenant past its GPU budget.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pollux.policy.problem import Problem
from pollux.policy.quota import Quota
from pollux.policy.valuation import utility

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def search(problem: Problem, quota: Quota | None = None) -> IntArray:
    """The jobs × nodes matrix the phases choose, then improved by local search.

    Counts chosen without regard to packing can strand GPUs (three distributed jobs of 9-10
    GPUs need 9 whole nodes of 4). When placement could not realise them, counts with
    distributed jobs in whole nodes (which always pack) are tried too, and the better by the
    objective wins. `quota`: each tenant's budget, kept by every phase; GPUs still idle at the
    end are lent to tenants below their caps.
    """
    candidates = []
    for whole_nodes in (False, True):
        counts, keep = choose_counts(problem, whole_nodes=whole_nodes, quota=quota)
        placed = place(problem, counts, keep)
        candidates.append(fill(problem, placed, quota))
        if placed.sum() == counts.sum():
            break  # everything packed: the whole-node strategy has nothing to fix
    best = max(candidates, key=lambda placed: total_utility(problem, placed))
    if quota is None:
        return improve(problem, best)
    # Work-conserving: GPUs no tenant could use within its budget go to any that can, up to
    # its cap (they are back in the split next round).
    return fill(problem, improve(problem, best, quota), quota.lent())


def total_utility(problem: Problem, placed: IntArray) -> float:
    """Σ_j w_p(x_j) of a jobs × nodes matrix (ordered like the power mean)."""
    return float(problem.utilities(placed).sum())


# -- phase 1: GPU counts --------------------------------------------------------------------


def count_utilities(problem: Problem, *, whole_nodes: bool = False) -> tuple[FloatArray, BoolArray]:
    """U[j, k]: utility of job j with k GPUs on a consolidated placement (−inf: not allowed).

    At k equal to the current size the job may also keep its current placement with no
    restart penalty, whichever is worth more; the second result says where keeping won.
    """
    width = int(problem.max_k.max(initial=0)) + 1
    table = np.full((problem.num_jobs, width), -np.inf)
    eps, p = problem.params.epsilon, problem.params.p
    staying = problem.utilities(problem.current)
    table[:, 0] = utility(np.array([eps]), p)[0]
    tops = problem.max_k
    jobs = np.repeat(problem.every_job, tops)
    ks = np.arange(jobs.size) - np.repeat(np.cumsum(tops) - tops, tops) + 1
    speed = problem.speedups.lookup(jobs, problem.consolidated_nodes(ks), ks)
    table[jobs, ks] = utility(problem.scale * speed * problem.penalty[jobs] + eps, p)
    if problem.weight is not None:
        table *= problem.weight[:, None]
    k_cur = problem.current_k
    stays = np.nonzero((k_cur > 0) & (k_cur <= tops))[0]
    stay = staying[stays]
    keep = np.zeros(problem.num_jobs, dtype=bool)
    keep[stays] = stay >= table[stays, k_cur[stays]]
    table[stays, k_cur[stays]] = np.maximum(table[stays, k_cur[stays]], stay)
    sizes = np.arange(width)
    below_gang = (sizes >= 1) & (sizes < problem.min_k[:, None])
    table[below_gang] = -np.inf
    if whole_nodes:
        g = max(problem.gpus_per_node, 1)
        partial = (sizes > g) & (sizes % g != 0) & (sizes != k_cur[:, None])
        table[partial] = -np.inf
    return table, keep


def choose_counts(
    problem: Problem, *, whole_nodes: bool = False, quota: Quota | None = None
) -> tuple[IntArray, BoolArray]:
    """Greedy: repeatedly make the jump (job, new size) with the best utility gain per GPU.

    Two budgets are kept: GPUs, and — with interference avoidance — nodes for distributed
    jobs, since no two distributed jobs may share a node (a job larger than one node needs
    ceil(K / G) nodes of its own; single-node jobs may fill their leftover GPUs).

    With `whole_nodes`, jobs larger than a node may only take whole nodes (or keep their
    current size). With a `quota`, a third budget per tenant. Returns the counts and, per job,
    whether staying exactly where it is beat re-placing it.

    Each job's best jump is kept in a heap and recomputed only when the job grows or when the
    jump no longer fits the budgets as it reaches the top: budgets only shrink, so a jump that
    still fits is still its job's best, and one that does not is an upper bound.
    """
    table, keep = count_utilities(problem, whole_nodes=whole_nodes)
    num_jobs, width = table.shape
    counts = np.zeros(num_jobs, dtype=np.int64)
    free = problem.total_gpus
    sizes = np.arange(width)
    node_need = distributed_nodes(problem, sizes)
    free_nodes = len(problem.node_names)
    spare = _Spare(quota)

    def best_jumps(rows: IntArray) -> tuple[FloatArray, IntArray]:
        jump = sizes[None, :] - counts[rows, None]
        more_nodes = node_need[None, :] - node_need[counts[rows], None]
        ok = (jump > 0) & (jump <= free) & (more_nodes <= free_nodes) & spare.allows(jump, rows)
        here = table[rows, counts[rows]][:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            gain = np.where(ok, (table[rows] - here) / np.where(ok, jump, 1), -np.inf)
        best = np.argmax(gain, axis=1)
        return gain[np.arange(rows.size), best], best

    def best_jump(j: int, now: int) -> tuple[float, int]:
        """`best_jumps` of one job at size `now`: the jumps that fit are sizes now+1 … top."""
        top = min(now + free, now + spare.room(j), width - 1)
        top = min(top, int(np.searchsorted(node_need, node_need[now] + free_nodes, "right")) - 1)
        if top <= now:
            return -math.inf, 0
        gain = (table[j, now + 1 : top + 1] - table[j, now]) / sizes[1 : top - now + 1]
        best = int(np.argmax(gain))
        if gain[best] == -np.inf:
            return -math.inf, 0
        return float(gain[best]), now + 1 + best

    first_gains, first_targets = best_jumps(problem.every_job)
    targets = first_targets.tolist()
    heap = [(-g, j) for j, g in enumerate(first_gains.tolist())]
    heapq.heapify(heap)
    count = [0] * num_jobs
    while free > 0 and heap:
        loss, j = heap[0]
        target, now = targets[j], count[j]
        if (
            target - now > min(free, spare.room(j))
            or node_need[target] - node_need[now] > free_nodes
        ):
            gain, targets[j] = best_jump(j, now)  # its jump no longer fits
            heapq.heapreplace(heap, (-gain, j))
            continue
        if not -loss > 0:
            break
        spare.take(j, target - now)
        free -= target - now
        free_nodes -= int(node_need[target] - node_need[now])
        count[j] = target
        gain, targets[j] = best_jump(j, target)
        heapq.heapreplace(heap, (-gain, j))
    counts[:] = count
    return counts, keep


class _Spare:
    """GPUs each job's tenant may still take in the count phase (no limit without a quota)."""

    def __init__(self, quota: Quota | None) -> None:
        self.quota = quota
        self.owner = quota.of_job.tolist() if quota is not None else []
        self.left = quota.budget.tolist() if quota is not None else []

    def room(self, j: int) -> float:
        """What job j's tenant may still take."""
        return self.left[self.owner[j]] if self.quota is not None else math.inf

    def take(self, j: int, gpus: int) -> None:
        """Job j's tenant takes `gpus` more."""
        if self.quota is not None:
            self.left[self.owner[j]] -= gpus

    def allows(self, jump: IntArray, rows: IntArray) -> BoolArray | bool:
        """Whether each job of `rows` may jump by `jump` (rows × sizes) within its budget."""
        if self.quota is None:
            return True
        left = np.array(self.left, dtype=np.int64)[self.quota.of_job[rows]]
        return np.asarray(jump <= left[:, None])


def distributed_nodes(problem: Problem, sizes: IntArray) -> IntArray:
    """Nodes a job of each size must hold exclusively (0 unless it spans several nodes)."""
    if not problem.params.interference_avoidance:
        return np.zeros_like(sizes)
    span = problem.consolidated_nodes(sizes)
    return np.where(span > 1, span, 0)


# -- phase 2: placement ---------------------------------------------------------------------


@dataclass(slots=True)
class Cluster:
    """Mutable placement state: the jobs × nodes matrix, free GPUs and distributed owners."""

    placed: IntArray
    free: IntArray
    owner: IntArray  # index of the distributed job on each node, or -1
    spans: list[int]  # nodes each job holds

    @classmethod
    def empty(cls, problem: Problem) -> Cluster:
        """No job placed yet."""
        return cls(
            placed=np.zeros_like(problem.current),
            free=problem.capacity.copy(),
            owner=np.full(problem.capacity.size, -1, dtype=np.int64),
            spans=[0] * problem.num_jobs,
        )

    def assign(self, j: int, row: IntArray) -> None:
        """Give job j exactly `row` (its previous GPUs are released first)."""
        self.release(j)
        self.placed[j] = row
        self.free -= row
        self.spans[j] = int(np.count_nonzero(row))
        if self.spans[j] > 1:
            self.owner[row > 0] = j

    def release(self, j: int) -> None:
        """Take all GPUs away from job j."""
        if self.spans[j] == 0:
            return  # it holds nothing, so it owns no node either
        self.free += self.placed[j]
        if self.spans[j] > 1:
            self.owner[self.owner == j] = -1
        self.placed[j] = 0
        self.spans[j] = 0


def place(problem: Problem, counts: IntArray, keep: BoolArray) -> IntArray:
    """Realise the chosen counts on nodes; jobs whose stay won in phase 1 keep their nodes."""
    cluster = Cluster.empty(problem)
    kept = set()
    wanted, current_k = counts.tolist(), problem.current_k.tolist()
    for j in np.nonzero(keep)[0].tolist():
        if wanted[j] == current_k[j] and fits_as_is(problem, cluster, j):
            cluster.assign(j, problem.current[j].copy())
            kept.add(j)
    order = sorted(
        (j for j in range(problem.num_jobs) if wanted[j] > 0 and j not in kept),
        key=lambda j: (-wanted[j], j),
    )
    # GPUs still held by jobs placed later: avoid them so those jobs can stay where they are.
    reserved = problem.current[order].sum(axis=0) if order else np.zeros_like(cluster.free)
    for j in order:
        reserved -= problem.current[j]
        options = _placements(problem, cluster, j, wanted[j], reserved)
        if wanted[j] == current_k[j] and fits_as_is(problem, cluster, j):
            options.append(
                (problem.current[j].copy(), int(problem.current_spans[j]), current_k[j], False)
            )
        if options:
            values = problem.row_values(
                j, [o[1] for o in options], [o[2] for o in options], [o[3] for o in options]
            )
            cluster.assign(j, options[int(np.argmax(values))][0])
    return cluster.placed


def fits_as_is(problem: Problem, cluster: Cluster, j: int) -> bool:
    """Whether job j's current placement is still free and interference-safe."""
    row = problem.current[j]
    if (row > cluster.free).any():
        return False
    avoid = problem.params.interference_avoidance
    return not (avoid and problem.current_spans[j] > 1 and (cluster.owner[row > 0] >= 0).any())


def placement_options(
    problem: Problem, cluster: Cluster, j: int, k: int, reserved: IntArray | None = None
) -> list[IntArray]:
    """Up to two placements of k GPUs for job j: on one node, and across nodes.

    Each is shrunk to what fits. Nodes are ranked: the job's own nodes first, then those where
    it would take the fewest GPUs `reserved` by jobs not yet placed, then (one node) the best
    fit or (spread) the most free GPUs, then node order. The spread option uses only nodes that
    host no other distributed job, up to the node cap.
    """
    return [option[0] for option in _placements(problem, cluster, j, k, reserved)]


def _placements(
    problem: Problem, cluster: Cluster, j: int, k: int, reserved: IntArray | None
) -> list[tuple[IntArray, int, int, bool]]:
    """`placement_options` with each row's N, K and whether it differs from the current one."""
    free = cluster.free
    own = problem.current[j] > 0
    unclaimed = free - (reserved if reserved is not None else 0)
    options = []
    fits = np.nonzero(free >= k)[0]
    node, size = -1, 0
    if fits.size:
        evicts = np.maximum(k - unclaimed[fits], 0)
        node, size = int(fits[np.lexsort((fits, free[fits], evicts, ~own[fits]))[0]]), k
    elif free.max(initial=0) > 0:
        some = np.nonzero(free > 0)[0]
        node = int(some[np.lexsort((some, -free[some], -unclaimed[some], ~own[some]))[0]])
        size = int(free[node])
    if node >= 0:
        same = problem.current_spans[j] == 1 and problem.current[j, node] == size
        options.append((_single(free.size, node, size), 1, size, not same))
    open_nodes = free > 0
    if problem.params.interference_avoidance:
        open_nodes &= cluster.owner < 0
    candidates = np.nonzero(open_nodes)[0]
    if candidates.size > 1 and _first_free(candidates, free, unclaimed, own) < k:
        keys = (candidates, -free[candidates], -unclaimed[candidates], ~own[candidates])
        ranked = candidates[np.lexsort(keys)][: problem.max_nodes]
        row = _take(free, ranked, k)
        spans = int(np.count_nonzero(row))
        if spans > 1:
            changed = bool((row != problem.current[j]).any())
            options.append((row, spans, int(row.sum()), changed))
    return options


def _first_free(candidates: IntArray, free: IntArray, unclaimed: IntArray, own: BoolArray) -> int:
    """Free GPUs of the node the spread option would rank first.

    When they hold all k GPUs the spread row is the single-node one, so ranking is skipped.
    """
    mine = own[candidates]
    if mine.any():
        candidates = candidates[mine]
    spare = unclaimed[candidates]
    return int(free[candidates][spare == spare.max()].max())


def _single(size: int, node: int, k: int) -> IntArray:
    row = np.zeros(size, dtype=np.int64)
    row[node] = k
    return row


# -- phase 3: fill idle GPUs ----------------------------------------------------------------


def fill(problem: Problem, placed: IntArray, quota: Quota | None = None) -> IntArray:
    """Give GPUs left idle to the growth moves with the best exact utility gain per GPU.

    With a `quota`, a job grows only as far as its tenant's budget allows.

    Each pass values every job's growth options in one batch: nothing changes within a pass,
    and the best move is the first largest gain in job order, as if judged one by one.
    """
    cluster = Cluster.empty(problem)
    for j in range(problem.num_jobs):
        if placed[j].any():
            cluster.assign(j, placed[j].copy())
    while cluster.free.sum() > 0:
        idle = _Idle.of(problem, cluster, quota)
        jobs: list[int] = []
        rows: list[IntArray] = []
        growing: list[int] = []
        for j in np.nonzero(idle.room > 0)[0].tolist():
            options = growth_options(problem, cluster, j, idle)
            if options:
                growing.append(j)
                jobs += [j] * len(options)
                rows += options
        if not rows:
            break
        grow = np.array(growing)
        here = np.zeros(problem.num_jobs)
        here[grow] = problem.values_at(
            grow, idle.spans[grow], idle.held[grow], idle.moved[grow]
        )  # before the options: the order in which one-by-one valuation would ask
        candidates, owner = np.array(rows), np.array(jobs)
        values = problem.row_utilities(owner, candidates)
        gains = (values - here[owner]) / (candidates.sum(axis=1) - idle.held[owner])
        best = int(np.argmax(gains))
        if not gains[best] > 0.0:
            break
        cluster.assign(int(owner[best]), candidates[best])
    return cluster.placed


@dataclass(frozen=True, slots=True)
class _Idle:
    """Idle GPUs and every job's holdings during one fill pass, computed once for all jobs.

    Attributes:
        total: Idle GPUs.
        nodes: Nodes with idle GPUs, in node order.
        spread: Those a job may spread onto (no distributed job on them under interference
            avoidance), most idle GPUs first, then node order.
        held: GPUs per job.
        spans: Nodes per job.
        room: GPUs each job may still add.
        moved: Whether a job's row differs from its current allocation.
        blocked: Whether a job shares a node with another distributed job.
    """

    total: int
    nodes: list[int]
    spread: list[int]
    held: IntArray
    spans: IntArray
    room: IntArray
    moved: BoolArray
    blocked: BoolArray

    @classmethod
    def of(cls, problem: Problem, cluster: Cluster, quota: Quota | None = None) -> _Idle:
        """The state of `cluster` now; with a `quota`, room stops at the tenant's budget."""
        free, placed, owner = cluster.free, cluster.placed, cluster.owner
        nodes = np.nonzero(free > 0)[0]
        avoid = problem.params.interference_avoidance
        spread = nodes[owner[nodes] < 0] if avoid else nodes
        held = placed.sum(axis=1)
        blocked = np.zeros(problem.num_jobs, dtype=bool)
        if avoid:
            others = (owner >= 0) & (owner != problem.every_job[:, None])
            blocked = ((placed > 0) & others).any(axis=1)
        room = problem.max_k - held
        if quota is not None:
            spare = quota.budget - quota.usage(held)
            room = np.minimum(room, spare[quota.of_job])
        return cls(
            total=int(free.sum()),
            nodes=nodes.tolist(),
            spread=spread[np.lexsort((spread, -free[spread]))].tolist(),
            held=held,
            spans=np.count_nonzero(placed, axis=1),
            room=room,
            moved=(placed != problem.current).any(axis=1),
            blocked=blocked,
        )


def growth_options(
    problem: Problem, cluster: Cluster, j: int, idle: _Idle | None = None
) -> list[IntArray]:
    """Rows that add idle GPUs to job j, never past its max_replicas.

    A job without GPUs gets fresh placements of every size that fits; a running job can grow
    on the nodes it holds (N unchanged) or, unless it shares a node with another distributed
    job, spread onto nodes that host no other distributed job. `idle`: the cluster's state,
    when computed already.
    """
    idle = idle or _Idle.of(problem, cluster)
    row = cluster.placed[j]
    k, room = int(idle.held[j]), int(idle.room[j])
    if room <= 0 or idle.total == 0:
        return []
    if k == 0:
        top = min(room, idle.total)
        sizes = range(max(1, int(problem.min_k[j])), top + 1)
        return [o for size in sizes for o in placement_options(problem, cluster, j, size)]
    free = cluster.free
    own = [(node, int(free[node])) for node in idle.nodes if row[node] > 0]
    local = min(room, sum(count for _, count in own))
    options = [_added(row, own, extra) for extra in range(1, local + 1)]
    if idle.blocked[j]:
        return options  # it shares a node with another distributed job: it must stay local
    slots = problem.max_nodes - int(idle.spans[j])
    if slots > 0:
        ranked = [(node, int(free[node])) for node in idle.spread if row[node] == 0][:slots]
        if ranked and local < room:  # some GPUs come from a new node
            options.append(_added(row, own + ranked, room))
    return options


def _added(row: IntArray, free: list[tuple[int, int]], amount: int) -> IntArray:
    """`row` plus up to `amount` GPUs from (node, free GPUs) pairs, visited in order."""
    out = row.copy()
    for node, count in free:
        take = min(count, amount)
        out[node] += take
        amount -= take
        if amount == 0:
            break
    return out


def _take(free: IntArray, order: IntArray, amount: int) -> IntArray:
    """Up to `amount` GPUs from `free`, visiting nodes in `order`."""
    available = free[order]
    taken = np.minimum(available, np.maximum(amount - np.cumsum(available) + available, 0))
    out = np.zeros_like(free)
    out[order] = taken
    return out


# -- phase 4: local search ------------------------------------------------------------------

MOVE_BUDGET = 4  # moves per node: bounds the search on large clusters
_MIN_GAIN = 1e-9


@dataclass(slots=True)
class _Deltas:
    """How one job's utility changes under the moves the local search considers.

    Attributes:
        lose: node → Δu when the job gives up d = 1, 2, … of its GPUs there.
        gain: node → Δu when it takes d = 1, 2, … more GPUs there (nodes it holds).
        start: Δu when a job without GPUs starts on d = 1, 2, … GPUs of one node.
        move: (Δu, row) of re-placing a single-node job elsewhere on free GPUs, or None.
    """

    lose: dict[int, FloatArray]
    gain: dict[int, FloatArray]
    start: FloatArray
    move: tuple[float, IntArray] | None


def improve(problem: Problem, placed: IntArray, quota: Quota | None = None) -> IntArray:
    """Apply the best improving move, repeatedly, until none is left (or the budget is spent).

    Phases 1–3 cannot trade GPUs between jobs that share a node, nor move a small job out of
    the way so that its neighbour can grow in place. Two moves can, each judged by its exact
    change of the objective: *trade* d GPUs on a node from one job to another (or to a job
    without GPUs), and *make room*: a single-node job moves wholly onto free GPUs elsewhere
    and another job takes the GPUs it left. Only the jobs a move touches are re-evaluated,
    and only the nodes they hold are searched again. With a `quota`, a move that gives a
    tenant GPUs beyond its budget is not considered.
    """
    cluster = Cluster.empty(problem)
    for j in range(problem.num_jobs):
        if placed[j].any():
            cluster.assign(j, placed[j].copy())
    here = problem.utilities(cluster.placed)
    deltas = _all_deltas(problem, cluster, here, list(range(problem.num_jobs)))
    moves = _Moves(problem, cluster, quota)
    for _ in range(MOVE_BUDGET * len(problem.node_names)):
        move = moves.best(deltas)
        if move is None:
            break
        free_before = cluster.free.copy()
        held_before = {j: np.nonzero(cluster.placed[j])[0] for j, _ in move}
        for j, row in move:
            cluster.assign(j, row)
            here[j] = problem.values(j, row)[0]
            if moves.held is not None:
                moves.held[j] = int(row.sum())
        touched = sorted(held_before)
        if not np.array_equal(free_before, cluster.free):
            touched = list(range(problem.num_jobs))  # relocations depend on free GPUs
            moves.forget()
        else:
            for j, row in move:
                moves.forget(np.union1d(held_before[j], np.nonzero(row)[0]))
        for j, delta in zip(touched, _all_deltas(problem, cluster, here, touched), strict=True):
            deltas[j] = delta
    return cluster.placed


def _all_deltas(
    problem: Problem, cluster: Cluster, here: FloatArray, jobs: list[int]
) -> list[_Deltas]:
    """`_Deltas` of each of `jobs`, valued in two batches (all moves, then all relocations)."""
    moves = _MoveSet.of(problem, cluster, jobs)
    values = np.zeros(0)
    if moves.owner:
        who = np.array(moves.owner)
        worth = problem.values_at(
            who, np.array(moves.spans), np.array(moves.sizes), np.array(moves.changed)
        )
        values = worth - here[who]
    relocations = _relocations(problem, cluster, here, jobs)
    out = [_Deltas({}, {}, np.zeros(0), move) for move in relocations]
    for i, kind, node, ds, offset in moves.groups:
        arr = np.full(ds[-1] + 1, -np.inf)
        arr[ds] = values[offset : offset + len(ds)]
        if kind == "lose":
            out[i].lose[node] = arr
        elif kind == "gain":
            out[i].gain[node] = arr
        else:
            out[i].start = arr
    return out


@dataclass(slots=True)
class _MoveSet:
    """The one-node moves of several jobs, described without building their rows.

    A move changes one node of the job's row by d, so its (N, K), and whether it gives back
    the job's current allocation, follow from the row alone.

    Attributes:
        groups: (position in the job list, "lose" | "gain" | "start", node, the amounts d in
            increasing order, index of the first of these moves) per kind of move and node.
        owner: Job of each move.
        spans: N after each move.
        sizes: K after each move.
        changed: Whether the row after the move differs from the current allocation.
    """

    groups: list[tuple[int, str, int, list[int], int]]
    owner: list[int]
    spans: list[int]
    sizes: list[int]
    changed: list[bool]

    @classmethod
    def of(cls, problem: Problem, cluster: Cluster, jobs: list[int]) -> _MoveSet:
        """The moves `_Deltas` values for each of `jobs`."""
        placed, current = cluster.placed[jobs], problem.current[jobs]
        held, spans = placed.sum(axis=1).tolist(), np.count_nonzero(placed, axis=1).tolist()
        differs = placed != current
        capacity = problem.capacity.tolist()
        out = cls([], [], [], [], [])
        for i, j in enumerate(jobs):
            row, k, n = placed[i], held[i], spans[i]
            room, gang = int(problem.max_k[j]) - k, int(problem.min_k[j])
            diff = np.nonzero(differs[i])[0]
            # The one move that gives back the current allocation, (node, change), if any.
            back = (
                (int(diff[0]), int(current[i, diff[0]] - row[diff[0]])) if diff.size == 1 else None
            )
            nodes = np.nonzero(row)[0].tolist()
            for node, r in zip(nodes, row[nodes].tolist(), strict=True):
                # Below its gang size a job runs on all or nothing.
                ds = [d for d in range(1, r + 1) if not 0 < k - d < gang]
                out.add((i, "lose", node), ds, [n - (d == r) for d in ds], k, -1, back)
                ds = list(range(1, min(room, capacity[node] - r) + 1))
                out.add((i, "gain", node), ds, [n] * len(ds), k, 1, back)
            if k == 0 and room > 0:
                ds = list(range(max(1, gang), min(room, problem.gpus_per_node) + 1))
                out.add((i, "start", 0), ds, [1] * len(ds), 0, 1, back)
            out.owner += [j] * (len(out.spans) - len(out.owner))
        return out

    def add(
        self,
        key: tuple[int, str, int],
        ds: list[int],
        spans: list[int],
        k: int,
        sign: int,
        back: tuple[int, int] | None,
    ) -> None:
        """Record the moves of one kind on one node: K becomes k + sign·d for each d in `ds`.

        `back` is the one move, (node, change), that gives back the current allocation.
        """
        if ds:
            i, kind, node = key
            self.groups.append((i, kind, node, ds, len(self.spans)))
            self.spans += spans
            self.sizes += [k + sign * d for d in ds]
            self.changed += [back != (node, sign * d) for d in ds]


def _relocations(
    problem: Problem, cluster: Cluster, here: FloatArray, jobs: list[int]
) -> list[tuple[float, IntArray] | None]:
    """Best re-placement of each single-node job of `jobs` onto free GPUs on other nodes."""
    free_total = int(cluster.free.sum())
    owner: list[int] = []
    options: list[IntArray] = []
    counts = []
    for j in jobs:
        row = cluster.placed[j].copy()  # release() below zeroes the live row
        nodes = np.nonzero(row)[0]
        size = int(row.sum())
        found: list[IntArray] = []
        if nodes.size == 1 and free_total >= size:
            node = int(nodes[0])
            cluster.release(j)
            saved = cluster.free[node]
            cluster.free[node] = 0  # elsewhere: its GPUs here are for the job that takes them
            found = [o for o in placement_options(problem, cluster, j, size) if o.sum() == size]
            cluster.free[node] = saved
            cluster.assign(j, row)
        counts.append(len(found))
        owner += [j] * len(found)
        options += found
    out: list[tuple[float, IntArray] | None] = [None] * len(jobs)
    if options:
        rows, who = np.array(options), np.array(owner)
        values = problem.row_utilities(who, rows)
        gains = values - here[who]
        start = 0
        for i, count in enumerate(counts):
            if count:
                best = start + int(np.argmax(gains[start : start + count]))
                out[i] = float(gains[best]), options[best]
            start += count
    return out


class _Moves:
    """The best move found on each node, kept until a move touches the node's jobs.

    The best move overall is the first largest of the nodes' bests in node order, exactly
    the move a search over every node would find.
    """

    def __init__(self, problem: Problem, cluster: Cluster, quota: Quota | None = None) -> None:
        self.problem = problem
        self.cluster = cluster
        self.quota = quota
        # With a quota: GPUs per job (kept up to date by `improve`) and the last tenant state.
        self.held = cluster.placed.sum(axis=1) if quota is not None else None
        self.limits: _Limits | None = None
        self.gain = np.full(len(problem.node_names), -np.inf)
        self.move: list[list[tuple[int, IntArray]] | None] = [None] * self.gain.size
        self.stale = np.ones(self.gain.size, dtype=bool)
        self.idle: tuple[FloatArray, IntArray] | None = None

    def forget(self, nodes: IntArray | None = None) -> None:
        """Search `nodes` (default: all) again at the next `best`."""
        if nodes is None:
            self.stale[:] = True
        else:
            self.stale[nodes] = True

    def best(self, deltas: list[_Deltas]) -> list[tuple[int, IntArray]] | None:
        """The improving trade or make-room move with the largest gain: (job, new row) pairs."""
        idle = _best_idle(self.problem, deltas)
        if self.idle is None or not all(map(np.array_equal, idle, self.idle)):
            self.stale[:] = True  # every node may trade with a job without GPUs
        self.idle = idle
        limits = None
        if self.quota is not None and self.held is not None:
            limits = _Limits.of(self.quota, self.held, deltas, self.problem.gpus_per_node)
            if self.limits is None or not limits.same(self.limits):
                self.stale[:] = True  # what every tenant may take has changed
            self.limits = limits
        held = self.cluster.placed.sum(axis=0) > 0
        for node in np.nonzero(self.stale)[0].tolist():
            self.gain[node], self.move[node] = -np.inf, None
            if held[node]:
                gain, move = (
                    _node_move(self.cluster, deltas, idle, node)
                    if limits is None
                    else _node_move_within(self.cluster, deltas, node, limits)
                )
                if move is not None:
                    self.gain[node], self.move[node] = gain, move
        self.stale[:] = False
        node = int(np.argmax(self.gain))
        return self.move[node] if self.gain[node] > -np.inf else None


def _node_move(
    cluster: Cluster, deltas: list[_Deltas], idle: tuple[FloatArray, IntArray], node: int
) -> tuple[float, list[tuple[int, IntArray]] | None]:
    """The improving trade or make-room move on `node` with the largest gain, and the gain."""
    idle_gain, idle_job = idle
    best_gain, best_move = _MIN_GAIN, None
    holders = np.nonzero(cluster.placed[:, node])[0].tolist()
    for giver in holders:
        losses = deltas[giver].lose.get(node)
        relocation = deltas[giver].move
        held = int(cluster.placed[giver, node])
        takers = [(t, deltas[t].gain.get(node)) for t in holders if t != giver]
        takers.append((-1, idle_gain))  # -1: the best job without GPUs, per amount
        for taker, gains in takers:
            if gains is None:
                continue
            if losses is not None:
                top = min(losses.size, gains.size)
                total = losses[1:top] + gains[1:top]
                if total.size and total.max() > best_gain:
                    d = int(np.argmax(total)) + 1
                    best_gain = float(total.max())
                    who = taker if taker >= 0 else int(idle_job[d])
                    best_move = _trade(cluster, node, giver, who, d)
            if relocation is not None and held < gains.size:
                total_room = relocation[0] + gains[held]
                if total_room > best_gain:
                    best_gain = float(total_room)
                    who = taker if taker >= 0 else int(idle_job[held])
                    best_move = [
                        (giver, relocation[1]),
                        (who, _grown(cluster, who, node, held)),
                    ]
    return best_gain, best_move


def _node_move_within(
    cluster: Cluster, deltas: list[_Deltas], node: int, limits: _Limits
) -> tuple[float, list[tuple[int, IntArray]] | None]:
    """`_node_move` under tenant budgets: a taker's tenant must have room for what it takes.

    A trade within one tenant leaves its total unchanged; a make-room move adds the GPUs the
    taker takes (the giver keeps its own, moved elsewhere). Jobs without GPUs compete per
    tenant. (A copy of `_node_move`'s loop rather than a shared one: the check would slow the
    single-pool search, which runs on every round.)
    """
    best_gain, best_move = _MIN_GAIN, None
    holders = np.nonzero(cluster.placed[:, node])[0].tolist()
    of_job, spare = limits.of_job, limits.spare
    for giver in holders:
        losses = deltas[giver].lose.get(node)
        relocation = deltas[giver].move
        held = int(cluster.placed[giver, node])
        takers: list[tuple[int, FloatArray | None, IntArray | None, int]] = [
            (t, deltas[t].gain.get(node), None, of_job[t]) for t in holders if t != giver
        ]
        takers += [(-1, *best) for best in limits.idle]  # -1: the best job without GPUs
        for taker, gains, idle_job, tenant in takers:
            if gains is None:
                continue
            room = spare[tenant]
            trades = gains.size if tenant == of_job[giver] else min(gains.size, room + 1)
            if losses is not None:
                top = min(losses.size, trades)
                total = losses[1:top] + gains[1:top]
                if total.size and total.max() > best_gain:
                    d = int(np.argmax(total)) + 1
                    best_gain = float(total.max())
                    who = taker if idle_job is None else int(idle_job[d])
                    best_move = _trade(cluster, node, giver, who, d)
            if held <= room and relocation is not None and held < gains.size:
                total_room = relocation[0] + gains[held]
                if total_room > best_gain:
                    best_gain = float(total_room)
                    who = taker if idle_job is None else int(idle_job[held])
                    best_move = [
                        (giver, relocation[1]),
                        (who, _grown(cluster, who, node, held)),
                    ]
    return best_gain, best_move


@dataclass(frozen=True, slots=True)
class _Limits:
    """What each tenant may still take during the local search.

    Attributes:
        of_job: Each job's tenant.
        spare: GPUs each tenant may still take before it reaches its budget.
        idle: Per tenant with a job without GPUs: (gain, job) per amount, as `_best_idle`
            gives for all jobs, and the tenant.
    """

    of_job: list[int]
    spare: list[int]
    idle: list[tuple[FloatArray, IntArray, int]]

    @classmethod
    def of(cls, quota: Quota, held: IntArray, deltas: list[_Deltas], width: int) -> _Limits:
        """The limits with jobs holding `held` GPUs."""
        count = quota.budget.size
        gain = np.full((count, width + 1), -np.inf)
        job = np.full((count, width + 1), -1, dtype=np.int64)
        of_job = quota.of_job.tolist()
        for j, delta in enumerate(deltas):
            start = delta.start
            if start.size == 0:
                continue
            t = of_job[j]
            better = np.nonzero(start > gain[t, : start.size])[0]
            gain[t, better] = start[better]
            job[t, better] = j
        idle = [(gain[t], job[t], t) for t in range(count) if (job[t] >= 0).any()]
        spare = (quota.budget - quota.usage(held)).tolist()
        return cls(of_job, spare, idle)

    def same(self, other: _Limits) -> bool:
        """Whether every move allowed under `other` is allowed, and valued, alike here."""
        return (
            self.spare == other.spare
            and len(self.idle) == len(other.idle)
            and all(
                a[2] == b[2] and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                for a, b in zip(self.idle, other.idle, strict=True)
            )
        )


def _best_idle(problem: Problem, deltas: list[_Deltas]) -> tuple[FloatArray, IntArray]:
    """For each amount d, the largest gain of a job without GPUs starting on d, and the job."""
    width = problem.gpus_per_node + 1
    gain = np.full(width, -np.inf)
    job = np.full(width, -1, dtype=np.int64)
    for j, delta in enumerate(deltas):
        start = delta.start
        if start.size == 0:
            continue
        better = np.nonzero(start > gain[: start.size])[0]
        gain[better] = start[better]
        job[better] = j
    return gain, job


def _trade(
    cluster: Cluster, node: int, giver: int, taker: int, d: int
) -> list[tuple[int, IntArray]]:
    giver_row = cluster.placed[giver].copy()
    giver_row[node] -= d
    return [(giver, giver_row), (taker, _grown(cluster, taker, node, d))]


def _grown(cluster: Cluster, j: int, node: int, d: int) -> IntArray:
    row: IntArray = cluster.placed[j].copy()
    row[node] += d
    return row
