"""The batch configuration a job trains with on an allocation shape (nodes, replicas).

Pure: given the job's limits, its latest model and the configuration last handed out for the
shape, choose (per-replica batch, accumulation steps). Before any throughput fit there is
nothing to optimise, so the job's initial batch M0 is split over the replicas; afterwards
`pollux.goodput.best_batch` picks the goodput-maximising batch within the limits, and the
previous choice is kept unless the new one is predicted to be better by more than the
hysteresis (the published agent's 5 % rule), so a refit that moves the optimum by noise does not
make replicas change batch size, and learning-rate scale, back and forth.
"""

from __future__ import annotations

import math

from pollux.agent.profile import Limits, goodput_model
from pollux.goodput import GoodputModel, best_batch, goodput
from pollux.v1 import types_pb2 as pb


class BatchConfigError(ValueError):
    """No configuration within the job's limits exists for the allocation."""


def initial_split(limits: Limits, num_replicas: int) -> tuple[int, int]:
    """(local batch, accumulation steps) that run M0 over `num_replicas` replicas.

    Each replica takes ceil(M0 / K) samples per optimizer step, in as few micro-batches as fit
    the local-batch maximum, rounded down rather than ever exceeding the maximum total batch.
    Where that rounding would take the local batch below its minimum, fewer micro-batches of
    the largest local batch that fits are used instead (a total below M0, the nearest one
    within the limits): so every K up to max_batch // min_local, the replicas the scheduler
    may give a job (`cycle`), has a split.

    Raises:
        BatchConfigError: Even the smallest local batch on every replica exceeds the maximum.
    """
    per_replica = math.ceil(limits.initial / num_replicas)
    fewest = max(1, math.ceil(per_replica / limits.max_local))
    for accum in range(fewest, 0, -1):
        local = max(math.ceil(per_replica / accum), limits.min_local)
        local = min(local, limits.max_local, limits.max_batch // (num_replicas * accum))
        if local >= limits.min_local:
            return local, accum
    raise BatchConfigError(
        f"{num_replicas} replicas × local batch ≥ {limits.min_local} exceed the maximum "
        f"batch size {limits.max_batch}; allocate fewer replicas"
    )


def choose(
    limits: pb.BatchLimits,
    model: pb.JobModel | None,
    num_nodes: int,
    num_replicas: int,
    *,
    last: pb.BatchConfig | None,
    hysteresis: float,
) -> pb.BatchConfig:
    """The batch configuration for an allocation of `num_replicas` over `num_nodes`.

    Args:
        limits: The job's batch limits (from its spec).
        model: The job's latest model, or None before the first report.
        num_nodes: Nodes of the allocation, >= 1.
        num_replicas: Replicas of the allocation, >= num_nodes.
        last: The configuration last handed out for this shape, if any.
        hysteresis: Relative predicted-goodput gain needed to move away from `last`.

    Returns:
        The configuration; `predicted_speedup` is goodput relative to one replica training at
        the initial batch, 0 before the throughput model is fitted.

    Raises:
        BatchConfigError: The allocation admits no configuration within the limits.
        pollux.goodput.InvalidInputError: The limits or the model are inconsistent.
    """
    resolved = Limits.of(limits)
    if model is None or not model.HasField("throughput"):
        local, accum = initial_split(resolved, num_replicas)
        return _config(local, accum, num_replicas, 0.0)
    gm = goodput_model(model, limits)
    choice = best_batch(gm, num_nodes, num_replicas)
    best_value = float(choice.goodput)
    if best_value <= 0:
        raise BatchConfigError(
            f"no batch within the limits fits {num_replicas} replicas "
            f"(max batch {resolved.max_batch}, min local batch {resolved.min_local})"
        )
    local, accum = int(choice.atomic_bsz), int(choice.accum_steps) + 1
    if last is not None and _within(last, resolved, num_replicas):
        kept = _goodput(gm, num_nodes, num_replicas, last.local_batch_size, last.accum_steps)
        if kept > 0 and best_value <= kept * (1 + hysteresis):
            local, accum = last.local_batch_size, last.accum_steps
    # One formula for the chosen configuration whichever way it was chosen, so the same answer
    # always carries the same speedup, to the last bit.
    value = _goodput(gm, num_nodes, num_replicas, local, accum)
    base_local, base_accum = initial_split(resolved, 1)
    base = _goodput(gm, 1, 1, base_local, base_accum)
    return _config(local, accum, num_replicas, value / base if base > 0 else 0.0)


def _goodput(model: GoodputModel, nodes: int, replicas: int, local: int, accum: int) -> float:
    return float(goodput(model, nodes, replicas, local, accum - 1))


def _within(config: pb.BatchConfig, limits: Limits, num_replicas: int) -> bool:
    """Whether a previous configuration is still a legal choice for this shape."""
    total = num_replicas * config.local_batch_size * config.accum_steps
    return (
        limits.min_local <= config.local_batch_size <= limits.max_local
        and config.accum_steps >= 1
        and total <= limits.max_batch
        and config.total_batch_size == total
    )


def _config(local: int, accum: int, replicas: int, speedup: float) -> pb.BatchConfig:
    return pb.BatchConfig(
        local_batch_size=local,
        accum_steps=accum,
        total_batch_size=local * accum * replicas,
        predicted_speedup=speedup,
    )
