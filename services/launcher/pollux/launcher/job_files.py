"""A job's files on a node, private to the job's uid, and their removal after retention.

Per job the launcher keeps ``<root>/<job id>`` under three roots, mode 0700 and owned by the
job's uid (job_users.py): the checkpoint directory (``checkpoint_root``, shared storage on a
multi-node cluster), the replica logs (``log_root``, 0600 files, replica_log.py) and scratch
(``scratch_root``: the replicas' ``HOME``, ``TMPDIR`` and a copy of the cluster's CA). The
job's uid may plant links or FIFOs there, so the launcher never follows a name inside:
directories are opened ``O_NOFOLLOW`` and changed through descriptors, files made ``O_EXCL``
under a temporary name and renamed, removal never follows links.

Retention (`expired`): a job's directories go once the job is over (no allocation, no live
replica here, its record finished or gone) and ``file_retention_s`` has passed since it
finished (or since the directory last changed, without a record); on a shared root whichever
node comes first removes them. `reclaim` removes what other jobs left under a reused uid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pollux.launcher.job_policy import RunAs

ROOT_MODES = {"checkpoint_root": 0o711, "scratch_root": 0o711, "log_root": 0o700}
"""Modes of the roots a launcher creates: job uids traverse the checkpoint and scratch roots to
their own directory; nothing of a job's needs the log root. A root that exists is the
operator's and keeps its mode."""
SCAN_LIMIT = 1000
"""Most entries of a job directory looked at for its last change (a job controls how many)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """What the sweep knows of a job that has files on the node.

    Attributes:
        live: It has an allocation or a live replica here (never removed).
        finish_time: When its record says it finished (seconds since the epoch); None while
            it is not finished, or when its record is gone (then `gone` is set).
        gone: Its record no longer exists.
    """

    live: bool
    finish_time: float | None = None
    gone: bool = False


def expired(
    on_disk: Mapping[str, float],
    jobs: Mapping[str, Finished],
    *,
    now: float,
    retention_s: float,
) -> list[str]:
    """The job directories of a root that may be removed now, by job id.

    Args:
        on_disk: Last change (seconds since the epoch) of each job's directory in the root.
        jobs: What is known of each of those jobs (a job missing here counts as gone).
        now: The time now.
        retention_s: How long a finished job's files are kept.
    """
    out = []
    for job_id, changed in sorted(on_disk.items()):
        known = jobs.get(job_id, Finished(live=False, gone=True))
        if known.live or (known.finish_time is None and not known.gone):
            continue
        since = changed if known.finish_time is None else known.finish_time
        if now - since >= retention_s:
            out.append(job_id)
    return out


def last_change(directory: Path) -> float:
    """The newest mtime of `directory` and its first `SCAN_LIMIT` entries (no link followed)."""
    newest = directory.lstat().st_mtime
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for count, entry in enumerate(entries):
            if count >= SCAN_LIMIT:
                break
            with contextlib.suppress(OSError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def job_dirs(root: Path) -> dict[str, float]:
    """Each job directory directly under `root` with its last change (links are skipped)."""
    out: dict[str, float] = {}
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return out
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                out[entry.name] = last_change(Path(entry.path))
    return out


def remove(path: Path) -> None:
    """Remove a job's directory tree without following any link in it (gone already: fine)."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return


def reclaim(roots: Iterable[Path], uid: int, job_id: str) -> list[Path]:
    """Remove every directory owned by `uid` directly under `roots` that is not `job_id`'s.

    Before `uid` goes to `job_id` on this node: a job that held the uid before has released
    it (its retention passed), and its leftovers must not become readable by the new holder.
    Returns what was removed.
    """
    removed = []
    for root in roots:
        try:
            entries = list(os.scandir(root))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.name == job_id:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid and stat.S_ISDIR(info.st_mode):
                remove(Path(entry.path))
                removed.append(Path(entry.path))
    return removed


def make_root(path: Path, mode: int) -> None:
    """Create `path` (and missing parents) with `mode` unless it exists."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        return
    path.chmod(mode)  # mkdir's mode is masked by the umask


def make_private_dir(path: Path, owner: RunAs | None, *, mode: int = 0o700) -> None:
    """Create `path` (its parent is the launcher's) if missing; make it `owner`'s, `mode`.

    With `owner` None (replicas run as the launcher's user) only the mode is set. A link or a
    non-directory at `path` is refused, never followed.

    Raises:
        OSError: It could not be made, or it is not a directory.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _own(fd, owner, mode)
    finally:
        os.close(fd)


def make_private_subdir(parent: Path, name: str, owner: RunAs | None) -> Path:
    """`make_private_dir` of `parent/name`, where `parent` may belong to the job's uid.

    The name is made and opened relative to the parent's descriptor, with no link followed.
    """
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=pfd)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        try:
            _own(fd, owner, 0o700)
        finally:
            os.close(fd)
    finally:
        os.close(pfd)
    return parent / name


def _own(fd: int, owner: RunAs | None, mode: int) -> None:
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory")
    if owner is not None:
        os.fchown(fd, owner.uid, owner.gid)
    os.fchmod(fd, mode)


def write_file(directory: Path, name: str, data: bytes) -> Path:
    """Write `directory/name` (mode 0644, the launcher's) atomically, following no link.

    For files the launcher hands a job in its own directory (the CA certificate): written
    under a fresh temporary name and renamed over whatever the job may have put there; the
    file stays the launcher's, so the job may read it but not change it.
    """
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dfd,
        )
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
    return directory / name
