"""Pollux's greedy marginal-gain optimiser (replaces the published NSGA-II, §4.4).

Three phases over a `Problem`:

1. **Counts.** Give GPUs to the jobs whose objective gains most per GPU, one jump at a time,
   assuming consolidated placements. Jumps (not single GPUs) are compared by gain per GPU, so
   non-concave speedup curves and the bonus for keeping an allocation unchanged are handled.
2. **Placement.** Jobs that keep their GPU count keep their exact nodes (no restart); the rest
   are placed largest first, on one node (best fit) or across nodes that host no other
   distributed job (interference avoidance), avoiding GPUs still held by jobs placed later.
3. **Fill.** GPUs left idle by fragmentation go to the growth moves with the best exact gain.

Every phase is deterministic: ties go to the earlier job and node in the snapshot's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pollux.policy.problem import Problem
from pollux.policy.valuation import utility

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def search(problem: Problem) -> IntArray:
    """The jobs × nodes matrix the phases choose, then improved by local search.

    Counts chosen without regard to packing can strand GPUs (three distributed jobs of 9-10
    GPUs need 9 whole nodes of 4). When placement could not realise them, counts with
    distributed jobs in whole nodes (which always pack) are tried too, and the better by the
    objective wins.
    """
    candidates = []
    for whole_nodes in (False, True):
        counts, keep = choose_counts(problem, whole_nodes=whole_nodes)
        placed = place(problem, counts, keep)
        candidates.append(fill(problem, placed))
        if placed.sum() == counts.sum():
            break  # everything packed: the whole-node strategy has nothing to fix
    best = max(candidates, key=lambda placed: total_utility(problem, placed))
    return improve(problem, best)


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
    keep = np.zeros(problem.num_jobs, dtype=bool)
    eps, p = problem.params.epsilon, problem.params.p
    staying = problem.utilities(problem.current)
    for j in range(problem.num_jobs):
        top = int(problem.max_k[j])
        ks = np.arange(1, top + 1)
        table[j, 0] = utility(np.array([eps]), p)[0]
        if top == 0:
            continue
        speed = problem.speedup[j](problem.consolidated_nodes(ks), ks)
        table[j, 1 : top + 1] = utility(problem.scale * speed * problem.penalty[j] + eps, p)
        k_cur = int(problem.current[j].sum())
        if 0 < k_cur <= top:
            stay = float(staying[j])
            keep[j] = stay >= table[j, k_cur]
            table[j, k_cur] = max(table[j, k_cur], stay)
        if problem.min_k[j] > 1:
            table[j, 1 : problem.min_k[j]] = -np.inf
        if whole_nodes:
            g = max(problem.gpus_per_node, 1)
            partial = (ks > g) & (ks % g != 0) & (ks != k_cur)
            table[j, ks[partial]] = -np.inf
    return table, keep


def choose_counts(problem: Problem, *, whole_nodes: bool = False) -> tuple[IntArray, BoolArray]:
    """Greedy: repeatedly make the jump (job, new size) with the best utility gain per GPU.

    Two budgets are kept: GPUs, and — with interference avoidance — nodes for distributed
    jobs, since no two distributed jobs may share a node (a job larger than one node needs
    ceil(K / G) nodes of its own; single-node jobs may fill their leftover GPUs).

    With `whole_nodes`, jobs larger than a node may only take whole nodes (or keep their
    current size). Returns the counts and, per job, whether staying exactly where it is beat
    re-placing it.
    """
    table, keep = count_utilities(problem, whole_nodes=whole_nodes)
    num_jobs, width = table.shape
    counts = np.zeros(num_jobs, dtype=np.int64)
    free = problem.total_gpus
    sizes = np.arange(width)
    node_need = distributed_nodes(problem, sizes)
    free_nodes = len(problem.node_names)

    def best_jumps(rows: IntArray) -> tuple[FloatArray, IntArray]:
        jump = sizes[None, :] - counts[rows, None]
        more_nodes = node_need[None, :] - node_need[counts[rows], None]
        ok = (jump > 0) & (jump <= free) & (more_nodes <= free_nodes)
        here = table[rows, counts[rows]][:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            gain = np.where(ok, (table[rows] - here) / np.where(ok, jump, 1), -np.inf)
        best = np.argmax(gain, axis=1)
        return gain[np.arange(rows.size), best], best

    every = np.arange(num_jobs)
    gains, targets = best_jumps(every)
    while free > 0:
        j = int(np.argmax(gains))
        if not gains[j] > 0:
            break
        free -= int(targets[j] - counts[j])
        free_nodes -= int(node_need[targets[j]] - node_need[counts[j]])
        counts[j] = targets[j]
        jump = targets - counts
        over = (jump > free) | (node_need[targets] - node_need[counts] > free_nodes)
        stale = np.nonzero(over | (every == j))[0]
        gains[stale], targets[stale] = best_jumps(stale)
    return counts, keep


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

    @classmethod
    def empty(cls, problem: Problem) -> Cluster:
        """No job placed yet."""
        return cls(
            placed=np.zeros_like(problem.current),
            free=problem.capacity.copy(),
            owner=np.full(problem.capacity.size, -1, dtype=np.int64),
        )

    def assign(self, j: int, row: IntArray) -> None:
        """Give job j exactly `row` (its previous GPUs are released first)."""
        self.release(j)
        self.placed[j] = row
        self.free -= row
        if np.count_nonzero(row) > 1:
            self.owner[row > 0] = j

    def release(self, j: int) -> None:
        """Take all GPUs away from job j."""
        self.free += self.placed[j]
        self.owner[self.owner == j] = -1
        self.placed[j] = 0


def place(problem: Problem, counts: IntArray, keep: BoolArray) -> IntArray:
    """Realise the chosen counts on nodes; jobs whose stay won in phase 1 keep their nodes."""
    cluster = Cluster.empty(problem)
    kept = set()
    for j in range(problem.num_jobs):
        if keep[j] and counts[j] == problem.current[j].sum() and fits_as_is(problem, cluster, j):
            cluster.assign(j, problem.current[j].copy())
            kept.add(j)
    order = sorted(
        (j for j in range(problem.num_jobs) if counts[j] > 0 and j not in kept),
        key=lambda j: (-counts[j], j),
    )
    # GPUs still held by jobs placed later: avoid them so those jobs can stay where they are.
    reserved = problem.current[order].sum(axis=0) if order else np.zeros_like(cluster.free)
    for j in order:
        reserved = reserved - problem.current[j]
        options = placement_options(problem, cluster, j, int(counts[j]), reserved)
        if counts[j] == problem.current[j].sum() and fits_as_is(problem, cluster, j):
            options.append(problem.current[j].copy())
        if options:
            values = problem.values(j, np.array(options))
            cluster.assign(j, options[int(np.argmax(values))])
    return cluster.placed


def fits_as_is(problem: Problem, cluster: Cluster, j: int) -> bool:
    """Whether job j's current placement is still free and interference-safe."""
    row = problem.current[j]
    if (row > cluster.free).any():
        return False
    avoid = problem.params.interference_avoidance
    return not (avoid and problem.is_distributed(row) and (cluster.owner[row > 0] >= 0).any())


def placement_options(
    problem: Problem, cluster: Cluster, j: int, k: int, reserved: IntArray | None = None
) -> list[IntArray]:
    """Up to two placements of k GPUs for job j: on one node, and across nodes.

    Each is shrunk to what fits. Nodes are ranked: the job's own nodes first, then those where
    it would take the fewest GPUs `reserved` by jobs not yet placed, then (one node) the best
    fit or (spread) the most free GPUs, then node order. The spread option uses only nodes that
    host no other distributed job, up to the node cap.
    """
    free = cluster.free
    own = problem.current[j] > 0
    unclaimed = free - (reserved if reserved is not None else 0)
    options = []
    fits = np.nonzero(free >= k)[0]
    if fits.size:
        evicts = np.maximum(k - unclaimed[fits], 0)
        node = fits[np.lexsort((fits, free[fits], evicts, ~own[fits]))[0]]
        options.append(_single(free.size, node, k))
    elif free.max(initial=0) > 0:
        some = np.nonzero(free > 0)[0]
        node = some[np.lexsort((some, -free[some], -unclaimed[some], ~own[some]))[0]]
        options.append(_single(free.size, node, int(free[node])))
    open_nodes = free > 0
    if problem.params.interference_avoidance:
        open_nodes &= cluster.owner < 0
    candidates = np.nonzero(open_nodes)[0]
    if candidates.size > 1:
        keys = (candidates, -free[candidates], -unclaimed[candidates], ~own[candidates])
        ranked = candidates[np.lexsort(keys)][: problem.max_nodes]
        row = _take(free, ranked, k)
        if np.count_nonzero(row) > 1:
            options.append(row)
    return options


def _single(size: int, node: int, k: int) -> IntArray:
    row = np.zeros(size, dtype=np.int64)
    row[node] = k
    return row


# -- phase 3: fill idle GPUs ----------------------------------------------------------------


def fill(problem: Problem, placed: IntArray) -> IntArray:
    """Give GPUs left idle to the growth moves with the best exact utility gain per GPU."""
    cluster = Cluster.empty(problem)
    for j in range(problem.num_jobs):
        if placed[j].any():
            cluster.assign(j, placed[j].copy())
    while cluster.free.sum() > 0:
        best_gain, best_j, best_row = 0.0, -1, None
        for j in range(problem.num_jobs):
            rows = growth_options(problem, cluster, j)
            if not rows:
                continue
            candidates = np.array(rows)
            added = candidates.sum(axis=1) - cluster.placed[j].sum()
            here = problem.values(j, cluster.placed[j])[0]
            gains = (problem.values(j, candidates) - here) / added
            i = int(np.argmax(gains))
            if gains[i] > best_gain:
                best_gain, best_j, best_row = float(gains[i]), j, candidates[i]
        if best_row is None:
            break
        cluster.assign(best_j, best_row)
    return cluster.placed


def growth_options(problem: Problem, cluster: Cluster, j: int) -> list[IntArray]:
    """Rows that add idle GPUs to job j, never past its max_replicas.

    A job without GPUs gets fresh placements of every size that fits; a running job can grow
    on the nodes it holds (N unchanged) or, unless it shares a node with another distributed
    job, spread onto nodes that host no other distributed job.
    """
    row = cluster.placed[j]
    k = int(row.sum())
    room = int(problem.max_k[j]) - k
    free = cluster.free
    if room <= 0 or free.sum() == 0:
        return []
    if k == 0:
        top = min(room, int(free.sum()))
        sizes = range(max(1, int(problem.min_k[j])), top + 1)
        return [o for size in sizes for o in placement_options(problem, cluster, j, size)]
    own = np.nonzero(row)[0]
    local = min(room, int(free[own].sum()))
    options = [row + _take(free, own, extra) for extra in range(1, local + 1)]
    avoid = problem.params.interference_avoidance
    owners = cluster.owner[own]
    if avoid and np.any((owners >= 0) & (owners != j)):
        return options  # it shares a node with another distributed job: it must stay local
    others = (free > 0) & (row == 0)
    if avoid:
        others &= cluster.owner < 0
    slots = problem.max_nodes - own.size
    if others.any() and slots > 0:
        nodes = np.nonzero(others)[0]
        ranked = nodes[np.lexsort((nodes, -free[nodes]))][:slots]
        grown = row + _take(free, np.concatenate([own, ranked]), room)
        if np.count_nonzero(grown) > own.size:
            options.append(grown)
    return options


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


def improve(problem: Problem, placed: IntArray) -> IntArray:
    """Apply the best improving move, repeatedly, until none is left (or the budget is spent).

    Phases 1–3 cannot trade GPUs between jobs that share a node, nor move a small job out of
    the way so that its neighbour can grow in place. Two moves can, each judged by its exact
    change of the objective: *trade* d GPUs on a node from one job to another (or to a job
    without GPUs), and *make room*: a single-node job moves wholly onto free GPUs elsewhere
    and another job takes the GPUs it left. Only the jobs a move touches are re-evaluated.
    """
    cluster = Cluster.empty(problem)
    for j in range(problem.num_jobs):
        if placed[j].any():
            cluster.assign(j, placed[j].copy())
    here = problem.utilities(cluster.placed)
    deltas = [_deltas(problem, cluster, here, j) for j in range(problem.num_jobs)]
    for _ in range(MOVE_BUDGET * len(problem.node_names)):
        move = _best_move(problem, cluster, deltas)
        if move is None:
            break
        free_before = cluster.free.copy()
        for j, row in move:
            cluster.assign(j, row)
            here[j] = problem.values(j, row)[0]
        touched = {j for j, _ in move}
        if not np.array_equal(free_before, cluster.free):
            touched = set(range(problem.num_jobs))  # relocations depend on free GPUs
        for j in touched:
            deltas[j] = _deltas(problem, cluster, here, j)
    return cluster.placed


def _deltas(problem: Problem, cluster: Cluster, here: FloatArray, j: int) -> _Deltas:
    row = cluster.placed[j]
    k = int(row.sum())
    room = int(problem.max_k[j]) - k
    lose: dict[int, FloatArray] = {}
    gain: dict[int, FloatArray] = {}
    start = np.zeros(0)
    candidates, owners = [], []
    for node in (int(n) for n in np.nonzero(row)[0]):
        for d in range(1, int(row[node]) + 1):
            shrunk = row.copy()
            shrunk[node] -= d
            if 0 < k - d < problem.min_k[j]:
                continue  # below its gang size: all or nothing
            candidates.append(shrunk)
            owners.append(("lose", node, d))
        for d in range(1, min(room, int(problem.capacity[node] - row[node])) + 1):
            grown = row.copy()
            grown[node] += d
            candidates.append(grown)
            owners.append(("gain", node, d))
    if k == 0 and room > 0:
        lowest = max(1, int(problem.min_k[j]))
        for d in range(lowest, min(room, problem.gpus_per_node) + 1):
            candidates.append(_single(row.size, 0, d))
            owners.append(("start", 0, d))
    if candidates:
        values = problem.values(j, np.array(candidates)) - here[j]
        by_kind: dict[tuple[str, int], dict[int, float]] = {}
        for (kind, node, d), value in zip(owners, values, strict=True):
            by_kind.setdefault((kind, node), {})[d] = float(value)
        for (kind, node), table in by_kind.items():
            arr = np.full(max(table) + 1, -np.inf)
            arr[list(table)] = list(table.values())
            target = lose if kind == "lose" else gain if kind == "gain" else None
            if target is None:
                start = arr
            else:
                target[node] = arr
    return _Deltas(lose, gain, start, _relocation(problem, cluster, here, j))


def _relocation(
    problem: Problem, cluster: Cluster, here: FloatArray, j: int
) -> tuple[float, IntArray] | None:
    """Best re-placement of a single-node job j onto free GPUs on other nodes."""
    row = cluster.placed[j].copy()  # release() below zeroes the live row
    nodes = np.nonzero(row)[0]
    if nodes.size != 1 or cluster.free.sum() < row.sum():
        return None
    node, size = int(nodes[0]), int(row.sum())
    cluster.release(j)
    saved = cluster.free[node]
    cluster.free[node] = 0  # elsewhere: its GPUs here are for the job that takes them
    options = [o for o in placement_options(problem, cluster, j, size) if o.sum() == size]
    cluster.free[node] = saved
    cluster.assign(j, row)
    if not options:
        return None
    values = problem.values(j, np.array(options)) - here[j]
    best = int(np.argmax(values))
    return float(values[best]), options[best]


def _best_move(
    problem: Problem, cluster: Cluster, deltas: list[_Deltas]
) -> list[tuple[int, IntArray]] | None:
    """The improving trade or make-room move with the largest gain: (job, new row) pairs."""
    idle_gain, idle_job = _best_idle(problem, deltas)
    best_gain, best_move = _MIN_GAIN, None
    for node in (int(n) for n in np.nonzero(cluster.placed.sum(axis=0))[0]):
        holders = [int(j) for j in np.nonzero(cluster.placed[:, node])[0]]
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
    return best_move


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
