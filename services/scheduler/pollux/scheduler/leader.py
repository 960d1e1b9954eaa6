"""Leader election and fencing for scheduler replicas, after etcd's `concurrency` package.

A `Session` owns one lease and keeps it alive; its `lost` event fires when the lease can no
longer be confirmed (expired, revoked, or etcd unreachable for longer than the TTL allows).
`Election.campaign()` puts ``<root>/leader/<lease-hex>`` with the lease (create-if-absent) and
waits until no key with a lower create revision remains: the lowest create revision leads.
It returns a `Fence` — the key and its create revision — that every leader write carries, so
etcd itself rejects the write of a replica that is no longer leader (style.md R8).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from pollux.service.store import (
    Delete,
    Expect,
    Fence,
    Put,
    Store,
    StoreError,
    cancel_and_wait,
)
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)


class Session:
    """A lease kept alive in the background.

    Args:
        store: The store.
        ttl_s: Lease time-to-live; a dead process's leadership ends at most this long after.
    """

    def __init__(self, store: Store, ttl_s: int) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.lease_id = 0
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Grant the lease and start keeping it alive."""
        self.lease_id = await self.store.grant_lease(self.ttl_s)
        self._task = asyncio.create_task(self._keep_alive(), name="lease-keepalive")

    async def _keep_alive(self) -> None:
        # Refresh every third of the TTL. The lease is treated as lost as soon as a refresh
        # reports it expired, or when no refresh succeeded for a whole TTL: after that etcd may
        # have expired it and another replica may lead, so this one must stop writing (the
        # fence would reject the writes anyway; stopping early keeps logs honest).
        last_ok = time.monotonic()
        while not self.lost.is_set():
            try:
                remaining = await self.store.keep_alive(self.lease_id)
                if remaining <= 0:
                    log.warning("lease_expired", lease=f"{self.lease_id:x}")
                    self.lost.set()
                    return
                last_ok = time.monotonic()
            except (StoreError, OSError) as error:
                log.warning("lease_keepalive_failed", error=str(error))
                if time.monotonic() - last_ok >= self.ttl_s:
                    self.lost.set()
                    return
            await asyncio.sleep(self.ttl_s / 3)

    async def close(self, *, revoke: bool = True) -> None:
        """Stop the keep-alive and (by default) revoke the lease, ending leadership now."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.lost.set()
        if revoke and self.lease_id:
            with contextlib.suppress(StoreError, OSError):
                await self.store.revoke_lease(self.lease_id)


class Election:
    """Campaign for scheduler leadership with one session.

    Args:
        session: The session whose lease backs the election key.
        member: This replica's id and address (the key's value, so others can find the leader).
    """

    def __init__(self, session: Session, member: pb.Member) -> None:
        self.session = session
        self.member = member
        self.store = session.store
        self.key = self.store.keys.leader(session.lease_id)

    async def campaign(self) -> Fence:
        """Wait until this replica leads; returns the fence for its writes.

        Raises:
            asyncio.CancelledError: If cancelled, or `LeadershipLost` if the session ends first.
        """
        store = self.store
        value = self.member.SerializeToString()
        with contextlib.suppress(StoreError):  # already campaigning: the key exists
            await store.txn(
                [Put(self.key, value, self.session.lease_id)], expect=[Expect(self.key, 0)]
            )
        while True:
            if self.session.lost.is_set():
                raise LeadershipLost()
            entries, revision = await store.scan(store.keys.prefix("leader"), pb.Member)
            mine = next((e for e in entries if e.lease == self.session.lease_id), None)
            if mine is None:
                raise LeadershipLost()
            lower = [e for e in entries if e.create_revision < mine.create_revision]
            if not lower:
                return Fence(self.key, mine.create_revision)
            predecessor = max(lower, key=lambda e: e.create_revision)
            await self._wait_deleted(predecessor.value.id, predecessor.create_revision, revision)

    async def _wait_deleted(self, member_id: str, create_revision: int, revision: int) -> None:
        """Wait until the key with `create_revision` is gone (or the session is lost)."""
        store = self.store
        prefix = store.keys.prefix("leader")

        async def gone() -> None:
            async for event in store.watch(prefix, start_revision=revision + 1):
                if event.value is None:
                    return  # some key went away: re-check who is lowest

        watcher = asyncio.create_task(gone())
        lost = asyncio.create_task(self.session.lost.wait())
        log.info("election_waiting", behind=member_id, behind_revision=create_revision)
        try:
            await asyncio.wait({watcher, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watcher, lost):
                await cancel_and_wait(task)

    async def resign(self) -> None:
        """Give up leadership (or the candidacy) by deleting the key."""
        with contextlib.suppress(StoreError, OSError):
            await self.store.txn([Delete(self.key)])


async def current_leader(store: Store) -> pb.Member | None:
    """The leading replica's member record, or None when nobody campaigns."""
    entries, _ = await store.scan(store.keys.prefix("leader"), pb.Member)
    if not entries:
        return None
    return min(entries, key=lambda e: e.create_revision).value


class LeadershipLost(Exception):
    """The session ended: this replica is not (or no longer) the leader."""
