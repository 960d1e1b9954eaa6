"""Optimus+Oracle, the baseline that sizes jobs by marginal gain in remaining time (ref. §6.1).

Each job's true step time at every replica count and its true remaining iterations (in the
simulator; live, predicted from its fitted model) stand in for fitted models. The batch size
stays fixed; only GPU counts adapt. The round has two phases:

1. **Counts.** Every job, in submission order, gets one GPU while any remain (with several
   users in the round, in round-robin order over them: `pollux.policy.owners`); then, one
   GPU at a time, the job whose estimated remaining time drops most,
   (T(K) − T(K+1)) × remaining, gets another, until no GPU is left or no job gains.
2. **Placement.** Jobs whose count did not change keep their nodes; the others are placed in
   increasing count, each on the nodes with the most free GPUs (no interference avoidance).

Both phases are deterministic (ties go to the earlier job and node in the snapshot's order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pollux.policy.allocation import (
    canonical,
    gpus,
    place_on_freest,
    validate_state,
)
from pollux.policy.exploration import FAITHFUL, Exploration
from pollux.policy.owners import owners_of, turns
from pollux.policy.params import PolicyInputError
from pollux.policy.types import (
    Allocation,
    AllocationDecision,
    ClusterState,
    JobExplain,
    JobInfo,
    JobSizing,
    OracleInfo,
)


@dataclass(frozen=True, slots=True)
class OptimusPolicy:
    """Optimus with oracle step times and remaining work (see the module docstring).

    It keeps no memory between rounds (`AllocationDecision.memory` is None) and ignores the
    `memory` and `rng` it is given. Its objective is the estimated total remaining seconds of
    the jobs it gives GPUs, Σ remaining_j × T(K_j), which the count phase greedily lowers;
    jobs left without GPUs are excluded, since their remaining time is unbounded.

    Attributes:
        user_fairness: Hand out the first GPUs round-robin over the jobs' owners, so one
            user's backlog cannot hold every GPU; False (an ablation): in submission order.
    """

    user_fairness: bool = True

    @property
    def name(self) -> str:
        """The registry name."""
        return "optimus"

    @property
    def sizing(self) -> JobSizing:
        """GPU counts adapt; each job keeps its own batch size."""
        return JobSizing.FIXED_BATCH

    @property
    def exploration(self) -> Exploration:
        """Pollux's rule: live, step times come from a model fitted on what a job has run."""
        return FAITHFUL

    @property
    def needs_oracle(self) -> bool:
        """Every job carries its step times and remaining iterations (`OracleInfo`)."""
        return True

    @property
    def objective_text(self) -> str:
        """Empty: it trades GPUs by remaining time, not by speedup (Explain shows none)."""
        return ""

    @property
    def explain_params(self) -> None:
        """None: Explain evaluates speedups with Pollux's default parameters."""
        return None

    def replica_limit(self, profiled: int, held: int, cap: int) -> int:
        """The exploration limit within `cap`: a predicted oracle is trusted that far only.

        In the simulator the oracle is the truth and jobs are bounded by their batch alone;
        live it is predicted from the job's fitted model, as far as it has measured.
        """
        return max(1, min(cap, self.exploration.limit(profiled, held)))

    def allocate(
        self, state: ClusterState, memory: None, rng: np.random.Generator
    ) -> AllocationDecision[None]:
        """Choose every job's allocation for this round.

        Raises:
            PolicyInputError: The state is invalid, or a job lacks a usable oracle.
        """
        validate_state(state)
        oracles = [checked_oracle(job) for job in state.jobs]
        total = sum(node.gpus for node in state.nodes)
        order = turns(owners_of(state)) if self.user_fairness else None
        counts = choose_counts(state.jobs, oracles, total, order)
        allocations = place(state, counts)
        return AllocationDecision(
            allocations=allocations,
            explain={job.name: explain(job, allocations[job.name]) for job in state.jobs},
            objective=remaining_time(oracles, counts),
        )


def checked_oracle(job: JobInfo) -> OracleInfo:
    """The job's oracle, after checking it can price every replica count it covers.

    Raises:
        PolicyInputError: The oracle is missing, covers no replica count, or holds a
            non-finite, non-positive step time or a negative remaining count.
    """
    where = f"jobs[{job.name}].oracle"
    oracle = job.oracle
    if oracle is None:
        raise PolicyInputError(where, "Optimus+Oracle needs step times and remaining iterations")
    step_time = oracle.step_time
    if step_time.ndim != 1 or step_time.size < 2:
        raise PolicyInputError(
            f"{where}.step_time", "must be 1-D and cover at least K = 1 (entry 0 is unused)"
        )
    if not np.all(np.isfinite(step_time[1:]) & (step_time[1:] > 0)):
        raise PolicyInputError(f"{where}.step_time", "entries 1.. must be finite and > 0")
    if not (math.isfinite(oracle.remaining_iterations) and oracle.remaining_iterations >= 0):
        raise PolicyInputError(
            f"{where}.remaining_iterations",
            f"must be finite and ≥ 0, got {oracle.remaining_iterations}",
        )
    return oracle


def choose_counts(
    jobs: Sequence[JobInfo],
    oracles: Sequence[OracleInfo],
    total: int,
    order: Sequence[int] | None = None,
) -> list[int]:
    """GPU count of each job: one each in arrival order, then greedy marginal gain (§6.1).

    `order`: the positions of `jobs` in the order the first GPUs go (default: as given). A
    job with max_replicas 0 is never started, so that max_replicas is always respected.
    """
    counts = [0] * len(jobs)
    free = total
    for j in range(len(jobs)) if order is None else order:
        first = min(1, free, jobs[j].max_replicas)
        counts[j] = first
        free -= first
    gains = [gain(job, oracle, k) for job, oracle, k in zip(jobs, oracles, counts, strict=True)]
    while free > 0 and gains and max(gains) > 0:
        best = gains.index(max(gains))  # first maximum: ties go to the earlier job
        counts[best] += 1
        free -= 1
        gains[best] = gain(jobs[best], oracles[best], counts[best])
    return counts


def gain(job: JobInfo, oracle: OracleInfo, k: int) -> float:
    """Drop in estimated remaining seconds from a (k+1)-th GPU; 0 where none may be added.

    A job without a GPU (k = 0) gains nothing here: it waits for the next round's first pass.
    """
    if k == 0 or k + 1 > job.max_replicas or k + 1 >= oracle.step_time.size:
        return 0.0
    return float(oracle.step_time[k] - oracle.step_time[k + 1]) * oracle.remaining_iterations


def place(state: ClusterState, counts: Sequence[int]) -> dict[str, Allocation]:
    """Allocations for the chosen counts: unchanged counts stay put, the rest pack freest-first.

    Kept allocations are returned in canonical order (the same nodes, so no restart).
    """
    order = [node.name for node in state.nodes]
    free = {node.name: node.gpus for node in state.nodes}
    allocations: dict[str, Allocation] = {job.name: () for job in state.jobs}
    moved = []
    for j, (job, k) in enumerate(zip(state.jobs, counts, strict=True)):
        if k == len(job.allocation):
            allocations[job.name] = canonical(job.allocation, order)
            for node in job.allocation:
                free[node] -= 1
        else:
            moved.append((k, j))
    for k, j in sorted(moved):  # increasing count, ties in job order (reference §6.1)
        allocations[state.jobs[j].name] = place_on_freest(k, free, order)
    return allocations


def explain(job: JobInfo, allocation: Allocation) -> JobExplain:
    """Why the job got `allocation`, with the GPU count standing in for its speedup."""
    old, new = len(job.allocation), len(allocation)
    if new == 0 and job.max_replicas == 0:
        reason = "pending: max_replicas is 0"
    elif new == old:
        reason = "unchanged" if new else "pending: every GPU went to earlier jobs"
    elif new == 0:
        reason = "preempted: every GPU went to earlier jobs"
    elif old == 0:
        reason = f"started on {gpus(new)}"
    else:
        reason = f"scaled {old} → {gpus(new)}"
    return JobExplain(speedup=float(new), penalty=1.0, reason=reason)


def remaining_time(oracles: Sequence[OracleInfo], counts: Sequence[int]) -> float:
    """Σ remaining_j × T(K_j) over the jobs with GPUs: the objective the count phase lowers."""
    return sum(
        (
            o.remaining_iterations * float(o.step_time[k])
            for o, k in zip(oracles, counts, strict=True)
            if k
        ),
        0.0,
    )
