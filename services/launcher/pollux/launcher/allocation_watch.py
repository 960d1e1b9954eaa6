"""The cluster's allocations as this launcher last saw them: listed once, then watched.

Allocations are listed at one revision and watched from the next, so no change is missed; a
failed or compacted watch re-lists. Every change calls `changed`, which wakes the reconcile
loop; the loop also runs on a timer, so it heals whatever an event could not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from pollux.service.keys import Kind
from pollux.service.store import Store, StoreError, WatchEvent, decode
from pollux.v1 import types_pb2 as pb


@dataclass(frozen=True, slots=True)
class Current:
    """A job's allocation as last seen, with the mod revision launches are conditioned on."""

    allocation: pb.Allocation
    mod_revision: int


class AllocationWatch:
    """Every job's current allocation, kept by a watch.

    Args:
        store: The cluster state.
        changed: Called after the listing and after every change.
        node_name: This node (for the log lines).
    """

    def __init__(self, store: Store, changed: Callable[[], None], *, node_name: str) -> None:
        self.store = store
        self._changed = changed
        self.current: dict[str, Current] = {}
        """Allocations by job id."""
        self._log = structlog.get_logger(__name__).bind(node_id=node_name)

    async def run(self) -> None:
        """List and watch until cancelled; failures re-list after a second."""
        prefix = self.store.keys.prefix(Kind.ALLOCATIONS)
        while True:
            try:
                listed, revision = await self.store.list_allocations()
                self.current = {
                    job_id: Current(entry.value, entry.mod_revision)
                    for job_id, entry in listed.items()
                }
                self._changed()
                async for event in self.store.watch(prefix, start_revision=revision + 1):
                    self.apply(event)
                    self._changed()
            except StoreError as error:  # unreachable, or the revision was compacted: re-list
                self._log.warning("allocation_watch_failed", error=str(error))
                await asyncio.sleep(1.0)
            except Exception:  # a dead watch would freeze the node: log, re-list, go on
                self._log.exception("allocation_watch_crashed")
                await asyncio.sleep(1.0)

    def apply(self, event: WatchEvent) -> None:
        """Apply one watched change (a corrupt value is logged and skipped)."""
        job_id = self.store.keys.name_of(event.key, Kind.ALLOCATIONS)
        if event.value is None:
            self.current.pop(job_id, None)
            return
        try:
            allocation = decode(pb.Allocation, event.value, event.key)
        except StoreError as error:
            self._log.error("allocation_corrupt", job_id=job_id, error=str(error))
            return
        self.current[job_id] = Current(allocation, event.revision)
