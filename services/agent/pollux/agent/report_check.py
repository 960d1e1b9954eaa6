"""The one validation of a metrics report: `check_report`, called by the agent before a merge.

A report is refused (INVALID_ARGUMENT, every problem named, nothing stored) when a field is
malformed, when it claims what no honest replica measures (step times, training time per
report, gradient statistics, work status out of bounds), when it breaks its job's limits
(replicas, batch size), or when its replica claims more training than the wall time since its
earlier reports allows (`ReplicaBudgets`, the agent's memory). The rules and their reasons are
in docs/architecture.md §6; the weight a valid report gets in the profile is the merge's
(`profile.report_weights`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pollux.agent.profile import Limits
from pollux.goodput import GoodputError
from pollux.user_metrics import metric_problems
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import types_pb2 as pb

Problem = tuple[str, str]
"""(field path, what to fix) of one violation."""
ReplicaKey = tuple[str, int, int]
"""(job, generation, rank) of a replica."""

MAX_REPORT_OBSERVATIONS = 64
"""Observations one report may carry. A replica reports the configurations it ran since its
last report (one or two); a longer list is a broken client."""
MIN_STEP_TIME_S = 1e-4
"""Least time one optimizer step is counted for in `claimed_seconds` (not refused below it):
a synchronising step takes milliseconds at least, and ``count = 10**6`` then claims 100 s."""
MAX_STEP_TIME_S = 600.0
"""Longest plausible mean time of one micro-batch (accumulation or optimizer step), seconds."""
MAX_REPORT_SPAN_S = 900.0
"""Most training seconds one report may cover, and the backlog a replica's budget holds."""
MAX_GRADIENT_STAT = 1e30
"""Largest plausible gradient statistic: a squared gradient norm beyond it has diverged."""
MAX_WORK_STEPS = 1e12
"""Largest plausible progress or remaining work, M0-steps (a trillion optimizer steps)."""
MAX_RESCALE_PAUSE_S = 7 * 86400.0
"""Longest plausible rescale pause: a week (a job suspended that long counts as a restart)."""
MAX_TRACKED_REPLICAS = 65_536
"""Replica budgets an agent keeps; the least recently reporting go first (they restart full)."""


@dataclass(frozen=True, slots=True)
class JobBounds:
    """What a report is checked against from its job's spec.

    Attributes:
        max_batch: The job's largest total batch, or None when its limits are unusable (then
            the batch is not checked: the job cannot be tuned anyway).
        max_replicas: The job's replica limit; 0 means none.
    """

    max_batch: int | None = None
    max_replicas: int = 0

    @classmethod
    def of(cls, limits: pb.BatchLimits, max_replicas: int) -> JobBounds:
        """The bounds of a job with these batch `limits` and replica limit."""
        try:
            max_batch: int | None = Limits.of(limits).max_batch
        except GoodputError:  # limits that admit nothing
            max_batch = None
        return cls(max_batch, max_replicas)


def check_report(
    request: api.ReportMetricsRequest,
    job: JobBounds,
    *,
    budgets: ReplicaBudgets | None = None,
    now: float = 0.0,
) -> list[Problem]:
    """Every problem of a report, as (field path, what to fix); empty when it may be merged.

    Args:
        request: The report.
        job: Its job's bounds.
        budgets: The replicas' time budgets, checked (at clock reading `now`) only when the
            report is otherwise valid; None for a report that will not be applied (a retry of
            an applied one claims nothing new).
        now: The agent's clock reading, seconds.
    """
    out: list[Problem] = []
    count = len(request.observations)
    if count > MAX_REPORT_OBSERVATIONS:
        # Listing the problems of thousands of rows would help no one.
        limit = MAX_REPORT_OBSERVATIONS
        out.append(("observations", f"{count}; at most {limit} per report (report more often)"))
    else:
        for i, obs in enumerate(request.observations):
            out.extend(_check_observation(f"observations[{i}]", obs, request.rank))
        out.extend(_check_span(request.observations))
        out.extend(_check_against_job(request.observations, job))
    if request.HasField("gradient"):
        for name in ("sqr", "var"):
            value = getattr(request.gradient, name)
            if not (math.isfinite(value) and 0 <= value <= MAX_GRADIENT_STAT):
                out.append(
                    (f"gradient.{name}", f"{value:g}; must be in [0, {MAX_GRADIENT_STAT:g}]")
                )
    if request.HasField("work"):
        out.extend(_check_work(request.work))
    out.extend(metric_problems(dict(request.user_metrics)))
    if not out and budgets is not None:
        key = (request.job_id, request.generation, request.rank)
        out.extend(budgets.check(key, claimed_seconds(request.observations), now))
    return out


def step_seconds(obs: pb.StepObservation) -> float:
    """Time of one optimizer step of an observation: its accumulation steps and itself."""
    return obs.optim_step_time_s + (obs.accum_steps - 1) * obs.accum_step_time_s


def claimed_seconds(observations: Sequence[pb.StepObservation]) -> float:
    """Training time a report covers, each step counted at least `MIN_STEP_TIME_S`."""
    return sum(obs.count * max(step_seconds(obs), MIN_STEP_TIME_S) for obs in observations)


def _check_observation(at: str, obs: pb.StepObservation, rank: int) -> list[Problem]:
    out: list[Problem] = []
    if obs.num_nodes < 1:
        out.append((f"{at}.num_nodes", "must be >= 1"))
    if obs.num_replicas < max(obs.num_nodes, 1):
        out.append((f"{at}.num_replicas", f"must be >= num_nodes ({obs.num_nodes}) and >= 1"))
    if obs.local_batch_size < 1:
        out.append((f"{at}.local_batch_size", "must be >= 1"))
    if obs.accum_steps < 1:
        out.append((f"{at}.accum_steps", "must be >= 1 (1 = no accumulation)"))
    for name, positive in (("accum_step_time_s", False), ("optim_step_time_s", True)):
        value = getattr(obs, name)
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            out.append(
                (f"{at}.{name}", f"must be finite and {'>' if positive else '>='} 0 seconds")
            )
        elif value > MAX_STEP_TIME_S:
            out.append((f"{at}.{name}", f"{value:g} s; at most {MAX_STEP_TIME_S:g} s"))
    if obs.count < 1:
        out.append((f"{at}.count", "must be >= 1 (steps averaged)"))
    if obs.num_replicas and rank >= obs.num_replicas:
        out.append(
            (
                "rank",
                f"{rank} is not below {at}.num_replicas ({obs.num_replicas}): a replica reports "
                "the configuration it runs in",
            )
        )
    return out


def _check_span(observations: Sequence[pb.StepObservation]) -> list[Problem]:
    """The training time one report covers, once every step time is in range."""
    for obs in observations:
        for value in (obs.accum_step_time_s, obs.optim_step_time_s):
            if not (math.isfinite(value) and 0 <= value <= MAX_STEP_TIME_S):
                return []  # named by _check_observation; the span would mean nothing
    claimed = claimed_seconds(observations)
    if claimed <= MAX_REPORT_SPAN_S:
        return []
    return [
        (
            "observations",
            f"claim {claimed:.6g} s of training (count × step time, each step at least "
            f"{MIN_STEP_TIME_S:g} s); one report covers at most {MAX_REPORT_SPAN_S:g} s "
            "(report more often)",
        )
    ]


def _check_against_job(observations: Sequence[pb.StepObservation], job: JobBounds) -> list[Problem]:
    out: list[Problem] = []
    for i, obs in enumerate(observations):
        replicas = obs.num_replicas
        if job.max_replicas and replicas > job.max_replicas:
            out.append(
                (
                    f"observations[{i}].num_replicas",
                    f"{replicas} exceeds the job's max_replicas ({job.max_replicas})",
                )
            )
        if job.max_batch is None:
            continue
        total = obs.local_batch_size * obs.accum_steps * replicas
        # The trainer's initial split rounds M0 up to a multiple of K.
        if total > job.max_batch + replicas - 1:
            out.append(
                (
                    f"observations[{i}].local_batch_size",
                    f"{obs.local_batch_size} × {obs.accum_steps} accumulation steps × "
                    f"{replicas} replicas = {total} samples per step exceeds the job's "
                    f"max_batch_size {job.max_batch} (+{replicas - 1} for rounding up per "
                    "replica)",
                )
            )
    return out


def _check_work(work: pb.WorkStatus) -> list[Problem]:
    limits = {"progress": MAX_WORK_STEPS}
    if work.HasField("remaining"):
        limits["remaining"] = MAX_WORK_STEPS
    if work.HasField("rescale_pause_s"):
        limits["rescale_pause_s"] = MAX_RESCALE_PAUSE_S
    out = []
    for name, top in limits.items():
        value = getattr(work, name)
        if not (math.isfinite(value) and 0 <= value <= top):
            out.append((f"work.{name}", f"{value:g}; must be finite and in [0, {top:g}]"))
    return out


@dataclass(slots=True)
class _Bucket:
    seconds: float
    """Training seconds the replica may still claim."""
    at: float
    """Clock reading of the last refill."""


class ReplicaBudgets:
    """Per-replica token buckets of claimable training seconds, refilled at 1 s per second.

    What a replica claims over any period is at most that period's wall time (it runs one step
    at a time) plus `capacity_s` of backlog. Pure apart from the state it holds: the caller
    passes the clock reading. Check before applying a report; charge once it is stored, so a
    refused or lost write costs nothing.

    Args:
        capacity_s: Seconds a bucket holds (the backlog allowance).
        max_replicas: Buckets kept; the least recently used is dropped past it.
    """

    def __init__(
        self,
        capacity_s: float = MAX_REPORT_SPAN_S,
        max_replicas: int = MAX_TRACKED_REPLICAS,
    ) -> None:
        self.capacity_s = capacity_s
        self._max = max_replicas
        self._buckets: OrderedDict[ReplicaKey, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def available(self, key: ReplicaKey, now: float) -> float:
        """Seconds the replica `key` (job, generation, rank) may claim at `now`."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return self.capacity_s
        return min(self.capacity_s, bucket.seconds + max(0.0, now - bucket.at))

    def check(self, key: ReplicaKey, claimed: float, now: float) -> list[Problem]:
        """The violation of claiming `claimed` seconds now, or nothing."""
        available = self.available(key, now)
        if claimed <= available:
            return []
        _, generation, rank = key
        return [
            (
                "observations",
                f"claim {claimed:.6g} s of training; replica {generation}/{rank} may claim at "
                f"most {available:.6g} s more now (the wall time since its earlier reports, "
                f"plus {self.capacity_s:g} s of backlog)",
            )
        ]

    def charge(self, key: ReplicaKey, claimed: float, now: float) -> None:
        """Take `claimed` seconds from the replica's bucket (never below zero)."""
        seconds = max(0.0, self.available(key, now) - claimed)
        previous = self._buckets.get(key)
        # A clock that stepped back must not refill the same interval twice.
        at = now if previous is None else max(now, previous.at)
        self._buckets[key] = _Bucket(seconds, at)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
