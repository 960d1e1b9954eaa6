"""Following a job through its whole life: state changes and logs, across rescales.

A Pollux job is stopped and restarted on a new allocation every time it is rescaled, so its
rank-0 log is not one stream but one per allocation *generation*, each on whatever node rank 0
landed on. `follow` stitches them together: it streams the current generation's log until that
replica exits, then waits (polling the job) until a newer generation's replica of the rank
exists — asking for it with ``min_generation``, so no line is shown twice — and goes on, with a
marker line at every generation and every state change, until the job ends.

Polling the job once per `poll_s` while waiting costs one etcd read per second per follower;
a watch stream would be quicker to react but dies with the scheduler replica serving it, and a
follower must survive a scheduler fail-over like every other client call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import datetime

from pollux.client.client import Client
from pollux.client.errors import NotFoundError, UnavailableError
from pollux.client.format import plural
from pollux.client.types import Job, Transition

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_CANCELLED = 0, 3, 4
"""`pollux-cli submit --follow / --wait` exit codes by the job's result (1 and 2 stay the
CLI's own errors, so a script can tell "the job failed" from "could not ask")."""


@dataclass(frozen=True, slots=True)
class Line:
    """A line of the followed replica's log."""

    text: str
    generation: int


@dataclass(frozen=True, slots=True)
class Marker:
    """A state change, or the start of a generation's log (rendered between log lines)."""

    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The job reached a terminal state; the last event."""

    job: Job


FollowEvent = Line | Marker | Finished


def exit_code(job: Job) -> int:
    """The process exit code that reports a finished job's result."""
    return {"SUCCEEDED": EXIT_SUCCEEDED, "CANCELLED": EXIT_CANCELLED}.get(job.state, EXIT_FAILED)


def transition_marker(entry: Transition) -> Marker:
    """``12:00:03 RUNNING: allocated 2 GPUs on n1`` (local time)."""
    when = entry.time.astimezone().strftime("%H:%M:%S") if entry.time is not None else "--:--:--"
    reason = f": {entry.reason}" if entry.reason else ""
    return Marker(f"{when} {entry.state}{reason}")


def generation_marker(job: Job, generation: int, rank: int) -> Marker:
    """``generation 3 (rank 0 of 4 GPUs on n1, n2)``: where the next log lines come from."""
    allocation = job.allocation
    if allocation is None or allocation.generation != generation:
        return Marker(f"generation {generation} (rank {rank})")
    counts: dict[str, int] = {}
    for node in allocation.nodes:
        counts[node] = counts.get(node, 0) + 1
    where = ", ".join(f"{node} x{n}" if n > 1 else node for node, n in counts.items())
    gpus = allocation.gpus
    return Marker(f"generation {generation} (rank {rank} of {plural(gpus, 'GPU')} on {where})")


def follow(
    client: Client,
    job_ref: str,
    *,
    rank: int = 0,
    logs: bool = True,
    history_from: int | None = None,
    tail_lines: int = 0,
    since: datetime | None = None,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[FollowEvent]:
    """State changes (and, with `logs`, every generation's log of `rank`) until the job ends.

    Args:
        client: A connected client.
        job_ref: A job id, unique id prefix or unique name.
        rank: Whose log to follow.
        logs: False to report state changes only (``--wait``).
        history_from: First history entry to report (None: only changes from now on; 0: the
            job's whole history, as after a submit).
        tail_lines: Retained lines of the first generation to show first (0: all).
        since: Only lines of the first stream that arrived at or after this time.
        poll_s: Seconds between reads of the job while waiting, and at least between two
            reads while log lines flow (a state change is shown among the lines it came with).
        sleep: Waits between polls (tests pass a fake).
        clock: Monotonic seconds, for the reads while lines flow (tests pass a fake).

    Raises:
        PolluxError: The job cannot be read (deleted, no scheduler reachable).
    """
    watch = _JobWatch(client, client.get_job(job_ref), history_from, poll_s, clock)
    # 0: the newest replica of the rank; a follower from the job's start (history_from 0) asks
    # for the oldest instead, so that a generation that ended before it got there is shown too.
    next_generation = 1 if history_from == 0 else 0
    first_stream = True
    while True:
        yield from watch.news(refresh=False)
        job = watch.job
        if logs:
            streamed = yield from _stream_generation(
                client,
                job,
                rank,
                next_generation,
                tail_lines if first_stream else 0,
                since if first_stream else None,
                watch,
            )
            if streamed is not None:
                next_generation, first_stream = streamed + 1, False
        if job.is_terminal:
            yield from watch.news(refresh=False)
            yield Finished(job)
            return
        sleep(poll_s)
        watch.read()


class _JobWatch:
    """The followed job as last read, and the history entries not reported yet."""

    def __init__(
        self,
        client: Client,
        job: Job,
        history_from: int | None,
        poll_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.job = job
        self.reported = len(job.history) if history_from is None else history_from
        self.poll_s = poll_s
        self.clock = clock
        self.read_at = clock()

    def read(self) -> None:
        """Read the job again."""
        self.job = self.client.get_job(self.job.id)
        self.read_at = self.clock()

    def news(self, *, refresh: bool) -> Iterator[Marker]:
        """Markers of history entries not reported yet.

        With `refresh`, the job is read again first if `poll_s` has passed since the last read.
        """
        if refresh and self.clock() - self.read_at >= self.poll_s:
            self.read()
        for entry in self.job.history[self.reported :]:
            yield transition_marker(entry)
        self.reported = len(self.job.history)


def _stream_generation(
    client: Client,
    job: Job,
    rank: int,
    min_generation: int,
    tail_lines: int,
    since: datetime | None,
    watch: _JobWatch,
) -> Generator[FollowEvent, None, int | None]:
    """One replica's log, followed until it exits; returns its generation, None if none ran.

    A missing replica (not started yet, or the rank is beyond the job's GPUs now) and a
    launcher that does not answer are both "not now": the caller polls and asks again.
    """
    generation: int | None = None
    try:
        for chunk in client.log_chunks(
            job.id,
            rank,
            follow=not job.is_terminal,
            tail_lines=tail_lines,
            min_generation=min_generation,
            since=since,
        ):
            if chunk.generation != generation:
                generation = chunk.generation
                yield generation_marker(job, generation, rank)
            yield from watch.news(refresh=True)
            for text in chunk.lines:
                yield Line(text, generation)
    except (NotFoundError, UnavailableError):
        pass
    return generation
