"""One replica's optimizer steps: what each micro-batch owes, and how a step ends.

`OptimizerSteps` drives the parts of a step in their order: the loop's step state and loss
weights (`step_state`), micro-batch timing (`timing`), the gradient statistics (`measurement`),
mixed precision (`amp`), the replicas' agreement (`agreement`) and the scaled optimizer update
(`scaling`). What the trainer does with a finished step (adopt the agreed batch size, stop,
report, checkpoint) is the trainer's; the data loader is not touched here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from structlog.typing import FilteringBoundLogger
from torch.optim import Optimizer

from pollux.train.agreement import Agreement, Agreements, AgreementSchedule
from pollux.train.amp import MixedPrecision
from pollux.train.config import TrainerConfig
from pollux.train.data import BatchConfig, MicroBatchInfo
from pollux.train.distributed import Replicas
from pollux.train.measurement import Captured, GradientMeasurement
from pollux.train.metrics import Mark, StepProfile
from pollux.train.scaling import ScaledOptimizer
from pollux.train.step_state import StepState
from pollux.train.timing import StepTimer


class StepOutcome(NamedTuple):
    """How an optimizer step ended (a named tuple: one is made per step).

    Attributes:
        agreed: What the replicas agreed on at its end (stop, batch configuration), or None
            on a step without an agreement.
        applied: False when AMP skipped the update (non-finite gradients).
    """

    agreed: Agreement | None
    applied: bool


class OptimizerSteps:
    """The micro-batches and optimizer steps of one replica.

    Args:
        optimizer: The user's optimizer.
        replicas: The job's process group.
        init_batch_size: M0.
        config: The trainer's settings (statistics interval, timing warm-up, agreement period).
        profile: Where step times are recorded.
        amp: The loop's mixed precision.
        scaling: The optimizer with its learning-rate scaling rule.
        stop_requested: Whether this replica was asked to stop.
        proposal: The leader's latest batch configuration (`ConfigPoller.proposal`).
        log: The trainer's logger.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        replicas: Replicas,
        *,
        init_batch_size: int,
        config: TrainerConfig,
        profile: StepProfile,
        amp: MixedPrecision,
        scaling: ScaledOptimizer,
        stop_requested: Callable[[], bool],
        proposal: Callable[[], BatchConfig | None],
        log: FilteringBoundLogger,
    ) -> None:
        self.optimizer = optimizer
        self.replicas = replicas
        self.init_batch_size = init_batch_size
        self.amp = amp
        self.scaling = scaling
        self.agreements = Agreements(
            rank=replicas.rank,
            world_size=replicas.world_size,
            schedule=AgreementSchedule(config.control.agreement_period_s),
            stop_requested=stop_requested,
            proposal=proposal,
            start_sum=replicas.start_sum,
        )
        measure = config.measure
        self.state = StepState()
        self.timer = StepTimer(
            replicas.device,
            profile,
            num_nodes=replicas.num_nodes,
            num_replicas=replicas.world_size,
            warmup_steps=measure.profile_warmup_steps,
        )
        self.measurement = GradientMeasurement(
            optimizer,
            replicas,
            init_batch_size=init_batch_size,
            stats_interval=measure.stats_interval,
            amp=amp,
            on_grad=self.timer.on_grad,
            log=log,
        )
        self._captured: Captured | None = None
        self._log = log

    def restart(self) -> None:
        """A loop over batches begins: an abandoned step is replayed from its start."""
        self.optimizer.zero_grad(set_to_none=True)
        self.measurement.collector.reset()
        self._captured = None
        self.state.restart()

    def begin_micro(self, info: MicroBatchInfo) -> None:
        """A micro-batch is handed out (the first of a step begins the step)."""
        self.state.begin(info)
        if info.micro_index == 0:
            self.begin_step(info)
        self.measurement.begin_micro(self.state.loss_weight)
        self.timer.begin_micro(info)

    def begin_step(self, info: MicroBatchInfo) -> None:
        """Decide what the step measures; identical on every replica (no communication)."""
        self.state.micro = info
        self.timer.begin_step()
        self.measurement.begin_step(
            info.plan,
            step=self.state.finished_steps,
            until_agreement=self.agreements.schedule.until,
        )

    def end_micro(self, info: MicroBatchInfo, start: Mark, end: Mark) -> None:
        """The loop asks for the next micro-batch; the current one must have had its step."""
        self.state.check_stepped()
        self.timer.end_micro(info, start, end)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate the current micro-batch's weighted (and AMP-scaled) mean loss."""
        info = self.state.check_backward()
        weight = self.state.loss_weight
        torch.autograd.backward(self.amp.scale(loss * weight if weight != 1.0 else loss))
        self.timer.backward_done()
        self.state.backward_done()
        if info.is_last:
            # Read the step's gradient statistics now, before user code between backward()
            # and step() (e.g. gradient clipping) can change the gradients.
            self._captured = self.measurement.capture(info.plan, self.agreements.start)

    def finish(self, info: MicroBatchInfo) -> StepOutcome:
        """End the optimizer step whose last micro-batch is `info`: agree, measure, update."""
        plan = info.plan
        scale = plan.samples / self.init_batch_size
        captured = self._captured
        if captured is None:  # this replica had no micro-batch in the step
            captured = self.measurement.capture(plan, self.agreements.start)
        self._captured = None
        agreed, tail = self.agreements.settle(captured.agreement)
        collect = self.replicas.world_size > 1 and self.measurement.duties.collect
        self.measurement.update(scale, captured, tail if collect else None, step=self.scaling.steps)
        applied = self.amp.step(
            self.scaling,
            self.optimizer,
            scale=scale,
            stats=self.measurement.gns.group_stats(),
            lr_scale=plan.config.lr_scale,
        )
        self.optimizer.zero_grad(set_to_none=True)
        self.measurement.end_step(applied=applied)
        self.state.finished_steps += 1
        return StepOutcome(agreed, applied)

    def new_config(self, old: BatchConfig, new: BatchConfig) -> None:
        """The batch configuration changes at the next step: restart what depends on it."""
        self.measurement.collector.forget_previous()  # never pair gradients of two batch sizes
        self.timer.restart_warmup()
        self._log.info(
            "batch_config_changed",
            **new.as_dict(),
            total_batch_size=new.total(self.replicas.world_size),
            previous_local_bsz=old.local_bsz,
            previous_accum_steps=old.accum_steps,
        )
