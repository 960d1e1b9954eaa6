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
    """The jobs × nodes matrix the three phases choose, trying two count strategies.

    Counts chosen without regard to packing can strand GPUs (three distributed jobs of 9-10
    GPUs need 9 whole nodes of 4); counts with distributed jobs in whole nodes always pack but
    may waste a node's worth. Both are placed and the better by the objective wins.
    """
    candidates = []
    for whole_nodes in (False, True):
        counts, keep = choose_counts(problem, whole_nodes=whole_nodes)
        candidates.append(fill(problem, place(problem, counts, keep)))
    return max(candidates, key=lambda placed: total_utility(problem, placed))


def total_utility(problem: Problem, placed: IntArray) -> float:
    """Σ_j w_p(x_j) of a jobs × nodes matrix (ordered like the power mean)."""
    return float(sum(problem.values(j, placed[j])[0] for j in range(problem.num_jobs)))


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
            stay = float(problem.values(j, problem.current[j])[0])
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
