"""The cluster key job credentials are made with, and whether a credential's job still lives.

Launchers hand each replica `auth.job_credential(key, job_id)`; agents check it with the same
key. The key is made once, by whichever service first needs it, in a transaction that only
creates it if absent, so concurrent first users agree on one key. It is one fixed-size value
for the cluster's life: nothing to clean up. Only the services read it (etcd itself demands
their client certificates).

A credential is an HMAC of its job's id, valid forever by itself; `JobLiveness` makes it die
with its job: an agent refuses the credential of a job that has ended (SUCCEEDED, FAILED,
CANCELLED) or was deleted, reading the job's state at most every `LIVE_CACHE_S`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.wrappers_pb2 import BytesValue

from pollux.service.store import Conflict, Expect, Put, Store
from pollux.v1 import types_pb2 as pb

KEY_BYTES = 32
LIVE_CACHE_S = 2.0
"""How long an agent trusts that a job is live (as long as a replica caches a token)."""
MAX_REMEMBERED = 10_000
"""Jobs whose state is remembered before the memory is cleared."""
V = TypeVar("V")
_ENDED = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED})


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


class JobLiveness:
    """Whether a job credential's job still lives (`auth.JobEnded`), cached briefly.

    An ended job stays ended, so that answer is kept; a live one is asked again after
    `LIVE_CACHE_S`.

    Args:
        store: The cluster state.
        clock: Monotonic seconds.
    """

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._live: dict[str, float] = {}
        self._ended: dict[str, str] = {}

    async def ended(self, job_id: str) -> str | None:
        """Why the job's credential no longer holds ("ended FAILED", "was deleted"), or None."""
        if job_id in self._ended:
            return self._ended[job_id]
        now = self._clock()
        checked = self._live.get(job_id)
        if checked is not None and now - checked < LIVE_CACHE_S:
            return None
        entry = await self._store.get_job(job_id)
        if entry is not None and entry.value.state not in _ENDED:
            self._remember(self._live, job_id, now)
            return None
        why = (
            "was deleted"
            if entry is None
            else f"ended {pb.JobState.Name(entry.value.state).removeprefix('JOB_STATE_')}"
        )
        self._live.pop(job_id, None)
        self._remember(self._ended, job_id, why)
        return why

    @staticmethod
    def _remember(memory: dict[str, V], job_id: str, value: V) -> None:
        if len(memory) >= MAX_REMEMBERED and job_id not in memory:
            memory.clear()
        memory[job_id] = value
