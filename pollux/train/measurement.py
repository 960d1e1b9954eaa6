"""Measuring the gradient noise scale on the steps the schedule picks (`pollux.train.schedule`).

At the start of each optimizer step `GradientMeasurement` decides, from step counters alone,
what the step measures, and installs the gradient hooks only when per-micro-batch gradients
exist (several replicas or accumulation). At the end of the step's last backward pass it reads
the norms (`capture`) before user code can change the gradients (e.g. clipping); with several
replicas it starts the step's agreement all-reduce there, which carries the local norms. Once
the agreement is settled the norms feed `GradientNoiseScale` (`update`). The estimators are
described in docs/architecture.md, "The training library".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from structlog.typing import FilteringBoundLogger
from torch.optim import Optimizer

from pollux.train.agreement import PendingSum
from pollux.train.amp import MixedPrecision
from pollux.train.data import StepPlan
from pollux.train.distributed import Replicas
from pollux.train.gns import GradientCollector, GradientNoiseScale
from pollux.train.schedule import StepDuties, interval_steps, step_duties

NO_DUTIES = StepDuties(
    interval=1, measure=False, agree=False, pair=False, per_micro=False, collect=False
)
"""Before the first step: nothing measured."""


@dataclass(slots=True)
class Captured:
    """A step's gradient norms, read at the end of its last backward pass."""

    agreement: PendingSum | None = None
    """The step's agreement all-reduce in flight (several replicas, agreement steps)."""
    total: torch.Tensor | None = None
    """|mean gradient|² per group."""
    local: torch.Tensor | None = None
    """Σ |micro-batch gradient|² per group (one replica with accumulation)."""
    differenced: torch.Tensor | None = None
    """[L, T] of the differenced estimator (one replica, no accumulation)."""


class GradientMeasurement:
    """The gradient statistics of a training loop: hooks, schedule, estimator updates.

    Args:
        optimizer: The optimizer whose parameters (and groups) are measured.
        replicas: The job's process group.
        init_batch_size: M0.
        stats_interval: Measure once per this many M0-batches of samples.
        amp: The loop's mixed precision (its loss scale divides the gradients).
        on_grad: Called from the gradient hooks when a local gradient is ready.
        log: Where non-finite statistics are logged.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        replicas: Replicas,
        *,
        init_batch_size: int,
        stats_interval: int,
        amp: MixedPrecision,
        on_grad: Callable[[], None],
        log: FilteringBoundLogger,
    ) -> None:
        self.collector = GradientCollector(optimizer, on_grad=on_grad)
        self.gns = GradientNoiseScale(len(optimizer.param_groups))
        self.duties = NO_DUTIES
        """What the current optimizer step measures (see `begin_step`)."""
        self.replicas = replicas
        self.init_batch_size = init_batch_size
        self.stats_interval = stats_interval
        self._amp = amp
        self._log = log

    def begin_step(self, plan: StepPlan, *, step: int, until_agreement: int) -> StepDuties:
        """Decide what step number `step` measures; identical on every replica."""
        self.collector.reset()
        self._amp.begin_step()
        world_size = self.replicas.world_size
        self.duties = step_duties(
            step=step,
            interval=interval_steps(
                stats_interval=self.stats_interval,
                init_batch_size=self.init_batch_size,
                total_batch_size=plan.config.total(world_size),
            ),
            world_size=world_size,
            accum_steps=plan.config.accum_steps,
            regular=plan.regular,
            until_agreement=until_agreement,
        )
        # Per-micro-batch gradients exist only with several replicas or accumulation; the hooks
        # that read them (and time the synchronisation) are installed only then.
        if self.duties.per_micro != self.collector.hooks_enabled:
            self.collector.enable_hooks(self.duties.per_micro)
        return self.duties

    def begin_micro(self, loss_weight: float) -> None:
        """A micro-batch whose loss is weighted by `loss_weight` begins."""
        self.collector.begin_micro_batch(
            collect=self.duties.collect, multiplier=loss_weight * self._amp.loss_scale
        )

    def capture(
        self, plan: StepPlan, agree: Callable[[torch.Tensor | None], PendingSum]
    ) -> Captured:
        """Read the step's norms and, on an agreement step, start the agreement.

        Runs at the end of the backward pass of this replica's last micro-batch of the step (or
        at the step itself for a replica without micro-batches). Every replica issues the same
        collectives in the same order: the gradient sum of an irregular step, then, on an
        agreement step, `agree` with the local norms when they are measured.
        """
        duties = self.duties
        collector = self.collector
        captured = Captured()
        loss_scale = self._amp.loss_scale
        if self.replicas.world_size > 1:
            if not plan.regular:
                self.replicas.sum_gradients(collector.params())
            if duties.agree:
                captured.agreement = agree(collector.local_sqr() if duties.collect else None)
                if duties.collect:
                    captured.total = collector.total_sqr(loss_scale)
            return captured
        if not plan.regular or plan.config.accum_steps > 1:
            # The differenced estimator pairs consecutive steps only: a step it does not see
            # ends any pending pair.
            collector.forget_previous()
        if not plan.regular:
            return captured
        if plan.config.accum_steps == 1:
            if duties.measure or duties.pair:
                keep = duties.measure
                if keep and not duties.pair:
                    collector.forget_previous()  # pair consecutive steps only
                captured.differenced = collector.differenced_sqr(loss_scale, keep=keep)
        elif duties.collect:
            captured.local = collector.local_sqr()
            captured.total = collector.total_sqr(loss_scale)
        return captured

    def update(
        self, scale: float, captured: Captured, norms: list[float] | None, *, step: int
    ) -> None:
        """Feed a measured step's norms to the noise scale; non-finite ones are skipped.

        Args:
            scale: S = samples of the step / M0.
            captured: The step's `capture`.
            norms: The agreed sum of the replicas' local norms (several replicas), else None.
            step: Optimizer steps of the job, for the log.
        """
        weight = float(self.duties.interval)
        if captured.differenced is not None:
            pair_local, pair_total = captured.differenced.tolist()
            if not self.gns.update(
                pair_local, pair_total, 2, 2.0 * scale, differenced=True, steps=weight
            ):
                self.collector.forget_previous()
                self._log.warning("nonfinite_gradient_statistics", step=step)
            return
        if norms is None and captured.local is not None:
            norms = captured.local.tolist()
        if norms is None or captured.total is None:
            return
        # Every replica ran the same number of equal micro-batches (regular step).
        count = self.replicas.world_size * self.collector.micro_batches
        local = [v / count for v in norms]
        if not self.gns.update(local, captured.total.tolist(), count, scale, steps=weight):
            self._log.warning("nonfinite_gradient_statistics", step=step)

    def end_step(self, *, applied: bool) -> None:
        """The optimizer step is over; an update AMP skipped ends any differenced pair."""
        self.collector.reset()
        if not applied:
            self.collector.forget_previous()
