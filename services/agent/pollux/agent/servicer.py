"""The AgentService gRPC servicer: a thin adapter over `Agent`.

Each handler checks the request's job id and calls the agent, which validates the rest before
it writes anything (a bad request changes nothing and gets INVALID_ARGUMENT naming every bad
field); then it encodes the reply. The service skeleton's `RpcObserver` maps typed errors to
status codes, binds `job_id` in the log context and ends every RPC in one canonical log line
(the fields `annotate` adds included) and a latency observation; the agent's own metrics are
below.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc
import prometheus_client
import structlog

from pollux.agent.agent import Agent
from pollux.service.errors import InvalidArgument
from pollux.service.rpc import annotate
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import agent_service_pb2_grpc as api_grpc

log = structlog.get_logger(__name__)

SERVICE_NAME = api.DESCRIPTOR.services_by_name["AgentService"].full_name
"""Fully qualified service name, for health and reflection."""

REPORTS = prometheus_client.Counter(
    "pollux_agent_reports", "ReportMetrics calls that passed validation, by outcome.", ["outcome"]
)
FITS = prometheus_client.Counter(
    "pollux_agent_fits", "Throughput-model fits, by outcome.", ["outcome"]
)
FIT_SECONDS = prometheus_client.Histogram(
    "pollux_agent_fit_seconds",
    "Seconds per throughput-model fit.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class AgentServicer(api_grpc.AgentServiceServicer):
    """AgentService over one `Agent`."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    async def ReportMetrics(
        self, request: api.ReportMetricsRequest, context: Context
    ) -> api.ReportMetricsResponse:
        """Merge a replica's report into the job's profile (see agent_service.proto)."""
        annotate(generation=request.generation, rank=request.rank, seq=request.seq)
        if not request.job_id:
            raise InvalidArgument([("job_id", "must not be empty")])
        outcome = await self._agent.report_metrics(request)
        REPORTS.labels("applied" if outcome.applied else "duplicate").inc()
        if outcome.fit_seconds is not None:
            FITS.labels("failed" if outcome.fit_failed else "ok").inc()
            FIT_SECONDS.observe(outcome.fit_seconds)
        annotate(
            applied=outcome.applied,
            observations=outcome.observations,
            fit_s=None if outcome.fit_seconds is None else round(outcome.fit_seconds, 4),
            attempts=outcome.attempts,
        )
        return api.ReportMetricsResponse(
            applied=outcome.applied,
            observations=outcome.observations,
            agents=self._agent.agents_for(request.job_id),
        )

    async def GetBatchConfig(
        self, request: api.GetBatchConfigRequest, context: Context
    ) -> api.GetBatchConfigResponse:
        """The batch configuration for an allocation shape (see agent_service.proto)."""
        annotate(num_nodes=request.num_nodes, num_replicas=request.num_replicas)
        problems = []
        if not request.job_id:
            problems.append(("job_id", "must not be empty"))
        if request.num_nodes < 1:
            problems.append(("num_nodes", "must be >= 1"))
        if request.num_replicas < max(request.num_nodes, 1):
            problems.append(
                ("num_replicas", f"must be >= num_nodes ({request.num_nodes}) and >= 1")
            )
        if problems:
            raise InvalidArgument(problems)
        config = await self._agent.get_batch_config(
            request.job_id, request.num_nodes, request.num_replicas
        )
        annotate(
            local_batch_size=config.local_batch_size,
            accum_steps=config.accum_steps,
            speedup=round(config.predicted_speedup, 3),
        )
        return api.GetBatchConfigResponse(
            config=config, agents=self._agent.agents_for(request.job_id)
        )

    async def GetModel(
        self, request: api.GetModelRequest, context: Context
    ) -> api.GetModelResponse:
        """The job's latest model (see agent_service.proto)."""
        if not request.job_id:
            raise InvalidArgument([("job_id", "must not be empty")])
        return api.GetModelResponse(model=await self._agent.get_model(request.job_id))
