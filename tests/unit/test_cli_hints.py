"""pollux-cli for a new user's usual mistakes (issue 32's list): each gets a way forward.

The real parser and `main` run against a fake client (`main(connect=...)`), so no server is
needed; pollux-up's context writing runs on a real config file.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pollux.client import cli
from pollux.client.client import LogChunk
from pollux.client.config import Context, current_context, write_context
from pollux.client.errors import NotFoundError
from pollux.client.types import Job, JobSpec
from pollux.service.local_cluster import LocalCluster

T0 = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def a_job(state: str) -> Job:
    return Job(
        id="j-0123456789",
        spec=JobSpec("train", ("python", "t.py"), 32),
        request_id="r",
        state=state,
        history=(),
        create_time=T0,
        finish_time=None,
        cancel_requested=False,
        restarts=0,
        failures=0,
        allocation=None,
    )


class NoReplicaClient:
    """A job in `state` whose rank has no replica: log_chunks is NOT_FOUND."""

    def __init__(self, state: str, interrupt: bool = False) -> None:
        self.state = state
        self.interrupt = interrupt

    def __enter__(self) -> NoReplicaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def get_job(self, job_id: str) -> Job:
        if self.interrupt:
            raise KeyboardInterrupt
        return a_job(self.state)

    def log_chunks(self, job_id: str, rank: int = 0, **kwargs: Any) -> list[LogChunk]:
        raise NotFoundError("no replica of rank 0 of job j-0123456789 on any node", None)


def run(client: Any, *argv: str) -> int:
    return cli.main(list(argv), connect=lambda args: client)


@pytest.mark.parametrize("flag", ["--gpus", "--gpu=2", "--num-gpus"])
def test_a_gpu_count_flag_says_that_pollux_picks_it(flag: str, capsys) -> None:
    argv = ["submit", flag] + ([] if "=" in flag else ["2"]) + ["--", "t"]
    assert run(None, *argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err
    assert "hint: " in err
    assert "chooses each job's GPU count" in err
    assert "--max-replicas" in err


def test_a_mistyped_command_gets_a_did_you_mean(capsys) -> None:
    assert run(None, "sumbit") == cli.EXIT_USAGE
    assert "hint: did you mean 'submit'?" in capsys.readouterr().err
    assert run(None, "xyzzy") == cli.EXIT_USAGE
    assert "did you mean" not in capsys.readouterr().err  # nothing close: no guess


def test_usage_since_takes_a_duration_like_logs_since() -> None:
    parser = cli.build_parser({})
    before = datetime.now(UTC)
    since = parser.parse_args(["usage", "--since", "1h"]).since
    assert before - timedelta(hours=1, seconds=5) <= since <= before - timedelta(minutes=59)
    day = parser.parse_args(["usage", "--since", "2026-11-01"]).since
    assert day == datetime(2026, 11, 1, tzinfo=UTC)


def test_usage_since_nonsense_names_all_three_forms(capsys) -> None:
    assert run(None, "usage", "--since", "lately") == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "a day (2026-11-01)" in err
    assert "a duration" in err
    assert "ISO 8601" in err


def test_a_job_submitted_with_flags_runs_where_it_was_submitted(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = cli.build_parser({}).parse_args(
        ["submit", "--name", "t", "--initial-batch-size", "8", "--", "t"]
    )
    assert cli.spec_from_args(args).working_dir == os.getcwd()
    # An explicit working_dir wins; a container starts in its image's own directory.
    args = cli.build_parser({}).parse_args(
        ["submit", "--name", "t", "--initial-batch-size", "8", "--working-dir", "/srv/x", "--", "t"]
    )
    assert cli.spec_from_args(args).working_dir == "/srv/x"
    args = cli.build_parser({}).parse_args(
        ["submit", "--name", "t", "--initial-batch-size", "8", "--image", "busybox:1", "--", "t"]
    )
    assert cli.spec_from_args(args).working_dir == ""


def test_logs_of_a_job_without_a_replica_says_why_and_how_to_wait(capsys) -> None:
    assert run(NoReplicaClient("PENDING"), "logs", "train") == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "is PENDING and rank 0 has no log yet" in err
    assert "pollux-cli logs -f j-0123456789" in err


def test_logs_of_a_finished_job_without_a_replica_keeps_the_servers_message(capsys) -> None:
    assert run(NoReplicaClient("FAILED"), "logs", "train") == cli.EXIT_ERROR
    assert "no replica of rank 0" in capsys.readouterr().err


def test_ctrl_c_while_following_says_the_job_goes_on(capsys) -> None:
    assert run(NoReplicaClient("RUNNING", interrupt=True), "logs", "-f", "train") == 130
    err = capsys.readouterr().err
    assert "interrupted: train goes on running" in err
    assert "pollux-cli cancel" in err


def test_pollux_up_does_not_take_over_another_clusters_current_context(tmp_path) -> None:
    path = tmp_path / "config.toml"
    write_context(path, "prod", Context("prod:443"))
    cluster = SimpleNamespace(scheduler_addresses=["127.0.0.1:1"], ca_file=None, admin_token="t")
    assert LocalCluster.write_cli_context(cluster, path) is False  # type: ignore[arg-type]
    assert current_context(path) == "prod"
    # A config without a current context, or already on "local", points at the new cluster.
    fresh = tmp_path / "fresh.toml"
    assert LocalCluster.write_cli_context(cluster, fresh) is True  # type: ignore[arg-type]
    assert current_context(fresh) == "local"
    assert LocalCluster.write_cli_context(cluster, fresh) is True  # type: ignore[arg-type]
    assert oct(Path(fresh).stat().st_mode & 0o777) == "0o600"


class ClusterClient(NoReplicaClient):
    def __init__(self, url: str) -> None:
        super().__init__("RUNNING")
        self.url = url

    def cluster_status(self) -> Any:
        return SimpleNamespace(dashboard_url=self.url)


def test_dashboard_prints_the_address_and_on_request_a_sign_in_link(capsys) -> None:
    url = "https://sched:8443/"
    assert run(ClusterClient(url), "dashboard") == 0
    assert capsys.readouterr().out == url + "\n"

    def connect(args: Any) -> Any:
        args.token = "pollux_secret"
        return ClusterClient(url)

    assert cli.main(["dashboard", "--link"], connect=connect) == 0
    assert capsys.readouterr().out == url + "#token=pollux_secret\n"
    assert run(ClusterClient(""), "dashboard") == cli.EXIT_ERROR
    assert "serves no dashboard" in capsys.readouterr().err
