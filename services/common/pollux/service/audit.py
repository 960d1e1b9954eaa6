"""The audit log: every mutation — who, what, when, from where — as a log line and a record.

`RpcObserver` hands every finished call of a method in `AuditLog.actions` to `record`: the
structlog line ``audit`` is written at once (synchronously, so a crash cannot lose it from the
log), and a bounded `pb.AuditRecord` is queued for etcd, where `pollux-cli admin audit` reads
it. A background task writes the queue in batches, so auditing adds no etcd round trip to a
call; if etcd is down, records wait in a bounded queue and the oldest are dropped (and counted)
past it. The records' owner is the scheduler leader's retention sweep (`prune_ops`), which
keeps the newest `max_records` of at most `max_age_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections import deque
from collections.abc import Callable

import prometheus_client
import structlog

from pollux.service.keys import Kind
from pollux.service.store import Delete, Put, Store, StoreError, cancel_and_wait
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger("pollux.audit")

AUDITED = prometheus_client.Counter(
    "pollux_audit_records_total", "Audit records by outcome of storing them.", ["stored"]
)
MAX_DETAIL = 256
QUEUE_LIMIT = 10_000
BATCH = 64


_SECRETS = re.compile(r"(pollux_[0-9a-f]{12}_|pjc\.)[^\s\"',;]+")
"""An API token's secret part (its id stays), or a job credential after its prefix."""


def redacted(text: str) -> str:
    """`text` with every token secret and job credential it holds cut to "…".

    A caller may put a secret where an id belongs (RevokeToken of a whole token, say): it is
    audited by its id, never written to a log or etcd in full.
    """
    return _SECRETS.sub(r"\1…", text)


class AuditLog:
    """Where one process's audited calls go (see the module doc).

    Args:
        store: The cluster state.
        actions: The RPC method names audited (the mutations).
        clock: Wall-clock seconds.
    """

    def __init__(
        self, store: Store, actions: frozenset[str], clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.actions = actions
        self.clock = clock
        self._queue: deque[pb.AuditRecord] = deque(maxlen=QUEUE_LIMIT)
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        """One flush at a time: `close` and the background task would write a batch twice."""

    def record(
        self,
        *,
        principal: str,
        role: str,
        action: str,
        target: str,
        peer: str,
        outcome: str,
        detail: str = "",
    ) -> None:
        """Log one audited call and queue its record (secrets a caller sent, redacted)."""
        target, detail = redacted(target), redacted(detail)
        log.info(
            "audit",
            principal=principal,
            role=role,
            action=action,
            target=target,
            peer=peer,
            outcome=outcome,
            detail=detail,
        )
        entry = pb.AuditRecord(
            principal=principal[:128],
            role=role,
            action=action,
            target=target[:128],
            peer=peer[:128],
            outcome=outcome,
            detail=detail[:MAX_DETAIL],
        )
        entry.time.FromNanoseconds(int(self.clock() * 1e9))
        if len(self._queue) == self._queue.maxlen:
            AUDITED.labels("dropped").inc()
        self._queue.append(entry)
        self._ready.set()
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: the log line stands
                self._task = asyncio.get_running_loop().create_task(self._flush_forever())

    async def _flush_forever(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                if not await self.flush():
                    await asyncio.sleep(1.0)

    async def flush(self) -> bool:
        """Write up to one batch of queued records; False if etcd refused (kept queued)."""
        async with self._flushing:
            return await self._flush_batch()

    async def _flush_batch(self) -> bool:
        batch = [self._queue[i] for i in range(min(BATCH, len(self._queue)))]
        if not batch:
            return True
        ops = [
            Put(
                self.store.keys.audit(r.time.ToNanoseconds(), secrets.token_hex(3)),
                r.SerializeToString(),
            )
            for r in batch
        ]
        try:
            await self.store.txn(ops)
        except StoreError as error:
            log.warning("audit_store_failed", error=str(error), queued=len(self._queue))
            return False
        for entry in batch:
            # A full queue may have evicted some of the batch meanwhile (maxlen): pop only
            # what is still at the front, never a newer record.
            if self._queue and self._queue[0] is entry:
                self._queue.popleft()
        AUDITED.labels("stored").inc(len(batch))
        return True

    async def close(self) -> None:
        """Write what is queued (best effort, briefly), then stop."""
        with contextlib.suppress(StoreError, TimeoutError):
            async with asyncio.timeout(2.0):
                while self._queue and await self.flush():
                    pass
        if self._task is not None:
            await cancel_and_wait(self._task)


async def prune_ops(
    store: Store, *, now_s: float, max_age_s: float, max_records: int
) -> list[Delete]:
    """The deletes that bring the audit records within their bounds (age, then count)."""
    prefix = store.keys.prefix(Kind.AUDIT)
    cutoff = store.keys.audit(int((now_s - max_age_s) * 1e9), "")
    ops = [Delete(prefix, end=cutoff)]
    excess = await store.count(prefix) - max_records
    if excess > 0:  # keys sort by time: drop the oldest `excess`
        oldest = await store.first_keys(prefix, excess)
        if oldest:
            ops.append(Delete(prefix, end=oldest[-1] + b"\0"))
    return ops
