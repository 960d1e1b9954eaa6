"""A stalled log follower holds a bounded number of bytes in the scheduler: real gRPC, loopback.

A launcher that always has more to send serves a replica's log; the scheduler's relay
(pollux.scheduler.logs) serves it on to a follower that reads the first message and then stops.
Everything the launcher handed to gRPC and the follower did not read is in flight between
them, the scheduler's share included, so that total is what is bounded: by the follower's own
window, the relay's window and the few messages in hand along the way. Without the relay's
fixed window gRPC grows it to megabytes on loopback (6.2 MB here).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from pollux.launcher.replica import batches
from pollux.launcher.servicer import MESSAGE_BYTES
from pollux.scheduler.logs import RELAY_WINDOW_BYTES, LauncherLogs
from pollux.service.server import ServiceHost
from pollux.service.store import Store
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lpb_grpc
from pollux.v1 import types_pb2 as pb
from tests.waiting import eventually

LINE = 1000
"""Characters of each log line (its number, then filler)."""
FOLLOWER_WINDOW = 16 * 1024
"""The test follower's own HTTP/2 stream window (its share of the bytes in flight)."""
FOLLOWER_OPTIONS = [
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", FOLLOWER_WINDOW),
    ("grpc.use_local_subchannel_pool", 1),
]
BOUND = FOLLOWER_WINDOW + RELAY_WINDOW_BYTES + 6 * MESSAGE_BYTES
"""In flight at most: the follower's window, the relay's, and up to two messages each that the
launcher, the relay and the relay's server hold while gRPC sends them (gRPC takes a message
before its predecessor is on the wire). Without the relay's fixed window: megabytes."""


@dataclass
class Sent:
    """What the launcher handed gRPC on one stream."""

    bytes: int = 0
    lines: int = 0
    sending: bool = False
    """Inside a yield: waiting for gRPC to take the message."""


class EndlessLauncher:
    """A launcher whose replica has always written more: numbered lines, as fast as sent."""

    def __init__(self) -> None:
        self.streams: list[Sent] = []

    async def StreamLogs(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        sent = Sent()
        self.streams.append(sent)
        yield lpb.StreamLogsResponse(generation=2)  # the first message, as a launcher sends it
        while True:
            lines = [f"{sent.lines + i:08d} ".ljust(LINE, "x") for i in range(512)]
            for batch in batches(lines, MESSAGE_BYTES):
                sent.bytes += sum(len(line) + 1 for line in batch)
                sent.lines += len(batch)
                sent.sending = True
                yield lpb.StreamLogsResponse(lines=batch, generation=2)
                sent.sending = False

    async def ListReplicas(self, request: Any, context: Any) -> Any:  # noqa: N802
        return lpb.ListReplicasResponse()


class Relay:
    """The scheduler's side: StreamLogs served through `LauncherLogs`, on a `ServiceHost`."""

    def __init__(self, logs: LauncherLogs) -> None:
        self.logs = logs

    async def StreamLogs(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        job = pb.Job(id="j-1", allocation=pb.Allocation(nodes=["n1"], generation=2))
        async for response in self.logs.stream(job, request):
            yield response

    async def ListReplicas(self, request: Any, context: Any) -> Any:  # noqa: N802
        return lpb.ListReplicasResponse()


@dataclass
class Setup:
    launcher: EndlessLauncher
    address: str
    """The relay's."""
    logs: LauncherLogs


@pytest.fixture
async def relay(store: Store) -> AsyncIterator[Setup]:
    """The launcher of n1 (registered in etcd) and a relay from it."""
    launcher = EndlessLauncher()
    launcher_host = ServiceHost("launcher", "127.0.0.1:0")
    launcher_port = await launcher_host.start(
        lambda server: _serve(launcher, server),
    )
    await store.put(
        store.keys.node("n1"), pb.Node(name="n1", address=f"127.0.0.1:{launcher_port}", gpus=1)
    )
    logs = LauncherLogs(store, tls=None)
    relay_host = ServiceHost("scheduler", "127.0.0.1:0")
    relay_port = await relay_host.start(lambda server: _serve(Relay(logs), server))
    try:
        yield Setup(launcher, f"127.0.0.1:{relay_port}", logs)
    finally:
        await relay_host.stop(0)
        await launcher_host.stop(0)


def _serve(servicer: Any, server: grpc.aio.Server) -> list[str]:
    lpb_grpc.add_LauncherServiceServicer_to_server(servicer, server)
    return [lpb.DESCRIPTOR.services_by_name["LauncherService"].full_name]


async def stalled(launcher: EndlessLauncher, index: int) -> Sent:
    """The launcher's side of stream `index` once it waits on gRPC for good.

    Blocked inside a yield with its count unchanged over ten looks a tenth of a second apart:
    the follower reads nothing, so nothing more can drain.
    """
    seen: list[int] = []

    def blocked() -> bool:
        sent = launcher.streams[index] if len(launcher.streams) > index else None
        if sent is None or not sent.sending:
            seen.clear()
            return False
        assert sent.bytes <= BOUND, f"{sent.bytes} bytes in flight, bound {BOUND}"
        seen.append(sent.bytes)
        return len(seen) >= 10 and len(set(seen[-10:])) == 1

    async def look() -> bool:
        await asyncio.sleep(0.1)
        return blocked()

    await eventually(look, 30.0, "the launcher's stream to block on a reader that stopped")
    return launcher.streams[index]


def numbers(responses: list[Any]) -> list[int]:
    return [int(line.split(" ", 1)[0]) for r in responses for line in r.lines]


async def test_a_stalled_follower_holds_a_bounded_number_of_bytes(relay: Setup) -> None:
    launcher, address = relay.launcher, relay.address
    async with grpc.aio.insecure_channel(address, options=FOLLOWER_OPTIONS) as channel:
        call = lpb_grpc.LauncherServiceStub(channel).StreamLogs(
            lpb.StreamLogsRequest(job_id="j-1", follow=True)
        )
        first = await call.read()
        assert first.generation == 2
        assert not first.lines
        sent = await stalled(launcher, 0)  # the follower reads nothing more from here on
        held, lines = sent.bytes, sent.lines
        assert held <= BOUND, f"{held} bytes in flight, bound {BOUND}"
        assert lines > 0  # the pipe did fill: the launcher was not idle
        # Reading again, it gets every line, in order: nothing was dropped on the way.
        responses = [await call.read() for _ in range(200)]
        got = numbers(responses)
        assert got == list(range(len(got)))
        assert len(got) > lines
        call.cancel()


async def test_a_follower_reading_on_gets_its_lines_beside_a_stalled_one(relay: Setup) -> None:
    launcher, address = relay.launcher, relay.address
    async with (
        grpc.aio.insecure_channel(address, options=FOLLOWER_OPTIONS) as slow_channel,
        grpc.aio.insecure_channel(address) as channel,
    ):
        slow = lpb_grpc.LauncherServiceStub(slow_channel).StreamLogs(
            lpb.StreamLogsRequest(job_id="j-1", follow=True)
        )
        await slow.read()
        held = (await stalled(launcher, 0)).bytes
        # Both relays share the one channel to the launcher, each stream with a window of its
        # own: the stalled one does not hold up this one.
        call = lpb_grpc.LauncherServiceStub(channel).StreamLogs(
            lpb.StreamLogsRequest(job_id="j-1", follow=True)
        )
        responses = [await call.read() for _ in range(1 + 400)]
        assert relay.logs.relay_channels == 1
        got = numbers(responses)
        assert got == list(range(len(got)))
        assert len(got) * LINE > 10 * BOUND  # far past what the stalled one may hold
        assert launcher.streams[0].bytes == held
        call.cancel()
        slow.cancel()
        # The shared channel closes with its last stream.
        await eventually(lambda: relay.logs.relay_channels == 0, 10.0, "the channel to close")


class RenewedTls:
    """TLS files whose generation a test bumps, as a renewed certificate does."""

    generation = 0

    def current(self) -> None:
        """The files are re-read in `TlsFiles.current`; here the test sets the generation."""

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials()


async def test_relays_share_a_channel_until_the_tls_files_change(store: Store) -> None:
    tls = RenewedTls()
    logs = LauncherLogs(store, tls=tls)  # type: ignore[arg-type]
    address = "127.0.0.1:1"  # never dialled: no call is made
    async with logs._relay_channel(address) as first:
        async with logs._relay_channel(address) as again:
            assert again is first
        tls.generation = 1  # renewed: new relays get a channel with the new certificate
        async with logs._relay_channel(address) as renewed:
            assert renewed is not first
            assert logs.relay_channels == 1
        assert logs.relay_channels == 0  # the renewed one closed with its stream ...
        async with logs._relay_channel(address) as later:
            assert later is not first  # ... and the old one serves no new stream
    assert logs.relay_channels == 0
