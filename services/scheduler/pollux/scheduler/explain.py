"""Explain's counterfactuals: what a job would do with other GPU counts, and who holds the GPUs.

`pollux-cli explain` answers "why does my job have N GPUs?" with the quantities the Pollux
policy weighs, evaluated now on the live state (the scheduler's mirror, the agents' models):

- the job's speedup and goodput at N-1, N and N+1 GPUs, each on the fewest nodes that hold
  them (the speedup functions the policy maximises: `pollux.policy.problem.Problem`);
- the jobs whose last GPU is worth least to them: a GPU for this job would have to come from
  one of them, and the policy gives it only where it raises the objective more;
- the batch size its model picks on the current allocation, with throughput and statistical
  efficiency (goodput = throughput x efficiency);
- its place among the pending jobs.

Plain functions over the policy's dataclasses, no I/O: the servicer builds the state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pollux.goodput import best_batch, efficiency
from pollux.policy.params import PolluxParams
from pollux.policy.problem import Problem
from pollux.policy.types import ClusterState, JobExplain, JobInfo
from pollux.scheduler.lifecycle import clipped
from pollux.v1 import types_pb2 as pb

HOLDERS = 3
"""Holders listed: enough to show where a GPU would come from, short enough to read."""


@dataclass(frozen=True, slots=True)
class Alternative:
    """One GPU count for the job: speedup (dimensionless) and goodput (samples/s)."""

    gpus: int
    nodes: int
    speedup: float
    goodput: float


@dataclass(frozen=True, slots=True)
class Holder:
    """A job holding GPUs; ``speedup - speedup_without_one`` is what its last GPU is worth."""

    job_id: str
    gpus: int
    speedup: float
    speedup_without_one: float

    @property
    def last_gpu_worth(self) -> float:
        """Speedup the job loses by giving one GPU up."""
        return self.speedup - self.speedup_without_one


@dataclass(frozen=True, slots=True)
class BatchPick:
    """The batch choice on an allocation (samples; samples/s; efficiency is a fraction)."""

    batch_size: int
    local_batch_size: int
    accum_steps: int
    throughput: float
    efficiency: float
    goodput: float


@dataclass(frozen=True, slots=True)
class Counterfactual:
    """Everything `counterfactual` found for one job."""

    alternatives: tuple[Alternative, ...]
    holders: tuple[Holder, ...]
    batch: BatchPick | None
    queue_position: int
    pending_jobs: int


def decision_entry(
    job_id: str,
    nodes: tuple[str, ...],
    explain: JobExplain | None,
    moved: bool,
    model: pb.JobModel | None,
) -> pb.JobDecision:
    """A job's part of a round's decision record, as Explain reads it back.

    Beside the allocation, speedup and reason: what a move would have cost it (the restart
    factor), what one more GPU was worth, its GPU limit, what speedup 1.0 stood for and
    which model the round valued it with, so that Explain can say why a GPU was not given
    and why a speedup changed while the allocation did not.
    """
    entry = pb.JobDecision(
        job_id=job_id,
        nodes=list(nodes),
        speedup=explain.speedup if explain else 0.0,
        restart_penalty=explain.penalty if explain else 1.0,
        reason=clipped(explain.reason) if explain else "",
        changed=moved,
    )
    if explain is not None:
        if explain.move_factor is not None:
            entry.move_factor = explain.move_factor
        if explain.one_more is not None:
            entry.speedup_one_more = explain.one_more
        entry.gpu_limit = max(explain.limit or 0, 0)
        if explain.reference is not None:
            entry.reference_nodes, entry.reference_gpus = explain.reference
    if model is not None and model.HasField("update_time"):
        entry.model_time.CopyFrom(model.update_time)
    return entry


def counterfactual(
    state: ClusterState,
    job_id: str,
    params: PolluxParams | None = None,
    *,
    holders: int = HOLDERS,
) -> Counterfactual:
    """The counterfactuals of active job `job_id` in `state` (module docstring).

    Raises:
        KeyError: `job_id` is not an active job of `state`.
    """
    names = [job.name for job in state.jobs]
    j = names.index(job_id) if job_id in names else -1
    if j < 0:
        raise KeyError(job_id)
    job = state.jobs[j]
    pending = [x.name for x in state.jobs if not x.allocation]
    position = pending.index(job_id) + 1 if job_id in pending else 0
    if not state.nodes:
        return Counterfactual((), (), None, position, len(pending))
    problem = Problem(state, params or PolluxParams())
    return Counterfactual(
        alternatives=_alternatives(problem, j, job),
        holders=_holders(problem, j, holders),
        batch=_batch(job),
        queue_position=position,
        pending_jobs=len(pending),
    )


def _alternatives(problem: Problem, j: int, job: JobInfo) -> tuple[Alternative, ...]:
    now = len(job.allocation)
    top = int(problem.max_k[j])
    ks = np.array([k for k in (now - 1, now, now + 1) if 1 <= k <= top], dtype=np.int64)
    if ks.size == 0:
        return ()
    nodes = problem.consolidated_nodes(ks)
    speed = problem.speedup[j](nodes, ks)
    good = (
        best_batch(job.model, nodes, ks).goodput
        if job.model is not None
        else np.zeros(ks.size, dtype=np.float64)
    )
    return tuple(
        Alternative(int(k), int(n), float(s), float(g))
        for k, n, s, g in zip(ks, nodes, speed, good, strict=True)
    )


def _holders(problem: Problem, j: int, count: int) -> tuple[Holder, ...]:
    others = [i for i in range(problem.num_jobs) if i != j and problem.current_k[i] > 0]
    found = []
    for i in others:
        k = int(problem.current_k[i])
        span = np.array([int(problem.current_spans[i])])
        now = float(problem.speedup[i](span, np.array([k]))[0])
        if k > 1:
            fewer = np.array([k - 1])
            less = float(problem.speedup[i](problem.consolidated_nodes(fewer), fewer)[0])
        else:
            less = 0.0
        found.append(Holder(problem.state.jobs[i].name, k, now, less))
    found.sort(key=lambda h: (h.last_gpu_worth, h.job_id))
    return tuple(found[:count])


def _batch(job: JobInfo) -> BatchPick | None:
    model, replicas = job.model, len(job.allocation)
    if model is None or replicas == 0:
        return None
    nodes = len(set(job.allocation))
    choice = best_batch(model, nodes, replicas)
    local, accum = int(choice.atomic_bsz), int(choice.accum_steps)
    if local == 0:
        return None
    batch = replicas * local * (accum + 1)
    eff = float(efficiency(model.grad, float(model.init_batch_size), batch))
    good = float(choice.goodput)
    return BatchPick(batch, local, accum, good / eff if eff > 0 else 0.0, eff, good)
