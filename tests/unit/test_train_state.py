"""The trainer's checkpoints alone: what is saved, when, and what a restart resumes from."""

import pytest

torch = pytest.importorskip("torch")

import structlog  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from pollux.train import (  # noqa: E402
    AdaptiveDataLoader,
    BatchConfig,
    CheckpointConfig,
    CheckpointError,
    GradientNoiseScale,
    InvalidValueError,
    ScaledOptimizer,
    StepProfile,
    TrainEnv,
)
from pollux.train.amp import MixedPrecision  # noqa: E402
from pollux.train.distributed import Replicas  # noqa: E402
from pollux.train.state import TrainerCheckpoints, TrainingParts  # noqa: E402

LOG = structlog.get_logger("test")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Counter:
    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": torch.tensor(self.value)}

    def load_state_dict(self, state):
        self.value = int(state["value"])


def parts(seed=0, world_size=1):
    torch.manual_seed(seed)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
    loader = AdaptiveDataLoader(data, BatchConfig(4), num_replicas=world_size)
    return TrainingParts(
        model,
        opt,
        MixedPrecision(None),
        loader,
        ScaledOptimizer(opt, "adascale"),
        GradientNoiseScale(1),
        StepProfile(),
    )


def checkpoints(directory, held, *, world_size=1, clock=None, extra=None, **config):
    replicas = Replicas(0, world_size, 1, torch.device("cpu"), torch.device("cpu"))
    return TrainerCheckpoints(
        CheckpointConfig(directory=directory, **config),
        TrainEnv(job_id="j"),
        replicas,
        held,
        extra=extra,
        log=LOG,
        clock=clock or Clock(),
    )


def test_a_saved_state_resumes_the_parts_and_the_objects_registered_before_or_after(tmp_path):
    first = parts(seed=0)
    first.profile.record((1, 1, 4, 1), [], 0.5)
    saving = checkpoints(tmp_path, first, extra={"early": Counter(3)})
    saving.register("late", Counter(4))
    path = saving.save(lambda: saving.state(8, stop_requested_at=123.0))
    assert path is not None

    second = parts(seed=1)
    early, late = Counter(), Counter()
    loading = checkpoints(tmp_path, second, extra={"early": early})
    resumed = loading.resume(8)
    assert resumed is not None
    assert resumed.stop_requested_at == 123.0
    assert resumed.batch_config == BatchConfig(4)  # as many replicas as before
    assert resumed.meta["job_id"] == "j"
    for a, b in zip(first.module.parameters(), second.module.parameters(), strict=True):
        assert torch.equal(a, b)
    assert second.profile.observations() == first.profile.observations()
    assert early.value == 3
    loading.register("late", late)  # restored when registered
    assert late.value == 4


def test_another_replica_count_resumes_without_the_old_batch_config(tmp_path):
    saving = checkpoints(tmp_path, parts(world_size=2), world_size=2)  # rank 0 of 2 writes
    saving.save(lambda: saving.state(8, None))
    resumed = checkpoints(tmp_path, parts()).resume(8)
    assert resumed is not None
    assert resumed.batch_config is None
    assert resumed.stop_requested_at is None


def test_a_checkpoint_of_another_m0_is_refused_and_none_is_a_fresh_start(tmp_path):
    assert checkpoints(tmp_path, parts()).resume(8) is None
    saving = checkpoints(tmp_path, parts())
    saving.save(lambda: saving.state(8, None))
    with pytest.raises(InvalidValueError, match="M0=8"):
        checkpoints(tmp_path, parts()).resume(16)


def test_names_are_registered_once_and_unloadable_state_is_refused_before_writing(tmp_path):
    store = checkpoints(tmp_path, parts())
    store.register("a", Counter())
    with pytest.raises(InvalidValueError, match="already registered"):
        store.register("a", Counter())

    class Unloadable:
        def state_dict(self):
            return {"x": object()}

        def load_state_dict(self, state):
            pass

    store.register("bad", Unloadable())
    with pytest.raises(CheckpointError, match="extra state 'bad'"):
        store.save(lambda: store.state(8, None))
    assert not any(tmp_path.iterdir())


def test_the_periodic_checkpoint_falls_due_after_the_interval_since_the_last_save(tmp_path):
    clock = Clock()
    store = checkpoints(tmp_path, parts(), clock=clock, interval_s=10.0)
    calls = []

    def state():
        calls.append(clock.now)
        return store.state(8, None)

    store.save_if_due(state)
    clock.now = 9.9
    store.save_if_due(state)
    clock.now = 10.0
    store.save_if_due(state)
    clock.now = 15.0
    store.save(state)  # any save restarts the interval
    clock.now = 24.0
    store.save_if_due(state)
    assert calls == [10.0, 15.0]


def test_checkpoints_off_write_nothing(tmp_path):
    store = checkpoints(tmp_path, parts(), enabled=False)
    assert store.save(lambda: store.state(8, None)) is None
    assert store.resume(8) is None
    assert not any(tmp_path.iterdir())
