"""A replica's log file: private to its job, capped with rotation, never in the way of its exit.

Output goes to ``<log_root>/<job>/<generation>-<rank>.log``, mode 0600, owned by the job's uid
in the job's 0700 directory (job_files.py). The directory is the job's, so the file is opened
relative to its descriptor with ``O_NOFOLLOW | O_NONBLOCK`` and refused unless it is a regular
file with one link: a planted link or FIFO never redirects or blocks the launcher. At
``log_max_bytes`` it is rotated (``.1`` … ``.<log_rotations>``, the oldest dropped). A write
that fails (a full disk above all) never raises: the lines are dropped from the file (the
in-memory ring keeps them), the failure is said once (a log line, a line in the ring, the
metrics below), writing is retried every `RETRY_S`, and the file then says how many lines are
missing. So a full log filesystem costs log lines, never an exit report or a slot.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import prometheus_client
import structlog

from pollux.launcher.job_files import make_private_dir
from pollux.launcher.job_policy import RunAs

log = structlog.get_logger(__name__)

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errors that mean "no room": a full filesystem, or a quota reached."""
RETRY_S = 5.0
"""How often a failing log file is tried again."""

LOG_WRITE_FAILURES = prometheus_client.Counter(
    "pollux_launcher_log_write_failures_total",
    "Replica log writes (or opens) that failed, by errno name (ENOSPC: the disk is full).",
    ["errno"],
)
LOGS_FAILING = prometheus_client.Gauge(
    "pollux_launcher_replica_logs_failing",
    "Replica log files that cannot be written now (their lines are kept in memory only).",
)
LOG_ROTATIONS = prometheus_client.Counter(
    "pollux_launcher_log_rotations_total", "Replica log files rotated at log_max_bytes."
)


def errno_name(error: OSError) -> str:
    """ENOSPC, EACCES, ... (or "OSError" when the error carries no errno)."""
    return errno.errorcode.get(error.errno or 0, "OSError")


class ReplicaLog:
    """The log file of one replica (see the module docstring).

    Args:
        directory: The job's log directory (made here, private to `owner`), or None for no
            file at all (the lines live in memory only).
        name: The file's name in it.
        owner: The job's uid and gid, or None when replicas run as the launcher's user.
        max_bytes: Size at which the file is rotated.
        rotations: Rotated files kept (0: the file is truncated instead).
        notify: Called with one human line when writing starts failing and when it recovers
            (the replica puts it in its ring, where StreamLogs shows it).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        directory: Path | None,
        name: str,
        owner: RunAs | None,
        *,
        max_bytes: int,
        rotations: int,
        notify: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.monotonic,
        fields: dict[str, object] | None = None,
    ) -> None:
        self.directory = directory
        self.name = name
        self.owner = owner
        self.max_bytes = max_bytes
        self.rotations = rotations
        self._notify = notify
        self._clock = clock
        self._dir_fd: int | None = None
        self._fd: int | None = None
        self._size = 0
        self._dropped = 0
        self._retry_at = 0.0
        self.failure: OSError | None = None
        """The error that stopped writing, while it lasts."""
        self._closed = False
        self._log = log.bind(**(fields or {}))

    @property
    def path(self) -> Path | None:
        """The file's path (None without a directory)."""
        return None if self.directory is None else self.directory / self.name

    def write(self, lines: Sequence[str]) -> None:
        """Append lines (each gets a newline); never raises."""
        if self.directory is None or self._closed or not lines:
            return
        if self._fd is None and not self._reopen():
            self._dropped += len(lines)
            return
        data = "".join(line + "\n" for line in lines).encode("utf-8", "replace")
        if self._dropped:
            reason = "" if self.failure is None else f" ({os.strerror(self.failure.errno or 0)})"
            missing = f"pollux-launcher: {self._dropped} lines of output are missing here{reason}"
            data = (missing + "\n").encode() + data
        try:
            self._write_all(data)
        except OSError as error:
            self._fail(error)
            self._dropped += len(lines)
            return
        if self.failure is not None:
            self._recovered()
        self._dropped = 0
        self._size += len(data)
        if self._size >= self.max_bytes:
            self._rotate()

    def close(self) -> None:
        """Close the file (and say, if lines were lost, how many); never raises."""
        if self._closed:
            return
        if self._dropped and self._fd is None:
            self._reopen()
        if self._dropped and self._fd is not None:
            with contextlib.suppress(OSError):
                self._write_all(
                    f"pollux-launcher: {self._dropped} lines of output are missing here\n".encode()
                )
        self._closed = True
        if self.failure is not None:
            LOGS_FAILING.dec()
            self.failure = None
        self._close_fds()

    # -- internals -----------------------------------------------------------------------------

    def _reopen(self) -> bool:
        if self.failure is not None and self._clock() < self._retry_at:
            return False
        try:
            self._open()
        except OSError as error:
            self._fail(error)
            return False
        return True

    def _open(self) -> None:
        assert self.directory is not None
        if self._dir_fd is None:
            make_private_dir(self.directory, self.owner)
            self._dir_fd = os.open(
                self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(self.name, flags | os.O_CLOEXEC, 0o600, dir_fd=self._dir_fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                raise OSError(errno.EPERM, "not a regular file of its own", self.name)
            if self.owner is not None:
                os.fchown(fd, self.owner.uid, self.owner.gid)
            os.fchmod(fd, 0o600)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self._size = info.st_size

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def _rotate(self) -> None:
        """Start a new file: shift the rotated ones up, drop the oldest (or truncate)."""
        if self._fd is None or self._dir_fd is None:
            return
        LOG_ROTATIONS.inc()
        try:
            if self.rotations == 0:
                os.ftruncate(self._fd, 0)
                self._size = 0
                return
            os.close(self._fd)
            self._fd = None
            for index in range(self.rotations - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(
                        f"{self.name}.{index}",
                        f"{self.name}.{index + 1}",
                        src_dir_fd=self._dir_fd,
                        dst_dir_fd=self._dir_fd,
                    )
            os.rename(self.name, f"{self.name}.1", src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            self._open()
        except OSError as error:
            self._fail(error)

    def _fail(self, error: OSError) -> None:
        LOG_WRITE_FAILURES.labels(errno_name(error)).inc()
        self._retry_at = self._clock() + RETRY_S
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self.failure is not None:
            return  # said once per outage
        self.failure = error
        LOGS_FAILING.inc()
        full = error.errno in DISK_FULL_ERRNOS
        self._log.error(
            "disk_full" if full else "replica_log_unwritable",
            path=str(self.path),
            error=f"{errno_name(error)}: {os.strerror(error.errno or 0)}",
            action="the replica runs on; its output is kept in memory only (StreamLogs) "
            f"until the file can be written again (retried every {RETRY_S:.0f} s)",
        )
        self._notify(
            f"pollux-launcher: cannot write this replica's log file {self.path}: "
            f"{os.strerror(error.errno or 0)}; output is kept in memory until it can"
        )

    def _recovered(self) -> None:
        assert self.failure is not None
        self._log.info("replica_log_writable_again", path=str(self.path), dropped=self._dropped)
        self._notify(f"pollux-launcher: writing this replica's log file {self.path} again")
        self.failure = None
        LOGS_FAILING.dec()

    def _close_fds(self) -> None:
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._dir_fd = None
