"""End to end: `pollux-cli submit --follow` shows a job's whole life across its rescales.

etcd, a scheduler, an agent and two launchers (2 CPU "GPU slots" each) run as processes on a
secure cluster (TLS, tokens). The job is tests/e2e/jobs/counter_job.py, which reports a model
that scales, so the scheduler grows it from 1 GPU: its rank-0 log then comes from two or more
generations (possibly on different nodes), which `--follow` must stitch into one story.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pollux.service.local_cluster import LocalCluster
from tests.job_python import job_python

JOB = Path(__file__).parent / "jobs" / "counter_job.py"
ROOT = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 150


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    # Faithful Pollux starts a job on one GPU and doubles it: generations to follow (the
    # default, pollux-jct, would start it on all 4 slots at once).
    with LocalCluster(
        tmp_path,
        nodes=2,
        gpus_per_node=2,
        schedulers=1,
        agents=1,
        interval_s=1.0,
        lease_ttl_s=2,
        policy="pollux",
    ) as c:
        yield c


def cli(cluster: LocalCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pollux.client.cli",
            "--server",
            cluster.scheduler_addresses[0],
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={
            **os.environ,
            "POLLUX_CONFIG": str(cluster.workdir / "no-config.toml"),
            "POLLUX_CA": str(cluster.ca_file),
            "POLLUX_TOKEN": cluster.admin_token or "",
        },
    )


@pytest.mark.timeout(240)
def test_submit_follow_streams_every_generation_and_exits_with_the_result(
    cluster: LocalCluster,
) -> None:
    followed = cli(
        cluster,
        "submit",
        "--follow",
        "--name",
        "counter",
        "--initial-batch-size",
        "32",
        "--max-batch-size",
        "256",
        "--max-replicas",
        "4",
        "--env",
        f"PYTHONPATH={ROOT}",
        "--env",
        f"COUNTER_TOTAL={TOTAL_STEPS}",
        "--",
        job_python(),
        str(JOB),
        timeout=200,
    )
    out = followed.stdout
    assert followed.returncode == 0, (out, followed.stderr)
    job_id = out.splitlines()[0].split("\t")[0]
    assert re.fullmatch(r"j-[0-9a-f]{10}", job_id), out

    generations = [int(g) for g in re.findall(r"^==> generation (\d+) \(rank 0 of", out, re.M)]
    assert len(generations) >= 2, out  # it was rescaled at least once
    assert generations == sorted(set(generations)), out  # each generation once, in order
    # Every generation's own lines follow its marker: the story is not interleaved.
    for generation in generations:
        marker = out.index(f"==> generation {generation} ")
        first_line = out.find(f"gen {generation}: step")
        assert first_line == -1 or first_line > marker, (generation, out)
    assert re.search(r"^==> \S+ RESCALING: ", out, re.M), out
    assert f"rank 0: done at step {TOTAL_STEPS}" in out
    assert out.rstrip().endswith(f"==> job {job_id} SUCCEEDED <=="), out
    # Each step's line is shown once although rank 0 restarted: nothing is streamed twice.
    steps = re.findall(r"^rank 0/\d+ gen \d+: step (\d+)$", out, re.M)
    assert len(steps) == len(set(steps)), out

    # The job is named by its unique name, and by a prefix of its id.
    described = cli(cluster, "describe", "counter")
    assert described.returncode == 0, described.stderr
    assert job_id in described.stdout
    # `logs -f` of a finished job prints its last generation and ends at once.
    logs = cli(cluster, "logs", "-f", job_id[:6])
    assert logs.returncode == 0, logs.stderr
    assert f"==> generation {generations[-1]} " in logs.stdout
    assert f"rank 0: done at step {TOTAL_STEPS}" in logs.stdout
