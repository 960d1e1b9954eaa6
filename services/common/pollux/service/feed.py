"""Job changes fanned out from a replica's one jobs watch to every open stream.

A WatchJobs stream used to open an etcd watch of its own and decode every job of every user:
hundreds of streams meant hundreds of watches and copies of the cluster. Instead the replica's
mirror (pollux.service.mirror) publishes each job change it applies, decoded once, to a
`JobFeed`, and each stream subscribes to the part it may see: every job (admins), one owner's
jobs, or one job. A subscription's queue is bounded; a stream whose reader falls that far
behind is ended (`FeedOverflow`) rather than growing without bound, and its client watches
again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from pollux.v1 import types_pb2 as pb

MAX_QUEUED = 10_000
"""Changes a subscription holds before its stream is ended as too slow."""


@dataclass(frozen=True, slots=True)
class JobChange:
    """One change of one job record.

    Attributes:
        key: The job's etcd key.
        job: The record after the change (shared: never modify it); for a delete, what the
            index knew of it (id, name, owner, tenant, state, creation time).
        revision: The etcd revision of the change.
        deleted: Whether the record was deleted.
    """

    key: bytes
    job: pb.Job
    revision: int
    deleted: bool = False

    @property
    def owner(self) -> str:
        """The job's owner."""
        return self.job.owner


class FeedOverflow(Exception):
    """A subscription's reader fell `MAX_QUEUED` changes behind; changes were dropped."""


class Subscription:
    """The changes one stream receives, in the order they were applied.

    Args:
        limit: Changes held before the subscription overflows.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: deque[JobChange] = deque()
        self._ready = asyncio.Event()
        self.overflowed = False

    def offer(self, change: JobChange) -> None:
        """Queue a change (or note the overflow)."""
        if len(self._items) >= self._limit:
            self.overflowed = True
        else:
            self._items.append(change)
        self._ready.set()

    async def next(self) -> JobChange:
        """The next change, waiting for one.

        Raises:
            FeedOverflow: Changes were dropped: the stream must end.
        """
        while True:
            if self.overflowed:
                raise FeedOverflow(f"more than {self._limit} changes queued for a slow reader")
            if self._items:
                return self._items.popleft()
            self._ready.clear()
            await self._ready.wait()


class JobFeed:
    """Publishes job changes to subscriptions by owner, by key, or to all.

    Args:
        limit: Each subscription's queue bound.
    """

    def __init__(self, limit: int = MAX_QUEUED) -> None:
        self._limit = limit
        self._everything: set[Subscription] = set()
        self._by_owner: dict[str, set[Subscription]] = {}
        self._by_key: dict[bytes, set[Subscription]] = {}

    @property
    def subscriptions(self) -> int:
        """Open subscriptions."""
        return (
            len(self._everything)
            + sum(map(len, self._by_owner.values()))
            + sum(map(len, self._by_key.values()))
        )

    def publish(self, change: JobChange) -> None:
        """Deliver a change to every subscription it concerns."""
        for sub in self._everything:
            sub.offer(change)
        for sub in self._by_owner.get(change.owner, ()):
            sub.offer(change)
        for sub in self._by_key.get(change.key, ()):
            sub.offer(change)

    @contextlib.contextmanager
    def subscribe(
        self, *, owner: str | None = None, key: bytes | None = None
    ) -> Iterator[Subscription]:
        """A subscription for the block.

        It receives one job's changes (`key`), else one owner's (`owner`), else every change.
        """
        sub = Subscription(self._limit)
        group: set[Subscription]
        if key is not None:
            group = self._by_key.setdefault(key, set())
        elif owner is not None:
            group = self._by_owner.setdefault(owner, set())
        else:
            group = self._everything
        group.add(sub)
        try:
            yield sub
        finally:
            group.discard(sub)
            if not group:
                if key is not None and self._by_key.get(key) is group:
                    del self._by_key[key]
                elif key is None and owner is not None and self._by_owner.get(owner) is group:
                    del self._by_owner[owner]
