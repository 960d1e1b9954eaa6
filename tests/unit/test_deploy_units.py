"""The systemd units in deploy/ name real commands, flags and settings (checked, not read)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pollux.agent.config import AgentConfig
from pollux.launcher.config import LauncherConfig
from pollux.scheduler.config import SchedulerConfig
from pollux.service.config import ConfigError, load

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
CONFIGS = {
    "pollux-scheduler": (SchedulerConfig, "POLLUX_SCHEDULER"),
    "pollux-agent": (AgentConfig, "POLLUX_AGENT"),
    "pollux-launcher": (LauncherConfig, "POLLUX_LAUNCHER"),
}
MODULES = {
    "pollux-scheduler": "pollux.scheduler.main",
    "pollux-agent": "pollux.agent.main",
    "pollux-launcher": "pollux.launcher.main",
}


def service_lines(unit: Path) -> tuple[list[str], dict[str, str]]:
    """The ExecStart argv and the Environment= settings of a unit (%H as a host name)."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for raw in unit.read_text().splitlines():
        line = raw.strip().replace("%H", "node7")
        if line.startswith("ExecStart="):
            argv = shlex.split(line.removeprefix("ExecStart="))
        elif line.startswith("Environment="):
            name, _, value = line.removeprefix("Environment=").partition("=")
            env[name] = value
    return argv, env


@pytest.mark.parametrize("unit", sorted(UNITS.glob("*.service")), ids=lambda p: p.stem)
def test_every_unit_runs_a_real_command_with_real_flags_and_settings(
    unit: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, env = service_lines(unit)
    command = Path(argv[0]).name
    assert command in CONFIGS, f"{unit.name}: unknown command {argv[0]}"
    help_text = subprocess.run(
        [sys.executable, "-m", MODULES[command], "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    for flag in (a.split("=")[0] for a in argv[1:] if a.startswith("--")):
        assert flag in help_text, f"{unit.name}: {command} has no {flag}"
    # Every Environment= setting is one the service knows (an unknown one fails at start).
    config, prefix = CONFIGS[command]
    for name in list(os.environ):
        if name.startswith(prefix + "_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        assert name.startswith(prefix + "_"), f"{unit.name}: {name} is not a {prefix}_ setting"
        monkeypatch.setenv(name, value)
    try:
        load(config, None, prefix)
    except ConfigError as error:
        unknown = [p for p in error.problems if "unknown setting" in p or "expected" in p]
        assert not unknown, f"{unit.name}: {unknown}"
