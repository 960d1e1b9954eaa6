"""The sweep driver: an Optuna study whose trials run as jobs of a `TrialBackend`.

`run_sweep` keeps `SweepSpec.concurrency` trials running: it asks the study for parameters,
renders the job template, starts the job, and between `TrialBackend.wait` calls reads each
running trial's reports. Every new value of the objective metric goes to the study as an
intermediate value; when the pruner says so, the job is stopped and the trial is PRUNED. A
job that succeeds gives the study its last reported objective (FAIL if it reported none); a
job that fails or is cancelled from outside is a FAIL. Backends: the live cluster
(`pollux.client.sweep.ClusterTrials`) and the simulator (`pollux.sim.trials.SimTrials`).
If the driver stops on an error or an interrupt, it stops every trial it started.

Optuna is an optional dependency (the ``hpo`` extra); this module imports it.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from pollux.hpo.metrics import MetricReport
from pollux.hpo.spec import Parameter, ParamValue, SweepSpec


class TrialStatus(enum.Enum):
    """A trial job's state as the driver needs it."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class TrialPoll:
    """What a backend knows of a trial job now.

    Attributes:
        status: Running (or waiting for GPUs), succeeded, or failed/cancelled.
        reports: Every metric report seen so far, in the order written.
        reason: Why it failed, when it did.
    """

    status: TrialStatus
    reports: tuple[MetricReport, ...] = ()
    reason: str = ""


class TrialBackend(Protocol):
    """Where trial jobs run: a cluster through its API, or the simulator."""

    def start(self, number: int, params: Mapping[str, ParamValue], job: Mapping[str, Any]) -> str:
        """Start trial `number`'s job (the rendered template); returns its handle (job id)."""
        ...

    def poll(self, handle: str) -> TrialPoll:
        """The job's status and every report so far."""
        ...

    def stop(self, handle: str, reason: str) -> None:
        """Stop the job (the pruner stopped it, or the sweep is ending)."""
        ...

    def wait(self) -> None:
        """Return when the trials may have changed (a poll interval, a simulated round)."""
        ...


@dataclass(frozen=True, slots=True)
class TrialOutcome:
    """One finished trial.

    Attributes:
        number: Optuna's trial number.
        params: Its parameters.
        state: "COMPLETE", "PRUNED" or "FAIL".
        value: Its objective (COMPLETE), last intermediate value (PRUNED), or None.
        job: The backend's handle of its job.
        reason: For PRUNED and FAIL, why.
    """

    number: int
    params: Mapping[str, ParamValue]
    state: str
    value: float | None
    job: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class SweepResult:
    """A finished sweep: every trial in the order they finished, and the best."""

    trials: tuple[TrialOutcome, ...]
    best: TrialOutcome | None
    study: optuna.Study = field(repr=False)


Listener = Callable[[str, TrialOutcome | None, Mapping[str, Any]], None]
"""Told of each event: ("started" | "finished", outcome or None, details)."""


def distributions(parameters: tuple[Parameter, ...]) -> dict[str, BaseDistribution]:
    """Optuna's distribution of each parameter."""
    out: dict[str, BaseDistribution] = {}
    for p in parameters:
        if p.kind == "categorical":
            out[p.name] = CategoricalDistribution(p.choices)
        elif p.kind == "int":
            out[p.name] = IntDistribution(
                int(p.low), int(p.high), log=p.log, step=1 if p.log else int(p.step or 1)
            )
        else:
            out[p.name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def make_study(spec: SweepSpec) -> optuna.Study:
    """An in-memory study with the spec's direction, sampler and pruner."""
    sampler: optuna.samplers.BaseSampler
    if spec.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=spec.seed)
    else:
        # constant_liar: trials still running count as bad, so concurrent asks spread out.
        sampler = optuna.samplers.TPESampler(seed=spec.seed, constant_liar=True)
    pruner: optuna.pruners.BasePruner
    if spec.pruner == "none":
        pruner = optuna.pruners.NopPruner()
    else:
        pruner = optuna.pruners.MedianPruner(
            n_startup_trials=spec.startup_trials, n_warmup_steps=spec.warmup_steps
        )
    return optuna.create_study(
        study_name=spec.name, direction=spec.direction, sampler=sampler, pruner=pruner
    )


@dataclass
class _Running:
    trial: optuna.Trial
    handle: str
    seen: int = 0
    steps: set[int] = field(default_factory=set)


def run_sweep(
    spec: SweepSpec,
    backend: TrialBackend,
    *,
    study: optuna.Study | None = None,
    on_event: Listener | None = None,
) -> SweepResult:
    """Run the sweep to its last trial (see the module docstring)."""
    study = study or make_study(spec)
    space = distributions(spec.parameters)
    running: list[_Running] = []
    done: list[TrialOutcome] = []
    started = 0

    def tell(run: _Running, state: str, value: float | None, reason: str = "") -> None:
        if state == "COMPLETE":
            study.tell(run.trial, value)
        else:
            study.tell(run.trial, state=TrialState.PRUNED if state == "PRUNED" else TrialState.FAIL)
        outcome = TrialOutcome(
            run.trial.number, dict(run.trial.params), state, value, run.handle, reason
        )
        done.append(outcome)
        running.remove(run)
        if on_event is not None:
            on_event("finished", outcome, {})

    try:
        while started < spec.trials or running:
            while len(running) < spec.concurrency and started < spec.trials:
                trial = study.ask(space)
                job = spec.render(trial.params, trial.number)
                try:
                    handle = backend.start(trial.number, dict(trial.params), job)
                except BaseException:
                    study.tell(trial, state=TrialState.FAIL)
                    raise
                running.append(_Running(trial, handle))
                started += 1
                if on_event is not None:
                    on_event(
                        "started",
                        None,
                        {"number": trial.number, "job": handle, "params": trial.params},
                    )
            backend.wait()
            for run in list(running):
                _check(spec, backend, run, tell)
    except BaseException:
        for run in running:
            # Best effort: the error that stopped the sweep is the one to report.
            with contextlib.suppress(Exception):
                backend.stop(run.handle, f"sweep {spec.name} stopped")
            study.tell(run.trial, state=TrialState.FAIL)
        raise
    complete = [t for t in done if t.state == "COMPLETE" and t.value is not None]
    pick = min if spec.direction == "minimize" else max
    best = pick(complete, key=lambda t: t.value or 0.0) if complete else None
    return SweepResult(tuple(done), best, study)


def _check(
    spec: SweepSpec,
    backend: TrialBackend,
    run: _Running,
    tell: Callable[[_Running, str, float | None, str], None],
) -> None:
    """Read one trial's new reports; prune or finish it when it is time."""
    poll = backend.poll(run.handle)
    new = [r for r in poll.reports[run.seen :] if r.name == spec.metric]
    run.seen = len(poll.reports)
    last = None
    for report in new:
        step = report.step if report.step is not None else len(run.steps)
        if step in run.steps:
            continue  # Optuna keeps the first value of a step
        run.steps.add(step)
        run.trial.report(report.value, step)
        last = report.value
    values = [r.value for r in poll.reports if r.name == spec.metric]
    if poll.status is TrialStatus.SUCCEEDED:
        if values:
            tell(run, "COMPLETE", values[-1], "")
        else:
            tell(run, "FAIL", None, f"the job succeeded without reporting {spec.metric!r}")
    elif poll.status is TrialStatus.FAILED:
        tell(run, "FAIL", None, poll.reason or "the job failed")
    elif last is not None and run.trial.should_prune():
        backend.stop(run.handle, f"pruned by the sweep at step {max(run.steps)}")
        tell(run, "PRUNED", last, f"pruned at step {max(run.steps)}: {spec.metric} = {last:g}")
