"""How far a job may grow past what it has measured: Pollux's rule, and the jct mode's step.

The same limit (`Policy.replica_limit`) reaches the policy from the simulator, the live
scheduler's JobInfo and the forecasts, so each is checked here against
`pollux.policy.exploration`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.wrapped import WrappedPolicy
from pollux.goodput import SyncModel
from pollux.policy.exploration import FAITHFUL, FAITHFUL_GROWTH, Exploration, exploration_limit
from pollux.policy.forecast import forecast
from pollux.policy.goodput_policy import JctParams, PolluxPolicy
from pollux.policy.optimus import OptimusPolicy
from pollux.policy.params import PolicyInputError
from pollux.policy.tiresias import TiresiasPolicy
from pollux.policy.types import AllocationDecision, ClusterState, JobExplain, JobSizing
from pollux.scheduler.cycle import cluster_state
from pollux.service.store import Entry, Snapshot
from pollux.sim.application import load_published_applications
from pollux.sim.simulator import SimJob
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob
from pollux.v1 import types_pb2 as pb
from tests.unit.policy_builders import job, nodes, state


def test_a_job_may_reach_growth_times_what_it_measured_and_keeps_what_it_holds() -> None:
    assert exploration_limit(0, 0) == 1, "a new job starts on one GPU"
    assert exploration_limit(1, 0) == 2 == FAITHFUL_GROWTH
    assert exploration_limit(3, 0) == 6
    assert exploration_limit(1, 8) == 8, "what a job holds is never taken by this rule"
    assert exploration_limit(1, 0, growth=4) == 4
    assert exploration_limit(4, 0, growth=4) == 16
    assert exploration_limit(0, 0, growth=4, start=4) == 4, "the jct mode's first step"
    assert exploration_limit(1, 0, growth=4, start=4) == 4, "one GPU measured: the same reach"
    assert exploration_limit(0, 6, growth=4, start=4) == 6


@given(st.integers(2, 64), st.data())
def test_a_first_step_never_reaches_past_a_measured_jobs(growth: int, data: st.DataObject) -> None:
    rule = Exploration(growth, data.draw(st.integers(1, growth)))
    profiled = data.draw(st.integers(1, 4096))
    assert rule.limit(0, 0) <= rule.limit(profiled, 0) == growth * profiled
    assert rule.limit(0, 0) == rule.start


@pytest.mark.parametrize(("growth", "start"), [(1, 1), (2, 0), (2, 3), (4, 5)])
def test_an_exploration_rule_out_of_range_is_refused(growth: int, start: int) -> None:
    with pytest.raises(ValueError, match="exploration"):
        Exploration(growth, start)


@given(st.integers(0, 4096), st.integers(0, 4096), st.integers(2, 64))
def test_the_limit_grows_with_the_step_and_covers_one_gpu_and_the_held(
    profiled: int, held: int, growth: int
) -> None:
    limit = exploration_limit(profiled, held, growth)
    assert limit >= max(1, held, profiled)
    assert limit >= exploration_limit(profiled, held, FAITHFUL_GROWTH)


def test_faithful_pollux_and_the_other_policies_double_and_the_jct_mode_quadruples() -> None:
    assert PolluxPolicy().exploration == FAITHFUL == Exploration(FAITHFUL_GROWTH, start=1)
    assert PolluxPolicy(jct=JctParams()).exploration == Exploration(4, start=4)
    assert PolluxPolicy(jct=JctParams(explore_first=False)).exploration == Exploration(4, 1)
    assert PolluxPolicy(jct=JctParams(explore_growth=2)).exploration == Exploration(2, 2)
    assert OptimusPolicy().exploration == TiresiasPolicy().exploration == FAITHFUL
    for bad in (1, 0, 65):
        with pytest.raises(PolicyInputError, match=r"jct\.explore_growth"):
            JctParams(explore_growth=bad)


APPS = load_published_applications(default_data_root() / "traces")
POLICY = {
    FAITHFUL: PolluxPolicy(),
    Exploration(4): PolluxPolicy(jct=JctParams(explore_first=False)),
    Exploration(4, 4): PolluxPolicy(jct=JctParams()),
}
"""A Pollux policy of each exploration rule."""


def test_a_policys_replica_limit_is_its_exploration_limit_within_the_cap() -> None:
    for rule, policy in POLICY.items():
        assert policy.exploration == rule
        for profiled, held in ((0, 0), (1, 0), (3, 2), (1, 8)):
            assert policy.replica_limit(profiled, held, 64) == rule.limit(profiled, held)
            assert policy.replica_limit(profiled, held, 3) == min(3, rule.limit(profiled, held))
    # Optimus explores too live (its step times are predicted from what a job ran); Tiresias
    # runs each job at its own size, so only the cap binds.
    assert OptimusPolicy().replica_limit(1, 0, 64) == 2
    assert TiresiasPolicy().replica_limit(0, 0, 64) == 64


def test_the_simulator_lets_a_job_explore_by_the_policys_step() -> None:
    spec = WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)
    for rule, limits in (
        (FAITHFUL, (1, 2, 8)),
        (Exploration(4), (1, 4, 16)),
        (Exploration(4, 4), (4, 4, 16)),
    ):
        limit = POLICY[rule].replica_limit
        sim = SimJob.create(spec, APPS["cifar10"], JobSizing.ADAPTIVE, SyncModel.LINEAR, limit)
        seen = [sim.max_replicas(64)]
        sim.profile[(1, 1, 128)] = (0.1, 0.01)
        seen.append(sim.max_replicas(64))
        sim.profile[(1, 4, 128)] = (0.1, 0.02)
        seen.append(sim.max_replicas(64))
        assert tuple(seen) == limits
        assert sim.max_replicas(3) == 3, "the cap still binds"


def snapshot_with(profiled: int, held: int) -> Snapshot:
    record = pb.Job(id="a", state=pb.JOB_STATE_RUNNING)
    record.spec.batch.initial_batch_size = 128
    record.spec.batch.max_batch_size = 65536
    record.spec.batch.min_local_batch_size = 32
    record.allocation.nodes.extend(["n1"] * held)
    record.create_time.FromNanoseconds(int(1e9))
    return Snapshot(
        revision=1,
        jobs={"a": Entry(record, mod_revision=2, create_revision=1)},
        nodes={"n1": pb.Node(name="n1", gpus=64)},
        agents=[],
        models={"a": pb.JobModel(job_id="a", max_profiled_replicas=profiled)},
        replicas=[],
    )


def test_the_scheduler_hands_the_policy_the_same_limit() -> None:
    snapshot = snapshot_with(profiled=2, held=2)
    active = [snapshot.jobs["a"].value]
    pollux, pollux_jct = POLICY[FAITHFUL], POLICY[Exploration(4, 4)]
    faithful = cluster_state(snapshot, active, now=60.0, policy=pollux)
    jct = cluster_state(snapshot, active, now=60.0, policy=pollux_jct)
    assert (faithful.jobs[0].max_replicas, jct.jobs[0].max_replicas) == (4, 8)
    new = snapshot_with(profiled=0, held=0)
    fresh = [new.jobs["a"].value]
    only = cluster_state(new, fresh, now=60.0, policy=pollux).jobs[0]
    assert only.max_replicas == 1, "Pollux: one GPU"
    first = cluster_state(new, fresh, now=60.0, policy=pollux_jct)
    assert first.jobs[0].max_replicas == 4, "the jct mode's first step"
    held = snapshot_with(profiled=1, held=6)
    kept = cluster_state(held, [held.jobs["a"].value], now=60.0, policy=pollux)
    assert kept.jobs[0].max_replicas == 6
    # Tiresias runs a job at its own size: the batch limits and the cluster bound it only.
    tiresias = cluster_state(new, fresh, now=60.0, policy=TiresiasPolicy())
    assert tiresias.jobs[0].max_replicas == 64
    # Optimus gets an oracle as far as the job may explore.
    optimus = cluster_state(new, fresh, now=60.0, policy=OptimusPolicy()).jobs[0]
    assert optimus.oracle is not None
    assert (optimus.max_replicas, optimus.oracle.step_time.size) == (1, 2)


class Greedy(WrappedPolicy[None]):
    """Gives each job every GPU its limit allows on n0, and records the limits it saw."""

    def __init__(self, exploration: Exploration) -> None:
        super().__init__(POLICY[exploration])  # type: ignore[arg-type]
        self.limits: list[int] = []

    def allocate(
        self, state: ClusterState, memory: None, rng: np.random.Generator
    ) -> AllocationDecision[None]:
        (only,) = state.jobs
        self.limits.append(only.max_replicas)
        return AllocationDecision(
            {only.name: ("n0",) * only.max_replicas}, {only.name: JobExplain(1.0, 1.0, "")}
        )


def test_a_forecast_explores_by_the_policys_step() -> None:
    new = replace(job("new", on=("n0",), max_replicas=1), remaining_work=1e9)
    for growth, want in ((2, [1, 2, 4, 8, 16]), (4, [1, 4, 16, 64, 64])):
        policy = Greedy(Exploration(growth))
        forecast(
            state([new], nodes(1, gpus=64)), policy, round_s=60.0, restart_delay_s=0.0,
            max_rounds=5,
        )  # fmt: skip
        assert policy.limits == want
