"""The admin token written where another user may read it: every place ABSENT.

A token on a service's output or `pollux-up`'s (redirected to a file under the default umask)
or in any world-readable file of the work dir would give any job admin power (every job can
reach the scheduler on loopback). The check reads the service logs of the work dir
(``logs/``: each service's stdout and stderr) and every file of the work dir that other users
may read. Made only where the check can see the cluster's files (its own cluster, or
``--pki-dir`` inside a `pollux-up` work dir).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pollux.service.local.workdir import untraversable

from .session import Session

MAX_READ = 16 * 1024 * 1024
"""Larger files (checkpoints, etcd's database) are read only up to this many bytes."""


def _holders(root: Path, secret: bytes, *, world_readable: bool) -> list[str]:
    """Files under `root` that hold `secret` (only those others may reach and read, if asked)."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            try:
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode):
                    continue
                if world_readable and (
                    not info.st_mode & stat.S_IROTH or untraversable(path.parent) is not None
                ):
                    continue  # others may not read it, or not reach it
                with path.open("rb") as file:
                    if secret in file.read(MAX_READ):
                        found.append(str(path.relative_to(root)))
            except OSError:
                continue
    return found


async def token_on_output(session: Session) -> None:
    """The admin token in no service's output and in no file another user may read."""
    workdir = session.target.workdir
    if workdir is None:
        return
    token = session.target.admin_token.encode()
    logs = workdir / "logs"
    for what, found in (
        ("a service's stdout or stderr (logs/)", _holders(logs, token, world_readable=False)),
        ("a world-readable file of the work dir", _holders(workdir, token, world_readable=True)),
    ):
        session.record(
            f"the admin token in {what}",
            "ABSENT",
            "PRESENT" if found else "ABSENT",
            f"found in {', '.join(found)}" if found else f"searched {workdir}",
        )
