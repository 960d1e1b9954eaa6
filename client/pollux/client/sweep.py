"""Sweep trials on a live cluster: the `pollux.hpo.driver.TrialBackend` over the client API.

Each trial is a job submitted through `Client.submit`, named "<sweep>-<trial>" and labelled
``pollux.sweep`` and ``pollux.trial``. Its metric reports are the ``pollux-metric`` lines of
rank 0's log (`pollux.hpo.metrics`), read through `Client.log_chunks` at each poll: the
training library reports step times and gradient statistics to its agent, not user metrics,
so the log is where a trial's objective comes from. Lines are read per allocation generation;
a line a replica printed in the last poll interval before a rescale stopped it may be missed
(it was an intermediate value; the final one comes from the last generation). Pruning and the
end of a sweep cancel the trial's job. A submit refused by the user's submit rate or PENDING
limit is retried with the same request id after the wait the server names (else a doubling
one, at most `MAX_BACKOFF_S`), for at most `SUBMIT_PATIENCE_S`: a sweep resumes, not dies.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pollux.client.client import Client
from pollux.client.errors import NotFoundError, ResourceExhaustedError, UnavailableError
from pollux.client.types import JobSpec
from pollux.hpo.driver import TrialPoll, TrialStatus
from pollux.hpo.metrics import MetricReport, parse_metric_line
from pollux.hpo.spec import ParamValue

MAX_BACKOFF_S = 30.0
"""Longest pause between two submits of a trial the server refused for a limit."""
SUBMIT_PATIENCE_S = 3600.0
"""How long a trial's submit is retried under a limit before the sweep gives up."""
SWEEP_LABEL = "pollux.sweep"
TRIAL_LABEL = "pollux.trial"


def trial_spec(sweep: str, number: int, job: Mapping[str, Any]) -> JobSpec:
    """The job of trial `number`: the rendered template, named and labelled for the sweep.

    Raises:
        JobSpecError: The rendered template is no valid job (every problem, by key).
    """
    labels = {**dict(job.get("labels") or {}), SWEEP_LABEL: sweep, TRIAL_LABEL: str(number)}
    return JobSpec.from_mapping({**job, "name": f"{sweep}-{number}", "labels": labels})


@dataclass
class _Logs:
    consumed: dict[int, int] = field(default_factory=dict)
    reports: list[MetricReport] = field(default_factory=list)


class ClusterTrials:
    """Trials as jobs of a live cluster (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        sweep: str,
        poll_interval_s: float = 2.0,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.client = client
        self.sweep = sweep
        self.poll_interval_s = poll_interval_s
        self.sleep = sleep
        self.clock = clock
        self.say = say
        self.logs: dict[str, _Logs] = {}

    def start(self, number: int, params: Mapping[str, ParamValue], job: Mapping[str, Any]) -> str:
        """Submit trial `number`'s job, waiting out the caller's limits; returns its id.

        Raises:
            ResourceExhaustedError: Still refused after `SUBMIT_PATIENCE_S`.
        """
        spec = trial_spec(self.sweep, number, job)
        request_id = str(uuid.uuid4())  # one per trial: a retry never makes a second job
        give_up = self.clock() + SUBMIT_PATIENCE_S
        backoff = 1.0
        while True:
            try:
                submitted = self.client.submit(spec, request_id=request_id)
                break
            except ResourceExhaustedError as refused:
                wait = refused.retry_after_s if refused.retry_after_s is not None else backoff
                wait = min(max(wait, 0.05), MAX_BACKOFF_S)
                if self.clock() + wait > give_up:
                    raise
                self.say(f"trial {number}: {refused.message}; submitting again in {wait:.1f} s")
                self.sleep(wait)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        self.logs[submitted.id] = _Logs()
        return submitted.id

    def poll(self, handle: str) -> TrialPoll:
        """The job's state and every metric line its rank 0 has printed so far."""
        job = self.client.get_job(handle)
        logs = self.logs.setdefault(handle, _Logs())
        self._read(handle, logs)
        reports = tuple(logs.reports)
        if job.state == "SUCCEEDED":
            return TrialPoll(TrialStatus.SUCCEEDED, reports)
        if job.state in ("FAILED", "CANCELLED"):
            return TrialPoll(TrialStatus.FAILED, reports, f"job {job.state.lower()}")
        return TrialPoll(TrialStatus.RUNNING, reports)

    def _read(self, handle: str, logs: _Logs) -> None:
        try:
            for chunk in self.client.log_chunks(handle, 0):
                done = logs.consumed.get(chunk.generation, 0)
                for line in chunk.lines[done:]:
                    report = parse_metric_line(line)
                    if report is not None:
                        logs.reports.append(report)
                logs.consumed[chunk.generation] = max(done, len(chunk.lines))
        except (NotFoundError, UnavailableError):
            return  # no replica has started yet, or its node is away: nothing new this time

    def stop(self, handle: str, reason: str) -> None:
        """Cancel the job (a job that already ended is left as it is)."""
        try:
            job = self.client.get_job(handle)
            if job.state not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                self.client.cancel(handle, reason)
        except NotFoundError:
            return

    def wait(self) -> None:
        """Sleep one poll interval."""
        self.sleep(self.poll_interval_s)
