"""The synchronous Pollux client: dataclasses in, dataclasses out, typed errors.

Why synchronous: its users are the CLI, scripts and notebooks, none of which run an event loop.
`Client` has the SchedulerService calls (jobs, logs, the cluster); its AdminService calls are
in admin_calls.py and its channels, retries and failover between replicas in transport.py.
Every `grpc.RpcError` leaves as a `PolluxError` subclass (see errors.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from pollux.client import _convert
from pollux.client.admin_calls import AdminCalls
from pollux.client.errors import InvalidArgumentError
from pollux.client.transport import (
    DEFAULT_TARGET,
    IDEMPOTENT_RPCS,
    Transport,
    parse_targets,
    service_config,
)
from pollux.client.types import JOB_STATES, ClusterStatus, Explanation, Job, JobEstimate, JobSpec
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

__all__ = [
    "DEFAULT_TARGET",
    "IDEMPOTENT_RPCS",
    "Client",
    "JobEvent",
    "LogChunk",
    "Transport",
    "parse_targets",
    "service_config",
]


class LogChunk(NamedTuple):
    """Lines of a replica's log and the allocation generation of the replica that wrote them."""

    generation: int
    lines: tuple[str, ...]


class JobEvent(NamedTuple):
    """One WatchJobs event: the job after a change, and whether it was deleted."""

    job: Job
    deleted: bool


class Client(AdminCalls):
    """A connection to the Pollux schedulers (any replica can serve any request).

    Args:
        targets: host:port of one or more scheduler replicas, as a list or comma-separated.
        timeout_s: Deadline of each unary call, seconds (per target). Streams have none.
        retry_attempts: Attempts per target for a retryable call, 1-5 (1: no gRPC retry).
            With the default 3, a target that stays UNAVAILABLE costs 0.3 s before failover.
        credentials: TLS channel credentials; None for plaintext.
        token: An API token, sent with every call (needs `credentials`: never in plaintext).

    Use it as a context manager, or call `close`, to release its channels.
    """

    def submit(self, spec: JobSpec, *, request_id: str | None = None) -> Job:
        """Submit a job; returns it as stored (PENDING on first submission).

        Args:
            spec: The job.
            request_id: Idempotency key; a fresh UUID when None. Every retry and failover of
                this call reuses it, so the job is created at most once. Pass your own to make
                resubmitting from a new process safe too.

        Raises:
            InvalidArgumentError: The spec is invalid; `violations` names each field.
            AlreadyExistsError: `request_id` was used before for a different spec.
        """
        request = spb.SubmitJobRequest(
            spec=_convert.spec_to_proto(spec), request_id=request_id or str(uuid.uuid4())
        )
        response: spb.SubmitJobResponse = self._unary("SubmitJob", request)
        return _convert.job_from_proto(response.job)

    def estimate(self, spec: JobSpec) -> JobEstimate:
        """When `spec` would complete if submitted now (nothing is submitted).

        Raises:
            InvalidArgumentError: The spec is invalid.
            FailedPreconditionError: No earlier job of that name (yours) has reported a model
                and a declared size, or the cluster is too busy to say.
        """
        request = spb.EstimateJobRequest(spec=_convert.spec_to_proto(spec))
        response: spb.EstimateJobResponse = self._unary("EstimateJob", request)
        return _convert.estimate_from_proto(response)

    def get_job(self, job_id: str) -> Job:
        """One job by id.

        Raises:
            NotFoundError: No such job.
        """
        response: spb.GetJobResponse = self._unary("GetJob", spb.GetJobRequest(job_id=job_id))
        return _convert.job_from_proto(response.job)

    def list_jobs(
        self,
        states: Sequence[str] | None = None,
        name_prefix: str = "",
        labels: Mapping[str, str] | None = None,
        page_size: int = 100,
        *,
        newest_first: bool = False,
        owner: str = "",
        limit: int | None = None,
    ) -> Iterator[Job]:
        """Every matching job, fetching pages as the iterator advances.

        Args:
            states: Only jobs in these states ("RUNNING", case-insensitive); None means all.
            name_prefix: Only jobs whose name starts with this.
            labels: Only jobs carrying all these labels.
            page_size: Jobs per RPC, 1-1000.
            newest_first: Newest first instead of creation order.
            owner: Only this user's jobs ("" = every job the caller may see).
            limit: Stop after this many jobs (None: all); pages are no larger than needed.

        Raises:
            InvalidArgumentError: An unknown state name (raised before any RPC).
        """
        numbers = _state_numbers(states or ())
        request = spb.ListJobsRequest(
            states=numbers,  # type: ignore[arg-type]
            name_prefix=name_prefix,
            labels=dict(labels or {}),
            page_size=page_size if limit is None else max(1, min(page_size, limit)),
            newest_first=newest_first,
            owner=owner,
        )
        return self._pages(request, limit)

    def _pages(self, request: spb.ListJobsRequest, limit: int | None = None) -> Iterator[Job]:
        left = limit
        while left is None or left > 0:
            response: spb.ListJobsResponse = self._unary("ListJobs", request)
            for job in response.jobs[:left]:
                yield _convert.job_from_proto(job)
            if left is not None:
                left -= len(response.jobs)
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    def cancel(self, job_id: str, reason: str = "") -> Job:
        """Ask for a job to stop; returns it with `cancel_requested` set.

        Cancelling a cancelled job succeeds.

        Raises:
            NotFoundError: No such job.
            FailedPreconditionError: The job already succeeded or failed.
        """
        request = spb.CancelJobRequest(job_id=job_id, reason=reason)
        response: spb.CancelJobResponse = self._unary("CancelJob", request)
        return _convert.job_from_proto(response.job)

    def delete(self, job_id: str) -> None:
        """Remove a finished job's record and model.

        Raises:
            NotFoundError: No such job (including a job this call deleted on an attempt whose
                reply was lost).
            FailedPreconditionError: The job has not finished; cancel it first.
        """
        self._unary("DeleteJob", spb.DeleteJobRequest(job_id=job_id))

    def watch(self, job_id: str = "") -> Iterator[JobEvent]:
        """The current jobs (or one job), then every change, until the iterator is closed.

        Closing the iterator (or leaving a ``for`` loop over it) cancels the stream.

        Args:
            job_id: Only this job; empty means every job.
        """
        for response in self._stream("WatchJobs", spb.WatchJobsRequest(job_id=job_id)):
            yield JobEvent(_convert.job_from_proto(response.job), response.deleted)

    def explain(self, job_id: str) -> Explanation:
        """Why a job has what it has: its last decision, that round, its model and batch.

        Raises:
            NotFoundError: No such job.
        """
        response: spb.ExplainResponse = self._unary("Explain", spb.ExplainRequest(job_id=job_id))
        return _convert.explanation_from_proto(response)

    def cluster_status(self) -> ClusterStatus:
        """Nodes, GPUs, allocations, agents and the current leader."""
        response: spb.ClusterStatusResponse = self._unary(
            "ClusterStatus", spb.ClusterStatusRequest()
        )
        return _convert.cluster_from_proto(response)

    def log_chunks(
        self,
        job_id: str,
        rank: int = 0,
        *,
        follow: bool = False,
        tail_lines: int = 0,
        min_generation: int = 0,
        since: datetime | None = None,
    ) -> Iterator[LogChunk]:
        """Log lines of one replica with the generation that wrote them (see `logs`).

        Args:
            job_id: The job (id, unique id prefix or unique name).
            rank: Global rank of the replica.
            follow: Keep streaming new lines until the replica exits.
            tail_lines: Retained lines to send first; 0 means all retained.
            min_generation: Only a replica of at least this generation (NotFoundError while
                none has started): how a follower asks for the next generation.
            since: Only lines that arrived at or after this time.
        """
        if rank < 0 or tail_lines < 0:
            raise InvalidArgumentError(
                "rank and tail_lines must be >= 0",
                None,
                violations=[("rank" if rank < 0 else "tail_lines", "must be >= 0")],
            )
        request = lpb.StreamLogsRequest(
            job_id=job_id,
            rank=rank,
            follow=follow,
            tail_lines=tail_lines,
            min_generation=min_generation,
        )
        if since is not None:
            request.since.FromDatetime(since)
        for response in self._stream("StreamLogs", request):
            yield LogChunk(response.generation, tuple(response.lines))

    def timeline(self, job_id: str) -> pb.JobTimeline:
        """The job's sampled life (GPUs, batch size, throughput, efficiency, goodput, progress).

        Raises:
            NotFoundError: No such job.
        """
        request = spb.GetJobTimelineRequest(job_id=job_id)
        response: spb.GetJobTimelineResponse = self._unary("GetJobTimeline", request)
        return response.timeline

    def logs(
        self, job_id: str, rank: int = 0, *, follow: bool = False, tail_lines: int = 0
    ) -> Iterator[str]:
        """Log lines of one replica, relayed by a scheduler from the node that runs (or ran) it.

        Args:
            job_id: The job.
            rank: Global rank of the replica.
            follow: Keep streaming new lines until the replica exits.
            tail_lines: Retained lines to send first; 0 means all retained.

        Raises:
            NotFoundError: No such job, or no launcher has a replica of that rank.
            UnavailableError: The node is not registered or its launcher does not answer.
        """
        for chunk in self.log_chunks(job_id, rank, follow=follow, tail_lines=tail_lines):
            yield from chunk.lines


def _state_numbers(states: Sequence[str]) -> list[int]:
    numbers: list[int] = []
    bad: list[tuple[str, str]] = []
    for name in states:
        try:
            numbers.append(_convert.state_number(name))
        except KeyError:
            bad.append(("states", f"unknown job state {name!r}"))
    if bad:
        raise InvalidArgumentError(
            f"unknown job state; use one of {', '.join(JOB_STATES)}", None, violations=bad
        )
    return numbers
