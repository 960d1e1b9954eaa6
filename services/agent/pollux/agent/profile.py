"""A job's observation profile: merging reports, fitting, and the published model.

Pure functions (no I/O, no clock): the agent reads a profile from etcd, calls these, and writes
the result back with a compare-and-swap, so the same functions give the same profile whichever
agent applies a report. This is also the one place that converts between `pollux.v1` messages
and `pollux.goodput` dataclasses; the core never sees a protobuf.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from pollux.goodput import (
    UNKNOWN_GRAD,
    FitResult,
    GoodputModel,
    GradParams,
    InvalidInputError,
    Observations,
    PerfParams,
    SyncModel,
    fit_perf_params,
)
from pollux.service.seeding import fit_rows
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import types_pb2 as pb

KEEP_GENERATIONS = 2
"""Allocation generations whose report sequence numbers are kept for deduplication.

Older entries are pruned so a long-lived job's profile stays small; a report from a generation
older than every kept one is treated as already applied (its replicas were stopped long ago).
"""
MAX_UINT32 = 2**32 - 1
MAX_REPORT_STEPS = 512
"""Most optimizer steps one report adds to the profile (`report_weights`): in a configuration's
mean one report weighs at most this many steps however many it claims, so a forged count is
outweighed by honest reports as they accumulate (docs/architecture.md §6)."""
MAX_PROFILE_ROWS = 1024
"""Configuration rows a profile keeps. A job meets at most a few hundred (allocation shapes
times the batch sizes chosen for them); past the bound the least-observed rows the report did
not touch are dropped, so the profile (about 50 bytes a row) stays a small etcd value."""
MAX_APPLIED_SEQ = 4096
"""Replica keys ("<generation>/<rank>") kept for deduplication: every rank of the largest job a
spec allows (max_replicas <= 4096). Past it the older kept generation is dropped first (its
late reports then count as already applied); a new rank of a newest generation already this
large is not applied: ranks are client input, and its peers report the same configurations."""
MAX_SHAPES = 1024
"""Allocation shapes whose last batch configuration a profile keeps for hysteresis. Shapes are
request input; past the bound the others are dropped in key order (a dropped shape only loses
its hysteresis once, should the job see it again)."""


def report_weights(observations: Sequence[pb.StepObservation]) -> list[int]:
    """The steps each observation adds to the profile: counts scaled to `MAX_REPORT_STEPS`.

    Proportional, rounded down, at least one each (so at most `MAX_REPORT_STEPS` plus one per
    observation in all); unchanged when the report is within the cap.
    """
    total = sum(obs.count for obs in observations)
    if total <= MAX_REPORT_STEPS:
        return [obs.count for obs in observations]
    return [max(1, obs.count * MAX_REPORT_STEPS // total) for obs in observations]


def already_applied(profile: pb.ObservationProfile, request: api.ReportMetricsRequest) -> bool:
    """Whether the report's (generation, rank, seq) was applied to `profile` before.

    Also true for a report older than the replica's newest applied one, and for a generation
    older than every kept one (its replicas were stopped long ago).
    """
    generations = {_generation_of(k) for k in profile.applied_seq}
    if generations and request.generation < min(generations):
        return True
    key = f"{request.generation}/{request.rank}"
    return key in profile.applied_seq and request.seq <= profile.applied_seq[key]


def shape_key(num_nodes: int, num_replicas: int) -> str:
    """Key of an allocation shape in `ObservationProfile.last_configs`."""
    return f"{num_nodes}/{num_replicas}"


def observation_count(profile: pb.ObservationProfile) -> int:
    """Optimizer steps observed in total: what `observations` counts in responses and models.

    Each report counts at most `MAX_REPORT_STEPS` of them (its merge weight).
    """
    return sum(obs.count for obs in profile.observations)


@dataclass(frozen=True, slots=True)
class Merge:
    """The outcome of applying a report to a profile.

    Attributes:
        profile: The new profile (a copy; the input is never modified), or the input itself
            when the report was not applied.
        applied: False when (generation, rank, seq) had been applied already, or the report is
            from a generation too old to tell.
        new_configuration: Whether a (nodes, replicas, local batch) never seen before arrived:
            the throughput fit can learn something new, so it should run now.
    """

    profile: pb.ObservationProfile
    applied: bool
    new_configuration: bool


def merge_report(profile: pb.ObservationProfile, request: api.ReportMetricsRequest) -> Merge:
    """Apply a valid report (`report_check`) to a profile, once per (generation, rank, seq).

    Observations of the same (nodes, replicas, local batch, accumulation steps) merge into one
    count-weighted mean, so the profile stays one row per configuration however long the job
    runs; a report's counts are first clipped to `MAX_REPORT_STEPS` in all
    (`report_weights`), so no report outweighs the honest ones for good. The
    latest gradient statistics replace the previous ones. The profile stays bounded:
    at most `MAX_PROFILE_ROWS` rows and `MAX_APPLIED_SEQ` replica keys (see both).
    """
    if already_applied(profile, request):
        return Merge(profile, applied=False, new_configuration=False)
    key = f"{request.generation}/{request.rank}"

    merged = pb.ObservationProfile()
    merged.CopyFrom(profile)
    merged.job_id = request.job_id
    merged.applied_seq[key] = request.seq
    _prune_generations(merged)
    if key not in profile.applied_seq and len(merged.applied_seq) > MAX_APPLIED_SEQ:
        return Merge(profile, applied=False, new_configuration=False)
    rows = {_config_of(obs): obs for obs in merged.observations}
    fit_rows = {_config_of(obs)[:3] for obs in merged.observations}
    new_configuration = False
    weights = report_weights(request.observations)
    for obs, weight in zip(request.observations, weights, strict=True):
        config = _config_of(obs)
        new_configuration |= config[:3] not in fit_rows
        fit_rows.add(config[:3])
        row = rows.get(config)
        if row is None:
            row = merged.observations.add()
            row.CopyFrom(obs)
            row.count = weight
            rows[config] = row
            continue
        total = row.count + weight
        row.accum_step_time_s = (
            row.accum_step_time_s * row.count + obs.accum_step_time_s * weight
        ) / total
        row.optim_step_time_s = (
            row.optim_step_time_s * row.count + obs.optim_step_time_s * weight
        ) / total
        row.count = min(total, MAX_UINT32)
    _drop_rows(merged, {_config_of(obs) for obs in request.observations})
    if request.HasField("gradient"):
        merged.gradient.CopyFrom(request.gradient)
    if request.HasField("work"):
        merged.work.CopyFrom(request.work)
    return Merge(merged, applied=True, new_configuration=new_configuration)


def _config_of(obs: pb.StepObservation) -> tuple[int, int, int, int]:
    return (obs.num_nodes, obs.num_replicas, obs.local_batch_size, obs.accum_steps)


def _generation_of(key: str) -> int:
    return int(key.partition("/")[0])


def _prune_generations(profile: pb.ObservationProfile) -> None:
    """Keep the newest `KEEP_GENERATIONS`, the older first to go past `MAX_APPLIED_SEQ` keys."""
    per_generation = Counter(_generation_of(k) for k in profile.applied_seq)
    kept = sorted(per_generation)[-KEEP_GENERATIONS:]
    while len(kept) > 1 and sum(per_generation[g] for g in kept) > MAX_APPLIED_SEQ:
        kept.pop(0)
    for key in [k for k in profile.applied_seq if _generation_of(k) not in kept]:
        del profile.applied_seq[key]


def _drop_rows(profile: pb.ObservationProfile, touched: set[tuple[int, int, int, int]]) -> None:
    """Drop the least-observed rows past `MAX_PROFILE_ROWS`, never one of `touched`."""
    excess = len(profile.observations) - MAX_PROFILE_ROWS
    if excess <= 0:
        return
    candidates = sorted(
        (obs.count, _config_of(obs))
        for obs in profile.observations
        if _config_of(obs) not in touched
    )
    dropped = {config for _, config in candidates[:excess]}
    for i in reversed(range(len(profile.observations))):
        if _config_of(profile.observations[i]) in dropped:
            del profile.observations[i]


def with_config(
    profile: pb.ObservationProfile, job_id: str, shape: str, config: pb.BatchConfig
) -> pb.ObservationProfile:
    """A copy of `profile` that remembers `config` for `shape`, with at most `MAX_SHAPES`."""
    updated = pb.ObservationProfile()
    updated.CopyFrom(profile)
    updated.job_id = job_id
    updated.last_configs[shape].CopyFrom(config)
    excess = len(updated.last_configs) - MAX_SHAPES
    for other in sorted(k for k in updated.last_configs if k != shape)[: max(excess, 0)]:
        del updated.last_configs[other]
    return updated


def can_fit(profile: pb.ObservationProfile) -> bool:
    """Whether the profile has a row the throughput fit can use (see `fit_observations`)."""
    return any(o.accum_step_time_s > 0 for o in fit_rows(profile))


def fit_observations(profile: pb.ObservationProfile) -> Observations | None:
    """One fit row per (nodes, replicas, local batch), or None when nothing can be fitted.

    Rows of one (N, K, m) with different accumulation steps are pooled (count-weighted): the
    model's step times do not depend on accumulation. Rows without a measured accumulation
    (compute) time are left out: the fit works in log-time and needs both times. Seeded rows
    count only where the job has not measured the (N, K, m) itself (`fit_rows`).
    """
    pooled: dict[tuple[int, int, int], list[float]] = {}
    for obs in fit_rows(profile):
        if obs.accum_step_time_s <= 0:
            continue
        row = pooled.setdefault(_config_of(obs)[:3], [0.0, 0.0, 0.0])
        row[0] += obs.accum_step_time_s * obs.count
        row[1] += obs.optim_step_time_s * obs.count
        row[2] += obs.count
    if not pooled:
        return None
    configs = sorted(pooled)
    columns = np.array(configs, dtype=np.float64).T
    sums = np.array([pooled[c] for c in configs], dtype=np.float64).T
    return Observations.from_columns(
        columns[0], columns[1], columns[2], sums[0] / sums[2], sums[1] / sums[2]
    )


def fit_profile(
    profile: pb.ObservationProfile, previous: pb.ThroughputParams | None
) -> FitResult | None:
    """Fit the throughput model to a profile, warm-started from the previous parameters.

    Returns:
        The fit, or None when the profile has nothing to fit yet.

    Raises:
        pollux.goodput.FitError: No optimiser start converged to a finite loss.
    """
    obs = fit_observations(profile)
    if obs is None:
        return None
    initial = perf_from_pb(previous) if previous is not None else None
    return fit_perf_params(
        obs.num_nodes,
        obs.num_replicas,
        obs.atomic_bsz,
        obs.accum_step_time,
        obs.optim_step_time,
        sync_model=initial.sync_model if initial is not None else SyncModel.RING,
        initial=initial,
    )


def build_model(
    profile: pb.ObservationProfile,
    limits: pb.BatchLimits,
    throughput: pb.ThroughputParams | None,
    *,
    agent_id: str,
    now_s: float,
) -> pb.JobModel:
    """The model to publish for the scheduler from a profile and its latest fit."""
    model = pb.JobModel(
        job_id=profile.job_id,
        grad_sqr=profile.gradient.sqr,
        grad_var=profile.gradient.var,
        batch=limits,
        max_profiled_replicas=max((o.num_replicas for o in fit_rows(profile)), default=0),
        observations=observation_count(profile),
        agent_id=agent_id,
        seeded_from=profile.seeded_from,
    )
    if throughput is not None:
        model.throughput.CopyFrom(throughput)
    if profile.HasField("work"):
        model.work.CopyFrom(profile.work)
    stamp = Timestamp()
    stamp.FromNanoseconds(int(now_s * 1e9))
    model.update_time.CopyFrom(stamp)
    return model


# -- conversions between pollux.v1 and pollux.goodput -------------------------------------------

_SYNC_TO_PB = {SyncModel.RING: pb.SYNC_MODEL_RING, SyncModel.LINEAR: pb.SYNC_MODEL_LINEAR}


def perf_to_pb(perf: PerfParams) -> pb.ThroughputParams:
    """`PerfParams` as the wire message."""
    a_c, b_c, a_n, b_n, a_r, b_r, gamma = perf.as_tuple()
    return pb.ThroughputParams(
        alpha_c=a_c,
        beta_c=b_c,
        alpha_n=a_n,
        beta_n=b_n,
        alpha_r=a_r,
        beta_r=b_r,
        gamma=gamma,
        sync_model=_SYNC_TO_PB[perf.sync_model],
    )


def perf_from_pb(message: pb.ThroughputParams) -> PerfParams:
    """The wire message as `PerfParams` (UNSPECIFIED sync model means RING, the default).

    Raises:
        pollux.goodput.InvalidInputError: A parameter is out of range.
    """
    sync = SyncModel.LINEAR if message.sync_model == pb.SYNC_MODEL_LINEAR else SyncModel.RING
    return PerfParams(
        message.alpha_c,
        message.beta_c,
        message.alpha_n,
        message.beta_n,
        message.alpha_r,
        message.beta_r,
        message.gamma,
        sync,
    )


def grad_from_model(model: pb.JobModel) -> GradParams:
    """The model's gradient statistics; `UNKNOWN_GRAD` (efficiency 1) before any arrived."""
    if model.grad_sqr == 0 and model.grad_var == 0:
        return UNKNOWN_GRAD
    return GradParams(model.grad_sqr, model.grad_var)


@dataclass(frozen=True, slots=True)
class Limits:
    """A job's `BatchLimits` with the zero defaults resolved (samples).

    Attributes:
        initial: M0, the total batch the learning rate was tuned for.
        max_batch: Largest total batch.
        min_local: Smallest per-replica micro-batch.
        max_local: Largest per-replica micro-batch.
    """

    initial: int
    max_batch: int
    min_local: int
    max_local: int

    @classmethod
    def of(cls, limits: pb.BatchLimits) -> Limits:
        """Resolve the documented defaults (0 = M0, 1, max batch) and check consistency.

        Raises:
            pollux.goodput.InvalidInputError: The limits admit no configuration at all.
        """
        m0 = limits.initial_batch_size
        if m0 < 1:
            raise InvalidInputError("batch.initial_batch_size", "must be >= 1")
        top = limits.max_batch_size or m0
        low = limits.min_local_batch_size or 1
        high = limits.max_local_batch_size or top
        if top < m0:
            raise InvalidInputError("batch.max_batch_size", f"{top} is below M0={m0}")
        if low > min(high, top):
            raise InvalidInputError(
                "batch.min_local_batch_size", f"{low} exceeds the largest usable local batch"
            )
        return cls(m0, top, low, high)


def goodput_model(model: pb.JobModel, limits: pb.BatchLimits) -> GoodputModel:
    """The goodput model of a fitted `JobModel` under a job's batch limits.

    Accumulation is always allowed: the training library supports it, and without it a job
    whose M0 does not fit one GPU's memory could not run at all.

    Raises:
        pollux.goodput.InvalidInputError: The parameters or limits are inconsistent.
    """
    resolved = Limits.of(limits)
    return GoodputModel(
        perf=perf_from_pb(model.throughput),
        grad=grad_from_model(model),
        init_batch_size=resolved.initial,
        max_batch_size=resolved.max_batch,
        min_atomic_bsz=resolved.min_local,
        max_atomic_bsz=resolved.max_local,
        accumulation=True,
    )
