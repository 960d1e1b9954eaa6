"""What the JSON endpoints answer, from the RPCs' responses (pure).

Responses are the RPCs' own messages as `google.protobuf.json_format` writes them (proto field
names, every field present, 64-bit integers as numbers), with a few values derived for the
page beside them: GPUs per job on the cluster view, and on a job's timeline the restarts
(generation changes) and the progress its model predicted.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from pollux.service.errors import InvalidArgument
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

JOBS_QUERY = ("state", "name_prefix", "owner", "limit", "page_token")
"""The query parameters of /api/v1/jobs."""
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


def to_dict(message: Message) -> dict[str, Any]:
    """A message as JSON-ready data: proto field names, defaults included, int64 as numbers."""
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )


def job_state(text: str) -> int:
    """A job state from "running", "RUNNING" or "JOB_STATE_RUNNING".

    Raises:
        ValueError: Not a state.
    """
    name = text.strip().upper()
    if not name.startswith("JOB_STATE_"):
        name = "JOB_STATE_" + name
    value = pb.JobState.Value(name)  # raises ValueError
    if value == pb.JOB_STATE_UNSPECIFIED:
        raise ValueError(text)
    return value


def jobs_request(query: Mapping[str, str]) -> spb.ListJobsRequest:
    """The ListJobs request of /api/v1/jobs's query, newest first.

    ``state`` is one state or several, comma-separated; ``limit`` is the page size (1-1000,
    default 50); ``page_token`` is the previous answer's ``next_page_token``.

    Raises:
        InvalidArgument: Every bad or unknown parameter.
    """
    problems: list[tuple[str, str]] = []
    for name in query:
        if name not in JOBS_QUERY:
            problems.append((name[:32], f"unknown parameter (known: {', '.join(JOBS_QUERY)})"))
    request = spb.ListJobsRequest(
        newest_first=True,
        name_prefix=query.get("name_prefix", ""),
        owner=query.get("owner", ""),
        page_token=query.get("page_token", ""),
        page_size=DEFAULT_LIMIT,
    )
    for text in filter(None, query.get("state", "").split(",")):
        try:
            request.states.append(job_state(text))  # type: ignore[arg-type]
        except ValueError:
            problems.append(("state", f"{text[:32]!r} is not a job state"))
    limit = query.get("limit", "")
    if limit:
        if limit.isdigit() and 1 <= int(limit) <= MAX_LIMIT:
            request.page_size = int(limit)
        else:
            problems.append(("limit", f"{limit[:16]!r} must be a number from 1 to {MAX_LIMIT}"))
    if problems:
        raise InvalidArgument(problems)
    return request


def cluster_view(status: spb.ClusterStatusResponse) -> dict[str, Any]:
    """ClusterStatus, with GPUs per job (``job_gpus``: job id → GPUs, most first)."""
    out = to_dict(status)
    gpus = Counter(job for node in status.nodes for job in node.jobs if job)
    out["job_gpus"] = dict(sorted(gpus.items(), key=lambda item: (-item[1], item[0])))
    return out


def seconds(stamp: Any) -> float:
    """A `Timestamp` as seconds since the epoch."""
    return float(stamp.ToNanoseconds()) / 1e9


def restarts(points: Sequence[pb.TimelinePoint]) -> list[dict[str, Any]]:
    """Each generation change between two points: the first point of the new generation.

    A restart of a job is a new allocation generation (a rescale, a move, or a retry after a
    failure), so this is where the plots mark one.
    """
    out = []
    for before, after in itertools.pairwise(points):
        if after.generation != before.generation:
            out.append(
                {
                    "time_s": seconds(after.time),
                    "generation": after.generation,
                    "from_generation": before.generation,
                    "gpus_before": before.gpus,
                    "gpus_after": after.gpus,
                    "batch_before": before.batch_size,
                    "batch_after": after.batch_size,
                }
            )
    return out


def predicted_progress(points: Sequence[pb.TimelinePoint], m0: int) -> list[float | None]:
    """The progress (M0-steps) the model predicted, aligned with `points`.

    Within each generation, from its first point that has a prediction (the actual progress
    there), the prediction integrates ``predicted_goodput / M0`` (M0-steps per second) over
    time, each interval at the prediction of the point that starts it; it restarts from the
    actual progress at each generation's start, so the gap to the actual progress is what the
    model got wrong about this allocation. None where no prediction exists yet.
    """
    out: list[float | None] = []
    value: float | None = None
    previous: pb.TimelinePoint | None = None
    for point in points:
        if previous is None or point.generation != previous.generation:
            value = None
        elif value is not None:
            rate = previous.predicted_goodput / m0 if m0 > 0 else 0.0
            value += rate * max(0.0, seconds(point.time) - seconds(previous.time))
        if value is None and point.predicted_goodput > 0:
            value = point.progress
        if value is not None and not math.isfinite(value):
            value = None
        out.append(value)
        previous = point
    return out


def timeline_view(job: pb.Job, timeline: pb.JobTimeline) -> dict[str, Any]:
    """GetJobTimeline's answer with what the job page plots beside it.

    ``times`` are the points' times in seconds, ``predicted_progress`` and ``restarts`` as
    above, ``m0`` the job's initial batch size, ``completion`` the job's estimated completion
    (seconds) with the progress it would then have reached (the last point's progress plus its
    declared remaining work), when the scheduler estimates one; ``metric_names`` the names
    of the values the job logged (each point's ``user_metrics``).
    """
    points = list(timeline.points)
    m0 = job.spec.batch.initial_batch_size
    completion: dict[str, Any] | None = None
    if job.HasField("estimated_completion"):
        completion = {
            "time": job.estimated_completion.ToJsonString(),
            "time_s": seconds(job.estimated_completion),
            "progress": None,
        }
        if points and points[-1].HasField("remaining"):
            completion["progress"] = points[-1].progress + points[-1].remaining
    return {
        "job_id": job.id,
        "state": pb.JobState.Name(job.state).removeprefix("JOB_STATE_"),
        "m0": m0,
        "timeline": to_dict(timeline),
        "times": [seconds(p.time) for p in points],
        "predicted_progress": predicted_progress(points, m0),
        "restarts": restarts(points),
        "generations": sorted({p.generation for p in points}),
        "metric_names": sorted({name for p in points for name in p.user_metrics}),
        "completion": completion,
    }


MAX_LOG_LINES = 1000
"""Most lines the job page asks for at once (its default: DEFAULT_LOG_LINES)."""
DEFAULT_LOG_LINES = 200


def logs_request(job_id: str, query: Mapping[str, str]) -> lpb.StreamLogsRequest:
    """The StreamLogs request of ``/jobs/<id>/logs?rank=R&tail=N`` (not followed).

    Raises:
        InvalidArgument: An unknown parameter, or a rank or tail that is not a number in range.
    """
    problems = [(name[:32], "unknown parameter (known: rank, tail)") for name in query]
    problems = [p for p in problems if p[0] not in ("rank", "tail")]
    numbers = {"rank": 0, "tail": DEFAULT_LOG_LINES}
    for name, top in (("rank", 65_535), ("tail", MAX_LOG_LINES)):
        text = query.get(name, "")
        if not text:
            continue
        if text.isdigit() and (name == "rank" or int(text) >= 1) and int(text) <= top:
            numbers[name] = int(text)
        else:
            low = 0 if name == "rank" else 1
            problems.append((name, f"{text[:16]!r} must be a number from {low} to {top}"))
    if problems:
        raise InvalidArgument(problems)
    return lpb.StreamLogsRequest(
        job_id=job_id, rank=numbers["rank"], follow=False, tail_lines=numbers["tail"]
    )


def logs_view(
    job: pb.Job, rank: int, generation: int, lines: Sequence[str], note: str = ""
) -> dict[str, Any]:
    """The job page's log card: the lines, their replica and generation, why there are none.

    The lines are as written: the page shows their control characters visibly.
    """
    return {
        "job_id": job.id,
        "state": pb.JobState.Name(job.state).removeprefix("JOB_STATE_"),
        "rank": rank,
        "generation": generation,
        "lines": list(lines),
        "note": note,
    }
