"""The job's declared size, and the work it has left in M0-steps (what the scheduler plans by).

A job declares its size as epochs (`ElasticTrainer.epochs` does), samples or progress; the
work left is reported in progress units, optimizer steps of the initial batch M0. A budget of
samples converts at the current batch: one optimizer step of M samples adds the AdaScale gain
r to progress, so R samples left are R·r/M M0-steps. Pure arithmetic over the loop's counters.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

from pollux.train.data import AdaptiveDataLoader
from pollux.train.errors import InvalidValueError
from pollux.train.scaling import ScaledOptimizer


class SizeUnit(enum.Enum):
    """What a declared size counts."""

    EPOCHS = "epochs"
    """Passes over the dataset (map-style datasets only: an iterable one has no length)."""
    SAMPLES = "samples"
    """Training samples of all replicas together, since the job began."""
    PROGRESS = "progress"
    """Optimizer steps of the initial batch M0 (`ElasticTrainer.progress`)."""


@dataclass(frozen=True, slots=True)
class DeclaredSize:
    """A job's declared size.

    Attributes:
        unit: What `total` counts.
        total: The job's whole size in that unit (finite, ≥ 0).
    """

    unit: SizeUnit
    total: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.total) and self.total >= 0):
            raise InvalidValueError(self.unit.value, f"must be finite and ≥ 0, got {self.total}")

    @classmethod
    def of(cls, *, samples: int | None = None, progress: float | None = None) -> DeclaredSize:
        """A budget of `samples` or of `progress`: exactly one of them.

        Raises:
            InvalidValueError: Neither or both given, or a negative or non-finite budget.
        """
        if (samples is None) == (progress is None):
            raise InvalidValueError("declare_total", "give exactly one of samples or progress")
        if samples is not None:
            return cls(SizeUnit.SAMPLES, float(samples))
        assert progress is not None
        return cls(SizeUnit.PROGRESS, float(progress))


class LoopPosition(NamedTuple):
    """The loop's counters that the work left is computed from.

    (A named tuple: one is made per optimizer step, on the training loop's critical path.)

    Attributes:
        progress: M0-steps so far.
        epoch: Completed epochs.
        position: Samples of the current epoch consumed.
        dataset_len: Samples per epoch, or None for an iterable dataset.
        samples_total: Samples consumed since the job began.
        gain: The AdaScale gain r of the latest optimizer step.
        total_batch_size: M of a regular optimizer step.
    """

    progress: float
    epoch: int
    position: int
    dataset_len: int | None
    samples_total: int
    gain: float
    total_batch_size: int

    @classmethod
    def of(cls, loader: AdaptiveDataLoader, scaling: ScaledOptimizer) -> LoopPosition:
        """Where a loop over `loader`, stepping with `scaling`, stands now."""
        return cls(
            scaling.progress,
            loader.epoch,
            loader.position,
            loader.dataset_len,
            loader.samples_total,
            scaling.last_gain,
            loader.batch_config.total(loader.num_replicas),
        )

    def for_log(self) -> dict[str, float | int]:
        """Where training stands, as log fields."""
        return {"epoch": self.epoch, "position": self.position, "progress": round(self.progress, 3)}


def remaining_work(size: DeclaredSize | None, at: LoopPosition) -> float | None:
    """Declared work left at `at`, in M0-steps; None when nothing (computable) is declared."""
    if size is None:
        return None
    if size.unit is SizeUnit.PROGRESS:
        return max(0.0, size.total - at.progress)
    if size.unit is SizeUnit.EPOCHS:
        if at.dataset_len is None:
            return None
        done = at.epoch * at.dataset_len + at.position
        total = size.total * at.dataset_len
    else:
        done, total = at.samples_total, size.total
    left = max(0.0, total - done)
    return left * at.gain / max(at.total_batch_size, 1)
