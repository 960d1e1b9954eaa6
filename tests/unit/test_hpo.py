"""Sweep files, metric lines, and the Optuna driver over an in-memory backend and the simulator."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.client.cli_sweep import read_sweep
from pollux.hpo import (
    MetricReport,
    SweepSpec,
    SweepSpecError,
    format_metric_line,
    parse_metric_line,
)
from pollux.hpo.driver import TrialPoll, TrialStatus, run_sweep
from pollux.policy.registry import PolicySpec, make_policy
from pollux.sim.application import load_published_applications
from pollux.sim.autoscaling import AutoscaleConfig, ElasticCluster
from pollux.sim.simulator import SimConfig
from pollux.sim.trials import SimTrials


def sweep(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "bowl",
        "objective": {"metric": "loss", "direction": "minimize"},
        "trials": 6,
        "concurrency": 2,
        "sampler": {"name": "tpe", "seed": 3},
        "parameters": {
            "x": {"type": "float", "low": -1.0, "high": 1.0},
            "width": {"type": "int", "low": 8, "high": 64, "log": True},
            "opt": {"type": "categorical", "choices": ["sgd", "adam"]},
        },
        "job": {
            "command": ["python", "train.py", "--x=${x}", "${width}"],
            "initial_batch_size": "${width}",
            "env": {"OPT": "${opt}", "TRIAL": "${sweep}-${trial}"},
        },
    }
    base.update(overrides)
    return base


# ---- sweep files ------------------------------------------------------------------------------


def test_a_template_renders_typed_values_in_mappings_and_text_in_argv() -> None:
    spec = SweepSpec.from_mapping(sweep())
    job = spec.render({"x": 0.25, "width": 32, "opt": "adam"}, 4)
    assert job["command"] == ["python", "train.py", "--x=0.25", "32"]
    assert job["initial_batch_size"] == 32
    assert job["env"] == {"OPT": "adam", "TRIAL": "bowl-4"}


def test_every_problem_of_a_sweep_file_is_reported_at_once() -> None:
    bad = sweep(
        name="Bad Name",
        trials=0,
        extra=1,
        objective={"metric": "", "direction": "up"},
        parameters={
            "lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True},
            "trial": {"type": "int", "low": 1, "high": 2},
            "k": {"type": "int", "low": 3, "high": 3},
        },
        job={"name": "x", "command": ["${nope}"]},
    )
    with pytest.raises(SweepSpecError) as caught:
        SweepSpec.from_mapping(bad)
    problems = "\n".join(caught.value.problems)
    for want in (
        "extra: unknown key",
        "name: 1-40 characters",
        "objective.metric",
        "objective.direction",
        "trials: a whole number ≥ 1",
        "parameters.lr.log: a log scale needs low > 0",
        "parameters.trial: 'trial' is a built-in placeholder",
        "parameters.k: need low < high",
        "job: placeholder ${nope} names no parameter",
        "job.name: set by the sweep",
    ):
        assert want in problems


def test_yaml_exponents_without_a_dot_are_numbers(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: s\nobjective: {metric: loss}\ntrials: 2\n"
        "parameters: {lr: {type: float, low: 1e-4, high: 1e-1, log: true}}\n"
        "job: {command: [python, t.py, '${lr}'], initial_batch_size: 8, working_dir: sub}\n"
    )
    spec = read_sweep(path, trials=3, concurrency=2)
    assert (spec.parameters[0].low, spec.trials, spec.concurrency) == (1e-4, 3, 2)
    assert spec.job["working_dir"] == str(tmp_path / "sub")


def test_an_unreadable_sweep_file_is_a_sweep_error(tmp_path: Path) -> None:
    with pytest.raises(SweepSpecError, match="cannot read"):
        read_sweep(tmp_path / "missing.yaml")


# ---- metric lines -----------------------------------------------------------------------------


@given(
    st.text(min_size=1, max_size=20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none() | st.integers(0, 10**9),
)
def test_metric_lines_round_trip(name: str, value: float, step: int | None) -> None:
    line = format_metric_line(name, value, step)
    assert "\n" not in line
    assert parse_metric_line(line) == MetricReport(name, value, step)


@pytest.mark.parametrize(
    "line",
    [
        "epoch 3 loss 0.2",
        "pollux-metric not json",
        'pollux-metric {"name": "", "value": 1}',
        'pollux-metric {"name": "a", "value": NaN}',
        'pollux-metric {"name": "a", "value": true}',
        'pollux-metric {"name": "a", "value": 1, "step": -1}',
    ],
    ids=["plain output", "bad json", "empty name", "nan", "boolean value", "negative step"],
)
def test_other_lines_are_not_metrics(line: str) -> None:
    assert parse_metric_line(line) is None


# ---- the driver -------------------------------------------------------------------------------


class Bowl:
    """Trials that report (x - 0.3)^2 + 1/(s+1) after step s, one step per `wait`."""

    def __init__(self, steps: int = 4, fail_above: float = math.inf) -> None:
        self.steps = steps
        self.fail_above = fail_above
        self.jobs: dict[str, dict[str, Any]] = {}
        self.running_max = 0
        self.stopped: list[str] = []

    def start(self, number: int, params: Mapping[str, Any], job: Mapping[str, Any]) -> str:
        handle = f"job-{number}"
        self.jobs[handle] = {"x": float(params["x"]), "step": 0, "stopped": False, "job": job}
        return handle

    def _running(self) -> list[dict[str, Any]]:
        return [j for j in self.jobs.values() if not j["stopped"] and j["step"] < self.steps]

    def poll(self, handle: str) -> TrialPoll:
        job = self.jobs[handle]
        x = job["x"]
        reports = tuple(
            MetricReport("loss", (x - 0.3) ** 2 + 1 / (s + 1), s) for s in range(job["step"])
        )
        noise = (MetricReport("other", 1.0),)
        if x > self.fail_above and job["step"] >= 1:
            return TrialPoll(TrialStatus.FAILED, reports, "exit code 1")
        status = TrialStatus.SUCCEEDED if job["step"] >= self.steps else TrialStatus.RUNNING
        return TrialPoll(status, noise + reports)

    def stop(self, handle: str, reason: str) -> None:
        self.jobs[handle]["stopped"] = True
        self.stopped.append(handle)

    def wait(self) -> None:
        running = self._running()
        self.running_max = max(self.running_max, len(running))
        for job in running:
            job["step"] += 1


def test_the_driver_keeps_concurrency_trials_running_and_finds_the_best() -> None:
    spec = SweepSpec.from_mapping(sweep(trials=8, concurrency=3, pruner={"name": "none"}))
    backend = Bowl()
    result = run_sweep(spec, backend)
    assert len(result.trials) == 8
    assert backend.running_max == 3
    assert {t.state for t in result.trials} == {"COMPLETE"}
    for t in result.trials:
        assert t.value == pytest.approx((float(t.params["x"]) - 0.3) ** 2 + 1 / 4)
    assert result.best is not None
    assert result.best.value == min(t.value for t in result.trials if t.value is not None)
    assert result.study.best_value == result.best.value
    # The rendered job reached the backend.
    job = backend.jobs[result.best.job]["job"]
    assert job["command"][2] == f"--x={result.best.params['x']}"


def test_the_pruner_stops_trials_that_are_worse_at_the_same_step() -> None:
    spec = SweepSpec.from_mapping(
        sweep(
            trials=12,
            concurrency=1,
            sampler={"name": "random", "seed": 1},
            pruner={"name": "median", "warmup_steps": 0, "startup_trials": 2},
        )
    )
    backend = Bowl(steps=6)
    result = run_sweep(spec, backend)
    pruned = [t for t in result.trials if t.state == "PRUNED"]
    assert pruned
    assert sorted(backend.stopped) == sorted(t.job for t in pruned)
    assert all("pruned at step" in t.reason for t in pruned)


def test_failed_trials_are_failures_and_the_sweep_goes_on() -> None:
    spec = SweepSpec.from_mapping(sweep(trials=6, pruner={"name": "none"}))
    result = run_sweep(spec, Bowl(fail_above=0.0))
    failed = [t for t in result.trials if t.state == "FAIL"]
    assert len(result.trials) == 6
    assert all(t.reason == "exit code 1" and float(t.params["x"]) > 0 for t in failed)


def test_a_trial_that_reports_no_objective_fails() -> None:
    spec = SweepSpec.from_mapping(sweep(trials=2, pruner={"name": "none"}))
    result = run_sweep(spec, Bowl(steps=0))
    assert {t.state for t in result.trials} == {"FAIL"}
    assert result.best is None
    assert "without reporting 'loss'" in result.trials[0].reason


def test_an_interrupted_sweep_stops_every_running_trial() -> None:
    class Interrupted(Bowl):
        def wait(self) -> None:
            super().wait()
            if len(self.jobs) >= 4:
                raise KeyboardInterrupt

    spec = SweepSpec.from_mapping(sweep(trials=10, concurrency=2, pruner={"name": "none"}))
    backend = Interrupted()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, backend)
    assert len(backend.stopped) == 2
    assert all(backend.jobs[h]["stopped"] for h in backend.stopped)


def test_a_trial_that_cannot_start_stops_the_sweep_and_its_running_trials() -> None:
    class Refusing(Bowl):
        def start(self, number: int, params: Mapping[str, Any], job: Mapping[str, Any]) -> str:
            if number == 1:
                raise ValueError("no such application")
            return super().start(number, params, job)

    spec = SweepSpec.from_mapping(sweep(trials=4, concurrency=2, pruner={"name": "none"}))
    backend = Refusing()
    with pytest.raises(ValueError, match="no such application"):
        run_sweep(spec, backend)
    assert backend.stopped == ["job-0"]


# ---- in the simulator -------------------------------------------------------------------------


def test_a_sweep_runs_in_the_simulator_with_every_trial_a_job() -> None:
    apps = load_published_applications()
    policy = make_policy(PolicySpec("pollux"))
    cluster = ElasticCluster(apps, policy, SimConfig(), AutoscaleConfig.fixed(2))
    backend = SimTrials(cluster, "accuracy", lambda p, acc: acc - abs(float(p["x"])))
    spec = SweepSpec.from_mapping(
        sweep(
            trials=3,
            concurrency=2,
            objective={"metric": "accuracy", "direction": "maximize"},
            parameters={"x": {"type": "float", "low": -1.0, "high": 1.0}},
            pruner={"name": "none"},
            job={"application": "cifar10"},
        )
    )
    result = run_sweep(spec, backend)
    assert [t.state for t in result.trials] == ["COMPLETE"] * 3
    done = cluster.result()
    assert set(done.sim.jcts) == {"trial-0", "trial-1", "trial-2"}
    third = cluster.job("trial-2")
    # The third trial started when one of the first two finished, not at time 0.
    assert third.spec.submission_time > 0
    assert done.sim.jcts["trial-2"] == pytest.approx(
        (third.completion_time or 0) - third.spec.submission_time
    )
    app = apps["cifar10"]
    for t in result.trials:
        assert t.value is not None
        assert t.value <= max(app.metric(b, app.completion_epoch) for b in app.batch_sizes)
    assert 0 < done.utilisation <= 1
