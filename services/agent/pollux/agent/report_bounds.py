"""How much one metrics report may claim, and how much it may weigh.

Observations of one configuration merge into a count-weighted mean (`profile.merge_report`),
so without bounds one forged report (``count = 10**6``, absurd step times) would outweigh
every honest report that could ever follow it. Every report is therefore checked for
plausibility, and what passes is given a bounded weight. The rule, per field:

**Refused** (INVALID_ARGUMENT naming the field and the bound; nothing of the report is
stored) — claims no honest replica makes:

- ``observations[i].accum_step_time_s`` / ``optim_step_time_s``: finite, the optimizer step
  > 0, neither above `MAX_STEP_TIME_S` (one micro-batch taking ten minutes is a broken clock,
  not a training step).
- ``observations``: the training time the report covers, Σ count × (optim + (accum_steps − 1)
  × accum), each step counted at least `MIN_STEP_TIME_S` (`claimed_seconds`), is at most
  `MAX_REPORT_SPAN_S`. The trainer cuts a report every few seconds (5 s by default), so an
  honest report covers seconds, and at the default interval its whole unsent backlog (128
  reports, 640 s) fits the bound; a longer interval's backlog after a long outage may not (the
  refused reports are old measurements, which the trainer logs and drops).
- ``observations`` again, against the replica's earlier reports (`ReplicaBudgets`, the
  agent's memory): what a replica claims over any period is at most that period's wall time
  (it runs one step at a time) plus `MAX_REPORT_SPAN_S` of backlog (steps measured before
  this agent heard from it, or while it was unreachable). A token bucket per (job,
  generation, rank) refilled at one second per second and holding at most
  `MAX_REPORT_SPAN_S` enforces exactly that. Each step counts at least `MIN_STEP_TIME_S`, so
  a report cannot claim more steps than the elapsed time over that floor allows.
- ``rank``: below every observation's ``num_replicas`` (a replica reports the configuration
  it runs in, whose ranks are 0 … K − 1).
- ``observations[i].num_replicas``: at most the job's ``max_replicas`` when it sets one (the
  scheduler never allocates more).
- ``observations[i].local_batch_size``: local × accum_steps × replicas, the samples of one
  optimizer step, at most the job's largest total batch plus K − 1 (the trainer's initial
  split rounds M0 up to a multiple of K). The smallest local batch is not checked: that
  initial split may go below it. A job whose code trains with a larger batch than its spec
  declares has its reports refused; the training library logs ``metrics_rejected``.
- ``gradient.sqr`` / ``gradient.var``: finite, >= 0 and at most `MAX_GRADIENT_STAT`. Gradient
  statistics are not merged: the latest report's replace the previous ones, so a report's
  weight there is bounded by construction (until the next report).
- ``work``: progress and remaining work finite, >= 0 and at most `MAX_WORK_STEPS`; the rescale
  pause finite, >= 0 and at most `MAX_RESCALE_PAUSE_S`. Replaced by the next report, as the
  gradient statistics are. A job's own credential is needed to report it, so a job can only
  misstate its own size (which moves its own place, bounded by the policy's starvation
  guard, not anyone's model).

**Clipped** (applied, logged as ``agent_report_clipped``): the steps one report adds to the
profile, Σ count, are scaled down to at most `MAX_REPORT_STEPS` (each observation keeps at
least one), so in a configuration's mean one report weighs at most that many steps however many
it claims: a forged report is outweighed by honest ones as they accumulate (its share after
honest reports of total weight W is at most ``MAX_REPORT_STEPS / (MAX_REPORT_STEPS + W)``).
Honest reports of ordinary jobs carry fewer steps (fifty 0.1 s steps in 5 s), so they merge as
before; a job faster than about a hundred steps a second gets report-weighted rather than
step-weighted means (the same mean for steady step times) and a profile count below its true
step count.

**Neither** — progress: a report whose (generation, rank, seq) was applied before, or is older
than the replica's newest applied one, is answered as already applied (``applied = false``),
not refused: a retried report is honest.

Not covered here: whether the caller is one of the job's replicas at all (per-job
credentials), and the budgets live in each agent's memory (a restarted agent, or a job moving
to another agent, starts its replicas with a full bucket; persisting them needs a field in
`ObservationProfile`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import types_pb2 as pb

MIN_STEP_TIME_S = 1e-4
"""Least time one optimizer step is counted for in `claimed_seconds` (not refused below it).

A synchronising training step (forward, backward, all-reduce, update) takes milliseconds at
least; 100 µs leaves room for toy models on CPU while making ``count = 10**6`` claim 100 s.
"""
MAX_STEP_TIME_S = 600.0
"""Longest plausible mean time of one micro-batch (accumulation or optimizer step), seconds."""
MAX_REPORT_SPAN_S = 900.0
"""Most training seconds one report may cover, and the backlog a replica's budget holds."""
MAX_REPORT_STEPS = 512
"""Most optimizer steps one report adds to the profile (more are clipped, see module doc)."""
MAX_GRADIENT_STAT = 1e30
"""Largest plausible gradient statistic: a squared gradient norm beyond it has diverged."""
MAX_WORK_STEPS = 1e12
"""Largest plausible progress or remaining work, M0-steps (a trillion optimizer steps)."""
MAX_RESCALE_PAUSE_S = 7 * 86400.0
"""Longest plausible rescale pause: a week (a job suspended that long counts as a restart)."""
MAX_TRACKED_REPLICAS = 65_536
"""Replica budgets an agent keeps; the least recently reporting go first (they restart full)."""


def step_seconds(obs: pb.StepObservation) -> float:
    """Time of one optimizer step of an observation: its accumulation steps and itself."""
    return obs.optim_step_time_s + (obs.accum_steps - 1) * obs.accum_step_time_s


def claimed_seconds(observations: Sequence[pb.StepObservation]) -> float:
    """Training time a report covers, each step counted at least `MIN_STEP_TIME_S`."""
    return sum(obs.count * max(step_seconds(obs), MIN_STEP_TIME_S) for obs in observations)


def check_values(request: api.ReportMetricsRequest) -> list[tuple[str, str]]:
    """The report's bound violations that need nothing but the report (see module doc).

    Complements `profile.check_report`'s field checks; the span is checked only when every
    observation's times are in range (otherwise it means nothing).
    """
    out: list[tuple[str, str]] = []
    times_ok = True
    for i, obs in enumerate(request.observations):
        for name in ("accum_step_time_s", "optim_step_time_s"):
            value = getattr(obs, name)
            if not math.isfinite(value) or value < 0:
                times_ok = False  # profile.check_report names it
            elif value > MAX_STEP_TIME_S:
                times_ok = False
                out.append(
                    (f"observations[{i}].{name}", f"{value:g} s; at most {MAX_STEP_TIME_S:g} s")
                )
        if obs.num_replicas and request.rank >= obs.num_replicas:
            out.append(
                (
                    "rank",
                    f"{request.rank} is not below observations[{i}].num_replicas "
                    f"({obs.num_replicas}): a replica reports the configuration it runs in",
                )
            )
    if times_ok:
        claimed = claimed_seconds(request.observations)
        if claimed > MAX_REPORT_SPAN_S:
            out.append(
                (
                    "observations",
                    f"claim {claimed:.6g} s of training (count × step time, each step at "
                    f"least {MIN_STEP_TIME_S:g} s); one report covers at most "
                    f"{MAX_REPORT_SPAN_S:g} s (report more often)",
                )
            )
    if request.HasField("gradient"):
        for name in ("sqr", "var"):
            value = getattr(request.gradient, name)
            if math.isfinite(value) and value > MAX_GRADIENT_STAT:
                out.append((f"gradient.{name}", f"{value:g}; at most {MAX_GRADIENT_STAT:g}"))
    if request.HasField("work"):
        out.extend(check_work(request.work))
    return out


def check_work(work: pb.WorkStatus) -> list[tuple[str, str]]:
    """A work status's bound violations: finite, non-negative, plausible (module doc)."""
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


def check_against_job(
    request: api.ReportMetricsRequest, max_batch: int | None, max_replicas: int
) -> list[tuple[str, str]]:
    """The report's violations of its job's limits (see module doc).

    Args:
        request: A report that passed `profile.check_report`.
        max_batch: The job's largest total batch, or None when its limits are unusable (then
            the batch is not checked: the job cannot be tuned anyway).
        max_replicas: The job's replica limit; 0 means none.
    """
    out: list[tuple[str, str]] = []
    for i, obs in enumerate(request.observations):
        replicas = obs.num_replicas
        if max_replicas and replicas > max_replicas:
            out.append(
                (
                    f"observations[{i}].num_replicas",
                    f"{replicas} exceeds the job's max_replicas ({max_replicas})",
                )
            )
        if max_batch is None:
            continue
        total = obs.local_batch_size * obs.accum_steps * replicas
        if total > max_batch + replicas - 1:
            out.append(
                (
                    f"observations[{i}].local_batch_size",
                    f"{obs.local_batch_size} × {obs.accum_steps} accumulation steps × "
                    f"{replicas} replicas = {total} samples per step exceeds the job's "
                    f"max_batch_size {max_batch} (+{replicas - 1} for rounding up per replica)",
                )
            )
    return out


def report_weights(observations: Sequence[pb.StepObservation]) -> list[int]:
    """The steps each observation adds to the profile: counts scaled to `MAX_REPORT_STEPS`.

    Proportional, rounded down, at least one each (so at most `MAX_REPORT_STEPS` plus one per
    observation in all); unchanged when the report is within the cap.
    """
    total = sum(obs.count for obs in observations)
    if total <= MAX_REPORT_STEPS:
        return [obs.count for obs in observations]
    return [max(1, obs.count * MAX_REPORT_STEPS // total) for obs in observations]


@dataclass(slots=True)
class _Bucket:
    seconds: float
    """Training seconds the replica may still claim."""
    at: float
    """Clock reading of the last refill."""


class ReplicaBudgets:
    """Per-replica token buckets of claimable training seconds (see module doc).

    Pure apart from the state it holds: the caller passes the clock reading. Check before
    applying a report and charge once it is stored, so a refused or lost write costs nothing.

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
        self._buckets: OrderedDict[tuple[str, int, int], _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def available(self, key: tuple[str, int, int], now: float) -> float:
        """Seconds the replica `key` (job, generation, rank) may claim at `now`."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return self.capacity_s
        return min(self.capacity_s, bucket.seconds + max(0.0, now - bucket.at))

    def check(self, key: tuple[str, int, int], claimed: float, now: float) -> list[tuple[str, str]]:
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

    def charge(self, key: tuple[str, int, int], claimed: float, now: float) -> None:
        """Take `claimed` seconds from the replica's bucket (never below zero)."""
        seconds = max(0.0, self.available(key, now) - claimed)
        previous = self._buckets.get(key)
        # A clock that stepped back must not refill the same interval twice.
        at = now if previous is None else max(now, previous.at)
        self._buckets[key] = _Bucket(seconds, at)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
