"""Leader election and fencing for scheduler replicas, after etcd's `concurrency` package.

The replica's `LeaseSession` (pollux.service.session: one lease kept alive and one rule for when
it is lost, shared with agent and node registration) backs the election key. A standby never
trusts its watch alone: it re-reads the election at least once per lease ttl.
`Election.campaign()` puts ``<root>/leader/<lease-hex>`` with the lease (create-if-absent) and
waits until no key with a lower create revision remains: the lowest create revision leads. It
returns a `Fence` — the key and its create revision — that every leader write carries, so etcd
itself rejects the write of a replica that is no longer leader.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from pollux.service.keys import Kind
from pollux.service.session import LeaseSession
from pollux.service.store import Expect, Fence, Put, Store, StoreError, cancel_and_wait
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)


class Election:
    """Campaign for scheduler leadership with one session.

    Args:
        session: The session whose lease backs the election key.
        member: This replica's id and address (the key's value, so others can find the leader).
    """

    def __init__(self, session: LeaseSession, member: pb.Member) -> None:
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
            entries, revision = await store.scan(store.keys.prefix(Kind.LEADER), pb.Member)
            mine = next((e for e in entries if e.lease == self.session.lease_id), None)
            if mine is None:
                raise LeadershipLost()
            lower = [e for e in entries if e.create_revision < mine.create_revision]
            if not lower:
                return Fence(self.key, mine.create_revision)
            predecessor = max(lower, key=lambda e: e.create_revision)
            await self._wait_deleted(predecessor.value.id, predecessor.create_revision, revision)

    async def _wait_deleted(self, member_id: str, create_revision: int, revision: int) -> None:
        """Wait until a leader key is deleted, the session is lost, or one ttl has passed.

        The watch is only a hint: after an etcd restart a watch can end up attached to another
        request and never deliver the delete (aetcd pairs create replies with whichever create
        is pending). So a standby re-reads the election from etcd at least once per lease ttl
        with a new watch, whatever its watch says; a dead leader's key is gone within a ttl,
        so a standby takes over within about two.
        """
        store = self.store
        prefix = store.keys.prefix(Kind.LEADER)

        async def gone() -> None:
            async for event in store.watch(prefix, start_revision=revision + 1):
                if event.value is None:
                    return  # some key went away: re-check who is lowest

        watcher = asyncio.create_task(gone())
        lost = asyncio.create_task(self.session.lost.wait())
        log.info("election_waiting", behind=member_id, behind_revision=create_revision)
        try:
            await asyncio.wait(
                {watcher, lost}, timeout=self.session.ttl_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (watcher, lost):
                await cancel_and_wait(task)


async def current_leader(store: Store) -> pb.Member | None:
    """The leading replica's member record, or None when nobody campaigns."""
    entries, _ = await store.scan(store.keys.prefix(Kind.LEADER), pb.Member)
    if not entries:
        return None
    return min(entries, key=lambda e: e.create_revision).value


class LeadershipLost(Exception):
    """The session ended: this replica is not (or no longer) the leader."""
