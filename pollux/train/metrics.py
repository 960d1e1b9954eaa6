"""Step-time profiles and background reporting to the job's agent (reference §8.3, §8.6).

`StepProfile` aggregates optimizer steps per configuration (N, K, m, s) into mean accumulation
and optimizer-step times and a count, the inputs of the throughput fit; `StepClock` and
`StepRecorder` turn marks (CUDA events read back once completed, else wall-clock readings) into
those records without making the host wait for the GPU. `MetricsReporter` sends `MetricsBatch`es
through a `MetricsSink` from a daemon thread: the training thread never waits on the sink, a
failing sink is retried with backoff, a bounded queue drops its oldest batch when full, and a
batch keeps its sequence number across retries (docs/architecture.md, "The training library").
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog
import torch

from pollux.train.errors import InvalidValueError
from pollux.train.gns import GradStats

log = structlog.get_logger(__name__)

ConfigKey = tuple[int, int, int, int]
"""(num_nodes, num_replicas, local_bsz, accum_steps) of an observation."""


@dataclass(frozen=True, slots=True)
class StepObservation:
    """Mean step times of one configuration (proto `StepObservation`).

    Attributes:
        num_nodes: Nodes N the job ran on.
        num_replicas: Replicas K.
        local_bsz: Samples per micro-batch per replica (m).
        accum_steps: Micro-batches per optimizer step (s ≥ 1).
        accum_step_time_s: Mean seconds of a micro-batch without synchronisation.
        optim_step_time_s: Mean seconds of a micro-batch that synchronises and steps.
        count: Optimizer steps behind the means.
    """

    num_nodes: int
    num_replicas: int
    local_bsz: int
    accum_steps: int
    accum_step_time_s: float
    optim_step_time_s: float
    count: int

    @property
    def key(self) -> ConfigKey:
        """The configuration this observation describes."""
        return (self.num_nodes, self.num_replicas, self.local_bsz, self.accum_steps)


@dataclass(frozen=True, slots=True)
class WorkStatus:
    """How far the job is and what it declared it has left (proto `WorkStatus`).

    Attributes:
        progress: Progress so far, M0-steps (optimizer steps of the initial batch: Σ gain).
        remaining: Declared work left, M0-steps; None when the job declares no size.
        rescale_pause_s: Seconds from the stop request that ended the previous allocation to
            this one's first step; None before the first rescale.
    """

    progress: float
    remaining: float | None = None
    rescale_pause_s: float | None = None


@dataclass(frozen=True, slots=True)
class MetricsBatch:
    """One report of a replica's measurements (proto `ReportMetricsRequest`).

    Attributes:
        job_id: The job.
        generation: Allocation generation the replica runs in.
        rank: The replica's rank.
        seq: Sequence number, +1 per batch; the first one is derived from the wall clock so that
            a replica restarted within the same generation never reuses a number.
        observations: Step times since the previous batch, one entry per configuration.
        grad: Latest smoothed gradient statistics, or None before the first estimate.
        created_at: Unix time the batch was cut.
        work: The job's progress and declared remaining work, or None (not counted).
        user_metrics: The values the job logged (`ElasticTrainer.log`), latest of each.
    """

    job_id: str
    generation: int
    rank: int
    seq: int
    observations: tuple[StepObservation, ...]
    grad: GradStats | None
    created_at: float
    work: WorkStatus | None = None
    user_metrics: tuple[tuple[str, float], ...] = ()


@runtime_checkable
class MetricsSink(Protocol):
    """Where metric batches go (the agent's ReportMetrics RPC, or memory for local runs)."""

    def send(self, batch: MetricsBatch) -> None:
        """Deliver one batch; raise any exception if it was not delivered (it is retried)."""
        ...


class InMemorySink:
    """A `MetricsSink` that keeps every batch in memory (tests and runs without an agent)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: list[MetricsBatch] = []

    def send(self, batch: MetricsBatch) -> None:
        """Store the batch."""
        with self._lock:
            self._batches.append(batch)

    @property
    def batches(self) -> list[MetricsBatch]:
        """A copy of the batches received, in arrival order."""
        with self._lock:
            return list(self._batches)

    def observations(self) -> dict[ConfigKey, StepObservation]:
        """Everything received, merged per configuration (count-weighted means)."""
        merged: dict[ConfigKey, StepObservation] = {}
        for batch in self.batches:
            for o in batch.observations:
                prev = merged.get(o.key)
                if prev is None:
                    merged[o.key] = o
                    continue
                n = prev.count + o.count
                merged[o.key] = StepObservation(
                    *o.key,
                    accum_step_time_s=(
                        prev.accum_step_time_s * prev.count + o.accum_step_time_s * o.count
                    )
                    / n,
                    optim_step_time_s=(
                        prev.optim_step_time_s * prev.count + o.optim_step_time_s * o.count
                    )
                    / n,
                    count=n,
                )
        return merged


@dataclass(slots=True)
class _Aggregate:
    accum_sum: float = 0.0
    accum_count: int = 0
    optim_sum: float = 0.0
    optim_sync_sum: float = 0.0
    optim_count: int = 0

    def add(self, accum_times: Sequence[float], optim_time: float, sync_time: float) -> None:
        self.accum_sum += sum(accum_times)
        self.accum_count += len(accum_times)
        self.optim_sum += optim_time
        self.optim_sync_sum += min(sync_time, optim_time)
        self.optim_count += 1

    def observation(self, key: ConfigKey) -> StepObservation:
        # The optimizer step's compute part (its time minus exposed sync) is one more sample of
        # an accumulation step; without accumulation it is the only one (reference §8.3).
        accum = (self.accum_sum + self.optim_sum - self.optim_sync_sum) / (
            self.accum_count + self.optim_count
        )
        return StepObservation(
            num_nodes=key[0],
            num_replicas=key[1],
            local_bsz=key[2],
            accum_steps=key[3],
            accum_step_time_s=accum,
            optim_step_time_s=self.optim_sum / self.optim_count,
            count=self.optim_count,
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "accum_sum": self.accum_sum,
            "accum_count": self.accum_count,
            "optim_sum": self.optim_sum,
            "optim_sync_sum": self.optim_sync_sum,
            "optim_count": self.optim_count,
        }


class StepProfile:
    """Step times aggregated per configuration; thread-safe.

    Keeps a cumulative profile (for inspection and checkpoints) and a delta since the last
    `take_delta` (what the reporter sends).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total: dict[ConfigKey, _Aggregate] = {}
        self._delta: dict[ConfigKey, _Aggregate] = {}

    def record(
        self,
        key: ConfigKey,
        accum_times: Sequence[float],
        optim_time: float,
        sync_time: float = 0.0,
    ) -> None:
        """Add one optimizer step: its accumulation micro-batch times and its own time.

        Args:
            key: (N, K, m, s) of the step.
            accum_times: Seconds of each accumulation micro-batch (s − 1 of them).
            optim_time: Seconds of the synchronising micro-batch.
            sync_time: Exposed synchronisation seconds inside `optim_time`.
        """
        _check_key(key)
        times = [*accum_times, optim_time, sync_time]
        if any(not (t >= 0.0 and t < float("inf")) for t in times):
            raise InvalidValueError("step_time", f"times must be finite and ≥ 0: {times}")
        with self._lock:
            self._total.setdefault(key, _Aggregate()).add(accum_times, optim_time, sync_time)
            self._delta.setdefault(key, _Aggregate()).add(accum_times, optim_time, sync_time)

    def observations(self) -> tuple[StepObservation, ...]:
        """The cumulative profile, one observation per configuration."""
        with self._lock:
            return tuple(agg.observation(key) for key, agg in sorted(self._total.items()))

    def take_delta(self) -> tuple[StepObservation, ...]:
        """Observations recorded since the previous call (and reset that delta)."""
        with self._lock:
            delta, self._delta = self._delta, {}
        return tuple(agg.observation(key) for key, agg in sorted(delta.items()))

    def state_dict(self) -> dict[str, Any]:
        """Plain-data cumulative profile."""
        with self._lock:
            return {"total": [[list(k), a.as_dict()] for k, a in self._total.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cumulative profile (the delta starts empty: it was reported before)."""
        total: dict[ConfigKey, _Aggregate] = {}
        for key, agg in state["total"]:
            k = (int(key[0]), int(key[1]), int(key[2]), int(key[3]))
            total[k] = _Aggregate(
                accum_sum=float(agg["accum_sum"]),
                accum_count=int(agg["accum_count"]),
                optim_sum=float(agg["optim_sum"]),
                optim_sync_sum=float(agg["optim_sync_sum"]),
                optim_count=int(agg["optim_count"]),
            )
        with self._lock:
            self._total = total
            self._delta = {}


def _check_key(key: ConfigKey) -> None:
    n, k, m, s = key
    if not (1 <= n <= k and m >= 1 and s >= 1):
        raise InvalidValueError(
            "config", f"(nodes, replicas, local_bsz, accum_steps) = {key} is not a valid shape"
        )


Mark = float | torch.cuda.Event
"""A moment in the training stream: a wall-clock reading or a recorded CUDA event."""


_new_event: Callable[..., torch.cuda.Event] = torch.cuda.Event
_event_done: Callable[[torch.cuda.Event], bool] = torch.cuda.Event.query
"""Typed handles on torch's unannotated CUDA event API."""


class StepClock:
    """Marks moments of the training stream on the device that does the work.

    Args:
        device: The training device; CUDA devices use events, everything else the wall clock.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Mark:
        """Record the current moment (on CUDA: of the current stream's work)."""
        if self.cuda:
            event = _new_event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def restamp(self, mark: Mark | None) -> Mark:
        """Move `mark` to now, reusing its CUDA event (cheap enough to call per gradient)."""
        if self.cuda and isinstance(mark, torch.cuda.Event):
            mark.record()
            return mark
        return self.mark()

    def elapsed(self, start: Mark, end: Mark) -> float | None:
        """Seconds from `start` to `end`, or None while a CUDA event has not completed."""
        if isinstance(start, float) and isinstance(end, float):
            return max(end - start, 0.0)
        if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
            if not _event_done(end):
                return None
            return max(float(start.elapsed_time(end)) / 1000.0, 0.0)
        raise InvalidValueError("mark", "start and end must come from the same clock")


@dataclass(slots=True)
class _PendingStep:
    key: ConfigKey
    accum: list[tuple[Mark, Mark]]
    optim: tuple[Mark, Mark]
    sync: tuple[Mark, Mark] | None


@dataclass(slots=True)
class StepRecorder:
    """Turns marks into `StepProfile` records once the device has completed them.

    Attributes:
        clock: The clock the marks come from.
        profile: Where resolved steps go.
        max_pending: Unresolved steps kept at most; older ones are dropped (they only occur
            if the device stops making progress).
    """

    clock: StepClock
    profile: StepProfile
    max_pending: int = 64
    _pending: collections.deque[_PendingStep] = field(default_factory=collections.deque)

    def add(
        self,
        key: ConfigKey,
        accum: Sequence[tuple[Mark, Mark]],
        optim: tuple[Mark, Mark],
        sync: tuple[Mark, Mark] | None = None,
    ) -> None:
        """Queue one optimizer step's marks and record every step that can be resolved."""
        if len(self._pending) >= self.max_pending:
            self._pending.popleft()
        self._pending.append(_PendingStep(key, list(accum), optim, sync))
        self.resolve()

    def resolve(self) -> None:
        """Record queued steps, oldest first, up to the first not yet completed on the device."""
        while self._pending:
            step = self._pending[0]
            optim = self.clock.elapsed(*step.optim)
            if optim is None:
                return
            accum = [self.clock.elapsed(a, b) for a, b in step.accum]
            sync = 0.0 if step.sync is None else self.clock.elapsed(*step.sync)
            if sync is None or any(t is None for t in accum):
                return
            self._pending.popleft()
            self.profile.record(step.key, [t for t in accum if t is not None], optim, sync)


class MetricsReporter:
    """Sends `MetricsBatch`es through a sink from a background thread (module docstring).

    Args:
        sink: Where batches go.
        job_id: The job (from the environment contract).
        generation: The allocation generation.
        rank: This replica's rank.
        interval_s: Seconds between batches.
        max_pending: Batches kept while the sink fails; the oldest is dropped beyond that.
        max_backoff_s: Longest wait between retries of a failing sink.
        profile: The profile to report from; a new one by default.
        clock: Monotonic clock (injectable for tests).
    """

    def __init__(
        self,
        sink: MetricsSink,
        *,
        job_id: str,
        generation: int = 0,
        rank: int = 0,
        interval_s: float = 5.0,
        max_pending: int = 128,
        max_backoff_s: float = 60.0,
        profile: StepProfile | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise InvalidValueError("interval_s", f"must be > 0, got {interval_s}")
        if max_pending < 1:
            raise InvalidValueError("max_pending", f"must be ≥ 1, got {max_pending}")
        self.sink = sink
        self.job_id = job_id
        self.generation = generation
        self.rank = rank
        self.interval_s = interval_s
        self.max_backoff_s = max(max_backoff_s, interval_s)
        self.profile = profile if profile is not None else StepProfile()
        self._clock = clock
        self._queue: collections.deque[MetricsBatch] = collections.deque()
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._grad: GradStats | None = None
        self._grad_reported: GradStats | None = None
        self._work: WorkStatus | None = None
        self._work_reported: WorkStatus | None = None
        self._user_metrics: tuple[tuple[str, float], ...] = ()
        self._user_metrics_reported: tuple[tuple[str, float], ...] = ()
        self._seq = time.time_ns() // 1_000_000
        self._backoff = interval_s
        self._next_attempt = 0.0
        self.sent = 0
        """Batches delivered."""
        self.dropped = 0
        """Batches dropped because the queue was full."""
        self.failures = 0
        """Failed send attempts."""
        self.log = log.bind(job_id=job_id, rank=rank)

    @property
    def pending(self) -> int:
        """Batches waiting to be delivered."""
        with self._lock:
            return len(self._queue)

    def set_grad_stats(self, stats: GradStats | None) -> None:
        """Publish the latest smoothed gradient statistics (sent with the next batch)."""
        self._grad = stats

    def set_work(self, work: WorkStatus | None) -> None:
        """Publish the job's latest work status (sent with the next batch)."""
        self._work = work

    def set_user_metrics(self, values: tuple[tuple[str, float], ...]) -> None:
        """Publish the values the job logged, latest of each (sent with the next batch)."""
        self._user_metrics = values

    def start(self) -> None:
        """Start the reporting thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"pollux-metrics-{self.rank}", daemon=True
        )
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Cut a final batch, try to deliver everything within `timeout_s`, stop the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        else:
            self.flush()
        if self.pending:
            self.log.warning("metrics_undelivered", pending=self.pending, dropped=self.dropped)

    def flush(self) -> bool:
        """Cut a batch now and try to send everything queued; True if nothing is left.

        Runs in the calling thread and may block on the sink: call it at the end of training,
        not in the training loop.
        """
        self._cut()
        self._deliver(force=True)
        return self.pending == 0

    def _run(self) -> None:
        next_cut = self._clock() + self.interval_s
        while not self._stop.is_set():
            now = self._clock()
            wait = min(next_cut, self._next_attempt if self.pending else next_cut) - now
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
            now = self._clock()
            if now >= next_cut:
                self._cut()
                next_cut = now + self.interval_s
            self._deliver(force=False)
        # Final attempt on close: whatever was measured since the last cut, then deliver.
        self._cut()
        self._deliver(force=True)

    def _cut(self) -> None:
        observations = self.profile.take_delta()
        grad, work, logged = self._grad, self._work, self._user_metrics
        if (
            not observations
            and grad == self._grad_reported
            and work == self._work_reported
            and logged == self._user_metrics_reported
        ):
            return
        self._grad_reported, self._work_reported = grad, work
        self._user_metrics_reported = logged
        with self._lock:
            self._seq += 1
            batch = MetricsBatch(
                job_id=self.job_id,
                generation=self.generation,
                rank=self.rank,
                seq=self._seq,
                observations=observations,
                grad=grad,
                created_at=time.time(),
                work=work,
                user_metrics=logged,
            )
            if len(self._queue) >= self._max_pending:
                self._queue.popleft()
                self.dropped += 1
                self.log.warning("metrics_batch_dropped", dropped=self.dropped)
            self._queue.append(batch)

    def _deliver(self, *, force: bool) -> None:
        if not force and self._clock() < self._next_attempt:
            return
        with self._send_lock:
            while True:
                with self._lock:
                    if not self._queue:
                        break
                    batch = self._queue[0]
                try:
                    self.sink.send(batch)
                except Exception as exc:  # any sink failure is kept and retried later
                    self.failures += 1
                    self._next_attempt = self._clock() + self._backoff
                    self.log.warning(
                        "metrics_send_failed",
                        error=repr(exc),
                        pending=self.pending,
                        retry_in_s=round(self._backoff, 3),
                        failures=self.failures,
                    )
                    self._backoff = min(self._backoff * 2.0, self.max_backoff_s)
                    return
                with self._lock:
                    if self._queue and self._queue[0] is batch:
                        self._queue.popleft()
                self.sent += 1
                if self._backoff != self.interval_s:
                    self.log.info("metrics_send_recovered", failures=self.failures)
                self._backoff = self.interval_s
                self._next_attempt = 0.0
