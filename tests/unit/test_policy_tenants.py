"""Tenants in the Pollux policy: caps, guarantees, goodput shares by weight, borrowing."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.nsga2 import NsgaConfig, NsgaPolicy
from pollux.policy import ClusterState, JobInfo, PolicyInputError
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.quota import Tenants, entitlements
from pollux.policy.tenant_shares import Budgets, Weights
from pollux.policy.types import AllocationDecision, TenantSpec
from tests.unit.policy_builders import (
    THREE_TENANTS,
    job,
    labelled,
    nodes,
    random_state,
    state,
    tenant_specs,
)

GREEDY = PolluxPolicy(tenant_shares=Budgets())  # written for the budgets method
RNG = np.random.default_rng(0)


def allocate(st_: ClusterState) -> AllocationDecision:
    return GREEDY.allocate(st_, None, np.random.default_rng(0))


def held(decision: AllocationDecision, st_: ClusterState) -> Counter[str]:
    """GPUs per tenant name (as the jobs name them)."""
    out: Counter[str] = Counter()
    for j in st_.jobs:
        out[j.tenant] += len(decision.allocations[j.name])
    return out


def goodput(decision: AllocationDecision, st_: ClusterState) -> Counter[str]:
    """Sum of the jobs' speedups per tenant."""
    out: Counter[str] = Counter()
    for j in st_.jobs:
        out[j.tenant] += decision.explain[j.name].speedup
    return out


def tenant_jobs(tenant: str, count: int, **kwargs: object) -> list[JobInfo]:
    return [replace(job(f"{tenant}{i}", **kwargs), tenant=tenant) for i in range(count)]  # type: ignore[arg-type]


# -- specs and validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "tenants[].name"),
        ({"name": "a", "guarantee_gpus": -1}, "tenants[a].guarantee_gpus"),
        ({"name": "a", "weight": 0.0}, "tenants[a].weight"),
        ({"name": "a", "weight": -2.0}, "tenants[a].weight"),
        ({"name": "a", "weight": float("nan")}, "tenants[a].weight"),
        ({"name": "a", "cap_gpus": -4}, "tenants[a].cap_gpus"),
        ({"name": "a", "guarantee_gpus": 8, "cap_gpus": 4}, "tenants[a].cap_gpus"),
    ],
)
def test_bad_tenant_specs_are_rejected_naming_the_field(kwargs, field):
    with pytest.raises(PolicyInputError) as err:
        TenantSpec(**kwargs)
    assert err.value.field == field


def test_a_zero_or_missing_cap_means_none_and_guarantees_may_exceed_the_cluster():
    assert TenantSpec("a", 8, 1.0, 0).cap is None
    assert TenantSpec("a", 8).cap is None
    big = (TenantSpec("a", 100), TenantSpec("b", 60))
    st_ = state(tenant_jobs("a", 3) + tenant_jobs("b", 3), nodes(2))
    decision = allocate(replace(st_, tenants=big))  # 160 guaranteed on 8 GPUs: scaled, no error
    assert sum(held(decision, st_).values()) <= 8


def test_duplicate_tenants_and_nsga2_with_tenants_are_rejected():
    st_ = replace(state(tenant_jobs("a", 2), nodes(1)), tenants=(TenantSpec("a"), TenantSpec("a")))
    with pytest.raises(PolicyInputError, match="more than once"):
        allocate(st_)
    nsga = NsgaPolicy(config=NsgaConfig(10, 2))
    with pytest.raises(PolicyInputError) as err:
        nsga.allocate(replace(st_, tenants=(TenantSpec("a"),)), None, RNG)
    assert err.value.field == "tenants"


# -- entitlement -----------------------------------------------------------------------------


def test_entitlement_is_guarantee_plus_a_weighted_share_of_the_rest():
    # 64 GPUs, a guaranteed 16: the other 48 split 1:2 → a 16 + 16, b 32.
    assert entitlements([16, 0], [1, 2], [2**62, 2**62], 64) == pytest.approx([32, 32])
    # A cap's excess goes to the others by weight.
    assert entitlements([0, 0, 0], [1, 1, 2], [8, 2**62, 2**62], 64) == pytest.approx(
        [8, 56 / 3, 112 / 3]
    )
    # Oversubscribed guarantees are scaled down in proportion.
    assert entitlements([48, 32], [1, 1], [2**62, 2**62], 40) == pytest.approx([24, 16])
    # Everyone capped below the cluster: the caps.
    assert entitlements([0, 0], [1, 1], [4, 6], 64) == pytest.approx([4, 6])


def test_jobs_of_unknown_tenants_form_one_default_tenant():
    specs = (TenantSpec("a"),)
    jobs = [replace(job("x"), tenant="a"), job("y"), replace(job("z"), tenant="nope")]
    tenants = Tenants.of(specs, jobs)
    assert tenants.names == ("a", "")
    assert tenants.of_job.tolist() == [0, 1, 1]
    assert tenants.weight.tolist() == [1.0, 1.0]
    assert tenants.guarantee.tolist() == [0, 0]
    # The policy treats "nope" exactly like "".
    cluster = nodes(2)
    named = replace(state(jobs, cluster), tenants=specs)
    unnamed = replace(
        named, jobs=tuple(replace(j, tenant="") if j.tenant == "nope" else j for j in jobs)
    )
    assert allocate(named).allocations == allocate(unnamed).allocations


# -- the no-tenant path ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_without_tenant_specs_tenant_labels_change_nothing(seed):
    st_ = random_state(np.random.default_rng(seed))
    labelled = replace(
        st_, jobs=tuple(replace(j, tenant="ab"[i % 2]) for i, j in enumerate(st_.jobs))
    )
    plain, tagged = allocate(st_), allocate(labelled)
    assert plain.allocations == tagged.allocations
    assert plain.explain == tagged.explain
    assert plain.objective == tagged.objective


# -- caps, guarantees, shares -----------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), **THREE_TENANTS)
def test_caps_are_never_exceeded_and_nodes_never_overfilled(seed, caps, guarantees, weights):
    base = random_state(np.random.default_rng(seed), num_nodes=4)
    specs = tenant_specs(guarantees, weights, caps)
    st_ = labelled(base, "abcd", specs)  # d: the default tenant
    jobs = st_.jobs
    decision = allocate(st_)
    used = held(decision, st_)
    for spec in specs:
        if spec.cap is not None:
            assert used[spec.name] <= spec.cap, f"{spec.name} over its cap"
    per_node = Counter(n for alloc in decision.allocations.values() for n in alloc)
    assert all(per_node[n.name] <= n.gpus for n in st_.nodes)
    assert all(len(decision.allocations[j.name]) <= j.max_replicas for j in jobs)


def test_a_guarantee_is_met_when_the_tenant_has_demand():
    # b weighs 10 times more and has many jobs, but a is guaranteed 12 of 16 GPUs.
    jobs = tenant_jobs("a", 4, max_replicas=4) + tenant_jobs("b", 8, max_replicas=8)
    specs = (TenantSpec("a", guarantee_gpus=12), TenantSpec("b", weight=10.0))
    st_ = replace(state(jobs, nodes(4)), tenants=specs)
    assert held(allocate(st_), st_)["a"] >= 12


def test_a_guarantee_is_not_held_for_jobs_that_cannot_use_it():
    # a is guaranteed 12 GPUs but its two jobs may use 2 each: b gets the other 12.
    jobs = tenant_jobs("a", 2, max_replicas=2) + tenant_jobs("b", 6, max_replicas=8)
    specs = (TenantSpec("a", guarantee_gpus=12), TenantSpec("b"))
    st_ = replace(state(jobs, nodes(4)), tenants=specs)
    used = held(allocate(st_), st_)
    assert used["a"] == 4
    assert used["b"] == 12


@pytest.mark.parametrize("weights", [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)])
def test_busy_tenants_share_goodput_by_weight(weights):
    # Identical jobs in both tenants, more than either can use: goodput splits by weight.
    jobs = tenant_jobs("a", 6, max_replicas=16) + tenant_jobs("b", 6, max_replicas=16)
    specs = (TenantSpec("a", weight=weights[0]), TenantSpec("b", weight=weights[1]))
    st_ = replace(state(jobs, nodes(8)), tenants=specs)
    decision = allocate(st_)
    good = goodput(decision, st_)
    share = good["a"] / (good["a"] + good["b"])
    entitled = weights[0] / sum(weights)
    assert share == pytest.approx(entitled, rel=0.10)
    assert sum(held(decision, st_).values()) == 32


def test_tenants_share_goodput_by_weight_whatever_their_job_counts():
    # Without tenants Pollux shares among jobs: a's 2 jobs get about 2/8 of the goodput. As
    # equal tenants a and b each get half, a's two jobs growing to the GPUs that takes.
    jobs = tenant_jobs("a", 2, max_replicas=16, noise=500.0) + tenant_jobs("b", 6)
    plain = state(jobs, nodes(8))
    good = goodput(allocate(plain), plain)
    assert good["a"] / (good["a"] + good["b"]) < 0.35
    st_ = replace(plain, tenants=(TenantSpec("a"), TenantSpec("b")))
    decision = allocate(st_)
    good = goodput(decision, st_)
    assert good["a"] / (good["a"] + good["b"]) == pytest.approx(0.5, rel=0.10)
    assert held(decision, st_)["a"] > 8


def test_an_idle_guarantee_is_borrowed_and_reclaimed_next_round():
    cluster = nodes(4)
    specs = (TenantSpec("a", guarantee_gpus=8), TenantSpec("b"))
    b_jobs = tenant_jobs("b", 4, max_replicas=8)
    first = replace(state(b_jobs, cluster), tenants=specs)
    decision = allocate(first)
    assert held(decision, first)["b"] == 16  # a has no jobs: b borrows its guarantee
    # Next round a's jobs arrive while b holds every GPU: a gets its guarantee back.
    running = [replace(j, allocation=decision.allocations[j.name], restarts=1) for j in b_jobs]
    second = replace(state(running + tenant_jobs("a", 3, max_replicas=4), cluster), tenants=specs)
    used = held(allocate(second), second)
    assert used["a"] >= 8
    assert used["a"] + used["b"] == 16


def test_a_single_uncapped_tenant_uses_the_cluster_like_no_tenants():
    cluster = nodes(4)
    jobs = tenant_jobs("a", 5, max_replicas=8)
    plain = allocate(state(jobs, cluster))
    one = allocate(replace(state(jobs, cluster), tenants=(TenantSpec("a"),)))
    assert sum(map(len, one.allocations.values())) == sum(map(len, plain.allocations.values()))
    assert one.objective == pytest.approx(plain.objective, rel=0.02)
    assert all("tenant a" in e.reason for e in one.explain.values())


# -- the one-level WEIGHTS mode ----------------------------------------------------------------

WEIGHTED = PolluxPolicy(tenant_shares=Weights())


def test_weights_mode_keeps_caps_and_guarantees():
    jobs = tenant_jobs("a", 4, max_replicas=4) + tenant_jobs("b", 8, max_replicas=8)
    specs = (TenantSpec("a", guarantee_gpus=12), TenantSpec("b", weight=10.0, cap_gpus=4))
    st_ = replace(state(jobs, nodes(4)), tenants=specs)
    used = held(WEIGHTED.allocate(st_, None, RNG), st_)
    assert used["a"] >= 12
    assert used["b"] <= 4


def test_weights_mode_moves_goodput_towards_the_heavier_tenant():
    jobs = tenant_jobs("a", 6, max_replicas=16) + tenant_jobs("b", 6, max_replicas=16)
    plain = state(jobs, nodes(8))
    specs = (TenantSpec("a", weight=3.0), TenantSpec("b"))
    st_ = replace(plain, tenants=specs)
    good = goodput(WEIGHTED.allocate(st_, None, RNG), st_)
    assert good["a"] > 1.5 * good["b"]
    # Weighting every job alike (one tenant) leaves the single-pool decision's allocations.
    one = replace(plain, tenants=(TenantSpec("a"), TenantSpec("b")))
    assert held(WEIGHTED.allocate(one, None, RNG), one) == held(allocate(plain), plain)
