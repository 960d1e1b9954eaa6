"""A Pollux round on several GPU types: solve the typed problem, place it, explain it.

`solve` turns a `TypedProblem` into the solver's options (one row per node group; with
tenants, one more per tenant budget), assigns them (`pollux.policy.assignment.assign`) and
places the result (`pollux.policy.typed_placement.place`); `decision` writes the round's
answer: allocations, each job's speedup, penalty, GPU type and that type's price per GPU,
and the power mean the single-type policy reports. The certified gap (the assignment's
bound against what placement achieved) comes with the result, for the journal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pollux.policy.allocation import gpus
from pollux.policy.assignment import Assignment, Options, assign
from pollux.policy.quota import Quota
from pollux.policy.typed_placement import Placed, place
from pollux.policy.typed_problem import TypedProblem
from pollux.policy.types import AllocationDecision, JobExplain
from pollux.policy.valuation import power_mean

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TypedResult:
    """One typed round's answer before it becomes a decision.

    Attributes:
        assignment: The solver's answer (its bound, prices, method).
        placed: Where every job runs.
        value: Σ gain (utility over no GPUs) of the placed allocations.
    """

    assignment: Assignment
    placed: Placed
    value: float

    @property
    def gap(self) -> float:
        """Certified gap of the placed allocations: (bound − value) / bound, ≥ 0."""
        bound = self.assignment.upper_bound
        return 0.0 if bound <= 1e-12 else max(0.0, (bound - self.value) / bound)


def options(problem: TypedProblem, quota: Quota | None = None) -> Options:
    """The solver's options: a row per node group, then one per tenant of `quota`."""
    gain = problem.utility - problem.idle[:, None]
    groups = problem.option_group()
    gain = np.where(groups >= 0, gain, -np.inf)
    capacity = problem.capacity.astype(np.float64)
    rows = groups[:, :, None]
    if quota is not None:
        tenant_rows = np.broadcast_to(len(problem.groups) + quota.of_job[:, None], groups.shape)
        rows = np.stack([groups, tenant_rows], axis=2)
        capacity = np.concatenate([capacity, quota.budget.astype(np.float64)])
    return Options.build(gain, problem.option_gpus(), rows, capacity)


def solve(problem: TypedProblem, quota: Quota | None = None) -> TypedResult:
    """Assign and place every job (module docstring); `quota`: tenant budgets to keep."""
    answer = assign(options(problem, quota))
    # Work-conserving as the single-type search: GPUs idle after placement may go to any
    # tenant below its cap (they are back in the split next round).
    budgets = None if quota is None else (quota.of_job, quota.lent().budget.astype(np.float64))
    placed = place(problem, answer.column, budgets)
    return TypedResult(answer, placed, _gain(problem, placed))


def _gain(problem: TypedProblem, placed: Placed) -> float:
    """Σ (U − U0) of the placed allocations."""
    total = 0.0
    for j in np.nonzero(placed.group >= 0)[0].tolist():
        speed = float(placed.speed[j])
        total += problem.value(j, speed, bool(placed.changed[j])) - float(problem.idle[j])
    return total


def matrix(problem: TypedProblem, placed: Placed) -> IntArray:
    """The placement as the single-type policy's jobs × nodes matrix (state node order)."""
    index = {node.name: i for i, node in enumerate(problem.state.nodes)}
    out = np.zeros((problem.num_jobs, len(index)), dtype=np.int64)
    for j, job in enumerate(problem.state.jobs):
        for name in placed.allocations[job.name]:
            out[j, index[name]] += 1
    return out


def decision(problem: TypedProblem, result: TypedResult) -> AllocationDecision[Any]:
    """The round's decision: allocations and explanations (module docstring)."""
    placed = result.placed
    prices = result.assignment.prices
    node_type = {n.name: n.gpu_type for n in problem.state.nodes}
    on = placed.group >= 0
    factor = np.where(on & placed.changed, problem.penalty, 1.0)
    xs = problem.scale * placed.speed * factor + problem.params.epsilon
    types = [g.gpu_type for g in problem.groups]
    price = [float(prices[g]) if g < prices.size else None for g in range(len(types))]
    explain = {}
    speeds, factors = placed.speed.tolist(), factor.tolist()
    for j, (job, g) in enumerate(zip(problem.state.jobs, placed.group.tolist(), strict=True)):
        explain[job.name] = JobExplain(
            speedup=speeds[j],
            penalty=factors[j],
            reason=_reason(problem, placed, j, node_type),
            gpu_type=types[g] if g >= 0 else "",
            gpu_price=price[g] if g >= 0 else None,
        )
    objective = power_mean(xs, problem.params.p) if xs.size else float("nan")
    return AllocationDecision(
        allocations=dict(placed.allocations), explain=explain, objective=objective
    )


def _reason(problem: TypedProblem, placed: Placed, j: int, node_type: dict[str, str]) -> str:
    """One line for job j, naming GPU types (`Problem._reason`'s with types)."""
    job = problem.state.jobs[j]
    alloc = placed.allocations[job.name]
    k_old, k_new = len(job.allocation), len(alloc)
    if k_new == 0 and placed.changed[j]:
        return f"suspended: its {gpus(k_old)} are worth more to other jobs"
    if k_new == 0:
        if job.gpu_types is not None and not any(
            grp.gpu_type in job.gpu_types for grp in problem.groups
        ):
            allowed = ", ".join(sorted(job.gpu_types))
            return f"pending: no node has a GPU type it may use ({allowed})"
        if job.max_replicas == 0:
            return "pending: max_replicas is 0"
        return "pending: every free GPU is worth more to other jobs"
    kind = problem.groups[int(placed.group[j])].gpu_type
    where = f"{_count(len(set(alloc)), 'node')} of {kind or 'its type'}"
    old = {node_type[n] for n in job.allocation}
    if not placed.changed[j]:
        return f"unchanged: {gpus(k_new)} on {where}"
    if k_old == 0:
        return f"started on {gpus(k_new)} across {where}"
    if old != {kind}:
        before = "/".join(sorted(old)) or "its type"
        size = gpus(k_new) if k_old == k_new else f"{k_old} → {gpus(k_new)}"
        return f"moved {before} → {kind}: {size} ({where})"
    if k_old != k_new:
        return f"scaled {k_old} → {gpus(k_new)} ({where})"
    return f"re-placed: {gpus(k_new)} now on {where}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"
