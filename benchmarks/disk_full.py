"""Full disks on demand: a small size-limited tmpfs mounted over a directory, then filled.

The fault suite (chaos.py) and the tests inject "disk full" for real: a tmpfs of a few MiB is
mounted over the directory (replica logs, checkpoints, an etcd member's data dir), what was in
it copied in first, and a ballast file written until the kernel answers ENOSPC; removing the
ballast frees the space again. Mounting needs root (CAP_SYS_ADMIN); `unavailable` says why
not when it cannot be done, so callers skip with a clear reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

BALLAST = ".pollux-ballast"
"""Name of the file that fills a mount (removed to free the space)."""


def unavailable() -> str:
    """Why a tmpfs cannot be mounted here ("" when it can)."""
    if os.geteuid() != 0:
        return "mounting a size-limited tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount are not installed"
    probe = Path(tempfile.mkdtemp(prefix="pollux-tmpfs-probe-"))
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            return f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}"
        subprocess.run(["umount", str(probe)], check=True)
        return ""
    finally:
        probe.rmdir()


def mount_small(directory: Path, size_bytes: int) -> None:
    """Mount a tmpfs of `size_bytes` over `directory`, keeping its contents, mode and owner."""
    info = directory.stat()
    saved = Path(tempfile.mkdtemp(prefix="pollux-tmpfs-save-"))
    try:
        for entry in directory.iterdir():
            shutil.move(str(entry), saved / entry.name)
        mode = f"mode={info.st_mode & 0o7777:o},uid={info.st_uid},gid={info.st_gid}"
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},{mode}", "tmpfs", str(directory)],
            check=True,
            capture_output=True,
        )
        for entry in saved.iterdir():
            shutil.move(str(entry), directory / entry.name)
    finally:
        shutil.rmtree(saved, ignore_errors=True)


def unmount(directory: Path) -> None:
    """Unmount the tmpfs over `directory`, copying what is in it back underneath."""
    saved = Path(tempfile.mkdtemp(prefix="pollux-tmpfs-save-"))
    try:
        with contextlib.suppress(FileNotFoundError):
            (directory / BALLAST).unlink()
        # Files may belong to job uids and be private: root copies everything.
        for entry in directory.iterdir():
            shutil.move(str(entry), saved / entry.name)
        subprocess.run(["umount", "-l", str(directory)], check=True, capture_output=True)
        for entry in saved.iterdir():
            shutil.move(str(entry), directory / entry.name)
    finally:
        shutil.rmtree(saved, ignore_errors=True)


def fill(directory: Path, *, leave: int = 0) -> Path:
    """Write a ballast file in `directory` until its filesystem is full; its path.

    Halving the write size at every ENOSPC, down to one byte, so not a byte is left; then
    `leave` bytes are given back (room for small writes, none for large ones).
    """
    ballast = directory / BALLAST
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = 1 << 20
        while size:
            try:
                os.write(fd, b"\0" * size)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                size //= 2
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return ballast


def free(directory: Path) -> None:
    """Remove the ballast: the filesystem has room again."""
    with contextlib.suppress(FileNotFoundError):
        (directory / BALLAST).unlink()


@contextlib.contextmanager
def small_tmpfs(directory: Path, size_bytes: int = 4 << 20) -> Iterator[Path]:
    """`mount_small` for the duration of a block (unmounted, contents kept, afterwards)."""
    directory.mkdir(parents=True, exist_ok=True)
    mount_small(directory, size_bytes)
    try:
        yield directory
    finally:
        unmount(directory)
