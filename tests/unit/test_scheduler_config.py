"""Scheduling settings: the policy and its settings, and the forecasts, checked before a round."""

from __future__ import annotations

import pytest

from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.registry import PolicySpecError, make_policy
from pollux.policy.tenant_shares import Deficits, Isolation
from pollux.scheduler.config import SchedulingConfig


def test_a_fresh_scheduler_runs_the_jct_mode_with_isolated_tenants() -> None:
    config = SchedulingConfig()
    assert config.problems() == []
    policy = make_policy(config.policy_spec())
    assert isinstance(policy, PolluxPolicy)
    assert policy.name == "pollux-jct"
    assert policy.jct is not None
    assert policy.jct.restart == "ramp"
    assert policy.tenant_shares == Isolation()
    assert policy.params.restart_delay == 30.0


def test_every_setting_reaches_the_policy() -> None:
    config = SchedulingConfig(
        policy="pollux-jct", jct_restart="expected", tenant_shares="deficits", restart_delay_s=12
    )
    policy = make_policy(config.policy_spec())
    assert isinstance(policy, PolluxPolicy)
    assert policy.jct is not None
    assert policy.jct.restart == "expected"
    assert policy.tenant_shares == Deficits()
    assert policy.params.restart_delay == 12.0
    faithful = make_policy(SchedulingConfig(policy="pollux").policy_spec())
    assert isinstance(faithful, PolluxPolicy)
    assert faithful.jct is None


def test_bad_policy_settings_are_every_one_reported_with_the_choices() -> None:
    assert SchedulingConfig(policy="fastest", jct_restart="never").problems() == [
        "policy: 'fastest' is not one of pollux-jct, pollux, optimus, tiresias",
        "jct_restart: 'never' is not one of ramp, holding, expected",
    ]
    assert SchedulingConfig(tenant_shares="fair", restart_delay_s=-1).problems() == [
        "restart_delay_s: must be >= 0, got -1",
        "tenant_shares: 'fair' is not one of isolation, deficits, weights, budgets",
    ]
    assert SchedulingConfig(policy="tiresias", jct_restart="holding").problems() == [
        "jct_restart: applies to pollux-jct only, not to tiresias"
    ]
    with pytest.raises(PolicySpecError, match="pollux-jct, pollux, optimus, tiresias"):
        SchedulingConfig(policy="jct").policy_spec()


def test_event_rounds_place_by_default_and_are_checked() -> None:
    assert SchedulingConfig().event_rounds == "place"
    assert SchedulingConfig(event_rounds="full").problems() == []
    assert SchedulingConfig(event_rounds="grow").problems() == [
        "event_rounds: 'grow' is not one of place, full"
    ]


def test_seeding_is_off_unless_set() -> None:
    assert not SchedulingConfig().seed_profiles
    assert SchedulingConfig(seed_profiles=True).seed_profiles


def test_forecast_settings_are_bounded() -> None:
    assert SchedulingConfig(forecast_interval_s=0).problems() == []  # forecasts off
    assert SchedulingConfig(forecast_interval_s=-1, forecast_round_s=0).problems() == [
        "forecast_interval_s: must be >= 0 (0 turns forecasts off)",
        "forecast_round_s: must be > 0",
    ]
