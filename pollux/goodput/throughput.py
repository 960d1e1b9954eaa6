"""Throughput model (Pollux paper §3.2, reference §1.3).

One micro-batch of m samples takes T_accum = alpha_c + beta_c·m to compute. The micro-batch
that ends in an optimizer step also synchronises gradients, taking T_net on the most
significant link, overlapped with compute:
T_optim = (T_accum^γ + T_net^γ)^(1/γ). With s extra accumulation micro-batches per step,
T_iter = s·T_accum + T_optim and throughput = K·m·(s+1) / T_iter samples per second.

Everything is vectorised over broadcastable arrays of (N, K, m, s). The private helpers work on
a raw parameter vector so that the fitter (`pollux.goodput.fit`) evaluates exactly the same
formulas it differentiates.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pollux.goodput._validate import (
    ArrayLike,
    FloatArray,
    IntArray,
    allocation_arrays,
    broadcast,
    finite_array,
    integer_array,
)
from pollux.goodput.params import PerfParams, SyncModel

TINY = 1e-8
"""Floor of every time and regressor, as in the published code, so logs stay finite."""

TIER_NONE, TIER_LOCAL, TIER_NETWORK = 0, 1, 2


class SyncDesign(NamedTuple):
    """Which link a configuration synchronises over and the retrogression regressor."""

    tier: IntArray  # TIER_NONE (K = 1), TIER_LOCAL (N = 1 < K) or TIER_NETWORK (N > 1)
    regressor: FloatArray  # what beta multiplies; ≥ TINY


def sync_design(sync_model: SyncModel, num_nodes: IntArray, num_replicas: IntArray) -> SyncDesign:
    """Classify each (N, K) by its most significant link and compute its regressor."""
    tier = np.where(num_nodes > 1, TIER_NETWORK, np.where(num_replicas > 1, TIER_LOCAL, TIER_NONE))
    k = num_replicas.astype(np.float64)
    if sync_model is SyncModel.LINEAR:
        x = k - 2.0
    else:
        ring = np.where(tier == TIER_NETWORK, num_nodes, num_replicas).astype(np.float64)
        x = 1.0 - 2.0 / ring
    return SyncDesign(tier.astype(np.int64), np.maximum(x, TINY))


def net_time(theta: FloatArray, design: SyncDesign) -> FloatArray:
    """T_net: sync seconds on the most significant link (≈ 0 for one replica)."""
    _, _, alpha_n, beta_n, alpha_r, beta_r, _ = theta
    alpha = np.where(
        design.tier == TIER_NETWORK, alpha_n, np.where(design.tier == TIER_LOCAL, alpha_r, TINY)
    )
    beta = np.where(
        design.tier == TIER_NETWORK, beta_n, np.where(design.tier == TIER_LOCAL, beta_r, TINY)
    )
    return np.asarray(alpha + beta * design.regressor, dtype=np.float64)


def log_step_times(
    theta: FloatArray, design: SyncDesign, atomic_bsz: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Log of (T_accum, T_optim) for the parameter vector `theta` in `PerfParams` order.

    Computed in log space (log-sum-exp) so that γ up to 10 neither overflows nor underflows.
    """
    alpha_c, beta_c, *_, gamma = theta
    log_accum = np.log(alpha_c + beta_c * atomic_bsz)
    log_optim = np.logaddexp(gamma * log_accum, gamma * np.log(net_time(theta, design))) / gamma
    return log_accum, log_optim


def step_times(
    perf: PerfParams, num_nodes: ArrayLike, num_replicas: ArrayLike, atomic_bsz: ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """Predicted seconds of an accumulation micro-batch and of an optimizer micro-batch.

    Args:
        perf: Throughput parameters.
        num_nodes: N, distinct nodes holding the job's replicas (≥ 1).
        num_replicas: K, replicas (GPUs), N ≤ K.
        atomic_bsz: m, per-GPU micro-batch size (> 0 samples).

    Returns:
        (T_accum, T_optim), broadcast to the shape of the inputs.
    """
    nodes, replicas = allocation_arrays(num_nodes, num_replicas)
    m = finite_array("atomic_bsz", atomic_bsz, minimum=0.0, strict=True)
    nodes, replicas, m = broadcast(
        ("num_nodes", nodes), ("num_replicas", replicas), ("atomic_bsz", m)
    )
    log_accum, log_optim = log_step_times(
        np.array(perf.as_tuple()), sync_design(perf.sync_model, nodes, replicas), m
    )
    return np.exp(log_accum), np.exp(log_optim)


def iteration_time(
    perf: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> FloatArray:
    """Seconds per optimizer step: s accumulation micro-batches plus one synchronising one."""
    s = integer_array("accum_steps", accum_steps, minimum=0)
    t_accum, t_optim = step_times(perf, num_nodes, num_replicas, atomic_bsz)
    t_accum, t_optim, s = broadcast(("atomic_bsz", t_accum), ("optim", t_optim), ("accum_steps", s))
    return np.asarray(s * t_accum + t_optim, dtype=np.float64)


def throughput(
    perf: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> FloatArray:
    """Training samples per second: K·m·(s+1) / T_iter."""
    t_iter = iteration_time(perf, num_nodes, num_replicas, atomic_bsz, accum_steps)
    return np.asarray(
        _samples_per_step(num_replicas, atomic_bsz, accum_steps) / t_iter, dtype=np.float64
    )


def _samples_per_step(
    num_replicas: ArrayLike, atomic_bsz: ArrayLike, accum_steps: ArrayLike
) -> FloatArray:
    """M = K·m·(s+1); inputs already validated by the caller's time computation."""
    k, m, s = (np.asarray(v, dtype=np.float64) for v in (num_replicas, atomic_bsz, accum_steps))
    return np.asarray(k * m * (s + 1), dtype=np.float64)
