"""SchedulerService over gRPC: decode → validate → store → encode, on every replica.

Every replica serves every RPC; the concerns live in `pollux.scheduler.api` (job writes, job
reads, streams, cluster views over one `ServicerBase`) and `SchedulerServicer` joins them into
the one servicer a replica registers. A job reference is resolved once per call and ownership
checked on the job it resolved to; responses carry the leader's id and address in trailing
metadata (api/base.py).
"""

from __future__ import annotations

from pollux.scheduler.api.base import Context, ServicerBase
from pollux.scheduler.api.cluster import ClusterViews, last_change
from pollux.scheduler.api.job_reads import JobReads
from pollux.scheduler.api.job_writes import JobWrites, cancel_reason
from pollux.scheduler.api.streams import JobStreams
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc

__all__ = ["Context", "SchedulerServicer", "ServicerBase", "cancel_reason", "last_change"]


class SchedulerServicer(
    JobWrites, JobReads, JobStreams, ClusterViews, spb_grpc.SchedulerServiceServicer
):
    """The SchedulerService RPCs of one replica (arguments: `ServicerBase`)."""
