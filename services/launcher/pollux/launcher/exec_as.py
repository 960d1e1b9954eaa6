"""Start a replica's command as its job's user: the launcher's exec helper (stdlib only).

Nothing may run as root with a job's environment (glibc honours LOCPATH, NLSPATH, TZDIR,
MALLOC_TRACE … in any process that is not set-uid), nor exec the job's program while holding
root's capabilities (with CAP_DAC_OVERRIDE it runs what the job's uid may not, readable then
through /proc/self/exe). setpriv does both, so replicas start here instead: ``python -I -S
exec_as.py`` (`argv`; no site dir, no PYTHON* variable) with a fixed environment
(`helper_env`: `BASE_ENV` and the replica `MARKERS`). The job's environment comes in an
inherited memfd (`env_file`), never in argv (/proc/PID/cmdline is world-readable). As root it
reads it, drops its groups, sets gids then uids (no KEEPCAPS: capabilities go; it checks).
As the job's user: parent-death SIGKILL (set after the switch, which clears it; exit at once
if the launcher already died), the working dir, and the exec on the job's PATH with its
environment. A failure is one line (``pollux-launcher: cannot start …``), exit 127 (not
found) or 126 (not run). Without ``--user`` (launcher not root, image client): no switch.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

HELPER = os.path.abspath(__file__)
"""This file: what the launcher runs."""
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
"""The helper's own environment (nothing of the job's)."""
MARKERS = ("POLLUX_NODE_FENCE", "POLLUX_JOB_ID", "POLLUX_ALLOCATION_GEN")
"""Variables of the replica's environment the helper carries too: the launcher sets them (a
job may not: job_policy.py), glibc and Python ignore them, and they mark the process as the
node's replica (fence.py, proc.py) from its first instant."""
PREFIX = "pollux-launcher: cannot start"
"""How every message of the helper begins (as the launcher's own: failure_hints.py)."""
NOT_FOUND = 127
"""Exit code when the program (or the working dir) does not exist, as a shell reports it."""
CANNOT_RUN = 126
"""Exit code for everything else that keeps the command from running."""
_PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that made it ends."""
_CAPABILITY_LINES = (b"CapPrm:", b"CapEff:", b"CapAmb:")


def argv(
    command: Sequence[str],
    *,
    env_fd: int,
    user: tuple[int, int] | None = None,
    cwd: str | None = None,
    parent: int | None = None,
) -> list[str]:
    """The argv that runs `command` through this helper.

    Args:
        command: The job's argv (argv[0] is looked up on the job's PATH unless it has a "/").
        env_fd: The descriptor `env_file` made, passed to the child (``pass_fds``).
        user: (uid, gid) to switch to, with no supplementary groups; None keeps the caller's.
        cwd: The working dir, entered after the switch; None keeps the caller's.
        parent: The pid the helper's parent must have (default: this process, which starts
            it); the helper dies if its parent is another by the time the death signal is set.
    """
    out = [sys.executable, "-I", "-S", HELPER, "--env-fd", str(env_fd)]
    out += ["--parent", str(os.getpid() if parent is None else parent)]
    if user is not None:
        out += ["--user", f"{user[0]}:{user[1]}"]
    if cwd is not None:
        out += ["--cwd", cwd]
    return [*out, "--", *command]


def helper_env(env: Mapping[str, str]) -> dict[str, str]:
    """The helper's environment: `BASE_ENV` and the replica's `MARKERS` from `env`."""
    return {**BASE_ENV, **{name: env[name] for name in MARKERS if name in env}}


@contextlib.contextmanager
def env_file(env: Mapping[str, str]) -> Iterator[int]:
    """A memfd holding `env` (``NAME=value``, each ended by a NUL byte), open while in the block.

    Close-on-exec: only a child given it in ``pass_fds`` inherits it.

    Raises:
        ValueError: A name is empty or holds "=" or a NUL byte, or a value holds a NUL byte
            (what ``os.execve`` refuses).
    """
    data = bytearray()
    for name, value in env.items():
        key, raw = os.fsencode(name), os.fsencode(value)
        if not key or b"=" in key or b"\0" in key:
            raise ValueError(f"illegal environment variable name {name!r}")
        if b"\0" in raw:
            raise ValueError(f"embedded null byte in the value of {name}")
        data += key + b"=" + raw + b"\0"
    fd = os.memfd_create("pollux-replica-env", os.MFD_CLOEXEC)
    if fd < 3:  # a launcher without stdin: the child's own stdio would replace it
        low, fd = fd, fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
        os.close(low)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield fd
    finally:
        os.close(fd)


# -- the helper itself (runs as `python -I -S exec_as.py`) ---------------------------------------


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, message.encode("utf-8", "backslashreplace") + b"\n")


def _fail(program: str, reason: str, code: int) -> NoReturn:
    _say(f"{PREFIX} {program!r}: {reason}")
    os._exit(code)


def _read_env(fd: int) -> dict[bytes, bytes]:
    size = os.fstat(fd).st_size
    data = b""
    while len(data) < size:
        chunk = os.pread(fd, size - len(data), len(data))
        if not chunk:
            break
        data += chunk
    os.close(fd)
    env = {}
    for entry in data.split(b"\0"):
        if entry:
            name, _, value = entry.partition(b"=")
            env[name] = value
    return env


def _capabilities_left() -> bool:
    """Whether the process still holds a capability (False when /proc cannot say)."""
    try:
        with open("/proc/self/status", "rb") as status:
            lines = status.read().splitlines()
    except OSError:
        return False
    return any(
        int(line.split()[1], 16) != 0 for line in lines if line.startswith(_CAPABILITY_LINES)
    )


@dataclass(frozen=True, slots=True)
class _Options:
    env_fd: int
    parent: int
    user: tuple[int, int] | None
    cwd: str | None
    command: list[str]


def _parse(args: list[str]) -> _Options:
    options: dict[str, str] = {}
    while args and args[0] != "--":
        if len(args) < 2 or args[0] not in ("--env-fd", "--parent", "--user", "--cwd"):
            raise ValueError(f"unexpected argument {args[0]!r}")
        options[args[0]] = args[1]
        args = args[2:]
    if len(args) < 2 or "--env-fd" not in options or "--parent" not in options:
        raise ValueError("usage: --env-fd N --parent PID [--user UID:GID] [--cwd DIR] -- ARGV")
    user = None
    if "--user" in options:
        uid, _, gid = options["--user"].partition(":")
        user = (int(uid), int(gid))
    return _Options(
        env_fd=int(options["--env-fd"]),
        parent=int(options["--parent"]),
        user=user,
        cwd=options.get("--cwd"),
        command=args[1:],
    )


def _become(program: str, uid: int, gid: int) -> None:
    """Drop every group, then set all gids and all uids: root's capabilities go with it."""
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as error:
        _fail(program, f"cannot switch to uid {uid}, gid {gid}: {error}", CANNOT_RUN)
    if uid != 0 and _capabilities_left():
        _fail(program, f"capabilities outlived the switch to uid {uid}", CANNOT_RUN)


def _die_with(program: str, parent: int) -> None:
    """Arm SIGKILL for when the parent ends; die now if it already has."""
    import ctypes  # noqa: PLC0415  (imported before the switch: see main)

    libc = ctypes.CDLL(None, use_errno=True)
    death = [ctypes.c_ulong(value) for value in (signal.SIGKILL, 0, 0, 0)]
    if libc.prctl(_PR_SET_PDEATHSIG, *death) != 0:
        reason = os.strerror(ctypes.get_errno())
        _fail(program, f"cannot set the parent-death signal: {reason}", CANNOT_RUN)
    if os.getppid() != parent:  # the launcher died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def _exec_reason(error: OSError, program: str, env: Mapping[bytes, bytes], uid: int | None) -> str:
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        if "/" in program:
            return os.strerror(errno.ENOENT)
        path = os.fsdecode(env.get(b"PATH", os.defpath.encode()))
        return f"not found on the job's PATH ({path})"
    reason = os.strerror(error.errno or errno.EACCES)
    if error.errno == errno.EACCES and uid is not None:
        reason += (
            f" to uid {uid} (the job's): the program and every directory above it must be "
            "open to other users (chmod o+rx)"
        )
    return reason


def main(args: list[str]) -> NoReturn:
    """Switch to the job's user, arm the parent-death signal and exec (module docstring)."""
    try:
        options = _parse(args)
    except ValueError as error:
        _fail("?", f"bad helper arguments: {error}", CANNOT_RUN)
    program, uid = options.command[0], None
    # Imported before the switch: the interpreter's own modules may lie where the job's uid
    # cannot read them (os.get_exec_path, which execvpe calls, imports warnings).
    import ctypes  # noqa: F401, PLC0415
    import warnings  # noqa: F401, PLC0415

    try:
        env = _read_env(options.env_fd)
    except OSError as error:
        _fail(program, f"cannot read the job's environment: {error}", CANNOT_RUN)
    if options.user is not None:
        uid = options.user[0]
        _become(program, *options.user)
    _die_with(program, options.parent)
    if options.cwd is not None:
        try:
            os.chdir(options.cwd)
        except OSError as error:
            who = "" if uid is None else f" as uid {uid}"
            code = NOT_FOUND if error.errno in (errno.ENOENT, errno.ENOTDIR) else CANNOT_RUN
            _fail(
                program, f"cannot enter the working dir {options.cwd}{who}: {error.strerror}", code
            )
    # Python ignores these; an ignored signal stays ignored across exec (subprocess's
    # restore_signals does the same for its children).
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvpe(program, options.command, env)
    except OSError as error:
        code = NOT_FOUND if error.errno in (errno.ENOENT, errno.ENOTDIR) else CANNOT_RUN
        _fail(program, _exec_reason(error, program, env, uid), code)
    except ValueError as error:  # a NUL byte in an argument
        _fail(program, str(error), CANNOT_RUN)


if __name__ == "__main__":
    main(sys.argv[1:])
