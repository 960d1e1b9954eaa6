"""How the Pollux policy values an allocation: speedup, re-allocation penalty and fairness.

The objective (Pollux paper §4.2, artifact `pollux.py`) is the power mean of the jobs' scaled
speedups: ((1/J) Σ_j (s_j + ε)^p)^(1/p), where a job whose allocation changes has its speedup
multiplied by its restart factor. Since x ↦ x^p / p (log x at p = 0) is increasing, maximising
Σ_j w_p(x_j) maximises the power mean; that separable form is what the optimiser works with.
"""

from __future__ import annotations

import enum
import math

import numpy as np
import numpy.typing as npt

from pollux.goodput import best_batch
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
    computed; each query computes all its missing entries in one vectorised goodput call.
    """

    def __init__(
        self, job: JobInfo, *, base_nodes: int, base_replicas: int, max_nodes: int
    ) -> None:
        self.model = job.model
        self.max_replicas = max(job.max_replicas, 0)
        self.max_nodes = max(1, min(max_nodes, max(self.max_replicas, 1)))
        self._table = np.full((self.max_nodes + 1, self.max_replicas + 1), np.nan)
        self._table[0, 0] = 0.0
        if self.model is None:
            # No model yet: assume linear scaling (reference §3).
            self._base = float(base_replicas)
        else:
            self._base = self._base_goodput(base_nodes, base_replicas)

    def _base_goodput(self, nodes: int, replicas: int) -> float:
        assert self.model is not None
        value = float(best_batch(self.model, min(nodes, replicas), replicas).goodput)
        if value > 0:
            return value
        # The reference allocation cannot run this job (its smallest micro-batches overshoot
        # the maximum batch): fall back to the largest feasible size below it.
        sizes = np.arange(1, replicas + 1)
        values = best_batch(self.model, np.minimum(nodes, sizes), sizes).goodput
        return float(values[np.nonzero(values > 0)[0][-1]])

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


def fair_share(num_jobs: int, num_nodes: int, total_gpus: int) -> tuple[int, int]:
    """(nodes, replicas) of an equal split of the cluster among `num_jobs` (artifact §3).

    One replica's dominant share is 1/total_gpus, so the fair split is ceil(total/jobs)
    replicas on ceil(num_nodes/total_gpus) nodes (1 node on a 16 × 4 cluster).
    """
    replicas = max(1, math.ceil(total_gpus / max(num_jobs, 1)))
    nodes = max(1, math.ceil(num_nodes / total_gpus))
    return min(nodes, replicas), replicas
