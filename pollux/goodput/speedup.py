"""Speedups: best goodput on an allocation relative to the best on one GPU (reference §3).

The scheduler compares jobs by speedup, so a job's whole table — every (N, K) the cluster could
give it — is computed in one vectorised call and looked up by index afterwards, instead of the
published per-call cache that stops at K < 32.
"""

from __future__ import annotations

import numpy as np

from pollux.goodput._validate import ArrayLike, FloatArray, allocation_arrays
from pollux.goodput.batch import NUM_CANDIDATES, _best_batch_flat
from pollux.goodput.errors import InvalidInputError
from pollux.goodput.params import GoodputModel


def speedup_table(
    model: GoodputModel,
    max_nodes: int,
    max_replicas: int,
    *,
    gpus_per_node: int | None = None,
    num_candidates: int = NUM_CANDIDATES,
) -> FloatArray:
    """Speedup of every allocation a cluster can offer, as a dense table.

    Args:
        model: The job's goodput model.
        max_nodes: Largest number of nodes (rows 0..max_nodes).
        max_replicas: Largest number of replicas (columns 0..max_replicas).
        gpus_per_node: If given, allocations with K > N·gpus_per_node are impossible.
        num_candidates: Total batch sizes tried per allocation.

    Returns:
        Array of shape (max_nodes + 1, max_replicas + 1) where entry [N, K] is the best goodput
        on K replicas over N nodes divided by the best goodput on one replica. Entries that are
        impossible (N > K, N = 0 < K, too many replicas per node) or infeasible (the smallest
        micro-batch on K replicas already exceeds the maximum batch) are 0; [0, 0] is 0.
    """
    if max_nodes < 1 or max_replicas < 1:
        raise InvalidInputError(
            "max_nodes",
            f"max_nodes and max_replicas must be ≥ 1, got {max_nodes} and {max_replicas}",
        )
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InvalidInputError("gpus_per_node", f"must be ≥ 1, got {gpus_per_node}")
    nodes, replicas = np.meshgrid(
        np.arange(max_nodes + 1), np.arange(max_replicas + 1), indexing="ij"
    )
    possible = (nodes >= 1) & (nodes <= replicas)
    if gpus_per_node is not None:
        possible &= replicas <= nodes * gpus_per_node
    n_flat = nodes[possible].astype(np.int64)
    k_flat = replicas[possible].astype(np.int64)
    # The 1-GPU reference goes first so that both come from one vectorised evaluation.
    value, _, _ = _best_batch_flat(model, np.r_[1, n_flat], np.r_[1, k_flat], num_candidates)
    table = np.zeros(nodes.shape)
    table[possible] = value[1:] / _single_gpu(value[0])
    return table


def speedup(
    model: GoodputModel,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    *,
    num_candidates: int = NUM_CANDIDATES,
) -> FloatArray:
    """Speedup for arbitrary arrays of (N, K); (0, 0) means no allocation and gives 0."""
    nodes, replicas = allocation_arrays(num_nodes, num_replicas, minimum=0)
    if np.any((nodes > 0) != (replicas > 0)):
        raise InvalidInputError("num_nodes", "must be 0 exactly when num_replicas is 0")
    shape = nodes.shape
    n_flat, k_flat = nodes.ravel(), replicas.ravel()
    some = k_flat > 0
    value, _, _ = _best_batch_flat(
        model, np.r_[1, n_flat[some]], np.r_[1, k_flat[some]], num_candidates
    )
    out = np.zeros(n_flat.shape)
    out[some] = value[1:] / _single_gpu(value[0])
    return out.reshape(shape)


def _single_gpu(base: float) -> float:
    if not base > 0:
        raise InvalidInputError(
            "model",
            "no per-GPU batch in [min_atomic_bsz, max_atomic_bsz] can run the job on "
            "one GPU, so speedups have no reference; widen the micro-batch range",
        )
    return float(base)
