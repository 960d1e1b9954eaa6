"""Timing the micro-batches of each optimizer step for the job's throughput model.

A micro-batch is timed from the moment the loader hands it out to the moment the loop asks
for the next one, so data loading is excluded and the user's forward, backward and optimizer
step are included. With several replicas the step's last micro-batch also marks its exposed
synchronisation: from the last local gradient to the end of the backward pass. The first steps
after a start or a configuration change are warm-up and not recorded. Marks become times in a
`StepProfile` once the device has completed them (`pollux.train.metrics`).
"""

from __future__ import annotations

import torch

from pollux.train.data import MicroBatchInfo
from pollux.train.errors import InvalidValueError
from pollux.train.metrics import Mark, StepClock, StepProfile, StepRecorder


class StepTimer:
    """Marks each micro-batch of a step and records finished steps into a profile.

    Args:
        device: The training device (CUDA events there, the wall clock elsewhere).
        profile: Where finished steps are recorded.
        num_nodes: Nodes N of the allocation (part of every record's configuration).
        num_replicas: Replicas K.
        warmup_steps: Optimizer steps not recorded after a start or `restart_warmup`.
    """

    def __init__(
        self,
        device: torch.device,
        profile: StepProfile,
        *,
        num_nodes: int,
        num_replicas: int,
        warmup_steps: int,
    ) -> None:
        if warmup_steps < 0:
            raise InvalidValueError("profile_warmup_steps", "must be ≥ 0")
        self._clock = StepClock(device)
        self._recorder = StepRecorder(self._clock, profile)
        self.num_nodes = num_nodes
        self.num_replicas = num_replicas
        self.warmup_steps = warmup_steps
        self._warmup_left = warmup_steps
        self._accum: list[tuple[Mark, Mark]] = []
        self._stamp = False
        self._last_grad: Mark | None = None
        self._backward_end: Mark | None = None

    def begin_step(self) -> None:
        """A new optimizer step begins."""
        self._accum = []

    def begin_micro(self, info: MicroBatchInfo) -> None:
        """A micro-batch begins; the synchronising one of a regular step marks its sync."""
        self._stamp = self.num_replicas > 1 and info.regular and info.is_last
        self._last_grad = None
        self._backward_end = None

    def mark(self) -> Mark:
        """The current moment of the training stream."""
        return self._clock.mark()

    def on_grad(self) -> None:
        """A local gradient is ready (called from the gradient hooks)."""
        if self._stamp:
            self._last_grad = self._clock.restamp(self._last_grad)

    def backward_done(self) -> None:
        """The micro-batch's backward pass returned."""
        if self._stamp:
            self._backward_end = self._clock.mark()
            self._stamp = False

    def end_micro(self, info: MicroBatchInfo, start: Mark, end: Mark) -> None:
        """A micro-batch ended; the last of a regular step records the step (after warm-up)."""
        if not info.regular:
            return
        if not info.is_last:
            self._accum.append((start, end))
            return
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return
        config = info.plan.config
        sync = None
        if self._last_grad is not None and self._backward_end is not None:
            sync = (self._last_grad, self._backward_end)
        key = (self.num_nodes, self.num_replicas, config.local_bsz, config.accum_steps)
        self._recorder.add(key, self._accum, (start, end), sync)

    def restart_warmup(self) -> None:
        """Skip the next `warmup_steps` again (the configuration changed)."""
        self._warmup_left = self.warmup_steps
