"""End to end: the dashboard in a real browser over a real cluster with a job that rescales.

A secure local cluster (etcd, a scheduler serving the dashboard over HTTPS, an agent, two
launchers with two CPU "GPU slots" each) runs the counter job, which declares its progress and
reports step times that make the scheduler grow it from one replica to more: each growth is a
new allocation generation, a restart. Once the job's timeline holds two generations, headless
Chromium (Debian's `chromium`) loads the pages with the admin token in the address fragment
(as `pollux-up` prints it): the job page must show the job, mark the restart in its list and
on its charts (uPlot canvases), the cluster page the nodes and the job, the jobs page the job;
without a token the page asks for one. Screenshots are kept as artifacts (under
$POLLUX_TEST_ARTIFACTS, else the test's tmp dir) and their paths printed.

The browser ignores certificate errors: it does not know the cluster's CA (the API calls in
this test verify the certificate against it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pollux.client import JobSpec
from pollux.service.local_cluster import LocalCluster
from tests.job_python import job_python
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).parent / "jobs" / "counter_job.py"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium; scripts/test installs it)",
)
BROWSER_TIMEOUT_S = 60
WINDOW = (1400, 1000)


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where screenshots are kept: $POLLUX_TEST_ARTIFACTS (CI keeps it) or the tmp dir."""
    root = Path(os.environ.get("POLLUX_TEST_ARTIFACTS") or tmp_path / "artifacts")
    folder = root / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    # A timeline point every second and a utilisation sample every second (the services read
    # these from the environment they inherit), so a short run has something to plot.
    monkeypatch.setenv("POLLUX_AGENT_TIMELINE_INTERVAL_S", "1")
    monkeypatch.setenv("POLLUX_SCHEDULER_DASHBOARD_SAMPLE_S", "1")
    with LocalCluster(
        tmp_path / "cluster",
        nodes=2,
        gpus_per_node=2,
        schedulers=1,
        agents=1,
        interval_s=1.0,
        lease_ttl_s=2,
        restart_delay_s=1.0,
        # Faithful Pollux starts a job on one GPU and doubles it: a rescale for the timeline
        # (the default, pollux-jct, would start it on all 4 slots at once).
        policy="pollux",
    ) as c:
        yield c


def api(cluster: LocalCluster, path: str) -> Any:
    """GET /api/v1/<path> as the admin, verifying the dashboard's certificate."""
    assert cluster.ca_file is not None
    assert cluster.dashboard_port is not None
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    request = urllib.request.Request(
        f"https://127.0.0.1:{cluster.dashboard_port}/api/v1/{path}",
        headers={"Authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        return json.load(answer)


def chromium(profile: Path, url: str, *args: str, window: tuple[int, int] = WINDOW) -> str:
    """Run headless Chromium on `url` with `args`; returns its stdout (the DOM for --dump-dom).

    Virtual time lets the page's scripts and requests finish before the DOM is dumped or the
    screenshot taken. The browser and all its helper processes are killed if it hangs.
    """
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--ignore-certificate-errors",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={window[0]},{window[1]}",
        "--virtual-time-budget=8000",
        *args,
        url,
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    try:
        out, _ = process.communicate(timeout=BROWSER_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # helpers that outlived the browser
        process.wait()
    assert process.returncode == 0, f"chromium exited with {process.returncode}"
    return out


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.timeout(150)
def test_the_dashboard_shows_the_cluster_and_a_rescaled_jobs_timeline(
    cluster: LocalCluster, tmp_path: Path, artifacts: Path
) -> None:
    env = {
        "COUNTER_TOTAL": "100000",
        "COUNTER_STEP_S": "0.2",
        "COUNTER_WORK": "1",
        "PYTHONPATH": str(ROOT),
    }
    spec = JobSpec(
        "counter-dash",
        (job_python(), str(JOB)),
        32,
        max_batch_size=256,
        max_replicas=4,
        env=env,
        stop_grace_s=10,
    )
    with cluster.client() as client:
        job = client.submit(spec)

    def rescaled() -> Any:
        # Everything the pages are checked for below: two generations with points in the
        # newest, a prediction from the model, declared progress.
        timeline = api(cluster, f"jobs/{job.id}/timeline")
        points = timeline["timeline"]["points"]
        newest = [p for p in points if p["generation"] == timeline["generations"][-1]]
        spans = len(timeline["generations"]) >= 2 and len(newest) >= 2
        predicted = any(p is not None for p in timeline["predicted_progress"])
        return timeline if spans and predicted and newest[-1].get("progress", 0) > 0 else None

    timeline = wait_until(
        rescaled, 60, "the job's timeline to span a rescale, with predicted and declared progress"
    )
    restart = timeline["restarts"][0]
    assert restart["gpus_after"] > restart["gpus_before"], restart

    # The job page, signed in by the link pollux-up prints.
    link = cluster.dashboard_link(f"/jobs/{job.id}")
    assert link is not None
    assert "#token=" in link
    dom = chromium(tmp_path / "profile-job", link, "--dump-dom")
    assert job.id in dom
    assert "counter-dash" in dom
    assert 'data-generation="' in dom, "the restart is listed"
    assert f"generation {restart['from_generation']} → {restart['generation']}" in dom
    marked = dom.count("data-restarts=")
    assert marked >= 4, f"every timeline chart marks the restart ({marked} do)\n{dom[:3000]}"
    assert dom.count("<canvas") >= 4, "uPlot drew the charts"
    assert "Sign in with an API token" in dom  # the (hidden) form is part of the page
    assert 'id="login" class="card login" hidden' in dom, "the token from the link was taken"
    assert "History" in dom
    assert "Explain" in dom
    # The value the job logged has a chart of its own; its log's last lines are on the page.
    assert ">loss</h3>" in dom, "the logged loss is plotted"
    assert 'id="log"' in dom
    assert re.search(r"rank 0/\d+ gen \d+: step \d+", dom), "the job's log is shown"
    logs = api(cluster, f"jobs/{job.id}/logs?tail=5")
    assert 1 <= len(logs["lines"]) <= 5
    assert logs["generation"] >= restart["generation"]

    # The cluster and the job list (the token is in this profile's tab now: a new profile
    # needs the link again).
    dom = chromium(tmp_path / "profile-cluster", cluster.dashboard_link() or "", "--dump-dom")
    for expected in ("node-0", "node-1", job.id, "GPUs allocated", "GPUs per job"):
        assert expected in dom, expected
    assert dom.count("<canvas") >= 2
    jobs = chromium(tmp_path / "profile-jobs", cluster.dashboard_link("/jobs") or "", "--dump-dom")
    assert job.id in jobs
    assert "counter-dash" in jobs

    # Without a token the API answers 401 and the page asks for one.
    base = f"https://127.0.0.1:{cluster.dashboard_port}/"
    anonymous = chromium(tmp_path / "profile-anonymous", base + "#/jobs", "--dump-dom")
    assert 'id="login" class="card login" hidden' not in anonymous
    assert job.id not in anonymous

    shots = {  # the job page's first screen, all of it, and the cluster page
        "job": (link, WINDOW),
        "job-full": (link, (WINDOW[0], 2600)),
        "cluster": (cluster.dashboard_link() or "", WINDOW),
    }
    for name, (url, window) in shots.items():
        path = artifacts / f"{name}.png"
        path.unlink(missing_ok=True)
        chromium(tmp_path / f"profile-{name}", url, f"--screenshot={path}", window=window)
        assert png_size(path) == window, name
        assert path.stat().st_size > 20_000, f"{path} looks empty"
        print(f"dashboard screenshot ({name}): {path}")
