"""`pollux.client.follow`: one story from a job's many generations, against a scripted client.

The real thing (a cluster, a job that rescales, `pollux-cli submit --follow`) is
tests/e2e/test_cli_follow.py; here every branch is driven deterministically: a replica not
started yet, a rescale between two streams, a launcher that does not answer, the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from pollux.client.client import LogChunk
from pollux.client.errors import NotFoundError, UnavailableError
from pollux.client.follow import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_SUCCEEDED,
    Finished,
    Line,
    Marker,
    exit_code,
    follow,
)
from pollux.client.types import Allocation, Job, JobSpec, Transition

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def job(state: str, generation: int = 0, nodes: tuple[str, ...] = (), history: int = 1) -> Job:
    states = ["PENDING", "RUNNING", "RESCALING", "RUNNING", state]
    return Job(
        id="j-0123456789",
        spec=JobSpec("train", ("python", "t.py"), 32),
        request_id="r",
        state=state,
        history=tuple(Transition(s, T0, f"step {i}") for i, s in enumerate(states[:history])),
        create_time=T0,
        finish_time=None,
        cancel_requested=False,
        restarts=0,
        failures=0,
        allocation=Allocation(nodes, generation, T0, 1) if nodes else None,
    )


class ScriptedClient:
    """get_job answers from a list (the last repeats); log_chunks from a per-call script."""

    def __init__(self, jobs: list[Job], streams: list[Any]) -> None:
        self.jobs = jobs
        self.streams = streams
        self.log_calls: list[dict[str, Any]] = []

    def get_job(self, job_id: str) -> Job:
        return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]

    def log_chunks(self, job_id: str, rank: int = 0, **kwargs: Any) -> Iterator[LogChunk]:
        self.log_calls.append(kwargs)
        step = self.streams.pop(0) if self.streams else NotFoundError("no replica", None)
        if isinstance(step, Exception):
            raise step
        yield from step


def run(client: ScriptedClient, **kwargs: Any) -> list[Any]:
    sleeps: list[float] = []
    kwargs.setdefault("clock", lambda: 0.0)  # no reads while lines flow, unless a test asks
    events = list(follow(client, "train", sleep=sleeps.append, **kwargs))  # type: ignore[arg-type]
    assert all(s == 1.0 for s in sleeps)
    return events


def test_follows_every_generation_once_with_markers_until_the_job_succeeds() -> None:
    client = ScriptedClient(
        jobs=[
            job("PENDING"),  # no replica yet: the first stream is not found, then poll
            job("RUNNING", 1, ("n1",), history=2),
            job("RESCALING", 1, ("n1",), history=3),  # generation 1 exited
            job("RUNNING", 2, ("n1", "n2"), history=4),
            job("SUCCEEDED", 2, ("n1", "n2"), history=5),
        ],
        streams=[
            NotFoundError("no replica yet", None),
            [LogChunk(1, ("a", "b")), LogChunk(1, ("c",))],
            NotFoundError("generation 2 not started", None),
            [LogChunk(2, ("d",))],
            [],  # the job ended: a last look finds nothing newer
        ],
    )
    events = run(client, history_from=0)
    lines = [e.text for e in events if isinstance(e, Line)]
    assert lines == ["a", "b", "c", "d"]
    markers = [e.text for e in events if isinstance(e, Marker)]
    assert markers[0].endswith("PENDING: step 0")
    assert "generation 1 (rank 0 of 1 GPU on n1)" in markers
    assert "generation 2 (rank 0 of 2 GPUs on n1, n2)" in markers
    assert any("RESCALING" in m for m in markers)
    assert isinstance(events[-1], Finished)
    assert events[-1].job.state == "SUCCEEDED"
    # From the job's start the first generation is asked for, each stream after it only for a
    # newer one, so nothing is repeated.
    assert [c["min_generation"] for c in client.log_calls] == [1, 1, 2, 2, 3]
    assert [c["follow"] for c in client.log_calls][-1] is False  # the job had ended


def test_a_generation_that_ended_before_the_follower_came_is_still_shown() -> None:
    # Generation 1 failed and generation 2 is running by the time the follower first asks: it
    # asks for the oldest generation (1), then for the one after it.
    client = ScriptedClient(
        jobs=[job("RUNNING", 2, ("n1",), history=4), job("FAILED", 2, ("n1",), history=5)],
        streams=[[LogChunk(1, ("first",))], [LogChunk(2, ("second",))], []],
    )
    events = run(client, history_from=0)
    assert [e.text for e in events if isinstance(e, Line)] == ["first", "second"]
    assert [c["min_generation"] for c in client.log_calls][:2] == [1, 2]


def test_following_a_running_job_starts_at_its_newest_generation() -> None:
    client = ScriptedClient(
        jobs=[job("RUNNING", 3, ("n1",), history=4), job("SUCCEEDED", 3, ("n1",), history=5)],
        streams=[[LogChunk(3, ("now",))], []],
    )
    events = run(client)
    assert [e.text for e in events if isinstance(e, Line)] == ["now"]
    assert [c["min_generation"] for c in client.log_calls] == [0, 4]


def test_the_first_stream_alone_gets_tail_and_since() -> None:
    since = datetime(2026, 11, 24, 11, 0, tzinfo=UTC)
    client = ScriptedClient(
        jobs=[job("RUNNING", 1, ("n1",)), job("RUNNING", 2, ("n1",)), job("FAILED", 2, ("n1",))],
        streams=[[LogChunk(1, ("x",))], [LogChunk(2, ("y",))], []],
    )
    events = run(client, tail_lines=5, since=since)
    assert [(c["tail_lines"], c["since"]) for c in client.log_calls] == [
        (5, since),
        (0, None),
        (0, None),
    ]
    assert exit_code(events[-1].job) == EXIT_FAILED
    # history_from=None: only changes from now on, and the history never grew here.
    assert [e.text for e in events if isinstance(e, Marker)] == [
        "generation 1 (rank 0 of 1 GPU on n1)",
        "generation 2 (rank 0 of 1 GPU on n1)",
    ]


def test_a_launcher_that_does_not_answer_is_waited_for_not_fatal() -> None:
    client = ScriptedClient(
        jobs=[job("RUNNING", 1, ("n1",)), job("RUNNING", 1, ("n1",)), job("CANCELLED", 1)],
        streams=[UnavailableError("launcher down", None), [LogChunk(1, ("late",))], []],
    )
    events = run(client)
    assert [e.text for e in events if isinstance(e, Line)] == ["late"]
    assert exit_code(events[-1].job) == EXIT_CANCELLED


def test_wait_reports_states_only() -> None:
    client = ScriptedClient(
        jobs=[job("PENDING"), job("RUNNING", 1, ("n1",), history=2), job("SUCCEEDED", history=5)],
        streams=[],
    )
    events = run(client, logs=False, history_from=0)
    assert client.log_calls == []
    assert not any(isinstance(e, Line) for e in events)
    assert [e.text.split(" ", 1)[1] for e in events if isinstance(e, Marker)] == [
        "PENDING: step 0",
        "RUNNING: step 1",
        "RESCALING: step 2",
        "RUNNING: step 3",
        "SUCCEEDED: step 4",
    ]
    assert exit_code(events[-1].job) == EXIT_SUCCEEDED


@pytest.mark.parametrize(("state", "code"), [("SUCCEEDED", 0), ("FAILED", 3), ("CANCELLED", 4)])
def test_exit_codes_tell_the_result_apart_from_cli_errors(state: str, code: int) -> None:
    assert exit_code(job(state)) == code
    assert code not in (1, 2)  # the CLI's own error and usage codes


def test_a_state_change_is_shown_among_the_lines_it_came_with() -> None:
    ticks = iter(range(100))
    client = ScriptedClient(
        jobs=[
            job("RUNNING", 1, ("n1",), history=2),
            job("RUNNING", 1, ("n1",), history=3),  # read while lines flow
            job("SUCCEEDED", 1, ("n1",), history=5),
        ],
        streams=[[LogChunk(1, ("a",)), LogChunk(1, ("b",))], []],
    )
    events = run(client, clock=lambda: float(next(ticks)))
    texts = [e.text.split(" ", 1)[-1] for e in events if not isinstance(e, Finished)]
    # Each chunk is preceded by the changes read since the last one (poll_s = 1 tick here).
    assert texts == [
        "1 (rank 0 of 1 GPU on n1)",
        "RESCALING: step 2",
        "a",
        "RUNNING: step 3",
        "SUCCEEDED: step 4",
        "b",
    ]
