"""Replica logs through the scheduler: clients never dial a launcher.

A person's `pollux-cli logs` asks a scheduler replica (launcher ports accept only services'
certificates), which checks the caller may see the job, finds the node that runs (or ran) the
rank and relays that launcher's stream over its own mTLS channel, one shared per launcher.
A relay holds bounded bytes whatever its reader does: it reads the launcher's next message
only once the last one was handed to the reader's connection, and its channel turns gRPC's
bandwidth probing off and fixes the stream window at `RELAY_WINDOW_BYTES` (the probe grew it to
megabytes: a stalled follower of a 2 MB/s job held 4.2 MB). With launcher messages of at most
32 KiB a stalled stream holds about 200 KiB; 1024 streams about 200 MB (architecture.md §9).
Nothing is dropped here; a follower more than the launcher's ring behind resumes at its oldest
line.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from pollux.service.errors import NotFound, Unavailable
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lpb_grpc
from pollux.v1 import types_pb2 as pb

LIST_TIMEOUT_S = 5.0

RELAY_WINDOW_BYTES = 16 * 1024
"""HTTP/2 stream window of a relay's call to a launcher: what the launcher may send ahead."""

RELAY_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.http2.bdp_probe", 0),  # no window growth past the one below (see the module doc)
    ("grpc.http2.lookahead_bytes", RELAY_WINDOW_BYTES),  # chttp2's initial stream window
)
"""Options of the relays' channels to launchers (grpc core's channel arguments)."""


@dataclass
class _Shared:
    """A channel to one launcher and the relays using it."""

    channel: grpc.aio.Channel
    tls_generation: int
    streams: int = 0


class LauncherLogs:
    """Finds and relays replica logs (see the module doc).

    Args:
        store: The cluster state (node registrations).
        tls: The scheduler's TLS files (its certificate is what launchers accept); None for a
            plaintext cluster.
    """

    def __init__(self, store: Store, tls: TlsFiles | None) -> None:
        self.store = store
        self.tls = tls
        self._shared: dict[str, _Shared] = {}

    @property
    def relay_channels(self) -> int:
        """Channels to launchers open for relays now (one per launcher relayed from)."""
        return len(self._shared)

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self.tls is None:
            return grpc.aio.insecure_channel(address, options=RELAY_OPTIONS)
        return grpc.aio.secure_channel(
            address, self.tls.channel_credentials(), options=RELAY_OPTIONS
        )

    def _tls_generation(self) -> int:
        """The generation of the TLS files now (re-read if they changed); 0 without TLS."""
        if self.tls is None:
            return 0
        self.tls.current()
        return self.tls.generation

    @contextlib.asynccontextmanager
    async def _relay_channel(self, address: str) -> AsyncIterator[grpc.aio.Channel]:
        """The channel to `address` that every relay from it shares while one is open.

        One connection per launcher, not one per stream: a connection (its TLS session, its
        buffers) costs more than a stream's window, and a thousand handshakes cost CPU. Each
        stream keeps a window of its own, so a stalled one holds up no other. A channel made
        before the TLS files changed serves the streams it has and no new one; each closes
        with its last stream.
        """
        generation = self._tls_generation()
        shared = self._shared.get(address)
        if shared is None or shared.tls_generation != generation:
            shared = _Shared(self._channel(address), generation)
            self._shared[address] = shared
        shared.streams += 1
        try:
            yield shared.channel
        finally:
            shared.streams -= 1
            if shared.streams == 0:
                if self._shared.get(address) is shared:
                    del self._shared[address]
                await shared.channel.close()

    async def _generations(self, address: str, job_id: str, rank: int) -> list[int]:
        """Generations of that replica on one launcher; [] if it cannot answer."""
        async with self._channel(address) as channel:
            try:
                response = await lpb_grpc.LauncherServiceStub(channel).ListReplicas(
                    lpb.ListReplicasRequest(job_id=job_id), timeout=LIST_TIMEOUT_S
                )
            except grpc.aio.AioRpcError:
                return []  # a dead node cannot serve the log either; the others may
        return [r.generation for r in response.replicas if r.job_id == job_id and r.rank == rank]

    async def _address(self, job: pb.Job, rank: int, min_generation: int) -> str:
        nodes, _ = await self.store.list_nodes()
        addresses = {e.value.name: e.value.address for e in nodes}
        has_rank = rank < len(job.allocation.nodes)
        if has_rank and min_generation in (0, job.allocation.generation):
            name = job.allocation.nodes[rank]
            if name not in addresses:
                raise Unavailable(f"node {name} of rank {rank} of job {job.id} is not registered")
            return addresses[name]
        # The newest replica (min_generation 0), else the oldest of at least min_generation:
        # a follower asking for the generation after its last one must not skip any.
        best: tuple[int, str] | None = None
        for address in addresses.values():
            for generation in await self._generations(address, job.id, rank):
                if generation < min_generation:
                    continue
                if best is None or (
                    generation > best[0] if min_generation == 0 else generation < best[0]
                ):
                    best = (generation, address)
        if best is None and has_rank and job.allocation.generation >= min_generation:
            name = job.allocation.nodes[rank]  # started, not listed yet by its launcher
            if name in addresses:
                return addresses[name]
        if best is None:
            held = len(job.allocation.nodes)
            newer = f" of generation >= {min_generation}" if min_generation else ""
            raise NotFound(
                f"no replica{newer} of rank {rank} of job {job.id} on any node "
                f"(the job holds {held} GPU{'s' if held != 1 else ''} now)"
            )
        return best[1]

    async def stream(
        self, job: pb.Job, request: lpb.StreamLogsRequest
    ) -> AsyncIterator[lpb.StreamLogsResponse]:
        """The launcher's stream of that replica's log.

        The launcher is asked for `job`'s id whatever `request.job_id` says: a caller's job
        reference (a name, a prefix) is resolved once, by the scheduler, and never forwarded.
        """
        forwarded = lpb.StreamLogsRequest()
        forwarded.CopyFrom(request)
        forwarded.job_id = job.id
        address = await self._address(job, forwarded.rank, forwarded.min_generation)
        async with self._relay_channel(address) as channel:
            call = lpb_grpc.LauncherServiceStub(channel).StreamLogs(forwarded)
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:
                    raise NotFound(str(error.details())) from error
                raise Unavailable(
                    f"the launcher at {address} did not serve the log: {error.details()}"
                ) from error
            finally:
                call.cancel()
