"""The demo's own path as a newcomer meets it: `pollux-up --demo` with its defaults, to SUCCEEDED.

As root, with the interpreter and the checkout under a 0700 home (the commonest first try on a
fresh machine: a checkout in /root); and as an ordinary user (a uid of the test's own, no
account). The suite's environment is reused through a link and a job environment
(job_reach.make_job_env), so that nothing is installed. The sample job is the demo's, trained
briefly; `pollux-up` runs as a real process with every service it starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from pollux.service.local import job_reach

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_classifier.py"
USER_UID = 0x7000FFFE
"""The ordinary user's uid: no account has it (the job uid range's second to last)."""
STOP_S = 90.0
"""How long pollux-up gets to stop its cluster after SIGTERM when the test gives up on it."""
JOB = """\
name: newcomer
command: [python, elastic_classifier.py, --epochs, "2", --samples, "1024"]
working_dir: .
initial_batch_size: 64
max_batch_size: 512
max_local_batch_size: 128
max_replicas: 4
stop_grace_s: 10
"""

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv"),
]


def demo_dir(parent: Path) -> Path:
    """The sample job and its file, as a checkout has them, in `parent`/examples."""
    examples = parent / "examples"
    examples.mkdir(parents=True)
    shutil.copy(EXAMPLE, examples)
    (examples / "job.yaml").write_text(JOB)
    return examples


def pollux_up(python: Path, examples: Path, workdir: Path, *, prefix: Sequence[str] = ()) -> str:
    """Run `pollux-up --demo` on the job with its defaults; what it printed (must exit 0)."""
    process = subprocess.Popen(
        [
            *(*prefix, str(python), "-m", "pollux.service.local_cluster"),
            *("--demo", "job.yaml", "--workdir", str(workdir)),
        ],
        cwd=examples,
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(examples.parent),
            "POLLUX_CONFIG": str(workdir.parent / "cli-config.toml"),
            "LC_ALL": "C.UTF-8",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGTERM)  # pollux-up stops its cluster in order
        try:
            out, _ = process.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
        pytest.fail(f"pollux-up --demo did not finish:\n{out}")
    assert process.returncode == 0, out
    return out


def test_root_with_python_and_checkout_in_a_closed_home_runs_the_demo(tmp_path: Path) -> None:
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    (home / "venv").symlink_to(Path(sys.prefix).resolve())
    examples = demo_dir(home / "pollux")
    out = pollux_up(home / "venv" / "bin" / "python", examples, tmp_path / "work")
    assert "SUCCEEDED" in out, out
    # No job uid can enter the checkout: the replicas ran as root, and pollux-up said why.
    assert "WARNING: replicas run as root (uid 0), not under a uid of their job's own (" in out
    assert f"job uids cannot enter {examples}: {home} (0o700) is closed" in out
    assert "--isolated-replicas refuses to start instead" in out
    # No secret on its output, which people redirect to world-readable files.
    token = (tmp_path / "work" / "pki" / "admin-token").read_text().strip()
    assert token.startswith("pollux_")
    assert token not in out
    assert "pollux-cli dashboard --link" in out


def test_an_ordinary_user_runs_the_demo_with_no_flags(tmp_path: Path) -> None:
    own = tmp_path / "user"
    own.mkdir()
    bases = [b for b in job_reach.base_candidates(os.environ["PATH"]) if b.startswith("/usr/")]
    if not bases:
        pytest.skip("no system Python of this version for another user to run")
    python = job_reach.make_job_env(own / "env", bases[0]) / "python"
    examples = demo_dir(own / "home")
    for path in [own, *own.rglob("*")]:
        os.lchown(path, USER_UID, USER_UID)
    user = ["setpriv", f"--reuid={USER_UID}", f"--regid={USER_UID}", "--clear-groups", "--"]
    can = subprocess.run(
        [*user, str(python), "-c", "import pollux.service.local_cluster, torch"],
        capture_output=True,
        text=True,
        check=False,
    )
    if can.returncode != 0:
        pytest.skip(f"another user cannot run this environment here: {can.stderr[-300:]}")
    out = pollux_up(python, examples, own / "work", prefix=user)
    assert "SUCCEEDED" in out, out
    assert f"WARNING: replicas run as uid {USER_UID}, not under a uid of their job's own (" in out
    assert "not root, so it cannot switch user" in out
