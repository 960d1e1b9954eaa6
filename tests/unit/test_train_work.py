"""The declared size and the work left, in M0-steps."""

import math

import pytest

pytest.importorskip("torch")

from pollux.train import InvalidValueError
from pollux.train.work import DeclaredSize, LoopPosition, SizeUnit, remaining_work


def at(**changes):
    values = {
        "progress": 10.0,
        "epoch": 1,
        "position": 20,
        "dataset_len": 100,
        "samples_total": 120,
        "gain": 2.0,
        "total_batch_size": 40,
    }
    return LoopPosition(**{**values, **changes})


def test_progress_left_is_the_budget_less_the_progress():
    assert remaining_work(DeclaredSize(SizeUnit.PROGRESS, 25.0), at()) == 15.0
    assert remaining_work(DeclaredSize(SizeUnit.PROGRESS, 5.0), at()) == 0.0


def test_samples_and_epochs_left_convert_at_the_current_batch_and_gain():
    # 3 epochs of 100: 300 − (1·100 + 20) = 180 samples left, 180 · 2 / 40 = 9 M0-steps.
    assert remaining_work(DeclaredSize(SizeUnit.EPOCHS, 3), at()) == pytest.approx(9.0)
    assert remaining_work(DeclaredSize(SizeUnit.SAMPLES, 200), at()) == pytest.approx(4.0)
    # An iterable dataset has no length: epochs left are unknown.
    assert remaining_work(DeclaredSize(SizeUnit.EPOCHS, 3), at(dataset_len=None)) is None
    assert remaining_work(None, at()) is None


def test_a_budget_is_exactly_one_finite_non_negative_amount():
    assert DeclaredSize.of(samples=5) == DeclaredSize(SizeUnit.SAMPLES, 5.0)
    assert DeclaredSize.of(progress=2.5) == DeclaredSize(SizeUnit.PROGRESS, 2.5)
    for bad in ({}, {"samples": 1, "progress": 1.0}):
        with pytest.raises(InvalidValueError, match="exactly one"):
            DeclaredSize.of(**bad)
    with pytest.raises(InvalidValueError, match="samples"):
        DeclaredSize.of(samples=-1)
    with pytest.raises(InvalidValueError, match="progress"):
        DeclaredSize.of(progress=math.inf)


def test_the_position_logs_what_a_stop_needs():
    assert at().for_log() == {"epoch": 1, "position": 20, "progress": 10.0}
