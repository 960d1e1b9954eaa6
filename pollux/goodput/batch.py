"""The goodput-maximising per-GPU batch and accumulation steps (reference §1.6).

For each allocation (N, K) we try `num_candidates` total batch sizes spaced geometrically from
max(M0, K·min_atomic) to max_batch_size, split each into the fewest micro-batches that fit in
GPU memory, and keep the one with the highest goodput. Unlike the published code, a
configuration whose total batch would exceed max_batch_size is never returned: the per-GPU
batch is rounded down when rounding up would overshoot, and an allocation too large for even
the smallest micro-batch is reported infeasible (goodput 0, m = s = 0).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pollux.goodput._validate import (
    ArrayLike,
    FloatArray,
    IntArray,
    allocation_arrays,
    broadcast,
    integer_array,
)
from pollux.goodput.efficiency import _efficiency
from pollux.goodput.errors import InvalidInputError
from pollux.goodput.params import GoodputModel, SyncModel
from pollux.goodput.throughput import TINY, _samples_per_step, throughput

BoolArray = npt.NDArray[np.bool_]

NUM_CANDIDATES = 50  # published: numpy geomspace's default
_SLACK = 1e-8  # keeps ceil() from rounding exact quotients up because of float error
_CHUNK = 1024  # queries evaluated together by `GoodputModels`: bounds the temporaries


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


@dataclass(frozen=True, slots=True)
class _Params:
    """Model parameters as arrays broadcastable over queries (scalars for one model)."""

    m0: FloatArray
    top: FloatArray
    min_m: FloatArray
    max_m: FloatArray
    accumulation: npt.NDArray[np.bool_]
    sqr: FloatArray
    var: FloatArray
    theta: FloatArray  # (7, ...) throughput parameters in PerfParams order
    ring: npt.NDArray[np.bool_]  # SyncModel.RING

    @classmethod
    def of(cls, models: Sequence[GoodputModel]) -> _Params:
        """One entry per model (a length-1 list gives scalars after indexing with [0])."""
        col = np.array
        return cls(
            m0=col([m.init_batch_size for m in models], dtype=np.float64),
            top=col([m.max_batch_size for m in models], dtype=np.float64),
            min_m=col([m.atomic_bsz_range[0] for m in models], dtype=np.float64),
            max_m=col([m.atomic_bsz_range[1] for m in models], dtype=np.float64),
            accumulation=col([m.accumulation for m in models], dtype=bool),
            sqr=col([m.grad.sqr for m in models], dtype=np.float64),
            var=col([m.grad.var for m in models], dtype=np.float64),
            theta=col([m.perf.as_tuple() for m in models], dtype=np.float64).T,
            ring=col([m.perf.sync_model is SyncModel.RING for m in models], dtype=bool),
        )

    def take(self, index: IntArray) -> _Params:
        """The parameters of the model behind each query."""
        return _Params(
            self.m0[index],
            self.top[index],
            self.min_m[index],
            self.max_m[index],
            self.accumulation[index],
            self.sqr[index],
            self.var[index],
            self.theta[:, index],
            self.ring[index],
        )


@functools.cache
def _spacing(num: int) -> tuple[FloatArray, FloatArray]:
    """Columns i and i/(num − 1), i < num: numpy's linspace grid, built once per size."""
    index = np.arange(num, dtype=np.float64).reshape(-1, 1)
    fraction = index / max(num - 1, 1)
    index.setflags(write=False)
    fraction.setflags(write=False)
    return index, fraction


def _batch_range(p: _Params, k: FloatArray) -> tuple[FloatArray, FloatArray, BoolArray]:
    """(low, top, feasible): the candidates' range per K; infeasible K get a dummy range."""
    low = np.maximum(p.m0, p.min_m * k)
    feasible = low <= p.top
    low = np.minimum(low, p.top)
    return low, np.broadcast_to(p.top, low.shape), feasible


def _divide_first(low: FloatArray, top: FloatArray, num: int, calls: ArrayLike | None) -> BoolArray:
    """Per column, whether `np.geomspace` would space its exponents as (i/(num − 1))·Δ.

    numpy spaces them as i·(Δ/(num − 1)), except within a call where some column has Δ = 0:
    there every column gets (i/(num − 1))·Δ, which can differ in the last bit. Columns batched
    from several calls (distinct `calls` values; None: one call) keep the spacing their own
    call would have had, so batching never changes a result.
    """
    flat = (np.log10(top) - np.log10(low)) / max(num - 1, 1) == 0
    if num == 1 or not flat.any():
        return np.zeros(low.shape, dtype=bool)
    if calls is None:
        return np.ones(low.shape, dtype=bool)
    _, call = np.unique(np.asarray(calls), return_inverse=True)
    return np.asarray((np.bincount(call, weights=flat) > 0)[call], dtype=bool)


def _geomspace(low: FloatArray, top: FloatArray, num: int, divide_first: BoolArray) -> FloatArray:
    """`np.geomspace(low, top, num)` bit for bit, with the spacing `_divide_first` gives.

    `low` and `top` are positive 1-D arrays of one shape.
    """
    if num == 1:
        return low.reshape(1, -1).astype(np.float64)
    index, fraction = _spacing(num)
    log_low, log_top = np.log10(low), np.log10(top)
    delta = log_top - log_low
    if not divide_first.any():
        y = index * (delta / (num - 1))
    elif divide_first.all():
        y = fraction * delta
    else:
        y = np.where(divide_first, fraction * delta, index * (delta / (num - 1)))
    y += log_low
    y[-1] = log_top
    total = np.power(10.0, y)
    total[0] = low
    total[-1] = top
    return total


def _splits(
    p: _Params, k: FloatArray, num_candidates: int, divide_first: BoolArray | None = None
) -> tuple[FloatArray, ...]:
    """Candidate total batches for K replicas, split into (m, s), and their worth.

    Returns (steps, atomic, t_accum, useful), each (candidates, len(k)); `useful` is the
    M0-equivalent progress per step, 0 for an invalid candidate. `divide_first`: the spacing
    of each column's candidates (see `_divide_first`; default: the columns form one call).
    """
    low, top, feasible = _batch_range(p, k)
    if divide_first is None:
        divide_first = _divide_first(low, top, num_candidates, None)
    total = _geomspace(low, top, num_candidates, divide_first)
    per_gpu = total / k
    steps = np.ceil(per_gpu / p.max_m - _SLACK) - 1
    # One GPU needs ≥ 2 micro-batches above M0: the noise estimator needs two gradients.
    steps = np.where((k == 1) & (per_gpu > p.m0 + _SLACK), np.maximum(steps, 1), steps)
    steps = np.where(p.accumulation, np.maximum(steps, 0), 0.0)
    atomic = np.ceil(per_gpu / (steps + 1) - _SLACK)
    atomic = np.minimum(atomic, np.floor(p.top / (k * (steps + 1)) + _SLACK))
    valid = feasible & (atomic >= p.min_m) & (atomic <= p.max_m)
    atomic = np.where(valid, atomic, 1.0)
    batch = k * atomic * (steps + 1)
    scale = np.maximum(batch, p.m0) / p.m0
    efficiency = (p.var + p.sqr) / (p.var / scale + p.sqr) / scale
    useful = np.where(valid, batch * efficiency, 0.0)
    t_accum = p.theta[0] + p.theta[1] * atomic
    return steps, atomic, t_accum, useful


def _net_times(p: _Params, nodes: IntArray, replicas: IntArray) -> FloatArray:
    """T_net per query (see `throughput.sync_design`), with per-query sync models."""
    network, local = nodes > 1, (nodes == 1) & (replicas > 1)
    ring_size = np.where(network, nodes, replicas).astype(np.float64)
    x = np.maximum(np.where(p.ring, 1.0 - 2.0 / ring_size, replicas - 2.0), TINY)
    alpha = np.where(network, p.theta[2], np.where(local, p.theta[4], TINY))
    beta = np.where(network, p.theta[3], np.where(local, p.theta[5], TINY))
    return np.asarray(alpha + beta * x, dtype=np.float64)


def _pick(
    value: FloatArray, atomic: FloatArray, steps: FloatArray, columns: IntArray
) -> tuple[FloatArray, IntArray, IntArray]:
    """Best candidate per query; `columns` maps queries to columns of atomic/steps."""
    best = np.argmax(value, axis=0)
    cols = np.arange(value.shape[1])
    best_value = value[best, cols]
    ok = best_value > 0
    best_m = np.where(ok, atomic[best, columns], 0).astype(np.int64)
    best_s = np.where(ok, steps[best, columns], 0).astype(np.int64)
    return best_value, best_m, best_s


def _best_batch_flat(
    model: GoodputModel, nodes: IntArray, replicas: IntArray, num_candidates: int
) -> tuple[FloatArray, IntArray, IntArray]:
    """`best_batch` over validated 1-D arrays; shared with the speedup table.

    Candidates, (m, s), compute time and efficiency depend on K alone, so they are computed
    once per distinct K; only the sync time varies with N. That keeps a 64×64 speedup table to
    a few elementwise passes over (candidates × allocations).
    """
    params = _Params.of([model]).take(np.zeros(1, dtype=np.int64))
    ks, k_index = np.unique(replicas, return_inverse=True)
    steps, atomic, t_accum, useful = _splits(params, ks.astype(np.float64), num_candidates)
    gamma = float(params.theta[6][0])  # a Python float keeps numpy's fast scalar power
    t_net = _net_times(params, nodes, replicas)
    # Powers per K before gathering onto (candidates × allocations): one power per cell.
    t_optim = ((t_accum**gamma)[:, k_index] + t_net**gamma) ** (1.0 / gamma)
    value = useful[:, k_index] / ((steps * t_accum)[:, k_index] + t_optim)
    return _pick(value, atomic, steps, k_index)


class GoodputModels:
    """Several goodput models' parameters as arrays, gathered once and queried many times.

    A scheduler round asks the same jobs' models for goodputs again and again, a few
    allocations at a time; gathering the parameters of a thousand models costs more than
    evaluating such a query.
    """

    def __init__(self, models: Sequence[GoodputModel]) -> None:
        self.count = len(models)
        self._params = _Params.of(models)

    def best_goodput(
        self,
        model_index: ArrayLike,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        *,
        calls: ArrayLike | None = None,
        num_candidates: int = NUM_CANDIDATES,
    ) -> FloatArray:
        """Best goodput of (model, N, K) queries in one vectorised evaluation.

        Query i uses model ``model_index[i]`` on (N_i, K_i). Queries with equal `calls`
        get exactly what one `best_batch` call on them would (numpy spaces a call's candidate
        batches by all of its K, see `_divide_first`); without `calls` all form one call.

        Returns:
            Best goodput per query (0 where infeasible).
        """
        nodes, replicas = allocation_arrays(num_nodes, num_replicas)
        index = integer_array("model_index", model_index, minimum=0)
        nodes, replicas, index = (
            a.ravel()
            for a in broadcast(
                ("num_nodes", nodes), ("num_replicas", replicas), ("model_index", index)
            )
        )
        if index.size and index.max() >= self.count:
            raise InvalidInputError("model_index", f"must be < {self.count} (number of models)")
        if index.size == 0:
            return np.zeros(0)
        group = None if calls is None else np.broadcast_to(np.asarray(calls), index.shape)
        k = replicas.astype(np.float64)
        every = self._params.take(index)
        low, top, _ = _batch_range(every, k)
        divide_first = _divide_first(low, top, num_candidates, group)
        out = np.empty(index.size)
        for start in range(0, index.size, _CHUNK):  # temporaries that stay in cache
            part = slice(start, start + _CHUNK)
            params = every if index.size <= _CHUNK else self._params.take(index[part])
            steps, _, t_accum, useful = _splits(params, k[part], num_candidates, divide_first[part])
            gamma = params.theta[6]
            t_net = _net_times(params, nodes[part], replicas[part])
            t_optim = (t_accum**gamma + t_net**gamma) ** (1.0 / gamma)
            out[part] = (useful / (steps * t_accum + t_optim)).max(axis=0)
        return out
