"""The one entry-point shape: flags > environment > TOML > defaults, every problem at once."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import pytest

from pollux.agent.main import SPEC as AGENT
from pollux.launcher.main import SPEC as LAUNCHER
from pollux.scheduler.main import SPEC as SCHEDULER
from pollux.service.config import ConfigError
from pollux.service.entry import (
    COMMON_FLAGS,
    EXIT_BAD_CONFIG,
    build_parser,
    load_config,
    run_service,
)

SPECS = [SCHEDULER, AGENT, LAUNCHER]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("POLLUX_"):
            monkeypatch.delenv(name)


def test_layers_apply_defaults_then_file_then_environment_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "scheduler.toml"
    path.write_text(
        'id = "from-file"\nlease_ttl_s = 7\n[scheduling]\ninterval_s = 30\npolicy = "tiresias"\n'
    )
    monkeypatch.setenv("POLLUX_SCHEDULER_SCHEDULING__INTERVAL_S", "20")
    monkeypatch.setenv("POLLUX_SCHEDULER_LEASE_TTL_S", "8")
    config = load_config(SCHEDULER, ["--config", str(path), "--lease-ttl", "9"])
    assert config.id == "from-file"  # file only
    assert config.scheduling.policy == "tiresias"  # file only
    assert config.scheduling.interval_s == 20.0  # environment over file
    assert config.lease_ttl_s == 9  # flag over environment
    assert config.scheduling.debounce_s == 1.0  # default


def test_a_flag_left_out_overrides_nothing_and_a_falsy_flag_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POLLUX_SCHEDULER_SCHEDULING__RESTART_DELAY_S", "12")
    assert load_config(SCHEDULER, []).scheduling.restart_delay_s == 12.0
    # 0 is a value, not "unset": applied with `is not None`, not truthiness.
    assert load_config(SCHEDULER, ["--restart-delay", "0"]).scheduling.restart_delay_s == 0.0


def test_every_problem_is_reported_at_once_with_its_field_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('colour = "blue"\n[server]\ngrace_s = -1\n')
    monkeypatch.setenv("POLLUX_AGENT_LEASE_TTL_S", "soon")
    monkeypatch.setenv("POLLUX_AGENT_HYSTERESIS", "2")
    with pytest.raises(ConfigError) as caught:
        load_config(AGENT, ["--config", str(path), "--etcd", "no-port", "--log-level", "loud"])
    fields = sorted(p.split(":")[0] for p in caught.value.problems)
    assert fields == [
        "colour",
        "etcd.endpoint",
        "hysteresis",
        "lease_ttl_s",
        "server.grace_s",
        "server.log_level",
    ]


def test_a_float_setting_must_be_finite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN compares false with everything, so it would slip past every range check."""
    path = tmp_path / "scheduler.toml"
    path.write_text("[retention]\nprofile_days = nan\n")
    monkeypatch.setenv("POLLUX_SCHEDULER_RETENTION__FINISHED_GRACE_S", "inf")
    with pytest.raises(ConfigError) as caught:
        load_config(SCHEDULER, ["--config", str(path)])
    assert sorted(caught.value.problems) == [
        "retention.finished_grace_s: expected a finite float, got 'inf'",
        "retention.profile_days: expected a finite float, got nan",
    ]


def test_an_unreadable_file_is_one_problem_among_the_others(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(AGENT, ["--config", str(tmp_path / "missing.toml"), "--etcd", "nohost"])
    problems = caught.value.problems
    assert any("missing.toml: no such file" in p for p in problems)
    assert any(p.startswith("etcd.endpoint:") for p in problems)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.prog)
def test_every_service_takes_the_common_flags_and_names_each_field_in_its_help(spec) -> None:
    text = build_parser(spec).format_help()
    for flag in (*COMMON_FLAGS, *spec.flags):
        assert flag.flag in text
        assert f"({flag.path})" in text.replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.prog)
def test_every_flag_names_a_real_config_field(spec) -> None:
    for flag in (*COMMON_FLAGS, *spec.flags):
        node = spec.config
        for part in flag.path.split("."):
            hints = typing.get_type_hints(node)
            assert part in hints, f"{spec.prog} {flag.flag}: no field {flag.path}"
            node = hints[part]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.prog)
def test_a_bad_configuration_exits_2_before_connecting(spec, capsys) -> None:
    # The endpoint is never dialled: the port check fails first.
    assert run_service(spec, ["--etcd", "127.0.0.1:notaport"]) == EXIT_BAD_CONFIG
    assert "etcd.endpoint" in capsys.readouterr().err


def test_a_usage_error_exits_2() -> None:
    with pytest.raises(SystemExit) as caught:
        run_service(SCHEDULER, ["--no-such-flag"])
    assert caught.value.code == EXIT_BAD_CONFIG
