"""The measurement schedule: intervals in M0-batches, who measures, pairs and agrees, and when."""

import pytest

pytest.importorskip("torch")  # pollux.train imports torch; the schedule itself is pure

from hypothesis import given
from hypothesis import strategies as st

from pollux.train.schedule import (
    MAX_AGREEMENT_STEPS,
    interval_steps,
    next_agreement_in,
    step_duties,
)


def duties(step, interval=4, world_size=1, accum_steps=1, regular=True, until_agreement=5):
    return step_duties(
        step=step,
        interval=interval,
        world_size=world_size,
        accum_steps=accum_steps,
        regular=regular,
        until_agreement=until_agreement,
    )


def test_the_interval_counts_m0_batches_of_samples():
    assert interval_steps(stats_interval=8, init_batch_size=16, total_batch_size=16) == 8
    assert interval_steps(stats_interval=8, init_batch_size=16, total_batch_size=64) == 2
    assert interval_steps(stats_interval=4, init_batch_size=8, total_batch_size=16) == 2
    # A batch far above M0 measures every step, never every zeroth.
    assert interval_steps(stats_interval=1, init_batch_size=16, total_batch_size=4096) == 1


@given(st.integers(1, 64), st.integers(1, 4096), st.integers(1, 1 << 20))
def test_the_interval_is_at_least_one_and_shrinks_as_the_batch_grows(stats, m0, total):
    here = interval_steps(stats_interval=stats, init_batch_size=m0, total_batch_size=total)
    larger = interval_steps(stats_interval=stats, init_batch_size=m0, total_batch_size=2 * total)
    assert 1 <= larger <= here


def test_one_replica_without_accumulation_stores_then_pairs_the_next_step():
    seen = [duties(step) for step in range(8)]
    assert [d.measure for d in seen] == [True, False, False, False] * 2
    assert [d.pair for d in seen] == [False, True, False, False] * 2
    assert not any(d.agree or d.per_micro or d.collect for d in seen)
    # Measuring every step, each step both stores and pairs with the previous one.
    assert all(d.measure and d.pair for d in (duties(s, interval=1) for s in range(3)))


def test_one_replica_with_accumulation_collects_micro_batches_on_measured_steps():
    seen = [duties(step, accum_steps=3) for step in range(4)]
    assert [d.collect for d in seen] == [True, False, False, False]
    assert all(d.per_micro and not d.pair and not d.agree for d in seen)


def test_several_replicas_agree_on_measured_steps_and_when_the_leader_said_so():
    seen = [duties(step, world_size=2) for step in range(4)]
    assert [d.agree for d in seen] == [True, False, False, False]
    assert [d.collect for d in seen] == [True, False, False, False]
    assert all(d.per_micro and not d.pair for d in seen)
    scheduled = duties(2, world_size=2, until_agreement=1)
    assert scheduled.agree
    assert not scheduled.measure
    assert not scheduled.collect


def test_an_irregular_step_measures_but_collects_nothing():
    tail = duties(0, world_size=2, regular=False)
    assert tail.measure
    assert tail.agree
    assert not tail.collect


@given(
    step=st.integers(0, 10_000),
    interval=st.integers(1, 64),
    world_size=st.integers(1, 64),
    accum_steps=st.integers(1, 8),
    regular=st.booleans(),
    until=st.integers(-3, 100),
)
def test_duties_are_consistent(step, interval, world_size, accum_steps, regular, until):
    d = duties(step, interval, world_size, accum_steps, regular, until)
    assert d.interval == interval
    assert d.measure == (step % interval == 0)
    assert d.collect == (regular and d.per_micro and d.measure)
    assert d.per_micro == (world_size > 1 or accum_steps > 1)
    if world_size > 1:
        assert not d.pair
        assert d.agree == (d.measure or until <= 1)
    else:
        assert not d.agree
        assert not d.pair or accum_steps == 1


def test_the_leader_schedules_agreements_about_a_period_apart():
    # 0.1 s per step over the last 4 steps (3 since the agreement, plus this one).
    assert next_agreement_in(elapsed_s=0.4, steps_since_agreement=3, agreement_period_s=1.0) == 10
    # Slow steps agree every step; fast ones are capped.
    assert next_agreement_in(elapsed_s=5.0, steps_since_agreement=0, agreement_period_s=1.0) == 1
    assert (
        next_agreement_in(elapsed_s=0.0, steps_since_agreement=0, agreement_period_s=1.0)
        == MAX_AGREEMENT_STEPS
    )
    assert (
        next_agreement_in(elapsed_s=1e-12, steps_since_agreement=0, agreement_period_s=1e6)
        == MAX_AGREEMENT_STEPS
    )
    assert next_agreement_in(elapsed_s=1.0, steps_since_agreement=0, agreement_period_s=0.0) == 1


@given(
    st.floats(0, 1e6, allow_nan=False),
    st.integers(0, 10**6),
    st.floats(0, 1e6, allow_nan=False),
)
def test_the_agreement_schedule_stays_within_bounds(elapsed, steps, period):
    chosen = next_agreement_in(
        elapsed_s=elapsed, steps_since_agreement=steps, agreement_period_s=period
    )
    assert 1 <= chosen <= MAX_AGREEMENT_STEPS
    assert float(chosen) == chosen  # exact in the float64 agreement buffer
