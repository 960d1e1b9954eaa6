"""One Pollux scheduling round as arrays: jobs × nodes, speedups, penalties, utilities.

`Problem` is what a Pollux optimiser searches (the greedy solver in `greedy.py`; the
published NSGA-II in benchmarks/nsga2.py). It is immutable: the policy builds it once from
the round's state and derives a re-weighted one (`weighted`) from it, never changing it in
place; its arrays are read-only. Job weights are the product of named factors
(`pollux.policy.weights`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from pollux.policy.params import Normalisation, PolluxParams
from pollux.policy.types import (
    AllocationDecision,
    ClusterState,
    JobExplain,
)
from pollux.policy.valuation import (
    Speedups,
    fair_share,
    power_mean,
    restart_factor,
    speedups_for,
    utility,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Problem:
    """One round's optimisation problem as arrays: jobs × nodes, speedups, penalties.

    Attributes (read-only, as every other one):
        penalty: Each job's restart factor, in [0, 1] (faithful Pollux's, unless `weighted`
            replaced it).
        reference: (nodes, replicas) of the allocation whose goodput is speedup 1.0.
        weight: Each job's utility weight (`pollux.policy.weights`); None: every job alike.
    """

    __slots__ = (
        "capacity",
        "current",
        "current_k",
        "current_spans",
        "every_job",
        "gpus_per_node",
        "max_k",
        "max_nodes",
        "min_k",
        "node_names",
        "num_jobs",
        "params",
        "penalty",
        "reference",
        "scale",
        "speedup",
        "speedups",
        "state",
        "total_gpus",
        "weight",
    )

    state: ClusterState
    params: PolluxParams
    node_names: list[str]
    capacity: IntArray
    num_jobs: int
    total_gpus: int
    gpus_per_node: int
    max_nodes: int
    current: IntArray
    max_k: IntArray
    min_k: IntArray
    penalty: FloatArray
    reference: tuple[int, int]
    scale: float
    current_k: IntArray
    current_spans: IntArray
    speedups: Speedups
    speedup: Any
    every_job: IntArray
    weight: FloatArray | None

    def __init__(self, state: ClusterState, params: PolluxParams) -> None:
        init = _Init(self)
        init.state = state
        init.params = params
        init.node_names = [n.name for n in state.nodes]
        index = {name: i for i, name in enumerate(self.node_names)}
        init.capacity = np.array([n.gpus for n in state.nodes], dtype=np.int64)
        init.num_jobs = len(state.jobs)
        init.total_gpus = int(self.capacity.sum())
        init.gpus_per_node = int(self.capacity.max()) if self.capacity.size else 0
        node_cap = params.max_nodes_per_job or len(self.node_names)
        init.max_nodes = max(1, min(node_cap, len(self.node_names)))

        current = np.zeros((self.num_jobs, len(self.node_names)), dtype=np.int64)
        for j, job in enumerate(state.jobs):
            for name in job.allocation:
                current[j, index[name]] += 1
        init.current = current
        init.max_k = np.array(
            [
                min(job.max_replicas, self.total_gpus, self.max_nodes * self.gpus_per_node)
                for job in state.jobs
            ],
            dtype=np.int64,
        )
        init.min_k = np.array([job.min_replicas for job in state.jobs], dtype=np.int64)
        init.penalty = np.array(
            [
                restart_factor(state.now - job.submission_time, job.restarts, params.restart_delay)
                for job in state.jobs
            ]
        )
        if params.normalisation is Normalisation.FAIR_SHARE:
            base = fair_share(self.num_jobs, len(self.node_names), self.total_gpus)
            # Artifact: a dominant share equal to one node's worth gives speedup 1.
            init.scale = len(self.node_names) / max(self.total_gpus, 1)
        else:
            base, init.scale = (1, 1), 1.0
        init.reference = base
        init.current_k = current.sum(axis=1)
        init.current_spans = np.count_nonzero(current, axis=1)
        init.speedups = speedups_for(
            state.jobs,
            base_nodes=base[0],
            base_replicas=base[1],
            max_nodes=self.max_nodes,
            consolidate=self.consolidated_nodes,
        )
        init.speedup = self.speedups.jobs
        init.every_job = np.arange(self.num_jobs)
        init.weight = None

    @property
    def base(self) -> FloatArray:
        """Each job's goodput (without a model: replica count) of speedup 1, read-only."""
        return self.speedups.base

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Problem is immutable: derive one with weighted(), not .{name} =")

    def weighted(
        self, *, weight: FloatArray | None = None, penalty: FloatArray | None = None
    ) -> Problem:
        """This problem with job weights `weight` and, if given, restart factors `penalty`.

        The speedup tables are shared, not rebuilt: only the valuation changes.
        """
        out = object.__new__(Problem)
        for name in Problem.__slots__:
            object.__setattr__(out, name, getattr(self, name))
        init = _Init(out)
        init.weight = weight
        if penalty is not None:
            init.penalty = penalty
        return out

    # -- valuation -----------------------------------------------------------------------

    def values(self, j: int, rows: IntArray) -> FloatArray:
        """Utility w_p of job j under each candidate row (nodes vector) of `rows`."""
        rows = np.atleast_2d(rows)
        speed = self.speedup[j](np.count_nonzero(rows, axis=1), rows.sum(axis=1))
        changed = (rows != self.current[j]).any(axis=1)
        factor = np.where(changed, self.penalty[j], 1.0)
        values = utility(self.scale * speed * factor + self.params.epsilon, self.params.p)
        return values if self.weight is None else values * self.weight[j]

    def values_at(
        self,
        jobs: IntArray,
        nodes: IntArray,
        replicas: IntArray,
        changed: npt.NDArray[np.bool_],
        calls: IntArray | None = None,
    ) -> FloatArray:
        """Utility w_p of many (job, N, K), re-allocated where `changed`, in one evaluation.

        Equal to `values` row by row; `calls` groups the queries as `Speedups.lookup` does.
        """
        speed = self.speedups.lookup(jobs, nodes, replicas, calls)
        factor = np.where(changed, self.penalty[jobs], 1.0)
        values = utility(self.scale * speed * factor + self.params.epsilon, self.params.p)
        return values if self.weight is None else values * self.weight[jobs]

    def row_values(
        self, j: int, spans: list[int], sizes: list[int], changed: list[bool]
    ) -> FloatArray:
        """`values` of job j's rows, given by their (N, K) and whether each is changed.

        The placement phase values one or two rows per job; table reads and float arithmetic
        (the same operations, in the same order) cost less than passes over whole rows.
        """
        table = self.speedups.table(j)
        speed = [float(table[n, k]) for n, k in zip(spans, sizes, strict=True)]
        if any(math.isnan(x) for x in speed):
            speed = self.speedup[j](np.array(spans), np.array(sizes)).tolist()
        penalty, scale, eps = float(self.penalty[j]), self.scale, self.params.epsilon
        x = [scale * s * (penalty if c else 1.0) + eps for s, c in zip(speed, changed, strict=True)]
        values = utility(np.array(x), self.params.p)
        return values if self.weight is None else values * self.weight[j]

    def utilities(self, placed: IntArray) -> FloatArray:
        """Utility w_p of every job under a whole jobs × nodes matrix."""
        return self.row_utilities(self.every_job, placed)

    def row_utilities(self, jobs: IntArray, rows: IntArray) -> FloatArray:
        """Utility w_p of job ``jobs[i]`` under the nodes vector ``rows[i]``, for every i."""
        return self.values_at(
            jobs,
            np.count_nonzero(rows, axis=1),
            rows.sum(axis=1),
            (rows != self.current[jobs]).any(axis=1),
        )

    def consolidated_nodes(self, k: IntArray) -> IntArray:
        """Fewest nodes that can hold k replicas (at least 1 for k > 0)."""
        return np.maximum(1, -(-k // max(self.gpus_per_node, 1)))

    # -- result --------------------------------------------------------------------------

    def decision(self, placed: IntArray) -> AllocationDecision[Any]:
        """Turn the final jobs × nodes matrix into allocations and explanations."""
        allocations, explain, xs = {}, {}, []
        replicas = placed.sum(axis=1)
        spans = np.count_nonzero(placed, axis=1)
        speeds = self.speedups.lookup(self.every_job, spans, replicas).tolist()
        moved = (placed != self.current).any(axis=1).tolist()
        one_more = self._one_more(replicas)
        for j, job in enumerate(self.state.jobs):
            row = placed[j]
            used = np.nonzero(row)[0]  # ascending: node order, replicas of a node adjacent
            alloc = tuple(self.node_names[i] for i in used for _ in range(int(row[i])))
            speed, changed = speeds[j], moved[j]
            factor = float(self.penalty[j]) if changed else 1.0
            xs.append(self.scale * speed * factor + self.params.epsilon)
            allocations[job.name] = alloc
            reason = self._reason(j, int(replicas[j]), int(spans[j]), changed)
            if changed and replicas[j] < self.current_k[j]:
                reason += self._taken_by(j, placed)
            explain[job.name] = JobExplain(
                speedup=speed,
                penalty=factor,
                reason=reason,
                move_factor=float(self.penalty[j]),
                one_more=one_more.get(j),
                limit=int(self.max_k[j]),
                reference=self.reference,
            )
        objective = power_mean(np.array(xs), self.params.p)
        return AllocationDecision(allocations=allocations, explain=explain, objective=objective)

    def _one_more(self, replicas: IntArray) -> dict[int, float]:
        """Each job's speedup with one GPU more than `replicas`, within its limit.

        On the fewest nodes that hold them, as Explain's counterfactuals: what the round would
        have valued growing the job at (times its restart factor: growing is a move).
        """
        grow = replicas + 1
        jobs = np.nonzero(grow <= self.max_k)[0]
        if jobs.size == 0:
            return {}
        ks = grow[jobs]
        speeds = self.speedups.lookup(jobs, self.consolidated_nodes(ks), ks)
        return {int(j): float(v) for j, v in zip(jobs.tolist(), speeds.tolist(), strict=True)}

    def _taken_by(self, j: int, placed: IntArray) -> str:
        """``; its GPUs went to b (1 → 2 GPUs, speedup 1.0 → 1.8); its speedup 2.0 → 1.0``.

        Who gained from a shrink, and for what: the jobs now holding more of the nodes job `j`
        gave up, with their speedups and `j`'s before and after (the terms of the objective).
        """
        lost = np.nonzero(self.current[j] > placed[j])[0]
        gained = np.asarray((placed[:, lost] > self.current[:, lost]).any(axis=1), dtype=bool)
        gained[j] = False
        gainers = np.nonzero(gained)[0]
        if gainers.size == 0:
            return ""
        involved = np.concatenate(([j], gainers[:2]))
        new_k = placed[involved].sum(axis=1)
        after = self.speedups.lookup(involved, np.count_nonzero(placed[involved], axis=1), new_k)
        before = self.speedups.lookup(
            involved, self.current_spans[involved], self.current_k[involved]
        )
        names = [
            f"{self._called(i, j)} ({int(self.current_k[i])} → {_count(int(k), 'GPU')}, "
            f"speedup {b:.2g} → {a:.2g})"
            for i, k, b, a in zip(
                involved[1:].tolist(), new_k[1:].tolist(), before[1:], after[1:], strict=True
            )
        ]
        more = f" and {gainers.size - 2} more" if gainers.size > 2 else ""
        return (
            f"; its GPUs went to {', '.join(names)}{more}; its speedup "
            f"{before[0]:.2g} → {after[0]:.2g}"
        )

    def _called(self, i: int, j: int) -> str:
        """How job `j`'s reason names job `i`: its name, with its id where that is needed.

        By name (its `label`) when it is a job of `j`'s owner, with its id only if another
        such job shares the name; another user's job by id alone (its name is theirs).
        """
        other, me = self.state.jobs[i], self.state.jobs[j]
        if other.owner != me.owner:
            return f"another user's job {other.name}"
        label = other.label or other.name
        same = sum(1 for x in self.state.jobs if x.owner == me.owner and x.label == other.label)
        return f"{label} ({other.name})" if other.label and same > 1 else label

    def _reason(self, j: int, k_new: int, n_new: int, changed: bool) -> str:
        k_old = int(self.current_k[j])
        if k_new == 0 and changed:
            reason = f"suspended: its {k_old} GPUs are worth more to other jobs"
        elif k_new == 0:
            reason = (
                "pending: max_replicas is 0"
                if self.max_k[j] == 0
                else "pending: every free GPU is worth more to other jobs"
            )
        elif not changed:
            reason = f"unchanged: {_count(k_new, 'GPU')} on {_count(n_new, 'node')}"
        elif k_old == 0:
            reason = f"started on {_count(k_new, 'GPU')} across {_count(n_new, 'node')}"
        elif k_old != k_new:
            reason = f"scaled {k_old} → {k_new} GPU{'s' * (k_new != 1)} ({_count(n_new, 'node')})"
        else:
            reason = f"re-placed: {_count(k_new, 'GPU')} now on {_count(n_new, 'node')}"
        return reason


class _Init:
    """Sets a `Problem`'s attributes while it is built (and makes each array read-only)."""

    __slots__ = ("_target",)
    _target: Problem

    def __init__(self, target: Problem) -> None:
        object.__setattr__(self, "_target", target)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        object.__setattr__(self._target, name, value)


def _count(n: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``: what a person reads in a job's history."""
    return f"{n} {noun}{'s' if n != 1 else ''}"
