"""A bad job file is refused by pollux-cli before anything is sent: every mistake at once, each
named by its key with what to fix, in the words the scheduler would use.

Every test runs the real job-file reader, the real contract (`pollux.jobspec`) and the real
CLI; the CLI runs against a fake client that fails the test if a bad spec reaches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pollux.client import cli
from pollux.client.errors import JobSpecError
from pollux.client.types import JobSpec, read_job_file

pytestmark = pytest.mark.usefixtures("no_user_config")


MANY_MISTAKES = """\
name: Bad_Name
command: [python, train.py]
initial-batch-size: 64
batch_size: 64
max_batch_size: 32
max_replicas: four
stop_grace_s: 7200
scaling_rule: cubic
env: {POLLUX_RANK: "1", DEBUG: true, OK: "1"}
labels: {"team name": vision}
mounts: ["/data:/data"]
"""


def test_a_job_file_reports_every_mistake_at_once(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANY_MISTAKES)
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping(read_job_file(path))
    problems = dict(caught.value.violations)
    assert problems["initial-batch-size"].startswith(
        "unknown key (did you mean 'initial_batch_size'?)"
    )
    assert problems["batch_size"].startswith("unknown key (did you mean 'initial_batch_size'?)")
    assert problems["initial_batch_size"] == "required key is missing"
    assert problems["name"] == (
        "'Bad_Name' must be 1-63 characters of [a-z0-9-] starting with a letter"
    )
    assert problems["max_replicas"] == "must be a whole number, got str 'four'"
    assert problems["stop_grace_s"] == "must be 0 to 3600 seconds (0: 30), not 7200"
    assert problems["scaling_rule"] == "'cubic' is not one of adascale, linear, sqrt, none"
    assert problems["env.POLLUX_RANK"] == "POLLUX_* variables are set by the launcher; rename it"
    assert problems["env.DEBUG"].startswith("must be a string, got bool")
    assert problems["labels.'team name'"].startswith("label keys must be 1-63 characters")
    assert problems["mounts"] == "only applies to a container: set image too, or leave it unset"
    assert "env.OK" not in problems
    # max_batch_size cannot be compared with a missing initial_batch_size: no guess.
    assert "max_batch_size" not in problems


def test_the_cli_prints_every_mistake_in_one_error(tmp_path: Path, capsys, never_submit) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANY_MISTAKES)
    assert cli.main(["submit", "-f", str(path)], connect=never_submit) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: invalid job spec (")
    assert sorted(line.split(": ", 1)[0].strip() for line in err[1:]) == sorted(
        [
            "initial-batch-size",
            "batch_size",
            "initial_batch_size",
            "name",
            "max_replicas",
            "scaling_rule",
            "env.DEBUG",
            "stop_grace_s",
            "env.POLLUX_RANK",
            "labels.'team name'",
            "mounts",
        ]
    )
    assert "  name: 'Bad_Name' must be 1-63 characters of [a-z0-9-] starting with a letter" in err
    assert "  stop_grace_s: must be 0 to 3600 seconds (0: 30), not 7200" in err


def test_a_flag_is_checked_like_its_file_key(capsys, never_submit) -> None:
    argv = ["submit", "--name", "job", "--initial-batch-size", "8", "--max-replicas", "5000"]
    assert cli.main([*argv, "--", "x"], connect=never_submit) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: invalid job spec (max_replicas)",
        "  max_replicas: must be 0 to 4096 (0: no limit), not 5000",
    ]


@pytest.mark.parametrize(
    ("changes", "key", "want"),
    [
        ({"initial_batch_size": 0}, "initial_batch_size", "must be 1 to 16777216"),
        ({"max_batch_size": 4}, "max_batch_size", "4 is below initial_batch_size 8"),
        (
            {"min_local_batch_size": 8, "max_local_batch_size": 4},
            "min_local_batch_size",
            "8 exceeds max_local_batch_size 4",
        ),
        ({"min_local_batch_size": 16}, "min_local_batch_size", "16 exceeds the largest total"),
        ({"max_failures": 1001}, "max_failures", "must be 0 to 1000 (0: 3), not 1001"),
        ({"command": [""]}, "command[0]", "the program must not be empty"),
        ({"command": ["py\x1bthon"]}, "command[0]", "contains a control character"),
        ({"name": "abc"}, "name", "reads as a job id or id prefix"),
        ({"env": {"1X": "a"}}, "env.1X", "not a valid environment variable name"),
        ({"env": {"A": "x\x00"}}, "env.A", "the value contains a NUL byte"),
        (
            {"env": {"A": "1"}, "secret_env": {"A": "2"}},
            "secret_env.A",
            "also in env; keep it in one of them",
        ),
        ({"labels": {"k": "\x1b[31m"}}, "labels.k", "the value contains a control character"),
        ({"working_dir": "/a\nb"}, "working_dir", "contains a control character"),
        ({"image": "Ubuntu"}, "image", "'Ubuntu' is not an image reference"),
        ({"shm_size_mb": 64}, "shm_size_mb", "only applies to a container"),
        (
            {"image": "ubuntu", "mounts": ["relative:/d"]},
            "mounts[0].host_path",
            "must be an absolute path",
        ),
        # The mount path pattern the client once copied wrong: a comma splits --mount.
        ({"image": "ubuntu", "mounts": ["/a,b:/d"]}, "mounts[0].host_path", "without ':' or ','"),
        ({"image": "ubuntu", "mounts": ["/a:/"]}, "mounts[0].container_path", "container's root"),
        (
            {"image": "ubuntu", "mounts": ["/a:/d", "/b:/d"]},
            "mounts[1].container_path",
            "mounted twice",
        ),
        ({"image": "ubuntu", "mounts": ["/a/../b:/d"]}, "mounts[0].host_path", "'..' components"),
        ({"batch": {"initial_batch_size": 8}}, "batch", "write the batch limits at the top level"),
        ({"workdir": "/w"}, "workdir", "did you mean 'working_dir'?"),
        ({"env": {f"V{i}": "x" * 4000 for i in range(20)}}, "spec", "bytes serialized; at most"),
    ],
)
def test_values_the_server_would_refuse_are_refused_here(
    changes: dict[str, Any], key: str, want: str
) -> None:
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping({"name": "job", "command": ["x"], "initial_batch_size": 8, **changes})
    problems = dict(caught.value.violations)
    assert key in problems, problems
    assert want in problems[key]


def test_a_key_that_cannot_be_read_is_not_guessed_by_the_rules_across_keys() -> None:
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_mapping(
            {
                "name": "job",
                "command": ["x"],
                "initial_batch_size": 8,
                "image": ["ubuntu"],  # not "no image": shm_size_mb is not refused for want of one
                "shm_size_mb": 64,
                "max_batch_size": "big",  # not 0: min_local_batch_size is not compared with 8
                "min_local_batch_size": 16,
            }
        )
    assert [field for field, _ in caught.value.violations] == ["max_batch_size", "image"]
