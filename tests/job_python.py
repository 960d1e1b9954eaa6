"""The interpreter tests name in their jobs' commands: one a job uid can run.

A root launcher runs replicas under their job's own uid, with that uid's permissions alone, so
`sys.executable` is no job command where this environment lies under a home closed to others
(a checkout's venv in /root). `job_python` is `job_reach.job_python`: this interpreter when a
job uid can run it, else a job environment over a Python of the same minor version, made once
per test session in a directory of its own that the session removes at its end (conftest's
`pytest_sessionfinish`). Services and CLI calls run as the test's user: they keep
`sys.executable`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pollux.service.local import job_reach

_directory: Path | None = None


def job_python() -> str:
    """An interpreter of this environment that a job uid can run (see the module docstring)."""
    global _directory  # noqa: PLW0603
    if _directory is None:
        _directory = Path(tempfile.mkdtemp(prefix="pollux-job-python-", dir="/tmp"))
        _directory.chmod(0o755)  # entered by the job uids
    return job_reach.job_python(_directory)


def remove() -> None:
    """Remove the session's job environment, if one was made."""
    global _directory  # noqa: PLW0603
    if _directory is not None:
        shutil.rmtree(_directory, ignore_errors=True)
        _directory = None
