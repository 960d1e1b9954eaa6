"""When no scheduler answers, the client and the CLI say so and what to do; a server's own
UNAVAILABLE (a launcher not answering) keeps its message.

Real sockets on 127.0.0.1: a port where nothing listens (connection refused), a listener that
accepts connections but never speaks HTTP/2 (the call waits for a connection until its
deadline), and a real gRPC server that answers UNAVAILABLE itself.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from pollux.client import cli
from pollux.client.client import Client
from pollux.client.errors import UnavailableError, UnreachableError
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2_grpc

pytestmark = pytest.mark.timeout(60)

HINT = (
    ": start one with ./scripts/demo or set POLLUX_SERVER (or --server, or a context in "
    "~/.config/pollux/config.toml)"
)


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("POLLUX_SERVER", "POLLUX_CONTEXT", "POLLUX_CA", "POLLUX_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POLLUX_CONFIG", str(tmp_path / "config.toml"))


@pytest.fixture
def refused() -> str:
    """An address where nothing listens (a port bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


class Relay(scheduler_service_pb2_grpc.SchedulerServiceServicer):
    """A scheduler whose launchers do not answer: UNAVAILABLE, from the server itself."""

    def ClusterStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        context.abort(grpc.StatusCode.UNAVAILABLE, "no leader: etcd unreachable")

    def StreamLogs(self, request: Any, context: Any) -> Iterator[lpb.StreamLogsResponse]:  # noqa: N802
        context.abort(grpc.StatusCode.UNAVAILABLE, "the launcher of node n1 does not answer")
        yield lpb.StreamLogsResponse()


@pytest.fixture
def relay() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_service_pb2_grpc.add_SchedulerServiceServicer_to_server(Relay(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait(10)


def test_connection_refused_is_unreachable(refused: str) -> None:
    with Client(refused, timeout_s=5) as client, pytest.raises(UnreachableError) as caught:
        client.cluster_status()
    assert caught.value.targets == (refused,)
    assert caught.value.cause == "connection refused"
    assert refused in caught.value.message


def test_a_deadline_before_any_connection_is_unreachable(silent: str) -> None:
    with Client(silent, timeout_s=0.5) as client, pytest.raises(UnreachableError) as caught:
        client.cluster_status()
    assert caught.value.targets == (silent,)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.cause == "no answer within 0.5 s"


def test_an_unreachable_target_is_failed_over_even_on_a_deadline(silent: str, relay: str) -> None:
    """A silent first replica does not hide a second one that answers (here: UNAVAILABLE)."""
    with (
        Client([silent, relay], timeout_s=0.5) as client,
        pytest.raises(UnavailableError) as caught,
    ):
        client.cluster_status()
    assert not isinstance(caught.value, UnreachableError), "one of them answered"
    assert "no leader: etcd unreachable" in caught.value.message


def test_a_servers_own_unavailable_keeps_its_message(relay: str, capsys) -> None:
    with Client(relay, timeout_s=5) as client, pytest.raises(UnavailableError) as caught:
        list(client.logs("j-1"))
    assert not isinstance(caught.value, UnreachableError)
    assert "the launcher of node n1 does not answer" in caught.value.message
    assert cli.main(["--server", relay, "logs", "j-1"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: no Pollux scheduler could serve the request")
    assert err.rstrip().endswith("the launcher of node n1 does not answer")


@pytest.mark.parametrize("where", ["flag", "environment", "context"])
def test_the_cli_says_where_the_address_came_from_and_what_to_do(
    where: str, refused: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    argv = ["nodes"]
    if where == "flag":
        argv = ["--server", refused, *argv]
        origin = "from --server"
    elif where == "environment":
        monkeypatch.setenv("POLLUX_SERVER", refused)
        origin = "from POLLUX_SERVER"
    else:
        from pollux.client.config import Context, write_context

        write_context(tmp_path / "config.toml", "lab", Context(refused))
        origin = f"from the server of context 'lab' in {tmp_path / 'config.toml'}"
    assert cli.main(argv) == cli.EXIT_ERROR
    assert capsys.readouterr().err.splitlines() == [
        f"error: no scheduler at {refused} ({origin}; connection refused){HINT}"
    ]


def test_the_cli_on_a_silent_address(silent: str, capsys) -> None:
    assert cli.main(["--server", silent, "--timeout", "0.5", "ls"]) == cli.EXIT_ERROR
    assert capsys.readouterr().err.splitlines() == [
        f"error: no scheduler at {silent} (from --server; no answer within 0.5 s){HINT}"
    ]
