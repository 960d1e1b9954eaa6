"""Forecasts: the cluster played forward with the policy's rounds (pollux.policy.forecast)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.policy.forecast import _resized, forecast, progress_rate
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.types import AllocationDecision, ClusterState, JobExplain
from tests.unit.policy_builders import NOW, Fixed, ScriptedPolicy, job, nodes, random_state, state


def declared(info, work):  # type: ignore[no-untyped-def]
    return replace(info, remaining_work=work)


def test_a_job_that_keeps_its_gpus_finishes_after_its_work_over_its_rate() -> None:
    mine = declared(job("a", on=("n0", "n0")), 600.0)
    s = state([mine], nodes(1))
    rate = progress_rate(mine, ("n0", "n0"))
    assert rate > 0
    result = forecast(s, Fixed({"a": ("n0", "n0")}), round_s=60.0, restart_delay_s=30.0)
    assert result.completion == {"a": pytest.approx(NOW + 600.0 / rate)}
    assert result.rounds == int(600.0 / rate // 60.0) + 1


def test_a_moved_job_pays_its_own_pause_or_else_the_default() -> None:
    mine = declared(job("a", on=("n0",)), 100.0)
    moved = {"a": ("n0", "n0")}
    rate = progress_rate(mine, ("n0", "n0"))
    default = forecast(state([mine], nodes(1)), Fixed(moved), round_s=1e6, restart_delay_s=30.0)
    assert default.completion["a"] == pytest.approx(NOW + 30.0 + 100.0 / rate)
    own = replace(mine, restart_pause_s=7.0)
    measured = forecast(state([own], nodes(1)), Fixed(moved), round_s=1e6, restart_delay_s=30.0)
    assert measured.completion["a"] == pytest.approx(NOW + 7.0 + 100.0 / rate)


def test_freed_gpus_go_to_the_others_and_shorten_their_time() -> None:
    # Two jobs share 4 GPUs; the small one finishes first. On its GPUs alone, the big one
    # would take work / rate(2 GPUs); with the freed GPUs the live policy finishes it sooner.
    small = declared(job("small", on=("n0", "n0")), 50.0)
    big = declared(job("big", on=("n0", "n0")), 3000.0)
    s = state([small, big], nodes(1))
    result = forecast(s, PolluxPolicy(), round_s=60.0, restart_delay_s=30.0)
    assert set(result.completion) == {"small", "big"}
    assert result.completion["small"] < result.completion["big"]
    alone_on_two = NOW + 3000.0 / progress_rate(big, ("n0", "n0"))
    assert result.completion["big"] < alone_on_two


def test_jobs_without_a_size_or_a_model_get_no_prediction_but_still_hold_gpus() -> None:
    sized = declared(job("sized", on=("n0",)), 100.0)
    unsized = job("unsized", on=("n0",))
    no_model = declared(job("no-model", on=("n0",), noise=None), 100.0)
    s = state([sized, unsized, no_model], nodes(1))
    fixed = Fixed({"sized": ("n0",), "unsized": ("n0",), "no-model": ("n0",)})
    result = forecast(s, fixed, round_s=60.0, restart_delay_s=30.0)
    assert set(result.completion) == {"sized"}


def test_the_horizon_bounds_a_forecast_that_would_never_end() -> None:
    waiting = declared(job("waiting"), 100.0)  # the policy never gives it a GPU
    result = forecast(
        state([waiting], nodes(1)), Fixed({}), round_s=60.0, restart_delay_s=30.0, horizon_s=600
    )
    assert result.completion == {}
    assert result.rounds == 10
    with pytest.raises(ValueError, match="round_s"):
        forecast(state([waiting], nodes(1)), Fixed({}), round_s=0, restart_delay_s=30.0)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_every_prediction_is_in_the_future_and_a_longer_job_alone_ends_later(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = random_state(rng, num_nodes=3)
    jobs = tuple(declared(j, float(rng.uniform(1, 2000))) for j in base.jobs)
    s = ClusterState(now=NOW, nodes=base.nodes, jobs=jobs)
    result = forecast(s, PolluxPolicy(), round_s=300.0, restart_delay_s=30.0, max_rounds=400)
    assert all(t > NOW for t in result.completion.values())
    assert set(result.completion) <= {j.name for j in jobs if j.model is not None}


class _Recorder(ScriptedPolicy):
    """Wraps a policy and records the states it was asked about (what the forecast feeds it)."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[ClusterState] = []

    def allocate(
        self, state: ClusterState, memory: object | None, rng: np.random.Generator
    ) -> AllocationDecision:
        self.seen.append(state)
        allocations = {j.name: ("n0",) for j in state.jobs}
        return AllocationDecision(allocations, {j: JobExplain(1.0, 1.0, "") for j in allocations})


def test_the_policy_sees_the_work_shrink_and_the_clock_advance_round_by_round() -> None:
    recorder = _Recorder()
    mine = declared(job("a", on=("n0",)), 500.0)
    forecast(state([mine], nodes(1)), recorder, round_s=60.0, restart_delay_s=0.0)
    times = [s.now for s in recorder.seen]
    assert times == [NOW + 60.0 * i for i in range(len(times))]
    left = [s.jobs[0].remaining_work for s in recorder.seen]
    assert all(a > b for a, b in itertools.pairwise(left))


def test_a_new_job_explores_beyond_its_first_gpus_up_to_its_cap() -> None:
    new = declared(job("new", on=("n0",), max_replicas=1), 20_000.0)
    s = state([new], nodes(2))
    explored = forecast(s, PolluxPolicy(), round_s=300.0, restart_delay_s=30.0)
    capped = forecast(s, PolluxPolicy(), round_s=300.0, restart_delay_s=30.0, caps={"new": 1})
    alone_on_one = NOW + 20_000.0 / progress_rate(new, ("n0",))
    assert capped.completion["new"] == pytest.approx(alone_on_one)
    assert explored.completion["new"] - NOW < 0.6 * (alone_on_one - NOW)  # 8 GPUs help


def test_a_forecast_round_keeps_each_jobs_resize_record() -> None:
    running = replace(job("a", on=("n0",) * 4), resizes=2, reversals=0, last_resize=1)
    shrunk = _resized(running, replace(running, allocation=("n0",) * 2))
    assert (shrunk.resizes, shrunk.reversals, shrunk.last_resize) == (3, 1, -1)
    fresh = job("b")
    started = _resized(fresh, replace(fresh, allocation=("n0",)))
    assert (started.resizes, started.reversals, started.last_resize) == (0, 0, 0)
