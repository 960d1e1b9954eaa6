"""A local cluster's work directory: its layout and modes, and whether job uids can use it.

Keys and logs are the cluster's own (0700); the work dir itself is traversable (0711) so that
job uids reach their own checkpoint and scratch directories (0700, theirs). When replicas run
under their job's own uid, the work dir and this Python environment must be reachable by
others, which job_reach.py checks before anything starts.
"""

from __future__ import annotations

from pathlib import Path


def prepare(workdir: Path, pki_dir: Path, etcd_dir: Path | None) -> None:
    """Make the work dir's layout with its modes (whether job uids reach it: job_reach.py)."""
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o711)
    for private in (workdir / "logs", pki_dir):
        private.mkdir(mode=0o700, exist_ok=True)
        private.chmod(0o700)
    if etcd_dir is not None:
        etcd_dir.mkdir(mode=0o700, parents=True, exist_ok=True)


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
