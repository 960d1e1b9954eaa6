"""Adaptive, elastic, resumable data loading (reference §8.4, with its gaps closed).

An epoch is one pass in a fixed order (a seeded permutation for map-style datasets, the stream
for iterable ones); the loader's only position is how many samples of the epoch all replicas
consumed in completed optimizer steps. Micro-batch j of replica r is the slice
``[j·K·m + r·m, j·K·m + (r+1)·m)`` of the step's window, so a restart on any number of replicas
or batch size continues from the same position and every sample is used once per epoch. A
batch-size change takes effect at the next step boundary. An epoch's last step uses exactly
the samples left (an *irregular* step; a replica left without any is told through
`on_empty_step`). The position advances when a step finishes (`finish_step`), so a checkpoint
never counts a step whose update was not applied (docs/architecture.md, "The training
library").
"""

from __future__ import annotations

import functools
import math
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from pollux import checks
from pollux.train.errors import InvalidValueError, UsageError


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """The batch configuration a replica trains with (proto `BatchConfig`).

    Attributes:
        local_bsz: Samples per micro-batch per replica (m); ≥ 1.
        accum_steps: Micro-batches per optimizer step (s); ≥ 1, 1 = no accumulation.
        lr_scale: Explicit learning-rate factor overriding the scaling rule, or None to let the
            trainer's rule compute it from the batch scale.
    """

    local_bsz: int
    accum_steps: int = 1
    lr_scale: float | None = None

    def __post_init__(self) -> None:
        for name in ("local_bsz", "accum_steps"):
            checks.whole_number(
                getattr(self, name), least=1, error=InvalidValueError.of(f"batch_config.{name}")
            )
        if self.lr_scale is not None and not (math.isfinite(self.lr_scale) and self.lr_scale > 0):
            raise InvalidValueError(
                "batch_config.lr_scale", f"must be finite and > 0 or None: {self.lr_scale!r}"
            )

    def total(self, num_replicas: int) -> int:
        """Total batch M = K · m · s of one optimizer step on `num_replicas` replicas."""
        return num_replicas * self.local_bsz * self.accum_steps

    def as_dict(self) -> dict[str, Any]:
        """Plain data for checkpoints and logs."""
        return {
            "local_bsz": self.local_bsz,
            "accum_steps": self.accum_steps,
            "lr_scale": self.lr_scale,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchConfig:
        """Inverse of `as_dict`."""
        lr = data.get("lr_scale")
        return cls(
            local_bsz=int(data["local_bsz"]),
            accum_steps=int(data["accum_steps"]),
            lr_scale=None if lr is None else float(lr),
        )


@runtime_checkable
class BatchConfigSource(Protocol):
    """Where the trainer gets its batch configuration (the job's agent, or a fixed choice).

    The trainer calls it on rank 0 only, on the training thread, at start and then at most once
    per poll interval at an optimizer-step boundary, and broadcasts the answer to every replica
    with the step's own collective. It must return quickly: an implementation that talks to a
    server should cache the latest answer and refresh it in the background (or use a short
    timeout). Raising is allowed: the trainer logs it and keeps its current configuration.
    """

    def batch_config(self, *, num_nodes: int, num_replicas: int) -> BatchConfig | None:
        """The configuration to use on this allocation, or None for "no opinion yet".

        Args:
            num_nodes: Distinct nodes N of the job's allocation.
            num_replicas: Replicas K of the allocation.
        """
        ...


class FixedBatchConfig:
    """A `BatchConfigSource` that always answers with one configuration."""

    def __init__(self, config: BatchConfig) -> None:
        self.config = config

    def batch_config(self, *, num_nodes: int, num_replicas: int) -> BatchConfig:
        """The fixed configuration, whatever the allocation."""
        del num_nodes, num_replicas
        return self.config


def default_batch_config(init_batch_size: int, num_replicas: int) -> BatchConfig:
    """The configuration used before any source answers: ⌈M0/K⌉ per replica, no accumulation.

    This keeps the total batch at M0 (rounded up), the batch the learning rate was tuned for.
    """
    if init_batch_size < 1 or num_replicas < 1:
        raise InvalidValueError(
            "init_batch_size", f"M0 and K must be ≥ 1, got {init_batch_size}, {num_replicas}"
        )
    return BatchConfig(local_bsz=-(-init_batch_size // num_replicas), accum_steps=1)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One optimizer step of the global sample order, seen from one replica.

    Attributes:
        start: Epoch position (samples consumed by all replicas) at the step's start.
        samples: Samples the whole step consumes across replicas (R).
        regular: True when every replica runs ``accum_steps`` micro-batches of exactly
            ``local_bsz`` samples; False for an epoch's tail.
        slices: This replica's micro-batches as (offset from `start`, length).
        config: The configuration the step runs with.
    """

    start: int
    samples: int
    regular: bool
    slices: tuple[tuple[int, int], ...]
    config: BatchConfig


def plan_step(
    start: int, available: int, num_replicas: int, rank: int, config: BatchConfig
) -> StepPlan:
    """Plan the step beginning at `start` with `available` samples left in the epoch.

    Pure and deterministic: every replica computes the same plan for the same inputs, which is
    what keeps replicas in step without any communication.

    Args:
        start: Epoch position at the step's start.
        available: Samples left in the epoch (or in the buffered stream), ≥ 1.
        num_replicas: K.
        rank: This replica's rank.
        config: The configuration for the step.
    """
    if available < 1:
        raise InvalidValueError("available", f"a step needs at least one sample, got {available}")
    if not 0 <= rank < num_replicas:
        raise InvalidValueError("rank", f"must be in [0, {num_replicas}), got {rank}")
    k, m, s = num_replicas, config.local_bsz, config.accum_steps
    full = config.total(k)
    if available >= full:
        return StepPlan(start, full, True, _regular_slices(k, m, s, rank), config)
    base, extra = divmod(available, k)
    mine = base + (1 if rank < extra else 0)
    offset = rank * base + min(rank, extra)
    if mine == 0:
        return StepPlan(start, available, False, (), config)
    parts = -(-mine // m)
    size, bigger = divmod(mine, parts)
    out: list[tuple[int, int]] = []
    for j in range(parts):
        n = size + (1 if j < bigger else 0)
        out.append((offset, n))
        offset += n
    return StepPlan(start, available, False, tuple(out), config)


@functools.lru_cache(maxsize=64)
def _regular_slices(k: int, m: int, s: int, rank: int) -> tuple[tuple[int, int], ...]:
    return tuple((j * k * m + rank * m, m) for j in range(s))


class MicroBatchInfo(NamedTuple):
    """Where a micro-batch sits in its optimizer step.

    (A named tuple: one is made per micro-batch, on the training loop's critical path.)

    Attributes:
        epoch: Epoch of the micro-batch.
        step: Steps started by this loader before this one (a process-local counter).
        micro_index: Position of the micro-batch among this replica's micro-batches of the
            step (0 = first).
        micro_count: Micro-batches this replica runs in the step.
        size: Samples in this micro-batch.
        plan: The step's plan.
    """

    epoch: int
    step: int
    micro_index: int
    micro_count: int
    size: int
    plan: StepPlan

    @property
    def is_last(self) -> bool:
        """Whether this is the replica's last micro-batch of the step (its sync point)."""
        return self.micro_index == self.micro_count - 1

    @property
    def regular(self) -> bool:
        """Whether the step is a regular (full) one; see `StepPlan.regular`."""
        return self.plan.regular


class MicroBatch(NamedTuple):
    """A micro-batch of data with its position (`MicroBatchInfo`)."""

    info: MicroBatchInfo
    data: Any


class AdaptiveDataLoader:
    """Serves one replica's micro-batches of an elastic, resumable epoch (module docstring).

    Args:
        dataset: A map-style `Dataset` with ``__len__`` or an `IterableDataset`.
        batch_config: The initial configuration.
        rank: This replica's rank.
        num_replicas: K, the number of replicas.
        shuffle: Permute map-style datasets each epoch (seeded by `seed` and the epoch).
        seed: Seed of the permutations; every replica must use the same one.
        collate_fn: Builds a batch from a list of samples; default torch's `default_collate`.
        num_workers: Worker processes for loading (map-style: any; iterable: 0 or 1, so that
            the stream order is preserved).
        pin_memory: Pin batches in page-locked memory (for faster host-to-GPU copies).
        device: Move each batch's tensors to this device before yielding it; None keeps them.
    """

    def __init__(
        self,
        dataset: Dataset[Any] | IterableDataset[Any],
        batch_config: BatchConfig,
        *,
        rank: int = 0,
        num_replicas: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        device: torch.device | None = None,
    ) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise InvalidValueError(
                "rank", f"must be in [0, num_replicas={num_replicas}), got {rank}"
            )
        if num_workers < 0:
            raise InvalidValueError("num_workers", f"must be ≥ 0, got {num_workers}")
        self.dataset = dataset
        self.iterable = isinstance(dataset, IterableDataset)
        if self.iterable and num_workers > 1:
            raise InvalidValueError(
                "num_workers",
                "an iterable dataset keeps its sample order only with 0 or 1 workers; "
                "shard or parallelise inside the dataset instead",
            )
        self._len: int | None = None
        if not self.iterable:
            try:
                self._len = len(dataset)  # type: ignore[arg-type]
            except TypeError:
                raise InvalidValueError(
                    "dataset", "a map-style dataset must define __len__ (or be an IterableDataset)"
                ) from None
            if self._len < 1:
                raise InvalidValueError("dataset", "is empty")
        self.rank = rank
        self.num_replicas = num_replicas
        self.shuffle = shuffle
        self.seed = int(seed)
        self.collate_fn: Callable[[list[Any]], Any] = collate_fn or default_collate
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.device = device
        self.on_empty_step: Callable[[MicroBatchInfo], None] | None = None
        """Called when this replica has no micro-batch in a step (see module docstring)."""
        self._config = batch_config
        self._pending: BatchConfig | None = None
        self._epoch = 0
        self._pos = 0
        self._samples_total = 0
        self._steps = 0
        self._plan: StepPlan | None = None
        self._plan_done = True
        self._iterating = False
        self.current: MicroBatchInfo | None = None
        """The latest micro-batch handed out."""

    # -- configuration -----------------------------------------------------------------------

    @property
    def batch_config(self) -> BatchConfig:
        """The configuration of the current (or next) step."""
        return self._config if self._pending is None else self._pending

    def set_batch_config(self, config: BatchConfig) -> None:
        """Switch configuration at the next optimizer-step boundary."""
        if config == self._config:
            self._pending = None
        else:
            self._pending = config

    @property
    def epoch(self) -> int:
        """The current epoch (number of completed passes)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Samples of the current epoch consumed by all replicas in finished steps."""
        return self._pos

    @property
    def dataset_len(self) -> int | None:
        """Samples per epoch, or None for an iterable dataset."""
        return self._len

    @property
    def samples_total(self) -> int:
        """Samples consumed by all replicas in finished steps since the job began."""
        return self._samples_total

    @property
    def step_in_progress(self) -> bool:
        """Whether a step was started and not finished."""
        return not self._plan_done

    def finish_step(self) -> None:
        """Mark the current step as done: its samples count as consumed from now on."""
        if self._plan is None or self._plan_done:
            return
        self._pos = self._plan.start + self._plan.samples
        self._samples_total += self._plan.samples
        self._plan_done = True

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """This replica's micro-batches for the rest of the current epoch."""
        for micro in self.micro_batches():
            yield micro.data

    def micro_batches(self) -> Iterator[MicroBatch]:
        """Like iteration, but with each micro-batch's `MicroBatchInfo`.

        Ends at the end of the epoch, after which `epoch` has advanced and the position is 0.
        A step left unfinished (the consumer stopped mid-step) is replayed from its start.
        """
        if self._iterating:
            raise UsageError("the loader is already being iterated; finish that loop first")
        self._iterating = True
        try:
            if self.iterable:
                yield from self._iterable_epoch()
            else:
                yield from self._map_epoch()
        finally:
            self._iterating = False
            if not self._plan_done:
                # Interrupted mid-step: the step's samples are served again next time.
                self._plan = None
                self._plan_done = True

    def _next_config(self) -> BatchConfig:
        if self._pending is not None:
            self._config, self._pending = self._pending, None
        return self._config

    def _begin(self, plan: StepPlan) -> None:
        self._plan = plan
        self._plan_done = False
        self._steps += 1

    def _serve(self, plan: StepPlan, batches: Iterator[Any]) -> Iterator[MicroBatch]:
        """Yield the plan's micro-batches from `batches` (already in plan order)."""
        count = len(plan.slices)
        step = self._steps - 1
        if count == 0:
            self._serve_nothing(plan)
            return
        for index, (_, size) in enumerate(plan.slices):
            data = next(batches)
            info = MicroBatchInfo(self._epoch, step, index, count, size, plan)
            self.current = info
            yield MicroBatch(info, self._to_device(data))
        self.finish_step()

    def _map_epoch(self) -> Iterator[MicroBatch]:
        assert self._len is not None  # map-style
        order = self.order(self._epoch)
        while self._pos < self._len:
            segment_start = self._pos
            config = self._next_config()
            plans = self._plans_from(segment_start, config)
            if self.num_workers == 0:
                yield from self._serve_in_process(order.tolist(), plans)
            else:
                # Workers prefetch a whole segment (steps of one configuration); a config change
                # ends the segment and the next one starts from the committed position.
                index_lists = [
                    order[p.start + off : p.start + off + n].tolist()
                    for p in self._plans_from(segment_start, config)
                    for off, n in p.slices
                ]
                loader = DataLoader(
                    self.dataset,
                    batch_sampler=index_lists,
                    num_workers=self.num_workers,
                    collate_fn=self.collate_fn,
                    pin_memory=self.pin_memory,
                    worker_init_fn=ignore_stop_signals,
                )
                stream = iter(loader)
                for plan in plans:
                    self._begin(plan)
                    yield from self._serve(plan, stream)
                    if self._pending is not None:
                        break
                del stream
        self._end_epoch()

    def _serve_in_process(
        self, order: list[int], plans: Iterator[StepPlan]
    ) -> Iterator[MicroBatch]:
        """The plans' micro-batches, fetched in this process (the common, hot path)."""
        dataset = self.dataset
        getitems = getattr(dataset, "__getitems__", None)  # batch fetch, as torch's DataLoader
        collate = self.collate_fn
        for plan in plans:
            self._begin(plan)
            count = len(plan.slices)
            if count == 0:
                self._serve_nothing(plan)
            else:
                step, epoch = self._steps - 1, self._epoch
                for index, (off, size) in enumerate(plan.slices):
                    first = plan.start + off
                    indices = order[first : first + size]
                    if callable(getitems):
                        samples = getitems(indices)
                    else:
                        samples = [dataset[i] for i in indices]
                    info = MicroBatchInfo(epoch, step, index, count, size, plan)
                    self.current = info
                    yield MicroBatch(info, self._to_device(collate(samples)))
                self.finish_step()
            if self._pending is not None:
                return

    def _serve_nothing(self, plan: StepPlan) -> None:
        info = MicroBatchInfo(self._epoch, self._steps - 1, 0, 0, 0, plan)
        self.current = info
        if self.on_empty_step is not None:
            self.on_empty_step(info)
        self.finish_step()

    def _plans_from(self, start: int, config: BatchConfig) -> Iterator[StepPlan]:
        assert self._len is not None
        pos = start
        while pos < self._len:
            plan = plan_step(pos, self._len - pos, self.num_replicas, self.rank, config)
            yield plan
            pos += plan.samples

    def _iterable_epoch(self) -> Iterator[MicroBatch]:
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self._epoch)
        source: Iterable[Any]
        if self.num_workers == 1:
            source = DataLoader(
                self.dataset,
                batch_size=None,
                num_workers=1,
                pin_memory=self.pin_memory,
                worker_init_fn=ignore_stop_signals,
            )
        else:
            source = cast(IterableDataset[Any], self.dataset)
        stream = iter(source)
        skipped = sum(1 for _ in islice(stream, self._pos))
        if skipped < self._pos:
            # The stream is shorter than the saved position: this epoch is complete.
            self._end_epoch()
            return
        while True:
            config = self._next_config()
            window = list(islice(stream, config.total(self.num_replicas)))
            if not window:
                break
            plan = plan_step(self._pos, len(window), self.num_replicas, self.rank, config)
            self._begin(plan)
            batches = (self.collate_fn(window[off : off + n]) for off, n in plan.slices)
            yield from self._serve(plan, batches)
        self._end_epoch()

    def _end_epoch(self) -> None:
        self._epoch += 1
        self._pos = 0
        self._plan = None
        self._plan_done = True

    def order(self, epoch: int) -> torch.Tensor:
        """The sample order of a map-style epoch (identical on every replica)."""
        assert self._len is not None, "iterable datasets have no index order"
        if not self.shuffle:
            return torch.arange(self._len)
        generator = torch.Generator()
        generator.manual_seed(_mix(self.seed, epoch))
        return torch.randperm(self._len, generator=generator)

    def _to_device(self, data: Any) -> Any:
        if self.device is None:
            return data
        return move_to_device(data, self.device)

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The committed position (finished steps only) as plain data."""
        return {
            "epoch": self._epoch,
            "position": self._pos,
            "samples_total": self._samples_total,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "dataset_len": self._len,
            "batch_config": self.batch_config.as_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at a saved position; the dataset and seed must be the ones it was saved with.

        The saved batch configuration is not applied here: the trainer decides (the new
        allocation may call for another one).

        Raises:
            InvalidValueError: The dataset's length, the seed or the shuffle flag differ from
                the checkpoint's, which would make the saved position meaningless.
        """
        if self._iterating:
            raise UsageError("cannot load a state while the loader is being iterated")
        saved_len = state.get("dataset_len")
        if saved_len != self._len:
            raise InvalidValueError(
                "loader.dataset_len",
                f"the checkpoint was made with {saved_len} samples per epoch, the dataset has "
                f"{self._len}; resume with the same dataset",
            )
        if int(state["seed"]) != self.seed or bool(state["shuffle"]) != self.shuffle:
            raise InvalidValueError(
                "loader.seed",
                f"checkpoint seed={state['seed']} shuffle={state['shuffle']}, loader "
                f"seed={self.seed} shuffle={self.shuffle}; use the same values to resume",
            )
        position = int(state["position"])
        if position < 0 or (self._len is not None and position > self._len):
            raise InvalidValueError("loader.position", f"out of range: {position}")
        self._epoch = int(state["epoch"])
        self._pos = position
        self._samples_total = int(state.get("samples_total", 0))
        self._plan = None
        self._plan_done = True
        if self._len is not None and self._pos == self._len:
            self._end_epoch()


def _mix(seed: int, epoch: int) -> int:
    """A 63-bit seed from (seed, epoch) with no collisions between nearby pairs."""
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & (
        (1 << 64) - 1
    )
    x ^= x >> 31
    x = (x * 0xD6E8FEB86659FD93) & ((1 << 64) - 1)
    x ^= x >> 32
    return x & ((1 << 63) - 1)


def move_to_device(data: Any, device: torch.device) -> Any:
    """Move every tensor in nested tuples, lists and dicts to `device` (non-blocking)."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, Mapping):
        return {k: move_to_device(v, device) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(move_to_device(v, device) for v in data))
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        converted = [move_to_device(v, device) for v in data]
        return tuple(converted) if isinstance(data, tuple) else converted
    return data


def ignore_stop_signals(worker_id: int) -> None:
    """Make a loader worker ignore SIGTERM and SIGINT (`DataLoader` ``worker_init_fn``).

    The launcher signals a replica's whole process group. A worker killed by that signal makes
    torch raise in the training process before the step can finish and checkpoint; ignoring
    it lets the training process stop at the step boundary and shut its workers down itself.
    """
    del worker_id
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
