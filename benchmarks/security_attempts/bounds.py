"""Per-user bounds: one user's open streams and submits hit a cap, and another user goes on.

Bob opens streams until one is refused and floods submits until one is refused
(RESOURCE_EXHAUSTED) while alice still streams and submits (the controls).
"""

from __future__ import annotations

import secrets
from typing import Any

import grpc

from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

from .session import CALL_TIMEOUT_S, MAX_STREAMS_TRIED, MAX_SUBMITS_TRIED, OK, Session, code_of


async def stream_caps(session: Session, users: dict[str, str]) -> None:
    """One user's open streams hit a cap; another user still streams meanwhile."""
    own = await session.submit(users["bob"], "check-streams")
    bob = session.jobs(users["bob"])
    calls: list[Any] = []
    got, message = "OPEN", f"{MAX_STREAMS_TRIED} streams opened, none refused"
    try:
        for _ in range(MAX_STREAMS_TRIED):
            call = bob.WatchJobs(spb.WatchJobsRequest(job_id=own.id), timeout=CALL_TIMEOUT_S * 6)
            calls.append(call)
            try:
                await call.read()
            except grpc.aio.AioRpcError as error:
                got, message = code_of(error)
                break
        others = session.jobs(users["alice"]).WatchJobs(
            spb.WatchJobsRequest(), timeout=CALL_TIMEOUT_S
        )
        await session.expect_stream(
            "(control) alice opens a stream while bob holds his cap", OK, others
        )
    finally:
        for call in calls:
            call.cancel()
    session.record(f"bob opens stream {len(calls)} at once", "RESOURCE_EXHAUSTED", got, message)


async def submit_caps(session: Session, users: dict[str, str]) -> None:
    """One user's flood of submits is refused past their rate; another user submits."""
    got, message, sent = "ACCEPTED", f"{MAX_SUBMITS_TRIED} submits accepted", 0
    flood_from = len(session.cleanup_jobs)
    while got == "ACCEPTED" and sent < MAX_SUBMITS_TRIED:
        sent += 1
        try:
            await session.submit(users["bob"], "check-flood")
        except grpc.aio.AioRpcError as error:
            got, message = code_of(error)
    session.record(f"bob's submit {sent} in a burst", "RESOURCE_EXHAUSTED", got, message)
    # The flood only had to be accepted or refused: cancelled now, its dozens of jobs do not
    # queue on the cluster's slots ahead of the later attempts' jobs.
    await session.cancel(session.cleanup_jobs[flood_from:])
    await session.expect(
        "(control) alice submits while bob is refused",
        OK,
        session.jobs(users["alice"]).SubmitJob(
            spb.SubmitJobRequest(
                spec=pb.JobSpec(
                    name="check-after-flood",
                    command=["python", "-c", "pass"],
                    batch=pb.BatchLimits(initial_batch_size=1),
                ),
                request_id=f"check-{secrets.token_hex(8)}",
            ),
            timeout=CALL_TIMEOUT_S,
        ),
    )
