"""The jct mode of the Pollux policy: lower mean JCT from each job's declared remaining work.

It keeps Pollux's goodput models, speedup tables and optimiser and changes three inputs of
its `Problem` (`inputs`): the objective is weighted proportional fairness (p = 0) with heSRPT
weights from each job's remaining-time rank (`hesrpt_weights`, a factor of the job weights,
`pollux.policy.weights`); a re-allocation must pay for its restart pause while it lasts
(`restart_penalties`), priced with the move that would undo it (`reversal_odds`); and a job
may grow 4-fold a round, starting on up to 4 GPUs (`JctParams.exploration`). Every constant is
derived, none fitted: docs/policy.md ("The jct mode") has the derivation, docs/results.md
("The jct mode") the measurements and their commands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
from scipy.special import exp1

from pollux.policy.exploration import Exploration
from pollux.policy.params import PolicyInputError, PolluxParams
from pollux.policy.types import ClusterState, JobInfo
from pollux.policy.valuation import restart_factor

FloatArray = npt.NDArray[np.float64]

RestartRule = Literal["holding", "age", "remaining", "expected", "ramp"]


class Round(Protocol):
    """What the jct mode reads of a round: the single-type `Problem` or the typed one."""

    @property
    def state(self) -> ClusterState:
        """The round's state."""
        ...

    @property
    def params(self) -> PolluxParams:
        """The objective's knobs (the restart delay)."""
        ...

    @property
    def num_jobs(self) -> int:
        """J."""
        ...

    @property
    def base(self) -> FloatArray:
        """Each job's goodput of speedup 1 (M0-equivalent samples per second)."""
        ...


@dataclass(frozen=True, slots=True)
class JctParams:
    """The jct mode's settings; the defaults are the mode.

    Only `restart` in "ramp", "holding" or "expected" is a supported setting (the
    scheduler's `jct_restart`); every other non-default value is an ablation that
    benchmarks/beyond_pollux.py alone selects.

    Attributes:
        p: Exponent of the power mean the mode maximises (0: weighted proportional
            fairness). It replaces `PolluxParams.p`.
        speedup_exponent: q of the power-law speedup the heSRPT weights assume, in [0, 1):
            1/2, goodput's elasticity at the gradient noise scale.
        rank_weights: Weigh each job by its remaining-time rank (False: all alike).
        restart: How a move's lifetime H is taken in the restart factor H/(H + δ):
            "ramp" (the mode: "holding" while the job is `ramping`, "expected" once it has
            shrunk or undone a move), "holding" (the job's mean holding time
            age / (restarts + 1), cut at its remaining time), "expected" (the mean of
            L/(L + δ) over a memoryless lifetime L of that mean, cut likewise;
            `expected_factor`: fewer restarts, more JCT at low load), "age" (faithful
            Pollux's age rule, with each job's own δ) or "remaining" (the remaining time
            alone).
        reversals: Price a move at δ (1 + p), p the job's odds of undoing it
            (`reversal_odds`); False: at δ.
        explore_growth: How many times its largest measured size a job may be given in one
            round (`pollux.policy.exploration`; faithful Pollux: 2).
        explore_first: Let a job that has measured nothing start on up to `explore_growth`
            GPUs, as far as a job measured on one may grow; False: on one, as Pollux.

    Raises:
        PolicyInputError: A field is out of range.
    """

    p: float = 0.0
    speedup_exponent: float = 0.5
    rank_weights: bool = True
    restart: RestartRule = "ramp"
    reversals: bool = True
    explore_growth: int = 4
    explore_first: bool = True

    @property
    def exploration(self) -> Exploration:
        """The mode's exploration rule (`pollux.policy.exploration`)."""
        start = self.explore_growth if self.explore_first else 1
        return Exploration(self.explore_growth, start)

    def __post_init__(self) -> None:
        if not math.isfinite(self.p):
            raise PolicyInputError("jct.p", f"must be finite, got {self.p}")
        if not 0.0 <= self.speedup_exponent < 1.0:
            raise PolicyInputError(
                "jct.speedup_exponent", f"must lie in [0, 1), got {self.speedup_exponent}"
            )
        if not 2 <= self.explore_growth <= 64:
            raise PolicyInputError(
                "jct.explore_growth", f"must be 2-64 (2: Pollux's rule), got {self.explore_growth}"
            )
        if self.restart not in ("holding", "age", "remaining", "expected", "ramp"):
            raise PolicyInputError(
                "jct.restart",
                "must be 'holding', 'age', 'remaining', 'expected' or 'ramp', "
                f"got {self.restart!r}",
            )


@dataclass(frozen=True, slots=True)
class JctInputs:
    """What the jct mode derived for one round (for explanations and tests).

    Attributes:
        remaining_s: Each job's remaining time at its fair share (seconds); NaN: unknown.
        pause_s: Each job's restart pause δ (seconds).
        rank: n_j, the jobs whose remaining time is at least j's (ties and unknowns count ½).
        weight: Each job's utility weight, scaled so that the largest is 1.
        penalty: Each job's restart factor, in [0, 1].
    """

    remaining_s: FloatArray
    pause_s: FloatArray
    rank: FloatArray
    weight: FloatArray
    penalty: FloatArray


def remaining_seconds(problem: Round) -> FloatArray:
    """Remaining time of each job at its fair-share goodput (seconds; NaN where unknown).

    Declared remaining work (M0-steps) × M0 (samples per M0-step) ÷ goodput at speedup 1
    (M0-equivalent samples per second). Unknown without a declared size or a goodput model.
    """
    base = problem.base
    out = np.full(problem.num_jobs, np.nan)
    for j, job in enumerate(problem.state.jobs):
        work, model = job.remaining_work, job.model
        if model is None and job.models:
            model = job.models[min(job.models)]  # M0 is the job's, whatever the type
        if work is None or model is None or not math.isfinite(work) or not base[j] > 0:
            continue
        out[j] = max(float(work), 0.0) * model.init_batch_size / float(base[j])
    return out


def ranks(remaining: FloatArray) -> FloatArray:
    """n_j: jobs whose remaining time is at least j's, j included; ties and unknowns: ½ each.

    A job of unknown remaining time gets the mean rank (m + 1)/2. Every rank lies in [1, m].
    """
    m = remaining.size
    known = ~np.isnan(remaining)
    unknown = m - int(known.sum())
    out = np.full(m, (m + 1) / 2.0)
    t = remaining[known]
    if t.size:
        # Counts by binary search in the sorted times: O(m log m), the same integers as
        # comparing every pair.
        order = np.sort(t)
        below_or_equal = np.searchsorted(order, t, side="right")
        above = t.size - below_or_equal
        ties = below_or_equal - np.searchsorted(order, t, side="left") - 1
        out[known] = 1.0 + above + 0.5 * ties + 0.5 * unknown
    return out


def hesrpt_weights(rank: FloatArray, known: npt.NDArray[np.bool_], q: float) -> FloatArray:
    """n^c − (n − 1)^c, c = 1/(1 − q), for known jobs; the mean over ranks, m^(c−1), else."""
    c = 1.0 / (1.0 - q)
    m = rank.size
    declared = rank**c - np.maximum(rank - 1.0, 0.0) ** c
    return np.where(known, declared, float(m) ** (c - 1.0))


def pauses(problem: Round) -> FloatArray:
    """Each job's restart pause: its own measurement, else `PolluxParams.restart_delay`."""
    default = problem.params.restart_delay
    return np.array(
        [
            default if job.restart_pause_s is None else max(float(job.restart_pause_s), 0.0)
            for job in problem.state.jobs
        ],
        dtype=np.float64,
    )


def has_held_gpus(job: JobInfo) -> bool:
    """Whether the job has had an allocation: its next one is a move, not its first start."""
    return bool(job.allocation or job.restarts or job.resizes)


def ramping(job: JobInfo) -> bool:
    """Whether every resize of the job so far has grown it (none undone, none a shrink).

    Such a job is learning its scaling: its next move is another growth, not the reversal of
    this one, so the gain of a move lasts past the allocation's holding time.
    """
    return job.reversals == 0 and job.last_resize >= 0


def reversal_odds(job: JobInfo) -> float:
    """The chance that the job's next move will be undone: Laplace's rule over its record."""
    pairs = max(job.resizes - 1, 0)
    return (min(job.reversals, pairs) + 1.0) / (pairs + 2.0)


def resize_history(
    resizes: int, reversals: int, last_resize: int, old: int, new: int
) -> tuple[int, int, int]:
    """(resizes, reversals, last_resize) of a job (`JobInfo`'s fields) after `old` → `new` GPUs.

    For a job that has held GPUs before (its first allocation is not a resize); a change that
    keeps the count (a move elsewhere) changes nothing.
    """
    if new == old:
        return resizes, reversals, last_resize
    direction = 1 if new > old else -1
    return resizes + 1, reversals + int(last_resize not in (0, direction)), direction


def restart_penalties(
    problem: Round,
    remaining: FloatArray,
    pause: FloatArray,
    rule: RestartRule = "holding",
    reversals: bool = False,
) -> FloatArray:
    """Each job's restart factor H/(H + δ) (rules in `JctParams.restart`).

    With `reversals`, δ is the pause of the move and of its likely reversal (`reversal_odds`)
    for a job that has held GPUs; a job's first allocation has nothing to undo.
    """
    now = problem.state.now
    out = np.ones(problem.num_jobs)
    for j, job in enumerate(problem.state.jobs):
        delay, left = float(pause[j]), float(remaining[j])
        if reversals and has_held_gpus(job):
            delay *= 1.0 + reversal_odds(job)  # a first allocation has nothing to undo
        age = max(now - job.submission_time, 0.0)
        if delay <= 0:
            continue
        if rule == "age":
            out[j] = restart_factor(age, job.restarts, delay)
            continue
        horizon = age / (job.restarts + 1)
        if rule == "expected" or (rule == "ramp" and not ramping(job)):
            out[j] = expected_factor(horizon, left, delay)
            continue
        if rule == "remaining":
            horizon = left if not math.isnan(left) else math.inf
            if math.isinf(horizon):  # undeclared: faithful's rule
                out[j] = restart_factor(age, job.restarts, delay)
                continue
        elif not math.isnan(left):
            horizon = min(horizon, left)
        out[j] = horizon / (horizon + delay)
    return out


def inputs(problem: Round, params: JctParams) -> JctInputs:
    """The jct mode's remaining times, pauses, ranks, weights and restart factors.

    `problem` must have been built with ``params.p`` (`PolluxPolicy` does so); its weights
    and penalties are not read. The weights are the remaining-work factor of the job
    weights (`pollux.policy.weights.WeightFactors.remaining_work`).
    """
    remaining = remaining_seconds(problem)
    pause = pauses(problem)
    rank = ranks(remaining)
    if params.rank_weights:
        weight = hesrpt_weights(rank, ~np.isnan(remaining), params.speedup_exponent)
    else:
        weight = np.ones(problem.num_jobs)
    weight = weight / float(weight.max(initial=1.0))
    penalty = restart_penalties(problem, remaining, pause, params.restart, params.reversals)
    return JctInputs(remaining, pause, rank, weight, penalty)


def _scaled_exp1(x: float) -> float:
    """e^x · E1(x) for x > 0; its asymptotic series past 50, where e^x overflows first."""
    if x > 50.0:
        return (1.0 - 1.0 / x + 2.0 / x**2 - 6.0 / x**3) / x
    return math.exp(x) * float(exp1(x))


def expected_factor(mean: float, left: float, delay: float) -> float:
    """E[L/(L + δ)] for a lifetime L = min(T, R): T exponential with mean `mean`, R = `left`.

    The "expected" restart rule. The holding time age/(restarts + 1) is only the mean of how
    long a job's allocations last; measured on the published 1.0x workloads their gaps are
    skewed (median 180 s, p90 840 s), and H/(H + δ) is concave in H, so the factor at the mean
    overrates a move (Jensen). With nothing known but the mean, the lifetime is taken as
    exponential (the maximum-entropy law for a given mean), cut at the remaining time R:

        E = (1 − e^(−R/μ)) − x e^x (E1(x) − E1(x + R/μ)) + e^(−R/μ) R/(R + δ),   x = δ/μ.

    R unknown (NaN) or infinite: E = 1 − x e^x E1(x).
    """
    if delay <= 0:
        return 1.0
    if not mean > 0:
        return 0.0
    x = delay / mean
    if math.isnan(left) or math.isinf(left):
        return max(0.0, 1.0 - x * _scaled_exp1(x))
    left = max(left, 0.0)
    tail = math.exp(-left / mean)
    y = (left + delay) / mean
    # e^x [E1(x) - E1(y)] = e^x E1(x) - e^(x - y) e^y E1(y)
    inner = _scaled_exp1(x) - math.exp(x - y) * _scaled_exp1(y)
    return max(0.0, (1.0 - tail) - x * inner + tail * left / (left + delay))
