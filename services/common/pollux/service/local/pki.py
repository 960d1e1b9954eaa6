"""A secure local cluster's CA, service certificates and admin token, under one directory.

The directory (`pki/` in the work dir, 0700) holds a CA made on first use, a certificate per
service process valid on loopback (keys 0600), and the admin token, reused when the cluster is
started again on the same work dir as long as etcd still has it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import grpc

from pollux.service import auth, pki
from pollux.service.bootstrap import create_token
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import types_pb2 as pb


class LocalPki:
    """The certificates and admin token of a local cluster.

    Args:
        directory: Where they are kept (made by the work dir's layout, 0700).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def ca_file(self) -> Path:
        """The CA certificate every service and client checks the others against."""
        return self.directory / "ca.pem"

    @property
    def admin_token_file(self) -> Path:
        """Where the admin token is kept (0600), reused on restart."""
        return self.directory / "admin-token"

    def identity(self, name: str) -> pki.Issued:
        """The certificate of a service process (made on first use, valid on loopback)."""
        issued = pki.Issued(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")
        if not issued.cert.exists():
            ca = pki.Issued(self.ca_file, self.directory / "ca-key.pem")
            if not ca.cert.exists():
                ca = pki.create_ca(self.directory, "pollux-up local CA")
            hosts = ("127.0.0.1", "localhost", socket.gethostname())
            issued = pki.issue(ca, self.directory, name, "service", hosts=hosts)
        return issued

    def tls_flags(self, name: str) -> list[str]:
        """The TLS flags of service process `name` (its certificate, made on first use)."""
        issued = self.identity(name)
        return [
            *("--tls-ca", str(self.ca_file)),
            *("--tls-cert", str(issued.cert), "--tls-key", str(issued.key)),
        ]

    def etcd_tls(self, name: str = "operator") -> TlsFiles:
        """TLS files for etcd under `name`'s certificate (an operator's by default)."""
        identity = self.identity(name)
        return TlsFiles(self.ca_file, identity.cert, identity.key)

    def channel(self, address: str) -> grpc.Channel:
        """A channel to a service port, holding an operator's service certificate."""
        identity = self.identity("operator")
        credentials = grpc.ssl_channel_credentials(
            self.ca_file.read_bytes(), identity.key.read_bytes(), identity.cert.read_bytes()
        )
        return grpc.secure_channel(address, credentials)

    async def admin_token(self, etcd_endpoint: str) -> str:
        """The admin token: the one kept here if etcd still has it, else a new one (kept).

        So starting again on the same work dir does not mint a second never-expiring token.
        """
        store = await Store.connect(etcd_endpoint, tls=self.etcd_tls("pollux-up"))
        try:
            kept = read_private(self.admin_token_file)
            parsed = auth.parse_token(kept) if kept else None
            if parsed is not None:
                record = await store.get(store.keys.token(parsed[0]), pb.ApiToken)
                if record is not None and auth.token_matches(parsed[1], record.value.secret_sha256):
                    expiry = record.value.expire_time.ToNanoseconds()
                    if not expiry or expiry > time.time_ns():
                        return kept
            token = await create_token(store, "admin", description="pollux-up")
            write_private(self.admin_token_file, token)
            return token
        finally:
            await store.close()


def read_private(path: Path) -> str:
    """A secret file's text, stripped ("" if there is none)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def write_private(path: Path, text: str) -> None:
    """Write a secret file: 0600 from its creation, replaced atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
    os.replace(tmp, path)
