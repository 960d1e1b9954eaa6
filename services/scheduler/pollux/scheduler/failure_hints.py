"""What to do about a replica failure that every replica of the job would meet again.

A traceback says what broke, not what to change. Some failures are the job's set-up rather
than its code — its interpreter lacks a module, its command is not found or not executable,
its uid may not read a file — and would fail the same way on every node and every restart; the
job's history then carries the fix beside the output tail. Pure: the exit code and the tail of
the replica's output in, one sentence (or "") out.
"""

from __future__ import annotations

import re

_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
_DENIED = re.compile(r"PermissionError: \[Errno 13\] Permission denied: '([^']+)'")
_LAUNCHER = "pollux-launcher: cannot start"
NOT_EXECUTABLE = 126
NOT_FOUND = 127


def hint(exit_code: int, output_tail: str) -> str:
    """The fix for a set-up failure that would recur, or "" when the output shows none."""
    missing = _NO_MODULE.search(output_tail)
    if missing:
        return (
            f"the job's interpreter cannot import {missing.group(1)}: name the python that has "
            "it by its full path in the command (e.g. /path/to/venv/bin/python), or install "
            "it for that interpreter; replicas that run under their job's own uid also need "
            "that interpreter and its packages readable by other users"
        )
    denied = _DENIED.search(output_tail)
    if denied:
        return (
            f"the job's user may not read {denied.group(1)}: replicas run under a uid of their "
            "job's own, so the file and its directories must be open to other users (chmod "
            "o+r on the file, o+x on each directory above it), or it must be under the job's "
            "working dir"
        )
    if _LAUNCHER in output_tail:
        return ""  # the launcher's own message names the cause and the fix
    if exit_code == NOT_EXECUTABLE:
        return (
            "exit 126: the command is not executable: chmod +x it, or run it through its "
            "interpreter (python script.py)"
        )
    if exit_code == NOT_FOUND:
        return (
            "exit 127: a program the command runs was not found: check its spelling, its "
            "PATH, and that it is installed on every node"
        )
    return ""
