"""The autoscaled simulator: a fixed pool is `simulate`, pools grow and shrink, nodes are billed."""

from __future__ import annotations

from typing import Any

import pytest

from pollux.autoscale import THROUGHPUT_RULE, NodePool
from pollux.policy.registry import PolicySpec, make_policy
from pollux.sim.application import Application, load_published_applications
from pollux.sim.autoscaling import AutoscaleConfig, ElasticCluster, simulate_autoscaled
from pollux.sim.simulator import SimConfig, simulate
from pollux.sim.workload import WorkloadJob

APPS: dict[str, Application] = {}


def apps() -> dict[str, Application]:
    if not APPS:
        APPS.update(load_published_applications())
    return APPS


WORKLOAD = (
    WorkloadJob("cifar10-0", 0.0, "cifar10", 4, 1024),
    WorkloadJob("ncf-1", 100.0, "ncf", 1, 32768),
    WorkloadJob("cifar10-2", 700.0, "cifar10", 8, 2048),
    WorkloadJob("bert-3", 900.0, "bert", 6, 384),
)


@pytest.mark.parametrize("policy", ["pollux", "tiresias"])
def test_a_fixed_pool_runs_exactly_as_the_simulator(policy: str) -> None:
    config = SimConfig(nodes=2)
    want = simulate(WORKLOAD, apps(), make_policy(PolicySpec(policy)), config)
    got = simulate_autoscaled(
        WORKLOAD, apps(), make_policy(PolicySpec(policy)), config, AutoscaleConfig.fixed(2)
    )
    assert got.sim.jcts == want.jcts
    assert got.sim.restarts == want.restarts
    assert got.sim.gpu_seconds == want.gpu_seconds
    assert got.node_hours == pytest.approx(2 * want.makespan / 3600)
    assert got.sizes == ((0.0, 2, 0),)


def pool(**kw: Any) -> NodePool:
    return NodePool("g", gpus_per_node=4, min_nodes=1, max_nodes=4, cost_per_node_hour=2.0, **kw)


def test_an_autoscaled_cluster_grows_with_its_jobs_and_shrinks_when_they_end() -> None:
    cluster = ElasticCluster(
        apps(),
        make_policy(PolicySpec("pollux")),
        SimConfig(),
        AutoscaleConfig((pool(),), provisioning_delay_s=120.0),
    )
    for job in WORKLOAD:
        cluster.submit(job)
    rounds: list[dict[str, Any]] = []
    while not cluster.idle:
        cluster.step()
        rounds.append(cluster.record())
    result = cluster.result()
    assert set(result.sim.jcts) == {j.name for j in WORKLOAD}
    peak = max(ready + provisioning for _, ready, provisioning in result.sizes)
    assert peak > 1
    assert any("up 1 →" in reason for _, reason in result.decisions)
    for record in rounds:
        assert record["num_gpus"] == 4 * record["num_nodes"]
        used = {n for j in record["submitted_jobs"] for n in j["allocation"]}
        assert len(used) <= record["num_nodes"]
    assert result.total_cost == pytest.approx(2.0 * result.node_hours)
    assert 0 < result.utilisation <= 1
    # With no jobs left, the idle nodes go after the cooldown and the idle timeout.
    for _ in range(10):
        cluster.step()
    assert cluster.record()["num_nodes"] == 1
    assert "no active jobs" in cluster.fleet.decisions[-1][1]


def test_nodes_join_only_after_the_provisioning_delay() -> None:
    job = (WorkloadJob("cifar10-0", 0.0, "cifar10", 4, 1024),)
    first_growth: list[float] = []
    for delay in (0.0, 300.0):
        rounds: list[dict[str, Any]] = []
        simulate_autoscaled(
            job,
            apps(),
            make_policy(PolicySpec("pollux")),
            SimConfig(),
            AutoscaleConfig((pool(),), provisioning_delay_s=delay),
            on_round=rounds.append,
        )
        asked = next(r["timestamp"] for r in rounds if r["provisioning"] or r["num_nodes"] > 1)
        joined = next(r["timestamp"] for r in rounds if r["num_nodes"] > 1)
        assert joined - asked >= delay
        first_growth.append(joined)
    assert first_growth[1] > first_growth[0]


def test_efficiency_blind_jobs_run_the_largest_per_gpu_batch_without_accumulation() -> None:
    cluster = ElasticCluster(
        apps(),
        make_policy(PolicySpec("pollux")),
        SimConfig(),
        AutoscaleConfig((pool(),), THROUGHPUT_RULE),
        efficiency_blind=True,
    )
    cluster.submit(WorkloadJob("imagenet-0", 0.0, "imagenet", 24, 3200))
    seen = []
    for _ in range(30):
        cluster.step()
        job = cluster.record()["submitted_jobs"][0]
        if job["allocation"]:
            seen.append((job["batch_size"] // len(job["allocation"]), job["accum_steps"]))
    app = apps()["imagenet"]
    # The best of the candidate batches (a geometric grid) nearest the memory limit.
    assert all(m >= 0.95 * app.max_local_bsz and s == 0 for m, s in seen)
    assert max(len(cluster.record()["submitted_jobs"][0]["allocation"]), 0) > 4


def test_submissions_are_checked() -> None:
    cluster = ElasticCluster(
        apps(), make_policy(PolicySpec("pollux")), SimConfig(), AutoscaleConfig.fixed(1)
    )
    cluster.submit(WorkloadJob("a", 0.0, "cifar10", 1, 128))
    with pytest.raises(ValueError, match="no traces"):
        cluster.submit(WorkloadJob("b", 0.0, "mnist", 1, 128))
    with pytest.raises(ValueError, match="exists already"):
        cluster.submit(WorkloadJob("a", 0.0, "cifar10", 1, 128))
    cluster.step()
    with pytest.raises(ValueError, match="is past"):
        cluster.submit(WorkloadJob("c", 0.0, "cifar10", 1, 128))
    with pytest.raises(KeyError, match="no job called 'zz'"):
        cluster.cancel("zz")
    cluster.cancel("a")
    assert cluster.idle
    assert cluster.cancelled == {"a"}
