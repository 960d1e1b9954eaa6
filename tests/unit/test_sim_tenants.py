"""Tenants in the simulator: assignment, what the policy sees, caps held in every round."""

import argparse
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.wrapped import WrappedPolicy
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.registry import PolicySpec
from pollux.policy.tenant_shares import Ledger
from pollux.policy.types import AllocationDecision, ClusterState, TenantSpec
from pollux.sim.application import load_published_applications
from pollux.sim.cli import parse_tenant
from pollux.sim.runner import RunSpec, run
from pollux.sim.simulator import SimConfig, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob, assign_tenants

APPS = load_published_applications(default_data_root() / "traces")
SMALL = SimConfig(nodes=2, gpus_per_node=4)
WORKLOAD = [
    WorkloadJob("ncf-0", 0, "ncf", 1, 32768),
    WorkloadJob("cifar10-1", 30, "cifar10", 6, 2048),
    WorkloadJob("cifar10-2", 60, "cifar10", 6, 2048),
    WorkloadJob("bert-3", 200, "bert", 6, 384),
    WorkloadJob("cifar10-4", 400, "cifar10", 8, 2048),
]


class Spy(WrappedPolicy[Ledger]):
    """The Pollux policy, keeping every state it was asked about."""

    def __init__(self) -> None:
        super().__init__(PolluxPolicy())
        self.states: list[ClusterState] = []

    def allocate(
        self, state: ClusterState, memory: Ledger | None, rng: np.random.Generator
    ) -> AllocationDecision[Ledger]:
        self.states.append(state)
        return self.inner.allocate(state, memory, rng)


def test_hash_assignment_depends_on_the_name_only_and_round_robin_balances():
    jobs = assign_tenants(WORKLOAD, ["a", "b", "c"])
    again = assign_tenants(list(reversed(WORKLOAD)), ["a", "b", "c"])
    assert {j.name: j.tenant for j in jobs} == {j.name: j.tenant for j in again}
    assert {j.tenant for j in jobs} <= {"a", "b", "c"}
    robin = assign_tenants(WORKLOAD, ["a", "b"], how="round_robin")
    assert [j.tenant for j in robin] == ["a", "b", "a", "b", "a"]
    with pytest.raises(ValueError, match="unknown assignment"):
        assign_tenants(WORKLOAD, ["a"], how="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        assign_tenants(WORKLOAD, [])


MANY = [WorkloadJob(f"job-{i}", float(i), "cifar10", 1, 128) for i in range(4000)]


def test_shares_give_each_tenant_its_fraction_of_the_jobs():
    hashed = Counter(j.tenant for j in assign_tenants(MANY, ["a", "b", "c"], shares=[4, 2, 2]))
    assert hashed == {"a": 2000, "b": 1000, "c": 1000}
    few = Counter(j.tenant for j in assign_tenants(MANY[:7], ["a", "b", "c"], shares=[4, 2, 2]))
    assert abs(few["a"] - 3.5) <= 1  # within one job of 7 × 4/8
    assert abs(few["b"] - 1.75) <= 1
    assert abs(few["c"] - 1.75) <= 1
    robin = [j.tenant for j in assign_tenants(MANY[:8], ["a", "b"], "round_robin", [3, 1])]
    assert robin == ["a", "a", "b", "a", "a", "a", "b", "a"]
    # in hash order, so the tenants do not depend on the order the jobs come in
    again = assign_tenants(list(reversed(MANY)), ["a", "b", "c"], shares=[4, 2, 2])
    assert {j.name: j.tenant for j in again} == {
        j.name: j.tenant for j in assign_tenants(MANY, ["a", "b", "c"], shares=[4, 2, 2])
    }


@pytest.mark.parametrize(
    ("shares", "message"),
    [([1.0], "one share per tenant"), ([1.0, 0.0], "positive"), ([1.0, float("nan")], "positive")],
)
def test_bad_shares_are_refused_with_what_to_fix(shares: list[float], message: str):
    with pytest.raises(ValueError, match=message):
        assign_tenants(WORKLOAD, ["a", "b"], shares=shares)


def test_the_policy_sees_the_tenants_and_every_jobs_tenant():
    specs = (TenantSpec("a", guarantee_gpus=2), TenantSpec("b", cap_gpus=4))
    workload = assign_tenants(WORKLOAD, ["a", "b"], how="round_robin")
    spy = Spy()
    simulate(workload, APPS, spy, replace(SMALL, tenants=specs))
    tenant_of = {j.name: j.tenant for j in workload}
    assert spy.states
    for state in spy.states:
        assert state.tenants == specs
        assert all(job.tenant == tenant_of[job.name] for job in state.jobs)


def test_a_cap_holds_in_every_round_and_every_job_still_completes():
    specs = (TenantSpec("a"), TenantSpec("b", cap_gpus=2))
    workload = assign_tenants(WORKLOAD, ["a", "b"], how="round_robin")
    tenant_of = {j.name: j.tenant for j in workload}
    rounds: list[dict] = []
    result = simulate(
        workload, APPS, PolluxPolicy(), replace(SMALL, tenants=specs), on_round=rounds.append
    )
    assert set(result.jcts) == set(tenant_of)
    for record in rounds:
        used: Counter[str] = Counter()
        for job in record["submitted_jobs"]:
            used[tenant_of[job["name"]]] += len(job["allocation"])
        assert used["b"] <= 2


def test_without_tenant_specs_labelled_jobs_simulate_exactly_as_before():
    short = WORKLOAD[:3]
    plain = simulate(short, APPS, PolluxPolicy(), SMALL)
    labelled = simulate(assign_tenants(short, ["a", "b"]), APPS, PolluxPolicy(), SMALL)
    assert labelled.jcts == plain.jcts
    assert labelled.rounds == plain.rounds


def test_the_runner_assigns_tenants_by_hash_and_records_them(tmp_path: Path):
    csv = tmp_path / "w.csv"
    csv.write_text(
        "name,time,application,num_replicas,batch_size\n"
        + "".join(
            f"{j.name},{j.submission_time:.0f},{j.application},1,{j.batch_size}\n"
            for j in WORKLOAD[:3]
        )
    )
    specs = (TenantSpec("a", cap_gpus=1), TenantSpec("b", weight=2.0))
    spec = RunSpec(PolicySpec("pollux"), replace(SMALL, tenants=specs))
    summary = run(csv, spec, tmp_path / "out", processes=1)
    assert set(summary["jcts"]["w"]) == {j.name for j in WORKLOAD[:3]}
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert [t["name"] for t in info["tenants"]] == ["a", "b"]
    assert info["tenants"][0]["cap_gpus"] == 1


def test_the_command_line_reads_tenants():
    assert parse_tenant("research:16:2:32") == TenantSpec("research", 16, 2.0, 32)
    assert parse_tenant("ops") == TenantSpec("ops")
    for bad in ("", "a:x", "a:8:1:4", "a:1:2:3:4", "a:0:0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_tenant(bad)
