"""Event-triggered rounds in the simulator (`SimConfig.event_delay`), as the live scheduler runs
them: a round shortly after each submission and completion. A full one re-plans every job and
the periodic schedule restarts from it; a placement one (`event_rounds="place"`) only places
jobs that never ran on free GPUs, periodic rounds keeping their own clock."""

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.wrapped import WrappedPolicy
from pollux.goodput import SyncModel
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.jct import JctParams
from pollux.policy.placement import never_ran
from pollux.policy.types import JobSizing, TenantSpec
from pollux.sim.application import load_published_applications
from pollux.sim.simulator import SimConfig, SimJob, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob

APPS = load_published_applications(default_data_root() / "traces")
# test_simulator.py's mix, with submissions off the 60 s grid (95, 410, 1234 s) and one at 0,
# so that event rounds and periodic ones differ for every job.
WORKLOAD = [
    WorkloadJob("ncf-0", 0, "ncf", 1, 32768),
    WorkloadJob("cifar10-1", 30, "cifar10", 6, 2048),
    WorkloadJob("ncf-2", 95, "ncf", 1, 32768),
    WorkloadJob("bert-3", 200, "bert", 6, 384),
    WorkloadJob("cifar10-4", 410, "cifar10", 8, 2048),
    WorkloadJob("ncf-5", 1234, "ncf", 1, 32768),
]
EVENTS = SimConfig(nodes=2, gpus_per_node=4, event_delay=1.0)
PLACE = replace(EVENTS, event_rounds="place")
POLICIES = {"faithful": PolluxPolicy, "jct": lambda: PolluxPolicy(jct=JctParams())}


def run(policy, config=EVENTS):
    rounds = []
    result = simulate(WORKLOAD, APPS, policy, config, on_round=rounds.append)
    return result, [r["timestamp"] for r in rounds], rounds


@pytest.mark.parametrize("mode", POLICIES)
def test_a_round_follows_every_submission_and_completion(mode):
    result, times, _ = run(POLICIES[mode]())
    for job in WORKLOAD:
        start = job.submission_time
        assert any(start <= t <= start + 1.0 for t in times), f"no round after {job.name} came"
        done = job.submission_time + result.jcts[job.name]
        # Completions fall on whole seconds of a job's clock; the round is at most 1 s later
        # than the trigger's delay.
        assert any(done <= t <= done + 2.0 for t in times), f"no round after {job.name} ended"


@pytest.mark.parametrize("mode", POLICIES)
def test_rounds_are_at_most_an_interval_apart_and_in_order(mode):
    _, times, _ = run(POLICIES[mode]())
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert all(0 < gap <= EVENTS.interval for gap in gaps)


def first_allocations(rounds):
    return {
        entry["name"]: next(
            r["timestamp"]
            for r in rounds
            for e in r["submitted_jobs"]
            if e["name"] == entry["name"] and e["allocation"]
        )
        for entry in rounds[-1]["submitted_jobs"]
    }


def test_with_placement_rounds_a_job_starts_at_once_on_free_gpus_else_at_the_periodic_round():
    _, _, rounds = run(PolluxPolicy(), PLACE)
    first = first_allocations(rounds)
    for job in WORKLOAD:
        periodic = math.ceil(job.submission_time / PLACE.interval) * PLACE.interval
        assert first[job.name] in (job.submission_time + 1.0, periodic), job.name
    assert first["ncf-0"] == 1.0  # an idle cluster: placed by the event round


def test_a_job_submitted_to_a_cluster_with_free_gpus_starts_at_the_next_event_round():
    _, _, rounds = run(PolluxPolicy())
    for job in WORKLOAD:
        first = next(
            r["timestamp"]
            for r in rounds
            for entry in r["submitted_jobs"]
            if entry["name"] == job.name and entry["allocation"]
        )
        assert first == job.submission_time + 1.0, job.name


def test_without_event_rounds_every_round_is_on_the_interval():
    periodic = SimConfig(nodes=2, gpus_per_node=4)
    _, times, _ = run(PolluxPolicy(), periodic)
    assert times == [periodic.interval * (i + 1) for i in range(len(times))]


def test_event_rounds_spend_less_time_waiting_for_the_first_round():
    periodic, _, _ = run(PolluxPolicy(), SimConfig(nodes=2, gpus_per_node=4))
    events, _, _ = run(PolluxPolicy())
    # The 1-GPU ncf jobs never share: each saves its wait for the next periodic round.
    for job in WORKLOAD:
        if job.application == "ncf":
            wait = (math.floor(job.submission_time / 60.0) + 1) * 60.0 - job.submission_time
            assert events.jcts[job.name] == pytest.approx(
                periodic.jcts[job.name] - wait + 1.0, abs=1.0
            ), job.name


@pytest.mark.parametrize("delay", [-1.0, 60.0, 90.0])
def test_an_event_delay_outside_the_round_interval_is_rejected(delay):
    with pytest.raises(ValueError, match="event_delay"):
        SimConfig(interval=60.0, event_delay=delay)


class Recording(WrappedPolicy):
    """A policy, keeping every state it was asked to plan."""

    def __init__(self, inner):
        super().__init__(inner)
        self.states = []

    def allocate(self, state, memory, rng):
        self.states.append(state)
        return self.inner.allocate(state, memory, rng)


def on_the_interval(t):
    return t % PLACE.interval == 0


@pytest.mark.parametrize("mode", POLICIES)
def test_placement_rounds_plan_only_jobs_that_never_ran_and_keep_the_periodic_clock(mode):
    policy = Recording(POLICIES[mode]())
    _, times, _ = run(policy, PLACE)
    assert any(not on_the_interval(t) for t in times)  # the workload does trigger event rounds
    periodic = [s for s in policy.states if on_the_interval(s.now)]
    assert [s.now for s in periodic] == [PLACE.interval * (i + 1) for i in range(len(periodic))]
    for state in policy.states:
        if not on_the_interval(state.now):
            assert state.jobs, state.now
            assert all(never_ran(job) for job in state.jobs), state.now
            assert sum(n.gpus for n in state.nodes) <= PLACE.nodes * PLACE.gpus_per_node


@pytest.mark.parametrize("mode", POLICIES)
def test_with_placement_rounds_a_job_that_ran_is_moved_only_by_a_periodic_round(mode):
    _, times, rounds = run(POLICIES[mode](), PLACE)
    held: dict[str, list] = {}
    moves = 0
    for t, record in zip(times, rounds, strict=True):
        for entry in record["submitted_jobs"]:
            before = held.get(entry["name"], [])
            finished = entry["completion_time"] is not None
            if before and entry["allocation"] != before and not finished:
                assert on_the_interval(t), (entry["name"], t)
                moves += 1
            held[entry["name"]] = entry["allocation"]
    assert moves > 0  # the workload does rescale jobs


def test_with_tenants_every_round_is_full_and_restarts_the_periodic_clock():
    # As live (`pollux.policy.rounds`): a placement round cannot see a tenant's GPUs elsewhere.
    policy = Recording(PolluxPolicy())
    tenants = (TenantSpec("a", guarantee_gpus=2), TenantSpec("b"))
    workload = [replace(job, tenant="ab"[i % 2]) for i, job in enumerate(WORKLOAD)]
    rounds = []
    simulate(workload, APPS, policy, replace(PLACE, tenants=tenants), on_round=rounds.append)
    times = [r["timestamp"] for r in rounds]
    assert any(not on_the_interval(t) for t in times)  # event rounds ran
    for state in policy.states:
        assert state.tenants == tenants
        assert sum(n.gpus for n in state.nodes) == PLACE.nodes * PLACE.gpus_per_node
    gaps = list(itertools.pairwise(times))
    assert all(after - before <= PLACE.interval + 1e-9 for before, after in gaps)
    # A periodic round an interval after an event's round, off the grid: the event's full
    # round restarted the clock (with placement rounds the periodic ones stay on the grid).
    assert any(
        after - before == PLACE.interval and not on_the_interval(after) for before, after in gaps
    )


def test_event_rounds_other_than_full_and_place_are_rejected():
    with pytest.raises(ValueError, match="event_rounds must be one of"):
        replace(EVENTS, event_rounds="grow")
    with pytest.raises(ValueError, match="needs an event_delay"):
        SimConfig(event_rounds="place")


@pytest.mark.parametrize("app", ["cifar10", "bert", "ncf"])
def test_the_predicted_finish_is_exact_in_the_last_epoch(app):
    spec = WorkloadJob(f"{app}-0", 0.0, app, 1, 128)
    job = SimJob.create(spec, APPS[app], JobSizing.ADAPTIVE, SyncModel.LINEAR)
    job.reallocate((0, 0), restart_delay=30.0)
    while job.epoch < job.app.completion_epoch:  # to the start of the last epoch
        job.step(max(1.0, math.ceil(job.seconds_to_epoch_end(0.0))), 0.0)
    assert not job.completed
    left = job.seconds_to_finish(0.0)
    assert 0 < left < math.inf
    before = job.clock
    job.step(max(math.floor(left) - 1.0, 0.0), 0.0)
    assert not job.completed
    job.step(2.0 + math.ceil(left) - math.floor(left), 0.0)
    assert job.completed
    assert job.completion_time == pytest.approx(before + left, abs=1.0)


def test_a_job_without_gpus_never_finishes():
    spec = WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 128)
    job = SimJob.create(spec, APPS["cifar10"], JobSizing.ADAPTIVE, SyncModel.LINEAR)
    assert job.seconds_to_finish(0.0) == math.inf


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["ncf", "cifar10"]), st.integers(0, 900)),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from([0.0, 1.0, 5.0]),
    st.sampled_from(["full", "place"]),
)
def test_any_workload_completes_with_a_round_soon_after_each_submission(jobs, delay, kind):
    workload = sorted(
        (WorkloadJob(f"{app}-{i}", t, app, 1, 2048) for i, (app, t) in enumerate(jobs)),
        key=lambda job: job.submission_time,
    )
    config = SimConfig(nodes=1, gpus_per_node=4, event_delay=delay, event_rounds=kind)
    rounds = []
    result = simulate(workload, APPS, PolluxPolicy(jct=JctParams()), config, on_round=rounds.append)
    times = [r["timestamp"] for r in rounds]
    assert set(result.jcts) == {job.name for job in workload}
    assert all(jct > 0 for jct in result.jcts.values())
    assert 0 <= times[0] <= config.interval  # at 0 when a job comes at 0 with no delay
    assert all(0 < b - a <= config.interval for a, b in itertools.pairwise(times))
    for job in workload:
        start = job.submission_time
        assert any(start <= t <= start + delay for t in times), job.name
    for record in rounds:
        held = sum(len(j["allocation"]) for j in record["submitted_jobs"])
        assert held <= config.gpus_per_node
