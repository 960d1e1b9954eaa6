"""End to end: etcd, 2 scheduler replicas, an agent and 2 launchers as real processes.

Real Python jobs run to completion through `pollux-cli` and the Python client while the
leading scheduler is killed with SIGKILL mid-way; the standby takes over and nothing is lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pollux.client import JobSpec
from pollux.service.local_cluster import LocalCluster
from tests.job_python import job_python
from tests.waiting import wait_until

JOB = Path(__file__).parent / "jobs" / "counter_job.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path,
        nodes=2,
        gpus_per_node=2,
        schedulers=2,
        agents=1,
        interval_s=1.0,
        lease_ttl_s=2,
    ) as c:
        yield c


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pollux.client.cli",
            "--server",
            ",".join(cluster.scheduler_addresses),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # What `pollux-up` writes to the config file, given through the environment here.
        env={
            **os.environ,
            "POLLUX_CONFIG": str(cluster.workdir / "no-config.toml"),
            "POLLUX_CA": str(cluster.ca_file),
            "POLLUX_TOKEN": cluster.admin_token or "",
        },
    )


@pytest.mark.timeout(240)
def test_jobs_complete_through_leader_failover(cluster: LocalCluster, tmp_path: Path) -> None:
    env = {"COUNTER_TOTAL": "60", "COUNTER_STEP_S": "0.1", "PYTHONPATH": str(ROOT)}
    spec = JobSpec(
        "counter",
        (job_python(), str(JOB)),
        32,
        max_batch_size=256,
        max_replicas=4,
        env=env,
        stop_grace_s=10,
    )
    submitted = cli(
        cluster,
        "submit",
        "--name",
        "counter-cli",
        "--initial-batch-size",
        "32",
        "--max-batch-size",
        "256",
        "--env",
        f"PYTHONPATH={ROOT}",
        "--env",
        "COUNTER_TOTAL=40",
        "-o",
        "json",
        "--",
        job_python(),
        str(JOB),
    )
    assert submitted.returncode == 0, submitted.stderr
    cli_job = json.loads(submitted.stdout)["id"]
    with cluster.client() as client:
        jobs = [client.submit(spec).id, client.submit(spec).id, cli_job]

        def running() -> bool:
            return any(client.get_job(j).state == "RUNNING" for j in jobs)

        wait_until(running, 60, "a job to run")
        status = client.cluster_status()
        leader = status.leader_id
        assert leader.startswith("scheduler-")
        killed_at = time.monotonic()
        cluster.kill(leader)

    with cluster.client() as client:  # the surviving replica

        def new_leader() -> bool:
            s = client.cluster_status()
            return bool(s.leader_id) and s.leader_id != leader

        wait_until(new_leader, 15, "a new leader")
        assert time.monotonic() - killed_at <= 10 + 1

        def all_done() -> bool:
            return all(client.get_job(j).state in ("SUCCEEDED", "FAILED") for j in jobs)

        wait_until(all_done, 180, "every job to finish")
        finals = [client.get_job(j) for j in jobs]
        assert [j.state for j in finals] == ["SUCCEEDED"] * 3, [j.history for j in finals]
        assert len(list(client.list_jobs())) == 3
        # The scheduler scaled at least one job once its agent had a model (submit → run →
        # scale → complete).
        assert any(t.state == "RESCALING" for j in finals for t in j.history)
        explanation = client.explain(jobs[0])
        assert explanation.decision is not None

    described = cli(cluster, "describe", jobs[0])
    assert described.returncode == 0, described.stderr
    assert "SUCCEEDED" in described.stdout
    for job_id in jobs:
        starts = (cluster.workdir / "checkpoints" / job_id / "starts.log").read_text().split()
        assert starts, job_id
        steps = (cluster.workdir / "checkpoints" / job_id / "step").read_text()
        assert int(steps) == (40 if job_id == cli_job else 60)
    missing = cli(cluster, "describe", "j-missing")
    assert missing.returncode == 1
    assert "not found" in missing.stderr
    assert os.path.exists(cluster.workdir / "logs" / "scheduler-0.log")
