"""At most one option per job within per-row GPU capacities: the typed round's solver.

The problem (`Options`): maximise Σ gain over the chosen (job, option) entries, each job at
most one, each resource row (a node group's GPUs; with tenants, also each tenant's budget)
within its capacity. That is a multiple-choice knapsack with a few rows; three solvers:

- `lp_rounded`: the LP relaxation (HiGHS), its few fractional jobs rounded to an option that
  fits, then local search (re-choices; pairs up to `PAIR_JOBS`; the MILP up to `EXACT_JOBS`).
- `priced`: a price per row by cutting planes on the Lagrangian dual; clear winners take
  their best option, the ~`MARGINAL` jobs nearest a tie share the rest through `lp_rounded`.
- `exact`: the integer programme (scipy's HiGHS MILP), for tests and benchmarks.

`assign` picks `lp_rounded` up to `MARGINAL` jobs, `priced` above; every `Assignment` carries
its upper bound, a certified gap (docs/policy.md, "Several GPU types").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MARGINAL = 300
"""Jobs up to which `assign` solves the LP of all jobs; above, the marginal jobs' only."""

PAIR_JOBS = 64
"""Jobs up to which local search also tries every pair's joint re-choice."""

EXACT_JOBS = 8
"""Jobs up to which `lp_rounded` closes a remaining gap with the integer programme."""

_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Options:
    """Every job's options as entries, grouped by job (entries of a job adjacent, in order).

    Attributes:
        num_jobs: J.
        job: Job of each entry (non-decreasing).
        column: The option's column in the caller's table (returned in `Assignment.column`).
        gain: Its gain over no GPUs, > 0 (options worth no more than nothing are left out).
        gpus: GPUs it takes.
        rows: E × D: the resource rows it takes `gpus` of (its group; its tenant's budget).
        capacity: GPUs of each row.
    """

    num_jobs: int
    job: IntArray
    column: IntArray
    gain: FloatArray
    gpus: FloatArray
    rows: IntArray
    capacity: FloatArray

    @classmethod
    def build(
        cls,
        gain: FloatArray,
        gpus: IntArray,
        rows: IntArray,
        capacity: npt.ArrayLike,
    ) -> Options:
        """Entries of the J × O tables `gain` (−inf: not an option), `gpus`, `rows` (J × O × D).

        Entries whose gain is not > 0 are dropped.
        """
        jobs, cols = np.nonzero(np.isfinite(gain) & (gain > 0))
        return cls(
            num_jobs=gain.shape[0],
            job=jobs.astype(np.int64),
            column=cols.astype(np.int64),
            gain=gain[jobs, cols].astype(np.float64),
            gpus=gpus[jobs, cols].astype(np.float64),
            rows=rows[jobs, cols].reshape(jobs.size, rows.shape[2]).astype(np.int64),
            capacity=np.asarray(capacity, dtype=np.float64),
        )

    @property
    def size(self) -> int:
        """E, the number of entries."""
        return int(self.job.size)

    def usage(self, picked: IntArray) -> FloatArray:
        """GPUs each row holds under the entries `picked` (−1: none)."""
        on = picked[picked >= 0]
        out = np.zeros(self.capacity.size)
        for d in range(self.rows.shape[1]):
            out += np.bincount(self.rows[on, d], weights=self.gpus[on], minlength=out.size)
        return out

    def value(self, picked: IntArray) -> float:
        """Σ gain of the entries `picked` (−1: none)."""
        return float(self.gain[picked[picked >= 0]].sum())

    def subset(self, jobs: IntArray, capacity: FloatArray) -> tuple[Options, IntArray]:
        """The options of `jobs` (renumbered 0 …) within `capacity`, and their entries' ids."""
        keep = np.nonzero(np.isin(self.job, jobs))[0]
        renumber = np.searchsorted(jobs, self.job[keep])
        sub = Options(
            num_jobs=int(jobs.size),
            job=renumber.astype(np.int64),
            column=self.column[keep],
            gain=self.gain[keep],
            gpus=self.gpus[keep],
            rows=self.rows[keep],
            capacity=capacity,
        )
        return sub, keep

    def matrix(self) -> sp.csr_matrix:
        """The constraint rows: one per job (Σ x ≤ 1), then one per resource row."""
        entries = np.arange(self.size)
        one = sp.csr_matrix(
            (np.ones(self.size), (self.job, entries)), shape=(self.num_jobs, self.size)
        )
        use = sp.csr_matrix((self.capacity.size, self.size))
        for d in range(self.rows.shape[1]):
            use = use + sp.csr_matrix(
                (self.gpus, (self.rows[:, d], entries)), shape=(self.capacity.size, self.size)
            )
        return sp.vstack([one, use]).tocsr()

    def bounds(self) -> FloatArray:
        """Right-hand sides of `matrix`."""
        return np.concatenate([np.ones(self.num_jobs), self.capacity])


@dataclass(frozen=True, slots=True)
class Assignment:
    """A solver's answer.

    Attributes:
        picked: Each job's entry (into the `Options`), −1: none.
        column: Each job's option column, −1: none.
        value: Σ gain of the picked entries.
        upper_bound: A proven upper bound on the best value (of the integer programme).
        prices: Each resource row's price per GPU (LP duals or Lagrangian prices).
        method: Which solver answered ("lp", "priced", "exact").
    """

    picked: IntArray
    column: IntArray
    value: float
    upper_bound: float
    prices: FloatArray
    method: str

    @property
    def gap(self) -> float:
        """(upper bound − value) / upper bound, ≥ 0: how far from optimal it may be."""
        if self.upper_bound <= _TOL:
            return 0.0
        return max(0.0, (self.upper_bound - self.value) / self.upper_bound)


def assign(options: Options) -> Assignment:
    """`lp_rounded` up to `MARGINAL` jobs with options, `priced` above."""
    jobs = np.unique(options.job).size
    return lp_rounded(options) if jobs <= MARGINAL else priced(options)


def _answer(
    options: Options, picked: IntArray, bound: float, prices: FloatArray, method: str
) -> Assignment:
    column = np.full(picked.size, -1, dtype=np.int64)
    column[picked >= 0] = options.column[picked[picked >= 0]]
    value = options.value(picked)
    return Assignment(picked, column, value, max(bound, value), prices, method)


# -- LP relaxation, rounding, local search ----------------------------------------------------


def lp_rounded(options: Options) -> Assignment:
    """The LP relaxation rounded, then improved by local search (module docstring).

    Up to `EXACT_JOBS` jobs with options, a gap left after local search is closed by the
    integer programme itself (milliseconds at that size).
    """
    picked, bound, prices = _lp_round(options)
    picked = improve(options, picked)
    answer = _answer(options, picked, bound, prices, "lp")
    if answer.gap > 1e-9 and np.unique(options.job).size <= EXACT_JOBS:
        try:
            best = exact(options, time_limit=1.0)
        except RuntimeError:  # no solution within the limit: keep the local search's
            return answer
        if best.value > answer.value:
            return _answer(options, best.picked, bound, prices, "lp")
    return answer


def _lp_round(options: Options) -> tuple[IntArray, float, FloatArray]:
    """Rounded LP solution, the LP's value (an upper bound) and the rows' duals."""
    picked = np.full(options.num_jobs, -1, dtype=np.int64)
    if options.size == 0:
        return picked, 0.0, np.zeros(options.capacity.size)
    res = linprog(
        -options.gain,
        A_ub=options.matrix(),
        b_ub=options.bounds(),
        bounds=(0, 1),
        method="highs",
    )
    if res.status != 0 or res.x is None:  # cannot happen for this bounded, feasible LP
        return greedy(options), float(options.gain.sum()), np.zeros(options.capacity.size)
    x = np.asarray(res.x)
    bound = float(-res.fun)
    duals = np.maximum(-np.asarray(res.ineqlin.marginals)[options.num_jobs :], 0.0)
    # Each job's entry of largest x; taken when integral enough, else rounded below.
    order = np.lexsort((-x, options.job))
    first = np.r_[True, options.job[order][1:] != options.job[order][:-1]]
    top = order[first]
    whole = x[top] > 1 - 1e-6
    picked[options.job[top[whole]]] = top[whole]
    picked = _repair(options, picked)
    partial = top[~whole & (x[top] > 1e-9)]
    free = options.capacity - options.usage(picked)
    for e in partial[np.argsort(-options.gain[partial] * x[partial], kind="stable")].tolist():
        j = int(options.job[e])
        entries = np.nonzero(options.job == j)[0]
        fits = _fits(options, entries, free)
        if fits.any():
            best = entries[fits][np.argmax(options.gain[entries[fits]])]
            picked[j] = best
            free -= _use(options, int(best))
    return picked, bound, duals


def _use(options: Options, e: int) -> FloatArray:
    out = np.zeros(options.capacity.size)
    np.add.at(out, options.rows[e], options.gpus[e])
    return out


def _fits(options: Options, entries: IntArray, free: FloatArray) -> BoolArray:
    """Which `entries` fit in `free` GPUs per row."""
    need = options.gpus[entries][:, None]
    rows = options.rows[entries]
    if rows.shape[1] == 1:
        return np.asarray(need[:, 0] <= free[rows[:, 0]] + _TOL)
    # An entry may take two rows that coincide only if the caller said so; sum per row.
    ok = np.ones(entries.size, dtype=bool)
    for d in range(rows.shape[1]):
        same = (rows == rows[:, d : d + 1]).sum(axis=1)
        ok &= need[:, 0] * same <= free[rows[:, d]] + _TOL
    return ok


def _repair(options: Options, picked: IntArray) -> IntArray:
    """Drop the picks of least gain per GPU from rows over capacity until all fit."""
    picked = picked.copy()
    while True:
        over = options.usage(picked) - options.capacity
        if not (over > _TOL).any():
            return picked
        row = int(np.argmax(over))
        on = np.nonzero(picked >= 0)[0]
        inside = on[(options.rows[picked[on]] == row).any(axis=1)]
        ratio = options.gain[picked[inside]] / options.gpus[picked[inside]]
        picked[inside[int(np.argmin(ratio))]] = -1


def greedy(options: Options) -> IntArray:
    """Options by gain per GPU, best first, each job's first that fits (a fallback)."""
    picked = np.full(options.num_jobs, -1, dtype=np.int64)
    free = options.capacity.copy()
    for e in np.argsort(-options.gain / options.gpus, kind="stable").tolist():
        j = int(options.job[e])
        if picked[j] < 0 and _fits(options, np.array([e]), free)[0]:
            picked[j] = e
            free -= _use(options, e)
    return picked


def improve(options: Options, picked: IntArray, *, sweeps: int = 3) -> IntArray:
    """Local search: each job's best re-choice (its own GPUs freed), then pairs' (small J)."""
    picked = picked.copy()
    starts = np.searchsorted(options.job, np.arange(options.num_jobs + 1))
    used = options.usage(picked)
    for _ in range(sweeps):
        changed = False
        for j in range(options.num_jobs):
            lo, hi = int(starts[j]), int(starts[j + 1])
            if lo == hi:
                continue
            mine = int(picked[j])
            free = options.capacity - used
            now = 0.0
            if mine >= 0:
                free = free + _use(options, mine)
                now = float(options.gain[mine])
            entries = np.arange(lo, hi)
            fits = _fits(options, entries, free)
            if not fits.any():
                continue
            best = int(entries[fits][np.argmax(options.gain[entries[fits]])])
            if options.gain[best] > now + 1e-12 * max(1.0, abs(now)):
                if mine >= 0:
                    used -= _use(options, mine)
                used += _use(options, best)
                picked[j] = best
                changed = True
        if not changed:
            break
    if np.unique(options.job).size <= PAIR_JOBS:
        picked = _improve_pairs(options, picked)
    return picked


def _improve_pairs(options: Options, picked: IntArray, *, sweeps: int = 4) -> IntArray:
    """Every pair's best joint re-choice (either may take none) within what both free."""
    jobs = np.unique(options.job)
    if jobs.size < 2:
        return picked
    # Dense per-job options: column 0 is "none".
    starts = np.searchsorted(options.job, jobs)
    counts = np.diff(np.r_[starts, options.size])
    width = int(counts.max()) + 1
    rows_n = options.capacity.size
    gain = np.full((jobs.size, width), -np.inf)
    gain[:, 0] = 0.0
    use = np.zeros((jobs.size, width, rows_n))
    entry = np.full((jobs.size, width), -1, dtype=np.int64)
    for i, (lo, n) in enumerate(zip(starts.tolist(), counts.tolist(), strict=True)):
        ids = np.arange(lo, lo + n)
        gain[i, 1 : n + 1] = options.gain[ids]
        entry[i, 1 : n + 1] = ids
        for d in range(options.rows.shape[1]):
            np.add.at(use[i], (np.arange(1, n + 1), options.rows[ids, d]), options.gpus[ids])
    slot = np.zeros(jobs.size, dtype=np.int64)
    for i, j in enumerate(jobs.tolist()):
        if picked[j] >= 0:
            slot[i] = int(np.nonzero(entry[i] == picked[j])[0][0])
    cap = options.capacity
    for _ in range(sweeps):
        improved = False
        for a in range(jobs.size - 1):
            used = use[np.arange(jobs.size), slot].sum(axis=0)
            b = np.arange(a + 1, jobs.size)
            free = cap - used + use[a, slot[a]] + use[b, slot[b]]  # (B, R)
            joint = use[a][None, :, None, :] + use[b][:, None, :, :]  # (B, W, W, R)
            ok = (joint <= free[:, None, None, :] + _TOL).all(axis=3)
            value = np.where(ok, gain[a][None, :, None] + gain[b][:, None, :], -np.inf)
            flat = value.reshape(b.size, -1)
            best = np.argmax(flat, axis=1)
            now = gain[a, slot[a]] + gain[b, slot[b]]
            better = flat[np.arange(b.size), best] - now
            i = int(np.argmax(better))
            if better[i] > 1e-12 * max(1.0, abs(float(now[i]))):
                slot[a], slot[b[i]] = divmod(int(best[i]), width)
                improved = True
        if not improved:
            break
    out = picked.copy()
    out[jobs] = entry[np.arange(jobs.size), slot]
    return out


# -- prices on the Lagrangian dual, LP on the marginal jobs ----------------------------------


def priced(options: Options, *, marginal: int = MARGINAL, iterations: int = 60) -> Assignment:
    """Row prices by Kelley's cutting planes; the marginal jobs by `lp_rounded`."""
    num_rows = options.capacity.size
    if options.size == 0:
        return _answer(options, np.full(options.num_jobs, -1), 0.0, np.zeros(num_rows), "priced")
    dual = _Dual(options)
    prices, bound = dual.minimise(iterations)
    best, second, pick = dual.choices(prices)
    # How clearly each job prefers its best option (nothing included) to the next.
    margin = np.where(pick >= 0, best - second, -best)
    margin[dual.absent] = np.inf  # jobs without options: nothing to decide
    order = np.sort(margin)
    delta = order[min(marginal, order.size - 1)]
    while True:
        free_jobs = margin <= delta
        fixed = np.where(free_jobs, -1, pick)
        used = options.usage(fixed)
        if (used <= options.capacity + _TOL).all() or free_jobs.all():
            break
        # Free about `marginal` more jobs (at least double the margin) and try again.
        above = order[order > delta]
        delta = (
            max(2 * delta, float(above[min(marginal, above.size - 1)])) if above.size else np.inf
        )
    rest = np.nonzero(free_jobs & ~dual.absent)[0]
    picked = np.where(free_jobs, -1, pick)
    if rest.size:
        sub, ids = options.subset(rest, np.maximum(options.capacity - used, 0.0))
        inner, _, _ = _lp_round(sub)
        inner = improve(sub, inner, sweeps=2)
        on = inner >= 0
        picked[rest[on]] = ids[inner[on]]
    return _answer(options, picked, bound, prices, "priced")


class _Dual:
    """D(λ) = Σ_j max(0, max_e gain_e − λ·use_e) + λ·capacity, an upper bound for any λ ≥ 0."""

    def __init__(self, options: Options) -> None:
        """The dual of `options` (which has at least one entry)."""
        self.options = options
        self.starts = np.nonzero(np.r_[True, np.diff(options.job) != 0])[0]
        self.owner = options.job[self.starts]
        self.absent = np.ones(options.num_jobs, dtype=bool)
        self.absent[self.owner] = False
        self.top = float(np.max(options.gain / options.gpus)) + 1.0

    def reduced(self, prices: FloatArray) -> FloatArray:
        """Each entry's gain less its GPUs at `prices`."""
        o = self.options
        if o.rows.shape[1] == 1:
            return np.asarray(o.gain - o.gpus * prices[o.rows[:, 0]], dtype=np.float64)
        return np.asarray(o.gain - o.gpus * prices[o.rows].sum(axis=1), dtype=np.float64)

    def evaluate(self, prices: FloatArray) -> tuple[float, FloatArray]:
        """D(λ) and a subgradient (capacity − demand of each job's best entry)."""
        v = self.reduced(prices)
        best = np.maximum.reduceat(v, self.starts)
        chosen = self._first_best(v, best)
        demand = self.options.usage(chosen)
        value = float(np.maximum(best, 0.0).sum() + prices @ self.options.capacity)
        return value, self.options.capacity - demand

    def _first_best(self, v: FloatArray, best: FloatArray) -> IntArray:
        """Per job, its first entry of best reduced gain if that is > 0, else −1."""
        o = self.options
        best_of_entry = np.full(o.num_jobs, -np.inf)
        best_of_entry[self.owner] = best
        hit = np.nonzero((v >= best_of_entry[o.job]) & (v > 0))[0]
        picked = np.full(o.num_jobs, -1, dtype=np.int64)
        jobs, first = np.unique(o.job[hit], return_index=True)
        picked[jobs] = hit[first]
        return picked

    def start(self, sample: int = 200) -> FloatArray:
        """Prices to start from: the row duals of the LP of an even sample of the jobs.

        The sample gets the same fraction of every row's GPUs as of the jobs.
        """
        o = self.options
        jobs = self.owner
        if jobs.size <= sample:
            return np.zeros(o.capacity.size)
        chosen = jobs[np.linspace(0, jobs.size - 1, sample).round().astype(np.int64)]
        sub, _ = o.subset(np.unique(chosen), o.capacity * (sample / jobs.size))
        res = linprog(
            -sub.gain, A_ub=sub.matrix(), b_ub=sub.bounds(), bounds=(0, 1), method="highs"
        )
        if res.status != 0:
            return np.zeros(o.capacity.size)
        duals = -np.asarray(res.ineqlin.marginals)[sub.num_jobs :]
        return np.asarray(np.clip(duals, 0.0, self.top), dtype=np.float64)

    def minimise(self, iterations: int, tolerance: float = 1e-5) -> tuple[FloatArray, float]:
        """Prices of (nearly) least D, and D there, by box-step cutting planes.

        Kelley's cutting planes in a box around the best prices so far, from `start`.
        Stops when the cutting-plane model proves no price in the box lowers D by more than
        `tolerance` of D (a convex function's local optimum is global), or after
        `iterations` evaluations. D at the prices returned is an upper bound either way.
        """
        rows = self.options.capacity.size
        center = self.start()
        best, sub = self.evaluate(center)
        cuts_a: list[FloatArray] = [np.r_[-1.0, sub]]
        cuts_b: list[float] = [float(sub @ center - best)]
        step = 0.25 * float(center.max(initial=0.0)) + 1e-3 * self.top
        for _ in range(iterations):
            lo = np.maximum(center - step, 0.0)
            hi = np.minimum(center + step, self.top)
            res = linprog(
                np.r_[1.0, np.zeros(rows)],
                A_ub=np.array(cuts_a),
                b_ub=np.array(cuts_b),
                bounds=[(None, None), *zip(lo.tolist(), hi.tolist(), strict=True)],
                method="highs",
            )
            if res.status != 0 or res.x is None:
                break
            prices, model = np.asarray(res.x[1:]), float(res.fun)
            if best - model <= tolerance * max(1.0, abs(best)):
                break
            value, sub = self.evaluate(prices)
            cuts_a.append(np.r_[-1.0, sub])
            cuts_b.append(float(sub @ prices - value))
            if value < best - 0.1 * (best - model):  # a serious step: move the box
                at_edge = np.any((prices <= lo + 1e-12) & (lo > 0)) or np.any(prices >= hi - 1e-12)
                center, best = prices, value
                if at_edge:
                    step *= 2.0
            else:
                step *= 0.7
        return center, best

    def choices(self, prices: FloatArray) -> tuple[FloatArray, FloatArray, IntArray]:
        """Per job at `prices`: best and second-best reduced gain (≥ 0: none), best entry."""
        o = self.options
        v = self.reduced(prices)
        best_s = np.maximum.reduceat(v, self.starts)
        pick = self._first_best(v, best_s)
        v2 = v.copy()
        v2[pick[pick >= 0]] = -np.inf
        second_s = np.maximum.reduceat(v2, self.starts)
        best = np.full(o.num_jobs, -np.inf)
        second = np.zeros(o.num_jobs)
        best[self.owner] = best_s
        second[self.owner] = np.maximum(second_s, 0.0)
        return best, second, pick


# -- exact ------------------------------------------------------------------------------------


def exact(options: Options, *, time_limit: float = 60.0, gap: float = 1e-9) -> Assignment:
    """The integer programme by HiGHS' branch and bound (for tests and benchmarks)."""
    picked = np.full(options.num_jobs, -1, dtype=np.int64)
    rows = options.capacity.size
    if options.size == 0:
        return _answer(options, picked, 0.0, np.zeros(rows), "exact")
    res = milp(
        -options.gain,
        constraints=LinearConstraint(options.matrix(), -np.inf, options.bounds()),
        integrality=np.ones(options.size),
        bounds=Bounds(0, 1),
        options={"mip_rel_gap": gap, "time_limit": time_limit},
    )
    if res.x is None:
        raise RuntimeError(f"the MILP solver found no solution: {res.message}")
    on = np.nonzero(np.asarray(res.x) > 0.5)[0]
    picked[options.job[on]] = on
    bound = float(getattr(res, "mip_dual_bound", np.nan))
    bound = -bound if np.isfinite(bound) else options.value(picked)
    return _answer(options, picked, bound, np.zeros(rows), "exact")
