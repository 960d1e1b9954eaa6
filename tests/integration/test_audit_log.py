"""The audit log's queue on a real etcd: every record written once, however flushes overlap."""

from __future__ import annotations

import asyncio

from pollux.service.audit import AuditLog
from pollux.service.keys import Kind
from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb


async def test_close_beside_the_background_flush_writes_each_record_once(store: Store) -> None:
    # The background flush task starts with the first record; close() flushes too. Before the
    # flushes were serialised both wrote the same batch and the second pop raised IndexError
    # from an empty deque (a teardown error in the scheduler tests, about 1 run in 6).
    for attempt in range(20):
        audit = AuditLog(store, frozenset({"SubmitJob"}))
        for i in range(5):
            audit.record(
                principal="alice",
                role="user",
                action="SubmitJob",
                target=f"j-{attempt}-{i}",
                peer="ipv4:127.0.0.1:1",
                outcome="OK",
            )
        await asyncio.sleep(0)  # let the background task take its batch
        await asyncio.gather(audit.flush(), audit.close())
    entries, _ = await store.scan(store.keys.prefix(Kind.AUDIT), pb.AuditRecord)
    targets = sorted(e.value.target for e in entries)
    assert targets == sorted(f"j-{a}-{i}" for a in range(20) for i in range(5))
