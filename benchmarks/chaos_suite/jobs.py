"""The fault suite's jobs: submitted through failovers, kept at a number active, followed.

Every call retries through a scheduler failover (UNAVAILABLE) for about 30 s; a submit carries
a request id, so a retried one creates one job. A job the API no longer lists is lost, and one
that ends FAILED is counted, unless a full checkpoint disk failed it saying so.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pollux.client import Client, Job, JobSpec
from pollux.client.errors import InvalidArgumentError, NotFoundError, PolluxError
from pollux.service.local import job_reach
from pollux.service.local_cluster import LocalCluster

from .tally import Tally

T = TypeVar("T")
JOB = Path(__file__).resolve().parents[1] / "chaos_job.py"
"""The job every replica runs (it ticks, checkpoints and checks its checkpoints' digests)."""
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
REGISTRATION_TTL_S = 4
"""Lease ttl of the suite's agents and launchers."""
STOP_GRACE_S = 5
"""Stop grace of the suite's jobs."""


class Jobs:
    """The jobs the suite submitted, by id, with the state last seen.

    Args:
        cluster: The cluster.
        rng: Draws each job's length and width.
        tally: Counts lost and failed jobs, and bad specs accepted.
        active: How many jobs `top_up` keeps active.
        steps: The most steps of a job (0.2 s each).
    """

    def __init__(
        self, cluster: LocalCluster, rng: random.Random, tally: Tally, *, active: int, steps: int
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.tally = tally
        self.active = active
        self.steps = steps
        self.accepted: dict[str, str] = {}
        """Job id -> last state seen."""
        self.full_checkpoints = False
        """A full checkpoint disk is (or was, this cycle) injected: jobs may fail of it."""
        self.python = job_reach.job_python(cluster.workdir)
        """This environment's interpreter as the job uids can run it (the cluster's own job
        environment where they cannot run this one)."""

    def client(self) -> Client:
        """A client of the scheduler replicas alive now (their ports change on restart)."""
        return self.cluster.client(timeout_s=5.0)

    def with_client(self, call: Callable[[Client], T], attempts: int = 30) -> T:
        """Call the API, retrying through failovers (UNAVAILABLE) for up to ~30 s."""
        for attempt in range(attempts):
            try:
                with self.client() as client:
                    return call(client)
            except PolluxError as error:
                if isinstance(error, InvalidArgumentError | NotFoundError):
                    raise
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def running(self) -> list[str]:
        """The ids of the jobs not known to have ended."""
        return [j for j, state in self.accepted.items() if state not in TERMINAL]

    def top_up(self) -> None:
        """Submit jobs until `active` are active."""
        for _ in range(self.active - len(self.running())):
            steps = self.rng.randint(self.steps // 2, self.steps)
            spec = JobSpec(
                name="chaos",
                command=(self.python, str(JOB), str(steps)),
                initial_batch_size=64,
                max_batch_size=512,
                max_replicas=self.rng.choice((1, 2, 4)),
                stop_grace_s=STOP_GRACE_S,
            )
            job = self.submit(spec, uuid.uuid4().hex)
            self.accepted[job.id] = job.state

    def submit(self, spec: JobSpec, request_id: str) -> Job:
        """Submit through failovers (the request id makes retries create one job)."""

        def call(client: Client) -> Job:
            return client.submit(spec, request_id=request_id)

        job: Job = self.with_client(call)
        return job

    def bad_submits(self) -> None:
        """An oversized spec and a NUL-byte spec must both be refused."""
        bad = [
            JobSpec(
                name="oversized", command=("true",), initial_batch_size=8, env={"X": "x" * 70_000}
            ),
            JobSpec(name="nul", command=("true",), initial_batch_size=8, working_dir="/tmp\0x"),
        ]
        for spec in bad:
            try:
                job = self.submit(spec, uuid.uuid4().hex)
            except InvalidArgumentError:
                continue
            self.tally.bad_accepted += 1
            self.tally.note(f"bad spec {spec.name!r} accepted as {job.id}")

    def refresh(self) -> dict[str, Job]:
        """Every accepted job as the API lists it now (pages of ListJobs); counts lost ones.

        The bad specs' names are never listed: the suite's jobs are all named "chaos".
        """

        def call(client: Client) -> dict[str, Job]:
            return {job.id: job for job in client.list_jobs(name_prefix="chaos", page_size=500)}

        listed: dict[str, Job] = self.with_client(call)
        for job_id in list(self.accepted):
            job = listed.get(job_id)
            if job is None:
                self.tally.lost += 1
                self.tally.note(f"job {job_id} lost")
                del self.accepted[job_id]
                continue
            if job.state == "FAILED" and self.accepted[job_id] != "FAILED":
                reason = job.history[-1].reason
                if self.full_checkpoints and "on a full disk" in reason:
                    self.tally.disk_failed += 1
                    print(f"  job {job_id} failed as it should: {reason[:160]}", flush=True)
                else:
                    self.tally.failed += 1
                    self.tally.note(f"job {job_id} failed: {reason}")
            self.accepted[job_id] = job.state
        return {job_id: listed[job_id] for job_id in self.accepted}

    def leader(self) -> str:
        """The leading scheduler's id, or "" (none leads, or none answers)."""
        try:
            with self.client() as client:
                return client.cluster_status().leader_id
        except PolluxError:
            return ""
