"""Processes this launcher did not start, found and stopped through /proc and signals.

A previous launcher process of this node may have died leaving replicas behind (orphans.py).
Their pids come from etcd, so before any signal the pid is checked to still be that replica
(its environment names the job and generation): a pid reused by an unrelated process is never
signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

from pollux.launcher.replica import PLANNED_STOP


def is_replica(pid: int, job_id: str, generation: int, *, proc: Path = Path("/proc")) -> bool:
    """Whether `pid` is (still) a replica of (job, generation), by its environment."""
    try:
        environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        f"POLLUX_JOB_ID={job_id}".encode() in environ
        and f"POLLUX_ALLOCATION_GEN={generation}".encode() in environ
    )


def exists(pid: int) -> bool:
    """Whether a process `pid` exists (ours to signal or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def stop_foreign(pid: int, grace_s: float) -> int:
    """SIGTERM, grace, SIGKILL a process group this process did not start; its exit code.

    Not our child, so its real exit code is unknowable: a stop within the grace period
    reports 143 (planned), a kill reports -9.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not exists(pid):
            return PLANNED_STOP
        await asyncio.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return -int(signal.SIGKILL)
