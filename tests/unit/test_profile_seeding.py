"""Seeding a re-run's profile from an earlier run: what is copied, what wins, what is bounded."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pollux.agent.profile import (
    build_model,
    can_fit,
    fit_observations,
    fit_profile,
    merge_report,
    perf_to_pb,
)
from pollux.goodput import PerfParams, step_times
from pollux.service.seeding import MAX_SEED_ROWS, fit_rows, seeded
from pollux.v1 import types_pb2 as pb
from tests.unit.test_agent_profile import obs, report

TRUE = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)
LIMITS = pb.BatchLimits(initial_batch_size=128, max_batch_size=4096)
NEW = pb.Job(id="j-new", spec=pb.JobSpec(name="resnet", batch=LIMITS))


def measured(nodes: int, replicas: int, local: int, count: int = 10) -> pb.StepObservation:
    accum, optim = step_times(TRUE, nodes, replicas, local)
    return obs(nodes, replicas, local, 1, float(accum), float(optim), count)


def earlier_run() -> tuple[pb.ObservationProfile, pb.JobModel]:
    profile = pb.ObservationProfile(
        job_id="j-old",
        observations=[measured(1, 1, 64), measured(1, 4, 64), measured(2, 8, 64)],
        gradient=pb.GradientStats(sqr=3.0, var=30.0),
        work=pb.WorkStatus(progress=100.0, remaining=5.0),
        applied_seq={"3/0": 7},
    )
    profile.last_configs["2/8"].CopyFrom(pb.BatchConfig(local_batch_size=64, accum_steps=1))
    model = pb.JobModel(job_id="j-old", throughput=perf_to_pb(TRUE), grad_sqr=3.0, agent_id="a")
    return profile, model


def test_a_seed_carries_the_earlier_runs_rows_and_fit_but_nothing_of_that_run_alone():
    profile, model = earlier_run()
    seed = seeded(NEW, profile, model, now_s=1_700_000_000.0)
    assert seed is not None
    new_profile, new_model = seed
    assert new_profile.job_id == new_model.job_id == "j-new"
    assert new_profile.seeded_from == new_model.seeded_from == "j-old"
    assert list(new_profile.seed_observations) == sorted(
        profile.observations, key=lambda o: (o.num_nodes, o.num_replicas)
    )
    assert not new_profile.observations, "nothing is the new job's own yet"
    assert not new_profile.HasField("gradient")
    assert not new_profile.HasField("work")
    assert not new_profile.applied_seq
    assert not new_profile.last_configs
    assert new_model.throughput == model.throughput
    assert new_model.batch == LIMITS, "the new job's own limits"
    assert new_model.max_profiled_replicas == 8
    assert (new_model.grad_sqr, new_model.grad_var, new_model.observations) == (0, 0, 0)
    assert new_model.agent_id == "", "no agent published it"
    assert new_model.update_time.seconds == 1_700_000_000


def test_no_seed_without_a_fit_or_without_measured_compute_times():
    profile, model = earlier_run()
    assert seeded(NEW, profile, pb.JobModel(job_id="j-old"), now_s=0) is None
    unmeasured = pb.ObservationProfile(job_id="j-old", observations=[obs(accum_s=0.0)])
    assert seeded(NEW, unmeasured, model, now_s=0) is None


def test_a_chain_of_reruns_carries_what_every_run_measured_the_newest_winning():
    profile, model = earlier_run()
    first = seeded(NEW, profile, model, now_s=0)
    assert first is not None
    second_run = first[0]
    second_run.job_id = "j-second"
    second_run.observations.append(measured(4, 16, 64))
    faster = measured(1, 4, 64)
    faster.optim_step_time_s /= 2
    second_run.observations.append(faster)
    third = seeded(pb.Job(id="j-third", spec=NEW.spec), second_run, model, now_s=0)
    assert third is not None
    rows = {(o.num_nodes, o.num_replicas): o for o in third[0].seed_observations}
    assert set(rows) == {(1, 1), (1, 4), (2, 8), (4, 16)}
    assert rows[(1, 4)].optim_step_time_s == faster.optim_step_time_s
    assert third[0].seeded_from == "j-second"
    assert third[1].max_profiled_replicas == 16


def test_seeded_rows_are_bounded_keeping_the_most_observed():
    profile, model = earlier_run()
    del profile.observations[:]
    for local in range(1, MAX_SEED_ROWS + 11):
        profile.observations.append(measured(1, 1, local, count=local))
    seed = seeded(NEW, profile, model, now_s=0)
    assert seed is not None
    kept = {o.local_batch_size for o in seed[0].seed_observations}
    assert kept == set(range(11, MAX_SEED_ROWS + 11))


def test_the_jobs_own_rows_win_over_seeded_ones_of_the_same_configuration():
    profile, model = earlier_run()
    seed = seeded(NEW, profile, model, now_s=0)
    assert seed is not None
    own = measured(1, 4, 64, count=1)
    own.accum_step_time_s *= 3  # this run's model is slower than the earlier one
    merged = merge_report(seed[0], report(own)).profile
    assert len(merged.seed_observations) == 3, "reports never merge into seeded rows"
    used = {(o.num_nodes, o.num_replicas): o for o in fit_rows(merged)}
    assert used[(1, 4)].accum_step_time_s == own.accum_step_time_s
    assert set(used) == {(1, 1), (1, 4), (2, 8)}
    fitted = fit_observations(merged)
    assert fitted is not None
    at = np.flatnonzero((fitted.num_replicas == 4) & (fitted.num_nodes == 1))
    assert fitted.accum_step_time[at].tolist() == [own.accum_step_time_s]


def test_a_seeded_profile_fits_before_the_job_measures_anything():
    profile, model = earlier_run()
    seed = seeded(NEW, profile, model, now_s=0)
    assert seed is not None
    assert can_fit(seed[0])
    fit = fit_profile(seed[0], previous=seed[1].throughput)
    assert fit is not None
    _, want = step_times(TRUE, 2, 8, 64)
    _, got = step_times(fit.params, 2, 8, 64)
    assert abs(float(got) / float(want) - 1) < 0.05


def test_the_published_model_counts_seeded_sizes_but_only_the_jobs_own_steps():
    profile, model = earlier_run()
    seed = seeded(NEW, profile, model, now_s=0)
    assert seed is not None
    merged = merge_report(seed[0], report(measured(1, 2, 64, count=4))).profile
    published = build_model(merged, LIMITS, model.throughput, agent_id="a", now_s=0)
    assert published.max_profiled_replicas == 8, "it may explore from what the seed measured"
    assert published.observations == 4
    assert published.seeded_from == "j-old"


@given(
    own=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4)), max_size=6),
    seed=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4)), max_size=6),
)
def test_fit_rows_hold_every_own_row_and_one_row_per_configuration_from_either(own, seed):
    profile = pb.ObservationProfile(
        observations=[measured(n, n * k, 64) for n, k in own],
        seed_observations=[measured(n, n * k, 64, count=99) for n, k in seed],
    )
    rows = fit_rows(profile)
    assert rows[: len(own)] == list(profile.observations)
    keys = {(o.num_nodes, o.num_replicas) for o in rows}
    assert keys == {(n, n * k) for n, k in own + seed}
    assert all(o.count == 99 for o in rows[len(own) :])
    assert not {(o.num_nodes, o.num_replicas) for o in rows[len(own) :]} & {
        (n, n * k) for n, k in own
    }
