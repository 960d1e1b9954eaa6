"""Fairness between the users of a tenant: the owner factor, turns, and every policy's use."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.jct import JctParams
from pollux.policy.optimus import OptimusPolicy
from pollux.policy.owners import by_owner_turns, next_in_turn, owner_factor, owners_of, turns
from pollux.policy.placement import owed_first_gpus, owed_moves, placement_state
from pollux.policy.rounds import decide_round
from pollux.policy.tiresias import TiresiasPolicy
from pollux.policy.types import ClusterState, JobInfo, NodeInfo, OracleInfo, TenantSpec
from pollux.policy.weights import WeightFactors
from tests.unit.policy_builders import NOW, Fixed, random_state

POLLUX = {"pollux": PolluxPolicy(), "pollux-jct": PolluxPolicy(jct=JctParams())}
TENANTS = (TenantSpec("a"), TenantSpec("b"))

# A job's (tenant, owner): tenants a, b, "" (the default) and one no spec defines.
OWNED = st.lists(
    st.tuples(st.sampled_from(["a", "b", "", "undefined"]), st.sampled_from(["u0", "u1", "u2"])),
    min_size=1,
    max_size=40,
)


def owned_state(pairs: list[tuple[str, str]], gpus: int = 8) -> ClusterState:
    jobs = tuple(
        JobInfo(f"j{i}", float(i), tenant=tenant, owner=owner)
        for i, (tenant, owner) in enumerate(pairs)
    )
    return ClusterState(NOW, (NodeInfo("n0", gpus),), jobs, TENANTS)


def share(owners: int, gpus: int) -> int:
    """S_t: the jobs one of `owners` users runs on its share of `gpus` GPUs (none running)."""
    return max(1, round(gpus / owners))


# -- the factor ----------------------------------------------------------------------------


@given(OWNED, st.integers(1, 64))
def test_each_user_holds_an_equal_part_of_its_tenant_and_tenants_keep_their_weight(
    pairs: list[tuple[str, str]], gpus: int
) -> None:
    st_ = owned_state(pairs, gpus)
    factor = owner_factor(st_)
    keys = owners_of(st_)
    if factor is None:  # no tenant has two owners
        assert all(len({u for t2, u in keys if t2 == t}) == 1 for t, _ in keys)
        return
    assert factor.max() == 1.0
    jobs = Counter(keys)
    owners = Counter(t for t, _ in jobs)
    tenants: dict[str, float] = {}
    part: dict[tuple[str, str], float] = {}
    for key, f in zip(keys, factor.tolist(), strict=True):
        tenants[key[0]] = tenants.get(key[0], 0.0) + f
        # The weight of the jobs its share of the cluster runs at once: its part.
        part[key] = f * min(jobs[key], share(owners[key[0]], gpus))
    per_job = [total / sum(1 for k in keys if k[0] == t) for t, total in tenants.items()]
    # Every tenant's total is its job count (times one common scale), as without the factor.
    assert max(per_job) == pytest.approx(min(per_job))
    for tenant in tenants:
        parts = [w for (t, _), w in part.items() if t == tenant]
        assert max(parts) == pytest.approx(min(parts))  # each user of it alike


@given(st.integers(1, 300), st.integers(1, 5), st.integers(1, 64))
def test_a_users_part_does_not_grow_with_the_jobs_it_queues(
    queued: int, others: int, gpus: int
) -> None:
    pairs = [("", "mallory")] * queued + [("", "victor")] * others
    factor = owner_factor(owned_state(pairs, gpus))
    assert factor is not None
    most = share(2, gpus)
    mallory, victor = factor[0], factor[-1]
    assert mallory * min(queued, most) == pytest.approx(victor * min(others, most))
    # Per job, the user queueing fewer weighs at least as much.
    assert (victor >= mallory) == (min(others, most) <= min(queued, most)) or np.isclose(
        victor, mallory
    )


def test_a_users_share_counts_the_gpus_a_running_job_holds() -> None:
    # 16 GPUs, two users: 8 GPUs each. Running jobs hold 4 GPUs each, so a user's share
    # runs two jobs at once, not 8: mallory's 2 jobs of 6 that it runs weigh victor's one.
    four = ("n0",) * 4
    jobs = [
        JobInfo(f"m{i}", float(i), allocation=four if i < 2 else (), owner="mallory")
        for i in range(6)
    ]
    jobs.append(JobInfo("v0", 9.0, allocation=four, owner="victor"))
    st_ = ClusterState(NOW, (NodeInfo("n0", 16),), tuple(jobs))
    factor = owner_factor(st_)
    assert factor is not None
    assert factor.tolist() == pytest.approx([0.5] * 6 + [1.0])
    # Running jobs holding one GPU each: a share runs 8 at once, all 6 of hers count.
    ones = replace(st_, jobs=tuple(replace(j, allocation=j.allocation[:1]) for j in jobs))
    factor = owner_factor(ones)
    assert factor is not None
    assert factor.tolist() == pytest.approx([1 / 6] * 6 + [1.0])


def test_undefined_tenant_names_are_the_default_tenant_so_inventing_them_gains_nothing() -> None:
    pairs = [("x1", "mallory"), ("x2", "mallory"), ("x3", "mallory"), ("", "victor")]
    assert owners_of(owned_state(pairs))[0] == ("", "mallory")
    factor = owner_factor(owned_state(pairs))
    assert factor is not None
    assert factor.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])


def test_the_owner_factor_is_one_of_the_weight_factors() -> None:
    rank, owner = np.array([1.0, 0.5, 0.25]), np.array([0.5, 1.0, 1.0])
    combined = WeightFactors(remaining_work=rank, owner=owner).combined()
    assert combined is not None
    assert combined.tolist() == pytest.approx([1.0, 1.0, 0.5])
    assert np.array_equal(WeightFactors(owner=owner).combined(), owner)


# -- turns ---------------------------------------------------------------------------------


@given(OWNED)
def test_turns_interleave_the_users_of_each_tenant_and_keep_each_users_order(
    pairs: list[tuple[str, str]],
) -> None:
    keys = owners_of(owned_state(pairs))
    order = turns(keys)
    assert sorted(order) == list(range(len(keys)))
    for position, i in enumerate(order):
        assert keys[i][0] == keys[position][0]  # tenants keep their positions
    jobs = Counter(keys)
    for key in jobs:
        mine = [i for i in order if keys[i] == key]
        assert mine == sorted(mine)  # a user's jobs in their own order
    for tenant in {t for t, _ in keys}:
        served: Counter[tuple[str, str]] = Counter()
        for i in (i for i in order if keys[i][0] == tenant):
            owner = keys[i]
            waiting = [k for k in jobs if k[0] == tenant and served[k] < jobs[k]]
            # No user's next turn before another user's earlier one; in one turn, the user
            # with fewer jobs first.
            assert all(
                (served[owner], jobs[owner]) <= (served[k], jobs[k])
                or (served[owner], jobs[owner]) == (served[k], jobs[k])
                for k in waiting
            )
            served[owner] += 1


@given(st.lists(st.sampled_from("ab"), max_size=30))
def test_with_one_user_per_tenant_the_order_is_unchanged(tenants: list[str]) -> None:
    keys = [(t, f"only-{t}") for t in tenants]
    assert turns(keys) == list(range(len(keys)))


# -- neutral with one owner per tenant -------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_with_one_owner_per_tenant_every_policy_decides_exactly_as_before(
    seed: int, with_tenants: bool
) -> None:
    rng = np.random.default_rng(seed)
    st_ = random_state(rng, num_nodes=4)
    names = ["a", "b"]
    jobs = []
    for info in st_.jobs:
        tenant = str(rng.choice(names)) if with_tenants else ""
        demand = max(1, min(info.max_replicas, 4))
        jobs.append(replace(info, tenant=tenant, owner=f"user-of-{tenant}", target_replicas=demand))
    st_ = replace(st_, jobs=tuple(jobs), tenants=TENANTS if with_tenants else ())
    assert owner_factor(st_) is None
    assert by_owner_turns(st_) is st_
    assert not owed_first_gpus(st_)
    policies = [*POLLUX.values(), TiresiasPolicy()]
    for policy in policies:
        fair = policy.allocate(st_, None, np.random.default_rng(0))
        alike = replace(policy, user_fairness=False).allocate(st_, None, np.random.default_rng(0))
        assert fair.allocations == alike.allocations
        assert fair.explain == alike.explain
        assert fair.objective == alike.objective or np.isnan(fair.objective)


# -- one user's backlog against another user's job -------------------------------------------

CLUSTER = (NodeInfo("n0", 2), NodeInfo("n1", 2))


def backlog(free_gpu: bool = False) -> ClusterState:
    """mallory holds every GPU (or all but one) and queues 100 more; victor has one job."""
    oracle = OracleInfo(np.array([np.inf, 1.0, 0.6, 0.45, 0.4]), 1000.0)

    def info(name: str, owner: str, age: float, on: tuple[str, ...] = ()) -> JobInfo:
        return JobInfo(
            name,
            NOW - age,
            allocation=on,
            attained_service=60.0 if on else 0.0,
            max_replicas=4,
            target_replicas=1,
            owner=owner,
            oracle=oracle,
        )

    running = [("n0",), ("n0",), ("n1",)] + ([] if free_gpu else [("n1",)])
    jobs = [info(f"m-run-{i}", "mallory", 600.0, on) for i, on in enumerate(running)]
    jobs += [info(f"m-wait-{i}", "mallory", 300.0 - i) for i in range(100)]
    # A round old: a younger job's first start is discounted by its age (restart factor).
    jobs.append(info("victor", "victor", 60.0))
    return ClusterState(NOW, CLUSTER, tuple(jobs))


@pytest.mark.parametrize("name", ["pollux", "pollux-jct", "optimus", "tiresias"])
def test_a_full_round_gives_the_other_users_job_a_gpu_despite_the_backlog(name: str) -> None:
    policy = {**POLLUX, "optimus": OptimusPolicy(), "tiresias": TiresiasPolicy()}[name]
    st_ = backlog()
    fair = policy.allocate(st_, None, np.random.default_rng(0))
    assert fair.allocations["victor"], fair.explain["victor"]
    held = sum(len(a) for n, a in fair.allocations.items() if n != "victor")
    assert held >= 2, "mallory keeps GPUs too: the factor shares, it does not hand over"
    alike = replace(policy, user_fairness=False).allocate(st_, None, np.random.default_rng(0))
    assert not alike.allocations["victor"], "every job alike: victor waits behind the backlog"


@pytest.mark.parametrize("name", ["pollux", "pollux-jct", "optimus", "tiresias"])
def test_an_event_round_with_no_free_gpu_preempts_one_backlog_job_for_the_other_user(
    name: str,
) -> None:
    # mallory holds every GPU: one of her jobs (alike: the first) makes way for victor's.
    policy = {**POLLUX, "optimus": OptimusPolicy(), "tiresias": TiresiasPolicy()}[name]
    st_ = backlog()
    assert owed_first_gpus(st_) == {("", "victor")}
    assert owed_moves(st_) == {"m-run-0"}
    fair = decide_round(st_, policy, "warm", np.random.default_rng(0), placement=True)
    assert not fair.full
    assert fair.memory == "warm"
    assert fair.decision.allocations["victor"] == ("n0",)
    assert fair.decision.allocations["m-run-0"] == ()
    assert "preempted" in fair.decision.explain["m-run-0"].reason
    assert fair.planned is not None
    assert {"m-run-1", "m-run-2", "m-run-3"}.isdisjoint(fair.planned)  # nobody else moved
    assert not any(fair.decision.allocations.get(f"m-wait-{i}") for i in range(100))
    alike = decide_round(
        st_, replace(policy, user_fairness=False), None, np.random.default_rng(0), placement=True
    )
    assert not alike.decision.allocations.get("victor")
    assert "m-run-0" not in (alike.planned or ())


def test_no_job_is_preempted_unless_an_owed_user_takes_its_gpu() -> None:
    # A policy that places nobody: the round places as if nobody were owed, moving no one.
    st_ = backlog()
    nobody = Fixed({})
    decided = decide_round(st_, nobody, "warm", np.random.default_rng(0), placement=True)
    assert "m-run-0" not in (decided.planned or ())
    assert dict(decided.decision.allocations) == {}
    assert "every GPU is held" in decided.decision.explain["victor"].reason


def test_the_preempted_jobs_are_the_cheapest_of_the_user_holding_most() -> None:
    # Seven GPUs, all held (a: 5, c: 2); b and d hold none and wait: two GPUs are owed.
    def running(name: str, owner: str, gpus: int, attained: float, submitted: float) -> JobInfo:
        return JobInfo(name, submitted, allocation=("n0",) * gpus, attained_service=attained,
                       owner=owner)  # fmt: skip

    jobs = (
        running("a-big", "a", 2, 10.0, 0.0),  # holds two: frees more than needed
        running("a-old", "a", 1, 900.0, 0.0),  # has run longest: most to lose
        running("a-young", "a", 1, 10.0, 50.0),
        running("a-twin", "a", 1, 10.0, 40.0),
        running("c-one", "c", 2, 5.0, 0.0),
        JobInfo("b-new", 60.0, owner="b"),
        JobInfo("d-new", 61.0, owner="d"),
    )
    st_ = ClusterState(NOW, (NodeInfo("n0", 7),), jobs)
    assert owed_first_gpus(st_) == {("", "b"), ("", "d")}
    # a holds most both times (5, then 4): its one-GPU jobs that ran least, newest first.
    assert owed_moves(st_) == {"a-young", "a-twin"}
    decided = decide_round(
        st_, POLLUX["pollux-jct"], None, np.random.default_rng(0), placement=True
    )
    held = {name for name, on in decided.decision.allocations.items() if on}
    assert held == {"b-new", "d-new"}


def test_no_user_gives_up_its_last_gpu_for_another() -> None:
    # a holds two GPUs, three users hold none: one GPU of a's is owed, not both.
    st_ = owned_jobs({"a": 2}, {"b": 1, "c": 1, "d": 1}, 2)
    assert owed_first_gpus(st_) == {("", "b"), ("", "c"), ("", "d")}
    assert len(owed_moves(st_)) == 1
    assert not owed_moves(owned_jobs({"a": 1, "b": 1}, {"c": 1}, 2))


def test_the_freed_gpus_are_offered_by_turn_counting_the_preemption() -> None:
    st_ = backlog()
    placed = placement_state(st_, freeing={"m-run-0"})
    assert [(n.name, n.gpus) for n in placed.nodes] == [("n0", 1)]
    assert [job.name for job in placed.jobs] == ["victor"]  # mallory holds 3, victor none


def owned_jobs(held: dict[str, int], waiting: dict[str, int], gpus: int) -> ClusterState:
    """Users holding `held` one-GPU jobs on one node of `gpus` and `waiting` new jobs each."""
    jobs = [
        JobInfo(f"{user}-run-{i}", 0.0, allocation=("n0",), attained_service=60.0, owner=user)
        for user, count in held.items()
        for i in range(count)
    ]
    jobs += [
        JobInfo(f"{user}-new-{i}", 1.0, owner=user)
        for user, count in waiting.items()
        for i in range(count)
    ]
    return ClusterState(NOW, (NodeInfo("n0", gpus),), tuple(jobs))


@pytest.mark.parametrize(
    ("held", "waiting", "gpus", "owed"),
    [
        ({"a": 4}, {"b": 1}, 4, "b"),  # b waits for a GPU that a holds a fourth of
        ({"a": 3}, {"b": 1}, 4, ""),  # one is free: a placement round gives it to b
        ({"a": 3}, {"b": 1, "c": 2}, 4, "bc"),  # one free GPU for two users holding none
        ({"a": 2, "b": 1}, {"b": 3}, 3, ""),  # b holds a GPU already
        ({"a": 1, "b": 1}, {"c": 1}, 2, ""),  # nobody holds a second GPU to give
        ({"a": 4}, {"a": 5}, 4, ""),  # one user: nobody is owed anything
        ({"a": 2}, {"b": 1}, 2, "b"),
    ],
)
def test_a_user_is_owed_a_first_gpu_when_only_a_move_can_give_it(
    held: dict[str, int], waiting: dict[str, int], gpus: int, owed: str
) -> None:
    assert owed_first_gpus(owned_jobs(held, waiting, gpus)) == {("", user) for user in owed}


def test_a_job_that_ran_before_waits_for_the_periodic_round_as_without_users() -> None:
    # b's job ran and was preempted: placement rounds never place it, so b is owed nothing.
    st_ = owned_jobs({"a": 2}, {}, 2)
    ran = JobInfo("b-old", 1.0, attained_service=30.0, restarts=1, owner="b")
    assert not owed_first_gpus(replace(st_, jobs=(*st_.jobs, ran)))


def test_users_are_owed_only_their_own_tenants_gpus() -> None:
    st_ = owned_jobs({"a": 2}, {"b": 1}, 2)
    jobs = tuple(replace(j, tenant="x") if j.owner == "b" else j for j in st_.jobs)
    assert not owed_first_gpus(replace(st_, jobs=jobs, tenants=(TenantSpec("x"),)))
    # "x" undefined: the default tenant, a's; inventing a tenant name changes nothing.
    assert owed_first_gpus(replace(st_, jobs=jobs)) == {("", "b")}


@pytest.mark.parametrize("name", ["pollux", "pollux-jct"])
def test_a_placement_round_gives_a_freed_gpu_to_the_other_users_job(name: str) -> None:
    policy = POLLUX[name]
    st_ = backlog(free_gpu=True)
    fair = decide_round(st_, policy, None, np.random.default_rng(0), placement=True)
    assert fair.decision.allocations["victor"] == ("n1",)
    assert fair.planned is not None
    assert "m-run-0" not in fair.planned  # nobody else moved
    alike = decide_round(
        st_, replace(policy, user_fairness=False), None, np.random.default_rng(0), placement=True
    )
    assert not alike.decision.allocations["victor"]
    assert alike.decision.allocations["m-wait-0"] == ("n1",)  # the oldest waiting job


@pytest.mark.parametrize("name", ["pollux", "pollux-jct", "optimus", "tiresias"])
def test_equal_claims_of_two_users_are_served_in_turns(name: str) -> None:
    # Identical one-GPU jobs submitted at once, alice's first in the snapshot; two GPUs.
    policy = {**POLLUX, "optimus": OptimusPolicy(), "tiresias": TiresiasPolicy()}[name]
    oracle = OracleInfo(np.array([np.inf, 1.0]), 1000.0)
    jobs = tuple(
        JobInfo(f"{owner}-{i}", NOW - 100, max_replicas=1, target_replicas=1, owner=owner,
                oracle=oracle)
        for owner, i in [("alice", 0), ("alice", 1), ("alice", 2), ("bob", 0), ("bob", 1)]
    )  # fmt: skip
    st_ = ClusterState(NOW, (NodeInfo("n0", 2),), jobs)
    got = policy.allocate(st_, None, np.random.default_rng(0)).allocations
    assert {n for n, a in got.items() if a} == {"alice-0", "bob-0"}
    alike = replace(policy, user_fairness=False).allocate(st_, None, np.random.default_rng(0))
    assert {n for n, a in alike.allocations.items() if a} == {"alice-0", "alice-1"}


def test_placement_rounds_offer_free_gpus_to_the_users_holding_fewest_first() -> None:
    def waiting(name: str, owner: str, age: float) -> JobInfo:
        return JobInfo(name, NOW - age, max_replicas=1, owner=owner)

    holding = JobInfo("a-run", NOW - 900, allocation=("n0",), attained_service=60.0, owner="alice")
    queue = [waiting(f"a-{i}", "alice", 600 - i) for i in range(3)]
    queue += [waiting(f"b-{i}", "bob", 60 - i) for i in range(2)]
    st_ = ClusterState(NOW, (NodeInfo("n0", 3),), (holding, *queue))
    # Two GPUs free: bob (holding none) gets the first turn and, alice holding one, the
    # second goes to whoever queued fewer.
    assert [job.name for job in next_in_turn(st_, queue, 2)] == ["b-0", "b-1"]
    assert [job.name for job in next_in_turn(st_, queue, 3)] == ["a-0", "b-0", "b-1"]
    assert next_in_turn(st_, queue, 5) == queue
    one_owner = replace(st_, jobs=tuple(replace(j, owner="alice") for j in st_.jobs))
    assert next_in_turn(one_owner, one_owner.jobs[1:], 2) == list(one_owner.jobs[1:])
    for policy in POLLUX.values():
        decided = decide_round(st_, policy, None, np.random.default_rng(0), placement=True)
        held = {n for n, a in decided.decision.allocations.items() if a}
        assert held == {"b-0", "b-1"}
        assert decided.planned == {job.name for job in queue}
        assert "users holding fewer" in decided.decision.explain["a-0"].reason
