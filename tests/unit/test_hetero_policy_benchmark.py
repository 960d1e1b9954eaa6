"""The typed-policy timing benchmark (benchmarks/hetero_policy_time.py) on the project's traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.hetero_policy_time import (
    OWN_CLUSTER,
    first_state,
    main,
    next_state,
    own_apps,
)
from pollux.policy.registry import PolicySpec, make_policy
from pollux.sim.traces import default_data_root


@pytest.fixture(scope="module")
def apps():  # one fit per model: a few seconds, shared by the tests here
    return own_apps(default_data_root() / "traces")


def test_rounds_are_built_from_every_type_and_move_running_jobs(apps):
    state = first_state(apps, OWN_CLUSTER, 1, 40, seed=3)
    assert {n.gpu_type for n in state.nodes} == {"t4", "fast", "faster"}
    assert sum(n.gpus for n in state.nodes) == 64
    assert all(set(j.models) == {"t4", "fast", "faster"} for j in state.jobs)
    decision = make_policy(PolicySpec("pollux-jct")).allocate(state, None, np.random.default_rng(0))
    later = next_state(state, dict(decision.allocations), np.random.default_rng(1))
    assert later.now == state.now + 60
    for before, after in zip(state.jobs, later.jobs, strict=True):
        assert after.allocation == decision.allocations[before.name]
        if after.allocation:  # running: its statistics moved, so its tables are recomputed
            assert after.models["t4"] is not before.models["t4"]
        else:  # waiting: the very same models, so the cache holds them
            assert after.models["t4"] is before.models["t4"]


def test_the_benchmark_prints_its_figures_without_sia_data(capsys, monkeypatch, tmp_path: Path):
    argv = ["hetero_policy_time", "--sia-data", str(tmp_path), "--cases", "64:30", "--rounds", "2"]
    monkeypatch.setattr("sys.argv", argv)
    main()
    out = capsys.readouterr().out
    assert "no Sia traces" in out
    assert "64 GPUs" in out
    assert "median" in out
    assert "certified gap" in out
