"""Whether job uids can run a local cluster's jobs, found by running Python as one (real uids).

The interpreter is reached through a link in a 0700 home, as a checkout's venv in /root is:
`plan` must then give the job uids an environment they can run that imports this one's
packages, and say why when nothing can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pollux.service.local import job_reach

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv"),
]

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
    ran = subprocess.run(
        job_reach.as_job_uid(
            ["python", "-c", "import os, structlog, pollux.train; print(os.getuid())"],
            job_reach.PROBE_UID,
        ),
        env={"PATH": path},
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
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
    assert "No such file or directory" in job_reach.probe("/nonexistent/python", "/usr/bin")
