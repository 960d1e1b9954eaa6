"""The generic etcd key-value API: typed reads, checked and fenced transactions, watches, leases.

Values are serialized protobuf messages. Reads return the etcd revisions they reflect;
conditional writes compare mod revisions (optimistic concurrency), and a write made on behalf
of the scheduler leader carries a `Fence`: the transaction also compares the create revision
of the leader's election key, so a deposed leader's write fails inside etcd, atomically
(docs/architecture.md §3). Every write is checked against `MAX_VALUE_BYTES` and
`MAX_TXN_BYTES` before it is sent. Nothing here knows Pollux's key layout (`pollux.service.store`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

import aetcd
import aetcd.exceptions
import structlog
from aetcd import rpc
from google.protobuf.message import DecodeError, Message

from pollux.service.etcd import client as etcd_client
from pollux.service.etcd.errors import (
    NOSPACE_MESSAGE,
    Conflict,
    CorruptValue,
    FenceLost,
    StoreError,
    StoreFull,
    StoreUnavailable,
    ValueTooLarge,
)
from pollux.service.tls import TlsFiles

M = TypeVar("M", bound=Message)
MAX_TXN_BYTES = 1024 * 1024
"""Largest transaction sent, serialized: etcd refuses one over 1.5 MiB (`--max-request-bytes`)
only after it travelled; this leaves a third of that as headroom (the scheduler chunks to it)."""
MAX_VALUE_BYTES = 512 * 1024
"""Largest single value written. Every stored message is bounded well below it by construction;
a value past it is a bug or unchecked input, refused with `ValueTooLarge`."""
_MAINTENANCE = frozenset({"Status", "Alarm", "Defragment"})
"""etcd RPCs served by the Maintenance service (the rest: KV and Lease)."""
LARGE_SCAN = 256
"""Scans with more values than this are decoded off the event loop."""
log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of leadership to attach to writes.

    Attributes:
        key: The leader's election key.
        revision: Its create revision when leadership was won.
    """

    key: bytes
    revision: int


@dataclass(frozen=True, slots=True)
class Entry(Generic[M]):
    """A stored message with the revisions it was read at.

    Attributes:
        value: The message.
        mod_revision: etcd revision of its last write (pass back as `expected` to update it).
        create_revision: etcd revision that created it.
        lease: Lease it is attached to (0 for none).
        key: Its etcd key (empty where the reader did not need it).
    """

    value: M
    mod_revision: int
    create_revision: int
    lease: int = 0
    key: bytes = b""


@dataclass(frozen=True, slots=True)
class Put:
    """A write of a transaction."""

    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    """A delete of a transaction (a key, every key under a prefix, or the keys [key, end))."""

    key: bytes
    prefix: bool = False
    end: bytes = b""


@dataclass(frozen=True, slots=True)
class Expect:
    """A precondition of a transaction: the key's mod revision (0: the key must not exist)."""

    key: bytes
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Exists:
    """A precondition of a transaction: the key exists, whatever its revision."""

    key: bytes


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change under a watched prefix.

    Attributes:
        key: The key.
        value: The new value, or None when the key was deleted.
        revision: The change's mod revision.
    """

    key: bytes
    value: bytes | None
    revision: int


async def _cancelling(stream: Any) -> AsyncIterator[Any]:
    """The events of an aetcd watch, cancelling the watch in etcd when iteration ends."""
    try:
        async for event in stream:
            yield event
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(stream.cancel())


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel a task and wait for it, re-cancelling if a cancel was swallowed.

    aetcd creates watches inside `asyncio.wait_for`, which on Python 3.11 can swallow a
    cancellation that arrives at that moment (cpython#86296); one `cancel()` is not enough.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.2)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with `prefix` (etcd's range_end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _compare(e: Expect | Exists) -> Any:
    if isinstance(e, Exists):
        return rpc.Compare(
            key=e.key, target=rpc.Compare.VERSION, result=rpc.Compare.GREATER, version=0
        )
    return rpc.Compare(
        key=e.key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=e.mod_revision
    )


def _holds(e: Expect | Exists, kvs: Any) -> bool:
    """Whether a precondition holds of the key's read (its failure branch's range reply)."""
    if isinstance(e, Exists):
        return bool(kvs)
    return (kvs[0].mod_revision if kvs else 0) == e.mod_revision


def _op(op: Put | Delete) -> Any:
    if isinstance(op, Put):
        return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key, value=op.value, lease=op.lease))
    end = prefix_end(op.key) if op.prefix else op.end
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key, range_end=end))


def _txn_request(
    ops: Sequence[Put | Delete], expect: Sequence[Expect | Exists], fence: Fence | None
) -> Any:
    """The TxnRequest of `EtcdKV.txn`: ops if every expect (and the fence) holds, else reads."""
    compare = [_compare(e) for e in expect]
    failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=e.key)) for e in expect]
    if fence is not None:
        compare.append(
            rpc.Compare(
                key=fence.key,
                target=rpc.Compare.CREATE,
                result=rpc.Compare.EQUAL,
                create_revision=fence.revision,
            )
        )
        failure.append(rpc.RequestOp(request_range=rpc.RangeRequest(key=fence.key)))
    return rpc.TxnRequest(compare=compare, success=[_op(op) for op in ops], failure=failure)


def txn_bytes(
    ops: Sequence[Put | Delete], expect: Sequence[Expect | Exists] = (), fence: Fence | None = None
) -> int:
    """Serialized size of the transaction `EtcdKV.txn` sends for these arguments.

    A TxnRequest holds only repeated fields, so sizes add up exactly: a transaction of several
    groups of ops is the sum of the groups' sizes plus the fence's (how the scheduler chunks).
    """
    return int(_txn_request(ops, expect, fence).ByteSize())


def _check_size(ops: Sequence[Put | Delete], request: Any) -> None:
    """Refuse a transaction with a value over `MAX_VALUE_BYTES` or a size over `MAX_TXN_BYTES`.

    Raises:
        ValueTooLarge: Naming the key and the limit; nothing has been sent.
    """
    puts = [op for op in ops if isinstance(op, Put)]
    for op in puts:
        if len(op.value) > MAX_VALUE_BYTES:
            raise ValueTooLarge("the value", op.key, len(op.value), MAX_VALUE_BYTES)
    size = int(request.ByteSize())
    if size > MAX_TXN_BYTES:
        largest = max(puts, key=lambda op: len(op.value)).key if puts else b"?"
        what = f"a transaction of {len(ops)} writes (largest value at the key below)"
        raise ValueTooLarge(what, largest, size, MAX_TXN_BYTES)


def decode(cls: type[M], data: bytes, key: bytes) -> M:
    """Parse a stored value, naming the key if it is corrupt."""
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise CorruptValue(f"{key.decode()}: not a {cls.__name__}: {error}") from error
    return message


def _entry(kv: Any, cls: type[M]) -> Entry[M]:
    return Entry(
        value=decode(cls, kv.value, kv.key),
        mod_revision=int(kv.mod_revision),
        create_revision=int(kv.create_revision),
        lease=int(kv.lease),
        key=bytes(kv.key),
    )


def _entries(kvs: Sequence[Any], cls: type[M]) -> list[Entry[M]]:
    return [_entry(kv, cls) for kv in kvs]


class EtcdKV:
    """One etcd connection's key-value, watch and lease calls.

    Args:
        client: A connected aetcd client.
        owned: Whether `close` closes the client (true when made by `connect`).
        tls: The TLS files the client was dialled with (None: plaintext).
    """

    def __init__(self, client: Any, *, owned: bool = False, tls: TlsFiles | None = None) -> None:
        self._client = client
        self._owned = owned
        self.tls = tls
        """The TLS files the connection was made with (None: plaintext); services serve
        their own ports with the same identity."""
        self._written: dict[bytes, int] = {}

    @classmethod
    async def connect(
        cls, endpoint: str, *, timeout_s: float = 5.0, tls: TlsFiles | None = None
    ) -> Self:
        """Connect to etcd (`etcd.client.dial`) and return an instance that owns the connection."""
        client = await etcd_client.dial(endpoint, timeout_s=timeout_s, tls=tls)
        return cls(client, owned=True, tls=tls)

    async def close(self) -> None:
        """Close the connection if this instance opened it; never hangs."""
        if self._owned:
            await etcd_client.close(self._client)

    async def reload_tls(self) -> bool:
        """Re-dial etcd if the TLS files changed since the connection was made (True if so)."""
        return await etcd_client.redial_if_renewed(self._client, self.tls)

    def track_writes(self, prefix: bytes) -> None:
        """Remember the revision of the last write made through this instance under `prefix`."""
        self._written.setdefault(prefix, 0)

    def written(self, prefix: bytes) -> int:
        """Revision of the last write under a tracked prefix made through this instance."""
        return self._written[prefix]

    def _stub(self, method: str) -> Any:
        if method.startswith("Lease"):
            return self._client.leasestub
        if method in _MAINTENANCE:
            return self._client.maintenancestub
        return self._client.kvstub

    async def call(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """One etcd RPC by name (KV, Lease or Maintenance), its failures as `StoreError`s."""
        stub = self._stub(method)
        if stub is None:
            await self._client.connect()
            stub = self._stub(method)
        try:
            return await getattr(stub, method)(
                request,
                timeout=timeout or self._client._timeout,
                metadata=self._client.metadata,
            )
        except rpc.AioRpcError as error:
            if error.code() in (rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED):
                raise StoreUnavailable(f"etcd {method}: {error.details()}") from error
            if error.code() == rpc.StatusCode.RESOURCE_EXHAUSTED and "space exceeded" in str(
                error.details()
            ):
                raise StoreFull(NOSPACE_MESSAGE) from error
            raise StoreError(f"etcd {method}: {error.code().name}: {error.details()}") from error

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, key: bytes, cls: type[M]) -> Entry[M] | None:
        """The message at a key, or None."""
        response = await self.call("Range", rpc.RangeRequest(key=key))
        return _entry(response.kvs[0], cls) if response.kvs else None

    async def get_bytes(self, key: bytes) -> bytes | None:
        """The raw value at a key (an index that holds an id, not a message), or None."""
        response = await self.call("Range", rpc.RangeRequest(key=key))
        return bytes(response.kvs[0].value) if response.kvs else None

    async def scan(
        self, prefix: bytes, cls: type[M], *, revision: int = 0
    ) -> tuple[list[Entry[M]], int]:
        """Every message under a prefix in key order, and the revision they reflect.

        Args:
            prefix: Key prefix.
            cls: Message type of the values.
            revision: Read as of this etcd revision (0: the latest), so several prefixes can be
                read as one consistent snapshot.
        """
        response = await self.call(
            "Range", rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), revision=revision)
        )
        return await self._decode(response.kvs, cls), int(response.header.revision)

    async def _decode(self, kvs: Sequence[Any], cls: type[M]) -> list[Entry[M]]:
        if len(kvs) > LARGE_SCAN:
            # Decoding thousands of values would stall every other request on this loop.
            return await asyncio.to_thread(_entries, list(kvs), cls)
        return _entries(kvs, cls)

    async def scan_pages(
        self, prefix: bytes, cls: type[M], *, page: int = 1000
    ) -> AsyncIterator[tuple[list[Entry[M]], int]]:
        """Every message under a prefix, `page` at a time, all at one revision.

        For prefixes too large to hold twice (the raw reply and the decoded messages): the
        caller keeps what it needs of each page. Every page reflects the first page's revision.
        """
        end = prefix_end(prefix)
        start, revision = prefix, 0
        while True:
            response = await self.call(
                "Range", rpc.RangeRequest(key=start, range_end=end, revision=revision, limit=page)
            )
            revision = revision or int(response.header.revision)
            kvs = list(response.kvs)
            yield await self._decode(kvs, cls), revision
            if not response.more or not kvs:
                return
            start = bytes(kvs[-1].key) + b"\0"

    async def newest(self, prefix: bytes, cls: type[M], *, limit: int) -> list[Entry[M]]:
        """The last `limit` messages under a prefix in key order, last first (decisions, audit)."""
        response = await self.call(
            "Range",
            rpc.RangeRequest(
                key=prefix,
                range_end=prefix_end(prefix),
                limit=limit,
                sort_order=rpc.RangeRequest.DESCEND,
                sort_target=rpc.RangeRequest.KEY,
            ),
        )
        return _entries(response.kvs, cls)

    async def first_keys(self, prefix: bytes, limit: int) -> list[bytes]:
        """The first `limit` keys under a prefix in key order (keys only)."""
        response = await self.call(
            "Range",
            rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), limit=limit, keys_only=True),
        )
        return [bytes(kv.key) for kv in response.kvs]

    async def list_keys(self, prefix: bytes) -> list[bytes]:
        """Keys under a prefix (no values)."""
        response = await self.call(
            "Range", rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), keys_only=True)
        )
        return [bytes(kv.key) for kv in response.kvs]

    async def count(self, prefix: bytes) -> int:
        """How many keys are under a prefix (etcd counts; nothing is transferred)."""
        response = await self.call(
            "Range", rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), count_only=True)
        )
        return int(response.count)

    async def get_many(self, keys: Sequence[bytes], cls: type[M]) -> list[Entry[M] | None]:
        """The messages at `keys` (None where a key is gone), read in transactions of 100."""
        found: list[Entry[M] | None] = []
        for start in range(0, len(keys), 100):
            reads = [
                rpc.RequestOp(request_range=rpc.RangeRequest(key=key))
                for key in keys[start : start + 100]
            ]
            response = await self.call("Txn", rpc.TxnRequest(success=reads))
            for reply in response.responses:
                kvs = reply.response_range.kvs
                found.append(_entry(kvs[0], cls) if kvs else None)
        return found

    async def newest_change(self, prefix: bytes, *, after: int) -> int:
        """The highest mod revision of a key under `prefix` written after revision `after`, or 0.

        A cheap freshness check for a mirror at revision `after` (keys only, one key back):
        0 means no key under the prefix changed since. Deletes leave no key, so they do not
        show; a mirror that misses one only plans a write that then fails its compare.
        """
        response = await self.call(
            "Range",
            rpc.RangeRequest(
                key=prefix,
                range_end=prefix_end(prefix),
                keys_only=True,
                limit=1,
                min_mod_revision=after + 1,
                sort_order=rpc.RangeRequest.DESCEND,
                sort_target=rpc.RangeRequest.MOD,
            ),
        )
        return int(response.kvs[0].mod_revision) if response.kvs else 0

    # -- writes and watches --------------------------------------------------------------------

    async def txn(
        self,
        ops: Sequence[Put | Delete],
        *,
        expect: Sequence[Expect | Exists] = (),
        fence: Fence | None = None,
    ) -> int:
        """Apply `ops` atomically if every `expect` holds and, with a fence, leadership does.

        Returns:
            The revision of the write.

        Raises:
            FenceLost: The fence's election key is gone or was re-created (nothing written).
            Conflict: An `expect` failed (nothing written), naming every key that failed.
            ValueTooLarge: A value or the whole request is over its bound (nothing sent).
        """
        request = _txn_request(ops, expect, fence)
        _check_size(ops, request)
        response = await self.call("Txn", request)
        if response.succeeded:
            revision = int(response.header.revision)
            for prefix, last in self._written.items():
                if any(op.key.startswith(prefix) for op in ops):
                    self._written[prefix] = max(last, revision)
            return revision
        ranges = [r.response_range for r in response.responses]
        if fence is not None:
            kvs = ranges[-1].kvs
            if not kvs or kvs[0].create_revision != fence.revision:
                raise FenceLost()
        moved = [e.key for e, r in zip(expect, ranges, strict=False) if not _holds(e, r.kvs)]
        if moved:
            raise Conflict(moved[0], moved)
        raise Conflict(expect[0].key if expect else b"?")

    async def put(self, key: bytes, message: Message, *, lease: int = 0) -> int:
        """Unconditional write; returns its revision."""
        return await self.txn([Put(key, message.SerializeToString(), lease)])

    async def watch(self, prefix: bytes, *, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Changes under a prefix from `start_revision` (inclusive), forever.

        A broken watch stream is re-established from the last revision seen, so no change is
        missed or repeated; a compacted start revision raises `StoreError` (re-list and retry).
        """
        # Events of one transaction share a revision, so progress is (revision, keys seen at
        # it): a re-established watch restarts at the last revision and skips what was seen.
        last_revision = start_revision - 1
        seen: set[bytes] = set()
        while True:
            try:
                stream = await self._client.watch_prefix(
                    prefix, start_revision=max(last_revision, start_revision)
                )
                async for event in _cancelling(stream):
                    kv = event.kv
                    key, revision = bytes(kv.key), int(kv.mod_revision)
                    if revision < last_revision or (revision == last_revision and key in seen):
                        continue
                    if revision > last_revision:
                        last_revision, seen = revision, set()
                    seen.add(key)
                    deleted = event.kind == aetcd.rtypes.EventKind.DELETE
                    yield WatchEvent(key, None if deleted else bytes(kv.value), revision)
            except aetcd.exceptions.RevisionCompactedError as error:
                raise StoreError(f"watch of {prefix.decode()}: {error}") from error
            except (aetcd.exceptions.ClientError, rpc.AioRpcError) as error:
                log.warning("etcd_watch_broken", prefix=prefix.decode(), error=str(error))
                await asyncio.sleep(0.5)

    # -- leases --------------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds; returns its id."""
        response = await self.call("LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_s))
        return int(response.ID)

    async def keep_alive(self, lease_id: int) -> int:
        """Refresh a lease once; returns its remaining TTL in seconds (≤ 0: it has expired)."""
        try:
            reply = await self._client.refresh_lease(lease_id)
        except aetcd.exceptions.ClientError as error:
            raise StoreUnavailable(f"lease keep-alive: {error}") from error
        return int(reply.TTL) if reply is not None else 0

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease, deleting every key attached to it."""
        await self.call("LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id))
