"""The deficits tenant-share method: goodput owed over time tilts tenants' weights."""

import math
from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.policy import ClusterState, JobInfo
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.problem import Problem
from pollux.policy.tenant_shares import Deficits
from pollux.policy.tenant_shares.ledger import (
    HORIZON,
    MEMORY,
    MOST_TILT,
    Ledger,
    owed_tilts,
    settle,
)
from pollux.policy.tenant_shares.weights import guarantee_quota
from pollux.policy.types import AllocationDecision, JobExplain, TenantSpec
from tests.unit.policy_builders import NOW, job, nodes, state

DEFICITS = PolluxPolicy(tenant_shares=Deficits())
SINGLE_POOL = PolluxPolicy()


def tenant_jobs(tenant: str, count: int, **kwargs: object) -> list[JobInfo]:
    return [replace(job(f"{tenant}{i}", **kwargs), tenant=tenant) for i in range(count)]  # type: ignore[arg-type]


def two_tenants(weights: tuple[float, float] = (1.0, 1.0)) -> ClusterState:
    jobs = tenant_jobs("a", 2, max_replicas=16) + tenant_jobs("b", 2, max_replicas=16)
    specs = (TenantSpec("a", weight=weights[0]), TenantSpec("b", weight=weights[1]))
    return replace(state(jobs, nodes(4)), tenants=specs)


def round_of(st_: ClusterState, speed: dict[str, float], gpus: dict[str, int]) -> tuple:
    """The round's problem and quota, and a decision giving each tenant's jobs `speed`."""
    problem = Problem(st_, DEFICITS.params)
    quota = guarantee_quota(problem)
    decision = AllocationDecision(
        allocations={j.name: ("n0",) * gpus[j.tenant] for j in st_.jobs},
        explain={j.name: JobExplain(speed[j.tenant], 1.0, "") for j in st_.jobs},
    )
    return problem, quota, decision


def run(ledger: Ledger | None, st_: ClusterState, rounds: int, **decided: dict) -> list[Ledger]:
    """`settle` over `rounds` rounds 60 s apart, the same decision each round."""
    out = []
    for r in range(rounds):
        now_state = replace(st_, now=NOW + 60.0 * r)
        problem, quota, decision = round_of(now_state, decided["speed"], decided["gpus"])
        ledger = settle(ledger, quota, problem, decision)
        out.append(ledger)
    return out


@settings(max_examples=40, deadline=None)
@given(
    behind=st.floats(0.05, 0.95),
    weights=st.sampled_from([(1.0, 1.0), (2.0, 1.0), (1.0, 3.0)]),
    p=st.sampled_from([-1.0, -0.5, 0.0, 0.5]),
)
def test_a_tenant_persistently_below_its_share_gets_a_growing_weight(behind, weights, p):
    st_ = two_tenants(weights)
    entitled_a = weights[0] / sum(weights)
    share_a = entitled_a * (1 - behind)  # a gets only this share of the goodput, every round
    speed = {"a": share_a / 2, "b": (1 - share_a) / 2}
    ledgers = run(None, st_, 12, speed=speed, gpus={"a": 1, "b": 1})
    factors = [owed_tilts(ledger, ("a", "b"), p) for ledger in ledgers]
    a_tilt = [float(f[0]) for f in factors]
    b_tilt = [float(f[1]) for f in factors]
    assert a_tilt[0] == 1.0  # the first round's error holds until the next round
    bound = MOST_TILT ** (1 - p)
    # Strictly growing (shrinking for b, which is ahead) until it reaches the most tilt.
    assert all(x > y or x == pytest.approx(bound) for y, x in pairwise(a_tilt[1:]))
    assert all(x < y or x == pytest.approx(1 / bound) for y, x in pairwise(b_tilt[1:]))
    assert max(a_tilt) <= bound * (1 + 1e-12)
    assert min(b_tilt) >= (1 - 1e-12) / bound


def test_the_deficit_integrates_the_relative_shortfall_over_seconds_and_decays():
    st_ = two_tenants()
    # a gets 20 % of the goodput, entitled to 50 %: relative shortfall 0.6, b's surplus 0.6.
    first, second = run(None, st_, 2, speed={"a": 0.5, "b": 2.0}, gpus={"a": 1, "b": 1})
    assert first.deficit == {"a": 0.0, "b": 0.0}
    assert first.error["a"] == pytest.approx(0.6)
    assert first.error["b"] == pytest.approx(-0.6)
    assert second.deficit["a"] == pytest.approx(0.6 * 60.0)
    # A round with no contention later: no new error, and the deficit only decays (the
    # interval counted at most HORIZON seconds, however long the scheduler was away).
    later = replace(st_, now=second.now + 10 * HORIZON)
    problem, quota, decision = round_of(later, {"a": 1.0, "b": 1.0}, {"a": 1, "b": 1})
    third = settle(second, quota, problem, decision)
    expected = second.deficit["a"] * math.exp(-HORIZON / MEMORY) + second.error["a"] * HORIZON
    assert third.deficit["a"] == pytest.approx(expected)


def test_a_satisfied_tenant_is_owed_nothing():
    # b's jobs hold everything they can use (max_replicas 1): only a contends.
    jobs = tenant_jobs("a", 2, max_replicas=16) + tenant_jobs("b", 2, max_replicas=1)
    st_ = replace(state(jobs, nodes(4)), tenants=(TenantSpec("a"), TenantSpec("b")))
    ledgers = run(None, st_, 3, speed={"a": 0.1, "b": 5.0}, gpus={"a": 4, "b": 1})
    assert all(v == 0.0 for ledger in ledgers for v in ledger.deficit.values())


def test_a_tenant_at_its_cap_gains_no_deficit():
    jobs = tenant_jobs("a", 2, max_replicas=16) + tenant_jobs("b", 2, max_replicas=16)
    specs = (TenantSpec("a", cap_gpus=2), TenantSpec("b"))
    st_ = replace(state(jobs, nodes(4)), tenants=specs)
    ledgers = run(None, st_, 3, speed={"a": 0.1, "b": 2.0}, gpus={"a": 1, "b": 4})
    assert ledgers[-1].deficit["a"] == 0.0  # more weight could not get it more GPUs


def test_the_first_round_is_single_pool_pollux_and_returns_a_ledger():
    st_ = two_tenants((2.0, 1.0))
    rng = np.random.default_rng(0)
    ours = DEFICITS.allocate(st_, None, rng)
    plain = SINGLE_POOL.allocate(replace(st_, tenants=()), None, np.random.default_rng(0))
    assert ours.allocations == plain.allocations
    assert isinstance(ours.memory, Ledger)


def rounds(policy: PolluxPolicy, st_: ClusterState, count: int) -> list[AllocationDecision]:
    """`count` rounds 60 s apart, each job keeping the allocation it was given."""
    memory, out = None, []
    for r in range(count):
        st_ = replace(st_, now=NOW + 60.0 * r)
        decision = policy.allocate(st_, memory, np.random.default_rng(0))
        memory = decision.memory
        out.append(decision)
        jobs = tuple(replace(j, allocation=decision.allocations[j.name]) for j in st_.jobs)
        st_ = replace(st_, jobs=jobs)
    return out


def test_with_one_tenant_the_objective_is_unchanged():
    jobs = tenant_jobs("a", 5, max_replicas=8)
    st_ = replace(state(jobs, nodes(4)), tenants=(TenantSpec("a"),))
    ours, plain = rounds(DEFICITS, st_, 5), rounds(SINGLE_POOL, replace(st_, tenants=()), 5)
    assert [d.allocations for d in ours] == [d.allocations for d in plain]
    assert [d.objective for d in ours] == [d.objective for d in plain]
    assert all(isinstance(d.memory, Ledger) and d.memory.deficit == {"a": 0.0} for d in ours)


def test_long_run_shares_converge_to_the_entitlements():
    # Identical jobs: single-pool Pollux splits goodput 1:1; tenant a is entitled to 2/3.
    jobs = tenant_jobs("a", 6, max_replicas=16) + tenant_jobs("b", 6, max_replicas=16)
    specs = (TenantSpec("a", weight=2.0), TenantSpec("b"))
    st_ = replace(state(jobs, nodes(8)), tenants=specs)

    def share(decisions: list[AllocationDecision]) -> float:
        good = {"a": 0.0, "b": 0.0}
        for decision in decisions:
            for j in st_.jobs:
                good[j.tenant] += decision.explain[j.name].speedup
        return good["a"] / (good["a"] + good["b"])

    # The restart penalty makes the allocation move in steps, each once the deficit is
    # worth a re-allocation; within an hour (60 rounds) the shares have settled.
    decisions = rounds(DEFICITS, st_, 60)
    assert share(decisions[:1]) == pytest.approx(0.5, abs=0.05)
    assert share(decisions[-20:]) == pytest.approx(2 / 3, rel=0.05)
    assert share(decisions[:20]) < share(decisions[20:40]) < share(decisions[40:])
