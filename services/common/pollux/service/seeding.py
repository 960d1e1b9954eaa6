"""Seeding a new job's profile from an earlier run of the same job (pure, no I/O).

A re-run of a training job runs the same model on the same hardware, so the step times its
earlier run measured are its own; without them every job starts small and may only grow a few
times its largest measured size each round (`pollux.policy.exploration`), paying a restart per
step. With `scheduling.seed_profiles` on (off by default), a submission is seeded from the
owner's newest earlier job of the same name that has a throughput fit: its rows become the new
profile's `seed_observations` and its fit the new model's start, so the first round can size it.

Seeded rows never mix with the job's own: reports merge into `observations` only, and the fit
uses a seeded row only for a (nodes, replicas, local batch) the job has not measured itself
(`fit_rows`). Gradient statistics, declared work and batch hysteresis belong to one run and
are not seeded. Both values live under the new job's keys and are deleted with it.
"""

from __future__ import annotations

from pollux.v1 import types_pb2 as pb

MAX_SEED_ROWS = 1024
"""Seeded rows a profile keeps: the most-observed ones, so a seed chained over many re-runs
stays a small etcd value (about 50 bytes a row), as a profile's own rows are bounded."""


def _fit_key(obs: pb.StepObservation) -> tuple[int, int, int]:
    return (obs.num_nodes, obs.num_replicas, obs.local_batch_size)


def fit_rows(profile: pb.ObservationProfile) -> list[pb.StepObservation]:
    """The rows the fit uses: the job's own, and seeded ones of (N, K, m) it has not measured.

    Step times depend on the model, the placement and the per-GPU batch, not on the run, so
    an earlier run's rows stand in until the job measures that configuration itself.
    """
    own = {_fit_key(obs) for obs in profile.observations}
    seeded = [obs for obs in profile.seed_observations if _fit_key(obs) not in own]
    return [*profile.observations, *seeded]


def seeded(
    job: pb.Job, earlier: pb.ObservationProfile, model: pb.JobModel, *, now_s: float
) -> tuple[pb.ObservationProfile, pb.JobModel] | None:
    """The profile and model `job` starts with, seeded from an earlier run; None if nothing.

    Args:
        job: The new job (its id and batch limits are used).
        earlier: The earlier run's profile: its own rows and what it was seeded with, so a
            chain of re-runs carries every configuration measured before.
        model: The earlier run's model; its throughput fit is the new job's starting fit.
        now_s: Publication time of the seeded model, seconds since the epoch.
    """
    rows = [obs for obs in fit_rows(earlier) if obs.accum_step_time_s > 0]
    if not rows or not model.HasField("throughput"):
        return None
    rows = sorted(rows, key=lambda obs: (-obs.count, _fit_key(obs), obs.accum_steps))
    rows = rows[:MAX_SEED_ROWS]
    source = earlier.job_id or model.job_id
    profile = pb.ObservationProfile(job_id=job.id, seed_observations=rows, seeded_from=source)
    seeded_model = pb.JobModel(
        job_id=job.id,
        throughput=model.throughput,
        batch=job.spec.batch,
        max_profiled_replicas=max(obs.num_replicas for obs in rows),
        seeded_from=source,
    )
    seeded_model.update_time.FromNanoseconds(int(now_s * 1e9))
    return profile, seeded_model
