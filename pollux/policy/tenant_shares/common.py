"""What the tenant-share methods share: goodput curves, progressive filling, isolated goodput.

A tenant's goodput curve G_t(B) is the goodput (sum of speedups, the policy's unit) its jobs
reach on B GPUs, grown in the order the greedy count phase grows them; its isolated goodput
I_t is its curve at its entitled GPUs ⌊E_t⌋, what it could do alone on a static partition.
docs/policy.md ("Tenants") says why goodput, and not GPUs, is what tenants are shared by.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from pollux.policy.problem import Problem
from pollux.policy.quota import Quota, Tenants, entitled_floors
from pollux.policy.types import AllocationDecision, M

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def job_factor(weight: FloatArray) -> FloatArray | None:
    """Per-job tenant weights as a weight factor: largest 1, tenants at 0 raised to the least.

    Jobs of tenants entitled to nothing weigh least (they borrow what is left). None when no
    job has a positive weight (no tenant has demand): the factor then does not apply.
    """
    positive = weight[weight > 0]
    if not positive.size:
        return None
    factor: FloatArray = np.where(weight > 0, weight, positive.min()) / positive.max()
    return factor


def entitled_per_job(problem: Problem, quota: Quota) -> FloatArray:
    """Each tenant's entitled GPUs split among its jobs that may use a GPU (0 without any)."""
    wants = problem.max_k > 0
    jobs = np.bincount(quota.of_job[wants], minlength=quota.budget.size)
    return np.where(jobs > 0, quota.entitled / np.maximum(jobs, 1), 0.0)


@dataclass(frozen=True, slots=True)
class IsolatedGoodput:
    """What each tenant would get alone on its entitled GPUs (the isolation method's promise).

    Attributes:
        entitled: E_t among the tenants with demand (0 for those without).
        goodput: I_t, the goodput (sum of speedups) of its jobs alone on ⌊E_t⌋ GPUs.
        curves: Per tenant, its goodput curve (`goodput_curve`) on at most ⌊E_t⌋ GPUs.
    """

    entitled: FloatArray
    goodput: FloatArray
    curves: tuple[tuple[IntArray, FloatArray], ...]

    def needs(self, fraction: float) -> IntArray:
        """Fewest GPUs on which each tenant's curve reaches `fraction` of its I_t."""
        out = []
        for (gpus, goodput), alone in zip(self.curves, self.goodput.tolist(), strict=True):
            reached = np.nonzero(goodput >= fraction * alone - 1e-12)[0]
            out.append(int(gpus[reached[0]]) if reached.size else 0)
        return np.array(out, dtype=np.int64)


def isolated_goodput(
    problem: Problem, utilities: FloatArray, tenants: Tenants | None = None
) -> IsolatedGoodput:
    """Each tenant's isolated goodput I_t: its jobs alone on ⌊E_t⌋ GPUs, grown as level 2 would.

    Args:
        problem: The round.
        utilities: The count phase's table U[j, k] (`greedy.count_utilities`).
        tenants: The tenants and each job's tenant (default: the problem's state's), so that a
            benchmark can measure a labelling the policy did not see.

    A tenant has demand when one of its jobs may use a GPU (max_k > 0); E_t is split among
    those. Whole GPUs, because a static partition gives a tenant whole GPUs.
    """
    tenants = tenants or Tenants.of_state(problem.state)
    count = len(tenants.names)
    total = problem.total_gpus
    demand = np.bincount(tenants.of_job, weights=problem.max_k, minlength=count)
    entitled, _ = entitled_floors(tenants, np.minimum(demand, tenants.cap), total)
    speed = consolidated_speedups(problem, utilities.shape[1])
    curves = tuple(
        goodput_curve(utilities, speed, np.nonzero(tenants.of_job == t)[0], int(entitled[t] + 1e-9))
        for t in range(count)
    )
    # The best the jobs reach on at most E_t GPUs: greedy growth by utility may pass a
    # higher goodput on its way (fairness costs some), and a tenant alone could stop there.
    # The greedy path depends on E_t, so I_t may dip slightly as E_t grows (under 2 %).
    goodput = np.array([float(curve[1].max()) for curve in curves])
    return IsolatedGoodput(entitled, goodput, curves)


def explained(decision: AllocationDecision[M], quota: Quota) -> AllocationDecision[M]:
    """`decision` with each job's reason naming its tenant's budget and what it holds."""
    jobs = list(decision.allocations)
    held = quota.usage([len(decision.allocations[name]) for name in jobs])
    names = quota.tenants.names
    explain = {}
    for name, t in zip(jobs, quota.of_job.tolist(), strict=True):
        why = decision.explain[name]
        label = names[t] or "default"
        note = f"tenant {label}: {held[t]} of its {quota.budget[t]}-GPU budget"
        explain[name] = replace(why, reason=f"{why.reason} ({note})")
    return replace(decision, explain=explain)


def consolidated_speedups(problem: Problem, width: int) -> FloatArray:
    """S[j, k]: job j's speedup on k GPUs on the fewest nodes (0 where k > its max)."""
    table = np.zeros((problem.num_jobs, width))
    tops = problem.max_k
    jobs = np.repeat(problem.every_job, tops)
    ks = np.arange(jobs.size) - np.repeat(np.cumsum(tops) - tops, tops) + 1
    table[jobs, ks] = problem.speedups.lookup(jobs, problem.consolidated_nodes(ks), ks)
    return table


def goodput_curve(
    utilities: FloatArray, speed: FloatArray, rows: IntArray, limit: int
) -> tuple[IntArray, FloatArray]:
    """G(B) of the jobs `rows` as the count phase would grow them on at most `limit` GPUs.

    Returns the GPUs and the goodput (sum of speedups) after each greedy jump, starting at
    (0, 0): the best jump by utility gain per GPU, as in `greedy.choose_counts`, until no jump
    gains or fits. The last GPU count is what the jobs can use.
    """
    gpus, goodput = [0], [0.0]
    if rows.size == 0 or limit <= 0:
        return np.array(gpus, dtype=np.int64), np.array(goodput)
    table, spd = utilities[rows], speed[rows]
    width = table.shape[1]
    sizes = np.arange(width)
    count = [0] * rows.size
    room = limit

    def best_jump(i: int, now: int) -> tuple[float, int]:
        top = min(now + room, width - 1)
        if top <= now:
            return -math.inf, 0
        gain = (table[i, now + 1 : top + 1] - table[i, now]) / sizes[1 : top - now + 1]
        best = int(np.argmax(gain))
        if not gain[best] > -np.inf:
            return -math.inf, 0
        return float(gain[best]), now + 1 + best

    with np.errstate(invalid="ignore"):
        first = (table[:, 1:] - table[:, :1]) / sizes[1:]
    first[:, min(room, width - 1) :] = -np.inf
    first = np.where(np.isnan(first), -np.inf, first)
    best = np.argmax(first, axis=1) if width > 1 else np.zeros(rows.size, dtype=np.int64)
    gains = first[np.arange(rows.size), best] if width > 1 else np.full(rows.size, -np.inf)
    targets = (best + 1).tolist()
    heap = [(-g, i) for i, g in enumerate(gains.tolist())]
    heapq.heapify(heap)
    total = 0.0
    while room > 0 and heap:
        loss, i = heap[0]
        target, now = targets[i], count[i]
        if target - now > room:
            gain, targets[i] = best_jump(i, now)  # its jump no longer fits
            heapq.heapreplace(heap, (-gain, i))
            continue
        if not -loss > 0:
            break
        room -= target - now
        total += float(spd[i, target] - spd[i, now])
        count[i] = target
        gpus.append(limit - room)
        goodput.append(total)
        gain, targets[i] = best_jump(i, target)
        heapq.heapreplace(heap, (-gain, i))
    return np.array(gpus, dtype=np.int64), np.array(goodput)


def progressive_fill(
    curves: Sequence[tuple[IntArray, FloatArray]],
    floor: IntArray,
    ceiling: IntArray,
    entitled: FloatArray,
    total: int,
) -> IntArray:
    """Budgets: from the floors, each step to the tenant with the least G_t / E_t.

    A step takes the tenant to the next point of its goodput curve (or as far as the free
    GPUs and its ceiling allow). Ties go to the fewest GPUs per entitled GPU, then the first
    tenant. Tenants entitled to nothing come after every other tenant has reached its ceiling.
    """
    budget = floor.astype(np.int64).copy()
    free = total - int(budget.sum())

    def key(t: int) -> tuple[float, float, int]:
        if entitled[t] <= 0:
            return math.inf, float(budget[t]), t
        return goodput_at(curves[t], int(budget[t])) / entitled[t], budget[t] / entitled[t], t

    heap = [key(t) for t in range(len(curves)) if budget[t] < ceiling[t]]
    heapq.heapify(heap)
    while free > 0 and heap:
        t = heapq.heappop(heap)[2]
        gpus = curves[t][0]
        nxt = int(np.searchsorted(gpus, budget[t], side="right"))
        step = int(gpus[nxt]) - int(budget[t]) if nxt < gpus.size else 1
        step = min(step, free, int(ceiling[t] - budget[t]))
        budget[t] += step
        free -= step
        if budget[t] < ceiling[t]:
            heapq.heappush(heap, key(t))
    return budget


def goodput_at(curve: tuple[IntArray, FloatArray], gpus: int) -> float:
    """G(gpus): the goodput at the last curve point with at most `gpus` GPUs."""
    points, goodput = curve
    return float(goodput[int(np.searchsorted(points, gpus, side="right")) - 1])


def apportion(amount: int, weights: IntArray) -> IntArray:
    """`amount` split in proportion to `weights` in whole units (largest remainders)."""
    exact = amount * weights / max(int(weights.sum()), 1)
    out = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - out), kind="stable")
    out[order[: amount - int(out.sum())]] += 1
    return out
