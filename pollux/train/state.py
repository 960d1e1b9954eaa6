"""The trainer's checkpoints: what is saved, when, and what a restart resumes from.

`TrainingParts` are the loop's parts a checkpoint holds; `TrainerCheckpoints` keeps the job's
`CheckpointManager` (`pollux.train.checkpoint`), the user's registered objects (LR schedulers,
EMA models), the periodic checkpoint's due time and the state read at start, from which
objects registered later are restored. What the replicas
do together (one view of the checkpoint, stop, wait for it) is `pollux.train.preemption`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from structlog.typing import FilteringBoundLogger
from torch import nn
from torch.optim import Optimizer

from pollux.train.amp import MixedPrecision
from pollux.train.checkpoint import CheckpointManager, check_loadable
from pollux.train.config import CheckpointConfig
from pollux.train.data import AdaptiveDataLoader, BatchConfig
from pollux.train.distributed import Replicas
from pollux.train.env import TrainEnv
from pollux.train.errors import InvalidValueError
from pollux.train.gns import GradientNoiseScale
from pollux.train.metrics import StepProfile
from pollux.train.preemption import (
    load_agreed_checkpoint,
    periodic_checkpoint_due,
    save_periodic_checkpoint,
)
from pollux.train.scaling import ScaledOptimizer


class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict`` (LR schedulers, EMA models, ...)."""

    def state_dict(self) -> dict[str, Any]:
        """The object's state as plain data and tensors."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """Restore `state_dict` output."""
        ...


@dataclass(frozen=True, slots=True)
class TrainingParts:
    """The parts of a training loop that a checkpoint holds, besides the user's objects."""

    module: nn.Module
    optimizer: Optimizer
    amp: MixedPrecision
    loader: AdaptiveDataLoader
    scaling: ScaledOptimizer
    gns: GradientNoiseScale
    profile: StepProfile

    def state_dict(self) -> dict[str, Any]:
        """Their states, as plain data and CPU-loadable tensors."""
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": self.amp.state_dict(),
            "loader": self.loader.state_dict(),
            "batch_config": self.loader.batch_config.as_dict(),
            "scaling": self.scaling.state_dict(),
            "gns": self.gns.state_dict(),
            "profile": self.profile.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` output (the batch configuration is the caller's to adopt)."""
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.amp.load_state_dict(state.get("grad_scaler"))
        self.loader.load_state_dict(state["loader"])
        self.scaling.load_state_dict(state["scaling"])
        self.gns.load_state_dict(state["gns"])
        self.profile.load_state_dict(state["profile"])


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a restart learned from the checkpoint it resumed from.

    Attributes:
        meta: The checkpoint's ``meta`` (job, generation, world size, times).
        batch_config: The batch configuration it was trained with, if it was trained with as
            many replicas as now (else None: a configuration is chosen for a shape).
        stop_requested_at: Wall-clock time of the stop request that ended the previous
            allocation, or None when it ended without a planned stop.
    """

    meta: Mapping[str, Any]
    batch_config: BatchConfig | None
    stop_requested_at: float | None


def check_resumable(meta: Mapping[str, Any], init_batch_size: int) -> None:
    """Refuse a checkpoint made with another M0 (progress is counted in M0-steps).

    Raises:
        InvalidValueError: The checkpoint's ``init_batch_size`` differs.
    """
    saved = int(meta.get("init_batch_size", init_batch_size))
    if saved != init_batch_size:
        raise InvalidValueError(
            "init_batch_size",
            f"the checkpoint was made with M0={saved}, now {init_batch_size}; progress is "
            "counted in M0 steps, so keep M0",
        )


class TrainerCheckpoints:
    """Saving and resuming one trainer's state.

    Args:
        config: Directory, on/off and periodic interval.
        env: The environment contract (the default directory, the generation that fences it).
        replicas: The job's process group (rank 0 writes; all read one view).
        parts: The loop's parts that a checkpoint holds.
        extra: The user's objects to checkpoint by name.
        log: The trainer's logger.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        env: TrainEnv,
        replicas: Replicas,
        parts: TrainingParts,
        *,
        extra: Mapping[str, Stateful] | None,
        log: FilteringBoundLogger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        directory = config.directory if config.directory is not None else env.checkpoint_dir
        self.manager = CheckpointManager(
            directory if config.enabled else None,
            rank=replicas.rank,
            generation=env.allocation_gen or None,  # 0: not started by a launcher
        )
        self.interval_s = config.interval_s
        self.env = env
        self.replicas = replicas
        self.parts = parts
        self.extra: dict[str, Stateful] = dict(extra or {})
        """Registered objects, by name."""
        self._unclaimed: dict[str, Any] = {}
        self._log = log
        self._clock = clock
        self._last_save = clock()

    def register(self, name: str, obj: Stateful) -> None:
        """Checkpoint `obj` under `name`; restored at once if the resumed state holds it."""
        if not name or name in self.extra:
            raise InvalidValueError("name", f"{name!r} is empty or already registered")
        self.extra[name] = obj
        if name in self._unclaimed:
            obj.load_state_dict(self._unclaimed.pop(name))

    def state(self, init_batch_size: int, stop_requested_at: float | None) -> dict[str, Any]:
        """Everything a restart needs: what and when, the parts' states, the objects' states.

        Args:
            init_batch_size: M0, which a restart must keep.
            stop_requested_at: Wall-clock time of this allocation's stop request, if any (the
                next allocation measures its rescale pause from it).
        """
        meta = {
            "job_id": self.env.job_id,
            "allocation_gen": self.env.allocation_gen,
            "world_size": self.replicas.world_size,
            "num_nodes": self.replicas.num_nodes,
            "init_batch_size": init_batch_size,
            "saved_at": time.time(),
            "stop_requested_at": stop_requested_at,
        }
        extra = {name: obj.state_dict() for name, obj in self.extra.items()}
        return {"meta": meta, **self.parts.state_dict(), "extra": extra}

    def resume(self, init_batch_size: int) -> Resumed | None:
        """Restore the parts and objects from the agreed checkpoint; None for a fresh start.

        A collective when K > 1 (every replica resumes from rank 0's view).

        Raises:
            InvalidValueError: The checkpoint was made with another M0.
            CheckpointError: The checkpoint exists but cannot be read.
        """
        state = load_agreed_checkpoint(
            self.manager,
            rank=self.replicas.rank,
            world_size=self.replicas.world_size,
            log=self._log,
        )
        if state is None:
            return None
        meta = state.get("meta", {})
        check_resumable(meta, init_batch_size)
        self.parts.load_state_dict(state)
        self._unclaimed = dict(state.get("extra", {}))
        for name, obj in self.extra.items():
            if name in self._unclaimed:
                obj.load_state_dict(self._unclaimed.pop(name))
        loader, scaling = self.parts.loader, self.parts.scaling
        self._log.info(
            "resumed",
            epoch=loader.epoch,
            position=loader.position,
            progress=round(scaling.progress, 3),
            steps=scaling.steps,
            previous_world_size=meta.get("world_size"),
        )
        config = None
        if int(meta.get("world_size", 0)) == self.replicas.world_size:
            config = BatchConfig.from_dict(state["batch_config"])
        stopped = meta.get("stop_requested_at")
        return Resumed(meta, config, float(stopped) if isinstance(stopped, int | float) else None)

    def save(self, state: Callable[[], dict[str, Any]]) -> Path | None:
        """Write `state()` now (rank 0; a no-op elsewhere or when checkpointing is off).

        Raises:
            CheckpointError: It could not be written, or a registered object's state could not
                be loaded back from it (checked before anything is written).
        """
        self._last_save = self._clock()
        if not self.manager.enabled or not self.replicas.leader:
            return None
        snapshot = state()
        for name, extra in snapshot.get("extra", {}).items():
            check_loadable(f"extra state {name!r}", extra)
        return self.manager.save(snapshot)

    def save_if_due(self, state: Callable[[], dict[str, Any]]) -> None:
        """The periodic checkpoint: rank 0 saves once the interval passed; failures are logged."""
        if periodic_checkpoint_due(
            rank=self.replicas.rank,
            interval_s=self.interval_s,
            last_s=self._last_save,
            now_s=self._clock(),
        ):
            save_periodic_checkpoint(lambda: self.save(state), self._log)
