"""The goodput-maximising per-GPU batch and accumulation steps (reference §1.6).

For each allocation (N, K) we try `num_candidates` total batch sizes spaced geometrically from
max(M0, K·min_atomic) to max_batch_size, split each into the fewest micro-batches that fit in
GPU memory, and keep the one with the highest goodput. Unlike the published code, a
configuration whose total batch would exceed max_batch_size is never returned: the per-GPU
batch is rounded down when rounding up would overshoot, and an allocation too large for even
the smallest micro-batch is reported infeasible (goodput 0, m = s = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pollux.goodput._validate import ArrayLike, FloatArray, IntArray, allocation_arrays
from pollux.goodput.efficiency import _efficiency
from pollux.goodput.errors import InvalidInputError
from pollux.goodput.params import GoodputModel
from pollux.goodput.throughput import _samples_per_step, net_time, sync_design, throughput

NUM_CANDIDATES = 50  # published: numpy geomspace's default
_SLACK = 1e-8  # keeps ceil() from rounding exact quotients up because of float error


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """Best batch configuration per allocation; arrays share the allocations' shape.

    Attributes:
        goodput: Predicted goodput (M0-equivalent samples per second); 0 where infeasible.
        atomic_bsz: Per-GPU micro-batch m; 0 where infeasible.
        accum_steps: Extra accumulation micro-batches s per optimizer step; 0 where infeasible.
    """

    goodput: FloatArray
    atomic_bsz: IntArray
    accum_steps: IntArray

    def total_batch_size(self, num_replicas: ArrayLike) -> IntArray:
        """M = K·m·(s+1) for each allocation."""
        return np.asarray(num_replicas) * self.atomic_bsz * (self.accum_steps + 1)


def goodput(
    model: GoodputModel,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> FloatArray:
    """Goodput = throughput × efficiency for explicit (N, K, m, s), vectorised.

    Units: M0-equivalent training samples per second.
    """
    tput = throughput(model.perf, num_nodes, num_replicas, atomic_bsz, accum_steps)
    total = _samples_per_step(num_replicas, atomic_bsz, accum_steps)
    return np.asarray(
        tput * _efficiency(model.grad, float(model.init_batch_size), total), dtype=np.float64
    )


def best_batch(
    model: GoodputModel,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    *,
    num_candidates: int = NUM_CANDIDATES,
) -> BatchChoice:
    """Choose (m, s) maximising goodput for every allocation (N, K).

    Args:
        model: The job's goodput model (limits included).
        num_nodes: N per allocation, ≥ 1.
        num_replicas: K per allocation, N ≤ K; broadcast with `num_nodes`.
        num_candidates: Total batch sizes tried per allocation (≥ 1).

    Returns:
        The best configuration per allocation, shaped like broadcast(N, K).
    """
    if num_candidates < 1:
        raise InvalidInputError("num_candidates", f"must be ≥ 1, got {num_candidates}")
    nodes, replicas = allocation_arrays(num_nodes, num_replicas)
    shape = nodes.shape
    nodes, replicas = nodes.ravel(), replicas.ravel()
    value, m, s = _best_batch_flat(model, nodes, replicas, num_candidates)
    return BatchChoice(value.reshape(shape), m.reshape(shape), s.reshape(shape))


def _best_batch_flat(
    model: GoodputModel, nodes: IntArray, replicas: IntArray, num_candidates: int
) -> tuple[FloatArray, IntArray, IntArray]:
    """`best_batch` over validated 1-D arrays; shared with the speedup table.

    Candidates, (m, s), compute time and efficiency depend on K alone, so they are computed
    once per distinct K; only the sync time varies with N. That keeps a 64×64 speedup table to
    a few elementwise passes over (candidates × allocations).
    """
    m0 = float(model.init_batch_size)
    top = float(model.max_batch_size)
    min_m, max_m = (float(v) for v in model.atomic_bsz_range)
    alpha_c, beta_c, *_, gamma = model.perf.as_tuple()

    # Per distinct K (columns): candidate total batches and their split into (m, s).
    ks, k_index = np.unique(replicas, return_inverse=True)
    k = ks.astype(np.float64)
    low = np.maximum(m0, min_m * k)
    feasible_k = low <= top
    low = np.minimum(low, top)  # infeasible K get a dummy range, masked below
    total = np.geomspace(low, np.full_like(low, top), num_candidates)  # (candidates, K)
    per_gpu = total / k
    if model.accumulation:
        steps = np.ceil(per_gpu / max_m - _SLACK) - 1
        # One GPU needs ≥ 2 micro-batches above M0: the noise estimator needs two gradients.
        steps = np.where((ks == 1) & (per_gpu > m0 + _SLACK), np.maximum(steps, 1), steps)
        steps = np.maximum(steps, 0)
    else:
        steps = np.zeros_like(per_gpu)
    atomic = np.ceil(per_gpu / (steps + 1) - _SLACK)
    atomic = np.minimum(atomic, np.floor(top / (k * (steps + 1)) + _SLACK))
    valid = feasible_k & (atomic >= min_m) & (atomic <= max_m)
    atomic = np.where(valid, atomic, 1.0)
    batch = k * atomic * (steps + 1)
    t_accum = alpha_c + beta_c * atomic
    # Samples of M0-equivalent progress per step; 0 marks an invalid candidate.
    useful = np.where(valid, batch * _efficiency(model.grad, m0, batch), 0.0)

    # Per allocation: sync time on its most significant link, overlapped with compute.
    design = sync_design(model.perf.sync_model, nodes, replicas)
    theta = np.array(model.perf.as_tuple())
    t_net = net_time(theta, design)
    t_optim = (t_accum[:, k_index] ** gamma + t_net**gamma) ** (1.0 / gamma)
    value = useful[:, k_index] / (steps[:, k_index] * t_accum[:, k_index] + t_optim)

    best = np.argmax(value, axis=0)
    cols = np.arange(nodes.size)
    best_value = value[best, cols]
    ok = best_value > 0
    best_m = np.where(ok, atomic[best, k_index], 0).astype(np.int64)
    best_s = np.where(ok, steps[best, k_index], 0).astype(np.int64)
    return best_value, best_m, best_s
