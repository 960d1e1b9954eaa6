"""The autoscaling decision: curves, the band rule, pools, cooldowns, and which nodes go."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.autoscale import (
    GOODPUT_RULE,
    THROUGHPUT_RULE,
    AutoscaleInputError,
    AutoscaleState,
    BandRule,
    NodePool,
    NodeStatus,
    PoolHistory,
    Signal,
    autoscale,
    concave_majorant,
    job_curve,
    size_ladder,
    total_speedup,
)
from pollux.goodput import GoodputModel, GradParams, PerfParams
from pollux.policy.types import JobInfo

POOL = NodePool("p", gpus_per_node=4, min_nodes=1, max_nodes=8, scale_up_cooldown_s=0.0)


def model(noise: float) -> GoodputModel:
    """A job whose throughput scales well and whose noise scale is `noise` (M0 = 128)."""
    perf = PerfParams(0.1, 0.001, 0.01, 0.0001, 0.005, 0.0001, 1.2)
    return GoodputModel(
        perf,
        GradParams(sqr=1.0, var=noise / 128),
        init_batch_size=128,
        max_batch_size=8192,
        min_atomic_bsz=32,
        max_atomic_bsz=256,
        accumulation=True,
    )


def job(
    name: str, limit: int = 64, noise: float | None = None, on: tuple[str, ...] = ()
) -> JobInfo:
    return JobInfo(
        name=name,
        submission_time=0.0,
        allocation=on,
        max_replicas=limit,
        model=None if noise is None else model(noise),
    )


def nodes(count: int, used: int = 0, pool: str = "p", **kw: object) -> tuple[NodeStatus, ...]:
    return tuple(
        NodeStatus(f"{pool}-{i}", pool, used_gpus=used, **kw)  # type: ignore[arg-type]
        for i in range(count)
    )


# ---- curves ----------------------------------------------------------------------------------


@given(st.lists(st.floats(0, 100), min_size=2, max_size=30))
def test_concave_majorant_is_above_concave_and_non_decreasing(values: list[float]) -> None:
    curve = np.array([0.0, *values])
    hull = concave_majorant(curve)
    assert np.all(hull >= np.maximum.accumulate(curve) - 1e-9)
    steps = np.diff(hull)
    assert np.all(steps >= -1e-9)
    assert np.all(np.diff(steps) <= 1e-9)


def test_a_job_without_a_model_scales_linearly_to_its_limit() -> None:
    curve = job_curve(job("a", limit=3), Signal.GOODPUT, 4, 8)
    assert list(curve) == [0, 1, 2, 3, 3, 3, 3, 3, 3]


def test_goodput_sees_statistical_efficiency_and_throughput_does_not() -> None:
    early = job("a", noise=50.0)  # small noise scale: large batches waste samples
    goodput = job_curve(early, Signal.GOODPUT, 4, 32)
    throughput = job_curve(early, Signal.THROUGHPUT, 4, 32)
    assert goodput[1] == pytest.approx(1.0)
    assert throughput[32] > 2 * goodput[32]


def test_total_speedup_takes_the_best_increments_across_jobs() -> None:
    curves = [np.array([0, 1, 2, 2, 2.0]), np.array([0, 1, 1.5, 1.5, 1.5])]
    total = total_speedup(curves, 4)
    assert list(total) == [0, 1, 2, 3, 3.5]


# ---- the band rule ---------------------------------------------------------------------------


def decide(jobs: tuple[JobInfo, ...], fleet: tuple[NodeStatus, ...], **kw: object) -> object:
    state = AutoscaleState(100.0, jobs, (kw.pop("pool", POOL),), fleet, kw.pop("history", None))  # type: ignore[arg-type]
    return autoscale(state, kw.pop("rule", GOODPUT_RULE))  # type: ignore[arg-type]


def test_jobs_that_scale_linearly_grow_the_cluster_to_what_they_can_use() -> None:
    decision = decide((job("a", limit=10), job("b", limit=6)), nodes(1, used=4))
    pool = decision.pools["p"]  # type: ignore[attr-defined]
    assert (pool.current, pool.desired, pool.add) == (1, 4, 3)
    assert pool.reason.startswith("up 1 → 4 nodes: goodput per GPU 1.00")


def test_within_the_band_nothing_moves() -> None:
    # 4 GPUs of a job limited to 3: utility 0.75, above L = 0.5 and at most U? 0.75 > 2/3.
    # A job limited to 3 GPUs on 2 nodes: 3/8 < 1/2 → shrink; on 1 node: 3/4 > 2/3 but the
    # largest size with utility ≥ 1/2 is 1 node → hold.
    decision = decide((job("a", limit=3),), nodes(1, used=3))
    assert decision.pools["p"].desired == 1  # type: ignore[attr-defined]
    assert decision.pools["p"].add == 0  # type: ignore[attr-defined]


def test_low_utility_shrinks_releasing_provisioning_then_expired_idle_nodes() -> None:
    fleet = (
        NodeStatus("p-0", "p", used_gpus=3),
        NodeStatus("p-1", "p", idle_since=0.0),  # idle 100 s ≥ 60 s timeout
        NodeStatus("p-2", "p", ready=False),
    )
    pool = NodePool("p", min_nodes=1, max_nodes=8, idle_timeout_s=60.0)
    decision = decide((job("a", limit=3),), fleet, pool=pool)
    verdict = decision.pools["p"]  # type: ignore[attr-defined]
    assert verdict.desired == 1
    assert verdict.remove == ("p-2", "p-1")
    assert verdict.drain == ()


def test_idle_nodes_wait_for_their_timeout_before_busy_ones_are_drained() -> None:
    fleet = (NodeStatus("p-0", "p", used_gpus=2), NodeStatus("p-1", "p", idle_since=90.0))
    pool = NodePool("p", min_nodes=1, max_nodes=8, idle_timeout_s=60.0)
    verdict = decide((job("a", limit=2),), fleet, pool=pool).pools["p"]  # type: ignore[attr-defined]
    assert (verdict.desired, verdict.remove, verdict.drain) == (1, (), ())
    assert "wait for the idle timeout" in verdict.reason


def test_busy_nodes_are_drained_least_used_first_when_no_idle_node_covers_it() -> None:
    fleet = (
        NodeStatus("p-0", "p", used_gpus=4),
        NodeStatus("p-1", "p", used_gpus=1),
        NodeStatus("p-2", "p", used_gpus=3),
    )
    jobs = (job("a", limit=4, on=("p-0",) * 4), job("b", limit=1))
    verdict = decide(jobs, fleet).pools["p"]  # type: ignore[attr-defined]
    assert verdict.desired == 2
    assert verdict.drain == ("p-1",)


def test_drained_nodes_do_not_count_and_go_once_empty() -> None:
    fleet = (
        NodeStatus("p-0", "p", used_gpus=4),
        NodeStatus("p-1", "p", used_gpus=0, draining=True),
    )
    verdict = decide((job("a", limit=4),), fleet).pools["p"]  # type: ignore[attr-defined]
    assert verdict.current == 1
    assert verdict.remove == ("p-1",)


def test_no_jobs_shrinks_to_the_minimum() -> None:
    fleet = nodes(3, idle_since=-50.0)  # idle 150 s, past the default 120 s timeout
    verdict = decide((), fleet).pools["p"]  # type: ignore[attr-defined]
    assert verdict.desired == 1
    assert len(verdict.remove) == 2


def test_cooldowns_hold_a_pool_that_just_scaled() -> None:
    pool = NodePool(
        "p", min_nodes=1, max_nodes=8, scale_up_cooldown_s=60, scale_down_cooldown_s=300
    )
    history = {"p": PoolHistory(last_scale_up=80.0)}
    up = decide((job("a", limit=16),), nodes(1, used=4), pool=pool, history=history)
    assert up.pools["p"].desired == 1  # type: ignore[attr-defined]
    assert "scale-up cooldown" in up.pools["p"].reason  # type: ignore[attr-defined]
    down = decide((), nodes(3, idle_since=0.0), pool=pool, history=history)
    assert down.pools["p"].desired == 3  # type: ignore[attr-defined]
    assert "scale-down cooldown" in down.pools["p"].reason  # type: ignore[attr-defined]


def test_an_empty_cluster_with_waiting_jobs_grows_even_from_zero_nodes() -> None:
    pool = NodePool("p", min_nodes=0, max_nodes=4, scale_up_cooldown_s=0.0)
    decision = decide((job("a", limit=2),), (), pool=pool)
    assert math.isinf(decision.utility)  # type: ignore[attr-defined]
    assert decision.pools["p"].add == 1  # type: ignore[attr-defined]


def test_pools_grow_cheapest_gpu_first_and_shrink_dearest_first() -> None:
    cheap = NodePool("cheap", gpus_per_node=4, max_nodes=2, cost_per_node_hour=4.0)
    dear = NodePool("dear", gpus_per_node=2, max_nodes=4, cost_per_node_hour=4.0)
    ladder = size_ladder((dear, cheap))
    assert ladder[1] == {"dear": 0, "cheap": 1}
    assert ladder[3] == {"dear": 1, "cheap": 2}
    state = AutoscaleState(0.0, (job("a", limit=12),), (dear, cheap))
    decision = autoscale(state)
    assert decision.desired == {"dear": 2, "cheap": 2}


def test_a_pool_without_nodes_holds_with_the_others() -> None:
    spare = NodePool("spare", max_nodes=2, cost_per_node_hour=100.0)
    state = AutoscaleState(0.0, (job("a", limit=3),), (POOL, spare), nodes(1, used=3))
    decision = autoscale(state)
    assert decision.desired == {"p": 1, "spare": 0}
    assert decision.reason.startswith("hold")


def test_the_throughput_rule_grows_where_the_goodput_rule_holds() -> None:
    early = (job("a", limit=64, noise=30.0, on=("p-0",) * 4),)
    fleet = nodes(1, used=4)
    goodput = decide(early, fleet)
    throughput = decide(early, fleet, rule=THROUGHPUT_RULE)
    assert goodput.pools["p"].desired < throughput.pools["p"].desired  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: NodePool(""), "pools[].name"),
        (lambda: NodePool("p", min_nodes=3, max_nodes=2), "pools[p].max_nodes"),
        (lambda: NodePool("p", cost_per_node_hour=-1), "pools[p].cost_per_node_hour"),
        (lambda: BandRule("r", Signal.GOODPUT, 0.4, 0.5), "rule.lower"),
        (
            lambda: autoscale(AutoscaleState(0, (), (POOL,), (NodeStatus("x", "q"),))),
            "nodes[x].pool",
        ),
        (lambda: autoscale(AutoscaleState(0, (), (POOL, POOL))), "pools"),
    ],
    ids=[
        "empty pool name",
        "min above max",
        "negative price",
        "lower above upper",
        "unknown pool",
        "duplicate pool",
    ],
)
def test_bad_inputs_name_their_field(build: object, field: str) -> None:
    with pytest.raises(AutoscaleInputError) as caught:
        build()  # type: ignore[operator]
    assert caught.value.field == field
