"""Atomic checkpoints and the planned-stop signal (docs/architecture.md §7).

A checkpoint is one file, ``<dir>/checkpoint.pt``, written to a temporary file in the same
directory, fsynced, renamed over the previous one, and the directory fsynced: a process killed
at any point leaves the previous checkpoint or the new one, never a mixture. Only rank 0 writes
(every replica holds the same state), and never once a newer allocation generation owns the
directory. A checkpoint that exists but cannot be read is an error, not a fresh start; files
are loaded with ``weights_only=True``. `StopSignal` turns SIGTERM into a flag the trainer polls
at step boundaries; a second signal ends the process at once. What the replicas do together is
`pollux.train.preemption` (docs/architecture.md, "The training library").
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
import torch

from pollux.train.errors import CheckpointError, InvalidValueError

log = structlog.get_logger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT = "pollux.train/1"
"""Format tag stored in every checkpoint; bumped on incompatible changes."""
GENERATION_NAME = ".pollux-generation"
"""The fence file of the environment contract: the launcher writes the newest allocation
generation that started replicas on the directory (docs/architecture.md §7)."""


def owning_generation(directory: Path) -> int | None:
    """The generation the launcher last started on `directory`, or None if none is recorded."""
    try:
        return int((directory / GENERATION_NAME).read_text().strip())
    except (OSError, ValueError):
        return None


class CheckpointManager:
    """Saves and loads a job's checkpoint in one directory.

    Args:
        directory: The checkpoint directory (created on first save), or None to disable
            checkpointing (`save` and `load` then do nothing).
        rank: This replica's rank; only rank 0 writes.
        generation: This replica's allocation generation, or None outside a launcher. A
            replica refuses to write once a newer generation owns the directory (its fence
            file says so): a stale replica that outlived its allocation never overwrites the
            checkpoint the new one trains from.
    """

    def __init__(
        self, directory: Path | str | None, *, rank: int = 0, generation: int | None = None
    ) -> None:
        self.directory = None if directory is None else Path(directory)
        self.rank = rank
        self.generation = generation

    @property
    def enabled(self) -> bool:
        """Whether a checkpoint directory is configured."""
        return self.directory is not None

    @property
    def path(self) -> Path | None:
        """The checkpoint file, or None when checkpointing is off."""
        return None if self.directory is None else self.directory / CHECKPOINT_NAME

    def save(self, state: dict[str, Any]) -> Path | None:
        """Write `state` atomically (rank 0 only); returns the file written, or None.

        Raises:
            CheckpointError: The directory or file could not be written; the previous
                checkpoint is untouched.
        """
        if self.directory is None or self.rank != 0:
            return None
        target = self.directory / CHECKPOINT_NAME
        started = time.perf_counter()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(str(target), f"cannot create the directory: {exc}") from exc
        owner = owning_generation(self.directory)
        if self.generation is not None and owner is not None and owner > self.generation:
            raise CheckpointError(
                str(target),
                f"generation {owner} owns this directory; this replica (generation "
                f"{self.generation}) is stale and must not write",
            )
        self._remove_stale_temporaries()
        tmp = self.directory / f".{CHECKPOINT_NAME}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        payload = {"format": FORMAT, "created_at": time.time(), "state": state}
        try:
            with open(tmp, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            _fsync_directory(self.directory)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(exc, Exception):
                raise CheckpointError(str(target), f"write failed: {exc!r}") from exc
            raise
        log.info(
            "checkpoint_saved",
            path=str(target),
            bytes=target.stat().st_size,
            seconds=round(time.perf_counter() - started, 4),
        )
        return target

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when there is no checkpoint (a fresh start).

        Raises:
            CheckpointError: The checkpoint exists but is unreadable or of an unknown format.
        """
        target = self.path
        if target is None or not target.exists():
            return None
        try:
            payload = torch.load(target, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(
                str(target), f"cannot be read ({exc!r}); move it away to start fresh"
            ) from exc
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
            raise CheckpointError(str(target), f"format {found!r} is not {FORMAT!r}")
        state = payload["state"]
        if not isinstance(state, dict):
            raise CheckpointError(str(target), "holds no state dictionary")
        log.info("checkpoint_loaded", path=str(target), created_at=payload.get("created_at"))
        return state

    def _remove_stale_temporaries(self) -> None:
        assert self.directory is not None
        for leftover in _temporaries(self.directory):
            with contextlib.suppress(OSError):
                leftover.unlink()
                log.info("checkpoint_stale_temporary_removed", path=str(leftover))


def _temporaries(directory: Path) -> Iterable[Path]:
    return directory.glob(f".{CHECKPOINT_NAME}.*.tmp")


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StopSignal:
    """Turns SIGTERM (by default) into a flag that the training loop polls.

    Args:
        signals: The signals that request a planned stop.
    """

    def __init__(self, signals: Iterable[signal.Signals] = (signal.SIGTERM,)) -> None:
        self.signals = tuple(signals)
        if not self.signals:
            raise InvalidValueError("signals", "give at least one signal")
        self._requested = threading.Event()
        self._previous: dict[signal.Signals, Any] = {}
        self.received: signal.Signals | None = None
        """The signal that requested the stop, if one did."""
        self.requested_at: float | None = None
        """Wall-clock time (``time.time()``) of the first stop request: the start of a rescale
        pause, which the next generation measures from the checkpoint (trainer.py)."""

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self._requested.is_set()

    def request(self) -> None:
        """Request a stop without a signal (e.g. from a test or a health check)."""
        if self.requested_at is None:
            self.requested_at = time.time()
        self._requested.set()

    def install(self) -> bool:
        """Install the handlers; False (and nothing installed) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("stop_signal_not_installed", reason="not the main thread")
            return False
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        """Restore the handlers that were there before `install`."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        sig = signal.Signals(signum)
        if self._requested.is_set():
            # Second signal: the user (or launcher) insists; die the default way right now.
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return
        self.received = sig
        self.requested_at = time.time()
        self._requested.set()


def check_loadable(name: str, state: Any) -> None:
    """Raise now if `state` could be saved but not loaded back by `CheckpointManager.load`.

    Checkpoints are read with ``torch.load(weights_only=True)`` (loading one never runs code
    from the file), which accepts tensors, numbers, strings and containers of them. The
    trainer's own state is made of those; a user's registered state (RNG states as numpy
    arrays, custom classes) may not be, and finding out only when a preempted job restarts
    would leave it unable to resume. This round-trips `state` through memory.

    Raises:
        CheckpointError: `state` holds a type that a weights-only load refuses.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            name,
            "its state_dict() holds a type that checkpoints cannot load (only tensors, "
            "numbers, strings, None and lists/tuples/dicts of them); convert it, e.g. numpy "
            f"arrays with torch.as_tensor: {exc}",
        ) from exc
