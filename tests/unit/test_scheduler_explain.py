"""Explain's counterfactuals (pollux.scheduler.explain) and the last GPU change of a job."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.wrapped import WrappedPolicy
from pollux.agent.profile import perf_to_pb
from pollux.goodput import best_batch
from pollux.policy.goodput_policy import (
    FAITHFUL_OBJECTIVE,
    JCT_OBJECTIVE,
    JctParams,
    PolluxPolicy,
)
from pollux.policy.optimus import OptimusPolicy
from pollux.policy.params import PolluxParams
from pollux.policy.problem import Problem
from pollux.policy.tenant_shares import Ledger
from pollux.policy.tiresias import TiresiasPolicy
from pollux.policy.types import AllocationDecision, ClusterState
from pollux.scheduler.cycle import declared_work, goodput_model, seconds_left
from pollux.scheduler.estimate import NEW_JOB, estimate, reference_work
from pollux.scheduler.explain import counterfactual
from pollux.scheduler.servicer import last_change
from pollux.v1 import types_pb2 as pb
from tests.unit.policy_builders import job, nodes, random_state, state
from tests.unit.policy_builders import model as policy_model


def test_a_running_job_sees_n_minus_one_n_and_n_plus_one_gpus_and_who_holds_the_rest() -> None:
    cluster = nodes(2)
    s = state(
        [
            job("mine", on=("n0", "n0")),
            job("big", on=("n0", "n0", "n1", "n1")),
            job("small", on=("n1",)),
            job("waiting"),
        ],
        cluster,
    )
    found = counterfactual(s, "mine")
    assert [(a.gpus, a.nodes) for a in found.alternatives] == [(1, 1), (2, 1), (3, 1)]
    problem = Problem(s, PolluxParams())
    expected = problem.speedup[0](np.array([1, 1, 1]), np.array([1, 2, 3]))
    assert [a.speedup for a in found.alternatives] == pytest.approx(expected.tolist())
    assert all(a.goodput > 0 for a in found.alternatives)  # the job has a model
    # Holders: every other job that holds GPUs, cheapest last GPU first.
    assert {h.job_id for h in found.holders} == {"big", "small"}
    worth = [h.last_gpu_worth for h in found.holders]
    assert worth == sorted(worth)
    small = next(h for h in found.holders if h.job_id == "small")
    assert small.speedup_without_one == 0.0  # its only GPU
    # The batch pick is the model's choice, and goodput = throughput x efficiency.
    pick = found.batch
    assert pick is not None
    model = s.jobs[0].model
    assert model is not None
    choice = best_batch(model, 1, 2)
    assert pick.goodput == pytest.approx(float(choice.goodput))
    assert pick.batch_size == 2 * pick.local_batch_size * (pick.accum_steps + 1)
    assert pick.throughput * pick.efficiency == pytest.approx(pick.goodput)
    assert 0 < pick.efficiency <= 1
    assert (found.queue_position, found.pending_jobs) == (0, 1)


def test_a_pending_job_is_placed_in_the_queue_by_submission_order() -> None:
    s = state(
        [job("old", age=900), job("runs", on=("n0",)), job("new", age=60, noise=None)],
        nodes(1),
    )
    found = counterfactual(s, "new")
    assert (found.queue_position, found.pending_jobs) == (2, 2)
    assert [a.gpus for a in found.alternatives] == [1]  # it holds none: what one would give
    assert found.alternatives[0].goodput == 0.0  # no model yet
    assert found.batch is None
    assert [h.job_id for h in found.holders] == ["runs"]


def test_without_nodes_only_the_queue_is_known_and_unknown_jobs_are_refused() -> None:
    found = counterfactual(state([job("a")], ()), "a")
    assert (found.alternatives, found.holders, found.batch) == ((), (), None)
    assert (found.queue_position, found.pending_jobs) == (1, 1)
    with pytest.raises(KeyError):
        counterfactual(state([job("a")], nodes(1)), "gone")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_any_cluster_gives_consistent_counterfactuals(seed: int) -> None:
    s = random_state(np.random.default_rng(seed), num_nodes=4)
    for info in s.jobs:
        found = counterfactual(s, info.name)
        held = len(info.allocation)
        gpus = [a.gpus for a in found.alternatives]
        assert gpus == sorted(gpus)
        assert all(max(held - 1, 1) <= k <= held + 1 for k in gpus)
        assert all(a.speedup >= 0 and a.goodput >= 0 for a in found.alternatives)
        assert info.name not in {h.job_id for h in found.holders}
        assert len(found.holders) <= 3
        worth = [h.last_gpu_worth for h in found.holders]
        assert worth == sorted(worth)
        assert (found.queue_position == 0) == bool(info.allocation)


def _history(*entries: tuple[int, str]) -> pb.Job:
    return pb.Job(history=[pb.StateTransition(state=s, reason=r) for s, r in entries])


def test_the_last_change_is_the_newest_allocation_rescale_or_suspension() -> None:
    assert last_change(_history((pb.JOB_STATE_PENDING, "submitted"))) is None
    running = _history(
        (pb.JOB_STATE_PENDING, "submitted"),
        (pb.JOB_STATE_ALLOCATED, "started on 1 GPUs"),
        (pb.JOB_STATE_RUNNING, "1 replicas running"),
        (pb.JOB_STATE_RESCALING, "scaled 1 → 2 GPUs"),
        (pb.JOB_STATE_RUNNING, "2 replicas running"),
    )
    change = last_change(running)
    assert change is not None
    assert change.reason == "scaled 1 → 2 GPUs"
    suspended = _history(
        (pb.JOB_STATE_PENDING, "submitted"),
        (pb.JOB_STATE_ALLOCATED, "started"),
        (pb.JOB_STATE_PENDING, "suspended: its 1 GPUs are worth more to other jobs"),
    )
    change = last_change(suspended)
    assert change is not None
    assert change.reason.startswith("suspended")


def test_a_jobs_declared_work_and_rescale_pause_reach_the_policys_view() -> None:
    assert declared_work(None) == (None, None)
    assert declared_work(pb.JobModel()) == (None, None)  # an older library reports no work
    undeclared = pb.JobModel(work=pb.WorkStatus(progress=3.0))
    assert declared_work(undeclared) == (None, None)
    model = pb.JobModel(work=pb.WorkStatus(progress=3.0, remaining=97.0, rescale_pause_s=12.5))
    assert declared_work(model) == (97.0, 12.5)


def _running(nodes: list[str]) -> pb.Job:
    job = pb.Job(id="j-1", state=pb.JOB_STATE_RUNNING)
    job.spec.batch.initial_batch_size = 128
    job.spec.batch.max_batch_size = 4096
    job.spec.batch.min_local_batch_size = 32
    job.spec.batch.max_local_batch_size = 512
    job.allocation.nodes.extend(nodes)
    return job


def test_the_time_left_is_declared_work_over_the_predicted_goodput_of_the_allocation() -> None:
    job = _running(["n0", "n0", "n1", "n1"])
    fitted = policy_model()
    model = pb.JobModel(
        throughput=perf_to_pb(fitted.perf),
        grad_sqr=fitted.grad.sqr,
        grad_var=fitted.grad.var,
        work=pb.WorkStatus(progress=10.0, remaining=500.0),
    )
    left = seconds_left(job, model)
    assert left is not None
    rate = float(best_batch(goodput_model(job, model), 2, 4).goodput)  # M0 samples/s
    assert left == pytest.approx(500.0 * 128 / rate)
    # Unknown without GPUs, without a declared size, or without a throughput fit.
    assert seconds_left(_running([]), model) is None
    undeclared = pb.JobModel()
    undeclared.CopyFrom(model)
    undeclared.work.ClearField("remaining")
    assert seconds_left(job, undeclared) is None
    assert seconds_left(job, pb.JobModel(work=pb.WorkStatus(remaining=5.0))) is None
    assert seconds_left(job, None) is None


def test_an_earlier_runs_size_is_its_progress_and_declared_remaining_work() -> None:
    perf = perf_to_pb(policy_model().perf)
    assert reference_work(pb.JobModel(throughput=perf)) is None  # no work status
    undeclared = pb.JobModel(throughput=perf, work=pb.WorkStatus(progress=9.0))
    assert reference_work(undeclared) is None
    unfitted = pb.JobModel(work=pb.WorkStatus(progress=9.0, remaining=1.0))
    assert reference_work(unfitted) is None
    done = pb.JobModel(throughput=perf, work=pb.WorkStatus(progress=9.0, remaining=0.0))
    assert reference_work(done) == 9.0


def test_an_estimate_forecasts_the_new_job_beside_the_running_ones() -> None:
    perf = perf_to_pb(policy_model().perf)
    reference = pb.JobModel(throughput=perf, work=pb.WorkStatus(progress=9e3, remaining=1e3))
    new = pb.JobSpec(name="again", batch=pb.BatchLimits(initial_batch_size=128))
    new.batch.max_batch_size = 4096
    quiet = state([], nodes(1))
    busy = state([replace(job("big", on=("n0",) * 4), remaining_work=1e6)], nodes(1))
    alone = estimate(quiet, PolluxPolicy(), new, reference, round_s=60.0, restart_delay_s=30.0)
    shared = estimate(busy, PolluxPolicy(), new, reference, round_s=60.0, restart_delay_s=30.0)
    assert alone is not None
    assert shared is not None
    assert alone.work == shared.work == 1e4
    assert quiet.now < alone.completion < shared.completion  # sharing the GPUs takes longer
    assert shared.rounds < 200  # the forecast stops once the new job is done
    with pytest.raises(ValueError, match="declared size"):
        estimate(quiet, PolluxPolicy(), new, pb.JobModel(), round_s=60.0, restart_delay_s=30.0)


class FirstLimits(WrappedPolicy[Ledger]):
    """A Pollux policy that records the new job's replica limit in each forecast round."""

    def __init__(self, inner: PolluxPolicy) -> None:
        super().__init__(inner)
        self.limits: list[int] = []

    def allocate(
        self, state: ClusterState, memory: Ledger | None, rng: np.random.Generator
    ) -> AllocationDecision[Ledger]:
        self.limits += [j.max_replicas for j in state.jobs if j.name == NEW_JOB]
        return self.inner.allocate(state, memory, rng)


@pytest.mark.parametrize(
    ("jct", "first", "spec_cap", "want"),
    [(None, 1, 0, 1), (JctParams(), 4, 0, 4), (JctParams(), 4, 2, 2)],
    ids=["faithful starts on one GPU", "jct starts on its step", "the spec's cap binds"],
)
def test_an_estimate_starts_the_new_job_as_the_policy_starts_one(
    jct: JctParams | None, first: int, spec_cap: int, want: int
) -> None:
    perf = perf_to_pb(policy_model().perf)
    reference = pb.JobModel(throughput=perf, work=pb.WorkStatus(progress=9e3, remaining=1e3))
    new = pb.JobSpec(
        name="again", max_replicas=spec_cap, batch=pb.BatchLimits(initial_batch_size=128)
    )
    new.batch.max_batch_size = 4096
    policy = FirstLimits(PolluxPolicy(jct=jct))
    assert policy.exploration.start == first
    got = estimate(state([], nodes(2)), policy, new, reference, round_s=60.0, restart_delay_s=30.0)
    assert got is not None
    assert policy.limits[0] == want


def test_explain_says_which_objective_the_policy_maximises() -> None:
    assert PolluxPolicy().objective_text == FAITHFUL_OBJECTIVE
    assert "p = -1" in FAITHFUL_OBJECTIVE
    assert PolluxPolicy(jct=JctParams()).objective_text == JCT_OBJECTIVE
    assert "remaining-time rank" in JCT_OBJECTIVE
    assert OptimusPolicy().objective_text == TiresiasPolicy().objective_text == ""


def test_an_estimate_plays_the_live_rounds_first_so_a_short_job_is_not_a_round_late() -> None:
    # The cluster is full until a job ends in 20 s; the new job is short. Played in 300 s
    # rounds it could only start at the next one; at the live 5 s rounds it starts at once.
    perf = perf_to_pb(policy_model().perf)
    reference = pb.JobModel(throughput=perf, work=pb.WorkStatus(progress=9.0, remaining=1.0))
    new = pb.JobSpec(name="again", batch=pb.BatchLimits(initial_batch_size=128))
    new.batch.max_batch_size = 4096
    ending = replace(job("ending", on=("n0",) * 4), remaining_work=1.0)
    busy = state([ending], nodes(1))
    coarse = estimate(busy, PolluxPolicy(), new, reference, round_s=300.0, restart_delay_s=5.0)
    fine = estimate(
        busy, PolluxPolicy(), new, reference, round_s=300.0, restart_delay_s=5.0, live_round_s=5.0
    )
    assert coarse is not None
    assert fine is not None
    assert fine.completion < coarse.completion
    assert fine.completion - busy.now < 300.0
