"""Job weights as a product of named factors, each a pure function; an immutable Problem."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pollux.policy import jct
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.jct import JctParams
from pollux.policy.params import PolluxParams
from pollux.policy.problem import Problem
from pollux.policy.quota import Tenants
from pollux.policy.tenant_shares.common import job_factor
from pollux.policy.tenant_shares.weights import entitlement_tilt, guarantee_quota, tenant_tilt
from pollux.policy.types import TenantSpec
from pollux.policy.weights import WeightFactors
from tests.unit.policy_builders import job, nodes, random_state, state

FACTOR = hnp.arrays(np.float64, 6, elements=st.floats(0.01, 100.0))


def scaled(values: np.ndarray) -> np.ndarray:
    return values / values.max()


def test_without_factors_every_job_weighs_alike() -> None:
    assert WeightFactors().combined() is None


@given(FACTOR)
def test_one_factor_scaled_to_one_is_the_weight_bit_for_bit(values: np.ndarray) -> None:
    factor = scaled(values)
    for factors in (WeightFactors(remaining_work=factor), WeightFactors(tenant=factor)):
        combined = factors.combined()
        assert combined is not None
        assert np.array_equal(combined, factor), "the faithful and jct rounds stay exact"


@given(FACTOR, FACTOR)
def test_two_factors_multiply_scaled_to_a_largest_of_one(
    rank: np.ndarray, tilt: np.ndarray
) -> None:
    combined = WeightFactors(remaining_work=rank, tenant=tilt).combined()
    assert combined is not None
    assert combined.max() == 1.0
    product = rank * tilt
    assert combined == pytest.approx(product / product.max())
    # Neither factor overwrites the other: scaling one scales nothing else.
    doubled = WeightFactors(remaining_work=rank, tenant=2 * tilt).combined()
    assert doubled == pytest.approx(combined)


def test_a_zero_product_is_left_unscaled() -> None:
    zero = np.zeros(3)
    combined = WeightFactors(remaining_work=zero, tenant=np.ones(3)).combined()
    assert combined is not None
    assert combined.tolist() == [0.0, 0.0, 0.0]


def test_a_problem_is_immutable_and_a_weighted_one_is_new() -> None:
    st_ = state([job("a", on=("n0",)), job("b")], nodes(2))
    problem = Problem(st_, PolluxParams())
    with pytest.raises(AttributeError, match="immutable"):
        problem.weight = np.ones(2)  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        problem.penalty[0] = 0.5
    with pytest.raises(ValueError, match="read-only"):
        problem.current[0, 0] = 3
    weight, penalty = np.array([1.0, 0.5]), np.array([0.9, 0.8])
    weighted = problem.weighted(weight=weight, penalty=penalty)
    assert weighted is not problem
    assert problem.weight is None, "the original is unchanged"
    assert problem.penalty.tolist() != penalty.tolist()
    assert weighted.weight is weight
    assert weighted.penalty is penalty
    assert weighted.speedups is problem.speedups, "speedup tables are shared, not rebuilt"
    kept = weighted.weighted(weight=None)
    assert kept.weight is None
    assert kept.penalty is penalty, "a re-weighting keeps the restart factors"


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_the_remaining_work_factor_is_a_pure_function_of_the_problem(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = random_state(rng, 4)
    jobs = tuple(
        replace(j, remaining_work=float(rng.uniform(1, 1e4)) if i % 3 else None)
        for i, j in enumerate(base.jobs)
    )
    problem = Problem(replace(base, jobs=jobs), PolluxParams(p=0.0))
    first = jct.inputs(problem, JctParams())
    again = jct.inputs(problem.weighted(weight=np.full(len(jobs), 0.5)), JctParams())
    assert np.array_equal(first.weight, again.weight), "other factors do not change it"
    assert np.array_equal(first.penalty, again.penalty)
    if jobs:
        assert first.weight.max() == 1.0
        assert (first.weight > 0).all()


def tenant_problem(weights: tuple[float, float], jobs: tuple[int, int]) -> Problem:
    listed = [replace(job(f"a{i}"), tenant="a") for i in range(jobs[0])]
    listed += [replace(job(f"b{i}"), tenant="b") for i in range(jobs[1])]
    specs = (TenantSpec("a", weight=weights[0]), TenantSpec("b", weight=weights[1]))
    return Problem(replace(state(listed, nodes(8)), tenants=specs), PolluxParams())


@given(
    st.tuples(st.floats(0.25, 4.0), st.floats(0.25, 4.0)),
    st.tuples(st.integers(1, 5), st.integers(1, 5)),
    st.sampled_from([-1.0, 0.0, 0.5]),
)
def test_the_entitlement_tilt_is_the_entitlement_per_job_to_the_one_minus_p(
    weights: tuple[float, float], jobs: tuple[int, int], p: float
) -> None:
    problem = tenant_problem(weights, jobs)
    problem = Problem(problem.state, PolluxParams(p=p))
    quota = guarantee_quota(problem)
    tilt = entitlement_tilt(problem, quota)
    assert tilt is not None
    assert tilt.max() == pytest.approx(1.0)
    per_job = {"a": weights[0] / jobs[0], "b": weights[1] / jobs[1]}
    a, b = tilt[0], tilt[-1]
    assert a / b == pytest.approx((per_job["a"] / per_job["b"]) ** (1 - p))


def test_a_tenant_tilt_applies_per_tenant_and_tenants_without_demand_weigh_least() -> None:
    problem = tenant_problem((1.0, 1.0), (2, 2))
    quota = guarantee_quota(problem)
    tilt = tenant_tilt(problem, quota, np.array([2.0, 1.0]))
    assert tilt is not None
    assert tilt.tolist() == [1.0, 1.0, 0.5, 0.5]
    assert job_factor(np.array([0.0, 2.0, 4.0])).tolist() == [0.5, 0.5, 1.0]
    assert job_factor(np.zeros(3)) is None, "no tenant has demand: the factor does not apply"
    assert Tenants.of_state(problem.state).names == ("a", "b")


def test_the_policy_combines_the_jct_and_tenant_factors_and_leaves_the_state_alone() -> None:
    problem = tenant_problem((2.0, 1.0), (2, 2))
    jobs = tuple(
        replace(j, remaining_work=10.0 * (i + 1)) for i, j in enumerate(problem.state.jobs)
    )
    st_ = replace(problem.state, jobs=jobs)
    policy = PolluxPolicy(jct=JctParams())
    first = policy.allocate(st_, None, np.random.default_rng(0))
    again = policy.allocate(st_, None, np.random.default_rng(0))
    assert first.allocations == again.allocations, "nothing of one round leaks into the next"
