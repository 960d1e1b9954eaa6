"""The cluster key job credentials are made with, kept in etcd and shared by the services.

Launchers hand each replica `auth.job_credential(key, job_id)`; agents check it with the same
key. The key is made once, by whichever service first needs it, in a transaction that only
creates it if absent, so concurrent first users agree on one key. It is one fixed-size value
for the cluster's life: nothing to clean up. Only the services read it (etcd itself demands
their client certificates).
"""

from __future__ import annotations

import secrets

from google.protobuf.wrappers_pb2 import BytesValue

from pollux.service.store import Conflict, Expect, Put, Store

KEY_BYTES = 32


class JobKeyring:
    """The job-credential key of one cluster, read (or made) once and then cached."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._key: bytes | None = None

    async def key(self) -> bytes:
        """The key; made on first use in the cluster."""
        if self._key is None:
            self._key = await self._load_or_create()
        return self._key

    async def _load_or_create(self) -> bytes:
        where = self._store.keys.job_credential_key()
        for _ in range(3):
            entry = await self._store.get(where, BytesValue)
            if entry is not None and len(entry.value.value) == KEY_BYTES:
                return bytes(entry.value.value)
            fresh = BytesValue(value=secrets.token_bytes(KEY_BYTES))
            expected = entry.mod_revision if entry is not None else 0
            try:
                await self._store.txn(
                    [Put(where, fresh.SerializeToString())], expect=[Expect(where, expected)]
                )
                return bytes(fresh.value)
            except Conflict:
                continue  # another service made it first: read theirs
        raise RuntimeError("could not agree on the job-credential key after 3 tries")
