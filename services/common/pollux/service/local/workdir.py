"""A local cluster's work directory: its layout and modes, and whether job uids can use it.

Keys and logs are the cluster's own (0700); the work dir itself is traversable (0711) so that
job uids reach their own checkpoint and scratch directories (0700, theirs). When replicas run
under their job's own uid, the work dir and this Python environment must be reachable by
others, which is checked before anything starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def prepare(workdir: Path, pki_dir: Path, etcd_dir: Path | None, *, isolated: bool) -> None:
    """Make the work dir's layout with its modes; check job uids can reach their files.

    Raises:
        RuntimeError: Replicas are to run under their job's uid but cannot (not root, or a
            directory or the Python environment others may not reach); the message says what
            to do.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o711)
    for private in (workdir / "logs", pki_dir):
        private.mkdir(mode=0o700, exist_ok=True)
        private.chmod(0o700)
    if etcd_dir is not None:
        etcd_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not isolated:
        return
    if os.geteuid() != 0:
        raise RuntimeError(
            "replicas can only run under their job's own uid (so that no job reads a key, "
            "a token or another job's files) when pollux-up runs as root: run it as root, "
            "or pass --insecure-replicas to run them as your own user"
        )
    blocked = untraversable(workdir.resolve())
    if blocked is not None:
        raise RuntimeError(
            f"jobs run under their own uids and cannot reach {workdir}: {blocked} is "
            "not traversable by others; use a --workdir under a directory others may "
            f"traverse (e.g. /var/tmp), or chmod o+x {blocked}"
        )
    environment = Path(sys.prefix).resolve()
    blocked = untraversable(environment)
    if blocked is not None or not os.stat(environment).st_mode & 0o005:
        raise RuntimeError(
            f"jobs run under their own uids and cannot use this Python environment "
            f"({environment}): {blocked or environment} is not readable by others; "
            "install it where others may read it (chmod -R o+rX), or pass "
            "--insecure-replicas"
        )


def untraversable(path: Path) -> Path | None:
    """The first of `path` and its parents that others may not traverse (no o+x), or None."""
    for directory in [*reversed(path.parents), path]:
        try:
            mode = directory.stat().st_mode
        except OSError:
            return directory
        if not mode & 0o001:
            return directory
    return None
