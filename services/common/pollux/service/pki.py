"""A cluster's own certificate authority: what `pollux-up` and `pollux-cli admin` issue.

Every Pollux identity that a certificate carries is in its subject: the common name is the
name (``scheduler``, ``launcher-node3``, ``alice``) and the organisational unit is the role
(``service``, ``admin`` or ``user``). Services read both with `identity_of` from the peer
certificate gRPC hands them, so a certificate is an identity without any lookup.

Keys are ECDSA P-256: small, fast to verify, and accepted by etcd and gRPC alike. Everything
here is the `cryptography` library's; nothing is hand-made but the choice of fields.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("service", "admin", "user")
"""What a certificate's organisational unit may say."""
ORGANISATION = "pollux"
CA_DAYS = 3650
LEAF_DAYS = 825
"""Leaf lifetime: the longest that common TLS clients still accept."""


class PkiError(ValueError):
    """A certificate or key that cannot be used, with what to do about it."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate says its holder is."""

    name: str
    role: str


@dataclass(frozen=True, slots=True)
class Issued:
    """Where an issued certificate and its key were written."""

    cert: Path
    key: Path


def _name(common: str, role: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write a private key readable by its owner only (created 0600, never widened)."""
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)  # atomic: a reloading service never reads half a key


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def create_ca(directory: Path, name: str = "pollux-ca") -> Issued:
    """A new self-signed CA in `directory` (ca.pem, ca-key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(name, "service")
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    issued = Issued(directory / "ca.pem", directory / "ca-key.pem")
    _write_key(issued.key, key)
    _write_cert(issued.cert, cert)
    return issued


def _load_ca(ca: Issued) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
        key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    except (OSError, ValueError) as error:
        raise PkiError(f"cannot read the CA at {ca.cert} / {ca.key}: {error}") from error
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{ca.key}: the CA key must be an EC key")
    return cert, key


def issue(
    ca: Issued,
    directory: Path,
    name: str,
    role: str,
    *,
    hosts: tuple[str, ...] = (),
    days: int = LEAF_DAYS,
    basename: str | None = None,
) -> Issued:
    """Issue a certificate for `name` in `role`, signed by `ca`, into `directory`.

    Args:
        ca: The CA's certificate and key.
        directory: Where `<basename>.pem` and `<basename>-key.pem` go.
        name: The identity (common name).
        role: One of `ROLES`.
        hosts: DNS names and IP addresses a server certificate is valid for (empty: a client
            certificate only).
        days: Validity.
        basename: File name stem (default: `name`).
    """
    if role not in ROLES:
        raise PkiError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not name or any(ch in name for ch in '/\\,=+<>#;"\n\0'):
        raise PkiError(f"not a usable certificate name: {name!r}")
    ca_cert, ca_key = _load_ca(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name, role))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        alternatives: list[x509.GeneralName] = []
        for host in hosts:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alternatives.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
    cert = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
        ca_key, hashes.SHA256()
    )
    stem = basename or name
    issued = Issued(directory / f"{stem}.pem", directory / f"{stem}-key.pem")
    _write_key(issued.key, key)
    _write_cert(issued.cert, cert)
    return issued


def identity_of(pem: bytes) -> Identity:
    """The identity a (verified) peer certificate states.

    Raises:
        PkiError: The certificate names no role Pollux knows, or no name.
    """
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as error:
        raise PkiError(f"not a PEM certificate: {error}") from error
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    role = str(units[0].value) if units else ""
    name = str(names[0].value) if names else ""
    if role not in ROLES or not name:
        raise PkiError(f"certificate of {name or '?'!r} names no Pollux role (OU={role!r})")
    return Identity(name, role)


def main(argv: list[str] | None = None) -> int:
    """`pollux-certs`: make a cluster CA and issue certificates from it.

    pollux-certs init DIR                                  # DIR/ca.pem, DIR/ca-key.pem
    pollux-certs issue DIR NAME [--role service] [--host H ...] [--days N]
    """
    import argparse  # noqa: PLC0415 - a command-line tool inside a library module
    import sys  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="pollux-certs", description="A Pollux cluster's CA.")
    sub = parser.add_subparsers(dest="action", required=True)
    init = sub.add_parser("init", help="create a CA (refuses to overwrite one)")
    init.add_argument("directory", type=Path)
    issue_cmd = sub.add_parser("issue", help="issue a certificate from DIR's CA")
    issue_cmd.add_argument("directory", type=Path)
    issue_cmd.add_argument("name")
    issue_cmd.add_argument("--role", choices=ROLES, default="service")
    issue_cmd.add_argument(
        "--host", action="append", default=[], help="DNS name or IP it serves (repeatable)"
    )
    issue_cmd.add_argument("--days", type=int, default=LEAF_DAYS)
    args = parser.parse_args(argv)
    try:
        if args.action == "init":
            if (args.directory / "ca.pem").exists():
                print(
                    f"pollux-certs: {args.directory}/ca.pem exists; not replaced", file=sys.stderr
                )
                return 1
            made = create_ca(args.directory)
        else:
            ca = Issued(args.directory / "ca.pem", args.directory / "ca-key.pem")
            made = issue(
                ca, args.directory, args.name, args.role, hosts=tuple(args.host), days=args.days
            )
    except PkiError as error:
        print(f"pollux-certs: {error}", file=sys.stderr)
        return 1
    print(f"{made.cert}\n{made.key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
