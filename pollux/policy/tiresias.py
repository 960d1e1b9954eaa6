"""Tiresias, the baseline that runs fixed-size jobs by least attained service (reference §6.2).

Discretised 2D least-attained-service: jobs keep their chosen GPUs and batch size, priority
falls past a fixed GPU time; the queues travel in `TiresiasMemory`. A round, at `state.now`:

1. Forget finished jobs; new jobs join the end of queue 0, pending.
2. Running jobs accrue executed time; a queue-0 job that has used `queue_threshold`
   GPU-seconds moves to the end of queue 1 (starvation promotion is off, as published).
3. Walk queue 0 then queue 1 counting free GPUs over the whole cluster: a job that fits runs,
   one that does not waits and loses its GPUs; smaller later jobs may backfill. With several
   users in the round each queue is walked round-robin over them (`pollux.policy.owners`),
   so one user's backlog cannot queue ahead of every other user's jobs.
4. Running jobs keep their nodes; the others take GPUs from the nodes with the most free.
Deterministic: the random generator is not needed.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pollux.policy.allocation import canonical, gpus, place_on_freest, validate_state
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
)


class TiresiasStatus(enum.Enum):
    """Whether Tiresias let a job run in the last round."""

    PENDING = "pending"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class TiresiasJob:
    """What Tiresias remembers about one job.

    Attributes:
        status: Whether it was admitted last round (it runs until the next one).
        executed_time: Seconds it has spent running; times its GPU demand this is the
            attained service that decides its queue.
    """

    status: TiresiasStatus
    executed_time: float


@dataclass(frozen=True, slots=True)
class TiresiasMemory:
    """Tiresias's queues, passed from one round to the next as `AllocationDecision.memory`.

    Attributes:
        queue_0: Names of high-priority jobs, first come first served.
        queue_1: Names of jobs demoted after `queue_threshold` GPU-seconds, in demotion order.
        jobs: Every queued job's entry (read-only).
        last_check_time: The previous round's time; running jobs accrue the time since.

    Raises:
        PolicyInputError: The queues and `jobs` do not name the same jobs, each once.
    """

    queue_0: tuple[str, ...]
    queue_1: tuple[str, ...]
    jobs: Mapping[str, TiresiasJob]
    last_check_time: float

    def __post_init__(self) -> None:
        queued = self.queue_0 + self.queue_1
        if len(set(queued)) != len(queued) or set(queued) != set(self.jobs):
            raise PolicyInputError("memory", "queues and jobs must name the same jobs, each once")

    def queue_of(self, name: str) -> int:
        """0 or 1: the queue holding the job."""
        return 0 if name in self.queue_0 else 1


@dataclass(frozen=True, slots=True)
class TiresiasPolicy:
    """Two-queue discretised 2D-LAS (see the module docstring).

    Its objective is NaN: Tiresias is a priority discipline and optimises no scalar.

    Attributes:
        queue_threshold: GPU-seconds of service after which a job drops to queue 1; the
            published value is 16 GPU-hours. `math.inf` never demotes (plain FIFO + backfill).
        user_fairness: Walk each queue round-robin over the jobs' owners; False (an
            ablation): in queue order, whoever owns the jobs.

    Raises:
        PolicyInputError: `queue_threshold` is not > 0.
    """

    queue_threshold: float = 3600 * 16
    user_fairness: bool = True

    def __post_init__(self) -> None:
        if not self.queue_threshold > 0:
            raise PolicyInputError("queue_threshold", f"must be > 0, got {self.queue_threshold}")

    @property
    def name(self) -> str:
        """The registry name."""
        return "tiresias"

    @property
    def sizing(self) -> JobSizing:
        """Each job runs at its own GPU count and batch size."""
        return JobSizing.FIXED

    @property
    def exploration(self) -> Exploration:
        """Pollux's rule (unused: this policy's jobs do not explore, their sizes are fixed)."""
        return FAITHFUL

    @property
    def needs_oracle(self) -> bool:
        """Tiresias needs no knowledge of a job beyond its GPU demand."""
        return False

    @property
    def objective_text(self) -> str:
        """Empty: a priority discipline, it optimises no objective."""
        return ""

    @property
    def explain_params(self) -> None:
        """None: Explain evaluates speedups with Pollux's default parameters."""
        return None

    def replica_limit(self, profiled: int, held: int, cap: int) -> int:
        """`cap`: a job's size is its own (`JobInfo.target_replicas`), not explored."""
        return max(1, cap)

    def allocate(
        self, state: ClusterState, memory: TiresiasMemory | None, rng: np.random.Generator
    ) -> AllocationDecision[TiresiasMemory]:
        """Choose every job's allocation for this round.

        Args:
            state: The round's snapshot; `state.now` is the event time.
            memory: The `TiresiasMemory` this policy returned last round, or None at first.
            rng: Unused.

        Raises:
            PolicyInputError: The state is invalid, a job has no `target_replicas`, or
                `state.now` is before the previous round.
        """
        validate_state(state)
        demands = {job.name: demand(job) for job in state.jobs}
        aged = age(recall(memory, state.now), state, demands, self.queue_threshold)
        # No step 3: starvation promotion is off in the published configuration (§6.2 step 3).
        walk = by_owner(aged, state) if self.user_fairness else None
        admitted, free_seen = admit(aged, demands, sum(node.gpus for node in state.nodes), walk)
        allocations = place(state, admitted, demands)
        return AllocationDecision(
            allocations=allocations,
            explain={
                job.name: explain(job, allocations[job.name], admitted, free_seen[job.name])
                for job in state.jobs
            },
            objective=math.nan,
            memory=admitted,
        )


def demand(job: JobInfo) -> int:
    """The fixed GPU count the job always runs at.

    Raises:
        PolicyInputError: The job has no `target_replicas`.
    """
    if job.target_replicas is None:
        raise PolicyInputError(
            f"jobs[{job.name}].target_replicas", "Tiresias runs jobs at a fixed GPU count"
        )
    return job.target_replicas


def recall(memory: TiresiasMemory | None, now: float) -> TiresiasMemory:
    """Last round's memory, or empty queues on the first round.

    Raises:
        PolicyInputError: `now` precedes the memory's time.
    """
    if memory is None:
        return TiresiasMemory(queue_0=(), queue_1=(), jobs={}, last_check_time=now)
    if now < memory.last_check_time:
        raise PolicyInputError(
            "now", f"{now} is before the previous round's time {memory.last_check_time}"
        )
    return memory


def age(
    memory: TiresiasMemory, state: ClusterState, demands: Mapping[str, int], threshold: float
) -> TiresiasMemory:
    """Drop finished jobs, enqueue new ones, accrue service, demote (reference §6.2 steps 1-2)."""
    elapsed = state.now - memory.last_check_time
    jobs = {
        name: replace(entry, executed_time=entry.executed_time + elapsed)
        if entry.status is TiresiasStatus.RUNNING
        else entry
        for name, entry in memory.jobs.items()
        if name in demands
    }
    queue_0 = [name for name in memory.queue_0 if name in demands]
    queue_1 = [name for name in memory.queue_1 if name in demands]
    for job in state.jobs:
        if job.name not in jobs:
            jobs[job.name] = TiresiasJob(TiresiasStatus.PENDING, executed_time=0.0)
            queue_0.append(job.name)
    demoted = [n for n in queue_0 if jobs[n].executed_time * demands[n] >= threshold]
    return TiresiasMemory(
        queue_0=tuple(n for n in queue_0 if n not in demoted),
        queue_1=(*queue_1, *demoted),
        jobs=jobs,
        last_check_time=state.now,
    )


def by_owner(memory: TiresiasMemory, state: ClusterState) -> tuple[str, ...]:
    """Queue 0 then queue 1, each in `turns` order over the owners of its jobs."""
    owner = dict(zip((job.name for job in state.jobs), owners_of(state), strict=True))
    walk: list[str] = []
    for queue in (memory.queue_0, memory.queue_1):
        walk += [queue[i] for i in turns([owner[name] for name in queue])]
    return tuple(walk)


def admit(
    memory: TiresiasMemory,
    demands: Mapping[str, int],
    total: int,
    walk: Sequence[str] | None = None,
) -> tuple[TiresiasMemory, dict[str, int]]:
    """Run every job whose demand fits the GPUs left, in queue order (reference §6.2 step 4).

    `walk`: the queued jobs in the order their turns come (default: queue 0, then queue 1).

    Returns:
        The memory with each job's new status, and the free GPUs each job saw when its turn
        came (for the explanation of a pending job).
    """
    free = total
    free_seen: dict[str, int] = {}
    jobs: dict[str, TiresiasJob] = {}
    for name in memory.queue_0 + memory.queue_1 if walk is None else walk:
        free_seen[name] = free
        fits = demands[name] <= free
        free -= demands[name] if fits else 0
        status = TiresiasStatus.RUNNING if fits else TiresiasStatus.PENDING
        jobs[name] = replace(memory.jobs[name], status=status)
    return replace(memory, jobs=jobs), free_seen


def place(
    state: ClusterState, memory: TiresiasMemory, demands: Mapping[str, int]
) -> dict[str, Allocation]:
    """Running jobs keep their nodes; the rest pack freest-first in queue order (§6.2 step 5).

    A running job whose current allocation is not exactly its demand is placed afresh.
    """
    order = [node.name for node in state.nodes]
    free = {node.name: node.gpus for node in state.nodes}
    current = {job.name: job.allocation for job in state.jobs}
    allocations: dict[str, Allocation] = {job.name: () for job in state.jobs}
    running = [
        name
        for name in memory.queue_0 + memory.queue_1
        if memory.jobs[name].status is TiresiasStatus.RUNNING
    ]
    unplaced = []
    for name in running:
        if len(current[name]) == demands[name]:
            allocations[name] = canonical(current[name], order)
            for node in current[name]:
                free[node] -= 1
        else:
            unplaced.append(name)
    for name in unplaced:
        allocations[name] = place_on_freest(demands[name], free, order)
    return allocations


def explain(
    job: JobInfo, allocation: Allocation, memory: TiresiasMemory, free_seen: int
) -> JobExplain:
    """Why the job got `allocation`, with the GPU count standing in for its speedup."""
    queue = memory.queue_of(job.name)
    old, new = len(job.allocation), len(allocation)
    if memory.jobs[job.name].status is TiresiasStatus.PENDING:
        verb = "preempted" if old else "pending"
        reason = f"{verb}: queue {queue}, needs {gpus(demand(job))}, {free_seen} free"
    elif old == new:
        reason = f"unchanged (queue {queue})"
    elif old == 0:
        reason = f"started on {gpus(new)} (queue {queue})"
    else:
        reason = f"scaled {old} → {gpus(new)} to match target_replicas (queue {queue})"
    return JobExplain(speedup=float(new), penalty=1.0, reason=reason)
