"""The policy registry: every name parses to the policy it names; bad specs say what to fix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.policy.exploration import FAITHFUL, Exploration
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.optimus import OptimusPolicy
from pollux.policy.registry import (
    DEFAULT_POLICY,
    JCT_RESTARTS,
    POLICY_NAMES,
    TENANT_SHARES,
    PolicySpec,
    PolicySpecError,
    make_policy,
)
from pollux.policy.tenant_shares import METHODS
from pollux.policy.tiresias import TiresiasPolicy
from pollux.policy.types import JobSizing
from tests.unit.policy_builders import job, nodes, state

EXPECTED = {
    "pollux-jct": (PolluxPolicy, JobSizing.ADAPTIVE, False, Exploration(4, 4)),
    "pollux": (PolluxPolicy, JobSizing.ADAPTIVE, False, FAITHFUL),
    "optimus": (OptimusPolicy, JobSizing.FIXED_BATCH, True, FAITHFUL),
    "tiresias": (TiresiasPolicy, JobSizing.FIXED, False, FAITHFUL),
}


def test_the_names_are_the_four_policies_and_the_default_is_the_jct_mode() -> None:
    assert set(POLICY_NAMES) == set(EXPECTED)
    assert DEFAULT_POLICY == POLICY_NAMES[0] == "pollux-jct"
    assert PolicySpec().name == DEFAULT_POLICY
    assert TENANT_SHARES == tuple(METHODS) == ("isolation", "deficits", "weights", "budgets")
    assert JCT_RESTARTS == ("ramp", "holding", "expected")


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_name_parses_to_the_policy_it_names(name: str) -> None:
    kind, sizing, oracle, exploration = EXPECTED[name]
    policy = make_policy(PolicySpec.parse(name))
    assert isinstance(policy, kind)
    assert policy.name == name, "a policy reports the name it was built from"
    assert policy.sizing is sizing
    assert policy.needs_oracle is oracle
    assert policy.exploration == exploration
    assert (policy.objective_text != "") == (kind is PolluxPolicy)
    assert policy.replica_limit(0, 0, 64) >= 1
    decision = policy.allocate(state([], nodes(1)), None, np.random.default_rng(0))
    assert dict(decision.allocations) == {}


def test_the_pollux_policies_take_their_settings() -> None:
    for name in ("pollux-jct", "pollux"):
        for shares in TENANT_SHARES:
            policy = make_policy(PolicySpec(name, restart_delay_s=5.0, tenant_shares=shares))
            assert isinstance(policy, PolluxPolicy)
            assert policy.tenant_shares is METHODS[shares]
            assert policy.params.restart_delay == 5.0
            assert policy.explain_params == policy.params
    for rule in JCT_RESTARTS:
        policy = make_policy(PolicySpec("pollux-jct", jct_restart=rule))
        assert isinstance(policy, PolluxPolicy)
        assert policy.jct is not None
        assert policy.jct.restart == rule
    faithful = make_policy(PolicySpec("pollux"))
    assert faithful == PolluxPolicy(), "the paper's configuration, nothing else"


@given(st.text(max_size=20).filter(lambda text: text not in POLICY_NAMES))
def test_a_bad_name_is_refused_listing_the_valid_ones(name: str) -> None:
    with pytest.raises(PolicySpecError) as caught:
        PolicySpec.parse(name)
    assert caught.value.problems == [
        f"policy: {name!r} is not one of pollux-jct, pollux, optimus, tiresias"
    ]
    assert isinstance(caught.value, ValueError)


def test_every_bad_setting_is_reported_at_once_with_its_choices() -> None:
    with pytest.raises(PolicySpecError) as caught:
        PolicySpec("pollux-jct", restart_delay_s=-1.0, jct_restart="age", tenant_shares="fair")
    assert caught.value.problems == [
        "restart_delay_s: must be >= 0, got -1.0",
        "jct_restart: 'age' is not one of ramp, holding, expected",
        "tenant_shares: 'fair' is not one of isolation, deficits, weights, budgets",
    ]
    with pytest.raises(PolicySpecError, match="restart_delay_s: must be >= 0, got nan"):
        PolicySpec(restart_delay_s=float("nan"))


def test_a_setting_of_another_policy_is_refused_not_ignored() -> None:
    with pytest.raises(
        PolicySpecError, match="jct_restart: applies to pollux-jct only, not to pollux"
    ):
        PolicySpec("pollux", jct_restart="holding")
    with pytest.raises(PolicySpecError, match="tenant_shares: applies to pollux-jct and pollux"):
        PolicySpec("optimus", tenant_shares="budgets")
    with pytest.raises(PolicySpecError, match=r"speed: unknown policy setting \(known: "):
        PolicySpec.parse("pollux", speed=2)
    assert PolicySpec("tiresias", restart_delay_s=10.0).problems() == []


def test_a_spec_is_a_value() -> None:
    assert PolicySpec.parse("pollux", restart_delay_s=30.0) == PolicySpec("pollux")
    assert hash(PolicySpec("optimus")) == hash(PolicySpec("optimus"))
    with pytest.raises(AttributeError):
        PolicySpec().name = "pollux"  # type: ignore[misc]


def test_optimus_gets_its_oracle_and_runs_a_round() -> None:
    # A policy that needs an oracle says so; the callers (simulator, scheduler) give one.
    policy = make_policy(PolicySpec("optimus"))
    with pytest.raises(ValueError, match="oracle"):
        policy.allocate(state([job("a")], nodes(1)), None, np.random.default_rng(0))
