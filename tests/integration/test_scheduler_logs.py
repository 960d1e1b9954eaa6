"""Replica logs relayed by the scheduler (pollux.scheduler.logs): real etcd, real gRPC."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from pollux.scheduler.logs import LauncherLogs
from pollux.service.errors import NotFound, Unavailable, abort
from pollux.service.store import Store
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lpb_grpc
from pollux.v1 import types_pb2 as pb


class Launcher(lpb_grpc.LauncherServiceServicer):
    """A launcher that ran rank 1 of every job (generation 2) and serves its log."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def StreamLogs(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.requests.append(request)
        if request.rank != 1:
            await abort(context, NotFound(f"no replica of rank {request.rank} here"))
        yield lpb.StreamLogsResponse(lines=["epoch 1", "epoch 2"], generation=2)
        yield lpb.StreamLogsResponse(lines=["done"], generation=2)

    async def ListReplicas(self, request: Any, context: Any) -> Any:  # noqa: N802
        return lpb.ListReplicasResponse(
            replicas=[pb.ReplicaStatus(job_id=request.job_id, rank=1, generation=2, node="n2")]
        )


def dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
async def nodes(store: Store) -> AsyncIterator[Launcher]:
    """n1 (its launcher is down) and n2 (a live launcher), registered in etcd."""
    launcher = Launcher()
    server = grpc.aio.server()
    lpb_grpc.add_LauncherServiceServicer_to_server(launcher, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await store.put(store.keys.node("n1"), pb.Node(name="n1", address=dead_address(), gpus=1))
    await store.put(store.keys.node("n2"), pb.Node(name="n2", address=f"127.0.0.1:{port}", gpus=1))
    try:
        yield launcher
    finally:
        await server.stop(0)


def job(*nodes: str) -> pb.Job:
    return pb.Job(id="j-1", allocation=pb.Allocation(nodes=list(nodes), generation=2))


async def lines(logs: LauncherLogs, job: pb.Job, **request: Any) -> list[str]:
    out: list[str] = []
    async for response in logs.stream(job, lpb.StreamLogsRequest(job_id=job.id, **request)):
        out.extend(response.lines)
    return out


async def test_the_log_comes_from_the_node_of_the_rank(store: Store, nodes: Launcher) -> None:
    logs = LauncherLogs(store, tls=None)
    got = await lines(logs, job("n1", "n2"), rank=1, follow=True, tail_lines=5)
    assert got == ["epoch 1", "epoch 2", "done"]
    request = nodes.requests[0]
    assert (request.job_id, request.rank, request.follow, request.tail_lines) == ("j-1", 1, True, 5)


async def test_a_job_without_gpus_is_found_by_asking_every_launcher(
    store: Store, nodes: Launcher
) -> None:
    # Finished or pending again: no allocation, and n1's launcher does not answer.
    assert await lines(LauncherLogs(store, tls=None), job(), rank=1) == [
        "epoch 1",
        "epoch 2",
        "done",
    ]


async def test_a_rank_no_launcher_ran_is_not_found(store: Store, nodes: Launcher) -> None:
    with pytest.raises(NotFound, match="no replica of rank 3 of job j-1 on any node"):
        await lines(LauncherLogs(store, tls=None), job(), rank=3)
    with pytest.raises(NotFound, match="rank 0"):  # the launcher's own NOT_FOUND, typed
        await lines(LauncherLogs(store, tls=None), job("n2", "n2"), rank=0)


async def test_an_unregistered_or_dead_node_is_unavailable(store: Store, nodes: Launcher) -> None:
    with pytest.raises(Unavailable, match="node n9 of rank 0 of job j-1 is not registered"):
        await lines(LauncherLogs(store, tls=None), job("n9"), rank=0)
    with pytest.raises(Unavailable, match="did not serve the log"):
        await lines(LauncherLogs(store, tls=None), job("n1"), rank=0)
