"""The job lifecycle as an explicit transition table with history (docs/architecture.md §8).

Every state change goes through `transition`, which refuses edges not in the table and appends
(state, time, reason) to the job's history, so `pollux-cli describe` can say why a job is where
it is from stored data alone. A reason may quote a user or a replica's output, so it is stored
with its control characters escaped (`pollux.terminal`): one line that no terminal acts on.
The history is bounded (the first entry and the latest `MAX_RECENT_HISTORY`, each reason at
most `MAX_REASON_CHARS`), so a job rescaled every round for a year stays a small etcd value.
"""

from __future__ import annotations

from pollux.terminal import escape_controls
from pollux.v1 import types_pb2 as pb

MAX_RECENT_HISTORY = 64
"""Latest transitions a job keeps besides its first (submission). Rescaling adds one or two per
round, forever; the latest 64 cover hours of a busy job, which is what "why is it pending,
why did it restart" needs, and keep a job record well inside the round's transaction budget."""
MAX_REASON_CHARS = 256
"""A transition's reason is cut to this many characters (with "…"): reasons name nodes and
carry policy and replica text, which is unbounded in principle."""

TRANSITIONS: dict[int, frozenset[int]] = {
    pb.JOB_STATE_PENDING: frozenset(
        {
            pb.JOB_STATE_ALLOCATED,  # a round gave it GPUs
            pb.JOB_STATE_CANCELLED,  # user cancelled before it ran
        }
    ),
    pb.JOB_STATE_ALLOCATED: frozenset(
        {
            pb.JOB_STATE_RUNNING,  # every replica of the allocation reported running
            pb.JOB_STATE_RESCALING,  # re-allocated (or a replica failed) before all started
            pb.JOB_STATE_PENDING,  # the policy took its GPUs back (or its node vanished)
            pb.JOB_STATE_SUCCEEDED,  # replicas finished before a running report was seen
            pb.JOB_STATE_FAILED,  # replicas failed more than max_failures times
            pb.JOB_STATE_CANCELLED,  # user cancelled
        }
    ),
    pb.JOB_STATE_RUNNING: frozenset(
        {
            pb.JOB_STATE_RESCALING,  # new allocation, a replica failed, or a planned stop
            pb.JOB_STATE_PENDING,  # preempted: the policy took every GPU
            pb.JOB_STATE_SUCCEEDED,  # every replica exited 0
            pb.JOB_STATE_FAILED,  # too many replica failures
            pb.JOB_STATE_CANCELLED,  # user cancelled
        }
    ),
    pb.JOB_STATE_RESCALING: frozenset(
        {
            pb.JOB_STATE_RUNNING,  # every replica of the new generation reported running
            pb.JOB_STATE_PENDING,  # preempted while rescaling
            pb.JOB_STATE_SUCCEEDED,  # finished during the restart
            pb.JOB_STATE_FAILED,  # too many replica failures
            pb.JOB_STATE_CANCELLED,  # user cancelled
        }
    ),
    pb.JOB_STATE_SUCCEEDED: frozenset(),
    pb.JOB_STATE_FAILED: frozenset(),
    pb.JOB_STATE_CANCELLED: frozenset(),
}

TERMINAL = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED})
ACTIVE = frozenset(TRANSITIONS) - TERMINAL - {pb.JOB_STATE_UNSPECIFIED}


class IllegalTransition(Exception):
    """A state change that the lifecycle does not allow."""

    def __init__(self, job_id: str, source: int, target: int) -> None:
        super().__init__(
            f"job {job_id}: {pb.JobState.Name(source)} → {pb.JobState.Name(target)} "
            "is not a lifecycle transition"
        )
        self.job_id = job_id
        self.source = source
        self.target = target


def transition(job: pb.Job, target: int, now: float, reason: str) -> None:
    """Move `job` to `target` in place, recording why (escaped, clipped); a no-op if it is there."""
    if job.state == target:
        return
    if target not in TRANSITIONS.get(job.state, frozenset()):
        raise IllegalTransition(job.id, job.state, target)
    job.state = target  # type: ignore[assignment]
    entry = job.history.add(state=target, reason=clipped(escape_controls(reason)))
    entry.time.FromNanoseconds(int(now * 1e9))
    _trim_history(job)
    if target in TERMINAL:
        job.finish_time.FromNanoseconds(int(now * 1e9))


def clipped(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """`text` cut to `limit` characters, the last one an ellipsis when it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _trim_history(job: pb.Job) -> None:
    """Keep the first transition and the latest `MAX_RECENT_HISTORY`, dropping those between."""
    excess = len(job.history) - 1 - MAX_RECENT_HISTORY
    if excess > 0:
        del job.history[1 : 1 + excess]


def state_name(state: int) -> str:
    """Short state name for messages: "RUNNING"."""
    return pb.JobState.Name(state).removeprefix("JOB_STATE_")
