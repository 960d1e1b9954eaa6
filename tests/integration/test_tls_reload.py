"""A renewed certificate is served from the next connection on, without a restart."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pollux.service import pki
from pollux.service.auth import Authenticator
from pollux.service.config import ConfigError
from pollux.service.server import ServiceHost
from pollux.service.tls import TlsFiles


async def healthy(address: str, ca: Path) -> bool:
    credentials = grpc.ssl_channel_credentials(ca.read_bytes())
    async with grpc.aio.secure_channel(address, credentials) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_rotated_certificate_is_served_to_new_connections(tmp_path: Path) -> None:
    old_ca = pki.create_ca(tmp_path / "old")
    new_ca = pki.create_ca(tmp_path / "new")
    served = tmp_path / "served"
    first = pki.issue(old_ca, served, "svc", "service", hosts=("127.0.0.1",))
    tls = TlsFiles(old_ca.cert, first.cert, first.key)
    host = ServiceHost("test", "127.0.0.1:0", tls=tls, authenticator=Authenticator())
    port = await host.start(lambda server: [])
    address = f"127.0.0.1:{port}"
    try:
        assert await healthy(address, old_ca.cert)
        assert not await healthy(address, new_ca.cert)
        # The operator renews the certificate from another CA, in place.
        renewed = pki.issue(new_ca, tmp_path / "renewed", "svc", "service", hosts=("127.0.0.1",))
        shutil.copy(renewed.key, first.key)
        shutil.copy(renewed.cert, first.cert)
        assert await healthy(address, new_ca.cert), "the next connection gets the new one"
        assert not await healthy(address, old_ca.cert)
    finally:
        await host.stop(0)


async def test_plaintext_off_loopback_needs_an_explicit_insecure() -> None:
    with pytest.raises(ConfigError, match="reachable from other machines"):
        ServiceHost("test", "0.0.0.0:0")
    ServiceHost("test", "0.0.0.0:0", insecure=True)  # allowed, and it warns when it starts
    ServiceHost("test", "127.0.0.1:0")


async def test_the_metrics_endpoint_of_a_tls_service_wants_a_certificate(tmp_path: Path) -> None:
    ca = pki.create_ca(tmp_path)
    served = pki.issue(ca, tmp_path, "svc", "service", hosts=("127.0.0.1",))
    scraper = pki.issue(ca, tmp_path, "prometheus", "service")
    tls = TlsFiles(ca.cert, served.cert, served.key)
    host = ServiceHost("test", "127.0.0.1:0", "127.0.0.1:0", tls=tls, authenticator=Authenticator())
    await host.start(lambda server: [])
    url = f"https://127.0.0.1:{host.metrics_port}/metrics"
    try:

        def scrape(with_certificate: bool) -> int:
            context = ssl.create_default_context(cafile=str(ca.cert))
            if with_certificate:
                context.load_cert_chain(scraper.cert, scraper.key)
            with urllib.request.urlopen(url, context=context, timeout=5) as reply:
                return int(reply.status)

        assert await asyncio.to_thread(scrape, True) == 200
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(scrape, False)
    finally:
        await host.stop(0)
