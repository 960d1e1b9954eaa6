"""Goodput models per GPU type: one fit per type, and a model for a type not yet run on.

A job measured on several GPU types has one throughput fit per type: multi-GPU scaling does
not carry over between types (their interconnects differ by amounts that depend on each
model's gradient size), while the 1-GPU speed ratio does decide which type a job prefers.
So a type's model is, in order (`bootstrap`): the job's own fit on that type; else its model
on a type it has run on, with the compute terms scaled by the 1-GPU step-time ratio at the
same per-GPU batch (from an earlier run that measured both types, `OneGpuSteps`) and sync
pinned optimistic, as Pollux's prior before a job has run on two GPUs; else its model on a
type it has run on as it is (ratio 1), so that the policy tries the type. docs/policy.md
("Several GPU types") has the measurements behind this order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from pollux.goodput._validate import FloatArray
from pollux.goodput.errors import InvalidInputError
from pollux.goodput.fit import CROSS_NODE_MARGIN, FitResult, Observations, fit_perf_params
from pollux.goodput.params import GoodputModel, PerfParams, SyncModel
from pollux.goodput.throughput import TINY


@dataclass(frozen=True, slots=True)
class TypedProfile:
    """A job's step-time observations, per GPU type.

    Attributes:
        observations: Per GPU type, its mean step times (one row per (N, K, m)).
    """

    observations: Mapping[str, Observations]


def fit_by_type(
    profile: TypedProfile,
    *,
    sync_model: SyncModel = SyncModel.RING,
    initial: Mapping[str, PerfParams] | None = None,
) -> dict[str, FitResult]:
    """One `fit_perf_params` per GPU type with observations, keyed by type.

    Args:
        profile: The observations per type.
        sync_model: The sync model of every fit.
        initial: Per type, a previous fit to start from (types without one start afresh).

    Raises:
        InvalidInputError: A type's observations are invalid (the field names the type).
        FitError: No start converged for some type.
    """
    out = {}
    for gpu_type in sorted(profile.observations):
        obs = profile.observations[gpu_type]
        try:
            out[gpu_type] = fit_perf_params(
                obs.num_nodes,
                obs.num_replicas,
                obs.atomic_bsz,
                obs.accum_step_time,
                obs.optim_step_time,
                sync_model=sync_model,
                initial=None if initial is None else initial.get(gpu_type),
            )
        except InvalidInputError as err:
            raise InvalidInputError(f"observations[{gpu_type}].{err.field}", err.problem) from err
    return out


@dataclass(frozen=True, slots=True)
class OneGpuSteps:
    """An application's measured 1-GPU step times per type, from an earlier run (a seed).

    Attributes:
        seconds: Per GPU type, per per-GPU batch m (samples), the mean seconds of a step on
            one GPU.
        max_atomic_bsz: Per GPU type, the largest per-GPU batch that fits in its memory
            (types not named keep the known type's limit).
    """

    seconds: Mapping[str, Mapping[int, float]]
    max_atomic_bsz: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for gpu_type, steps in self.seconds.items():
            for m, t in steps.items():
                if not (isinstance(m, int) and m >= 1 and np.isfinite(t) and t > 0):
                    raise InvalidInputError(
                        f"seconds[{gpu_type}][{m}]",
                        "per-GPU batches must be integers ≥ 1 and step times finite and > 0",
                    )

    def ratio(self, known: str, other: str) -> tuple[FloatArray, FloatArray]:
        """(m, t_other(m) / t_known(m)) at the per-GPU batches measured on both types."""
        a, b = self.seconds.get(known, {}), self.seconds.get(other, {})
        common = sorted(set(a) & set(b))
        m = np.array(common, dtype=np.float64)
        return m, np.array([b[x] / a[x] for x in common], dtype=np.float64)


def transfer(known: PerfParams, m: FloatArray, time_ratio: FloatArray) -> PerfParams:
    """`known`'s throughput model moved to another type by 1-GPU step-time ratios.

    The other type's compute time at each per-GPU batch m is the known model's times the
    measured ratio t_other(m)/t_known(m); its compute terms (α_c, β_c) are the line through
    those points (one point: both terms scaled by its ratio). Sync is pinned optimistic (as
    Pollux's fit before a job has run on two GPUs: negligible, cross-node 10 % above local),
    since sync times do not transfer between types; γ is kept.

    Raises:
        InvalidInputError: No ratio given, or one not finite and > 0.
    """
    if m.size == 0 or m.shape != time_ratio.shape:
        raise InvalidInputError("time_ratio", "need one ratio per per-GPU batch, at least one")
    if not (np.all(np.isfinite(time_ratio)) and np.all(time_ratio > 0)):
        raise InvalidInputError("time_ratio", "every ratio must be finite and > 0")
    compute = (known.alpha_c + known.beta_c * m) * time_ratio
    if np.unique(m).size >= 2:
        beta, alpha = np.polyfit(m, compute, 1)
        if alpha < TINY:  # the line through the origin (all per-sample time)
            alpha, beta = TINY, float(np.sum(compute * m) / np.sum(m * m))
        if beta < TINY:  # flat: all fixed time
            alpha, beta = float(np.mean(compute)), TINY
    else:
        scale = float(np.mean(time_ratio))
        alpha, beta = known.alpha_c * scale, known.beta_c * scale
    return PerfParams(
        alpha_c=max(float(alpha), TINY),
        beta_c=max(float(beta), TINY),
        alpha_n=CROSS_NODE_MARGIN * TINY,
        beta_n=CROSS_NODE_MARGIN * TINY,
        alpha_r=TINY,
        beta_r=TINY,
        gamma=known.gamma,
        sync_model=known.sync_model,
    )


def bootstrap(
    models: Mapping[str, GoodputModel], gpu_type: str, seed: OneGpuSteps | None = None
) -> GoodputModel | None:
    """The job's model on `gpu_type` (module docstring: own, transferred, or as known).

    Args:
        models: The job's models on the types it has a fit for.
        gpu_type: The type wanted.
        seed: 1-GPU step times of the same application on several types, if known.

    Returns:
        Its model on `gpu_type`; None when it has no model on any type (it then scales
        linearly, as a job that has not run yet).
    """
    if gpu_type in models:
        return models[gpu_type]
    if not models:
        return None
    known = sorted(models)
    if seed is not None:
        for source in known:
            m, ratio = seed.ratio(source, gpu_type)
            if m.size:
                model = models[source]
                perf = transfer(model.perf, m, ratio)
                limit = seed.max_atomic_bsz.get(gpu_type, model.max_atomic_bsz)
                if limit is not None:
                    limit = max(limit, model.min_atomic_bsz)
                return replace(model, perf=perf, max_atomic_bsz=limit)
    return models[known[0]]


def models_by_type(
    models: Mapping[str, GoodputModel],
    gpu_types: frozenset[str] | set[str] | tuple[str, ...],
    seed: OneGpuSteps | None = None,
) -> dict[str, GoodputModel]:
    """`bootstrap` for every type of `gpu_types` (types without any model left out)."""
    out = {}
    for gpu_type in sorted(gpu_types):
        model = bootstrap(models, gpu_type, seed)
        if model is not None:
            out[gpu_type] = model
    return out
