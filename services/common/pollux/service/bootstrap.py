"""The first admin of a cluster: a token written straight into etcd.

Tokens are issued by admins through the scheduler (`pollux-cli admin token create`), which
leaves the first one to this command. It talks to etcd with a service certificate, as the
services do, so only someone holding one (the operator who set the cluster up) can run it:

    pollux-bootstrap-admin --etcd HOST:PORT --tls-ca ca.pem --tls-cert svc.pem --tls-key svc-key.pem
                           [--user admin] [--etcd-root /pollux/v1]

It prints the token text once; only its SHA-256 is stored. `pollux-up` calls `create_token`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pollux.service import auth
from pollux.service.keys import DEFAULT_ROOT
from pollux.service.store import Expect, Put, Store, StoreError
from pollux.service.tls import TlsError, TlsFiles
from pollux.v1 import types_pb2 as pb


async def create_token(
    store: Store, user: str, *, role: str = auth.ADMIN, tenant: str = "", description: str = ""
) -> str:
    """Store a new token for `user` and return its text."""
    made = auth.new_token()
    record = pb.ApiToken(
        id=made.id,
        user=user,
        role=role,
        tenant=tenant,
        secret_sha256=made.digest,
        description=description,
        created_by="bootstrap",
    )
    record.create_time.FromNanoseconds(time.time_ns())
    key = store.keys.token(made.id)
    await store.txn([Put(key, record.SerializeToString())], expect=[Expect(key, 0)])
    return made.text


async def _run(args: argparse.Namespace) -> str:
    tls = TlsFiles(args.tls_ca, args.tls_cert, args.tls_key)
    store = await Store.connect(args.etcd, args.etcd_root, tls=tls)
    try:
        return await create_token(
            store, args.user, description="first admin (pollux-bootstrap-admin)"
        )
    finally:
        await store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; prints the new admin token."""
    parser = argparse.ArgumentParser(
        prog="pollux-bootstrap-admin", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--etcd", required=True, help="etcd endpoint host:port")
    parser.add_argument("--etcd-root", default=DEFAULT_ROOT)
    parser.add_argument("--tls-ca", type=Path, required=True)
    parser.add_argument("--tls-cert", type=Path, required=True)
    parser.add_argument("--tls-key", type=Path, required=True)
    parser.add_argument("--user", default="admin")
    args = parser.parse_args(argv)
    try:
        print(asyncio.run(_run(args)))
    except (TlsError, StoreError) as error:
        print(f"pollux-bootstrap-admin: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
