"""The simulator's side of the jct mode: declared sizes, per-model restart delays, the mode."""

from dataclasses import replace

import numpy as np
import pytest

from pollux.goodput import SyncModel
from pollux.policy.goodput_policy import JctParams, PolluxPolicy
from pollux.policy.registry import make_policy
from pollux.policy.types import JobSizing
from pollux.sim.application import load_published_applications
from pollux.sim.runner import spec_for
from pollux.sim.simulator import SimConfig, SimJob, _seed_profiles, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob

APPS = load_published_applications(default_data_root() / "traces")
SMALL = SimConfig(nodes=2, gpus_per_node=4, sync_model=SyncModel.LINEAR)
WORKLOAD = [
    WorkloadJob("ncf-0", 0, "ncf", 1, 32768),
    WorkloadJob("cifar10-1", 30, "cifar10", 6, 2048),
    WorkloadJob("ncf-2", 90, "ncf", 1, 32768),
    WorkloadJob("bert-3", 200, "bert", 6, 384),
    WorkloadJob("cifar10-4", 400, "cifar10", 8, 2048),
]
NAMES = ["n0", "n1"]


def sim_job(app: str = "cifar10", name: str = "cifar10-0") -> SimJob:
    spec = WorkloadJob(name, 0.0, app, 1, 128)
    return SimJob.create(spec, APPS[app], JobSizing.ADAPTIVE, SyncModel.LINEAR)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"restart_delays": (("ncf", -1.0),)}, "restart delay"),
        ({"undeclared_fraction": 1.5}, "undeclared_fraction"),
        ({"undeclared_fraction": -0.1}, "undeclared_fraction"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimConfig(**kwargs)


def test_per_application_delays_replace_the_flat_one():
    config = SimConfig(restart_delay=30.0, restart_delays=(("ncf", 15.0), ("imagenet", 250.0)))
    assert config.delay_of("ncf") == 15.0
    assert config.delay_of("imagenet") == 250.0
    assert config.delay_of("cifar10") == 30.0


def test_the_undeclared_fraction_picks_jobs_by_name_only():
    names = [f"job-{i}" for i in range(2000)]
    assert all(SimConfig().declares(n) for n in names)
    assert not any(SimConfig(undeclared_fraction=1.0).declares(n) for n in names)
    third = SimConfig(undeclared_fraction=0.3)
    silent = [n for n in names if not third.declares(n)]
    assert len(silent) / len(names) == pytest.approx(0.3, abs=0.05)
    # The same jobs at any other setting of the rest (load, seed …).
    assert silent == [n for n in names if not replace(third, seed=7).declares(n)]


def test_remaining_work_is_the_target_less_the_progress_in_m0_steps():
    job = sim_job()
    job.progress = 1000.0
    info = job.info(0.0, NAMES, SMALL)
    assert info.remaining_work == pytest.approx(APPS["cifar10"].final_progress - 1000.0)
    job.progress = APPS["cifar10"].final_progress + 5.0
    assert job.info(0.0, NAMES, SMALL).remaining_work == 0.0
    assert job.info(0.0, NAMES, replace(SMALL, undeclared_fraction=1.0)).remaining_work is None


def test_the_pause_is_reported_once_paid_and_only_with_per_model_delays():
    config = replace(SMALL, restart_delays=(("cifar10", 90.0),))
    job = sim_job()
    assert job.info(0.0, NAMES, config).restart_pause_s is None, "not started: not measured"
    job.reallocate((0, 0), config.delay_of("cifar10"))
    assert job.rescale_time == 90.0
    assert job.info(0.0, NAMES, config).restart_pause_s == 90.0
    assert job.info(0.0, NAMES, SMALL).restart_pause_s is None, "flat delay: the policy's own"


def test_a_per_model_delay_is_what_the_job_pays():
    one = [WorkloadJob("ncf-0", 0, "ncf", 1, 32768)]
    policy = PolluxPolicy()
    slow = simulate(one, APPS, policy, SMALL).jcts["ncf-0"]
    fast = simulate(one, APPS, policy, replace(SMALL, restart_delays=(("ncf", 0.0),)))
    assert slow - fast.jcts["ncf-0"] == pytest.approx(30.0, abs=1.0)


def test_results_carry_restarts_and_gpu_seconds():
    result = simulate(WORKLOAD, APPS, PolluxPolicy(), SMALL)
    assert set(result.restarts) == set(result.gpu_seconds) == set(result.jcts)
    assert all(r >= 0 for r in result.restarts.values())
    assert result.restarts["ncf-0"] == 0, "ncf runs on one GPU from start to end"
    # A one-GPU job holds its GPU from its first round to its completion.
    assert result.gpu_seconds["ncf-0"] == pytest.approx(result.jcts["ncf-0"], abs=60.0)


def test_faithful_pollux_ignores_what_jobs_declare():
    declared = simulate(WORKLOAD, APPS, PolluxPolicy(), SMALL)
    silent = simulate(WORKLOAD, APPS, PolluxPolicy(), replace(SMALL, undeclared_fraction=1.0))
    assert declared.jcts == silent.jcts
    assert declared.restarts == silent.restarts


@pytest.mark.parametrize("undeclared", [0.0, 0.5, 1.0])
def test_the_jct_mode_completes_every_job(undeclared):
    config = replace(SMALL, undeclared_fraction=undeclared)
    result = simulate(WORKLOAD, APPS, PolluxPolicy(jct=JctParams()), config)
    assert set(result.jcts) == {j.name for j in WORKLOAD}
    assert all(np.isfinite(v) and v > 0 for v in result.jcts.values())


def test_the_runner_runs_the_jct_mode_as_its_own_policy_with_the_same_simulator_settings():
    jct, faithful = spec_for("pollux-jct"), spec_for("pollux")
    assert jct.config == faithful.config, "same simulator settings"
    policy = make_policy(jct.policy)
    assert isinstance(policy, PolluxPolicy)
    assert policy.jct == JctParams()
    assert make_policy(faithful.policy) == PolluxPolicy()
    with pytest.raises(ValueError, match="pollux-jct, pollux, optimus, tiresias"):
        spec_for("jct")
    slow = spec_for("pollux-jct", interval=120.0, restart_delay=45.0)
    assert slow.config.interval == 120.0
    assert slow.policy.restart_delay_s == 45.0, "the policy prices the simulator's delay"


def test_a_job_adopts_what_other_runs_of_its_model_measured():
    first, second = sim_job(name="cifar10-a"), sim_job(name="cifar10-b")
    first.atomic_bsz = second.atomic_bsz = 64
    first._observe(1, 4, 0.5, 0.1, 1.0, 10.0)
    first._observe(2, 8, 0.6, 0.2, 1.0, 10.0)
    assert second.perf is None
    assert second.max_replicas(64) == 1
    second._observe(1, 1, 0.4, 0.01, 2.0, 20.0)
    second.adopt(dict(first.profile))
    assert set(first.profile) <= set(second.profile), "the other run's rows are added"
    assert second.profile[(1, 1, second.atomic_bsz)] == (0.4, 0.01), "its own rows are kept"
    assert second.perf is not None
    assert second.max_replicas(64) == 16, "it may grow to twice the largest size measured"
    assert second.grad == (2.0, 20.0), "gradient statistics stay its own"
    before = second.perf
    second.adopt(dict(first.profile))
    assert second.perf is before, "nothing new: no refit"


def test_a_new_job_is_seeded_once_from_the_newest_earlier_fitted_run_of_its_application():
    old, newer, unfitted, bert, new, later = (
        sim_job(name="cifar10-old"),
        sim_job(name="cifar10-newer"),
        sim_job(name="cifar10-unfitted"),
        sim_job("bert", "bert-0"),
        sim_job(name="cifar10-new"),
        sim_job(name="cifar10-later"),
    )
    for job, replicas in ((old, 4), (newer, 8), (later, 16)):
        job.atomic_bsz = 64
        job._observe(1, replicas, 0.5, 0.1, 1.0, 10.0)
    unfitted.profile[(1, 2, 64)] = (0.5, 0.1)  # measured, but no throughput fit yet
    bert.atomic_bsz = 8
    bert._observe(2, 32, 0.5, 0.1, 1.0, 10.0)
    runs = {"cifar10": [old, newer, unfitted, new, later], "bert": [bert]}
    _seed_profiles([new], runs)
    assert set(new.profile) == set(newer.profile), "the newest earlier run with a fit"
    assert new.max_replicas(64) == 16
    newer._observe(1, 12, 0.5, 0.1, 1.0, 10.0)
    _seed_profiles([new], runs)
    assert (1, 12, 64) not in new.profile, "seeded once, at its first round"


@pytest.mark.parametrize("share", [False, True])
def test_shared_profiles_complete_every_job_and_change_only_with_the_setting(share):
    policy = PolluxPolicy(jct=JctParams())
    config = replace(SMALL, share_profiles=share)
    result = simulate(WORKLOAD, APPS, policy, config)
    assert set(result.jcts) == {j.name for j in WORKLOAD}
    assert all(t > 0 for t in result.jcts.values())
    baseline = simulate(WORKLOAD, APPS, policy, SMALL)
    assert (result.jcts == baseline.jcts) is (not share)


def test_a_simulated_job_keeps_its_resize_record_for_the_policy():
    job = sim_job()
    job.reallocate((0,), 30.0)  # its first allocation: not a resize
    for allocation in ((0, 0, 1, 1), (0, 1, 1, 1), (0, 1), (), (0, 0)):
        job.reallocate(allocation, 30.0)
    # grow, (a move to as many GPUs: nothing), shrink (undoes), suspend, resume (undoes)
    assert job.resize_record == (4, 2, 1)
    info = job.info(0.0, NAMES, SMALL)
    assert (info.resizes, info.reversals, info.last_resize) == (4, 2, 1)
