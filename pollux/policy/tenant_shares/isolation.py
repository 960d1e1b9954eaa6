"""The isolation method (the default): each tenant its sharing incentive, else single-pool.

Each tenant with demand is reserved the fewest GPUs on which its jobs reach FLOOR of the
goodput they would get alone on its entitled GPUs (its isolated goodput, what it gives up by
pooling them), on top of its guarantee (`reserve_floors`); everything else is single-pool
Pollux's objective. The ledger of the deficits method is kept with a tolerance: a tenant is
owed only as far as its mean goodput share falls outside ±TOLERANCE of its entitlement. With
three tenants or more, two may squeeze a third below its floor; `restore_floors` repairs that.
docs/policy.md ("Tenants") says why this promise and not a share of the cluster's goodput.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pollux.policy import greedy
from pollux.policy.problem import Problem
from pollux.policy.quota import Quota
from pollux.policy.tenant_shares.base import Division, FloatArray, IntArray, Search
from pollux.policy.tenant_shares.common import apportion, isolated_goodput
from pollux.policy.tenant_shares.ledger import Ledger, owed_tilts, settle
from pollux.policy.tenant_shares.weights import guarantee_quota, tenant_tilt
from pollux.policy.types import AllocationDecision

FLOOR = 0.9
"""Fraction of its isolated goodput the isolation method reserves for each tenant: the issue's
tolerance (a tenant within 10 % of what it is entitled to), read as a floor, since more than its
entitlement is not a wrong done to it. A floor of 1 would reserve the last GPUs of each tenant's
curve, the ones its jobs turn into the least goodput, at the others' expense."""

TOLERANCE = 1.0 - FLOOR
"""Mean relative deviation from its goodput share that the isolation method lets a tenant
have before any of it is owed (`ledger.owed_tilts`): ±10 % again. Within it the round is
single-pool Pollux's (the best for JCT); beyond it the excess is owed as in deficits."""


def reserve_floors(problem: Problem, utilities: FloatArray, quota: Quota) -> Quota:
    """`quota` with each tenant's floor raised to the GPUs on which it reaches FLOOR · I_t.

    At most ⌊E_t⌋ and what its jobs can use, so the floors add up to at most the cluster;
    budgets as in `weights.guarantee_quota` (a tenant may hold up to its cap less the floors
    of all others). The quota's `goodput` is I_t.

    Args:
        problem: The round.
        utilities: The count phase's table U[j, k] (`greedy.count_utilities`).
        quota: Guarantee and cap budgets (`weights.guarantee_quota`).
    """
    alone = isolated_goodput(problem, utilities, quota.tenants)
    floor = np.maximum(quota.floor, np.minimum(alone.needs(FLOOR), quota.ceiling))
    total = problem.total_gpus
    budget = np.minimum(quota.tenants.cap, total - (floor.sum() - floor))
    return replace(quota, floor=floor, budget=budget, goodput=alone.goodput)


def restore_floors(
    problem: Problem, quota: Quota, placed: IntArray, search: Search
) -> tuple[Quota, IntArray]:
    """Repair a search that left a tenant below its floor; the final quota and placement.

    Budgets are per tenant (each may hold its cap less the others' floors), so with three
    tenants or more, two may each take part of the unreserved GPUs and together squeeze a
    third below its floor. Then the tenants above their floors are held to what they hold
    less their part (in proportion to their excess) of what the short tenants lack beyond
    the idle GPUs, and `search` runs again; kept only if the total shortfall shrinks, at most
    once per tenant.
    """
    for _ in range(quota.budget.size):
        held = quota.usage(placed.sum(axis=1))
        lack = np.maximum(quota.floor - held, 0)
        short = lack > 0
        if not short.any():
            break
        excess = np.where(short, 0, np.maximum(held - quota.floor, 0))
        idle = max(problem.total_gpus - int(held.sum()), 0)
        want = min(int(lack.sum()) - idle, int(excess.sum()))
        if want <= 0:
            break
        cut = apportion(want, excess)
        budget = np.where(short, quota.budget, np.minimum(quota.budget, held - cut))
        tighter = replace(quota, budget=budget)
        again = search(tighter)
        after = np.maximum(quota.floor - tighter.usage(again.sum(axis=1)), 0)
        if after.sum() >= lack.sum():
            break
        quota, placed = tighter, again
    return quota, placed


@dataclass(frozen=True, slots=True)
class Isolation:
    """The isolation method (module docstring)."""

    @property
    def name(self) -> str:
        """The setting's name."""
        return "isolation"

    def divide(self, problem: Problem, ledger: Ledger | None) -> Division:
        """Floors reserved; jobs weigh alike, tilted by shares owed beyond the tolerance."""
        quota = guarantee_quota(problem)
        owed = owed_tilts(ledger, quota.tenants.names, problem.params.p, TOLERANCE)
        tilt = tenant_tilt(problem, quota, owed)
        return Division(reserve_floors(problem, greedy.count_utilities(problem)[0], quota), tilt)

    def repair(
        self, problem: Problem, quota: Quota, placed: IntArray, search: Search
    ) -> tuple[Quota, IntArray]:
        """`restore_floors` (floors squeezed by other tenants' budgets)."""
        return restore_floors(problem, quota, placed, search)

    def remember(
        self,
        ledger: Ledger | None,
        quota: Quota,
        problem: Problem,
        decision: AllocationDecision[Ledger],
    ) -> Ledger | None:
        """The ledger after this round (`ledger.settle`)."""
        return settle(ledger, quota, problem, decision)
