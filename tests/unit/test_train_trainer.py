"""ElasticTrainer on one process: argument checks, agent wiring, and checkpoints that fail."""

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from pollux.train import (  # noqa: E402
    BatchConfig,
    CheckpointError,
    ElasticTrainer,
    FixedBatchConfig,
    InMemorySink,
    InvalidValueError,
    ScalingRule,
    TrainEnv,
)


def data(samples=64):
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(samples, 4, generator=gen), torch.randn(samples, 1, generator=gen)
    )


def trainer(tmp_path=None, **kwargs):
    model = nn.Linear(4, 1)
    kwargs.setdefault("handle_sigterm", False)
    kwargs.setdefault("checkpoint_dir", tmp_path)
    kwargs.setdefault("checkpointing", tmp_path is not None)
    return ElasticTrainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), data(), init_batch_size=8, **kwargs
    )


def train_steps(t, steps):
    for x, y in t.batches():
        t.step(nn.functional.mse_loss(t.model(x), y))
        if t.steps >= steps:
            return


class NumpyState:
    """A user object whose state holds numpy arrays, which weights-only loads refuse."""

    def state_dict(self):
        return {"rng": np.random.default_rng(0).bit_generator.state, "v": np.zeros(3)}

    def load_state_dict(self, state):
        pass


class TensorState:
    def __init__(self):
        self.value = torch.zeros(2)

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def test_scaling_rule_must_be_a_name_not_none():
    with pytest.raises(InvalidValueError, match="scaling_rule"):
        ScalingRule.parse(None)
    assert ScalingRule.parse(" AdaScale ") is ScalingRule.ADASCALE


def test_a_bad_report_interval_is_refused_on_every_replica_even_without_a_sink():
    with pytest.raises(InvalidValueError, match="report_interval_s"):
        trainer(report_interval_s=0)


def test_state_that_could_not_be_loaded_back_is_refused_before_anything_is_written(tmp_path):
    t = trainer(tmp_path, extra_state={"numpy": NumpyState()})
    train_steps(t, 1)
    with pytest.raises(CheckpointError, match="extra state 'numpy'"):
        t.save()
    assert not any(tmp_path.iterdir())  # the previous (no) checkpoint is untouched
    t.close()


def test_registered_tensor_state_round_trips(tmp_path):
    first = trainer(tmp_path, extra_state={"ema": TensorState()})
    first._checkpoints.extra["ema"].value = torch.tensor([1.0, 2.0])
    train_steps(first, 2)
    first.save()
    first.close()
    state = TensorState()
    second = trainer(tmp_path, extra_state={"ema": state})
    assert torch.equal(state.value, torch.tensor([1.0, 2.0]))
    assert second.steps == 2
    second.close()


def test_a_stop_whose_checkpoint_fails_raises_the_checkpoint_error_not_preempted(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    t = trainer(tmp_path, checkpoint_dir=blocker)
    t.stop_signal.request()
    with pytest.raises(CheckpointError):
        train_steps(t, 1)


def test_a_periodic_checkpoint_that_fails_is_logged_and_training_goes_on(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    t = trainer(tmp_path, checkpoint_dir=blocker, checkpoint_interval_s=1e-9)
    train_steps(t, 3)
    assert t.steps == 3
    t.close()


def test_periodic_checkpoints_are_on_by_default_every_few_minutes(tmp_path):
    t = trainer(tmp_path)
    assert t.checkpoint_interval_s is not None
    assert 60 <= t.checkpoint_interval_s <= 600
    t.close()
    off = trainer(tmp_path, checkpoint_interval_s=None)
    assert off.checkpoint_interval_s is None
    off.close()


def test_the_agent_fills_only_what_the_caller_left_unset():
    env = TrainEnv(agent_addr="127.0.0.1:9")  # nothing listens: the link never blocks training
    fixed = FixedBatchConfig(BatchConfig(local_bsz=4))
    with_source = trainer(env=env, batch_source=fixed)
    assert with_source.batch_source is fixed
    assert with_source.reporter is not None  # metrics still go to the agent
    with_source.close()
    sink = InMemorySink()
    with_sink = trainer(env=env, metrics_sink=sink)
    assert with_sink.batch_source is not None
    assert with_sink.batch_source is not fixed
    assert with_sink.reporter is not None
    assert with_sink.reporter.sink is sink
    with_sink.close()
    neither = trainer(env=env, connect_agent=False)
    assert neither.batch_source is None
    assert neither.reporter is None
    neither.close()


def test_the_next_allocation_measures_its_rescale_pause_from_the_stop_request(tmp_path):
    from pollux.train import Preempted

    first = trainer(tmp_path)
    train_steps(first, 2)
    first.stop_signal.request()
    asked = first.stop_signal.requested_at
    assert asked is not None
    with pytest.raises(Preempted):
        train_steps(first, 3)
    assert first.rescale_pause_s is None  # a fresh start pays no rescale pause
    second = trainer(tmp_path)
    assert second.rescale_pause_s is None  # measured at the first step, not at the restore
    time_before_step = time.time()
    train_steps(second, first.steps + 1)
    assert second.rescale_pause_s is not None
    assert time_before_step - asked <= second.rescale_pause_s <= time.time() - asked
    second.close()


def test_a_restart_after_a_periodic_checkpoint_measures_no_pause(tmp_path):
    first = trainer(tmp_path)
    train_steps(first, 2)
    first.save()  # a crash after this: no stop was requested, so no pause is known
    first.close()
    second = trainer(tmp_path)
    train_steps(second, 3)
    assert second.steps == 3
    assert second.rescale_pause_s is None
    second.close()


def test_epochs_declare_the_job_size_and_reports_carry_the_work_left():
    # 64 samples, M0 = 8: one epoch is 8 steps of M0. Before any gain is measured, a step adds
    # gain 1 at M = M0, so the work left is (samples left) / M0 in M0-steps.
    sink = InMemorySink()
    t = trainer(
        metrics_sink=sink, connect_agent=False, batch_source=FixedBatchConfig(BatchConfig(8))
    )
    assert t.remaining_work is None  # nothing declared yet
    epochs = t.epochs(3)
    next(epochs)
    assert t.remaining_work == pytest.approx(3 * 64 / 8)
    train_steps(t, 5)
    assert t.steps == 5
    left = t.remaining_work
    assert left is not None
    assert left == pytest.approx((3 * 64 - 5 * 8) * t.scaling.last_gain / 8)
    t.reporter.flush()
    work = [b.work for b in sink.batches if b.work is not None]
    assert work
    assert work[-1].progress == pytest.approx(t.progress)
    assert work[-1].remaining == pytest.approx(left)
    assert work[-1].rescale_pause_s is None
    t.close()


def test_a_declared_budget_counts_down_and_bad_budgets_are_refused():
    t = trainer(connect_agent=False)
    t.declare_total(progress=10.0)
    train_steps(t, 3)
    assert t.remaining_work == pytest.approx(10.0 - t.progress)
    t.declare_total(samples=100)
    assert t.remaining_work == pytest.approx(
        (100 - t.loader.samples_total) * t.scaling.last_gain / t.total_batch_size
    )
    for bad in ({}, {"samples": 1, "progress": 1.0}, {"samples": -1}, {"progress": float("nan")}):
        with pytest.raises(InvalidValueError):
            t.declare_total(**bad)
    t.close()


def test_logged_values_go_to_the_agent_with_the_next_report_latest_of_each():
    sink = InMemorySink()
    t = trainer(
        metrics_sink=sink, connect_agent=False, batch_source=FixedBatchConfig(BatchConfig(8))
    )
    train_steps(t, 2)
    t.log(loss=torch.tensor(0.5), accuracy=0.25)
    t.log(loss=0.125)  # a later value replaces the earlier; other names stay
    t.reporter.flush()
    logged = [dict(b.user_metrics) for b in sink.batches if b.user_metrics]
    assert logged[-1] == {"loss": 0.125, "accuracy": 0.25}
    t.close()


@pytest.mark.parametrize(
    ("values", "field"),
    [({"loss": float("nan")}, "log[loss]"), ({"1st": 1.0}, "log[1st]")],
)
def test_values_the_agent_would_refuse_are_refused_when_logged(values, field):
    t = trainer(connect_agent=False)
    with pytest.raises(InvalidValueError, match=r"finite|a name is a letter") as refused:
        t.log(**values)
    assert refused.value.field == field
    t.close()
