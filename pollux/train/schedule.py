"""What an optimizer step measures besides training: gradient statistics and agreements.

The trainer decides this at the start of every step, on every replica alike and without any
communication, so the schedule is a pure function of step counters and settings. Statistics
are measured on a fixed schedule of steps (once per ``stats_interval`` M0-batches of samples),
so their cost is a small fraction of training and runs are reproducible. With several replicas
a measured step ends in the agreement all-reduce (`pollux.train.agreement`), which carries the
norms; the leader schedules further agreements when steps are slow (`next_agreement_in`), so
that a stop never waits much longer than the agreement period or one step.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_AGREEMENT_STEPS = 1_000_000
"""Cap of the leader's agreement schedule (a value that fits exactly in the float64 buffer)."""


@dataclass(frozen=True, slots=True)
class StepDuties:
    """What one optimizer step does besides training.

    Attributes:
        interval: Optimizer steps per measurement; also the weight of a measurement in the
            smoothed statistics (the steps it stands for).
        measure: The gradient statistics are measured at the end of this step.
        agree: Several replicas: the step ends with the agreement all-reduce.
        pair: One replica without accumulation: the differenced estimator pairs this step's
            gradient with the one stored on the previous (measured) step.
        per_micro: Per-micro-batch gradients exist (several replicas or accumulation), so the
            gradient hooks must be installed.
        collect: The hooks collect this step's per-micro-batch gradient norms.
    """

    interval: int
    measure: bool
    agree: bool
    pair: bool
    per_micro: bool
    collect: bool


def interval_steps(*, stats_interval: int, init_batch_size: int, total_batch_size: int) -> int:
    """Optimizer steps per measurement: `stats_interval` M0-batches' worth of samples (≥ 1).

    Counting in samples keeps the number of measurements within the smoothing window (which is
    about 1000 M0-batches long) the same at every batch size.
    """
    return max(1, round(stats_interval * init_batch_size / total_batch_size))


def step_duties(
    *,
    step: int,
    interval: int,
    world_size: int,
    accum_steps: int,
    regular: bool,
    until_agreement: int,
) -> StepDuties:
    """The duties of optimizer step `step` (counted in this process, from 0).

    Args:
        step: Optimizer steps finished in this process (the same count on every replica).
        interval: `interval_steps` at the step's batch configuration.
        world_size: Replicas K.
        accum_steps: Micro-batches per optimizer step of the step's configuration.
        regular: False for an epoch's irregular last step (no per-micro-batch statistics).
        until_agreement: Steps until the agreement the leader scheduled (1: this one).
    """
    phase = step % interval
    measure = phase == 0
    per_micro = world_size > 1 or accum_steps > 1
    if world_size > 1:
        # The norms need the all-reduce; the leader may ask for further agreements.
        agree, pair = measure or until_agreement <= 1, False
    else:
        # The differenced estimator stores on the measured step and pairs on the next.
        agree, pair = False, accum_steps == 1 and (phase == 1 or interval == 1)
    return StepDuties(
        interval=interval,
        measure=measure,
        agree=agree,
        pair=pair,
        per_micro=per_micro,
        collect=regular and per_micro and measure,
    )


def next_agreement_in(
    *, elapsed_s: float, steps_since_agreement: int, agreement_period_s: float
) -> int:
    """The leader's choice of steps to the next agreement: about `agreement_period_s` away.

    Args:
        elapsed_s: Seconds since the previous agreement.
        steps_since_agreement: Steps finished since then, before the current one.
        agreement_period_s: The wanted time between agreements.

    Measurement steps are agreements anyway, so this only matters when steps are slow.
    """
    step_s = elapsed_s / max(steps_since_agreement + 1, 1)
    if step_s <= 0.0:
        return MAX_AGREEMENT_STEPS
    # Capped before the int conversion: a vanishing step time makes the ratio infinite.
    return max(1, int(min(float(MAX_AGREEMENT_STEPS), agreement_period_s / step_s)))
