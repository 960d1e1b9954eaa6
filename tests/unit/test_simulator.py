"""The trace-driven simulator: invariants, determinism, interference, published regressions."""

import itertools
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.nsga2 import NsgaConfig, NsgaPolicy
from pollux.policy.goodput_policy import PolluxParams, PolluxPolicy
from pollux.policy.optimus import OptimusPolicy
from pollux.policy.tiresias import TiresiasPolicy
from pollux.sim.application import load_published_applications
from pollux.sim.simulator import SimConfig, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob, load_workload

APPS = load_published_applications(default_data_root() / "traces")
SMALL = SimConfig(nodes=2, gpus_per_node=4)
# Rounds every interval (published) and also a second after each submission and completion
# (the live scheduler's timing): the invariants hold under both.
TIMINGS = {"periodic": SMALL, "events": replace(SMALL, event_delay=1.0)}
# A short, mixed workload: finishes in seconds of wall time under every policy.
WORKLOAD = [
    WorkloadJob("ncf-0", 0, "ncf", 1, 32768),
    WorkloadJob("cifar10-1", 30, "cifar10", 6, 2048),
    WorkloadJob("ncf-2", 90, "ncf", 1, 32768),
    WorkloadJob("bert-3", 200, "bert", 6, 384),
    WorkloadJob("cifar10-4", 400, "cifar10", 8, 2048),
    WorkloadJob("ncf-5", 1200, "ncf", 1, 32768),
]
POLICIES = {
    "pollux": PolluxPolicy(),
    "pollux-nsga2": NsgaPolicy(config=NsgaConfig(10, 3)),
    "optimus": OptimusPolicy(),
    "tiresias": TiresiasPolicy(),
}


def run(policy, config=SMALL, workload=WORKLOAD):
    rounds = []
    result = simulate(workload, APPS, policy, config, on_round=rounds.append)
    return result, rounds


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("name", POLICIES)
def test_every_job_completes_with_a_positive_jct(name, timing):
    result, rounds = run(POLICIES[name], TIMINGS[timing])
    assert set(result.jcts) == {j.name for j in WORKLOAD}
    assert all(jct > 0 for jct in result.jcts.values())
    assert result.makespan == max(j.submission_time + result.jcts[j.name] for j in WORKLOAD)
    assert result.rounds == len(rounds)


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("name", POLICIES)
def test_no_node_ever_holds_more_replicas_than_gpus(name, timing):
    _, rounds = run(POLICIES[name], TIMINGS[timing])
    for record in rounds:
        per_node = Counter(n for job in record["submitted_jobs"] for n in job["allocation"])
        assert all(0 <= n < SMALL.nodes for n in per_node)
        assert max(per_node.values(), default=0) <= SMALL.gpus_per_node
        assert sum(per_node.values()) <= record["num_gpus"]


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("name", ["pollux", "tiresias"])
def test_work_is_conserved_progress_only_grows_and_ends_at_the_final_epoch(name, timing):
    _result, rounds = run(POLICIES[name], TIMINGS[timing])
    last: dict[str, tuple[float, int]] = {}
    for record in rounds:
        for job in record["submitted_jobs"]:
            prev = last.get(job["name"], (0.0, 0))
            assert job["progress"] >= prev[0] - 1e-9
            assert job["epoch"] >= prev[1]
            last[job["name"]] = (job["progress"], job["epoch"])
            if job["completion_time"] is None:
                assert not job["allocation"] or job["batch_size"] > 0
    for spec in WORKLOAD:
        app = APPS[spec.application]
        progress, epoch = last[spec.name]
        assert epoch == app.max_epochs
        assert progress == pytest.approx(app.final_progress)


def test_jobs_without_gpus_make_no_progress():
    _, rounds = run(TiresiasPolicy())
    for record in rounds:
        for job in record["submitted_jobs"]:
            if job["num_restarts"] is None:  # never allocated yet
                assert job["progress"] == 0


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("name", ["pollux", "pollux-nsga2"])
def test_the_same_seed_gives_the_same_simulation(name, timing):
    config = replace(TIMINGS[timing], seed=3)
    first, _ = run(POLICIES[name], config)
    second, _ = run(POLICIES[name], config)
    assert first.jcts == second.jcts


def test_restarts_count_reallocations_after_the_first():
    _, rounds = run(POLICIES["pollux"])
    seen: dict[str, list] = {}
    for record in rounds:
        for job in record["submitted_jobs"]:
            seen.setdefault(job["name"], []).append((tuple(job["allocation"]), job["num_restarts"]))
    for history in seen.values():
        changes = sum(1 for (a, _), (b, _) in itertools.pairwise(history) if a != b and b)
        first_alloc = next((i for i, (a, _) in enumerate(history) if a), None)
        assert first_alloc is not None
        assert history[first_alloc][1] == 0
        assert history[-1][1] <= changes


def test_interference_slows_distributed_jobs_that_share_nodes():
    # Tiresias does not avoid interference; two 6-GPU jobs on 3 × 4 GPUs must share a node.
    workload = [
        WorkloadJob("cifar10-0", 0, "cifar10", 6, 2048),
        WorkloadJob("cifar10-1", 0, "cifar10", 6, 2048),
    ]
    base = SimConfig(nodes=3, gpus_per_node=4)
    calm, _ = run(TiresiasPolicy(), base, workload)
    noisy, _ = run(
        TiresiasPolicy(), SimConfig(nodes=3, gpus_per_node=4, interference=0.5), workload
    )
    assert noisy.average_jct > calm.average_jct * 1.2


def test_pollux_interference_avoidance_makes_the_slowdown_moot():
    workload = [
        WorkloadJob("cifar10-0", 0, "cifar10", 6, 2048),
        WorkloadJob("cifar10-1", 0, "cifar10", 6, 2048),
    ]
    calm, _ = run(PolluxPolicy(), SimConfig(nodes=3, gpus_per_node=4), workload)
    noisy, _ = run(PolluxPolicy(), SimConfig(nodes=3, gpus_per_node=4, interference=0.5), workload)
    assert noisy.jcts == calm.jcts


def test_tiresias_reproduces_the_published_workload_6_exactly():
    workload = load_workload(default_data_root() / "workloads" / "workload-6.csv")
    result = simulate(workload, APPS, TiresiasPolicy())
    assert result.average_jct == pytest.approx(3469.69375, abs=1e-6)  # artifact README


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nodes": 0}, "nodes"),
        ({"gpus_per_node": 8}, "gpus_per_node"),
        ({"interval": 0}, "interval"),
        ({"interference": 1.0}, "interference"),
    ],
    ids=[
        "no nodes",
        "more GPUs per node than the traces cover",
        "zero interval",
        "total interference",
    ],
)
def test_bad_simulator_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimConfig(**kwargs)


def test_an_unknown_application_is_rejected():
    with pytest.raises(ValueError, match="without traces"):
        simulate([WorkloadJob("x-0", 0, "resnet9000", 1, 1)], APPS, TiresiasPolicy())


def test_pollux_params_flow_through(tmp_path: Path):
    # p = 1 (no fairness) on the short workload still completes every job.
    result, _ = run(PolluxPolicy(PolluxParams(p=1.0)))
    assert len(result.jcts) == len(WORKLOAD)
