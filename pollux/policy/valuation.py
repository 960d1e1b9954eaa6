"""How the Pollux policy values an allocation: speedup, re-allocation penalty and fairness.

The objective (Pollux paper §4.2, artifact `pollux.py`) is the power mean of the jobs' scaled
speedups: ((1/J) Σ_j (s_j + ε)^p)^(1/p), where a job whose allocation changes has its speedup
multiplied by its restart factor. Since x ↦ x^p / p (log x at p = 0) is increasing, maximising
Σ_j w_p(x_j) maximises the power mean; that separable form is what the optimiser works with.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from pollux.goodput import GoodputModel, best_batch
from pollux.goodput.batch import best_goodput_many
from pollux.policy.types import JobInfo

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Normalisation(enum.Enum):
    """What a speedup of 1.0 means.

    Attributes:
        FAIR_SHARE: The goodput of an equal split of the cluster (the published artifact,
            `A:pollux.py` Problem.__init__): weighs jobs by how much better than a fair share
            they do.
        ONE_GPU: The best goodput on one GPU (the paper's definition, §3.3).
    """

    FAIR_SHARE = "fair_share"
    ONE_GPU = "one_gpu"


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


class JobSpeedup:
    """Normalised speedups of one job on any (N, K), computed on demand and memoised.

    The table is dense over N ≤ max_nodes and K ≤ max_replicas with NaN for entries not yet
    computed; each query computes all its missing entries in one vectorised goodput call, and
    `prime` fills entries computed elsewhere (`speedups_for`, one call for every job).
    """

    def __init__(
        self, model: GoodputModel | None, *, max_replicas: int, max_nodes: int, base: float
    ) -> None:
        """Args: base is the goodput (or, without a model, replica count) of speedup 1."""
        self.model = model
        self.max_replicas = max(max_replicas, 0)
        self.max_nodes = max(1, min(max_nodes, max(self.max_replicas, 1)))
        self._base = base
        self._table = np.full((self.max_nodes + 1, self.max_replicas + 1), np.nan)
        self._table[0, 0] = 0.0

    def prime(self, nodes: IntArray, replicas: IntArray, goodput: FloatArray) -> None:
        """Store speedups for (N, K) whose goodput was computed outside."""
        inside = (replicas <= self.max_replicas) & (nodes <= self.max_nodes)
        self._table[nodes[inside], replicas[inside]] = goodput[inside] / self._base

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
            if self.model is None:
                computed = k_miss / self._base
            else:
                computed = best_batch(self.model, n_miss, k_miss).goodput / self._base
            self._table[n_miss, k_miss] = computed
            values = self._table[nodes, replicas]
        return np.asarray(values, dtype=np.float64)


def speedups_for(
    jobs: Sequence[JobInfo],
    *,
    base_nodes: int,
    base_replicas: int,
    max_nodes: int,
    consolidate: Callable[[IntArray], IntArray],
) -> list[JobSpeedup]:
    """Every job's speedups, primed in one goodput evaluation for all jobs.

    Primed: every size on the fewest nodes (what the count phase asks) and the job's current
    allocation. Speedup 1 is the goodput on (base_nodes, base_replicas);
    jobs without a model scale linearly (reference §3). A job that cannot run on the reference
    allocation (its smallest micro-batches overshoot its maximum batch there) is normalised by
    the largest feasible size below it instead.
    """
    reference = np.arange(1, base_replicas + 1)
    ref_nodes = np.minimum(base_nodes, reference)
    models, primed = [], []
    for job in jobs:
        if job.model is None:
            continue
        ks = np.arange(1, max(job.max_replicas, 0) + 1)
        current = len(job.allocation)
        nodes = np.concatenate(
            [_consolidated(consolidate, ks, max_nodes), [len(set(job.allocation))] * bool(current)]
        )
        sizes = np.concatenate([ks, [current] * bool(current)])
        models.append(job.model)
        primed.append((nodes.astype(np.int64), sizes.astype(np.int64)))
    raw = np.zeros(0)
    if models:
        index = np.concatenate(
            [np.full(reference.size + n.size, i) for i, (n, _) in enumerate(primed)]
        )
        raw = best_goodput_many(
            models,
            index,
            np.concatenate([np.r_[ref_nodes, n] for n, _ in primed]),
            np.concatenate([np.r_[reference, k] for _, k in primed]),
        )
    out, offset, i = [], 0, 0
    for job in jobs:
        # The table also covers the current allocation, which may exceed today's caps.
        top_k = max(job.max_replicas, len(job.allocation))
        top_n = max(max_nodes, len(set(job.allocation)))
        if job.model is None:
            out.append(
                JobSpeedup(None, max_replicas=top_k, max_nodes=top_n, base=float(base_replicas))
            )
            continue
        nodes, sizes = primed[i]
        ref = raw[offset : offset + reference.size]
        values = raw[offset + reference.size : offset + reference.size + sizes.size]
        offset += reference.size + sizes.size
        feasible = np.nonzero(ref > 0)[0]
        speedup = JobSpeedup(
            job.model, max_replicas=top_k, max_nodes=top_n, base=float(ref[feasible[-1]])
        )
        speedup.prime(nodes, sizes, values)
        out.append(speedup)
        i += 1
    return out


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
