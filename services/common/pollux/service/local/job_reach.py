"""Whether a local cluster's job uids can run its jobs: the interpreter, its packages, the dirs.

A root `pollux-up` runs each job's replicas under a uid of the job's own with no groups, so
they reach only what "others" may: `python` on the replicas' PATH, what it imports and the
jobs' working dirs. A checkout or a Python under a 0700 home fails that, and every job dies on
its first import (or its exec). `plan` finds out before anything starts by running `python`
as a launcher runs a replica, through the launcher's own exec helper (`as_job_uid`, `probe`).
Where this interpreter is out of the job uids' reach but its packages are not, it makes a job
environment they can use (`make_job_env`): a virtual environment over an interpreter of the
same minor version that they can run, importing this environment's packages. Otherwise it
says why, so the caller can refuse or fall back. `job_python` answers the same question for
one command: the interpreter tests and benchmarks name in their jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pollux.service.local.workdir import untraversable

PROBE_UID = 0x7000FFFF
"""The uid the probe runs as: the last of the launchers' default job uid range (no account or
job owns files with it when a local cluster starts; it holds no groups)."""
PROBE_TIMEOUT_S = 60.0
"""Longest one probe may take (it looks modules up without importing them: well under 1 s)."""
JOB_ENV = "job-python"
"""The work dir's job environment (`make_job_env`)."""
MODULES = ("grpc", "structlog", "numpy", "pollux.train", "torch")
"""What a job of the training library imports, looked up where this environment has it."""
_PROBE = """
import importlib.util, sys
want, *modules = sys.argv[1:]
have = "%d.%d" % sys.version_info[:2]
if have != want:
    print(f"`python` there is Python {have} ({sys.executable or '?'}), not {want}")
    sys.exit(3)
for name in modules:
    try:
        found = importlib.util.find_spec(name) is not None
    except Exception as error:
        found, why = False, f"{type(error).__name__}: {error}"
    else:
        why = "not found"
    if not found:
        print(f"`python` there ({sys.executable or '?'}) cannot import {name} ({why})")
        sys.exit(3)
"""


@dataclass(frozen=True, slots=True)
class Reach:
    """What a local cluster must do for its job uids.

    Attributes:
        problem: Why job uids cannot run the cluster's jobs, with the fix; "" when they can.
        bin_dir: A directory to put first on the replicas' PATH (a job environment's), or None.
    """

    problem: str
    bin_dir: Path | None = None


def dir_problem(directory: Path) -> str:
    """Why a job uid (an "other", in no group) cannot enter `directory`; "" when it can."""
    blocked = untraversable(directory.resolve())
    if blocked is None:
        return ""
    mode = oct(blocked.stat().st_mode & 0o777) if blocked.exists() else "missing"
    return (
        f"job uids cannot enter {directory}: {blocked} ({mode}) is closed to other users; "
        f"chmod o+x {blocked}, or keep the job's files under a directory others may enter "
        "(/srv, /var/tmp)"
    )


def _modules() -> list[str]:
    """`MODULES` this environment has (a cluster without the train extra needs no torch)."""
    import importlib.util  # noqa: PLC0415

    return [name for name in MODULES if importlib.util.find_spec(name) is not None]


def as_job_uid(
    argv: Sequence[str],
    uid: int,
    *,
    env: Mapping[str, str],
    cwd: str = "/",
    timeout: float = PROBE_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `uid` (gid the same, no groups) exactly as a launcher starts a replica.

    Through the launcher's exec helper (launcher/exec_as.py): `env` is the command's only,
    never in force as root, and the program is exec'd with `uid`'s permissions alone. Output
    is captured as text.
    """
    # Imported here: the distribution pollux-common does not depend on the launcher's.
    from pollux.launcher import exec_as  # noqa: PLC0415

    with exec_as.env_file(env) as env_fd:
        return subprocess.run(
            exec_as.argv(argv, env_fd=env_fd, user=(uid, uid), cwd=cwd),
            env=exec_as.helper_env(env),
            pass_fds=(env_fd,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def probe(python: str, path: str, *, uid: int = PROBE_UID) -> str:
    """Run `python` (a name looked up on `path`, or a path) as `uid`, as a replica would.

    Returns what went wrong, "" when it is this Python's version and finds its packages.
    """
    from pollux.launcher import exec_as  # noqa: PLC0415

    version = _version()
    try:
        result = as_job_uid(
            [python, "-c", _PROBE, version, *_modules()],
            uid,
            env={"PATH": path, "HOME": "/", "LC_ALL": "C.UTF-8"},
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"a job uid cannot start {python}: {error}"
    if result.returncode == 0:
        return ""
    said = (result.stdout + result.stderr).strip().splitlines()
    refused = f"{exec_as.PREFIX} {python!r}: "
    never_ran = result.returncode in (exec_as.NOT_FOUND, exec_as.CANNOT_RUN)
    if never_ran and said and said[-1].startswith(refused):  # the exec helper's own word
        return f"a job uid cannot start {python}: {said[-1].removeprefix(refused)}"
    return said[-1] if said else f"{python} exited {result.returncode}"


def base_candidates(path: str) -> list[str]:
    """Interpreters of this minor version a job environment could be made over, best first."""
    name = f"python{_version()}"
    found = [
        str(Path(sys.executable).resolve()),
        *(str(Path(d) / name) for d in path.split(os.pathsep) if d),
        f"/usr/bin/{name}",
        f"/usr/local/bin/{name}",
    ]
    return [c for c in dict.fromkeys(found) if os.access(c, os.X_OK) and not os.path.isdir(c)]


def make_job_env(directory: Path, base: str) -> Path:
    """A virtual environment at `directory` over `base` that imports this one's packages.

    Returns its bin directory. The packages stay where they are: a ``.pth`` file adds this
    environment's site directories (and their own ``.pth`` files: editable installs).
    """
    if directory.exists():
        shutil.rmtree(directory)
    subprocess.run(
        [base, "-m", "venv", "--without-pip", str(directory)],
        check=True,
        capture_output=True,
        timeout=PROBE_TIMEOUT_S,
    )
    command = [str(directory / "bin" / "python"), "-c"]
    purelib = subprocess.run(
        [*command, "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    ).stdout.strip()
    # Resolved: this environment may be reached through a link the job uids cannot follow.
    paths = sysconfig.get_paths()
    ours = dict.fromkeys(os.path.realpath(paths[key]) for key in ("purelib", "platlib"))
    lines = "".join(f"import site; site.addsitedir({site!r})\n" for site in ours)
    (Path(purelib) / "pollux-cluster-packages.pth").write_text(lines)
    for path in [directory, *directory.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o005 if path.is_dir() else 0o004))
    return directory / "bin"


def plan(workdir: Path, job_dirs: Sequence[Path], path: str, *, uid: int = PROBE_UID) -> Reach:
    """What lets job uids run this cluster's jobs, or why nothing does.

    `path` is the PATH replicas inherit; `job_dirs` the directories jobs will run in.
    """
    if os.geteuid() != 0:
        return Reach(f"pollux-up runs as uid {os.geteuid()}, not root, so it cannot switch user")
    for directory in (workdir, *job_dirs):
        problem = dir_problem(directory)
        if problem:
            return Reach(problem)
    as_is = probe("python", path, uid=uid)
    if not as_is:
        return Reach("")
    bin_dir = _made_job_env(workdir, path, uid)
    if bin_dir is not None:
        return Reach("", bin_dir)
    blocked = untraversable(Path(sys.executable).resolve().parent) or Path(sys.prefix)
    return Reach(
        f"job uids cannot use this Python environment ({as_is}), and no Python "
        f"{_version()} they can run imports its packages: install Python and the environment "
        f"where other users may read them (not under {blocked}; chmod -R o+rX)"
    )


def _made_job_env(directory: Path, path: str, uid: int) -> Path | None:
    """The bin dir of a job environment made at `directory`/`JOB_ENV` that `uid` can run.

    None when no interpreter of this version that `uid` can start (`base_candidates`) makes
    one that finds this environment's packages.
    """
    for base in base_candidates(path):
        if probe(base, path, uid=uid).startswith("a job uid cannot start"):
            continue  # out of the job uids' reach: no environment over it would do
        try:
            bin_dir = make_job_env(directory / JOB_ENV, base)
        except (OSError, subprocess.SubprocessError):
            continue
        if not probe("python", os.pathsep.join([str(bin_dir), path]), uid=uid):
            return bin_dir
    return None


_job_pythons: dict[tuple[Path, int], str] = {}


def job_python(directory: Path, *, uid: int = PROBE_UID) -> str:
    """An interpreter of this environment that a job uid can run: for jobs' commands.

    What tests and benchmarks put in a job's command where they would say `sys.executable`:
    that interpreter when a job uid can run it and import its packages (`probe`), else the
    job environment in `directory` (`JOB_ENV`; a local cluster's work dir holds one when its
    jobs need it) if it works, else one made there now (`make_job_env`; `directory` must be
    open to job uids). Not root: this interpreter (nothing switches user). Remembered for the
    process.

    Raises:
        RuntimeError: No interpreter a job uid can start imports this environment's packages.
    """
    key = (directory.resolve(), uid)
    if key not in _job_pythons:
        _job_pythons[key] = _job_python(directory, uid)
    return _job_pythons[key]


def _job_python(directory: Path, uid: int) -> str:
    path = os.environ.get("PATH", os.defpath)
    if os.geteuid() != 0:
        return sys.executable
    as_is = probe(sys.executable, path, uid=uid)
    if not as_is:
        return sys.executable
    made = directory / JOB_ENV / "bin" / "python"
    if made.exists() and not probe(str(made), path, uid=uid):
        return str(made)
    problem = dir_problem(directory)
    if problem:
        raise RuntimeError(f"{as_is}; and {problem}")
    bin_dir = _made_job_env(directory, path, uid)
    if bin_dir is None:
        raise RuntimeError(f"{as_is}; and no Python {_version()} a job uid can run imports it")
    return str(bin_dir / "python")


def _version() -> str:
    """This interpreter's major.minor version ("3.11")."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"
