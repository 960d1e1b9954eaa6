"""The user-facing API: `init`, `ElasticTrainer`, `shutdown` (docs/architecture.md §1 step 6).

Adapting an ordinary PyTorch script takes about a dozen lines::

    import pollux.train as pt

    pt.init()                                     # process group from the environment
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = pt.ElasticTrainer(model, opt, dataset, init_batch_size=128)
    for epoch in trainer.epochs(10):              # resumes at the checkpointed epoch
        for x, y in trainer.batches():            # this replica's micro-batches
            loss = F.cross_entropy(trainer.model(x), y)
            trainer.step(loss)                    # backward + (maybe) scaled optimizer step
    trainer.close()
    pt.shutdown()                                 # leave the process group before exiting

**Shape.** The trainer owns the loop's moving parts and leaves the model's maths to the user:

- `batches` hands out micro-batches; each must be followed by exactly one `step` (or
  `backward` then `step`). On accumulation micro-batches `step` only accumulates; on the last
  micro-batch of an optimizer step it synchronises, updates the statistics, applies the
  optimizer with the scaled learning rate and zeroes the gradients. Do not call
  ``optimizer.zero_grad()`` or ``optimizer.step()`` yourself.
- `model` is the module wrapped in `DistributedDataParallel` when there are several replicas;
  accumulation micro-batches run under ``model.no_sync()``, so they cost no communication.
  Call ``trainer.model(...)`` for every batch rather than keeping a reference: an epoch's
  irregular last step runs the plain module. Use `module` for evaluation and for anything
  that must not synchronise.
- The gradient noise scale is measured on a fixed schedule of optimizer steps (once per
  ``stats_interval`` M0-batches of samples), so its cost is a small fraction of training and
  runs are reproducible. With several replicas a measured step ends with one small all-reduce
  that carries, at once, every replica's local gradient norms, the stop flag (SIGTERM) and
  rank 0's batch configuration (an *agreement*); rank 0 adds agreements when steps are slow,
  so that a stop never waits much longer than ``agreement_period_s`` or one step.
- The learning rate follows the scaling rule at every step; `progress` counts M0-steps.

**Stopping.** On SIGTERM the current optimizer step finishes; one replica stops at that step's
end, several at the next agreement (or epoch boundary), where they all agree. Rank 0 writes an
atomic checkpoint, every replica waits for it, and `Preempted` (exit code 143) is raised. The
next incarnation, with any number of replicas and any batch size, resumes at that step.

**Parts.** The trainer wires the loop together; the decisions live in small modules:
`pollux.train.schedule` (what a step measures), `pollux.train.agreement` (what the replicas
agree on, and its encoding), `pollux.train.preemption` (resuming, stopping and periodic
checkpoints of the replicas together) and `pollux.train.agent_link` (the agent, imported only
when ``POLLUX_AGENT_ADDR`` is set, so that importing the library loads no gRPC).

**Performance.** Per step the library adds only bookkeeping in Python; a measured step adds a
few passes over the gradients (and, with several replicas, the agreement all-reduce, which
overlaps with the computation of the global gradient norm). ``benchmarks/train_overhead.py``
measures it against a plain DDP loop.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, Self

import structlog
import torch
import torch.distributed as dist

# Imported before any process group can exist: `torch.distributed.nn` gives its functions the
# default ``group=group.WORLD``, evaluated at import, so importing it later (DDP does, through
# torch._dynamo) pins the world group for good. `destroy_process_group` could then no longer
# free it, and its communication threads would run on into interpreter shutdown, where they
# can abort a replica that finished its work ("terminate called without an active exception").
import torch.distributed.nn
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.utils.data import Dataset, IterableDataset

from pollux.train.agreement import Agreement
from pollux.train.checkpoint import CheckpointManager, StopSignal, check_loadable
from pollux.train.data import (
    AdaptiveDataLoader,
    BatchConfig,
    BatchConfigSource,
    MicroBatchInfo,
    StepPlan,
    default_batch_config,
)
from pollux.train.env import TrainEnv
from pollux.train.errors import InvalidValueError, UsageError
from pollux.train.gns import GradientCollector, GradientNoiseScale, GradStats
from pollux.train.metrics import (
    Mark,
    MetricsReporter,
    MetricsSink,
    StepClock,
    StepProfile,
    StepRecorder,
    WorkStatus,
)
from pollux.train.preemption import (
    any_replica,
    load_agreed_checkpoint,
    periodic_checkpoint_due,
    preempt,
    save_periodic_checkpoint,
)
from pollux.train.scaling import ScaledOptimizer, ScalingRule
from pollux.train.schedule import StepDuties, interval_steps, next_agreement_in, step_duties

if TYPE_CHECKING:
    from pollux.train.agent_link import AgentLink

log = structlog.get_logger(__name__)

DEFAULT_CHECKPOINT_INTERVAL_S = 300.0
"""Periodic checkpoint interval unless the job says otherwise: a crash loses minutes, not the
whole allocation's training, and a save every few minutes costs little next to it."""

_NO_DUTIES = StepDuties(
    interval=1, measure=False, agree=False, pair=False, per_micro=False, collect=False
)
"""Before the first step: nothing measured."""


class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict`` (LR schedulers, EMA models, ...)."""

    def state_dict(self) -> dict[str, Any]:
        """The object's state as plain data and tensors."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """Restore `state_dict` output."""
        ...


def default_device(env: TrainEnv) -> torch.device:
    """The device a replica trains on: its GPU when CUDA is usable, else the CPU.

    With one visible GPU (the launcher's usual ``CUDA_VISIBLE_DEVICES``) that GPU is used;
    with several, the replica's ``LOCAL_RANK`` selects one.
    """
    if env.cuda_visible_devices == () or not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = env.local_rank if count > 1 else 0
    if index >= count:
        raise InvalidValueError(
            "LOCAL_RANK",
            f"{env.local_rank} selects GPU {index} but only {count} are visible; "
            "check CUDA_VISIBLE_DEVICES",
        )
    return torch.device("cuda", index)


def init(
    env: TrainEnv | None = None, *, backend: str | None = None, timeout_s: float = 300.0
) -> TrainEnv:
    """Read the environment contract and join the job's process group.

    Binds ``job_id`` and ``rank`` into structlog's context for this process. With one replica no
    process group is created. Calling it again is harmless.

    Args:
        env: The contract; default: read from the environment.
        backend: ``"nccl"`` or ``"gloo"``; default nccl when the replica has a GPU, else gloo.
        timeout_s: How long collectives (and the rendezvous) may wait for other replicas.

    Returns:
        The contract in effect.
    """
    env = env if env is not None else TrainEnv.from_environ()
    structlog.contextvars.bind_contextvars(job_id=env.job_id, rank=env.rank)
    if not env.distributed or dist.is_initialized():
        return env
    device = default_device(env)
    if backend is None:
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started = time.perf_counter()
    dist.init_process_group(
        backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    log.info(
        "process_group_ready",
        backend=backend,
        world_size=env.world_size,
        seconds=round(time.perf_counter() - started, 3),
    )
    return env


def shutdown() -> None:
    """Leave the job's process group, if this process is in one (harmless otherwise).

    Call it once training is over, after `ElasticTrainer.close`: it joins the group's
    communication threads while the interpreter is still whole, so none outlives it into
    shutdown, where one can abort the process and turn a finished replica into a failed one.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        log.info("process_group_left")


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
            launcher set ``POLLUX_AGENT_ADDR`` (see `connect_agent`), else ⌈M0/K⌉ per replica
            and no accumulation, for the whole run.
        scaling_rule: Learning-rate scaling rule; AdaScale by default.
        grad_scaler: The AMP `GradScaler`, if mixed precision is used.
        metrics_sink: Where measurements are reported (rank 0 only); default: the job's agent
            when ``POLLUX_AGENT_ADDR`` is set, else they stay local (`profile`, `grad_stats`).
        connect_agent: False never connects to an agent on its own, even with
            ``POLLUX_AGENT_ADDR`` set. Otherwise the agent serves as whichever of
            `batch_source` and `metrics_sink` is not given.
        checkpoint_dir: Checkpoint directory; default ``POLLUX_CHECKPOINT_DIR``.
        checkpointing: False disables checkpoints even when a directory is configured.
        checkpoint_interval_s: Also checkpoint at the first step boundary after this many
            seconds, so that a crash (of the replica, its node or its launcher) loses at most
            this much training; None: only on stop and at the end. Default 5 minutes.
        shuffle: Shuffle map-style datasets each epoch.
        seed: Seed of the data order (same on every replica).
        collate_fn: Batch builder for the loader.
        num_workers: Loader worker processes.
        pin_memory: Pin host batches (CUDA).
        device: Training device; default: the replica's GPU or the CPU.
        report_interval_s: Seconds between metric reports.
        config_poll_interval_s: Seconds between queries of `batch_source`.
        handle_sigterm: Install the SIGTERM handler (main thread only).
        ddp_kwargs: Extra arguments for `DistributedDataParallel`.
        extra_state: Further objects to checkpoint (e.g. ``{"lr_scheduler": sched}``); more can
            be added later with `register_state`.
        profile_warmup_steps: Optimizer steps not timed after a start or a configuration
            change (allocator and autotuner warm-up).
        stats_interval: Measure the gradient statistics once per this many M0-batches of
            samples (≥ 1), i.e. every ``max(1, round(stats_interval · M0 / M))`` optimizer
            steps; 1 at M = M0 is the published every-step scheme. A measurement costs a few
            passes over the gradients; the smoothing weights each one by the steps it stands
            for, so the statistics forget at the published rate per step either way.
        agreement_period_s: With several replicas, the replicas agree on stop and batch
            configuration (one small all-reduce, which also carries the statistics) whenever
            statistics are measured and, when steps are slow, about this often: a stop never
            waits much longer than this or one step.
    """

    _declared: tuple[str, float] | None = None
    """The declared size: ("epochs" | "samples" | "progress", total); None: undeclared."""
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
        scaling_rule: ScalingRule | str = ScalingRule.ADASCALE,
        grad_scaler: torch.amp.GradScaler | None = None,
        metrics_sink: MetricsSink | None = None,
        connect_agent: bool = True,
        checkpoint_dir: Path | str | None = None,
        checkpointing: bool = True,
        checkpoint_interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S,
        shuffle: bool = True,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        device: torch.device | None = None,
        report_interval_s: float = 5.0,
        config_poll_interval_s: float = 5.0,
        handle_sigterm: bool = True,
        ddp_kwargs: Mapping[str, Any] | None = None,
        extra_state: Mapping[str, Stateful] | None = None,
        profile_warmup_steps: int = 1,
        stats_interval: int = 8,
        agreement_period_s: float = 1.0,
    ) -> None:
        _check_arguments(
            model,
            optimizer,
            init_batch_size,
            checkpoint_interval_s,
            config_poll_interval_s,
            profile_warmup_steps,
            stats_interval,
            agreement_period_s,
            report_interval_s,
        )

        self.env = init(env)
        self.init_batch_size = init_batch_size
        self.rank = self.env.rank
        self.world_size = self.env.world_size
        self.log = log.bind(job_id=self.env.job_id, rank=self.rank)
        self.device = device if device is not None else default_device(self.env)
        if self.device.type == "cuda":
            # Timing events and NCCL object collectives use the current device.
            torch.cuda.set_device(self.device)
        self.module = model.to(self.device)
        self.optimizer = optimizer
        self.grad_scaler = grad_scaler
        self._comm_device = self.device if self._backend() == "nccl" else torch.device("cpu")
        self.num_nodes = self._count_nodes()

        self._clock = StepClock(self.device)
        self._init_step_state()
        self.collector = GradientCollector(optimizer, on_grad=self._on_grad)
        self.gns = GradientNoiseScale(len(optimizer.param_groups))
        self.scaling = ScaledOptimizer(optimizer, scaling_rule)
        self.profile = StepProfile()
        self._recorder = StepRecorder(self._clock, self.profile)

        self.loader = AdaptiveDataLoader(
            dataset,
            default_batch_config(init_batch_size, self.world_size),
            rank=self.rank,
            num_replicas=self.world_size,
            shuffle=shuffle,
            seed=seed,
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
            device=self.device if self.device.type != "cpu" else None,
        )
        self.loader.on_empty_step = self._on_empty_step

        directory = checkpoint_dir if checkpoint_dir is not None else self.env.checkpoint_dir
        self.checkpoints = CheckpointManager(
            directory if checkpointing else None,
            rank=self.rank,
            generation=self.env.allocation_gen or None,  # 0: not started by a launcher
        )
        self.checkpoint_interval_s = checkpoint_interval_s
        self._extra: dict[str, Stateful] = dict(extra_state or {})
        self._saved_extra: dict[str, Any] = {}
        self._poll_interval_s = config_poll_interval_s
        self._next_poll = 0.0
        self._proposal: BatchConfig | None = None
        self._warmup_steps = profile_warmup_steps
        self._warmup_left = profile_warmup_steps
        self.stats_interval = stats_interval
        self.agreement_period_s = agreement_period_s

        restored_config = self._restore()
        metrics_sink = self._connect(connect_agent, batch_source, metrics_sink)
        try:
            self._set_initial_config(restored_config)
            self.ddp = self._wrap(ddp_kwargs)
            self.reporter = self._start_reporter(metrics_sink, report_interval_s)
        except BaseException:
            if self._link is not None:  # its threads and channels would outlive the trainer
                self._link.close()
            raise

        self.stop_signal = StopSignal()
        self._signals_installed = handle_sigterm and self.stop_signal.install()
        self._last_checkpoint = time.monotonic()

        self._closed = False
        self.log.info(
            "trainer_ready",
            world_size=self.world_size,
            num_nodes=self.num_nodes,
            device=str(self.device),
            init_batch_size=init_batch_size,
            local_bsz=self.batch_config.local_bsz,
            accum_steps=self.batch_config.accum_steps,
            scaling_rule=self.scaling.rule.value,
            adam=self.scaling.adam,
            epoch=self.epoch,
            progress=round(self.progress, 3),
        )

    def _wrap(self, ddp_kwargs: Mapping[str, Any] | None) -> DistributedDataParallel | None:
        """The DDP wrapper of the module with several replicas, else None."""
        if self.world_size == 1:
            return None
        device_ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(self.module, device_ids=device_ids, **dict(ddp_kwargs or {}))

    def _connect(
        self, wanted: bool, source: BatchConfigSource | None, sink: MetricsSink | None
    ) -> MetricsSink | None:
        """Set `batch_source` and return the metrics sink, the job's agent filling either gap."""
        self._link: AgentLink | None = None
        # Rank 0 alone polls the batch source and reports, so only it talks to the agent.
        if wanted and self.rank == 0 and (source is None or sink is None):
            self._link = _agent_link(self.env)
        self.batch_source = source or self._link
        return sink or self._link

    def _init_step_state(self) -> None:
        """Per-micro-batch bookkeeping of the loop (see `batches`, `step`)."""
        self._micro: MicroBatchInfo | None = None
        self._step_called = True
        self._backward_called = False
        self._loss_weight = 1.0
        self._amp_scale = 1.0
        """The AMP loss scale of the current step (kept from the previous step's update)."""
        self._amp_scale_unknown = True
        self._duties = _NO_DUTIES
        """What the current optimizer step measures (see `_begin_step`)."""
        self._stamp = False
        self._last_grad_mark: Mark | None = None
        self._accum_marks: list[tuple[Mark, Mark]] = []
        self._backward_end: Mark | None = None
        self._captured: _Captured | None = None
        self._local_steps = 0
        """Optimizer steps finished in this process (the same count on every replica)."""
        self._until_agreement = 1
        """Steps until the replicas' next agreement (several replicas; the first step agrees)."""
        self._steps_since_agreement = 0
        self._agreement_started = time.monotonic()

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
        micro = self._micro
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

    def declare_total(self, *, samples: int | None = None, progress: float | None = None) -> None:
        """Declare the job's size, so the scheduler can plan by the work it has left.

        `epochs(N)` declares N passes over the dataset by itself; call this instead for a
        budget of training `samples` (all replicas together, since the job began) or of
        `progress` (optimizer steps of the initial batch M0, what `progress` counts). Give
        exactly one.
        """
        if (samples is None) == (progress is None):
            raise InvalidValueError("declare_total", "give exactly one of samples or progress")
        if samples is not None:
            if samples < 0:
                raise InvalidValueError("samples", f"must be ≥ 0, got {samples}")
            self._declared = ("samples", float(samples))
        else:
            assert progress is not None
            if not math.isfinite(progress) or progress < 0:
                raise InvalidValueError("progress", f"must be finite and ≥ 0, got {progress}")
            self._declared = ("progress", float(progress))

    @property
    def remaining_work(self) -> float | None:
        """Declared work left, in M0-steps (progress units); None when no size is declared.

        A budget of samples (or epochs) converts at the current batch: one optimizer step of
        M samples adds the AdaScale gain r to progress, so R samples left are R·r/M M0-steps.
        """
        declared = self._declared
        if declared is None:
            return None
        kind, total = declared
        if kind == "progress":
            return max(0.0, total - self.progress)
        if kind == "epochs":
            size = self.loader.dataset_len
            if size is None:
                return None
            done = self.loader.epoch * size + self.loader.position
            total *= size
        else:
            done = self.loader.samples_total
        left = max(0.0, total - done)
        return left * self.scaling.last_gain / max(self.total_batch_size, 1)

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

    def register_state(self, name: str, obj: Stateful) -> None:
        """Checkpoint `obj` under `name`; restored at once if the checkpoint holds it."""
        if not name or name in self._extra:
            raise InvalidValueError("name", f"{name!r} is empty or already registered")
        self._extra[name] = obj
        if name in self._saved_extra:
            obj.load_state_dict(self._saved_extra.pop(name))

    # -- the loop ----------------------------------------------------------------------------

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Yield epoch numbers from the restored one up to `num_epochs` (exclusive).

        Checks for a requested stop at every epoch boundary and writes a final checkpoint
        when the last epoch is complete, so a restarted finished job trains no further.
        """
        if num_epochs < 0:
            raise InvalidValueError("num_epochs", f"must be ≥ 0, got {num_epochs}")
        if self._declared is None or self._declared[0] == "epochs":
            self._declared = ("epochs", float(num_epochs))
        while self.loader.epoch < num_epochs:
            self._check_stop()
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
        self._check_open()
        # A step abandoned by leaving an earlier loop early is replayed from its start.
        self.optimizer.zero_grad(set_to_none=True)
        self.collector.reset()
        self._captured = None
        self._step_called = True
        for micro in self.loader.micro_batches():
            info = micro.info
            self._begin_micro(info)
            sync_here = info.regular and info.is_last
            context: AbstractContextManager[Any] = (
                self.ddp.no_sync() if self.ddp is not None and not sync_here else nullcontext()
            )
            start = self._clock.mark()
            with context:
                yield micro.data
            end = self._clock.mark()
            if not self._step_called:
                raise UsageError(
                    "call trainer.step() (or trainer.step(loss)) once for every batch before "
                    "asking for the next one"
                )
            self._end_micro(info, start, end)
        self._micro = None

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate `loss`, the mean loss of the current batch.

        Applies the batch's weight (1/accum_steps, or its share of an epoch's irregular last
        step) and the AMP loss scale. Must be called at most once per batch.
        """
        if self._micro is None or self._step_called:
            raise UsageError("backward() must be called inside trainer.batches(), once per batch")
        if self._backward_called:
            raise UsageError("backward() was already called for this batch")
        scaled = loss * self._loss_weight if self._loss_weight != 1.0 else loss
        if self.grad_scaler is not None:
            scaled = self.grad_scaler.scale(scaled)
        torch.autograd.backward(scaled)
        if self._stamp:
            self._backward_end = self._clock.mark()
            self._stamp = False
        self._backward_called = True
        if self._micro.is_last:
            # Read the step's gradient statistics now, before user code between backward()
            # and step() (e.g. gradient clipping) can change the gradients.
            self._captured = self._capture(self._micro)

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
        info = self._micro
        if info is None or self._step_called:
            raise UsageError("step() must be called inside trainer.batches(), once per batch")
        if not self._backward_called:
            raise UsageError("step() needs a loss: call trainer.step(loss) or backward(loss)")
        self._step_called = True
        if not info.is_last:
            return False
        self._finish_step(info)
        return True

    def check_preemption(self) -> None:
        """Honour a requested stop now (checkpoint, then `Preempted`); collective if K > 1.

        Steps and epoch boundaries already check; call this from long stretches without
        training steps (e.g. evaluation), at the same point on every replica.
        """
        self._check_stop()

    # -- internals: one micro-batch ----------------------------------------------------------

    def _begin_micro(self, info: MicroBatchInfo) -> None:
        self._micro = info
        self._step_called = False
        self._backward_called = False
        plan = info.plan
        if info.micro_index == 0:
            self._begin_step(plan)
        if plan.regular:
            self._loss_weight = 1.0 / plan.config.accum_steps
        else:
            self._loss_weight = info.size / plan.samples
        self.collector.begin_micro_batch(
            collect=self._duties.collect, multiplier=self._loss_weight * self._amp_scale
        )
        self._stamp = self.world_size > 1 and plan.regular and info.is_last
        self._last_grad_mark = None
        self._backward_end = None

    def _begin_step(self, plan: StepPlan) -> None:
        """Decide what the step measures; identical on every replica (no communication)."""
        self.collector.reset()
        self._accum_marks = []
        if self._amp_scale_unknown:
            self._amp_scale = self._current_amp_scale()
            self._amp_scale_unknown = False
        self._duties = step_duties(
            step=self._local_steps,
            interval=interval_steps(
                stats_interval=self.stats_interval,
                init_batch_size=self.init_batch_size,
                total_batch_size=plan.config.total(self.world_size),
            ),
            world_size=self.world_size,
            accum_steps=plan.config.accum_steps,
            regular=plan.regular,
            until_agreement=self._until_agreement,
        )
        # Per-micro-batch gradients exist only with several replicas or accumulation; the hooks
        # that read them (and time the synchronisation) are installed only then.
        if self._duties.per_micro != self.collector.hooks_enabled:
            self.collector.enable_hooks(self._duties.per_micro)

    def _end_micro(self, info: MicroBatchInfo, start: Mark, end: Mark) -> None:
        if not info.regular:
            return
        if not info.is_last:
            self._accum_marks.append((start, end))
            return
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return
        config = info.plan.config
        sync = None
        if self._last_grad_mark is not None and self._backward_end is not None:
            sync = (self._last_grad_mark, self._backward_end)
        key = (self.num_nodes, self.world_size, config.local_bsz, config.accum_steps)
        self._recorder.add(key, self._accum_marks, (start, end), sync)

    def _on_grad(self) -> None:
        if self._stamp:
            self._last_grad_mark = self._clock.restamp(self._last_grad_mark)

    def _on_empty_step(self, info: MicroBatchInfo) -> None:
        # This replica has no samples in an epoch's last (irregular) step; it still takes part
        # in the step's collectives and applies the same update as everyone else.
        self._micro = info
        self._begin_step(info.plan)
        self._finish_step(info)

    def _current_amp_scale(self) -> float:
        if self.grad_scaler is None or not self.grad_scaler.is_enabled():
            return 1.0
        return float(self.grad_scaler.get_scale())

    # -- internals: the end of an optimizer step ---------------------------------------------

    def _capture(self, info: MicroBatchInfo) -> _Captured:
        """Read the step's gradient statistics and start the step's agreement all-reduce.

        Runs at the end of the backward pass of this replica's last micro-batch of the step (or
        at the step itself for a replica without micro-batches). Every replica issues the same
        collectives in the same order: the gradient sum of an irregular step, then, on an
        agreement step, the control all-reduce.
        """
        plan = info.plan
        duties = self._duties
        captured = _Captured()
        if self.world_size > 1:
            if not plan.regular:
                self._all_reduce_gradients()
            if duties.agree:
                local_sqr = self.collector.local_sqr() if duties.collect else None
                captured.work, captured.buffer = self._start_agreement(local_sqr)
                if duties.collect:
                    captured.total = self.collector.total_sqr(self._amp_scale)
            return captured
        if not plan.regular or plan.config.accum_steps > 1:
            # The differenced estimator pairs consecutive steps only: a step it does not see
            # ends any pending pair.
            self.collector.forget_previous()
        if not plan.regular:
            return captured
        if plan.config.accum_steps == 1:
            if duties.measure or duties.pair:
                keep = duties.measure
                if keep and not duties.pair:
                    self.collector.forget_previous()  # pair consecutive steps only
                captured.differenced = self.collector.differenced_sqr(self._amp_scale, keep=keep)
        elif duties.collect:
            captured.local = self.collector.local_sqr()
            captured.total = self.collector.total_sqr(self._amp_scale)
        return captured

    def _finish_step(self, info: MicroBatchInfo) -> None:
        plan = info.plan
        config = plan.config
        scale = plan.samples / self.init_batch_size
        captured = self._captured if self._captured is not None else self._capture(info)
        self._captured = None
        agreed: Agreement | None = None
        local_values: list[float] | None = None
        weight = float(self._duties.interval)
        if self.world_size > 1:
            self._until_agreement -= 1
            self._steps_since_agreement += 1
            if captured.buffer is not None:
                if captured.work is not None:
                    captured.work.wait()
                reduced = captured.buffer.tolist()
                agreed = Agreement.decode(reduced[: Agreement.FIELDS])
                self._until_agreement = max(1, agreed.next_in)
                self._agreement_started = time.monotonic()
                self._steps_since_agreement = 0
                if self._duties.collect:
                    local_values = reduced[Agreement.FIELDS :]
        else:
            agreed = Agreement(stop=self.stop_signal.requested, config=self._propose_config())
            if captured.local is not None:
                local_values = captured.local.tolist()

        self._update_statistics(scale, weight, local_values, captured)
        applied = self._apply_optimizer(scale, config)
        self.optimizer.zero_grad(set_to_none=True)
        self.collector.reset()
        self.loader.finish_step()
        self._local_steps += 1
        self._measure_rescale_pause()
        if not applied:
            self.collector.forget_previous()
        self._publish()
        if agreed is not None:
            if agreed.config is not None and agreed.config != self.loader.batch_config:
                self._switch_config(agreed.config)
            if agreed.stop:
                self._preempt()
        if periodic_checkpoint_due(
            rank=self.rank,
            interval_s=self.checkpoint_interval_s,
            last_s=self._last_checkpoint,
            now_s=time.monotonic(),
        ):
            save_periodic_checkpoint(self.save, self.log)

    def _start_agreement(self, local_sqr: torch.Tensor | None) -> tuple[Any, torch.Tensor]:
        """Launch the SUM all-reduce of [this replica's `Agreement` proposal, local norms]."""
        proposal = Agreement(stop=self.stop_signal.requested)
        if self.rank == 0:
            proposal = Agreement(
                stop=proposal.stop,
                config=self._propose_config(),
                next_in=next_agreement_in(
                    elapsed_s=time.monotonic() - self._agreement_started,
                    steps_since_agreement=self._steps_since_agreement,
                    agreement_period_s=self.agreement_period_s,
                ),
            )
        values = proposal.encode() + [0.0] * self.collector.num_groups
        buffer = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        if local_sqr is not None:
            buffer[Agreement.FIELDS :] = local_sqr.to(self._comm_device)
        return dist.all_reduce(buffer, async_op=True), buffer

    def _all_reduce_gradients(self) -> None:
        """Sum the weighted gradients of an irregular step over replicas (no DDP bucket).

        Each replica's gradient is already weighted by its samples' share of the step, so the
        sum is the exact mean over the step's samples. A presence count per parameter keeps
        gradients that no replica produced at None.
        """
        params = self.collector.params()
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, group in by_dtype.items():
            pieces = [
                (_dense_grad(p) if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in group
            ]
            present = torch.tensor(
                [0.0 if p.grad is None else 1.0 for p in group], dtype=dtype, device=self.device
            )
            flat = torch.cat([*pieces, present]).to(self._comm_device)
            dist.all_reduce(flat)
            flat = flat.to(self.device)
            offset = 0
            for p in group:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p).clone()
                offset += n
            counts = flat[offset:].tolist()
            for p, count in zip(group, counts, strict=True):
                if count == 0:
                    p.grad = None

    def _update_statistics(
        self,
        scale: float,
        weight: float,
        local_values: list[float] | None,
        captured: _Captured,
    ) -> None:
        """Feed a measured step's norms to the noise scale; non-finite ones are skipped."""
        if captured.differenced is not None:
            pair_local, pair_total = captured.differenced.tolist()
            if not self.gns.update(
                pair_local, pair_total, 2, 2.0 * scale, differenced=True, steps=weight
            ):
                self.collector.forget_previous()
                self.log.warning("nonfinite_gradient_statistics", step=self.steps)
        elif local_values is not None and captured.total is not None:
            # Every replica ran the same number of equal micro-batches (regular step).
            count = self.world_size * self.collector.micro_batches
            local = [v / count for v in local_values]
            if not self.gns.update(local, captured.total.tolist(), count, scale, steps=weight):
                self.log.warning("nonfinite_gradient_statistics", step=self.steps)

    def _apply_optimizer(self, scale: float, config: BatchConfig) -> bool:
        """Step with the scaled learning rate; False if AMP skipped the step (overflow)."""
        stats = self.gns.group_stats()
        scaler = self.grad_scaler
        if scaler is None or not scaler.is_enabled():
            self.scaling.step(scale, stats, lr_scale=config.lr_scale)
            return True
        self.scaling.step(
            scale,
            stats,
            lr_scale=config.lr_scale,
            step_fn=lambda: scaler.step(self.optimizer),
            count_progress=False,
        )
        scaler.update()
        before, self._amp_scale = self._amp_scale, float(scaler.get_scale())  # one sync per step
        if self._amp_scale < before:
            # The scaler backed off: it found inf/NaN gradients and skipped the update, so the
            # step made no progress.
            return False
        self.scaling.count_progress()
        return True

    # -- internals: configuration ------------------------------------------------------------

    def _propose_config(self) -> BatchConfig | None:
        """Rank 0's latest answer from the batch source (polled at most every interval)."""
        if self.rank != 0 or self.batch_source is None:
            return None
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self._poll_interval_s
            polled = self._poll_source()
            if polled is not None:
                self._proposal = polled
        return self._proposal

    def _poll_source(self) -> BatchConfig | None:
        assert self.batch_source is not None
        try:
            return self.batch_source.batch_config(
                num_nodes=self.num_nodes, num_replicas=self.world_size
            )
        except Exception as exc:  # a failing source must not stop training
            self.log.warning("batch_config_unavailable", error=repr(exc))
            return None

    def _switch_config(self, config: BatchConfig) -> None:
        old = self.loader.batch_config
        self.loader.set_batch_config(config)
        self.collector.forget_previous()  # never pair gradients of two batch sizes
        self._warmup_left = self._warmup_steps
        self.log.info(
            "batch_config_changed",
            local_bsz=config.local_bsz,
            accum_steps=config.accum_steps,
            lr_scale=config.lr_scale,
            total_batch_size=config.total(self.world_size),
            previous_local_bsz=old.local_bsz,
            previous_accum_steps=old.accum_steps,
        )

    def _set_initial_config(self, restored: BatchConfig | None) -> None:
        config = restored
        if self.rank == 0 and self.batch_source is not None:
            self._next_poll = time.monotonic() + self._poll_interval_s
            polled = self._poll_source()
            if polled is not None:
                self._proposal = polled
                config = polled
        if self.world_size > 1:
            box: list[Any] = [None if config is None else config.as_dict()]
            dist.broadcast_object_list(box, src=0)
            config = None if box[0] is None else BatchConfig.from_dict(box[0])
        if config is not None:
            self.loader.set_batch_config(config)

    # -- internals: checkpoints and stopping -------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a restart needs, as plain data and CPU-loadable tensors."""
        return {
            "meta": {
                "job_id": self.env.job_id,
                "allocation_gen": self.env.allocation_gen,
                "world_size": self.world_size,
                "num_nodes": self.num_nodes,
                "init_batch_size": self.init_batch_size,
                "saved_at": time.time(),
                "stop_requested_at": self.stop_signal.requested_at,
            },
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
            "loader": self.loader.state_dict(),
            "batch_config": self.loader.batch_config.as_dict(),
            "scaling": self.scaling.state_dict(),
            "gns": self.gns.state_dict(),
            "profile": self.profile.state_dict(),
            "extra": {name: obj.state_dict() for name, obj in self._extra.items()},
        }

    def save(self) -> Path | None:
        """Write a checkpoint now (rank 0; a no-op elsewhere or when checkpointing is off).

        Raises:
            CheckpointError: It could not be written, or a registered object's state could not
                be loaded back from it (checked before anything is written).
        """
        self._last_checkpoint = time.monotonic()
        if not self.checkpoints.enabled or self.rank != 0:
            return None
        state = self.state_dict()
        for name, extra in state["extra"].items():
            check_loadable(f"extra state {name!r}", extra)
        return self.checkpoints.save(state)

    def _restore(self) -> BatchConfig | None:
        self._stop_requested_at: float | None = None
        state = load_agreed_checkpoint(
            self.checkpoints, rank=self.rank, world_size=self.world_size, log=self.log
        )
        if state is None:
            return None
        meta = state.get("meta", {})
        if int(meta.get("init_batch_size", self.init_batch_size)) != self.init_batch_size:
            raise InvalidValueError(
                "init_batch_size",
                f"the checkpoint was made with M0={meta['init_batch_size']}, now "
                f"{self.init_batch_size}; progress is counted in M0 steps, so keep M0",
            )
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.grad_scaler is not None and state.get("grad_scaler") is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        self.loader.load_state_dict(state["loader"])
        self.scaling.load_state_dict(state["scaling"])
        self.gns.load_state_dict(state["gns"])
        self.profile.load_state_dict(state["profile"])
        self._saved_extra = dict(state.get("extra", {}))
        stopped = meta.get("stop_requested_at")
        self._stop_requested_at = float(stopped) if isinstance(stopped, int | float) else None
        for name, obj in self._extra.items():
            if name in self._saved_extra:
                obj.load_state_dict(self._saved_extra.pop(name))
        self.log.info(
            "resumed",
            epoch=self.loader.epoch,
            position=self.loader.position,
            progress=round(self.scaling.progress, 3),
            steps=self.scaling.steps,
            previous_world_size=meta.get("world_size"),
        )
        if int(meta.get("world_size", 0)) == self.world_size:
            return BatchConfig.from_dict(state["batch_config"])
        return None

    def _check_stop(self) -> None:
        """Stop now if any replica was asked to (a collective when K > 1)."""
        requested = self.stop_signal.requested
        if any_replica(requested, world_size=self.world_size, device=self._comm_device):
            self._preempt()

    def _publish(self) -> None:
        """Hand the reporter what changed with this step: gradient statistics, work status."""
        if self.reporter is None:
            return
        if self.gns.measured:
            self.reporter.set_grad_stats(self.gns.stats)
        self.reporter.set_work(WorkStatus(self.progress, self.remaining_work, self.rescale_pause_s))

    def _measure_rescale_pause(self) -> None:
        """At this process's first step, record the pause since the last stop request.

        Only after a planned stop (the checkpoint holds its request time). Wall-clock times
        of two processes, possibly on two nodes: as exact as their clocks agree (NTP keeps
        that to milliseconds), and never negative.
        """
        if self._local_steps != 1 or self._stop_requested_at is None:
            return
        self.rescale_pause_s = max(0.0, time.time() - self._stop_requested_at)
        self.log.info(
            "rescale_pause",
            seconds=round(self.rescale_pause_s, 3),
            world_size=self.world_size,
            generation=self.env.allocation_gen,
        )

    def _preempt(self) -> NoReturn:
        """Checkpoint and raise `Preempted` (see `pollux.train.preemption.preempt`)."""
        if self.stop_signal.requested_at is None:
            # Another replica was signalled and all agreed to stop: the request is now, here.
            self.stop_signal.requested_at = time.time()
        preempt(
            self.save,
            self.close,
            world_size=self.world_size,
            device=self._comm_device,
            checkpoints=self.checkpoints,
            stop_signal=self.stop_signal,
            log=self.log,
            position={
                "epoch": self.epoch,
                "position": self.loader.position,
                "progress": round(self.progress, 3),
            },
        )

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Flush metrics, restore signal handlers, detach hooks and drop the DDP wrapper.

        Idempotent. Dropping the wrapper releases its hold on the process group, so that
        `shutdown` (or ``dist.destroy_process_group``) frees the group and its threads.
        """
        if self._closed:
            return
        self._closed = True
        if self.reporter is not None:
            self.reporter.close()
        if self._link is not None:
            self._link.close()
        if self._signals_installed:
            self.stop_signal.uninstall()
        self.collector.remove()
        self.ddp = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_reporter(
        self, sink: MetricsSink | None, interval_s: float
    ) -> MetricsReporter | None:
        if sink is None or self.rank != 0:
            return None
        reporter = MetricsReporter(
            sink,
            job_id=self.env.job_id,
            generation=self.env.allocation_gen,
            rank=self.rank,
            interval_s=interval_s,
            profile=self.profile,
        )
        reporter.start()
        return reporter

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("the trainer is closed; create a new one to train further")

    def _backend(self) -> str | None:
        if self.world_size == 1 or not dist.is_initialized():
            return None
        return str(dist.get_backend())

    def _count_nodes(self) -> int:
        if self.env.num_nodes is not None:
            return self.env.num_nodes
        if self.world_size == 1:
            return 1
        names: list[Any] = [None] * self.world_size
        dist.all_gather_object(names, socket.gethostname())
        return len(set(names))


@dataclass(slots=True)
class _Captured:
    """A step's gradient statistics, read at the end of its last backward pass."""

    work: Any = None
    """The in-flight control all-reduce (several replicas)."""
    buffer: torch.Tensor | None = None
    """Its buffer: [stop, config..., local norms per group] once complete."""
    total: torch.Tensor | None = None
    """|mean gradient|² per group."""
    local: torch.Tensor | None = None
    """Σ |micro-batch gradient|² per group (one replica with accumulation)."""
    differenced: torch.Tensor | None = None
    """[L, T] of the differenced estimator (one replica, no accumulation)."""


def _check_arguments(
    model: nn.Module,
    optimizer: Optimizer,
    init_batch_size: int,
    checkpoint_interval_s: float | None,
    config_poll_interval_s: float,
    profile_warmup_steps: int,
    stats_interval: int,
    agreement_period_s: float,
    report_interval_s: float,
) -> None:
    # Checked here, on every replica, so that a bad value fails everywhere before the first
    # collective rather than on rank 0 alone (where the reporter is built).
    if not report_interval_s > 0:
        raise InvalidValueError("report_interval_s", f"must be > 0, got {report_interval_s}")
    if isinstance(init_batch_size, bool) or not isinstance(init_batch_size, int):
        raise InvalidValueError("init_batch_size", f"must be an int, got {init_batch_size!r}")
    if init_batch_size < 1:
        raise InvalidValueError("init_batch_size", f"must be ≥ 1, got {init_batch_size}")
    if checkpoint_interval_s is not None and not checkpoint_interval_s > 0:
        raise InvalidValueError("checkpoint_interval_s", "must be > 0 or None")
    if not config_poll_interval_s >= 0:
        raise InvalidValueError("config_poll_interval_s", "must be ≥ 0")
    if profile_warmup_steps < 0:
        raise InvalidValueError("profile_warmup_steps", "must be ≥ 0")
    if isinstance(stats_interval, bool) or not isinstance(stats_interval, int):
        raise InvalidValueError("stats_interval", f"must be an int, got {stats_interval!r}")
    if stats_interval < 1:
        raise InvalidValueError("stats_interval", f"must be ≥ 1, got {stats_interval}")
    if not agreement_period_s >= 0:
        raise InvalidValueError("agreement_period_s", "must be ≥ 0")
    known = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not any(id(p) in known for p in model.parameters()):
        raise InvalidValueError(
            "optimizer", "optimizes none of the model's parameters; build it from them"
        )


def _agent_link(env: TrainEnv) -> AgentLink | None:
    """The gRPC link to the job's agents named by ``POLLUX_AGENT_ADDR``, or None without one.

    Imported here, not at the top, so that `pollux.train` itself never loads gRPC: a script run
    outside a cluster, or with its own source and sink, does not pay for it.
    """
    if env.agent_addr is None:
        return None
    from pollux.train.agent_link import AgentLink  # noqa: PLC0415 - optional control plane

    addresses = [a.strip() for a in env.agent_addr.split(",") if a.strip()]
    if not addresses:
        return None
    return AgentLink(addresses, env.job_id, credential=env.job_credential, ca_file=env.tls_ca)


def _dense_grad(param: torch.Tensor) -> torch.Tensor:
    """The gradient as a dense tensor (sparse ones, e.g. of ``Embedding(sparse=True)``)."""
    assert param.grad is not None
    return param.grad.to_dense() if param.grad.is_sparse else param.grad
