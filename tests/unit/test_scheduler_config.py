"""Scheduling settings: the policy's mode and the forecasts are checked before anything runs."""

from __future__ import annotations

from pollux.scheduler.config import SchedulingConfig
from pollux.scheduler.scheduler import make_policy


def test_the_jct_mode_is_a_mode_of_the_pollux_policy_only() -> None:
    assert SchedulingConfig(mode="jct").problems() == []
    assert SchedulingConfig(mode="fastest").problems() == [
        "mode: 'fastest' is not one of faithful, jct"
    ]
    assert SchedulingConfig(policy="tiresias", mode="jct").problems() == [
        "mode: 'jct' is a mode of the pollux policy, not of tiresias"
    ]
    assert make_policy("pollux", 30.0, "jct").jct is not None  # type: ignore[attr-defined]
    assert make_policy("pollux", 30.0).jct is None  # type: ignore[attr-defined]


def test_the_jct_restart_rule_is_checked_and_reaches_the_policy() -> None:
    assert SchedulingConfig(mode="jct", jct_restart="expected").problems() == []
    assert SchedulingConfig(jct_restart="never").problems() == [
        "jct_restart: 'never' is not one of ramp, holding, expected"
    ]
    policy = make_policy("pollux", 30.0, "jct", "expected")
    assert policy.jct.restart == "expected"  # type: ignore[attr-defined]
    assert make_policy("pollux", 30.0, "jct").jct.restart == "ramp"  # type: ignore[attr-defined]


def test_event_rounds_place_by_default_and_are_checked() -> None:
    assert SchedulingConfig().event_rounds == "place"
    assert SchedulingConfig(event_rounds="full").problems() == []
    assert SchedulingConfig(event_rounds="grow").problems() == [
        "event_rounds: 'grow' is not one of place, full"
    ]


def test_seeding_is_off_unless_set() -> None:
    assert not SchedulingConfig(mode="jct").seed_profiles
    assert not SchedulingConfig().seed_profiles, "the faithful mode stays the published system"
    assert SchedulingConfig(mode="jct", seed_profiles=True).seed_profiles


def test_forecast_settings_are_bounded() -> None:
    assert SchedulingConfig(forecast_interval_s=0).problems() == []  # forecasts off
    assert SchedulingConfig(forecast_interval_s=-1, forecast_round_s=0).problems() == [
        "forecast_interval_s: must be >= 0 (0 turns forecasts off)",
        "forecast_round_s: must be > 0",
    ]
