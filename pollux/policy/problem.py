"""One Pollux scheduling round as arrays: jobs × nodes, speedups, penalties, utilities.

`Problem` is what every Pollux optimiser works on (the greedy solver in `greedy.py`, the
published NSGA-II in `nsga2.py`), so that they differ only in how they search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pollux.policy.types import (
    AllocationDecision,
    ClusterState,
    JobExplain,
    PolicyInputError,
)
from pollux.policy.valuation import (
    Normalisation,
    fair_share,
    power_mean,
    restart_factor,
    speedups_for,
    utility,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PolluxParams:
    """Knobs of the Pollux objective; the defaults are the published configuration.

    Attributes:
        p: Exponent of the power mean over job speedups: -1 (default) is the paper's fairness
            trade-off, 1 maximises total speedup, very negative approaches max-min fairness.
        restart_delay: Seconds a re-allocation costs, for the restart factor; 0 disables it.
        normalisation: What speedup 1.0 means (see `Normalisation`).
        interference_avoidance: At most one distributed job per node.
        max_nodes_per_job: Most nodes one job may span (the artifact uses 16); None: no cap.
        epsilon: Offset added to scaled speedups so a job without GPUs weighs 1/epsilon.
    """

    p: float = -1.0
    restart_delay: float = 30.0
    normalisation: Normalisation = Normalisation.FAIR_SHARE
    interference_avoidance: bool = True
    max_nodes_per_job: int | None = 16
    epsilon: float = 1e-3

    def __post_init__(self) -> None:
        if not math.isfinite(self.p):
            raise PolicyInputError("params.p", f"must be finite, got {self.p}")
        if self.restart_delay < 0:
            raise PolicyInputError("params.restart_delay", "must be ≥ 0")
        if self.max_nodes_per_job is not None and self.max_nodes_per_job < 1:
            raise PolicyInputError("params.max_nodes_per_job", "must be ≥ 1 or None")
        if not self.epsilon > 0:
            raise PolicyInputError("params.epsilon", "must be > 0")


class Problem:
    """One round's optimisation problem as arrays: jobs × nodes, speedups, penalties."""

    def __init__(self, state: ClusterState, params: PolluxParams) -> None:
        self.state = state
        self.params = params
        self.node_names = [n.name for n in state.nodes]
        index = {name: i for i, name in enumerate(self.node_names)}
        self.capacity = np.array([n.gpus for n in state.nodes], dtype=np.int64)
        self.num_jobs = len(state.jobs)
        self.total_gpus = int(self.capacity.sum())
        self.gpus_per_node = int(self.capacity.max()) if self.capacity.size else 0
        node_cap = params.max_nodes_per_job or len(self.node_names)
        self.max_nodes = max(1, min(node_cap, len(self.node_names)))

        self.current = np.zeros((self.num_jobs, len(self.node_names)), dtype=np.int64)
        for j, job in enumerate(state.jobs):
            for name in job.allocation:
                self.current[j, index[name]] += 1
        self.max_k = np.array(
            [
                min(job.max_replicas, self.total_gpus, self.max_nodes * self.gpus_per_node)
                for job in state.jobs
            ],
            dtype=np.int64,
        )
        self.min_k = np.array([job.min_replicas for job in state.jobs], dtype=np.int64)
        self.penalty = np.array(
            [
                restart_factor(state.now - job.submission_time, job.restarts, params.restart_delay)
                for job in state.jobs
            ]
        )
        if params.normalisation is Normalisation.FAIR_SHARE:
            base = fair_share(self.num_jobs, len(self.node_names), self.total_gpus)
            # Artifact: a dominant share equal to one node's worth gives speedup 1.
            self.scale = len(self.node_names) / max(self.total_gpus, 1)
        else:
            base, self.scale = (1, 1), 1.0
        self.speedup = speedups_for(
            state.jobs,
            base_nodes=base[0],
            base_replicas=base[1],
            max_nodes=self.max_nodes,
            consolidate=self.consolidated_nodes,
        )

    # -- valuation -----------------------------------------------------------------------

    def values(self, j: int, rows: IntArray) -> FloatArray:
        """Utility w_p of job j under each candidate row (nodes vector) of `rows`."""
        rows = np.atleast_2d(rows)
        k = rows.sum(axis=1)
        n = (rows > 0).sum(axis=1)
        speed = np.zeros(k.shape)
        some = k > 0
        if some.any():
            speed[some] = self.speedup[j](n[some], k[some])
        changed = (rows != self.current[j]).any(axis=1)
        factor = np.where(changed, self.penalty[j], 1.0)
        return utility(self.scale * speed * factor + self.params.epsilon, self.params.p)

    def utilities(self, placed: IntArray) -> FloatArray:
        """Utility w_p of every job under a whole jobs × nodes matrix."""
        k = placed.sum(axis=1)
        n = (placed > 0).sum(axis=1)
        speed = np.array(
            [
                self.speedup[j].at(int(n[j]), int(k[j])) if k[j] else 0.0
                for j in range(self.num_jobs)
            ]
        )
        changed = (placed != self.current).any(axis=1)
        factor = np.where(changed, self.penalty, 1.0)
        return utility(self.scale * speed * factor + self.params.epsilon, self.params.p)

    def consolidated_nodes(self, k: IntArray) -> IntArray:
        """Fewest nodes that can hold k replicas (at least 1 for k > 0)."""
        return np.maximum(1, -(-k // max(self.gpus_per_node, 1)))

    def is_distributed(self, row: IntArray) -> bool:
        """Whether a row spans more than one node."""
        return int(np.count_nonzero(row)) > 1

    # -- result --------------------------------------------------------------------------

    def decision(self, placed: IntArray) -> AllocationDecision:
        """Turn the final jobs × nodes matrix into allocations and explanations."""
        allocations, explain, xs = {}, {}, []
        for j, job in enumerate(self.state.jobs):
            row = placed[j]
            used = np.nonzero(row)[0]  # ascending: node order, replicas of a node adjacent
            alloc = tuple(self.node_names[i] for i in used for _ in range(int(row[i])))
            k, n = int(row.sum()), int(np.count_nonzero(row))
            speed = float(self.speedup[j](np.array([n]), np.array([k]))[0]) if k else 0.0
            changed = bool((row != self.current[j]).any())
            factor = float(self.penalty[j]) if changed else 1.0
            xs.append(self.scale * speed * factor + self.params.epsilon)
            allocations[job.name] = alloc
            explain[job.name] = JobExplain(
                speedup=speed, penalty=factor, reason=self._reason(j, row, changed)
            )
        objective = power_mean(np.array(xs), self.params.p)
        return AllocationDecision(allocations=allocations, explain=explain, objective=objective)

    def _reason(self, j: int, row: IntArray, changed: bool) -> str:
        k_old, k_new = int(self.current[j].sum()), int(row.sum())
        n_new = int(np.count_nonzero(row))
        if k_new == 0 and changed:
            reason = f"suspended: its {k_old} GPUs are worth more to other jobs"
        elif k_new == 0:
            reason = (
                "pending: max_replicas is 0"
                if self.max_k[j] == 0
                else "pending: every free GPU is worth more to other jobs"
            )
        elif not changed:
            reason = f"unchanged: {k_new} GPUs on {n_new} node(s)"
        elif k_old == 0:
            reason = f"started on {k_new} GPUs across {n_new} node(s)"
        elif k_old != k_new:
            reason = f"scaled {k_old} → {k_new} GPUs ({n_new} node(s))"
        else:
            reason = f"re-placed: {k_new} GPUs now on {n_new} node(s)"
        return reason
