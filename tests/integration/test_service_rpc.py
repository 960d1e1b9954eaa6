"""The one RPC wrapper, on a real gRPC server on loopback: status table, log line, histogram.

A servicer of a real `pollux.v1` service raises each typed error; the client sees the status the
one table gives it, each call leaves exactly one canonical `rpc` log line with method, code and
duration (and the job id bound for the handler's own lines), and the latency histogram counts it
under its method and code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import structlog
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from prometheus_client import REGISTRY

from pollux.service.app import ServiceApp, Servicer
from pollux.service.config import ServerConfig
from pollux.service.errors import InvalidArgument, NotFound
from pollux.service.rpc import annotate
from pollux.service.server import ServiceHost
from pollux.service.store import Conflict, FenceLost, StoreUnavailable
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lgrpc

SERVICE = "pollux.v1.LauncherService"

FAILURES: dict[str, Exception] = {
    "fence": FenceLost(),
    "conflict": Conflict(b"/pollux/v1/jobs/j"),
    "etcd-down": StoreUnavailable("etcd at 127.0.0.1:1 did not answer"),
    "missing": NotFound("no replica of job 'missing' here"),
    "bad": InvalidArgument([("rank", "must be >= 0"), ("tail_lines", "must be >= 0")]),
    "bug": ValueError("an unexpected bug"),
    "huge": InvalidArgument([(f"spec.env[{'K' * 100_000}{i}]", "x" * 100_000) for i in range(100)]),
}
WANT_CODE = {
    "fence": grpc.StatusCode.UNAVAILABLE,
    "conflict": grpc.StatusCode.ABORTED,
    "etcd-down": grpc.StatusCode.UNAVAILABLE,
    "missing": grpc.StatusCode.NOT_FOUND,
    "bad": grpc.StatusCode.INVALID_ARGUMENT,
    "bug": grpc.StatusCode.INTERNAL,
    "huge": grpc.StatusCode.INVALID_ARGUMENT,
}


class FailingLauncher:
    """ListReplicas fails as the job id says; StreamLogs yields two messages, then fails so."""

    log = structlog.get_logger("test")

    async def ListReplicas(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.log.info("handler_line")
        annotate(asked=request.job_id)
        if request.job_id in FAILURES:
            raise FAILURES[request.job_id]
        return lpb.ListReplicasResponse()

    async def StreamLogs(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        for _ in range(2):
            yield lpb.StreamLogsResponse(lines=["x"], generation=1)
        if request.job_id in FAILURES:
            raise FAILURES[request.job_id]


class Idle:
    """A component that does nothing: the RPC path is under test."""

    async def start(self, address: str) -> None:
        return None

    async def stop(self) -> None:
        return None


def make_app() -> ServiceApp:
    server = ServerConfig(grace_s=0)
    servicer = Servicer(lgrpc.add_LauncherServiceServicer_to_server, FailingLauncher(), SERVICE)
    host = ServiceHost.for_config("launcher", server)
    return ServiceApp(host, server, Idle(), [servicer], node_id="n-test")


@pytest.fixture
async def stub() -> AsyncIterator[lgrpc.LauncherServiceStub]:
    app = make_app()
    await app.start()
    try:
        async with grpc.aio.insecure_channel(app.address) as channel:
            yield lgrpc.LauncherServiceStub(channel)
    finally:
        await app.stop()


def observed(method: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "pollux_rpc_seconds_count",
        {"service": "LauncherService", "method": method, "code": code},
    )
    return value or 0.0


@pytest.mark.parametrize("job_id", sorted(FAILURES), ids=lambda j: f"{j} error")
async def test_a_typed_error_becomes_its_one_status_with_one_log_line_and_one_sample(
    stub: lgrpc.LauncherServiceStub, job_id: str
) -> None:
    code = WANT_CODE[job_id]
    before = observed("ListReplicas", code.name)
    with (
        structlog.testing.capture_logs(
            processors=[structlog.contextvars.merge_contextvars]
        ) as logs,
        pytest.raises(grpc.aio.AioRpcError) as caught,
    ):
        await stub.ListReplicas(lpb.ListReplicasRequest(job_id=job_id))
    assert caught.value.code() == code
    assert observed("ListReplicas", code.name) == before + 1
    lines = [e for e in logs if e["event"] == "rpc"]
    assert len(lines) == 1
    line = lines[0]
    assert (line["rpc"], line["code"], line["job_id"], line["asked"]) == (
        "ListReplicas",
        code.name,
        job_id,
        job_id,
    )
    assert line["duration_ms"] >= 0
    assert line["node_id"] == "n-test"  # the process identity reaches every RPC's lines
    handler = next(e for e in logs if e["event"] == "handler_line")
    assert handler["job_id"] == job_id
    assert handler["rpc"] == "ListReplicas"


async def test_invalid_argument_names_every_field_in_bad_request_details(
    stub: lgrpc.LauncherServiceStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListReplicas(lpb.ListReplicasRequest(job_id="bad"))
    status = rpc_status.from_call(caught.value)
    assert status is not None
    detail = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(detail)
    assert [v.field for v in detail.field_violations] == ["rank", "tail_lines"]


async def test_a_lost_fence_tells_the_client_to_retry(stub: lgrpc.LauncherServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListReplicas(lpb.ListReplicasRequest(job_id="fence"))
    assert "lost leadership; retry" in (caught.value.details() or "")


async def test_a_stream_that_fails_midway_delivers_what_it_sent_then_the_status(
    stub: lgrpc.LauncherServiceStub,
) -> None:
    received: list[Any] = []

    async def read_all() -> None:
        async for message in stub.StreamLogs(lpb.StreamLogsRequest(job_id="etcd-down")):
            received.append(message)

    with (
        structlog.testing.capture_logs(
            processors=[structlog.contextvars.merge_contextvars]
        ) as logs,
        pytest.raises(grpc.aio.AioRpcError) as caught,
    ):
        await read_all()
    assert len(received) == 2
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    line = next(e for e in logs if e["event"] == "rpc")
    assert (line["rpc"], line["code"], line["messages"]) == ("StreamLogs", "UNAVAILABLE", 2)


async def test_a_successful_call_is_observed_as_ok(stub: lgrpc.LauncherServiceStub) -> None:
    before = observed("ListReplicas", "OK")
    await stub.ListReplicas(lpb.ListReplicasRequest(job_id="fine"))
    assert observed("ListReplicas", "OK") == before + 1


async def test_health_checks_pass_through_unobserved() -> None:
    app = make_app()
    await app.start()
    try:
        async with grpc.aio.insecure_channel(app.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            with structlog.testing.capture_logs() as logs:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert not [e for e in logs if e["event"] == "rpc"]
    finally:
        await app.stop()


async def test_an_error_that_echoes_huge_input_stays_within_the_metadata_limit(
    stub: lgrpc.LauncherServiceStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListReplicas(lpb.ListReplicasRequest(job_id="huge"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(caught.value.details() or "") <= 1024
    assert (caught.value.details() or "").endswith("…")
    status = rpc_status.from_call(caught.value)
    assert status is not None
    detail = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(detail)
    assert len(detail.field_violations) == 12


async def test_an_undecodable_request_is_invalid_argument_not_unknown() -> None:
    app = make_app()
    await app.start()
    try:
        async with grpc.aio.insecure_channel(app.address) as channel:
            raw = channel.unary_unary(f"/{SERVICE}/ListReplicas")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await raw(b"\xff\xff\xff\xff")
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid ListReplicasRequest" in (caught.value.details() or "")
            stream = channel.unary_stream(f"/{SERVICE}/StreamLogs")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stream(b"\xff\xff\xff\xff"):
                    pass
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await app.stop()
