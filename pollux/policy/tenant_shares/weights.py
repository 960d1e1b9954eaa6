"""The weights method: each job weighted by its tenant's entitlement per job, in one level.

No split of the cluster: each job's utility is weighted by (e_t / n_t)^(1 − p), its tenant's
entitled share split among its n_t jobs, so the power mean itself leans goodput towards each
tenant's entitlement while efficiency and restarts are traded across all jobs; budgets only
keep guarantees and caps (`guarantee_quota`). It costs less mean JCT than the budgets method
and meets the shares less closely (docs/results.md, "Tenants").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pollux.policy.problem import Problem
from pollux.policy.quota import Quota, Tenants, entitled_floors
from pollux.policy.tenant_shares.base import Division, NoRepair
from pollux.policy.tenant_shares.common import entitled_per_job, job_factor
from pollux.policy.tenant_shares.ledger import Ledger

FloatArray = npt.NDArray[np.float64]


def guarantee_quota(problem: Problem) -> Quota:
    """Budgets that keep guarantees and caps only: each tenant's cap less the others' floors.

    So every guarantee stays available to its tenant whatever the others hold. Its `goodput`
    is unknown (NaN): no curve is computed.
    """
    tenants = Tenants.of_state(problem.state)
    count = len(tenants.names)
    total = problem.total_gpus
    demand = np.bincount(tenants.of_job, weights=problem.max_k, minlength=count).astype(np.int64)
    ceiling = np.minimum(np.minimum(demand, tenants.cap), total)
    entitled, floor = entitled_floors(tenants, ceiling, total)
    budget = np.minimum(tenants.cap, total - (floor.sum() - floor))
    goodput = np.full(count, np.nan)
    return Quota(tenants, budget, entitled, floor, ceiling, goodput)


def entitlement_tilt(problem: Problem, quota: Quota) -> FloatArray | None:
    """Each job's factor (e_t / n_t)^(1 − p): with it the optimum gives tenants goodput ∝ e_t.

    The power mean with exponent p < 1 and weights ω_j gives speedups ∝ ω_j^(1/(1−p)) at
    its optimum (for speedups ∝ GPUs). None when no tenant has demand.
    """
    per_job = entitled_per_job(problem, quota)
    return job_factor(per_job[quota.of_job] ** (1.0 - problem.params.p))


def tenant_tilt(problem: Problem, quota: Quota, tilt: FloatArray) -> FloatArray | None:
    """Each job's factor from a per-tenant `tilt` (tenants without demand: the least one)."""
    per_job = entitled_per_job(problem, quota)
    return job_factor(np.where(per_job > 0, tilt, 0.0)[quota.of_job])


@dataclass(frozen=True, slots=True)
class Weights(NoRepair):
    """The weights method (module docstring)."""

    @property
    def name(self) -> str:
        """The setting's name."""
        return "weights"

    def divide(self, problem: Problem, ledger: Ledger | None) -> Division:
        """Guarantee and cap budgets; jobs weighted by their tenant's entitlement per job."""
        quota = guarantee_quota(problem)
        return Division(quota, entitlement_tilt(problem, quota))
