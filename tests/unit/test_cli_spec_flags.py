"""pollux-cli's job settings have one name: each flag is its job-file key with dashes, a former
spelling still works once warned, and a server's errors name the keys the user wrote.

Every test runs the real parser; commands run against a fake client (`main(connect=...)`).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pollux.client import cli
from pollux.client.errors import InvalidArgumentError
from pollux.client.types import (
    SPEC_KEYS,
    Job,
    JobSpec,
)

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


pytestmark = pytest.mark.usefixtures("no_user_config")


def test_every_spec_flag_is_its_file_key_with_dashes() -> None:
    parser = cli.build_parser({})
    submit = parser._subparsers._group_actions[0].choices["submit"]  # type: ignore[union-attr]
    flags = {s for a in submit._actions for s in a.option_strings if a.help != argparse.SUPPRESS}
    for spec_flag in cli._SPEC_FLAGS:
        assert spec_flag.key in SPEC_KEYS
        assert spec_flag.flag == "--" + spec_flag.key.replace("_", "-")
        assert spec_flag.flag in flags
        assert not spec_flag.old_flag or spec_flag.old_flag not in flags, "old names are hidden"
    assert "--initial-batch-size" in flags
    assert "--batch-size" not in submit.format_help()


def test_the_new_flags_set_the_file_keys(tmp_path: Path) -> None:
    args = cli.build_parser({}).parse_args(
        [
            "submit",
            "--name",
            "job",
            "--initial-batch-size",
            "32",
            "--stop-grace-s",
            "90",
            "--working-dir",
            "/w",
            "--image",
            "ubuntu",
            "--shm-size-mb",
            "256",
            "--",
            "x",
        ]
    )
    spec = cli.spec_from_args(args)
    assert (spec.initial_batch_size, spec.stop_grace_s, spec.working_dir) == (32, 90, "/w")
    assert spec.shm_size_mb == 256


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("--batch-size", "--initial-batch-size", "32"),
        ("--stop-grace", "--stop-grace-s", "9"),
        ("--workdir", "--working-dir", "/w"),
        ("--shm-size", "--shm-size-mb", "64"),
    ],
)
def test_an_old_flag_still_works_and_says_its_new_name_once(
    old: str, new: str, value: str, capsys
) -> None:
    args = cli.build_parser({}).parse_args(["submit", old, value])
    new_args = cli.build_parser({}).parse_args(["submit", new, value])
    key = new.removeprefix("--").replace("-", "_")
    assert getattr(args, key) == getattr(new_args, key)
    err = capsys.readouterr().err
    assert err == f"pollux-cli: warning: {old} is deprecated; use {new}\n"


@pytest.mark.parametrize(
    ("api", "want"),
    [
        ("spec.batch.initial_batch_size", "initial_batch_size"),
        ("spec.batch.max_local_batch_size", "max_local_batch_size"),
        ("spec.name", "name"),
        ("spec.env[POLLUX_X]", "env.POLLUX_X"),
        ("spec.labels[a/b]", "labels.a/b"),
        ("spec.mounts[0].host_path", "mounts[0].host_path"),
        ("spec.command[0]", "command[0]"),
        ("request_id", "request_id"),
        ("spec", "spec"),
    ],
)
def test_api_field_paths_become_file_keys(api: str, want: str) -> None:
    assert cli.file_key_path(api) == want


class FakeClient:
    """Fails every call with `error` (or, without one, the test did not expect a call)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, spec: JobSpec, *, request_id: str | None = None) -> Job:
        raise self.error or AssertionError("an invalid spec must not be submitted")

    def get_job(self, job_id: str) -> Job:
        raise self.error or AssertionError("unexpected call")


SERVER_ERROR = InvalidArgumentError(
    "invalid request: spec.batch.initial_batch_size: must be >= 1; "
    "spec.shm_size_mb: only applies to a container: set spec.image too, or leave it unset",
    violations=[
        ("spec.batch.initial_batch_size", "must be >= 1"),
        ("spec.shm_size_mb", "only applies to a container: set spec.image too, or leave it unset"),
    ],
)


def test_submit_errors_name_the_file_keys(capsys) -> None:
    argv = ["submit", "--name", "job", "--initial-batch-size", "8", "--", "x"]
    assert cli.main(argv, connect=lambda args: FakeClient(SERVER_ERROR)) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: invalid request",
        "  initial_batch_size: must be >= 1",
        "  shm_size_mb: only applies to a container: set image too, or leave it unset",
    ]


def test_other_commands_keep_the_api_field_paths(capsys) -> None:
    assert cli.main(["describe", "j-1"], connect=lambda args: FakeClient(SERVER_ERROR)) == 1
    assert "  spec.batch.initial_batch_size: must be >= 1" in capsys.readouterr().err
