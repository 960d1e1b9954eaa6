"""Whether a local cluster's job uids can run its jobs: the interpreter, its packages, the dirs.

A root `pollux-up` runs each job's replicas under a uid of the job's own with no groups, so
they reach only what "others" may: `python` on the replicas' PATH, what it imports and the
jobs' working dirs. A checkout or a Python under a 0700 home fails that, and every job dies on
its first import. `plan` finds out before anything starts by running `python` as a launcher
would run a replica (`probe`). Where this interpreter is out of the job uids' reach but its
packages are not, it makes a job environment they can use (`make_job_env`): a virtual
environment over an interpreter of the same minor version that they can run, importing this
environment's packages. Otherwise it says why, so the caller can refuse or fall back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def as_job_uid(argv: Sequence[str], uid: int) -> list[str]:
    """`argv` run as `uid` with no groups, the way a launcher starts a replica (setpriv)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv)
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]


def probe(python: str, path: str, *, uid: int = PROBE_UID) -> str:
    """Run `python` (a name looked up on `path`, or a path) as `uid`, as a replica would.

    Returns what went wrong, "" when it is this Python's version and finds its packages.
    """
    identity: dict[str, Any] = {}
    if shutil.which("setpriv") is None:
        identity = {"user": uid, "group": uid, "extra_groups": []}
    version = _version()
    try:
        result = subprocess.run(
            as_job_uid([python, "-c", _PROBE, version, *_modules()], uid),
            # What replicas inherit that decides where Python finds its packages.
            env={
                "PATH": path,
                "HOME": "/",
                "LC_ALL": "C.UTF-8",
                **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
            },
            cwd="/",
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            **identity,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"a job uid cannot start {python}: {error}"
    if result.returncode == 0:
        return ""
    said = (result.stdout + result.stderr).strip().splitlines()
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
    for base in base_candidates(path):
        if probe(base, path, uid=uid).startswith("a job uid cannot start"):
            continue  # out of the job uids' reach: no environment over it would do
        try:
            bin_dir = make_job_env(workdir / JOB_ENV, base)
        except (OSError, subprocess.SubprocessError):
            continue
        if not probe("python", os.pathsep.join([str(bin_dir), path]), uid=uid):
            return Reach("", bin_dir)
    blocked = untraversable(Path(sys.executable).resolve().parent) or Path(sys.prefix)
    return Reach(
        f"job uids cannot use this Python environment ({as_is}), and no Python "
        f"{_version()} they can run imports its packages: install Python and the environment "
        f"where other users may read them (not under {blocked}; chmod -R o+rX)"
    )


def _version() -> str:
    """This interpreter's major.minor version ("3.11")."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"
