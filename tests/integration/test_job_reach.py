"""Whether job uids can run a local cluster's jobs, found by running Python as one (real uids).

The interpreter is reached through a link in a 0700 home, as a checkout's venv in /root is:
`plan` must then give the job uids an environment they can run that imports this one's
packages, and say why when nothing can.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pollux.service.local import job_reach

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

PLAN = (
    "import os, sys; from pathlib import Path; from pollux.service.local import job_reach; "
    "reach = job_reach.plan(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]], "
    "os.environ['PATH']); print(reach.bin_dir or ''); print(reach.problem)"
)


def plan_from(python: Path, workdir: Path, *dirs: Path) -> tuple[str, str]:
    """`job_reach.plan` as a pollux-up started with `python` finds it: (bin dir, problem)."""
    bin_dir = str(python.parent)
    env = {"PATH": os.pathsep.join([bin_dir, os.environ["PATH"]]), "LC_ALL": "C.UTF-8"}
    out = subprocess.run(
        [str(python), "-c", PLAN, str(workdir), *map(str, dirs)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    return out[0], out[1] if len(out) > 1 else ""


def closed_home_venv(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "venv").symlink_to(Path(sys.prefix).resolve())
    return home / "venv" / "bin" / "python"


def test_a_python_in_a_closed_home_gets_a_job_environment_a_job_uid_can_run(
    tmp_path: Path,
) -> None:
    python = closed_home_venv(tmp_path)
    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o711)
    bin_dir, problem = plan_from(python, workdir)
    if problem.startswith("job uids cannot use this Python environment"):
        pytest.skip(f"no Python of this version that other users may run here: {problem}")
    assert problem == ""
    if not bin_dir:  # the machine lets other users use the link: nothing to make
        return
    assert Path(bin_dir) == workdir / job_reach.JOB_ENV / "bin"
    path = os.pathsep.join([bin_dir, str(python.parent), os.environ["PATH"]])
    ran = job_reach.as_job_uid(
        ["python", "-c", "import os, structlog, pollux.train; print(os.getuid())"],
        job_reach.PROBE_UID,
        env={"PATH": path},
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(job_reach.PROBE_UID)]


def test_a_job_dir_in_a_closed_home_is_named_with_the_fix(tmp_path: Path) -> None:
    python = closed_home_venv(tmp_path)
    project = tmp_path / "home" / "project"
    project.mkdir()
    _, problem = plan_from(python, tmp_path, project)
    home = tmp_path / "home"
    assert problem == (
        f"job uids cannot enter {project}: {home} (0o700) is closed to other users; chmod o+x "
        f"{home}, or keep the job's files under a directory others may enter (/srv, /var/tmp)"
    )


def test_the_probe_says_what_the_job_uid_met() -> None:
    assert job_reach.probe("/bin/false", os.environ["PATH"]) == "/bin/false exited 1"
    assert job_reach.probe("/nonexistent/python", "/usr/bin") == (
        "a job uid cannot start /nonexistent/python: No such file or directory"
    )
    assert job_reach.probe("python", "/nonexistent") == (
        "a job uid cannot start python: not found on the job's PATH (/nonexistent)"
    )


def test_an_interpreter_only_root_may_run_is_out_of_reach_and_job_python_is_not(
    tmp_path: Path,
) -> None:
    # The probe runs as a replica does (the launcher's exec helper): root's permissions do
    # not carry over to the exec, so a Python in a closed home is out of the job uid's reach.
    python = closed_home_venv(tmp_path)
    assert job_reach.probe(str(python), os.environ["PATH"]).startswith(
        f"a job uid cannot start {python}: Permission denied to uid {job_reach.PROBE_UID}"
    )
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    found = job_reach.job_python(cache)
    if found == sys.executable:  # this environment is open to other users: nothing to make
        assert not job_reach.probe(sys.executable, os.environ["PATH"])
        return
    assert found == str(cache / job_reach.JOB_ENV / "bin" / "python")
    ran = job_reach.as_job_uid(
        [found, "-c", "import os, structlog, pollux.train; print(os.getuid())"],
        job_reach.PROBE_UID,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(job_reach.PROBE_UID)]
