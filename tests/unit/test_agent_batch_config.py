"""Batch configurations: the initial split, the limits, predicted speedup and hysteresis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.agent.batch_config import BatchConfigError, choose
from pollux.agent.profile import goodput_model, perf_to_pb
from pollux.goodput import PerfParams, goodput
from pollux.v1 import types_pb2 as pb

PERF = PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0)
LIMITS = pb.BatchLimits(
    initial_batch_size=128, max_batch_size=4096, min_local_batch_size=16, max_local_batch_size=256
)


def fitted(limits: pb.BatchLimits = LIMITS, sqr: float = 1.0, var: float = 20.0) -> pb.JobModel:
    return pb.JobModel(
        job_id="j-1", throughput=perf_to_pb(PERF), grad_sqr=sqr, grad_var=var, batch=limits
    )


def batch(local: int, accum: int, replicas: int) -> pb.BatchConfig:
    return pb.BatchConfig(
        local_batch_size=local, accum_steps=accum, total_batch_size=local * accum * replicas
    )


def predicted(config: pb.BatchConfig, nodes: int, replicas: int) -> float:
    gm = goodput_model(fitted(), LIMITS)
    return float(goodput(gm, nodes, replicas, config.local_batch_size, config.accum_steps - 1))


# -- before the first fit: the initial batch split over the replicas ---------------------------


@pytest.mark.parametrize(
    ("limits", "replicas", "want"),
    [
        (pb.BatchLimits(initial_batch_size=128), 1, (128, 1)),
        (pb.BatchLimits(initial_batch_size=128, max_batch_size=512), 3, (43, 1)),
        (pb.BatchLimits(initial_batch_size=128), 3, (42, 1)),
        (pb.BatchLimits(initial_batch_size=1024, max_local_batch_size=128), 2, (128, 4)),
        (
            pb.BatchLimits(initial_batch_size=64, max_batch_size=512, min_local_batch_size=16),
            8,
            (16, 1),
        ),
    ],
    ids=[
        "one replica takes the whole initial batch",
        "rounded up when the maximum allows",
        "rounded down rather than exceed a fixed batch",
        "accumulation when a replica cannot hold its share",
        "small shares raised to the minimum local batch",
    ],
)
def test_before_a_fit_the_initial_batch_is_split(limits, replicas, want):
    config = choose(limits, None, 1, replicas, last=None, hysteresis=0.05)
    assert (config.local_batch_size, config.accum_steps) == want
    assert config.total_batch_size == want[0] * want[1] * replicas
    assert config.predicted_speedup == 0.0


def test_fewer_micro_batches_when_rounding_down_would_break_the_minimum_local_batch():
    # ceil(100 / 4) = 25 a replica needs 2 micro-batches of ≤ 20, and 100 // 8 = 12 < 15 fits
    # no local batch; one micro-batch of 20 on each replica (80 in all) is within the limits.
    limits = pb.BatchLimits(
        initial_batch_size=100, max_batch_size=100, min_local_batch_size=15, max_local_batch_size=20
    )
    config = choose(limits, None, 1, 4, last=None, hysteresis=0.05)
    assert (config.local_batch_size, config.accum_steps, config.total_batch_size) == (20, 1, 80)


@settings(max_examples=300, deadline=None)
@given(
    m0=st.integers(1, 4096),
    extra=st.integers(0, 8192),
    low=st.integers(1, 256),
    span=st.integers(0, 512),
    data=st.data(),
)
def test_every_replica_count_the_scheduler_may_give_a_new_job_has_a_split(
    m0: int, extra: int, low: int, span: int, data: st.DataObject
) -> None:
    top = m0 + extra
    low = min(low, top)
    limits = pb.BatchLimits(
        initial_batch_size=m0,
        max_batch_size=top,
        min_local_batch_size=low,
        max_local_batch_size=min(low + span, top),
    )
    # cycle._job_info: a job may get at most max_batch // min_local replicas.
    replicas = data.draw(st.integers(1, max(1, top // low)))
    config = choose(limits, None, 1, replicas, last=None, hysteresis=0.05)
    assert low <= config.local_batch_size <= limits.max_local_batch_size
    assert config.accum_steps >= 1
    assert config.total_batch_size == config.local_batch_size * config.accum_steps * replicas
    assert config.total_batch_size <= top


def test_a_model_without_throughput_parameters_still_uses_the_initial_split():
    model = pb.JobModel(job_id="j-1", grad_sqr=1, grad_var=1, batch=LIMITS)
    assert choose(LIMITS, model, 2, 4, last=None, hysteresis=0.05) == batch(32, 1, 4)


def test_too_many_replicas_for_the_maximum_batch_is_an_error():
    limits = pb.BatchLimits(initial_batch_size=64, max_batch_size=128, min_local_batch_size=32)
    with pytest.raises(BatchConfigError, match="fewer replicas"):
        choose(limits, None, 1, 8, last=None, hysteresis=0.05)
    with pytest.raises(BatchConfigError):
        choose(limits, fitted(limits), 1, 8, last=None, hysteresis=0.05)


# -- after a fit: the goodput-maximising batch within the limits -------------------------------


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 8),
    extra=st.integers(0, 24),
    m0=st.sampled_from([32, 128, 512]),
    top_factor=st.sampled_from([1, 4, 32]),
    max_local=st.sampled_from([0, 64, 256]),
)
def test_fitted_choices_stay_within_every_limit(nodes, extra, m0, top_factor, max_local):
    limits = pb.BatchLimits(
        initial_batch_size=m0, max_batch_size=m0 * top_factor, max_local_batch_size=max_local
    )
    replicas = nodes + extra
    try:
        config = choose(limits, fitted(limits), nodes, replicas, last=None, hysteresis=0.05)
    except BatchConfigError:
        assert replicas > m0 * top_factor  # only when one sample per replica is too many
        return
    assert 1 <= config.local_batch_size <= (max_local or m0 * top_factor)
    assert config.accum_steps >= 1
    assert config.total_batch_size == config.local_batch_size * config.accum_steps * replicas
    assert config.total_batch_size <= m0 * top_factor
    assert config.predicted_speedup > 0


def test_speedup_is_relative_to_one_replica_at_the_initial_batch():
    one = choose(LIMITS, fitted(), 1, 1, last=None, hysteresis=0.05)
    eight = choose(LIMITS, fitted(), 2, 8, last=None, hysteresis=0.05)
    baseline = predicted(batch(128, 1, 1), 1, 1)
    assert one.predicted_speedup == pytest.approx(predicted(one, 1, 1) / baseline)
    assert one.predicted_speedup >= 1.0 - 1e-9  # the initial batch is one of the candidates
    assert eight.predicted_speedup > one.predicted_speedup


# -- hysteresis --------------------------------------------------------------------------------


def near_best(nodes: int, replicas: int, lower: float, upper: float) -> pb.BatchConfig:
    """A legal configuration whose predicted goodput is within (lower, upper) of the best."""
    best = choose(LIMITS, fitted(), nodes, replicas, last=None, hysteresis=0.0)
    top = predicted(best, nodes, replicas)
    for local in range(16, 257):
        candidate = batch(local, best.accum_steps, replicas)
        if candidate.total_batch_size <= 4096 and (
            lower < predicted(candidate, nodes, replicas) / top < upper
        ):
            return candidate
    raise AssertionError("no configuration in range")


def test_a_previous_choice_within_the_threshold_is_kept():
    last = near_best(1, 4, 0.96, 0.99)
    config = choose(LIMITS, fitted(), 1, 4, last=last, hysteresis=0.05)
    assert (config.local_batch_size, config.accum_steps) == (
        last.local_batch_size,
        last.accum_steps,
    )
    assert config.predicted_speedup == pytest.approx(
        predicted(last, 1, 4) / predicted(batch(128, 1, 1), 1, 1)
    )


def test_a_previous_choice_far_from_the_best_is_replaced():
    last = near_best(1, 4, 0.5, 0.9)
    best = choose(LIMITS, fitted(), 1, 4, last=None, hysteresis=0.05)
    assert choose(LIMITS, fitted(), 1, 4, last=last, hysteresis=0.05) == best


def test_zero_hysteresis_always_takes_the_best():
    last = near_best(1, 4, 0.96, 0.99)
    best = choose(LIMITS, fitted(), 1, 4, last=None, hysteresis=0.0)
    assert choose(LIMITS, fitted(), 1, 4, last=last, hysteresis=0.0) == best


@pytest.mark.parametrize(
    "last",
    [batch(512, 1, 4), batch(8, 1, 4), batch(256, 8, 4), pb.BatchConfig(local_batch_size=64)],
    ids=["above max local", "below min local", "above max batch", "total of another shape"],
)
def test_a_previous_choice_outside_the_limits_is_ignored(last):
    best = choose(LIMITS, fitted(), 1, 4, last=None, hysteresis=0.05)
    assert choose(LIMITS, fitted(), 1, 4, last=last, hysteresis=1.0 - 1e-9) == best
