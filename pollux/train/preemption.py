"""The replicas' side of checkpoints: one checkpoint to resume, one step to stop at, exit 143.

`CheckpointManager` writes one file and `StopSignal` turns SIGTERM into a flag
(`pollux.train.checkpoint`); this module is what the replicas do with them together, so that a
job of several replicas resumes, stops and fails as one (docs/architecture.md §7):

- **Resume.** If the replicas' views of the checkpoint differ, rank 0's state wins.
- **Stop.** The replicas agree on the step to stop at (`any_replica` at epoch boundaries, the
  step's agreement otherwise); `preempt` has rank 0 write the checkpoint, makes every replica
  wait until it is durable and raises `Preempted` (exit 143), or the same `CheckpointError` on
  every replica. `PlannedStop` is one trainer's side of it, the next start's pause included.
- **Periodic checkpoints** are insurance: a failure is only logged, since the other replicas
  have gone on already.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, cast

import torch
import torch.distributed as dist
from structlog.typing import FilteringBoundLogger

from pollux.train.checkpoint import CheckpointManager, StopSignal
from pollux.train.distributed import Replicas, any_replica
from pollux.train.errors import CheckpointError, Preempted


def load_agreed_checkpoint(
    checkpoints: CheckpointManager, *, rank: int, world_size: int, log: FilteringBoundLogger
) -> dict[str, Any] | None:
    """The checkpointed state every replica resumes from, or None for a fresh start.

    Every replica reads the file; if any sees something other than rank 0 (a node-local
    directory, a lagging network filesystem), rank 0's state is broadcast to all.
    """
    state = checkpoints.load() if checkpoints.enabled else None
    if world_size == 1:
        return state
    stamp = None if state is None else state.get("meta", {}).get("saved_at")
    stamps: list[Any] = [None] * world_size
    dist.all_gather_object(stamps, stamp)
    if all(s == stamps[0] for s in stamps):
        return state
    log.warning("checkpoint_views_differ", stamps=stamps)
    box: list[Any] = [state if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return cast(dict[str, Any] | None, box[0])


def periodic_checkpoint_due(
    *, rank: int, interval_s: float | None, last_s: float, now_s: float
) -> bool:
    """Whether rank 0 owes a periodic checkpoint (monotonic seconds; None: no interval)."""
    return interval_s is not None and rank == 0 and now_s - last_s >= interval_s


def save_periodic_checkpoint(save: Callable[[], Path | None], log: FilteringBoundLogger) -> None:
    """Call `save`; a `CheckpointError` is logged, not raised.

    The other replicas are already in the next step, so failing here alone would hang them;
    the stop and the end still checkpoint, and fail loudly.
    """
    try:
        save()
    except CheckpointError as error:
        log.warning("periodic_checkpoint_failed", error=str(error))


def preempt(
    save: Callable[[], Path | None],
    close: Callable[[], None],
    *,
    world_size: int,
    device: torch.device,
    checkpoints: CheckpointManager,
    stop_signal: StopSignal,
    log: FilteringBoundLogger,
    position: Mapping[str, Any],
) -> NoReturn:
    """Stop at the agreed step: checkpoint, wait for it everywhere, raise `Preempted`.

    Every replica calls it at the same step. Rank 0 writes the checkpoint with `save` (a no-op
    elsewhere); the flag all-reduce that follows is also the barrier, so nobody exits before
    the checkpoint is durable, and every replica learns whether it was written.

    Args:
        save: Writes the checkpoint (rank 0), returning its path or None.
        close: Releases the trainer (reporter, agent link, signal handlers, hooks).
        world_size: Replicas K.
        device: The collectives' device.
        checkpoints: The job's checkpoints (for the path named in errors).
        stop_signal: The signal that requested the stop, for the log.
        log: The trainer's logger.
        position: Where training stopped, for the log (epoch, position, progress).

    Raises:
        Preempted: The checkpoint is written (exit code 143).
        CheckpointError: It could not be written, raised on every replica.
    """
    path, failure = None, None
    try:
        path = save()
    except CheckpointError as error:
        failure = error
    failed = any_replica(failure is not None, world_size=world_size, device=device)
    if failure is None and failed:
        failure = CheckpointError(str(checkpoints.path), "rank 0 could not write it; see its log")
    if failure is not None:
        close()
        raise failure
    received = stop_signal.received
    log.info(
        "preempted",
        signal=None if received is None else received.name,
        checkpoint=None if path is None else str(path),
        **position,
    )
    close()
    if world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()  # the process is about to exit
    raise Preempted(None if path is None else str(path))


class PlannedStop:
    """One replica's planned stop: SIGTERM as a flag, stopping with the others, its cost.

    Args:
        replicas: The job's process group.
        checkpoints: The job's checkpoints (named when the stop's checkpoint fails).
        save: Writes the checkpoint (rank 0), returning its path or None.
        close: Releases the trainer (reporter, agent link, signal handlers, hooks).
        position: Where training stands, for the log (epoch, position, progress).
        log: The trainer's logger.
        generation: This replica's allocation generation, for the log.
    """

    def __init__(
        self,
        replicas: Replicas,
        checkpoints: CheckpointManager,
        *,
        save: Callable[[], Path | None],
        close: Callable[[], None],
        position: Callable[[], Mapping[str, Any]],
        log: FilteringBoundLogger,
        generation: int = 0,
    ) -> None:
        self.signal = StopSignal()
        self.generation = generation
        self.replicas = replicas
        self.checkpoints = checkpoints
        self.previous_request: float | None = None
        """Wall-clock time of the stop request that ended the previous allocation (from the
        checkpoint), or None after a fresh start or a restart without a planned stop."""
        self._save = save
        self._close = close
        self._position = position
        self._log = log
        self._installed = False

    def install(self, wanted: bool) -> None:
        """Install the SIGTERM handler if `wanted` (main thread only)."""
        self._installed = wanted and self.signal.install()

    def uninstall(self) -> None:
        """Restore the previous handlers, if `install` installed ours."""
        if self._installed:
            self.signal.uninstall()
            self._installed = False

    def rescale_pause_s(self, now: float) -> float | None:
        """Seconds from the previous allocation's stop request to wall-clock `now`, or None.

        Times of two processes, possibly on two nodes: as exact as their clocks agree (NTP
        keeps that to milliseconds), and never negative. Logged as ``rescale_pause``.
        """
        if self.previous_request is None:
            return None
        pause = max(0.0, now - self.previous_request)
        self._log.info(
            "rescale_pause",
            seconds=round(pause, 3),
            world_size=self.replicas.world_size,
            generation=self.generation,
        )
        return pause

    def check(self) -> None:
        """Stop now if any replica was asked to (a collective when K > 1)."""
        if self.replicas.any(self.signal.requested):
            self.stop()

    def stop(self) -> NoReturn:
        """Checkpoint and raise `Preempted` (see `preempt`); every replica calls it alike."""
        if self.signal.requested_at is None:
            # Another replica was signalled and all agreed to stop: the request is now, here.
            self.signal.requested_at = time.time()
        preempt(
            self._save,
            self._close,
            world_size=self.replicas.world_size,
            device=self.replicas.comm_device,
            checkpoints=self.checkpoints,
            stop_signal=self.signal,
            log=self._log,
            position=self._position(),
        )
