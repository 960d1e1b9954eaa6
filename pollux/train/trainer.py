"""`ElasticTrainer`: the user's training loop, made adaptive, elastic and measured.

The trainer only wires the loop together; each concern is a part of its own, usable alone:
the loop's step state (`step_state`), micro-batch timing (`timing`), gradient statistics
(`measurement`), mixed precision (`amp`), the replicas' agreement (`agreement`) and process
group (`distributed`), the batch-size poller (`poller`), checkpoints (`state`, `preemption`),
the agent (`control_plane`), the declared size (`work`) and the settings (`config`). How to
write a job with it: docs/training.md; how the parts work: docs/architecture.md, "The training
library".
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import structlog
import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset, IterableDataset

from pollux import checks
from pollux.train.amp import MixedPrecision
from pollux.train.config import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    CheckpointConfig,
    ControlConfig,
    DataConfig,
    MeasureConfig,
    TrainerConfig,
    with_keywords,
)
from pollux.train.control_plane import ControlPlane
from pollux.train.data import (
    BatchConfig,
    BatchConfigSource,
    MicroBatchInfo,
    default_batch_config,
)
from pollux.train.distributed import (
    Replicas,
    default_device,
    init,
    no_sync_unless_synchronising,
    shutdown,
)
from pollux.train.env import TrainEnv
from pollux.train.errors import InvalidValueError, UsageError
from pollux.train.gns import GradStats
from pollux.train.metrics import MetricsSink, StepProfile, WorkStatus
from pollux.train.preemption import PlannedStop
from pollux.train.scaling import ScaledOptimizer, ScalingRule
from pollux.train.state import Stateful, TrainerCheckpoints, TrainingParts
from pollux.train.steps import OptimizerSteps
from pollux.train.work import DeclaredSize, LoopPosition, SizeUnit, remaining_work
from pollux.user_metrics import metric_problems

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_S",
    "ElasticTrainer",
    "Stateful",
    "default_device",
    "init",
    "shutdown",
]

log = structlog.get_logger(__name__)


class ElasticTrainer:
    """Adaptive, elastic data-parallel training around a user's model and optimizer.

    Args:
        model: The model (moved to `device`).
        optimizer: An optimizer over the model's parameters, with the learning rate tuned for
            `init_batch_size` (M0).
        dataset: A map-style dataset with ``__len__`` or an `IterableDataset`.
        init_batch_size: M0, the total batch size the learning rate was tuned for.
        env: The environment contract; default: read it (and call `init` if needed).
        batch_source: Where batch configurations come from; default: the job's agent when the
            launcher set ``POLLUX_AGENT_ADDR``, else ⌈M0/K⌉ per replica for the whole run.
        metrics_sink: Where rank 0 reports measurements; default: the job's agent when
            ``POLLUX_AGENT_ADDR`` is set, else they stay local (`profile`, `grad_stats`).
        scaling_rule: Learning-rate scaling rule; AdaScale by default.
        grad_scaler: The AMP `GradScaler`, if mixed precision is used.
        device: Training device; default: the replica's GPU or the CPU.
        ddp_kwargs: Extra arguments for `DistributedDataParallel`.
        extra_state: Further objects to checkpoint (e.g. ``{"lr_scheduler": sched}``); more can
            be added later with `register_state`.
        data: The loader's settings.
        checkpoint: Checkpoint directory, on/off and periodic interval (5 minutes by default).
        measure: Statistics interval, timing warm-up and report interval.
        control: The agent, the poll and agreement periods, SIGTERM handling.
        **keywords: The flat settings of earlier versions (``shuffle=``, ``checkpoint_dir=``,
            ``handle_sigterm=``, ...: `pollux.train.config.KEYWORDS`), applied over the groups.
    """

    rescale_pause_s: float | None = None
    """Seconds from the stop request (SIGTERM) that ended the previous allocation to this
    one's first optimizer step: what the rescale cost this job in wall time. None until that
    step, and on a fresh start or a restart that followed no planned stop."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        dataset: Dataset[Any] | IterableDataset[Any],
        *,
        init_batch_size: int,
        env: TrainEnv | None = None,
        batch_source: BatchConfigSource | None = None,
        metrics_sink: MetricsSink | None = None,
        scaling_rule: ScalingRule | str = ScalingRule.ADASCALE,
        grad_scaler: torch.amp.GradScaler | None = None,
        device: torch.device | None = None,
        ddp_kwargs: Mapping[str, Any] | None = None,
        extra_state: Mapping[str, Stateful] | None = None,
        data: DataConfig | None = None,
        checkpoint: CheckpointConfig | None = None,
        measure: MeasureConfig | None = None,
        control: ControlConfig | None = None,
        **keywords: Any,
    ) -> None:
        # Checked here, on every replica, so that a bad value fails everywhere before the first
        # collective rather than on rank 0 alone (where the reporter is built).
        groups = TrainerConfig.of(data, checkpoint, measure, control)
        self.config = cfg = with_keywords(groups, keywords)
        _check_arguments(model, optimizer, init_batch_size)
        self.env = init(env)
        self.init_batch_size = init_batch_size
        # Private: `log` is a name the user-facing API may want (a user-metrics method).
        self._log = log.bind(job_id=self.env.job_id, rank=self.env.rank)
        self.replicas = Replicas.join(self.env, device)
        self.device = self.replicas.device
        self.module = model.to(self.device)
        self.optimizer = optimizer
        self.grad_scaler = grad_scaler
        self.rank, self.world_size = self.replicas.rank, self.replicas.world_size
        self.num_nodes = self.replicas.num_nodes

        self.profile = StepProfile()
        self.scaling = ScaledOptimizer(optimizer, scaling_rule)
        self._amp = MixedPrecision(grad_scaler)
        self._steps = OptimizerSteps(
            optimizer,
            self.replicas,
            init_batch_size=init_batch_size,
            config=cfg,
            profile=self.profile,
            amp=self._amp,
            scaling=self.scaling,
            stop_requested=lambda: self.stop_signal.requested,
            proposal=lambda: self._plane.poller.proposal(),  # noqa: PLW0108 - opened later
            log=self._log,
        )
        self.collector = self._steps.measurement.collector
        self.gns = self._steps.measurement.gns
        self.loader = cfg.data.loader(
            dataset,
            default_batch_config(init_batch_size, self.world_size),
            rank=self.rank,
            num_replicas=self.world_size,
            device=self.device if self.device.type != "cpu" else None,
        )
        self.loader.on_empty_step = self._on_empty_step
        parts = TrainingParts(
            self.module, optimizer, self._amp, self.loader, self.scaling, self.gns, self.profile
        )
        self._checkpoints = TrainerCheckpoints(
            cfg.checkpoint, self.env, self.replicas, parts, extra=extra_state, log=self._log
        )
        self.checkpoints = self._checkpoints.manager
        self._stop = PlannedStop(
            self.replicas,
            self.checkpoints,
            save=self.save,
            close=self.close,
            position=lambda: LoopPosition.of(self.loader, self.scaling).for_log(),
            log=self._log,
            generation=self.env.allocation_gen,
        )
        self.stop_signal = self._stop.signal
        self._size: DeclaredSize | None = None
        self._user_metrics: tuple[tuple[str, float], ...] = ()

        restored_config = self._restore()
        self._plane = ControlPlane(
            self.env,
            self.replicas,
            cfg.control,
            source=batch_source,
            sink=metrics_sink,
            log=self._log,
        )
        try:
            initial = self._plane.poller.initial(restored_config, self.replicas.from_leader)
            if initial is not None:
                self.loader.set_batch_config(initial)
            self.ddp = self.replicas.wrap(self.module, ddp_kwargs)
            self._plane.start_reporting(self.profile, cfg.measure)
        except BaseException:
            self._plane.close()  # its threads and channels would outlive the trainer
            raise
        self.reporter = self._plane.reporter
        self._stop.install(cfg.control.handle_sigterm)
        self._closed = False
        self._log.info(
            "trainer_ready",
            world_size=self.world_size,
            num_nodes=self.num_nodes,
            device=str(self.device),
            init_batch_size=init_batch_size,
            **self.batch_config.as_dict(),
            scaling_rule=self.scaling.rule.value,
            adam=self.scaling.adam,
            epoch=self.epoch,
            progress=round(self.progress, 3),
        )

    # -- what the user reads -----------------------------------------------------------------

    @property
    def model(self) -> nn.Module:
        """The module to call on the current batch: read it for every batch, do not keep it.

        With several replicas it is the `DistributedDataParallel` wrapper, except in an epoch's
        irregular last step: there a replica may have no samples at all, so the forward pass
        must not issue DDP's own collectives (buffer broadcast, bucket rebuild), which only the
        replicas with samples would reach; the plain module runs instead and the trainer sums
        the step's gradients itself.
        """
        micro = self._steps.state.micro
        if self.ddp is None or (micro is not None and not micro.regular):
            return self.module
        return self.ddp

    @property
    def epoch(self) -> int:
        """The current epoch (completed passes over the dataset)."""
        return self.loader.epoch

    @property
    def progress(self) -> float:
        """Training progress in optimizer steps of the initial batch M0 (Σ AdaScale gain)."""
        return self.scaling.progress

    @property
    def steps(self) -> int:
        """Optimizer steps applied since the job began."""
        return self.scaling.steps

    @property
    def batch_config(self) -> BatchConfig:
        """The batch configuration of the current (or next) optimizer step."""
        return self.loader.batch_config

    @property
    def total_batch_size(self) -> int:
        """M = K · m · s of a regular optimizer step."""
        return self.batch_config.total(self.world_size)

    @property
    def scale(self) -> float:
        """S = M / M0 of a regular optimizer step."""
        return self.total_batch_size / self.init_batch_size

    @property
    def grad_stats(self) -> GradStats | None:
        """Smoothed gradient statistics, or None before the first estimate."""
        return self.gns.stats if self.gns.measured else None

    @property
    def lr_factors(self) -> tuple[float, ...]:
        """Learning-rate factors of the latest optimizer step, per param group."""
        return self.scaling.last_factors

    @property
    def batch_source(self) -> BatchConfigSource | None:
        """Where rank 0 gets batch configurations (given, the job's agent, or None)."""
        return self._plane.source

    @property
    def checkpoint_interval_s(self) -> float | None:
        """Seconds between periodic checkpoints; None: only on a stop and at the end."""
        return self._checkpoints.interval_s

    def declare_total(self, *, samples: int | None = None, progress: float | None = None) -> None:
        """Declare the job's size, so the scheduler can plan by the work it has left.

        `epochs(N)` declares N passes over the dataset by itself; call this instead for a
        budget of training `samples` (all replicas together, since the job began) or of
        `progress` (optimizer steps of the initial batch M0, what `progress` counts). Give
        exactly one.
        """
        self._size = DeclaredSize.of(samples=samples, progress=progress)

    @property
    def remaining_work(self) -> float | None:
        """Declared work left, in M0-steps (progress units); None when no size is declared."""
        return remaining_work(self._size, LoopPosition.of(self.loader, self.scaling))

    def register_state(self, name: str, obj: Stateful) -> None:
        """Checkpoint `obj` under `name`; restored at once if the checkpoint holds it."""
        self._checkpoints.register(name, obj)

    # -- the loop ----------------------------------------------------------------------------

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Yield epoch numbers from the restored one up to `num_epochs` (exclusive).

        Checks for a requested stop at every epoch boundary and writes a final checkpoint
        when the last epoch is complete, so a restarted finished job trains no further.
        """
        if num_epochs < 0:
            raise InvalidValueError("num_epochs", f"must be ≥ 0, got {num_epochs}")
        if self._size is None or self._size.unit is SizeUnit.EPOCHS:
            self._size = DeclaredSize(SizeUnit.EPOCHS, float(num_epochs))
        while self.loader.epoch < num_epochs:
            self._stop.check()
            before = (self.loader.epoch, self.loader.samples_total)
            yield self.loader.epoch
            if (self.loader.epoch, self.loader.samples_total) == before:
                raise UsageError(
                    "an epoch ended without finishing a single step: iterate "
                    "trainer.batches() inside the `for epoch in trainer.epochs(...)` loop"
                )
        self.save()

    def batches(self) -> Iterator[Any]:
        """This replica's micro-batches for the rest of the current epoch.

        Call `step` (or `backward` then `step`) once for every batch before asking for the
        next. Leaving the loop early abandons the unfinished optimizer step: its batches are
        served again next time.
        """
        if self._closed:
            raise UsageError("the trainer is closed; create a new one to train further")
        self._steps.restart()
        for micro in self.loader.micro_batches():
            info = micro.info
            self._steps.begin_micro(info)
            start = self._steps.timer.mark()
            with no_sync_unless_synchronising(self.ddp, info):
                yield micro.data
            self._steps.end_micro(info, start, self._steps.timer.mark())
        self._steps.state.end()

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate `loss`, the mean loss of the current batch.

        Applies the batch's weight (1/accum_steps, or its share of an epoch's irregular last
        step) and the AMP loss scale. Must be called at most once per batch.
        """
        self._steps.backward(loss)

    def step(self, loss: torch.Tensor | None = None) -> bool:
        """Finish the current batch: back-propagate `loss` if given, step if it is time.

        Returns:
            True if this batch ended an optimizer step (the model was updated, unless the
            gradients were not finite), False for an accumulation batch.

        Raises:
            Preempted: A stop was requested; the checkpoint is written. Let it propagate.
        """
        if loss is not None:
            self.backward(loss)
        info = self._steps.state.check_step()
        if not info.is_last:
            return False
        self._finish_step(info)
        return True

    def log(self, **values: float) -> None:
        """Values for people to read (``trainer.log(loss=0.3)``), plotted on the job's page.

        Rank 0's go to the agent with its next report (other ranks' are only checked).
        Raises InvalidValueError for what `pollux.user_metrics` refuses.
        """
        merged = {**dict(self._user_metrics), **{k: float(v) for k, v in values.items()}}
        if problems := metric_problems(merged, "log"):
            raise InvalidValueError(*problems[0])
        self._user_metrics = tuple(sorted(merged.items()))
        if self.rank == 0:
            self._plane.publish_user_metrics(self._user_metrics)

    def check_preemption(self) -> None:
        """Honour a requested stop now (checkpoint, then `Preempted`); collective if K > 1.

        Steps and epoch boundaries already check; call this from long stretches without
        training steps (e.g. evaluation), at the same point on every replica.
        """
        self._stop.check()

    # -- internals: one step -----------------------------------------------------------------

    def _on_empty_step(self, info: MicroBatchInfo) -> None:
        # This replica has no samples in an epoch's last (irregular) step; it still takes part
        # in the step's collectives and applies the same update as everyone else.
        self._steps.begin_step(info)
        self._finish_step(info)

    def _finish_step(self, info: MicroBatchInfo) -> None:
        agreed = self._steps.finish(info).agreed
        self.loader.finish_step()
        if self._steps.state.finished_steps == 1:
            self.rescale_pause_s = self._stop.rescale_pause_s(time.time())
        if self.reporter is not None:  # rank 0 with a sink: what changed with this step
            work = WorkStatus(self.progress, self.remaining_work, self.rescale_pause_s)
            self._plane.publish(self.grad_stats, work)
        if agreed is not None:
            if agreed.config is not None and agreed.config != self.loader.batch_config:
                self._switch_config(agreed.config)
            if agreed.stop:
                self._stop.stop()
        self._checkpoints.save_if_due(self.state_dict)

    def _switch_config(self, config: BatchConfig) -> None:
        self._steps.new_config(self.loader.batch_config, config)
        self.loader.set_batch_config(config)

    # -- checkpoints and stopping ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a restart needs, as plain data and CPU-loadable tensors."""
        return self._checkpoints.state(self.init_batch_size, self.stop_signal.requested_at)

    def save(self) -> Path | None:
        """Write a checkpoint now (rank 0; a no-op elsewhere or when checkpointing is off).

        Raises:
            CheckpointError: It could not be written, or a registered object's state could not
                be loaded back from it (checked before anything is written).
        """
        return self._checkpoints.save(self.state_dict)

    def _restore(self) -> BatchConfig | None:
        """Resume from the agreed checkpoint; its batch configuration if K is unchanged."""
        resumed = self._checkpoints.resume(self.init_batch_size)
        if resumed is None:
            return None
        self._stop.previous_request = resumed.stop_requested_at
        return resumed.batch_config

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Flush metrics, restore signal handlers, detach hooks and drop the DDP wrapper.

        Idempotent. Dropping the wrapper releases its hold on the process group, so that
        `shutdown` (or ``dist.destroy_process_group``) frees the group and its threads.
        """
        if self._closed:
            return
        self._closed = True
        self._plane.close()
        self._stop.uninstall()
        self.collector.remove()
        self.ddp = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_arguments(model: nn.Module, optimizer: Optimizer, init_batch_size: int) -> None:
    checks.whole_number(init_batch_size, least=1, error=InvalidValueError.of("init_batch_size"))
    known = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not any(id(p) in known for p in model.parameters()):
        raise InvalidValueError(
            "optimizer", "optimizes none of the model's parameters; build it from them"
        )
