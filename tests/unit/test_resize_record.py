"""The scheduler keeps each job's resize record in its stored record and hands it to the policy."""

from __future__ import annotations

import numpy as np

from pollux.policy.types import AllocationDecision, ClusterState, JobExplain
from pollux.scheduler.cycle import plan_round
from pollux.service.store import Entry, Snapshot
from pollux.v1 import types_pb2 as pb
from tests.unit.policy_builders import ScriptedPolicy


class Sizes(ScriptedPolicy):
    """A policy that gives job "a" the next size of a script and remembers what it saw."""

    name = "sizes"

    def __init__(self) -> None:
        self.size = 0
        self.seen: list[tuple[int, int, int]] = []

    def allocate(
        self, state: ClusterState, memory: object | None, rng: np.random.Generator
    ) -> AllocationDecision:
        (job,) = state.jobs
        self.seen.append((job.resizes, job.reversals, job.last_resize))
        return AllocationDecision(
            {"a": ("n1",) * self.size}, {"a": JobExplain(1.0, 1.0, "scripted")}, objective=1.0
        )


def test_each_change_of_gpu_count_is_recorded_and_reaches_the_policy() -> None:
    job = pb.Job(id="a", state=pb.JOB_STATE_PENDING)
    job.create_time.FromNanoseconds(int(1e9))
    policy = Sizes()
    records = []
    for number, size in enumerate((2, 4, 4, 1, 0, 3), start=1):
        policy.size = size
        snapshot = Snapshot(
            revision=number,
            jobs={"a": Entry(job, mod_revision=number + 1, create_revision=1)},
            nodes={"n1": pb.Node(name="n1", gpus=4)},
            agents=[],
            models={},
            replicas=[],
        )
        plan = plan_round(
            snapshot, policy, None, np.random.default_rng(0), now=number * 60.0,
            round_number=number, scheduler_id="s",
        )  # fmt: skip
        changed = {j.id: j for j, _ in plan.jobs}
        job = changed.get("a", job)
        records.append((job.resizes, job.reversals, job.last_resize))
    # start (not a resize), grow, same size, shrink (undoes the grow), suspend, resume (undoes)
    assert records == [(0, 0, 0), (1, 0, 1), (1, 0, 1), (2, 1, -1), (3, 1, -1), (4, 2, 1)]
    assert policy.seen[1:] == records[:-1], "each round's policy sees the record so far"
