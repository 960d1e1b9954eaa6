"""One replica process: start, capture its output, stop it gracefully, report its exit.

The command runs without a shell in a session of its own (a stop signal reaches all it
spawned; the launcher's signals do not reach it), started through the exec helper (exec_as.py,
`with_launcher_fence`): a fixed environment of its own, the switch to the job's uid (root's
capabilities go with it), the parent-death signal, then the exec with the job's environment
from a memfd (never argv). Output is pumped line by line into a bounded ring (StreamLogs) and
its log file (replica_log.py: a failed write drops lines, never the exit report). A stop is
SIGTERM to the group, `grace_s` to checkpoint, then SIGKILL; death by SIGTERM reports 143, a
planned stop. A non-zero exit with ENOSPC or EDQUOT in its last lines (`mentions_disk_full`)
reports ``disk_full``, so the job fails instead of restarting onto the same full disk. An
image's replica (containers.py) is its runtime's attached ``run`` client: SIGTERM goes to the
container by name (retried until it exists), and once the client is gone the container is
killed and removed by name before the exit is reported.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import errno
import itertools
import os
import re
import shutil
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from pollux.launcher import exec_as
from pollux.launcher.containers import Container
from pollux.launcher.job_policy import RunAs
from pollux.launcher.replica_log import DISK_FULL_ERRNOS, ReplicaLog
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

PLANNED_STOP = 143
"""Exit code of a replica that stopped on SIGTERM (128 + 15), as the scheduler expects."""
SPAWN_FAILED = 127
"""Exit code reported when the command could not be started (as a shell reports it)."""
_MAX_LINE = 64 * 1024
"""Longer lines are split, so one runaway line cannot exhaust memory."""
_CHUNK_LINES = 512
"""Most lines per follow batch (one StreamLogs message)."""
_DRAIN_S = 5.0
"""How long output is drained after the process exits."""
_QUOTED_CHARS = 512
"""Longest user or runtime text quoted in a message or log line (a command, stderr)."""
_SIGNAL_RETRY_S = 0.5
"""Pause between attempts to SIGTERM a container that does not exist yet."""
_CONTAINER_KILLED = 128 + signal.SIGKILL
"""What a runtime client reports for a container killed with SIGKILL (137)."""
_REMOVE_S = 30.0
"""Longest the removal of a replica's container is waited for."""
DISK_FULL_LINES = 20
"""Last output lines of a failed replica searched for a full disk."""
_DISK_FULL = re.compile(
    "|".join(
        [
            *(re.escape(os.strerror(code)) for code in sorted(DISK_FULL_ERRNOS)),
            *(rf"\b{errno.errorcode[code]}\b" for code in sorted(DISK_FULL_ERRNOS)),
            *(rf"\[Errno {code}\]" for code in sorted(DISK_FULL_ERRNOS)),
        ]
    )
)


def mentions_disk_full(lines: Sequence[str]) -> str:
    """The last of `lines` that names a full disk (ENOSPC or EDQUOT), or ""."""
    for line in reversed(lines):
        if _DISK_FULL.search(line):
            return line
    return ""


def _quoted_command(command: Sequence[str]) -> str:
    text = repr(list(command))
    return text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS] + "…"


class LogRing:
    """The last `capacity` lines of a replica's output, with followers.

    Lines are numbered from 0 in arrival order; a follower keeps a cursor (the number of the
    next line it wants) and, when it falls behind the ring, skips to the oldest retained line.
    Each line's arrival time is kept beside it, so a reader can ask for the lines since a time.
    """

    def __init__(self, capacity: int, clock: Callable[[], float] = time.time) -> None:
        self._lines: deque[str] = deque(maxlen=capacity)
        self._times: deque[float] = deque(maxlen=capacity)
        self._clock = clock
        self._next = 0
        self._closed = False
        self._changed = asyncio.Event()

    @property
    def closed(self) -> bool:
        """Whether no more lines will come (the replica exited and its output is drained)."""
        return self._closed

    def append(self, line: str) -> None:
        """Add a line and wake followers."""
        self._lines.append(line)
        self._times.append(self._clock())
        self._next += 1
        self._wake()

    def close(self) -> None:
        """Mark the end of output and wake followers so they finish."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def tail(self, count: int, since: float | None = None) -> tuple[list[str], int]:
        """The last `count` retained lines (0: all) and the cursor after them.

        With `since`, only lines that arrived at or after that time (seconds since the epoch).
        """
        lines = list(self._lines)
        if since is not None:
            # Arrival times never decrease (one clock, appended in order): bisect them.
            lines = lines[bisect.bisect_left(self._times, since) :]
        if count:
            lines = lines[-count:]
        return lines, self._next

    def since(self, cursor: int) -> tuple[list[str], int]:
        """Retained lines numbered >= `cursor` (at most one batch) and the next cursor."""
        first = self._next - len(self._lines)
        start = max(cursor, first)
        lines = list(itertools.islice(self._lines, start - first, start - first + _CHUNK_LINES))
        return lines, start + len(lines)

    async def follow(self, cursor: int) -> AsyncIterator[list[str]]:
        """Batches of lines from `cursor` on, until the ring is closed and drained."""
        while True:
            changed = self._changed  # taken before reading, so no append is missed
            lines, cursor = self.since(cursor)
            if lines:
                yield lines
            elif self._closed:
                return
            else:
                await changed.wait()


def batches(lines: Sequence[str], max_bytes: int = 1 << 20) -> Iterator[list[str]]:
    """Split lines into batches of at most `max_bytes` (one gRPC message each; at least a line).

    gRPC's default message limit is 4 MiB and a ring can hold far more than that.
    """
    batch: list[str] = []
    size = 0
    for line in lines:
        if batch and size + len(line) > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(line)
        size += len(line) + 1
    if batch:
        yield batch


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How to start a replica.

    Attributes:
        command: argv, argv[0] first (no shell).
        env: The complete environment.
        cwd: Working directory, or None for the launcher's.
        log_path: File the output is appended to (None: kept in memory only); its directory
            is the job's (replica_log.py).
        run_as: User and group to run as (no supplementary groups), or None for the
            launcher's own (job_policy.JobPolicy.run_as); they own the log file too.
        refusal: Why the launcher's job policy refuses the job; when set, nothing runs and
            the replica exits 127 with this reason in its log.
        refusal_final: The refusal is of the job itself (its working dir, its environment):
            every start would be refused alike, so its status says `refused`.
        container: The container `command` runs (a runtime's ``run``), or None for a plain
            process.
        log_max_bytes: Size at which the log file is rotated.
        log_rotations: Rotated log files kept.
        umask: The replica's file creation mask (0o077: what it creates is its own).
    """

    command: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None
    log_path: Path | None
    run_as: RunAs | None = None
    refusal: str = ""
    refusal_final: bool = False
    container: Container | None = None
    log_max_bytes: int = 64 * 1024 * 1024
    log_rotations: int = 2
    umask: int = 0o077


def with_launcher_fence(spec: LaunchSpec, env_fd: int) -> list[str]:
    """The argv that runs `spec.command` as its user, so that it dies with its launcher.

    Through the launcher's exec helper (exec_as.py), which switches to `spec.run_as` (if any)
    with root's capabilities gone before the exec, arms the parent-death signal and execs the
    command with the environment the memfd `env_fd` holds (`exec_as.env_file`). A replica runs
    in its own session (its process group is signalled as a whole), so nothing else would
    stop it if its launcher were killed: the cluster would re-place the job while the old
    replica kept training on the same checkpoint directory. With SIGKILL as its parent-death
    signal it dies the moment the launcher process ends (periodic checkpoints bound what that
    loses).

    Raises:
        FileNotFoundError: A replica of the launcher's own user names a program that does not
            exist or is not executable (checked here, so the replica's log says so plainly).
            A replica under its job's uid is not checked here: root's look-up would tell the
            job what exists where it may not look; the helper looks as the job's user, and
            says what it found with exit 127 (not found) or 126 (not allowed).
    """
    user = None if spec.run_as is None else (spec.run_as.uid, spec.run_as.gid)
    if user is not None:
        return exec_as.argv(spec.command, env_fd=env_fd, user=user, cwd=spec.cwd)
    program = spec.command[0]
    found: str | None
    if "/" in program:
        path = os.path.join(spec.cwd or os.getcwd(), program)
        found = path if os.access(path, os.X_OK) and not os.path.isdir(path) else None
    else:
        found = shutil.which(program, path=spec.env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "no such executable program", program)
    return exec_as.argv(spec.command, env_fd=env_fd, user=None, cwd=spec.cwd)


class Replica:
    """A job replica on this node, from start to reported exit.

    Args:
        job_id: The job.
        generation: Allocation generation it runs for.
        rank: Global rank.
        node: This node's name (for status reports).
        slot: Device index it holds while alive.
        grace_s: Seconds between SIGTERM and SIGKILL when stopped.
        ring_lines: Output lines kept in memory.
    """

    def __init__(
        self,
        *,
        job_id: str,
        generation: int,
        rank: int,
        node: str,
        slot: int,
        grace_s: float,
        ring_lines: int,
    ) -> None:
        self.job_id = job_id
        self.generation = generation
        self.rank = rank
        self.node = node
        self.slot = slot
        self.grace_s = grace_s
        self.log = LogRing(ring_lines)
        self.pid = 0
        self.exit_code: int | None = None
        self.started_at = time.time()
        self.exited_at: float | None = None
        self.stop_requested = False
        self.fenced = False
        """Killed because the node's lease lapsed (fence.py): a planned stop, not a failure."""
        self.status_revision = 0
        """Mod revision of this replica's last status write (0: none yet)."""
        self.exit_reported = False
        self.disk_full = ""
        self.refused = False
        """Its launcher refused the job itself (`LaunchSpec.refusal_final`): never retried."""
        """The output line that says the replica failed on a full disk ("": it did not)."""
        self._process: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        self._exited = asyncio.Event()
        self._started = asyncio.Event()
        self._starting = False
        self._terminated = False
        self._container: Container | None = None
        self._log = log.bind(job_id=job_id, generation=generation, rank=rank)

    @property
    def key(self) -> tuple[str, int, int]:
        """(job_id, generation, rank): unique on a node."""
        return (self.job_id, self.generation, self.rank)

    @property
    def alive(self) -> bool:
        """Whether the replica holds its slot: started or starting, and not yet exited."""
        return self.exit_code is None

    def status(self) -> pb.ReplicaStatus:
        """The replica's status as reported to etcd and ListReplicas."""
        status = pb.ReplicaStatus(
            job_id=self.job_id,
            node=self.node,
            rank=self.rank,
            generation=self.generation,
            phase=pb.REPLICA_PHASE_RUNNING if self.exit_code is None else pb.REPLICA_PHASE_EXITED,
            exit_code=self.exit_code or 0,
            pid=self.pid,
        )
        if self.exit_code not in (None, 0, PLANNED_STOP):
            status.output_tail = output_tail(self.log.tail(TAIL_LINES)[0])
            if self.disk_full:
                status.disk_full = True
                status.output_tail = output_tail([self.disk_full])
            status.refused = self.refused
        status.time.FromNanoseconds(int((self.exited_at or self.started_at) * 1e9))
        return status

    async def start(self, spec: LaunchSpec) -> None:
        """Start the process and its output pump.

        A command that cannot be started (missing binary or working directory, or refused by
        the launcher's job policy) becomes an exited replica with code 127 and the reason in
        its log, rather than an exception: the scheduler decides what a failed replica means.
        """
        self._starting = True
        try:
            await self._spawn(spec)
        finally:
            self._started.set()

    async def _spawn(self, spec: LaunchSpec) -> None:
        if self.stop_requested:  # stopped before it started: it never runs
            self._finish(PLANNED_STOP)
            return
        sink = ReplicaLog(
            None if spec.log_path is None else spec.log_path.parent,
            "" if spec.log_path is None else spec.log_path.name,
            spec.run_as,
            max_bytes=spec.log_max_bytes,
            rotations=spec.log_rotations,
            notify=self.log.append,
            fields={"job_id": self.job_id, "generation": self.generation, "rank": self.rank},
        )
        if spec.refusal:
            message = f"pollux-launcher: cannot start the replica: {spec.refusal}"
            self.log.append(message)
            sink.write([message])
            sink.close()
            self._log.warning("replica_refused", reason=spec.refusal, final=spec.refusal_final)
            self.refused = spec.refusal_final
            self._finish(SPAWN_FAILED)
            return
        self._container = spec.container
        try:
            # The helper (exec_as.py) starts as this process's user with an environment of its
            # own and takes the job's from the memfd: nothing of the job's runs as root.
            with exec_as.env_file(spec.env) as env_fd:
                self._process = await asyncio.create_subprocess_exec(
                    *with_launcher_fence(spec, env_fd),
                    env=exec_as.helper_env(spec.env),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(env_fd,),
                    umask=spec.umask,
                )
        except Exception as error:
            # Whatever the exec refused (a missing program or working dir, a NUL byte in an
            # argument, the environment or the working dir), the replica failed to start.
            message = f"pollux-launcher: cannot start {_quoted_command(spec.command)}: {error}"
            self.log.append(message)
            sink.write([message])
            sink.close()
            self._log.warning("replica_spawn_failed", error=str(error))
            self._finish(SPAWN_FAILED)
            return
        self.pid = self._process.pid
        self.started_at = time.time()
        self._pump = asyncio.create_task(self._run(self._process, sink))
        self._log.info(
            "replica_started",
            pid=self.pid,
            slot=self.slot,
            uid=os.getuid() if spec.run_as is None else spec.run_as.uid,
            container=None if spec.container is None else spec.container.name,
        )

    async def _run(self, process: asyncio.subprocess.Process, sink: ReplicaLog) -> None:
        reader = asyncio.create_task(self._read(process, sink))
        code: int | None = None
        try:
            code = await process.wait()
            # Leftovers of the group (workers of a crashed replica) must not outlive it; killing
            # them also closes their copies of the pipe, so the reader sees the end of output.
            _signal_group(process.pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(asyncio.shield(reader), _DRAIN_S)
            except TimeoutError:  # a process that left the group still holds the pipe
                reader.cancel()
            except Exception:  # the pump died: its lines are lost, the exit is not
                self._log.exception("replica_output_pump_failed")
            await self._remove_container()
        finally:
            sink.close()
            if code is None:  # cancelled or crashed before the exit: report a kill, not hang
                code = -int(signal.SIGKILL)
                _signal_group(process.pid, signal.SIGKILL)
            if (code == -signal.SIGTERM and self.stop_requested) or (
                self.killed(code) and self.fenced
            ):
                code = PLANNED_STOP
            if code not in (0, PLANNED_STOP) and not self.killed(code):
                self.disk_full = mentions_disk_full(self.log.tail(DISK_FULL_LINES)[0])
            self._finish(code)
        self._log.info(
            "replica_exited",
            exit_code=code,
            stop_requested=self.stop_requested,
            disk_full=bool(self.disk_full),
        )

    async def _read(self, process: asyncio.subprocess.Process, sink: ReplicaLog) -> None:
        stream = process.stdout
        if stream is None:
            return
        pending = b""
        while chunk := await stream.read(65536):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            while len(pending) > _MAX_LINE:
                complete.append(pending[:_MAX_LINE])
                pending = pending[_MAX_LINE:]
            self._emit(complete, sink)
        if pending:
            self._emit([pending], sink)

    async def _remove_container(self) -> None:
        """Kill and remove the replica's container, if it has one and it still exists.

        The runtime client has exited (or been killed): a container it left behind would go
        on training after its exit is reported.
        """
        container = self._container
        if container is None:
            return
        try:
            remover = await asyncio.create_subprocess_exec(
                *container.remove_argv(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await asyncio.wait_for(remover.communicate(), _REMOVE_S)
        except (OSError, TimeoutError) as error:
            self._log.error("container_remove_failed", container=container.name, error=str(error))
            return
        if remover.returncode:
            self._log.warning(
                "container_remove_failed",
                container=container.name,
                error=err.decode(errors="replace").strip()[:_QUOTED_CHARS],
            )

    def killed(self, code: int | None) -> bool:
        """Whether `code` says the replica was SIGKILLed (its container too, for a container)."""
        return code == -signal.SIGKILL or (
            self._container is not None and code == _CONTAINER_KILLED
        )

    def _emit(self, raw_lines: list[bytes], sink: ReplicaLog) -> None:
        lines = [raw.decode("utf-8", errors="replace").rstrip("\r") for raw in raw_lines]
        for line in lines:
            self.log.append(line)
        sink.write(lines)

    def fail_to_start(self, reason: str, *, disk_full: bool = False) -> None:
        """Mark a replica that could not be started as exited with `SPAWN_FAILED`.

        For failures outside `start` itself (the launcher's own preparation); a replica that
        already exited keeps its code. Its slot is free from here on. `disk_full`: the
        preparation failed on a full disk (the job fails rather than restarting).
        """
        if self.exit_code is None:
            line = f"pollux-launcher: {reason}"
            self.log.append(line)
            if disk_full:
                self.disk_full = line
            self._finish(SPAWN_FAILED)
        self._started.set()

    def _finish(self, code: int) -> None:
        self.exit_code = code
        self.exited_at = time.time()
        self.log.close()
        self._exited.set()

    def mark_fenced(self) -> None:
        """Count a kill as the fence's (the watchdog's or `fence`): it reports a planned stop."""
        self.fenced = True
        if self.killed(self.exit_code):
            self.exit_code = PLANNED_STOP

    async def fence(self) -> int:
        """SIGKILL the group now, without a grace period; return the exit code (143).

        For a node whose lease lapsed: the cluster may already run the job's next generation,
        so there is no time to checkpoint (periodic checkpoints bound what is lost).
        """
        self.mark_fenced()
        if (code := await self._begin_stop()) is not None:
            return code
        self._log.warning("replica_fenced")
        _signal_group(self.pid, signal.SIGKILL)
        return await self.wait()

    async def _begin_stop(self) -> int | None:
        """Mark the replica stopped; its exit code if no process is left to signal, else None.

        A replica stopped before `start` never runs (a planned stop); one whose spawn is in
        flight is waited for first.
        """
        if self.exit_code is not None:
            return self.exit_code
        self.stop_requested = True
        if self._process is None:
            if not self._starting:
                self._finish(PLANNED_STOP)
                return PLANNED_STOP
            await self._started.wait()
            if self._exited.is_set():
                return await self.wait()
        return None

    async def wait(self) -> int:
        """Wait for the exit (and the end of its output); returns the exit code."""
        await self._exited.wait()
        return self.exit_code if self.exit_code is not None else SPAWN_FAILED

    async def stop(self, grace_s: float | None = None) -> int:
        """SIGTERM the group, wait `grace_s` (default: the replica's), SIGKILL; return the code.

        Idempotent: a second call waits for the first one's outcome. A replica stopped before
        `start` never runs and reports a planned stop.
        """
        if (code := await self._begin_stop()) is not None:
            return code
        grace = self.grace_s if grace_s is None else grace_s
        signaller: asyncio.Task[None] | None = None
        if not self._terminated:
            self._terminated = True
            self._log.info("replica_stopping", grace_s=grace)
            if self._container is None:
                _signal_group(self.pid, signal.SIGTERM)
            else:
                signaller = asyncio.create_task(self._terminate_container(self._container))
        try:
            return await asyncio.wait_for(asyncio.shield(self.wait()), grace)
        except TimeoutError:
            self._log.warning("replica_killed", grace_s=grace)
            _signal_group(self.pid, signal.SIGKILL)
            return await self.wait()
        finally:
            if signaller is not None:
                signaller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await signaller

    async def _terminate_container(self, container: Container) -> None:
        """SIGTERM the container through its runtime, retrying until that works or it exited.

        The first attempts can fail while the client is still creating the container.
        """
        while not self._exited.is_set():
            try:
                signaller = await asyncio.create_subprocess_exec(
                    *container.signal_argv("TERM"),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    if await asyncio.wait_for(signaller.wait(), _REMOVE_S) == 0:
                        return
                finally:
                    if signaller.returncode is None:
                        signaller.kill()
                        await signaller.wait()
            except (OSError, TimeoutError) as error:
                self._log.warning(
                    "container_signal_failed", container=container.name, error=str(error)
                )
            await asyncio.sleep(_SIGNAL_RETRY_S)


TAIL_LINES = 3
"""Output lines of a failed replica its status carries (the error is usually the last)."""
TAIL_CHARS = 512
"""Most characters of that tail: the status stays small, the history reason smaller still."""


def output_tail(lines: Sequence[str]) -> str:
    """The last non-blank `lines` as one line, cut from the front to `TAIL_CHARS`."""
    text = " | ".join(line.strip() for line in lines if line.strip())
    return text if len(text) <= TAIL_CHARS else "…" + text[-(TAIL_CHARS - 1) :]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal a replica's process group (its pid: it leads its own session)."""
    if pid <= 0:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
