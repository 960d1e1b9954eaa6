"""Every shipped way of running a launcher isolates jobs: root launchers, per-job uids.

The systemd unit and the compose file run their launchers as root (the compose file with only
the capabilities that takes), never with --insecure or a shared run_as_uid; the launcher itself
refuses to start without root unless told --insecure, saying why and what to do.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import detect
from pollux.launcher.main import prepare
from pollux.service.config import ConfigError, TlsConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_the_systemd_unit_runs_the_launcher_as_root_without_insecure() -> None:
    unit = (DEPLOY / "systemd" / "pollux-launcher.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0].isupper()
    )
    assert settings["User"] == "root"
    argv = shlex.split(settings["ExecStart"])
    assert "--insecure" not in argv
    assert "--scratch-root" in argv
    assert "RUN_AS_UID" not in unit


def test_the_compose_launchers_run_as_root_with_few_capabilities() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    launchers = {
        name: service
        for name, service in compose["services"].items()
        if "pollux-launcher" in service.get("command", "")
    }
    assert sorted(launchers) == ["node-1", "node-2"]
    for service in launchers.values():
        assert service["user"] == "0:0"
        assert service["cap_drop"] == ["ALL"]
        assert set(service["cap_add"]) <= {
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "KILL",
            "SETGID",
            "SETUID",
            "SYS_PTRACE",
        }
        assert "no-new-privileges:true" in service["security_opt"]
        assert "--insecure" not in service["command"].split()


def test_a_launcher_that_cannot_isolate_jobs_refuses_to_start_unless_insecure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    config = LauncherConfig(
        gpus=1,
        checkpoint_root=tmp_path / "c",
        log_root=tmp_path / "l",
        scratch_root=tmp_path / "s",
    )
    with pytest.raises(ConfigError) as refused:
        prepare(config)
    (problem,) = refused.value.problems
    assert problem.startswith("job_policy: the launcher runs as uid 1000, not root")
    assert problem.endswith(
        "or start the launcher with --insecure to run replicas without that isolation"
    )
    insecure = LauncherConfig(
        gpus=1,
        checkpoint_root=tmp_path / "c",
        log_root=tmp_path / "l",
        scratch_root=tmp_path / "s",
        tls=TlsConfig(insecure=True),
    )
    assert prepare(insecure) == detect(1)
