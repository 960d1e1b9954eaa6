"""Dialling etcd: one aetcd client, over TLS with a client certificate where configured.

aetcd itself dials plaintext only; `TlsClient` is made like aetcd's own `connect` with
`grpc.aio.secure_channel` in its place, reading the credentials at each connect so that a
re-dial picks up a renewed certificate. `close` never hangs (see its docstring).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aetcd
import aetcd.exceptions
import structlog
from aetcd import rpc

from pollux.service.etcd.errors import StoreUnavailable
from pollux.service.etcd_target import aetcd_address, split_endpoints
from pollux.service.tls import TlsFiles

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest etcd response the client receives (a range of thousands of jobs)."""
CLOSE_TIMEOUT_S = 1.0
"""How long closing waits for aetcd's own shutdown before closing the channel itself."""
log = structlog.get_logger(__name__)


class TlsClient(aetcd.Client):  # type: ignore[misc]
    """An aetcd client over TLS with a client certificate from `TlsFiles`."""

    def __init__(self, tls: TlsFiles, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tls = tls
        self.tls_generation = tls.generation

    async def connect(self) -> None:
        """Dial over TLS with the current certificate (a no-op while connected)."""
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            credentials = self._tls.channel_credentials()
            self.tls_generation = self._tls.generation
            self.channel = rpc.secure_channel(
                f"{self._host}:{self._port}", credentials, options=self._options.items()
            )
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


async def dial(endpoint: str, *, timeout_s: float = 5.0, tls: TlsFiles | None = None) -> Any:
    """A connected aetcd client of `endpoint`.

    `endpoint` is ``host:port``, or several members' endpoints comma-separated: requests
    then fail over between them. With `tls`, etcd is dialled over TLS and our certificate
    is the client identity (etcd runs with ``--client-cert-auth``).

    Raises:
        ValueError: A malformed endpoint (etcd_target.EndpointError).
        StoreUnavailable: etcd could not be reached.
    """
    host, port = aetcd_address(endpoint)
    # Large clusters list thousands of jobs in one range; gRPC's 4 MiB default is too small.
    options: dict[str, Any] = {"grpc.max_receive_message_length": MAX_MESSAGE_BYTES}
    if tls is not None:
        # One target over several members has no single host name to verify: every
        # member's certificate must name the first member's host (etcd's own guidance
        # is one certificate naming every member).
        options["grpc.ssl_target_name_override"] = split_endpoints(endpoint)[0][0]
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "timeout": timeout_s,
        "options": options,
    }
    client = TlsClient(tls, **settings) if tls is not None else aetcd.Client(**settings)
    try:
        await client.connect()
    except aetcd.exceptions.ClientError as error:
        raise StoreUnavailable(f"cannot connect to etcd at {endpoint}: {error}") from error
    return client


async def close(client: Any) -> None:
    """Close a client; never hangs.

    aetcd's watcher shutdown puts a sentinel into its bounded request queue, which can
    wait for good when the queue is full and its stream no longer reads it. After
    `CLOSE_TIMEOUT_S` the channel is closed directly, which ends every call and stream.
    """
    try:
        await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)
    except TimeoutError:
        log.warning("etcd_client_close_stuck", timeout_s=CLOSE_TIMEOUT_S)
        channel = client.channel
        if channel is not None:
            await channel.close()


async def redial_if_renewed(client: Any, tls: TlsFiles | None) -> bool:
    """Re-dial a TLS client if its certificate files changed since it connected.

    In-flight calls fail over (UNAVAILABLE, retried by their callers) and watches re-attach
    from their last revision, as after any etcd outage. True if it re-dialled.
    """
    if tls is None or not isinstance(client, TlsClient) or not tls.changed(client.tls_generation):
        return False
    log.info("etcd_redial_for_new_certificate", generation=tls.generation)
    try:
        await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)
    except TimeoutError:
        if client.channel is not None:
            await client.channel.close()
        client._init_channel_attrs()
        client._connected.clear()
    await client.connect()
    return True
