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


def search(problem: Problem) -> IntArray:
    """The jobs × nodes matrix the three phases choose."""
    return fill(problem, place(problem, choose_counts(problem)))


# -- phase 1: GPU counts --------------------------------------------------------------------


def count_utilities(problem: Problem) -> FloatArray:
    """U[j, k]: utility of job j with k GPUs on a consolidated placement (−inf: not allowed).

    At k equal to the current size the job may also keep its current placement with no
    restart penalty, whichever is worth more.
    """
    width = int(problem.max_k.max(initial=0)) + 1
    table = np.full((problem.num_jobs, width), -np.inf)
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
            table[j, k_cur] = max(table[j, k_cur], float(problem.values(j, problem.current[j])[0]))
        if problem.min_k[j] > 1:
            table[j, 1 : problem.min_k[j]] = -np.inf
    return table


def choose_counts(problem: Problem) -> IntArray:
    """Greedy: repeatedly make the jump (job, new size) with the best utility gain per GPU."""
    table = count_utilities(problem)
    num_jobs, width = table.shape
    counts = np.zeros(num_jobs, dtype=np.int64)
    free = problem.total_gpus
    sizes = np.arange(width)

    def best_jumps(rows: IntArray) -> tuple[FloatArray, IntArray]:
        jump = sizes[None, :] - counts[rows, None]
        ok = (jump > 0) & (jump <= free)
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
        counts[j] = targets[j]
        stale = np.nonzero((targets - counts > free) | (every == j))[0]
        gains[stale], targets[stale] = best_jumps(stale)
    return counts


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


def place(problem: Problem, counts: IntArray) -> IntArray:
    """Realise the chosen counts on nodes, keeping unchanged jobs where they are."""
    cluster = Cluster.empty(problem)
    avoid = problem.params.interference_avoidance
    kept = set()
    for j in range(problem.num_jobs):
        row = problem.current[j]
        if counts[j] == 0 or counts[j] != row.sum() or (row > cluster.free).any():
            continue
        if avoid and problem.is_distributed(row) and (cluster.owner[row > 0] >= 0).any():
            continue
        cluster.assign(j, row.copy())
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
        if options:
            values = problem.values(j, np.array(options))
            cluster.assign(j, options[int(np.argmax(values))])
    return cluster.placed


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
