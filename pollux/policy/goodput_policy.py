"""The Pollux cluster policy: maximise the power mean of job speedups (paper §4), two ways.

Faithful (`jct=None`, registry name "pollux"): the published objective, p = -1, every job
alike, searched by our greedy marginal-gain solver (`greedy.py`; the published NSGA-II is
benchmarks/nsga2.py, the baseline it is measured against). The jct mode (`jct=JctParams()`,
"pollux-jct", the default): p = 0, jobs weighted by their remaining-work rank and moves
priced over their lifetime (`jct.py`). The round's `Problem` is built once; each job's
weight is the product of named factors (`weights.WeightFactors`), one of them the users'
(`owners`: a tenant's users share it alike; with one user per tenant nothing changes).
With tenants in the state, the policy's tenant-share method (`tenant_shares`) divides the
GPUs first and the search keeps each tenant within its budget; its `Ledger` is the policy's
memory between rounds. Without tenants the round is exactly the single-pool one. On nodes
of several GPU types, or when a job restricts its types, the same objective is solved over
one configuration per job (`typed_round`); otherwise the round is exactly the single-type one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from pollux.policy import greedy, typed_round
from pollux.policy import jct as jct_mode
from pollux.policy.allocation import validate_state
from pollux.policy.configs import is_typed, on_one_type
from pollux.policy.exploration import FAITHFUL, Exploration
from pollux.policy.jct import JctParams
from pollux.policy.owners import by_owner_turns, owner_factor
from pollux.policy.params import PolluxParams
from pollux.policy.problem import IntArray, Problem
from pollux.policy.quota import Quota
from pollux.policy.tenant_shares import DEFAULT, Ledger, TenantShares, tenant_shares
from pollux.policy.tenant_shares.common import explained
from pollux.policy.typed_problem import TableCache, typed_problem
from pollux.policy.types import (
    AllocationDecision,
    ClusterState,
    JobExplain,
    JobSizing,
)
from pollux.policy.weights import WeightFactors

__all__ = ["FAITHFUL_OBJECTIVE", "JCT_OBJECTIVE", "JctParams", "PolluxParams", "PolluxPolicy"]

FAITHFUL_OBJECTIVE = "the power mean of speedups, p = -1, which favours jobs with low speedups"
"""What faithful Pollux maximises, in words (Explain's `objective`)."""
JCT_OBJECTIVE = (
    "the sum of log speedups weighted by remaining-time rank (heSRPT), which favours jobs "
    "closer to finishing; a move must pay for its restart pause"
)
"""What the jct mode maximises, in words."""


@dataclass(frozen=True, slots=True)
class PolluxPolicy:
    """Pollux's goodput-driven allocation (see the module docstring).

    Attributes:
        params: The objective's knobs (the published ones by default).
        jct: The jct mode's settings; None: faithful Pollux.
        tenant_shares: How busy tenants get their shares (only with tenants).
        tables: Goodputs of the typed rounds kept between rounds (not part of its value).
        user_fairness: Whether the users of a tenant share it alike (`owners`); False, every
            job alike whoever owns it, is an ablation benchmarks/user_fairness.py measures.
    """

    params: PolluxParams = field(default_factory=PolluxParams)
    jct: JctParams | None = None
    tenant_shares: TenantShares = field(default_factory=lambda: tenant_shares(DEFAULT))
    tables: TableCache = field(default_factory=TableCache, compare=False, repr=False)
    user_fairness: bool = True

    @property
    def name(self) -> str:
        """The registry name: "pollux" (faithful) or "pollux-jct"."""
        return "pollux" if self.jct is None else "pollux-jct"

    @property
    def sizing(self) -> JobSizing:
        """Pollux's jobs adapt both their GPU count and their batch size."""
        return JobSizing.ADAPTIVE

    @property
    def exploration(self) -> Exploration:
        """How far a job may grow past what it has measured (faithful: Pollux's rule)."""
        return FAITHFUL if self.jct is None else self.jct.exploration

    @property
    def needs_oracle(self) -> bool:
        """Pollux fits its own models: no oracle."""
        return False

    @property
    def objective_text(self) -> str:
        """What the policy maximises when it moves a GPU, in words."""
        return FAITHFUL_OBJECTIVE if self.jct is None else JCT_OBJECTIVE

    @property
    def explain_params(self) -> PolluxParams:
        """The objective's parameters (Explain evaluates speedups with them)."""
        return self.params

    def replica_limit(self, profiled: int, held: int, cap: int) -> int:
        """The exploration limit within `cap` (`pollux.policy.exploration`)."""
        return max(1, min(cap, self.exploration.limit(profiled, held)))

    def allocate(
        self, state: ClusterState, memory: Ledger | None, rng: np.random.Generator
    ) -> AllocationDecision[Ledger]:
        """Choose every job's allocation for this round.

        `memory` is the tenants' ledger the last round returned (None at first); a round
        with nothing to decide keeps it: what a tenant is owed outlives a moment without
        nodes or jobs.
        """
        validate_state(state)
        if not state.nodes:
            # A cluster with no registered node (yet): every job waits.
            return AllocationDecision(
                allocations={job.name: () for job in state.jobs},
                explain={
                    job.name: JobExplain(0.0, 1.0, "pending: no nodes in the cluster")
                    for job in state.jobs
                },
                memory=memory,
            )
        params = self.params if self.jct is None else replace(self.params, p=self.jct.p)
        if is_typed(state):
            return self._typed(state, params, memory)
        owners = None
        if self.user_fairness:
            state = by_owner_turns(state)  # the search breaks ties in job order
            owners = owner_factor(state)
        problem = Problem(on_one_type(state), params)
        if problem.num_jobs == 0:
            return AllocationDecision(allocations={}, explain={}, memory=memory)
        factors = WeightFactors(owner=owners)
        if self.jct is not None:
            derived = jct_mode.inputs(problem, self.jct)
            factors = replace(factors, remaining_work=derived.weight)
            problem = problem.weighted(weight=factors.combined(), penalty=derived.penalty)
        elif owners is not None:
            problem = problem.weighted(weight=factors.combined())
        if state.tenants:
            return self._with_tenants(problem, memory, factors)
        return problem.decision(greedy.search(problem))

    def _with_tenants(
        self, problem: Problem, ledger: Ledger | None, factors: WeightFactors
    ) -> AllocationDecision[Ledger]:
        """The round with the tenant-share method; `factors`: every weight factor but its tilt."""
        shares = self.tenant_shares
        division = shares.divide(problem, ledger)
        # Every factor of the job weights, combined here and only here.
        problem = problem.weighted(weight=replace(factors, tenant=division.tilt).combined())
        placed = greedy.search(problem, division.quota)
        quota, placed = shares.repair(
            problem, division.quota, placed, lambda q: greedy.search(problem, q)
        )
        decision: AllocationDecision[Ledger] = explained(problem.decision(placed), quota)
        return replace(decision, memory=shares.remember(ledger, quota, problem, decision))

    def _typed(
        self, state: ClusterState, params: PolluxParams, ledger: Ledger | None
    ) -> AllocationDecision[Ledger]:
        """The round on several GPU types (or with type restrictions), same objective."""
        problem = typed_problem(state, params, self.tables)
        if problem.num_jobs == 0:
            return AllocationDecision(allocations={}, explain={}, memory=ledger)
        rank, penalty = None, None
        if self.jct is not None:
            derived = jct_mode.inputs(problem, self.jct)
            rank, penalty = derived.weight, derived.penalty
        if not state.tenants:
            problem = problem.weighted(
                weight=WeightFactors(remaining_work=rank).combined(), penalty=penalty
            )
            return typed_round.decision(problem, typed_round.solve(problem))
        # Tenants: budgets in GPUs of any type, from the single-type view of the round (each
        # job's goodput curve on its current type's model); the typed search keeps them.
        pooled = Problem(state, params)
        if rank is not None:
            pooled = pooled.weighted(
                weight=WeightFactors(remaining_work=rank).combined(), penalty=penalty
            )
        shares = self.tenant_shares
        division = shares.divide(pooled, ledger)
        weight = WeightFactors(remaining_work=rank, tenant=division.tilt).combined()
        pooled = pooled.weighted(weight=weight)
        problem = problem.weighted(weight=weight, penalty=penalty)
        results: dict[bytes, typed_round.TypedResult] = {}

        def search(quota: Quota) -> IntArray:
            result = typed_round.solve(problem, quota)
            placed = typed_round.matrix(problem, result.placed)
            results[quota.budget.tobytes()] = result
            return placed

        placed = search(division.quota)
        quota, placed = shares.repair(pooled, division.quota, placed, search)
        final = results.get(quota.budget.tobytes()) or typed_round.solve(problem, quota)
        decision = typed_round.decision(problem, final)
        decision = explained(decision, quota)
        return replace(decision, memory=shares.remember(ledger, quota, pooled, decision))
