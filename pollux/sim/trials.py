"""Hyper-parameter search in the simulator: trials as simulated jobs (`pollux.hpo` backend).

`SimTrials` runs each trial as a job of an `ElasticCluster` (`pollux.sim.autoscaling`): the
rendered job template names the application and, for fixed-size policies, the GPU count and
batch size (keys ``application``, ``num_replicas``, ``batch_size``). A trial reports its
metric after every epoch; the traces hold one learning curve per batch size, which no
hyper-parameter changes, so the reported value is `objective(params, trace metric)`, a
function the caller chooses (identity by default). `wait` runs one scheduling round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pollux.hpo.driver import TrialPoll, TrialStatus
from pollux.hpo.metrics import MetricReport
from pollux.hpo.spec import ParamValue
from pollux.sim.autoscaling import ElasticCluster
from pollux.sim.workload import WorkloadJob

Objective = Callable[[Mapping[str, ParamValue], float], float]
"""(trial parameters, the trace's validation metric) → the reported value."""


def trace_metric(params: Mapping[str, ParamValue], metric: float) -> float:
    """The trace's own metric, whatever the parameters."""
    return metric


@dataclass
class _Trial:
    name: str
    params: Mapping[str, ParamValue]
    reports: list[MetricReport] = field(default_factory=list)


class SimTrials:
    """A `pollux.hpo.TrialBackend` over a simulated cluster (see the module docstring)."""

    def __init__(
        self, cluster: ElasticCluster, metric: str, objective: Objective = trace_metric
    ) -> None:
        self.cluster = cluster
        self.metric = metric
        self.objective = objective
        self.trials: dict[str, _Trial] = {}

    def start(self, number: int, params: Mapping[str, ParamValue], job: Mapping[str, Any]) -> str:
        """Submit the trial's job now.

        Raises:
            ValueError: The job names no application with traces, or bad sizes.
        """
        app = str(job.get("application", ""))
        known = self.cluster.apps.get(app)
        if known is None:
            raise ValueError(f"trial {number}: application {app!r} has no traces")
        name = str(job.get("name") or f"trial-{number}")
        spec = WorkloadJob(
            name,
            self.cluster.now,
            app,
            int(job.get("num_replicas", 1)),
            int(job.get("batch_size", known.init_batch_size)),
        )
        self.cluster.submit(spec)
        self.trials[name] = _Trial(name, dict(params))
        return name

    def poll(self, handle: str) -> TrialPoll:
        """Reports of every epoch finished so far, and whether the job is done."""
        trial = self.trials[handle]
        job = self.cluster.job(handle)
        app = job.app
        last = min(job.epoch, app.max_epochs)
        batch = min(max(job.batch_size, app.init_batch_size), app.max_batch_size)
        for epoch in range(len(trial.reports), last):
            value = self.objective(trial.params, app.metric(batch, epoch))
            trial.reports.append(MetricReport(self.metric, value, epoch))
        if handle in self.cluster.cancelled:
            return TrialPoll(TrialStatus.FAILED, tuple(trial.reports), "cancelled")
        status = TrialStatus.SUCCEEDED if job.completed else TrialStatus.RUNNING
        return TrialPoll(status, tuple(trial.reports))

    def stop(self, handle: str, reason: str) -> None:
        """Cancel the job now."""
        self.cluster.cancel(handle)

    def wait(self) -> None:
        """Run one scheduling round."""
        self.cluster.step()
