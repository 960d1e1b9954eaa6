"""The launcher's exec helper (launcher/exec_as.py) starting real replicas under real uids.

Nothing of a job may run as root with the job's environment, nor may its program be exec'd
while root's capabilities are still held: the command runs as the job's uid, with exactly the
job's environment, only after the switch; a program the uid may not run is refused (126); the
replica still dies with its launcher; and no value of the environment shows in a command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from benchmarks.security_attempts.replica_start import LOCALE, locale_trap, opened_while
from pollux.launcher import exec_as
from pollux.launcher.job_policy import DEFAULT_JOB_UIDS, RunAs
from pollux.launcher.replica import LaunchSpec, Replica, with_launcher_fence

pytestmark = pytest.mark.timeout(60)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching the replica user needs root")

JOB_UID = DEFAULT_JOB_UIDS[1] - 2
"""A job uid no test cluster claims (claims probe from a point derived from the job id; the
last uid of the range is job_reach's probe uid)."""
SECRET = "s3cr3t-value-of-a-secret-env"


def job_env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": "/", "TOKEN": SECRET, **extra}


async def run(spec: LaunchSpec, timeout: float = 20.0) -> tuple[int, list[str]]:
    """Start a replica of `spec`, wait for its exit: (exit code, output lines)."""
    replica = Replica(
        job_id="j-exec", generation=1, rank=0, node="n1", slot=0, grace_s=1.0, ring_lines=1000
    )
    await replica.start(spec)
    try:
        code = await asyncio.wait_for(replica.wait(), timeout)
    finally:
        if replica.alive:
            await replica.stop(0.1)
    return code, replica.log.tail(0)[0]


def root_only(tmp_path: Path) -> Path:
    """A directory only root may enter."""
    directory = tmp_path / "root-only"
    directory.mkdir(mode=0o700)
    return directory


@as_root
async def test_the_command_runs_as_the_job_uid_with_exactly_the_jobs_environment(
    tmp_path: Path,
) -> None:
    env = job_env(LR="0.1", SPACED="a b=c")
    as_job = LaunchSpec(["env"], env, str(tmp_path), None, run_as=RunAs(JOB_UID, JOB_UID))
    code, lines = await run(as_job)
    assert code == 0, lines
    assert sorted(lines) == sorted(f"{name}={value}" for name, value in env.items())
    script = "id -u; id -g; id -G; grep -E '^Cap(Prm|Eff|Amb):' /proc/self/status; pwd; umask"
    code, lines = await run(
        LaunchSpec(["sh", "-c", script], env, str(tmp_path), None, run_as=RunAs(JOB_UID, JOB_UID))
    )
    assert code == 0, lines
    uid, gid, groups, *capabilities, cwd, umask = lines
    assert (uid, gid, groups) == (str(JOB_UID), str(JOB_UID), str(JOB_UID))  # no root group
    assert [line.split()[1] for line in capabilities] == ["0000000000000000"] * 3
    assert (cwd, umask) == (str(tmp_path), "0077")
    # Without a user (a launcher that is not root, a runtime client) only the environment is
    # the job's: it is exactly that too.
    code, lines = await run(LaunchSpec(["env"], env, None, None))
    assert code == 0, lines
    assert sorted(lines) == sorted(f"{name}={value}" for name, value in env.items())


@as_root
async def test_nothing_runs_as_root_with_the_jobs_locale_variables(tmp_path: Path) -> None:
    # glibc honours LOCPATH in any process that is not set-uid: a root process started with
    # the job's environment opens the job's locale files (setpriv did, before the switch).
    locpath = locale_trap(root_only(tmp_path))
    env = job_env(LOCPATH=str(locpath), LC_ALL=LOCALE)
    # Control: a root process with that environment does open them (the trap works).
    control = await asyncio.create_subprocess_exec(
        "env", env=env, stdout=asyncio.subprocess.DEVNULL
    )
    assert await opened_while(locpath, control.wait()), "no trap"
    # The replica's start: the helper runs as root with its own environment only, and the
    # job's `env` (which calls setlocale) runs as the job's uid, which may not open them.
    spec = LaunchSpec(["env"], env, "/", None, run_as=RunAs(JOB_UID, JOB_UID))
    started = asyncio.ensure_future(run(spec))
    assert await opened_while(locpath, started) == []
    code, lines = started.result()
    assert code == 0, lines
    assert f"LOCPATH={locpath}" in lines  # the job did get its variables


@as_root
async def test_a_program_the_job_uid_may_not_run_is_refused_not_run(tmp_path: Path) -> None:
    closed = root_only(tmp_path)
    hidden = closed / "id"  # readable and executable, in a directory only root may enter
    shutil.copy2("/usr/bin/id", hidden)
    private = tmp_path / "private-id"  # root's own (0700) in a directory others may enter
    shutil.copy2("/usr/bin/id", private)
    private.chmod(0o700)
    for program in (hidden, private):
        spec = LaunchSpec([str(program)], job_env(), "/", None, run_as=RunAs(JOB_UID, JOB_UID))
        code, lines = await run(spec)
        assert code == exec_as.CANNOT_RUN, lines
        assert lines == [
            f"{exec_as.PREFIX} {str(program)!r}: Permission denied to uid {JOB_UID} (the "
            "job's): the program and every directory above it must be open to other users "
            "(chmod o+rx)"
        ]
        # Root may run it: the refusal is the job uid's own permissions, not a missing file.
        code, lines = await run(LaunchSpec([str(program)], job_env(), "/", None))
        assert (code, lines[0].split()[0]) == (0, "uid=0(root)")
    # A working dir the job's uid may not enter is refused the same way.
    spec = LaunchSpec(["true"], job_env(), str(closed), None, run_as=RunAs(JOB_UID, JOB_UID))
    code, lines = await run(spec)
    assert code == exec_as.CANNOT_RUN
    assert lines == [
        f"{exec_as.PREFIX} 'true': cannot enter the working dir {closed} as uid {JOB_UID}: "
        "Permission denied"
    ]
    code, lines = await run(LaunchSpec(["no-such-program-here"], job_env(), "/", None))
    assert code == 127
    assert "no such executable program" in lines[0]
    # Under the job's uid nothing is looked up as root: a missing program in a directory the
    # job may not enter answers as an existing one does, so its absence is not told.
    missing = closed / "no-such-program"
    code, lines = await run(
        LaunchSpec([str(missing)], job_env(), "/", None, run_as=RunAs(JOB_UID, JOB_UID))
    )
    assert code == exec_as.CANNOT_RUN
    assert "Permission denied" in lines[0]
    code, lines = await run(
        LaunchSpec(["no-such-program-here"], job_env(), "/", None, run_as=RunAs(JOB_UID, JOB_UID))
    )
    assert code == 127
    assert lines[0].startswith(f"{exec_as.PREFIX} 'no-such-program-here': not found")


LAUNCHER = """
import asyncio, os, sys
from pollux.launcher.job_policy import RunAs
from pollux.launcher.replica import LaunchSpec, Replica
uid = int(sys.argv[1])
env = {"PATH": "/usr/bin:/bin", "TOKEN": os.environ["SECRET"]}
async def main():
    replica = Replica(job_id="j-orphan", generation=1, rank=0, node="n1", slot=0, grace_s=1.0,
                      ring_lines=10)
    await replica.start(LaunchSpec(["sleep", "60"], env, "/", None,
                                   run_as=RunAs(uid, uid) if uid >= 0 else None))
    print("PID", replica.pid, flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


def gone(pid: int) -> bool:
    """Whether `pid` has ended (a zombie nobody reaped yet counts)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


def proc_text(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode()


def test_the_replica_dies_with_its_launcher_and_no_secret_is_in_a_command_line() -> None:
    uid = JOB_UID if os.geteuid() == 0 else -1
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(uid)],
        env={**os.environ, "SECRET": SECRET},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert launcher.stdout is not None
        pid = next(int(line.split()[1]) for line in launcher.stdout if line.startswith("PID "))
        deadline = time.monotonic() + 10
        while proc_text(pid, "cmdline") != "sleep 60 " and time.monotonic() < deadline:
            time.sleep(0.01)  # still the helper: its command line names no secret either
            assert SECRET not in proc_text(pid, "cmdline")
        assert proc_text(pid, "cmdline") == "sleep 60 "
        assert f"TOKEN={SECRET}" in proc_text(pid, "environ").split()
        if uid >= 0:
            assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in proc_text(pid, "status")
        launcher.kill()  # the launcher dies (kill -9): its replica must go with it
        launcher.wait()
        deadline = time.monotonic() + 10
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(pid), "the replica outlived its launcher"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


def helper_run(
    command: list[str], env: Mapping[str, str], **argv: object
) -> subprocess.CompletedProcess[str]:
    with exec_as.env_file(env) as env_fd:
        return subprocess.run(
            exec_as.argv(command, env_fd=env_fd, **argv),  # type: ignore[arg-type]
            env=exec_as.helper_env(env),
            pass_fds=(env_fd,),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


def test_a_helper_whose_launcher_died_before_the_signal_was_armed_dies_at_once(
    tmp_path: Path,
) -> None:
    ran = tmp_path / "ran"
    # Its parent is this process, not the "launcher" named: as if the launcher had died and
    # the helper been reparented before it armed the death signal.
    done = helper_run(["touch", str(ran)], job_env(), parent=1)
    assert done.returncode == -signal.SIGKILL
    assert not ran.exists()
    done = helper_run(["touch", str(ran)], job_env())
    assert done.returncode == 0, done.stderr
    assert ran.exists()


def test_the_environment_goes_by_descriptor_and_a_nul_byte_is_refused() -> None:
    spec = LaunchSpec(["true"], job_env(), "/", None, run_as=RunAs(JOB_UID, JOB_UID))
    with exec_as.env_file(spec.env) as env_fd:
        argv = with_launcher_fence(spec, env_fd)
        assert os.get_inheritable(env_fd) is False  # only the child given it gets it
    assert SECRET not in " ".join(argv)
    assert exec_as.helper_env({**spec.env, "POLLUX_JOB_ID": "j-1", "LOCPATH": "/x"}) == {
        **exec_as.BASE_ENV,
        "POLLUX_JOB_ID": "j-1",
    }
    for bad in ({"A": "a\0b"}, {"A=B": "c"}, {"": "c"}):
        with pytest.raises(ValueError, match=r"null byte|illegal"), exec_as.env_file(bad):
            pass
