"""TLS material of one process, re-read when its files change.

A service names three files in its `[tls]` section: the CA bundle that signed its peers, its
own certificate and its key. `TlsFiles` reads them and hands out gRPC credentials:

- server credentials are *dynamic*: gRPC asks `TlsFiles` before every new handshake, and a
  changed file (a renewed certificate) is picked up by the next connection, with no restart;
- channel credentials (to etcd, to launchers) are read when a channel is made; `changed`
  tells a long-lived connection that it is time to re-dial (`Store.reload_tls`).

A file caught half-written is not used: the previous material stays until all three parse.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from pollux.service.config import TlsConfig

log = structlog.get_logger(__name__)


class TlsError(ValueError):
    """The TLS files cannot be used, with what to do about it."""


@dataclass(frozen=True, slots=True)
class _Material:
    ca: bytes
    cert: bytes
    key: bytes
    stamp: tuple[tuple[int, int], ...]


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


def _looks_like_pem(data: bytes, what: str) -> bool:
    return b"-----BEGIN " in data and what.encode() in data


class TlsFiles:
    """The CA, certificate and key files of one process (see the module doc)."""

    def __init__(self, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        self.paths = (Path(ca_file), Path(cert_file), Path(key_file))
        self._lock = threading.Lock()  # gRPC calls the fetcher from its own threads
        self._material = self._read()
        self.generation = 0
        """Bumped each time new material is taken up."""

    @classmethod
    def of(cls, config: TlsConfig) -> TlsFiles | None:
        """The files a `[tls]` section names, or None when TLS is off."""
        if not config.enabled:
            return None
        ca, cert, key = config.ca_file, config.cert_file, config.key_file
        assert ca is not None
        assert cert is not None
        assert key is not None
        return cls(ca, cert, key)

    def _read(self) -> _Material:
        try:
            stamp = _stamp(self.paths)
            ca, cert, key = (path.read_bytes() for path in self.paths)
        except OSError as error:
            raise TlsError(
                f"cannot read {error.filename}: {error.strerror} "
                "(tls.ca_file, tls.cert_file and tls.key_file must name readable PEM files)"
            ) from error
        for data, what, path in ((ca, "CERTIFICATE", 0), (cert, "CERTIFICATE", 1), (key, "KEY", 2)):
            if not _looks_like_pem(data, what):
                raise TlsError(f"{self.paths[path]} is not a PEM {what.lower()}")
        return _Material(ca, cert, key, stamp)

    def current(self) -> _Material:
        """The material now, re-read if a file changed since it was last read."""
        with self._lock:
            try:
                stamp = _stamp(self.paths)
            except OSError:
                return self._material  # mid-rotation: keep what works
            if stamp != self._material.stamp:
                try:
                    self._material = self._read()
                    self.generation += 1
                    log.info("tls_reloaded", cert=str(self.paths[1]), generation=self.generation)
                except TlsError as error:
                    log.warning("tls_reload_failed", error=str(error))
            return self._material

    def changed(self, generation: int) -> bool:
        """Whether the files now differ from what `generation` was made from."""
        self.current()
        return self.generation != generation

    def server_credentials(self, *, require_client_certificate: bool) -> grpc.ServerCredentials:
        """Credentials for a server port; new handshakes see renewed files.

        gRPC Python offers a server either requiring and verifying a client certificate or
        not asking for one; there is no "verify if offered". Ports that only services and
        operators dial require one; the scheduler's public port, dialled by people with
        tokens, does not (`auth.client_certificates` can make it).
        """
        first = self.current()
        served = [first.stamp]

        def configuration(m: _Material) -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration([(m.key, m.cert)], m.ca)

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            now = self.current()
            if now.stamp == served[0]:
                return None
            served[0] = now.stamp
            return configuration(now)

        return grpc.dynamic_ssl_server_credentials(
            configuration(first), fetch, require_client_authentication=require_client_certificate
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for a channel to a peer signed by our CA, presenting our certificate."""
        m = self.current()
        return grpc.ssl_channel_credentials(m.ca, m.key, m.cert)


def is_loopback(listen: str) -> bool:
    """Whether a bind address (host:port) only accepts connections from this machine."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or a wildcard: reachable from elsewhere
