"""The ledger of goodput shares owed to tenants, kept between rounds (deficits, isolation).

Each tenant carries a deficit: the goodput share it has been owed, relative to its
entitlement, integrated over the seconds it contended and slowly forgotten (`settle`). What
it is owed tilts its jobs' weights (`owed_tilts`), exp((1 − p) · owed / HORIZON): an integral
controller whose constants are derived below and in docs/policy.md ("Tenants").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pollux.policy.problem import Problem
from pollux.policy.quota import Quota
from pollux.policy.types import AllocationDecision

FloatArray = npt.NDArray[np.float64]


HORIZON = 600.0
"""Seconds over which a tenant's shortfall is made up (the ledger controller's time constant).

Ten minutes: several scheduling rounds at Pollux's 60 s interval, so that the few rounds a
re-allocation takes to pay off (the restart penalty makes Pollux keep allocations a while)
do not make the loop overshoot, yet short against the hours that tenants' busy periods and
most jobs last, so that a shortfall is repaid to the jobs that suffered it."""

MEMORY = 4 * 3600.0
"""Seconds over which a deficit is forgotten (exponential decay), so that the distant past
(jobs long finished) does not steer today. 24 × HORIZON: with a leak the controller settles
with an error of about ln(1/β) · HORIZON / MEMORY, 1 % for a round-by-round bias β = 0.8."""

MOST_TILT = 4.0
"""Most a deficit may scale a tenant's share target in one round, either way: a tenant that
cannot catch up now (one job that scales badly) is not given unbounded weight over everyone
else. The deficit itself is not clipped: it is what the tenant is owed, and it is repaid,
at most this fast, once the tenant's jobs can turn GPUs into goodput (clipping the deficit
too forgets what a tenant was owed while it could not use it, and measurably left shares
further from the entitlements)."""


@dataclass(frozen=True, slots=True)
class Ledger:
    """The deficits and isolation methods' memory between rounds (`AllocationDecision.memory`).

    Attributes:
        now: The time of the round that wrote it.
        deficit: Per tenant name, its relative goodput shortfall integrated over time
            (seconds at its full entitled share it is owed; negative: it is ahead).
        error: Per tenant name, the relative shortfall (e_t − s_t) / e_t of the allocation
            that round chose, which holds until the next round (0 when not contending).
        span: Per tenant name, the seconds in which it contended, integrated and forgotten as
            the deficit is, so that deficit / span is its mean relative shortfall. Seconds in
            which its error was held at 0 (at its cap and behind, or at its floor and ahead)
            count as on target: what a cap or floor decided is not owed later.
        contending: The tenants whose shares that round compared (none unless two or more
            contended with some goodput).
    """

    now: float
    deficit: Mapping[str, float]
    error: Mapping[str, float]
    span: Mapping[str, float] = field(default_factory=dict)
    contending: frozenset[str] = frozenset()


def owed_tilts(
    ledger: Ledger | None, names: Sequence[str], p: float, tolerance: float = 0.0
) -> FloatArray:
    """Each tenant's weight factor: exp(owed / HORIZON) as a goodput share, raised to 1 − p.

    A share target scaled by r needs the weight scaled by r^(1 − p)
    (`weights.entitlement_tilt`), so a tenant owed HORIZON seconds of its share aims e-fold
    higher, whatever p. What is owed is the deficit, less `tolerance` × the seconds it
    contended: a tenant whose mean relative shortfall over its memory (deficit / span) is
    within ±tolerance is owed nothing, and one outside it only the excess (the isolation
    method's TOLERANCE; deficits owes every second).
    Without a ledger (the first round) every factor is 1: single-pool Pollux's objective.
    """
    if ledger is None:
        return np.ones(len(names))
    limit = HORIZON * math.log(MOST_TILT)
    deficit = np.array([ledger.deficit.get(name, 0.0) for name in names])
    band = tolerance * np.array([ledger.span.get(name, 0.0) for name in names])
    owed = np.sign(deficit) * np.maximum(np.abs(deficit) - band, 0.0)
    return np.asarray(np.exp(_sensitivity(p) * np.clip(owed, -limit, limit) / HORIZON))


def settle(
    ledger: Ledger | None,
    quota: Quota,
    problem: Problem,
    decision: AllocationDecision[Ledger],
) -> Ledger:
    """The ledger after this round: last round's error integrated, this round's recorded.

    Each interval between rounds adds the error of the allocation that ran in it times its
    length (capped at HORIZON, so a scheduler that was down does not settle a backlog at
    once) and decays the deficit by exp(−dt / MEMORY). The error counts only among
    *contending* tenants, those with an entitlement and a job holding fewer GPUs than it may
    use: a satisfied tenant is owed nothing (max-min fairness), and GPUs it leaves are the
    others' to share. Their shares are s_t = G_t / Σ G and e_t = E_t / Σ E over contenders.
    A tenant at its cap gains no deficit (more weight could not get it more) and one holding
    no more than its guarantee no credit (less weight could not take its guarantee away).
    The seconds each tenant contended are integrated alike (`Ledger.span`).
    """
    names = quota.tenants.names
    now = problem.state.now
    previous = ledger or Ledger(now, {}, {})
    dt = min(max(now - previous.now, 0.0), HORIZON)
    decay = math.exp(-dt / MEMORY)
    deficit = {
        name: previous.deficit.get(name, 0.0) * decay + previous.error.get(name, 0.0) * dt
        for name in names
    }
    span = {
        name: previous.span.get(name, 0.0) * decay + dt * (name in previous.contending)
        for name in names
    }
    jobs = list(decision.allocations)
    gpus = np.array([len(decision.allocations[name]) for name in jobs], dtype=np.int64)
    speed = np.array([decision.explain[name].speedup for name in jobs])
    count = len(names)
    goodput = np.bincount(quota.of_job, weights=speed, minlength=count)
    unmet = np.bincount(quota.of_job, weights=gpus < problem.max_k, minlength=count) > 0
    contending = unmet & (quota.entitled > 0)
    error = np.zeros(count)
    if not (contending.sum() > 1 and goodput[contending].sum() > 0):
        contending[:] = False  # no shares to compare: nothing owed, no seconds counted
    if contending.any():
        share = goodput / goodput[contending].sum()
        entitled = quota.entitled / quota.entitled[contending].sum()
        error[contending] = 1.0 - share[contending] / entitled[contending]
        held = quota.usage(gpus)
        error = np.where(held >= quota.tenants.cap, np.minimum(error, 0.0), error)
        error = np.where(held <= quota.floor, np.maximum(error, 0.0), error)
    errors = dict(zip(names, error.tolist(), strict=True))
    return Ledger(now, deficit, errors, span, frozenset(np.asarray(names)[contending].tolist()))


def _sensitivity(p: float) -> float:
    """The change of log(weight) per change of log(share) at the optimum: 1 − p (1 at p ≥ 1)."""
    return 1.0 - p if p < 1 else 1.0
