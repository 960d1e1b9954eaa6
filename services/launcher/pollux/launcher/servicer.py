"""LauncherService: the gRPC face of a node's replicas (logs and the replica table).

A thin adapter: validate the request, read the launcher's in-memory state,
encode. Allocations never arrive here — they come through etcd — so nothing in this service
mutates anything and every RPC is safe to retry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
import structlog

from pollux.launcher.launcher import Launcher
from pollux.launcher.replica import batches
from pollux.service.errors import NotFound, Violations
from pollux.service.rpc import annotate
from pollux.terminal import quoted
from pollux.v1 import launcher_service_pb2 as lpb

log = structlog.get_logger(__name__)

SERVICE_NAME = lpb.DESCRIPTOR.services_by_name["LauncherService"].full_name
"""Fully qualified service name, for health and reflection."""

MESSAGE_BYTES = 32 * 1024
"""Most log bytes in one StreamLogs message (a longer line goes alone).

Small, because whoever relays the stream holds a message while its reader is slow: the
scheduler's bound on a stalled follower's memory counts on it (pollux.scheduler.logs).
"""

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class LauncherServicer:
    """Implements pollux.v1.LauncherService over a `Launcher`.

    Not derived from the generated (untyped) base class: grpc only needs the methods, and the
    type checker then sees this class whole.
    """

    def __init__(self, launcher: Launcher) -> None:
        self._launcher = launcher

    async def StreamLogs(
        self, request: lpb.StreamLogsRequest, context: Context
    ) -> AsyncIterator[lpb.StreamLogsResponse]:
        """The replica's retained tail, then (with follow) new lines until it exits.

        Raises:
            InvalidArgument: job_id is empty.
            NotFound: No replica of that job and rank ran on this node recently.
        """
        problems = Violations()
        problems.check(bool(request.job_id), "job_id", "required: the job whose log to stream")
        problems.raise_if_any()
        replica = self._launcher.find(request.job_id, request.rank, request.min_generation)
        if replica is None:
            newer = f" of generation >= {request.min_generation}" if request.min_generation else ""
            raise NotFound(
                f"no replica{newer} of job {quoted(request.job_id)} with rank {request.rank} on "
                f"node {self._launcher.node_name!r}; ListReplicas shows the ones here"
            )
        annotate(rank=request.rank, generation=replica.generation, follow=request.follow)
        since = request.since.ToNanoseconds() / 1e9 if request.HasField("since") else None
        lines, cursor = replica.log.tail(request.tail_lines, since)
        sent = len(lines)
        # The first message comes at once, even empty: it tells the client the generation.
        for batch in batches(lines, MESSAGE_BYTES) if lines else [[]]:
            yield lpb.StreamLogsResponse(lines=batch, generation=replica.generation)
        if request.follow:
            async for new_lines in replica.log.follow(cursor):
                sent += len(new_lines)
                annotate(lines=sent)
                for batch in batches(new_lines, MESSAGE_BYTES):
                    yield lpb.StreamLogsResponse(lines=batch, generation=replica.generation)
        annotate(lines=sent)

    async def ListReplicas(
        self, request: lpb.ListReplicasRequest, context: Context
    ) -> lpb.ListReplicasResponse:
        """Replicas this node runs or ran recently, newest generation first."""
        replicas = self._launcher.replicas(request.job_id)
        return lpb.ListReplicasResponse(replicas=[r.status() for r in replicas])
