"""The budgets method: GPU budgets by weighted max-min fairness in goodput, then the search.

Two levels: `goodput_budgets` splits the cluster's GPUs among tenants by progressive filling
(each step to the tenant with the least goodput per entitled GPU, G_t / E_t, from its floor
to its ceiling), and the per-job search runs within those budgets, so within a tenant jobs
share as Pollux shares a cluster. Jobs are not weighed by tenant. docs/policy.md ("Tenants").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pollux.policy import greedy
from pollux.policy.problem import Problem
from pollux.policy.quota import Quota, Tenants, entitled_floors
from pollux.policy.tenant_shares.base import Division, NoRepair
from pollux.policy.tenant_shares.common import (
    consolidated_speedups,
    goodput_at,
    goodput_curve,
    progressive_fill,
)
from pollux.policy.tenant_shares.ledger import Ledger

FloatArray = npt.NDArray[np.float64]


def goodput_budgets(problem: Problem, utilities: FloatArray) -> Quota:
    """Each tenant's GPU budget for this round, by weighted max-min fairness in goodput.

    Args:
        problem: The round (its state names the tenants).
        utilities: The count phase's table U[j, k] (`greedy.count_utilities`), so that a
            tenant's goodput curve follows the order in which the search grows its jobs.
    """
    tenants = Tenants.of_state(problem.state)
    count = len(tenants.names)
    total = problem.total_gpus
    speed = consolidated_speedups(problem, utilities.shape[1])
    curves = [
        goodput_curve(utilities, speed, np.nonzero(tenants.of_job == t)[0], total)
        for t in range(count)
    ]
    usable = np.array([int(gpus[-1]) for gpus, _ in curves], dtype=np.int64)
    ceiling = np.minimum(usable, tenants.cap)
    entitled, floor = entitled_floors(tenants, ceiling, total)
    budget = progressive_fill(curves, floor, ceiling, entitled, total)
    goodput = np.array([goodput_at(curve, int(b)) for curve, b in zip(curves, budget, strict=True)])
    return Quota(tenants, budget, entitled, floor, ceiling, goodput)


@dataclass(frozen=True, slots=True)
class Budgets(NoRepair):
    """The budgets method (module docstring)."""

    @property
    def name(self) -> str:
        """The setting's name."""
        return "budgets"

    def divide(self, problem: Problem, ledger: Ledger | None) -> Division:
        """Goodput budgets; no tenant weights."""
        return Division(goodput_budgets(problem, greedy.count_utilities(problem)[0]), None)
