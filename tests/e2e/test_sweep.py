"""End to end: `pollux-cli sweep` runs an Optuna search whose trials are jobs of a real cluster.

Six trials of a tiny job (tests/e2e/jobs/hpo_trial.py), two at a time, on a LocalCluster with
CPU slots: each trial is a job labelled with its sweep, reports its loss through its log, and
the sweep prints the best trial; pruned trials' jobs end cancelled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pollux.service.local_cluster import LocalCluster
from tests.job_python import job_python

TRIAL = Path(__file__).parent / "jobs" / "hpo_trial.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path, nodes=1, gpus_per_node=2, schedulers=1, agents=1, interval_s=1.0
    ) as c:
        yield c


@pytest.mark.timeout(180)
def test_sweep_runs_trials_as_jobs_and_reports_the_best(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    sweep = {
        "name": "bowl",
        "objective": {"metric": "loss", "direction": "minimize"},
        "trials": 6,
        "concurrency": 2,
        "sampler": {"name": "tpe", "seed": 7},
        "pruner": {"name": "median", "warmup_steps": 1, "startup_trials": 2},
        "poll_interval_s": 0.5,
        "parameters": {"x": {"type": "float", "low": -1.0, "high": 1.0}},
        "job": {
            "command": [job_python(), str(TRIAL), "${x}"],
            "initial_batch_size": 8,
            "max_replicas": 1,
            "env": {"PYTHONPATH": str(ROOT)},
            "labels": {"team": "e2e"},
        },
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    env = {
        **os.environ,
        "POLLUX_CONFIG": str(cluster.workdir / "no-config.toml"),
        "POLLUX_CA": str(cluster.ca_file),
        "POLLUX_TOKEN": cluster.admin_token or "",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pollux.client.cli",
            "--server",
            ",".join(cluster.scheduler_addresses),
            "-o",
            "json",
            "sweep",
            "-f",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    trials = result["trials"]
    assert len(trials) == 6
    assert {t["state"] for t in trials} <= {"COMPLETE", "PRUNED"}
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    assert complete
    best = result["best"]
    assert best["value"] == min(t["value"] for t in complete)
    # The objective is the job's last report: (x - 0.3)^2 + 1/5.
    assert best["value"] == pytest.approx((best["params"]["x"] - 0.3) ** 2 + 0.2)
    with cluster.client() as client:
        jobs = {j.id: j for j in client.list_jobs()}
        for trial in trials:
            job = jobs[trial["job"]]
            assert job.spec.labels["pollux.sweep"] == "bowl"
            assert job.spec.labels["pollux.trial"] == str(trial["number"])
            assert job.spec.labels["team"] == "e2e"
            assert job.spec.name == f"bowl-{trial['number']}"
            # A pruned trial's job is cancelled, unless it finished in the same instant.
            want = {"SUCCEEDED"} if trial["state"] == "COMPLETE" else {"CANCELLED", "SUCCEEDED"}
            assert job.state in want, (trial, job.state)
