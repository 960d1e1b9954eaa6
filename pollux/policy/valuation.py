"""How the Pollux policy values an allocation: speedup, re-allocation penalty and fairness.

The objective (Pollux paper §4.2, artifact `pollux.py`) is the power mean of the jobs' scaled
speedups: ((1/J) Σ_j (s_j + ε)^p)^(1/p), where a job whose allocation changes has its speedup
multiplied by its restart factor. Since x ↦ x^p / p (log x at p = 0) is increasing, maximising
Σ_j w_p(x_j) maximises the power mean; that separable form is what the optimiser works with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from pollux.goodput.batch import GoodputModels
from pollux.policy.types import JobInfo

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def utility(x: FloatArray, p: float) -> FloatArray:
    """w_p(x): Σ_j w_p(x_j) increases exactly when the power mean of x does (x > 0)."""
    if p == 0:
        return np.log(x)
    return np.asarray(x**p / p, dtype=np.float64)


def power_mean(x: FloatArray, p: float) -> float:
    """((1/J) Σ x^p)^(1/p), the geometric mean at p = 0."""
    if x.size == 0:
        return float("nan")
    if p == 0:
        return float(np.exp(np.mean(np.log(x))))
    return float(np.mean(x**p) ** (1.0 / p))


def restart_factor(age: float, restarts: int, delay: float) -> float:
    """Discount of a re-allocated job's speedup: max(age − restarts·delay, 0) / (age + delay).

    A young or often-restarted job loses proportionally more to a checkpoint-restart, so the
    policy moves it only for a larger gain (artifact: 600 s old, 2 restarts → 0.857).
    """
    if delay <= 0:
        return 1.0
    age = max(age, 0.0)
    return max(age - restarts * delay, 0.0) / (age + delay)


class Speedups:
    """Normalised speedups of every job on any (N, K), computed on demand and memoised.

    Each job has a dense table over N ≤ its max_nodes and K ≤ its max_replicas, NaN where not
    yet computed. All tables live in one flat array so that the optimiser reads a batch of
    (job, N, K) from many jobs at once and computes the batch's missing entries in one
    vectorised goodput call; `jobs[j]` is job j's table as a `JobSpeedup`.
    """

    def __init__(
        self,
        goodput: GoodputModels,
        model: IntArray,
        *,
        max_replicas: IntArray,
        max_nodes: IntArray,
        base: FloatArray,
    ) -> None:
        """Tables for every job, nothing computed yet.

        Args:
            goodput: The jobs' models.
            model: Each job's index in `goodput`; −1 without a model (speedup ∝ replicas).
            max_replicas: Largest K of each job's table.
            max_nodes: Largest N of each job's table (capped at its max_replicas).
            base: Each job's goodput (without a model: replica count) of speedup 1.
        """
        self._goodput = goodput
        self._model = np.asarray(model, dtype=np.int64)
        self._base = np.asarray(base, dtype=np.float64)
        self.max_replicas = np.maximum(np.asarray(max_replicas, dtype=np.int64), 0)
        self.max_nodes = np.maximum(
            1, np.minimum(max_nodes, np.maximum(self.max_replicas, 1))
        ).astype(np.int64)
        self._stride = self.max_replicas + 1
        sizes = (self.max_nodes + 1) * self._stride
        self._offset = np.cumsum(sizes) - sizes
        self._flat = np.full(int(sizes.sum()), np.nan)
        self._flat[self._offset] = 0.0  # no GPUs: no speed
        self.jobs = [JobSpeedup(self, j) for j in range(self._model.size)]

    @property
    def base(self) -> FloatArray:
        """Each job's goodput (without a model: replica count) of speedup 1, read-only."""
        view = self._base.view()
        view.flags.writeable = False
        return view

    def table(self, j: int) -> FloatArray:
        """Job j's (max_nodes + 1) × (max_replicas + 1) table, a view of the flat array."""
        start = int(self._offset[j])
        rows, cols = int(self.max_nodes[j]) + 1, int(self._stride[j])
        return self._flat[start : start + rows * cols].reshape(rows, cols)

    def index(self, jobs: IntArray, nodes: IntArray, replicas: IntArray) -> IntArray:
        """Flat positions of (job, N, K); IndexError outside a job's table."""
        outside = (nodes < 0) | (replicas < 0)
        outside |= (nodes > self.max_nodes[jobs]) | (replicas > self.max_replicas[jobs])
        if outside.any():
            raise IndexError("speedup queried outside the job's (N, K) table")
        return np.asarray(self._offset[jobs] + nodes * self._stride[jobs] + replicas)

    def lookup(
        self, jobs: IntArray, nodes: IntArray, replicas: IntArray, calls: IntArray | None = None
    ) -> FloatArray:
        """Speedups at (job, N, K), N ≤ min(K, max_nodes), computing what is missing.

        The queries are taken as if asked in order, one `JobSpeedup` call per distinct
        (job, `calls`) pair (default: one per job): that fixes which entries each call
        computes, so batching several calls gives exactly their results.
        """
        index = self.index(jobs, nodes, replicas)
        values = self._flat[index]
        missing = np.isnan(values)
        if missing.any():
            where = np.nonzero(missing)[0]
            self.compute(
                index[where],
                jobs[where],
                nodes[where],
                replicas[where],
                None if calls is None else calls[where],
            )
            values = self._flat[index]
        return np.asarray(values, dtype=np.float64)

    def compute(
        self,
        index: IntArray,
        jobs: IntArray,
        nodes: IntArray,
        replicas: IntArray,
        calls: IntArray | None,
    ) -> None:
        """Fill missing entries (flat `index`); the first query of an entry computes it."""
        index, first = np.unique(index, return_index=True)
        jobs, nodes, replicas = jobs[first], nodes[first], replicas[first]
        group = jobs if calls is None else calls[first] * len(self.jobs) + jobs
        base = self._base[jobs]
        computed = replicas / base  # jobs without a model scale linearly
        model = self._model[jobs]
        modelled = model >= 0
        if modelled.any():
            pick = np.nonzero(modelled)[0]
            goodput = self._goodput.best_goodput(
                model[pick], nodes[pick], replicas[pick], calls=group[pick]
            )
            computed[pick] = goodput / base[pick]
        self._flat[index] = computed

    def prime(
        self, jobs: IntArray, nodes: IntArray, replicas: IntArray, goodput: FloatArray
    ) -> None:
        """Store speedups for (job, N, K) whose goodput was computed outside."""
        inside = (replicas <= self.max_replicas[jobs]) & (nodes <= self.max_nodes[jobs])
        jobs, nodes, replicas = jobs[inside], nodes[inside], replicas[inside]
        position = self._offset[jobs] + nodes * self._stride[jobs] + replicas
        self._flat[position] = goodput[inside] / self._base[jobs]


class JobSpeedup:
    """One job's speedups on any (N, K): its table in a `Speedups`, computed on demand."""

    def __init__(self, bank: Speedups, job: int) -> None:
        self.max_replicas = int(bank.max_replicas[job])
        self.max_nodes = int(bank.max_nodes[job])
        self._bank = bank
        self._job = job
        self._table = bank.table(job)

    def at(self, nodes: int, replicas: int) -> float:
        """One speedup; a plain table read when it is already known."""
        value = float(self._table[nodes, replicas])
        if not math.isnan(value):
            return value
        return float(self(np.array([nodes]), np.array([replicas]))[0])

    def __call__(self, nodes: IntArray, replicas: IntArray) -> FloatArray:
        """Speedups at arrays of (N, K); K ≤ max_replicas, N ≤ min(K, max_nodes)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        replicas = np.asarray(replicas, dtype=np.int64)
        values = self._table[nodes, replicas]
        missing = np.isnan(values)
        if missing.any():
            n_miss, k_miss = nodes[missing], replicas[missing]
            jobs = np.full(n_miss.shape, self._job)
            self._bank.compute(self._bank.index(jobs, n_miss, k_miss), jobs, n_miss, k_miss, None)
            values = self._table[nodes, replicas]
        return np.asarray(values, dtype=np.float64)


def speedups_for(
    jobs: Sequence[JobInfo],
    *,
    base_nodes: int,
    base_replicas: int,
    max_nodes: int,
    consolidate: Callable[[IntArray], IntArray],
) -> Speedups:
    """Every job's speedups, primed in one goodput evaluation for all jobs.

    Primed: every size on the fewest nodes (what the count phase asks) and the job's current
    allocation. Speedup 1 is the goodput on (base_nodes, base_replicas);
    jobs without a model scale linearly (reference §3). A job that cannot run on the reference
    allocation (its smallest micro-batches overshoot its maximum batch there) is normalised by
    the largest feasible size below it instead.
    """
    current = np.array([len(job.allocation) for job in jobs], dtype=np.int64)
    spread = np.array([len(set(job.allocation)) for job in jobs], dtype=np.int64)
    caps = np.array([max(job.max_replicas, 0) for job in jobs], dtype=np.int64)
    modelled = np.array([job.model is not None for job in jobs], dtype=bool)
    owners = np.nonzero(modelled)[0]
    model = np.where(modelled, np.cumsum(modelled) - 1, -1)
    goodput = GoodputModels([job.model for job in jobs if job.model is not None])
    base = np.full(len(jobs), float(base_replicas))
    # Queries per modelled job, as one call: the reference sizes, every size on the fewest
    # nodes, and the current allocation.
    reference = np.arange(1, base_replicas + 1)
    ref_nodes = np.minimum(base_nodes, reference)
    sizes = caps[owners]
    ks = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes) + 1
    ks_job = np.repeat(owners, sizes)
    running = owners[current[owners] > 0]
    primed = (
        np.concatenate([ks_job, running]),
        np.concatenate([_consolidated(consolidate, ks, max_nodes), spread[running]]),
        np.concatenate([ks, current[running]]),
    )
    raw = np.zeros(0)
    if owners.size:
        raw = goodput.best_goodput(
            np.concatenate([np.repeat(model[owners], reference.size), model[primed[0]]]),
            np.concatenate([np.tile(ref_nodes, owners.size), primed[1]]),
            np.concatenate([np.tile(reference, owners.size), primed[2]]),
        )
        ref = raw[: owners.size * reference.size].reshape(owners.size, reference.size)
        feasible = ref > 0
        if not feasible.any(axis=1).all():
            raise IndexError("a job runs on no reference size, not even one GPU")
        last = reference.size - 1 - np.argmax(feasible[:, ::-1], axis=1)
        base[owners] = ref[np.arange(owners.size), last]
    # The table also covers the current allocation, which may exceed today's caps.
    bank = Speedups(
        goodput,
        model,
        max_replicas=np.maximum(caps, current),
        max_nodes=np.maximum(max_nodes, spread),
        base=base,
    )
    bank.prime(*primed, raw[owners.size * reference.size :])
    return bank


def _consolidated(
    consolidate: Callable[[IntArray], IntArray], replicas: IntArray, max_nodes: int
) -> IntArray:
    return np.minimum(consolidate(replicas), np.minimum(replicas, max_nodes))


def fair_share(num_jobs: int, num_nodes: int, total_gpus: int) -> tuple[int, int]:
    """(nodes, replicas) of an equal split of the cluster among `num_jobs` (artifact §3).

    One replica's dominant share is 1/total_gpus, so the fair split is ceil(total/jobs)
    replicas on ceil(num_nodes/total_gpus) nodes (1 node on a 16 × 4 cluster).
    """
    replicas = max(1, math.ceil(total_gpus / max(num_jobs, 1)))
    nodes = max(1, math.ceil(num_nodes / total_gpus))
    return min(nodes, replicas), replicas
