"""The loop's step state: batches → (backward) → step, in order, and each batch's loss weight."""

import pytest

pytest.importorskip("torch")

from pollux.train import BatchConfig, MicroBatchInfo, UsageError, plan_step
from pollux.train.step_state import StepState, loss_weight


def micro(index, count, *, available=1000, size=None):
    plan = plan_step(0, available, 2, 0, BatchConfig(local_bsz=4, accum_steps=count))
    size = size if size is not None else plan.slices[index][1]
    return MicroBatchInfo(0, 0, index, len(plan.slices), size, plan)


def test_a_regular_steps_batches_weigh_one_over_the_accumulation_steps():
    assert loss_weight(micro(0, 4)) == 0.25
    assert loss_weight(micro(0, 1)) == 1.0


def test_an_irregular_steps_batches_weigh_their_share_of_the_steps_samples():
    # 6 samples left for 2 replicas: this replica holds 3 of them, in one micro-batch.
    tail = micro(0, 2, available=6)
    assert not tail.regular
    assert loss_weight(tail) == pytest.approx(3 / 6)


def test_the_order_is_enforced_with_errors_that_say_what_to_do():
    state = StepState()
    with pytest.raises(UsageError, match=r"inside trainer\.batches"):
        state.check_backward()
    with pytest.raises(UsageError, match=r"inside trainer\.batches"):
        state.check_step()
    first = micro(0, 2)
    state.begin(first)
    with pytest.raises(UsageError, match="needs a loss"):
        state.check_step()
    assert state.check_backward() is first
    state.backward_done()
    with pytest.raises(UsageError, match="already called"):
        state.check_backward()
    with pytest.raises(UsageError, match="once for every batch"):
        state.check_stepped()
    assert state.check_step() is first
    state.check_stepped()  # the next batch may come
    with pytest.raises(UsageError, match="once per batch"):
        state.check_step()


def test_a_new_loop_owes_nothing_for_an_abandoned_batch():
    state = StepState()
    state.begin(micro(0, 2))
    state.restart()
    state.check_stepped()
    assert state.micro is None
