"""Tenants: GPU guarantees, caps and goodput shares by weight, on top of Pollux (two levels).

Level 1 (`plan`) splits the cluster's GPUs among tenants into budgets; level 2 is the normal
per-job Pollux search (`greedy.search`) with each tenant held to its budget, so within a tenant
jobs share exactly as Pollux shares a cluster.

**Entitlement.** Among the tenants that have demand, tenant t is entitled to

    E_t = g_t + w_t / Σ_u w_u · (N − Σ_u g_u)   GPUs        (N: the cluster's GPUs)

water-filled under the caps (what a capped tenant cannot take goes to the others by weight);
guarantees that add up to more than N are first scaled down in proportion. Its entitled share
of the cluster's *goodput* is e_t = E_t / Σ_u E_u. Why goodput and not GPUs: a GPU is worth
different amounts to different jobs (a job that scales badly turns a 9th GPU into little
progress), so a share of GPUs is not a share of useful work. Goodput is counted in the policy's
own unit, the speedup (a job's goodput over that of the round's fair-share reference
allocation, `valuation.Normalisation`), which makes jobs of different sizes comparable: a
tenant's goodput is the sum of its jobs' speedups. Why E_t is stated in GPUs: guarantees and
caps are GPU counts an administrator reserves and a team can plan with; E_t is the part of the
cluster the tenant would own in a static partition, and e_t says that it gets that part of
the cluster's useful progress instead, whichever GPUs that takes.

**Level 1** is weighted max-min fairness in goodput, by progressive filling: every tenant
starts at its floor (its guarantee, or what its jobs can use if that is less), then GPUs go,
one greedy step at a time, to the tenant with the least goodput per entitled GPU, G_t / E_t,
never past its ceiling (its cap, or what its jobs can use). G_t(B), a tenant's goodput on B
GPUs, comes from the greedy count phase run on the tenant's jobs alone (the order in which
level 2 would grow them). When every tenant can use more than its share, G_t / E_t ends equal
up to one step, so each tenant's share of goodput is e_t. A tenant without enough demand for
its share (an idle guarantee) leaves the rest to the others (borrowing); the next round splits
again, so it gets them back as soon as its jobs can use them (reclaim), paying only the restart
penalty Pollux charges any re-allocation. GPUs level 2 cannot place within the budgets are
lent, in the same round, to tenants below their caps. A tenant entitled to nothing (every GPU
guaranteed to others) only borrows.

**The WEIGHTS mode** (`PolluxParams.tenant_shares`, `weigh`) is the one-level alternative: no
split; each job's utility in the power mean is weighted by its tenant's entitlement per job,
so that the objective itself leans goodput towards e_t while trading it against efficiency and
restarts across all jobs. Budgets then only hold guarantees and caps. It costs less mean JCT
and meets the shares less closely (benchmarks/multi_tenant.py measures both).

**The DEFICITS mode** (`Ledger`, `tilts`, `account`) asks for fairness over time instead of in
every round: each tenant carries a deficit, the goodput share it has been owed (relative to
its entitlement) integrated over the seconds it was contending, and every job weighs as in
single-pool Pollux (1), times its tenant's tilt exp((1 − p) · deficit / HORIZON). A round
with no deficits is the single-pool round (the best for JCT) within the WEIGHTS mode's
guarantee and cap budgets; a tenant persistently below its share gets a growing weight until
its long-run share meets e_t (an integral controller; see `account` and the constants for
why they are what they are). So deviations that help JCT (a tenant with one job that scales
badly is not pushed to 30 GPUs) are allowed for a while and repaid later, when the tenant's
jobs can turn GPUs into goodput.

**The ISOLATION mode** (`isolation`, `insure`) promises each tenant the *sharing incentive*
instead of a share of the cluster's goodput: at least FLOOR of the goodput its jobs would get
alone on its entitled GPUs, a static partition of ⌊E_t⌋ GPUs (its isolated goodput I_t, the
sum of speedups the count phase reaches on the tenant's jobs alone, `goodput_curve`). Why
this promise and not e_t: a share of goodput is unreachable, at any weight, for a tenant whose
jobs scale badly (no number of GPUs turns one such job into 30 % of the cluster's goodput), and
chasing it takes GPUs from jobs that would use them well; what a team gives up by pooling its
GPUs is what it could have done on them alone, which is what I_t measures (DRF's sharing
incentive, Themis' finish-time fairness per round). So each tenant with demand is reserved the
fewest GPUs on which its curve reaches FLOOR · I_t (never more than ⌊E_t⌋, so the reservations
always fit), on top of its guarantee, and everything else is single-pool Pollux's objective:
a tenant that single-pool Pollux already serves well constrains nothing, an efficient tenant
may hold more than its entitlement while the others are at their floors (work conservation),
and the reservations bind only for tenants single-pool Pollux would leave below the floor.
Budgets are per tenant, so with three tenants or more two of them can together take a third's
reservation; `secure` then holds the tenants above their floors to less and searches again.
The mode also keeps the DEFICITS mode's ledger, with a tolerance: a tenant is owed only as
far as its mean goodput share over the ledger's memory falls outside ±TOLERANCE (the same
10 %) of e_t, and what is owed tilts its jobs' weights as in DEFICITS. So while every
tenant's mean share is within the tolerance the round is single-pool Pollux's (round-to-round
swings, which the job mix makes large, cost nothing), and a tenant persistently outside it (a
tenant with many small jobs that single-pool Pollux favours, or one that single-pool Pollux
leaves just above its floor) is pulled back over the following rounds, within the floors, at
the pace of DEFICITS' HORIZON.

Jobs naming no tenant, or one no `TenantSpec` defines, form one implicit default tenant "":
weight 1, no guarantee, no cap. One tenant and not one per unknown name, so that inventing
names gains nothing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from pollux.policy.problem import Problem
from pollux.policy.types import AllocationDecision, ClusterState, JobExplain, JobInfo, TenantSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_TENANT = ""
"""Name of the implicit tenant of jobs whose tenant no `TenantSpec` defines."""


@dataclass(frozen=True, slots=True)
class Tenants:
    """The round's tenants as arrays, and each job's tenant.

    Attributes:
        names: Tenant names, in the order of `ClusterState.tenants`, then "" if any job is in
            the default tenant.
        guarantee: Guaranteed GPUs per tenant (as configured, not yet scaled).
        weight: Weight per tenant.
        cap: Cap per tenant in GPUs (a very large number when there is none).
        of_job: Index into `names` of each job's tenant.
    """

    names: tuple[str, ...]
    guarantee: IntArray
    weight: FloatArray
    cap: IntArray
    of_job: IntArray

    @classmethod
    def of(cls, specs: Sequence[TenantSpec], jobs: Sequence[JobInfo]) -> Tenants:
        """Tenant arrays for `specs`, adding the default tenant when a job needs it."""
        index = {spec.name: i for i, spec in enumerate(specs)}
        default = len(specs)
        of_job = np.array([index.get(job.tenant, default) for job in jobs], dtype=np.int64)
        rows = list(specs)
        names = [spec.name for spec in rows]
        guarantee = [spec.guarantee_gpus for spec in rows]
        weight = [spec.weight for spec in rows]
        cap = [spec.cap or _NO_CAP for spec in rows]
        if (of_job == default).any():
            names.append(DEFAULT_TENANT)
            guarantee.append(0)
            weight.append(1.0)
            cap.append(_NO_CAP)
        return cls(
            names=tuple(names),
            guarantee=np.array(guarantee, dtype=np.int64),
            weight=np.array(weight, dtype=np.float64),
            cap=np.array(cap, dtype=np.int64),
            of_job=of_job,
        )

    @classmethod
    def of_state(cls, state: ClusterState) -> Tenants:
        """`of` the state's tenants and jobs."""
        return cls.of(state.tenants, state.jobs)


_NO_CAP = 2**62


@dataclass(frozen=True, slots=True)
class Quota:
    """Level 1's answer for one round: the most GPUs each tenant may hold.

    Attributes:
        tenants: The tenants and each job's tenant.
        budget: Most GPUs each tenant may hold this round (Σ ≤ the cluster's GPUs).
        entitled: E_t among the tenants with demand (0 for those without).
        floor: GPUs set aside first: its guarantee, or what its jobs can use if that is less.
        ceiling: Most GPUs it may get: its cap, or what its jobs can use if that is less.
        goodput: Predicted goodput (sum of speedups) of each tenant on its budget.
    """

    tenants: Tenants
    budget: IntArray
    entitled: FloatArray
    floor: IntArray
    ceiling: IntArray
    goodput: FloatArray

    @property
    def of_job(self) -> IntArray:
        """Index of each job's tenant (into `tenants.names`, `budget` …)."""
        return self.tenants.of_job

    def lent(self) -> Quota:
        """The quota with every budget raised to the tenant's cap (for otherwise idle GPUs)."""
        return replace(self, budget=np.maximum(self.budget, self.tenants.cap))

    def usage(self, held: npt.ArrayLike) -> IntArray:
        """GPUs each tenant holds, given the GPUs each job holds."""
        counts = np.bincount(self.of_job, weights=held, minlength=self.budget.size)
        return np.asarray(np.rint(counts), dtype=np.int64)


def entitlements(
    guarantee: npt.ArrayLike, weight: npt.ArrayLike, cap: npt.ArrayLike, total: int
) -> FloatArray:
    """E_t, each tenant's entitled GPUs out of `total` (see the module docstring).

    Guarantees adding up to more than `total` are scaled down in proportion; the rest of the
    GPUs is split by weight, and whatever a cap stops a tenant from taking is split again
    among the uncapped ones (water-filling). The result adds up to `total` unless every tenant
    is capped below it.
    """
    g = np.asarray(guarantee, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    limit = np.minimum(np.asarray(cap, dtype=np.float64), float(total))
    if g.sum() > total:
        g = g * (total / g.sum())
    share = np.minimum(g, limit)
    rest = total - share.sum()
    open_ = share < limit
    while rest > 1e-9 * max(total, 1) and open_.any():
        add = np.zeros_like(share)
        add[open_] = rest * w[open_] / w[open_].sum()
        add = np.minimum(add, limit - share)
        share += add
        rest -= add.sum()
        open_ = share < limit - 1e-9
    return share


def plan(problem: Problem, utilities: FloatArray) -> Quota:
    """Level 1: each tenant's GPU budget for this round.

    Args:
        problem: The round (its state names the tenants).
        utilities: The count phase's table U[j, k] (`greedy.count_utilities`), so that a
            tenant's goodput curve follows the order in which level 2 grows its jobs.
    """
    tenants = Tenants.of_state(problem.state)
    count = len(tenants.names)
    total = problem.total_gpus
    speed = _consolidated_speedups(problem, utilities.shape[1])
    curves = [
        goodput_curve(utilities, speed, np.nonzero(tenants.of_job == t)[0], total)
        for t in range(count)
    ]
    usable = np.array([int(gpus[-1]) for gpus, _ in curves], dtype=np.int64)
    ceiling = np.minimum(usable, tenants.cap)
    active = ceiling > 0
    entitled = np.zeros(count)
    entitled[active] = entitlements(
        tenants.guarantee[active], tenants.weight[active], tenants.cap[active], total
    )
    scaled = tenants.guarantee.astype(np.float64)
    if scaled[active].sum() > total:
        scaled *= total / scaled[active].sum()
    floor = np.minimum(np.floor(scaled + 1e-9).astype(np.int64), ceiling)
    budget = progressive_fill(curves, floor, ceiling, entitled, total)
    goodput = np.array([_at(curve, int(b)) for curve, b in zip(curves, budget, strict=True)])
    return Quota(tenants, budget, entitled, floor, ceiling, goodput)


def weigh(problem: Problem, tilt: FloatArray | None = None) -> Quota:
    """The WEIGHTS mode's level 1: weight each job's utility; budgets for guarantees and caps.

    Pollux's power mean with exponent p < 1, maximised, gives jobs of equal weight about
    equal speedups; with weights ω_j its optimum (for speedups ∝ GPUs) has speedups
    ∝ ω_j^(1/(1−p)). Weighting each job by (e_t / n_t)^(1−p), its tenant's entitlement split
    among the tenant's n_t jobs, therefore gives each busy tenant goodput ∝ e_t, while
    efficiency and restart penalties are still traded off across all jobs in one objective.
    Budgets: a tenant may hold up to its cap, less the floors of all other tenants, so every
    guarantee stays available to its tenant. With a `tilt` per tenant (the DEFICITS mode's
    `tilts`) each job weighs its tenant's tilt instead of its entitlement per job, so that
    without deficits the objective is single-pool Pollux's. Sets `problem.weight`.
    """
    tenants = Tenants.of_state(problem.state)
    count = len(tenants.names)
    total = problem.total_gpus
    wants = problem.max_k > 0
    jobs = np.bincount(tenants.of_job[wants], minlength=count)
    demand = np.bincount(tenants.of_job, weights=problem.max_k, minlength=count).astype(np.int64)
    ceiling = np.minimum(np.minimum(demand, tenants.cap), total)
    active = ceiling > 0
    entitled = np.zeros(count)
    entitled[active] = entitlements(
        tenants.guarantee[active], tenants.weight[active], tenants.cap[active], total
    )
    scaled = tenants.guarantee.astype(np.float64)
    if scaled[active].sum() > total:
        scaled *= total / scaled[active].sum()
    floor = np.minimum(np.floor(scaled + 1e-9).astype(np.int64), ceiling)
    budget = np.minimum(tenants.cap, total - (floor.sum() - floor))
    per_job = np.where(jobs > 0, entitled / np.maximum(jobs, 1), 0.0)
    if tilt is None:
        weight = per_job[tenants.of_job] ** (1.0 - problem.params.p)
    else:
        weight = np.where(per_job > 0, tilt, 0.0)[tenants.of_job]
    positive = weight[weight > 0]
    if positive.size:  # tenants entitled to nothing weigh least: they borrow what is left
        problem.weight = np.where(weight > 0, weight, positive.min()) / positive.max()
    goodput = np.full(count, np.nan)
    return Quota(tenants, budget, entitled, floor, ceiling, goodput)


FLOOR = 0.9
"""Fraction of its isolated goodput the ISOLATION mode reserves for each tenant: the issue's
tolerance (a tenant within 10 % of what it is entitled to), read as a floor, since more than its
entitlement is not a wrong done to it. A floor of 1 would reserve the last GPUs of each tenant's
curve, the ones its jobs turn into the least goodput, at the others' expense."""

TOLERANCE = 1.0 - FLOOR
"""Mean relative deviation from its goodput share that the ISOLATION mode lets a tenant have
before any of it is owed (`tilts`): the issue's ±10 % again. Within it the round is single-pool
Pollux's (the best for JCT); beyond it the excess is owed as in the DEFICITS mode."""


@dataclass(frozen=True, slots=True)
class Isolation:
    """What each tenant would get alone on its entitled GPUs (the ISOLATION mode's promise).

    Attributes:
        entitled: E_t among the tenants with demand (0 for those without).
        goodput: I_t, the goodput (sum of speedups) of its jobs alone on ⌊E_t⌋ GPUs.
        curves: Per tenant, its goodput curve (`goodput_curve`) on at most ⌊E_t⌋ GPUs.
    """

    entitled: FloatArray
    goodput: FloatArray
    curves: tuple[tuple[IntArray, FloatArray], ...]

    def needs(self, fraction: float = FLOOR) -> IntArray:
        """Fewest GPUs on which each tenant's curve reaches `fraction` of its I_t."""
        out = []
        for (gpus, goodput), alone in zip(self.curves, self.goodput.tolist(), strict=True):
            reached = np.nonzero(goodput >= fraction * alone - 1e-12)[0]
            out.append(int(gpus[reached[0]]) if reached.size else 0)
        return np.array(out, dtype=np.int64)


def isolation(problem: Problem, utilities: FloatArray, tenants: Tenants | None = None) -> Isolation:
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
    active = np.minimum(demand, tenants.cap) > 0
    entitled = np.zeros(count)
    entitled[active] = entitlements(
        tenants.guarantee[active], tenants.weight[active], tenants.cap[active], total
    )
    speed = _consolidated_speedups(problem, utilities.shape[1])
    curves = tuple(
        goodput_curve(utilities, speed, np.nonzero(tenants.of_job == t)[0], int(entitled[t] + 1e-9))
        for t in range(count)
    )
    goodput = np.array([float(curve[1][-1]) for curve in curves])
    return Isolation(entitled, goodput, curves)


def insure(problem: Problem, utilities: FloatArray, tilt: FloatArray | None = None) -> Quota:
    """The ISOLATION mode's level 1: single-pool weights, each tenant's floor reserved.

    Budgets as in `weigh` (a tenant may hold up to its cap less the floors of all others), with
    each tenant's floor raised from its guarantee to the GPUs on which it reaches FLOOR · I_t
    (at most ⌊E_t⌋ and what its jobs can use, so the floors add up to at most the cluster).
    Every job weighs alike (single-pool Pollux), times its tenant's `tilt` (`tilts` of the
    mode's ledger; none: 1), so the floors and any share owed beyond the tolerance are the only
    constraints. Sets `problem.weight`; the quota's `goodput` is I_t.
    """
    if tilt is None:
        tilt = np.ones(len(Tenants.of_state(problem.state).names))
    quota = weigh(problem, tilt)
    alone = isolation(problem, utilities, quota.tenants)
    floor = np.maximum(quota.floor, np.minimum(alone.needs(), quota.ceiling))
    total = problem.total_gpus
    budget = np.minimum(quota.tenants.cap, total - (floor.sum() - floor))
    return replace(quota, floor=floor, budget=budget, goodput=alone.goodput)


def secure(
    problem: Problem, quota: Quota, placed: IntArray, search: Callable[[Quota], IntArray]
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
        cut = _apportion(want, excess)
        budget = np.where(short, quota.budget, np.minimum(quota.budget, held - cut))
        tighter = replace(quota, budget=budget)
        again = search(tighter)
        after = np.maximum(quota.floor - tighter.usage(again.sum(axis=1)), 0)
        if after.sum() >= lack.sum():
            break
        quota, placed = tighter, again
    return quota, placed


def _apportion(amount: int, weights: IntArray) -> IntArray:
    """`amount` split in proportion to `weights` in whole units (largest remainders)."""
    exact = amount * weights / max(int(weights.sum()), 1)
    out = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - out), kind="stable")
    out[order[: amount - int(out.sum())]] += 1
    return out


HORIZON = 600.0
"""Seconds over which a tenant's shortfall is made up (the DEFICITS controller's time constant).

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
    """The DEFICITS and ISOLATION modes' memory between rounds (`AllocationDecision.memory`).

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


def tilts(
    ledger: Ledger | None, names: Sequence[str], p: float, tolerance: float = 0.0
) -> FloatArray:
    """Each tenant's weight factor: exp(owed / HORIZON) as a goodput share, raised to 1 − p.

    A share target scaled by r needs the weight scaled by r^(1 − p) (see `weigh`), so a tenant
    owed HORIZON seconds of its share aims e-fold higher, whatever p. What is owed is the
    deficit, less `tolerance` × the seconds it contended: a tenant whose mean relative
    shortfall over its memory (deficit / span) is within ±tolerance is owed nothing, and one
    outside it only the excess (the ISOLATION mode's TOLERANCE; DEFICITS owes every second).
    Without a ledger (the first round) every factor is 1: single-pool Pollux's objective.
    """
    if ledger is None:
        return np.ones(len(names))
    limit = HORIZON * math.log(MOST_TILT)
    deficit = np.array([ledger.deficit.get(name, 0.0) for name in names])
    band = tolerance * np.array([ledger.span.get(name, 0.0) for name in names])
    owed = np.sign(deficit) * np.maximum(np.abs(deficit) - band, 0.0)
    return np.asarray(np.exp(_sensitivity(p) * np.clip(owed, -limit, limit) / HORIZON))


def account(
    ledger: Ledger | None, quota: Quota, problem: Problem, decision: AllocationDecision
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


def explained(decision: AllocationDecision, quota: Quota) -> AllocationDecision:
    """`decision` with each job's reason naming its tenant's budget and what it holds."""
    jobs = list(decision.allocations)
    held = quota.usage([len(decision.allocations[name]) for name in jobs])
    names = quota.tenants.names
    explain = {}
    for name, t in zip(jobs, quota.of_job.tolist(), strict=True):
        why = decision.explain[name]
        label = names[t] or "default"
        note = f"tenant {label}: {held[t]} of its {quota.budget[t]}-GPU budget"
        explain[name] = JobExplain(why.speedup, why.penalty, f"{why.reason} ({note})")
    return replace(decision, explain=explain)


def _consolidated_speedups(problem: Problem, width: int) -> FloatArray:
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
        return _at(curves[t], int(budget[t])) / entitled[t], budget[t] / entitled[t], t

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


def _at(curve: tuple[IntArray, FloatArray], gpus: int) -> float:
    """G(gpus): the goodput at the last curve point with at most `gpus` GPUs."""
    points, goodput = curve
    return float(goodput[int(np.searchsorted(points, gpus, side="right")) - 1])
