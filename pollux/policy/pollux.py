"""The Pollux cluster policy: maximise the power mean of job speedups (paper §4).

The objective (`problem.py`) is the published one; the optimiser is selectable: our greedy
marginal-gain solver (`greedy.py`, default: milliseconds per round) or the published NSGA-II
(`nsga2.py`: about a second per round), kept as the baseline the greedy one is measured
against (benchmarks/policy_latency.py).

With tenants in the state, a first level splits the GPUs among them (guarantees, caps, goodput
shares by weight: `tenants.py`) and the greedy search keeps each within its budget; without
them the round is exactly the single-pool one. NSGA-II does not support tenants. In the
DEFICITS and ISOLATION modes the decision's `memory` is the tenants' `Ledger`, which must be
passed back.

With `jct` set (the "jct" mode, `jct.py`), the objective is a weighted proportional fairness
(p = 0) with heSRPT weights from each job's declared remaining work, and re-allocations are
discounted over how long they will last; with `jct=None` (the default, "faithful") none of
that runs and the round is exactly the published one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from pollux.policy import greedy, nsga2, tenants
from pollux.policy import jct as jct_mode
from pollux.policy.allocation import validate_state
from pollux.policy.exploration import FAITHFUL, Exploration
from pollux.policy.jct import JctParams
from pollux.policy.problem import PolluxParams, Problem, TenantShares
from pollux.policy.types import AllocationDecision, ClusterState, JobExplain, PolicyInputError

__all__ = ["JctParams", "Optimizer", "PolluxParams", "PolluxPolicy"]

Optimizer = Literal["greedy", "nsga2"]


@dataclass(frozen=True, slots=True)
class PolluxPolicy:
    """Pollux's goodput-driven allocation (see the module docstring for the algorithm)."""

    params: PolluxParams = field(default_factory=PolluxParams)
    optimizer: Optimizer = "greedy"
    nsga: nsga2.NsgaConfig = field(default_factory=nsga2.NsgaConfig)
    jct: JctParams | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in ("greedy", "nsga2"):
            raise PolicyInputError(
                "optimizer", f"must be 'greedy' or 'nsga2', got {self.optimizer!r}"
            )

    @property
    def name(self) -> str:
        """Short name of the policy."""
        return "pollux"

    @property
    def exploration(self) -> Exploration:
        """How far a job may grow past what it has measured (faithful: Pollux's rule)."""
        return FAITHFUL if self.jct is None else self.jct.exploration

    def allocate(
        self, state: ClusterState, memory: object | None, rng: np.random.Generator
    ) -> AllocationDecision:
        """Choose every job's allocation for this round."""
        validate_state(state)
        if state.tenants and self.optimizer == "nsga2":
            raise PolicyInputError(
                "tenants", "the nsga2 optimizer does not support tenants; use optimizer='greedy'"
            )
        # A round with nothing to decide keeps the tenants' ledger: what a tenant is owed
        # outlives a moment without nodes or jobs.
        kept = memory if isinstance(memory, tenants.Ledger) else None
        if not state.nodes:
            # A cluster with no registered node (yet): every job waits.
            return AllocationDecision(
                allocations={job.name: () for job in state.jobs},
                explain={
                    job.name: JobExplain(0.0, 1.0, "pending: no nodes in the cluster")
                    for job in state.jobs
                },
                memory=kept,
            )
        params = self.params if self.jct is None else replace(self.params, p=self.jct.p)
        problem = Problem(state, params)
        if problem.num_jobs == 0:
            return AllocationDecision(allocations={}, explain={}, memory=kept)
        tilt = None if self.jct is None else jct_mode.apply(problem, self.jct).weight
        if self.optimizer == "nsga2":
            previous = memory if isinstance(memory, nsga2.NsgaMemory) else None
            placed, front = nsga2.search(problem, rng, previous, self.nsga)
            return replace(problem.decision(placed), memory=front)
        if state.tenants:
            return self._with_tenants(problem, memory, tilt)
        return problem.decision(greedy.search(problem))

    def _with_tenants(
        self, problem: Problem, memory: object | None, tilt: jct_mode.FloatArray | None = None
    ) -> AllocationDecision:
        """The round in the configured `TenantShares` mode; DEFICITS and ISOLATION carry a `Ledger`.

        `tilt`: the jct mode's per-job weights, combined with the tenants' own weighting.
        """
        shares = self.params.tenant_shares
        ledger = memory if isinstance(memory, tenants.Ledger) else None
        if shares is TenantShares.BUDGETS:
            quota = tenants.plan(problem, greedy.count_utilities(problem)[0])
        elif shares is TenantShares.WEIGHTS:
            quota = tenants.weigh(problem)
        else:
            names = tenants.Tenants.of_state(problem.state).names
            if shares is TenantShares.ISOLATION:
                owed = tenants.tilts(ledger, names, problem.params.p, tenants.TOLERANCE)
                quota = tenants.insure(problem, greedy.count_utilities(problem)[0], owed)
            else:
                quota = tenants.weigh(problem, tenants.tilts(ledger, names, problem.params.p))
        if tilt is not None and shares is not TenantShares.BUDGETS:
            problem.weight = jct_mode.combine(problem.weight, tilt)  # weigh() replaced ours
        placed = greedy.search(problem, quota)
        if shares is TenantShares.ISOLATION:  # floors squeezed by other tenants' budgets
            quota, placed = tenants.secure(
                problem, quota, placed, lambda q: greedy.search(problem, q)
            )
        decision = tenants.explained(problem.decision(placed), quota)
        if shares in (TenantShares.DEFICITS, TenantShares.ISOLATION):
            decision = replace(decision, memory=tenants.account(ledger, quota, problem, decision))
        return decision
