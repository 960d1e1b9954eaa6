"""The deficits method: fairness over time, by the shares each tenant is owed.

Every job weighs as in single-pool Pollux, times its tenant's tilt from the ledger
(`ledger.owed_tilts`): a round with no deficits is single-pool Pollux's (the best for JCT)
within guarantee and cap budgets (`weights.guarantee_quota`); a tenant persistently below its
share gets a growing weight until its long-run share meets its entitlement. So deviations
that help JCT are allowed for a while and repaid later. docs/policy.md ("Tenants").
"""

from __future__ import annotations

from dataclasses import dataclass

from pollux.policy.problem import Problem
from pollux.policy.quota import Quota
from pollux.policy.tenant_shares.base import Division, IntArray, Search
from pollux.policy.tenant_shares.ledger import Ledger, owed_tilts, settle
from pollux.policy.tenant_shares.weights import guarantee_quota, tenant_tilt
from pollux.policy.types import AllocationDecision


@dataclass(frozen=True, slots=True)
class Deficits:
    """The deficits method (module docstring)."""

    @property
    def name(self) -> str:
        """The setting's name."""
        return "deficits"

    def divide(self, problem: Problem, ledger: Ledger | None) -> Division:
        """Guarantee and cap budgets; jobs tilted by what their tenant is owed."""
        quota = guarantee_quota(problem)
        owed = owed_tilts(ledger, quota.tenants.names, problem.params.p)
        return Division(quota, tenant_tilt(problem, quota, owed))

    def repair(
        self, problem: Problem, quota: Quota, placed: IntArray, search: Search
    ) -> tuple[Quota, IntArray]:
        """The search's result as it is."""
        return quota, placed

    def remember(
        self,
        ledger: Ledger | None,
        quota: Quota,
        problem: Problem,
        decision: AllocationDecision[Ledger],
    ) -> Ledger | None:
        """The ledger after this round (`ledger.settle`)."""
        return settle(ledger, quota, problem, decision)
