"""The replicas' checkpoint protocol on one process: periodic due dates, stop, failures."""

import signal

import pytest

torch = pytest.importorskip("torch")

import structlog  # noqa: E402

from pollux.train import CheckpointError, CheckpointManager, Preempted, StopSignal  # noqa: E402
from pollux.train.distributed import Replicas  # noqa: E402
from pollux.train.preemption import (  # noqa: E402
    PlannedStop,
    any_replica,
    load_agreed_checkpoint,
    periodic_checkpoint_due,
    preempt,
    save_periodic_checkpoint,
)

CPU = torch.device("cpu")
log = structlog.get_logger("test")


def test_periodic_checkpoints_fall_due_on_rank_zero_after_the_interval():
    due = {"interval_s": 10.0, "last_s": 100.0}
    assert periodic_checkpoint_due(rank=0, now_s=110.0, **due)
    assert not periodic_checkpoint_due(rank=0, now_s=109.9, **due)
    assert not periodic_checkpoint_due(rank=1, now_s=500.0, **due)
    assert not periodic_checkpoint_due(rank=0, interval_s=None, last_s=0.0, now_s=1e9)


def test_a_failed_periodic_checkpoint_is_logged_not_raised():
    def failing():
        raise CheckpointError("/ckpt", "disk full")

    with structlog.testing.capture_logs() as logs:
        save_periodic_checkpoint(failing, log)
    assert [e["event"] for e in logs] == ["periodic_checkpoint_failed"]


def test_one_replica_needs_no_collective_to_agree():
    assert any_replica(True, world_size=1, device=CPU)
    assert not any_replica(False, world_size=1, device=CPU)


def test_one_replica_resumes_from_its_own_view(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert load_agreed_checkpoint(manager, rank=0, world_size=1, log=log) is None
    manager.save({"meta": {"saved_at": 1.0}, "x": 3})
    state = load_agreed_checkpoint(manager, rank=0, world_size=1, log=log)
    assert state is not None
    assert state["x"] == 3
    off = CheckpointManager(None)
    assert load_agreed_checkpoint(off, rank=0, world_size=1, log=log) is None


def stop(save, closed, tmp_path):
    stop_signal = StopSignal()
    stop_signal.received = signal.SIGTERM
    preempt(
        save,
        lambda: closed.append(True),
        world_size=1,
        device=CPU,
        checkpoints=CheckpointManager(tmp_path),
        stop_signal=stop_signal,
        log=log,
        position={"epoch": 2, "position": 5, "progress": 1.5},
    )


def test_a_stop_checkpoints_closes_and_exits_with_143(tmp_path):
    closed = []
    with structlog.testing.capture_logs() as logs, pytest.raises(Preempted) as raised:
        stop(lambda: tmp_path / "checkpoint.pt", closed, tmp_path)
    assert raised.value.code == 143
    assert raised.value.checkpoint == str(tmp_path / "checkpoint.pt")
    assert closed == [True]
    (event,) = [e for e in logs if e["event"] == "preempted"]
    assert (event["signal"], event["epoch"], event["position"]) == ("SIGTERM", 2, 5)


def test_a_stop_whose_checkpoint_fails_closes_and_raises_the_failure(tmp_path):
    def failing():
        raise CheckpointError("/ckpt", "disk full")

    closed = []
    with pytest.raises(CheckpointError, match="disk full"):
        stop(failing, closed, tmp_path)
    assert closed == [True]


def planned_stop(tmp_path, saved, closed):
    replicas = Replicas(0, 1, 1, CPU, CPU)
    return PlannedStop(
        replicas,
        CheckpointManager(tmp_path),
        save=lambda: saved.append(True) or tmp_path / "checkpoint.pt",
        close=lambda: closed.append(True),
        position=lambda: {"epoch": 1, "position": 0, "progress": 2.0},
        log=log,
    )


def test_a_planned_stop_does_nothing_until_requested_then_checkpoints_and_exits(tmp_path):
    saved, closed = [], []
    stop_ = planned_stop(tmp_path, saved, closed)
    stop_.check()
    assert saved == []
    stop_.signal.request()
    with pytest.raises(Preempted):
        stop_.check()
    assert saved == [True]
    assert closed == [True]


def test_a_stop_agreed_elsewhere_is_dated_here_for_the_next_allocation(tmp_path):
    stop_ = planned_stop(tmp_path, [], [])
    assert stop_.signal.requested_at is None
    with pytest.raises(Preempted):
        stop_.stop()  # the replicas agreed on another replica's request
    assert stop_.signal.requested_at is not None


def test_the_rescale_pause_runs_from_the_previous_request_and_is_never_negative(tmp_path):
    stop_ = planned_stop(tmp_path, [], [])
    assert stop_.rescale_pause_s(100.0) is None  # a fresh start paid no rescale
    stop_.previous_request = 90.0
    with structlog.testing.capture_logs() as logs:
        assert stop_.rescale_pause_s(100.0) == 10.0
    assert [e["event"] for e in logs] == ["rescale_pause"]
    assert stop_.rescale_pause_s(80.0) == 0.0  # clocks of two nodes disagree


def test_the_handler_is_installed_only_when_wanted_and_removed_again(tmp_path):
    stop_ = planned_stop(tmp_path, [], [])
    before = signal.getsignal(signal.SIGTERM)
    stop_.install(False)
    assert signal.getsignal(signal.SIGTERM) == before
    stop_.install(True)
    assert signal.getsignal(signal.SIGTERM) != before
    stop_.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before
