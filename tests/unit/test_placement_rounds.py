"""Live placement rounds (cycle.plan_round with `placement`): new jobs on free GPUs, no moves."""

from __future__ import annotations

import numpy as np

from pollux.policy.types import AllocationDecision, ClusterState, JobExplain
from pollux.scheduler.cycle import RoundPlan, plan_round
from pollux.service.store import Entry, Snapshot
from pollux.v1 import types_pb2 as pb
from tests.unit.policy_builders import ScriptedPolicy

WARM = object()  # a full round's warm start, which a placement round must keep


class FirstFit(ScriptedPolicy):
    """Gives every job it sees one GPU on the first node with room; keeps what it saw."""

    name = "pollux"

    def __init__(self) -> None:
        self.states: list[ClusterState] = []

    def allocate(
        self, state: ClusterState, memory: object | None, rng: np.random.Generator
    ) -> AllocationDecision:
        self.states.append(state)
        room = {node.name: node.gpus for node in state.nodes}
        allocations: dict[str, tuple[str, ...]] = {}
        for job in state.jobs:
            node = next((n for n, free in room.items() if free > 0), None)
            allocations[job.name] = () if node is None else (node,)
            if node is not None:
                room[node] -= 1
        explain = {j: JobExplain(1.0, 1.0, f"placed on {len(n)}") for j, n in allocations.items()}
        return AllocationDecision(allocations, explain, objective=1.0, memory="new warm start")


NODES = {"n1": pb.Node(name="n1", gpus=2), "n2": pb.Node(name="n2", gpus=2)}


def snapshot(
    jobs: list[pb.Job], tenants: list[pb.Tenant] | None = None, nodes: dict[str, pb.Node] = NODES
) -> Snapshot:
    return Snapshot(
        revision=1,
        jobs={j.id: Entry(j, mod_revision=2, create_revision=1) for j in jobs},
        nodes=nodes,
        agents=[],
        models={},
        replicas=[],
        tenants=tenants or [],
    )


def job(job_id: str, *, nodes: tuple[str, ...] = (), served: float = 0.0) -> pb.Job:
    out = pb.Job(id=job_id, state=pb.JOB_STATE_RUNNING if nodes else pb.JOB_STATE_PENDING)
    out.create_time.FromNanoseconds(int(1e9))
    out.allocation.nodes.extend(nodes)
    out.allocation.time.FromNanoseconds(int(10e9))
    out.attained_gpu_seconds = served
    return out


def round_(
    jobs: list[pb.Job],
    policy: FirstFit,
    *,
    placement: bool,
    tenants: list[pb.Tenant] | None = None,
    nodes: dict[str, pb.Node] = NODES,
) -> RoundPlan:
    return plan_round(
        snapshot(jobs, tenants, nodes),
        policy,
        WARM,
        np.random.default_rng(0),
        now=100.0,
        round_number=7,
        scheduler_id="s",
        placement=placement,
    )


JOBS = [
    job("running", nodes=("n1", "n1", "n2")),  # holds 3 of the 4 GPUs
    job("suspended", served=50.0),  # ran before: waits for a periodic round to resume
    job("new"),
]


def test_a_placement_round_plans_only_new_jobs_on_the_free_gpus_and_moves_nobody():
    policy = FirstFit()
    plan = round_(JOBS, policy, placement=True)
    (state,) = policy.states
    assert [j.name for j in state.jobs] == ["new"]
    assert [(n.name, n.gpus) for n in state.nodes] == [("n2", 1)]
    assert [j.id for j, _ in plan.jobs] == ["new"]  # the only job written
    assert list(plan.jobs[0][0].allocation.nodes) == ["n2"]
    assert plan.decision.placement
    assert [d.job_id for d in plan.decision.jobs] == ["new"]
    assert plan.memory is WARM
    assert plan.held_gpus == 4


def test_a_full_round_plans_every_job_and_takes_the_policys_warm_start():
    policy = FirstFit()
    plan = round_(JOBS, policy, placement=False)
    assert sorted(j.name for j in policy.states[0].jobs) == ["new", "running", "suspended"]
    assert not plan.decision.placement
    assert plan.memory == "new warm start"


def test_a_placement_round_without_new_jobs_or_free_gpus_asks_the_policy_nothing():
    policy = FirstFit()
    plan = round_(JOBS[:2], policy, placement=True)
    assert policy.states == []
    assert plan.jobs == []
    assert plan.decision.placement


def test_a_placement_round_without_free_gpus_records_why_each_new_job_waits():
    # Explain shows the latest record of a job: an empty reason there left `explain` mute
    # until the next full round (the dashboard test's flake).
    policy = FirstFit()
    full = [job("running", nodes=("n1", "n1", "n2", "n2")), job("new")]
    plan = round_(full, policy, placement=True)
    assert policy.states == []
    assert [(d.job_id, d.reason, list(d.nodes)) for d in plan.decision.jobs] == [
        ("new", "pending: every GPU is held", [])
    ]
    empty = round_([job("new")], policy, placement=True, nodes={})
    assert [(d.job_id, d.reason) for d in empty.decision.jobs] == [
        ("new", "pending: no nodes in the cluster")
    ]
    assert empty.jobs == []


def test_with_tenants_an_event_round_is_a_full_one():
    policy = FirstFit()
    tenants = [pb.Tenant(name="team", guarantee_gpus=1)]
    plan = round_(JOBS, policy, placement=True, tenants=tenants)
    assert len(policy.states[0].jobs) == 3
    assert not plan.decision.placement
