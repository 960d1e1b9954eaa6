"""The fix the job's history gives beside a set-up failure that every restart would meet."""

from __future__ import annotations

from pollux.scheduler.failure_hints import hint


def test_a_missing_module_names_the_module_and_the_interpreter_fix() -> None:
    tail = 'File "x.py", line 27, in <module> | import structlog | ModuleNotFoundError: '
    said = hint(1, tail + "No module named 'structlog'")
    assert said.startswith("the job's interpreter cannot import structlog: name the python")
    assert "readable by other users" in said


def test_a_file_the_job_uid_may_not_read_is_named_with_the_modes_to_change() -> None:
    said = hint(1, "PermissionError: [Errno 13] Permission denied: '/root/data/train.csv'")
    assert said.startswith("the job's user may not read /root/data/train.csv:")
    assert "chmod o+r" in said


def test_exit_126_and_127_say_what_to_check() -> None:
    assert hint(126, "bash: ./train.sh: Permission denied").startswith(
        "exit 126: the command is not executable: chmod +x it"
    )
    assert hint(127, "sh: 1: trian: not found").startswith(
        "exit 127: a program the command runs was not found"
    )


def test_the_launchers_own_refusal_and_ordinary_failures_get_no_hint() -> None:
    refused = "pollux-launcher: cannot start the replica: working_dir /x is outside the roots"
    assert hint(127, refused) == ""
    assert hint(1, "ValueError: loss is nan") == ""
    assert hint(137, "") == ""
