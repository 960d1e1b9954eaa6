"""`EstimateJob`: when would a job complete if it were submitted now?

A job not yet submitted has no model and no size of its own. A team re-running a training
job has both from its earlier runs, so the estimate borrows them from the caller's newest
earlier job of the same name that reported a throughput model and a declared size: its
goodput model (with the new spec's batch limits) and its size, progress + remaining work
in M0-steps. The new job joins the live state as a pending job and the cluster is forecast
forward with the scheduler's policy (`pollux.policy.forecast`).

`reference_work` and `estimate` are plain functions; the servicer finds the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pollux.policy.forecast import forecast
from pollux.policy.types import ClusterState, JobInfo, Policy
from pollux.scheduler.cycle import goodput_model, replica_cap
from pollux.v1 import types_pb2 as pb

NEW_JOB = "estimated-job"
"""Name of the hypothetical job in the forecast (no job id has this form)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """A prediction: completion time (state clock, s) and what it assumed."""

    completion: float
    work: float
    rounds: int


FINE_ROUNDS = 240
"""Rounds an estimate plays at the live scheduler's interval before coarser ones."""


def reference_work(model: pb.JobModel) -> float | None:
    """An earlier run's size, progress + declared remaining work (M0-steps), if it has one."""
    if not model.HasField("throughput") or not model.HasField("work"):
        return None
    work = model.work
    if not work.HasField("remaining"):
        return None
    total = work.progress + work.remaining
    return total if total > 0 else None


def estimate(
    state: ClusterState,
    policy: Policy[Any],
    spec: pb.JobSpec,
    reference: pb.JobModel,
    *,
    round_s: float,
    restart_delay_s: float,
    live_round_s: float | None = None,
) -> Estimate | None:
    """The forecast completion of `spec` submitted at `state.now`; None if not within reach.

    Raises:
        ValueError: `reference` has no throughput fit or no declared size (`reference_work`).
    """
    work = reference_work(reference)
    model = goodput_model(pb.Job(spec=spec), reference)
    if work is None or model is None:
        raise ValueError("the reference has no throughput model or no declared size")
    total = sum(node.gpus for node in state.nodes)
    new = JobInfo(
        name=NEW_JOB,
        submission_time=state.now,
        # A new job starts as the policy lets one that has measured nothing (as live), and
        # the forecast grows it as it measures.
        max_replicas=policy.replica_limit(0, 0, replica_cap(spec, total)),
        model=model,
        target_replicas=max(1, min(int(spec.max_replicas or 1), total or 1)),
        target_batch_size=int(spec.batch.initial_batch_size),
        remaining_work=work,
    )
    caps = {NEW_JOB: int(spec.max_replicas)} if spec.max_replicas else None
    # At the live scheduler's own rounds first, as far as FINE_ROUNDS reach: a short job
    # then starts when the live one would, not a whole coarse round later (a 30 s job was
    # once estimated at 5 minutes). Beyond them, the coarse rounds bound the cost.
    grains = [(live_round_s, FINE_ROUNDS)] if live_round_s and live_round_s < round_s else []
    played = 0
    for grain, rounds in [*grains, (round_s, 10_000)]:
        result = forecast(
            replace(state, jobs=(*state.jobs, new)),
            policy,
            round_s=grain,
            restart_delay_s=restart_delay_s,
            max_rounds=rounds,
            caps=caps,
            until=NEW_JOB,
        )
        played += result.rounds
        if NEW_JOB in result.completion:
            return Estimate(result.completion[NEW_JOB], work, played)
    return None
