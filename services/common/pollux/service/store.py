"""Typed access to the cluster state in etcd: the only module that imports `aetcd`.

Values are serialized `pollux.v1` messages. Reads return the etcd revisions they reflect;
conditional writes compare mod revisions (optimistic concurrency), and a write made
on behalf of the scheduler leader carries a `Fence`: the transaction also compares the
create revision of the leader's election key, so a deposed leader's write fails inside etcd,
atomically, whatever the process believes (docs/architecture.md §3, etcd's `Mutex.IsOwner`).
Every write is checked against `MAX_VALUE_BYTES` and `MAX_TXN_BYTES` before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aetcd
import aetcd.exceptions
import structlog
from aetcd import rpc
from google.protobuf.message import DecodeError, Message

from pollux.service.etcd_target import aetcd_address, split_endpoints
from pollux.service.keys import DEFAULT_ROOT, Keys, Kind
from pollux.service.tls import TlsFiles
from pollux.v1 import types_pb2 as pb

M = TypeVar("M", bound=Message)
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest etcd response the client receives (a range of thousands of jobs)."""
MAX_TXN_BYTES = 1024 * 1024
"""Largest transaction the store sends, serialized. etcd refuses a request over 1.5 MiB (its
`--max-request-bytes` default) only after the whole request travelled; this bound is checked
before sending and leaves a third of etcd's limit as headroom. The scheduler chunks a round's
commit to it, so every legitimate transaction fits."""
MAX_VALUE_BYTES = 512 * 1024
"""Largest single value the store writes. Every stored message is bounded well below it by
construction (a job spec by 64 KiB, a job's history by count and reason length, a profile by
rows, replicas and shapes, a decision record by bytes); a value past it is a bug or unchecked
input, refused with `ValueTooLarge` instead of growing etcd's database and every scan."""
_MAINTENANCE = frozenset({"Status", "Alarm", "Defragment"})
"""etcd RPCs served by the Maintenance service (the rest: KV and Lease)."""
CLOSE_TIMEOUT_S = 1.0
"""How long closing waits for aetcd's own shutdown before closing the channel itself."""
LARGE_SCAN = 256
"""Scans with more values than this are decoded off the event loop."""
log = structlog.get_logger(__name__)


class StoreError(Exception):
    """Base of every store failure."""


class StoreUnavailable(StoreError):
    """etcd could not be reached or did not answer in time; the operation may be retried."""


class StoreFull(StoreError):
    """etcd is out of space (its NOSPACE alarm is raised): it serves reads and deletes only.

    Nothing can be written — no job submitted, no lease granted, so no scheduler can start
    leading — until space is freed and the alarm disarmed (`pollux.service.maintenance` does
    both once deletes or compaction made room).
    """


NOSPACE_MESSAGE = (
    "etcd is out of space (NOSPACE alarm): the cluster accepts no writes until space is freed; "
    "the schedulers compact, defragment and disarm the alarm once finished jobs are removed "
    "(retention, DeleteJob) or etcd's --quota-backend-bytes is raised"
)
"""The one line every service says about a full etcd (errors, logs, ClusterStatus)."""


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One etcd member's storage, from its Status call.

    Attributes:
        member_id: The member's id.
        revision: The cluster's current revision.
        db_size: Bytes of the member's database file.
        db_in_use: Bytes of it in use (the rest is reclaimed by defragmenting).
        alarms: Active alarm names ("NOSPACE", "CORRUPT").
    """

    member_id: int
    revision: int
    db_size: int
    db_in_use: int
    alarms: tuple[str, ...]


class Conflict(StoreError):
    """An optimistic-concurrency check failed: the entry changed since it was read.

    Attributes:
        key: The (first) key whose revision no longer matched.
        keys: Every key whose revision no longer matched.
    """

    def __init__(self, key: bytes, keys: Sequence[bytes] = ()) -> None:
        super().__init__(f"{key.decode()} changed concurrently; re-read and retry")
        self.key = key
        self.keys = tuple(keys) or (key,)


class FenceLost(StoreError):
    """A fenced write was rejected because the writer no longer holds leadership."""

    def __init__(self) -> None:
        super().__init__("leadership lost: the election key is gone or was re-created")


class CorruptValue(StoreError):
    """A stored value does not parse as the expected message."""


class ValueTooLarge(StoreError):
    """A write was refused before it was sent: a value or the whole transaction is too large.

    Attributes:
        key: The oversized value's key, or the largest value's key of an oversized transaction.
        size: Bytes of the value or of the serialized transaction.
        limit: The bound it exceeds (`MAX_VALUE_BYTES` or `MAX_TXN_BYTES`).
    """

    def __init__(self, what: str, key: bytes, size: int, limit: int) -> None:
        super().__init__(
            f"{what} is {size} bytes, over the store's limit of {limit} bytes "
            f"({key.decode(errors='replace')}); nothing was written"
        )
        self.key = key
        self.size = size
        self.limit = limit


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


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster state at one etcd revision (what a scheduling round reads).

    Attributes:
        revision: The etcd revision every part reflects.
        jobs: Job records by id, with their mod revisions for the round's conditional writes.
        nodes: Registered nodes by name.
        agents: Registered agents.
        models: Latest job models by job id.
        replicas: Replica statuses of every job.
        tenants: The tenants an admin defined (their guarantees, weights and caps).
    """

    revision: int
    jobs: dict[str, Entry[pb.Job]]
    nodes: dict[str, pb.Node]
    agents: list[pb.Member]
    models: dict[str, pb.JobModel]
    replicas: list[pb.ReplicaStatus]
    tenants: list[pb.Tenant] = field(default_factory=list)


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


def _prefix_end(prefix: bytes) -> bytes:
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _compare_mod(e: Expect) -> Any:
    return rpc.Compare(
        key=e.key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=e.mod_revision
    )


def _op(op: Put | Delete) -> Any:
    if isinstance(op, Put):
        return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key, value=op.value, lease=op.lease))
    end = _prefix_end(op.key) if op.prefix else op.end
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key, range_end=end))


def _txn_request(ops: Sequence[Put | Delete], expect: Sequence[Expect], fence: Fence | None) -> Any:
    """The TxnRequest of `Store.txn`: ops if every expect (and the fence) holds, else reads."""
    compare = [_compare_mod(e) for e in expect]
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
    ops: Sequence[Put | Delete], expect: Sequence[Expect] = (), fence: Fence | None = None
) -> int:
    """Serialized size of the transaction `Store.txn` sends for these arguments.

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


def side_state_deletes(
    keys: Keys, job: pb.Job, *, keep_profile: bool = False
) -> list[Put | Delete]:
    """Deletes of everything stored for a job besides its record.

    That is its idempotency key, model, observation profile, allocation and replica statuses:
    what serves a running job. Its timeline is not: it is the finished job's picture, and goes
    with the record (`record_deletes`). With `keep_profile`, the model and observation profile
    stay: a finished run's measurements that a later run of its name is seeded from.
    """
    deletes: list[Put | Delete] = [
        Delete(keys.request(job.request_id)),
        Delete(keys.allocation(job.id)),
        Delete(keys.replicas_of(job.id), prefix=True),
    ]
    if not keep_profile:
        deletes += [Delete(keys.model(job.id)), Delete(keys.observations(job.id))]
    return deletes


def record_deletes(keys: Keys, job: pb.Job) -> list[Put | Delete]:
    """Deletes of a job's record and what lives as long as it (its timeline)."""
    return [Delete(keys.job(job.id)), Delete(keys.timeline(job.id))]


class _TlsClient(aetcd.Client):  # type: ignore[misc]
    """An aetcd client over TLS with a client certificate (aetcd itself dials plaintext only).

    Made like aetcd's own `connect`, with `grpc.aio.secure_channel` in place of the insecure
    one; the credentials are read from `TlsFiles` at each connect, so a re-dial picks up a
    renewed certificate.
    """

    def __init__(self, tls: TlsFiles, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tls = tls
        self.tls_generation = tls.generation

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            credentials = self._tls.channel_credentials()
            self.tls_generation = self._tls.generation
            self.channel = rpc.secure_channel(
                f"{self._host}:{self._port}", credentials, options=self._options.items()
            )
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


class Store:
    """The cluster state in etcd, typed by entity.

    Args:
        client: A connected aetcd client (the store does not own it unless made by `connect`).
        root: Key root (`Keys.root`); tests use a unique root each.
    """

    def __init__(self, client: aetcd.Client, root: str = DEFAULT_ROOT) -> None:
        self._client = client
        self.keys = Keys(root)
        self._owned = False
        self.tls: TlsFiles | None = None
        """The TLS files the connection was made with (None: plaintext); services serve
        their own ports with the same identity."""
        self.jobs_written = 0
        """Revision of the last job-record write made through this store (read your writes:
        a replica's mirror waits for it before answering a listing)."""

    @classmethod
    async def connect(
        cls,
        endpoint: str,
        root: str = DEFAULT_ROOT,
        *,
        timeout_s: float = 5.0,
        tls: TlsFiles | None = None,
    ) -> Store:
        """Connect to etcd and return a store that owns the connection.

        `endpoint` is ``host:port``, or several members' endpoints comma-separated: requests
        then fail over between them. With `tls`, etcd is dialled over TLS and our certificate
        is the client identity (etcd runs with ``--client-cert-auth``).

        Raises:
            ValueError: A malformed endpoint (etcd_target.EndpointError).
        """
        host, port = aetcd_address(endpoint)
        # Large clusters list thousands of jobs in one range; gRPC's 4 MiB default is too small.
        options: dict[str, Any] = {"grpc.max_receive_message_length": MAX_MESSAGE_BYTES}
        if tls is not None:
            # One target over several members has no single host name to verify: every
            # member's certificate must name the first member's host (etcd's own guidance
            # is one certificate naming every member).
            options["grpc.ssl_target_name_override"] = split_endpoints(endpoint)[0][0]
        settings: dict[str, Any] = {
            "host": host,
            "port": port,
            "timeout": timeout_s,
            "options": options,
        }
        client = _TlsClient(tls, **settings) if tls is not None else aetcd.Client(**settings)
        try:
            await client.connect()
        except aetcd.exceptions.ClientError as error:
            raise StoreUnavailable(f"cannot connect to etcd at {endpoint}: {error}") from error
        store = cls(client, root)
        store._owned = True
        store.tls = tls
        return store

    async def close(self) -> None:
        """Close the connection if this store opened it; never hangs.

        aetcd's watcher shutdown puts a sentinel into its bounded request queue, which can
        wait for good when the queue is full and its stream no longer reads it. After
        `CLOSE_TIMEOUT_S` the channel is closed directly, which ends every call and stream.
        """
        if not self._owned:
            return
        try:
            await asyncio.wait_for(self._client.close(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("etcd_client_close_stuck", timeout_s=CLOSE_TIMEOUT_S)
            channel = self._client.channel
            if channel is not None:
                await channel.close()

    async def reload_tls(self) -> bool:
        """Re-dial etcd if the TLS files changed since the connection was made.

        In-flight calls fail over (UNAVAILABLE, retried by their callers) and watches re-attach
        from their last revision, as after any etcd outage. True if it re-dialled.
        """
        client = self._client
        if self.tls is None or not isinstance(client, _TlsClient):
            return False
        if not self.tls.changed(client.tls_generation):
            return False
        log.info("etcd_redial_for_new_certificate", generation=self.tls.generation)
        try:
            await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            if client.channel is not None:
                await client.channel.close()
            client._init_channel_attrs()
            client._connected.clear()
        await client.connect()
        return True

    # -- generic operations ------------------------------------------------------------------

    def _stub(self, method: str) -> Any:
        if method.startswith("Lease"):
            return self._client.leasestub
        if method in _MAINTENANCE:
            return self._client.maintenancestub
        return self._client.kvstub

    async def _call(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
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

    # -- maintenance (pollux.service.maintenance) ------------------------------------------

    async def member_status(self) -> MemberStatus:
        """Storage and alarms of the member this store is connected to."""
        status = await self._call("Status", rpc.StatusRequest())
        alarms = await self._call(
            "Alarm", rpc.AlarmRequest(action=rpc.AlarmRequest.GET, memberID=0, alarm=rpc.NONE)
        )
        member = int(status.header.member_id)
        return MemberStatus(
            member_id=member,
            revision=int(status.header.revision),
            db_size=int(status.dbSize),
            db_in_use=int(status.dbSizeInUse),
            alarms=tuple(
                sorted({rpc.AlarmType.Name(a.alarm) for a in alarms.alarms if a.alarm != rpc.NONE})
            ),
        )

    async def compact(self, revision: int) -> None:
        """Drop the history before `revision` (physical: done when this returns)."""
        try:
            await self._call(
                "Compact", rpc.CompactionRequest(revision=revision, physical=True), timeout=60.0
            )
        except StoreError as error:
            if "required revision has been compacted" not in str(error):
                raise

    async def defragment(self) -> None:
        """Give the connected member's free pages back to the file system (blocks it a while)."""
        await self._call("Defragment", rpc.DefragmentRequest(), timeout=120.0)

    async def disarm_nospace(self) -> None:
        """Clear every member's NOSPACE alarm (etcd never clears it by itself)."""
        alarms = await self._call(
            "Alarm", rpc.AlarmRequest(action=rpc.AlarmRequest.GET, memberID=0, alarm=rpc.NONE)
        )
        for alarm in alarms.alarms:
            if alarm.alarm == rpc.NOSPACE:
                await self._call(
                    "Alarm",
                    rpc.AlarmRequest(
                        action=rpc.AlarmRequest.DEACTIVATE,
                        memberID=alarm.memberID,
                        alarm=rpc.NOSPACE,
                    ),
                )

    async def get(self, key: bytes, cls: type[M]) -> Entry[M] | None:
        """The message at a key, or None."""
        response = await self._call("Range", rpc.RangeRequest(key=key))
        if not response.kvs:
            return None
        return self._entry(response.kvs[0], cls)

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
        response = await self._call(
            "Range",
            rpc.RangeRequest(key=prefix, range_end=_prefix_end(prefix), revision=revision),
        )
        if len(response.kvs) > LARGE_SCAN:
            # Decoding thousands of values would stall every other request on this loop.
            entries = await asyncio.to_thread(lambda: [self._entry(kv, cls) for kv in response.kvs])
        else:
            entries = [self._entry(kv, cls) for kv in response.kvs]
        return entries, int(response.header.revision)

    async def scan_pages(
        self, prefix: bytes, cls: type[M], *, page: int = 1000
    ) -> AsyncIterator[tuple[list[Entry[M]], int]]:
        """Every message under a prefix, `page` at a time, all at one revision.

        For prefixes too large to hold twice (the raw reply and the decoded messages): the
        caller keeps what it needs of each page. Every page reflects the first page's revision.
        """
        end = _prefix_end(prefix)
        start, revision = prefix, 0
        while True:
            response = await self._call(
                "Range",
                rpc.RangeRequest(key=start, range_end=end, revision=revision, limit=page),
            )
            revision = revision or int(response.header.revision)
            kvs = list(response.kvs)
            if len(kvs) > LARGE_SCAN:  # as in `scan`: decode big pages off the event loop
                entries = await asyncio.to_thread(self._entries, kvs, cls)
            else:
                entries = self._entries(kvs, cls)
            yield entries, revision
            if not response.more or not kvs:
                return
            start = bytes(kvs[-1].key) + b"\0"

    async def newest(self, prefix: bytes, cls: type[M], *, limit: int) -> list[Entry[M]]:
        """The last `limit` messages under a prefix in key order, last first (decisions, audit)."""
        response = await self._call(
            "Range",
            rpc.RangeRequest(
                key=prefix,
                range_end=_prefix_end(prefix),
                limit=limit,
                sort_order=rpc.RangeRequest.DESCEND,
                sort_target=rpc.RangeRequest.KEY,
            ),
        )
        return self._entries(list(response.kvs), cls)

    async def first_keys(self, prefix: bytes, limit: int) -> list[bytes]:
        """The first `limit` keys under a prefix in key order (keys only)."""
        response = await self._call(
            "Range",
            rpc.RangeRequest(
                key=prefix, range_end=_prefix_end(prefix), limit=limit, keys_only=True
            ),
        )
        return [bytes(kv.key) for kv in response.kvs]

    async def count(self, prefix: bytes) -> int:
        """How many keys are under a prefix (etcd counts; nothing is transferred)."""
        response = await self._call(
            "Range",
            rpc.RangeRequest(key=prefix, range_end=_prefix_end(prefix), count_only=True),
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
            response = await self._call("Txn", rpc.TxnRequest(success=reads))
            for reply in response.responses:
                kvs = reply.response_range.kvs
                found.append(self._entry(kvs[0], cls) if kvs else None)
        return found

    async def newest_change(self, prefix: bytes, *, after: int) -> int:
        """The highest mod revision of a key under `prefix` written after revision `after`, or 0.

        A cheap freshness check for a mirror at revision `after` (keys only, one key back):
        0 means no key under the prefix changed since. Deletes leave no key, so they do not
        show; a mirror that misses one only plans a write that then fails its compare.
        """
        response = await self._call(
            "Range",
            rpc.RangeRequest(
                key=prefix,
                range_end=_prefix_end(prefix),
                keys_only=True,
                limit=1,
                min_mod_revision=after + 1,
                sort_order=rpc.RangeRequest.DESCEND,
                sort_target=rpc.RangeRequest.MOD,
            ),
        )
        return int(response.kvs[0].mod_revision) if response.kvs else 0

    async def list_keys(self, prefix: bytes) -> list[bytes]:
        """Keys under a prefix (no values)."""
        response = await self._call(
            "Range", rpc.RangeRequest(key=prefix, range_end=_prefix_end(prefix), keys_only=True)
        )
        return [bytes(kv.key) for kv in response.kvs]

    def _entries(self, kvs: list[Any], cls: type[M]) -> list[Entry[M]]:
        return [self._entry(kv, cls) for kv in kvs]

    def _entry(self, kv: Any, cls: type[M]) -> Entry[M]:
        return Entry(
            value=decode(cls, kv.value, kv.key),
            mod_revision=int(kv.mod_revision),
            create_revision=int(kv.create_revision),
            lease=int(kv.lease),
            key=bytes(kv.key),
        )

    async def txn(
        self,
        ops: Sequence[Put | Delete],
        *,
        expect: Sequence[Expect] = (),
        fence: Fence | None = None,
    ) -> int:
        """Apply `ops` atomically if every `expect` holds and, with a fence, leadership does.

        Returns:
            The revision of the write.

        Raises:
            FenceLost: The fence's election key is gone or was re-created (nothing written).
            Conflict: An `expect` failed (nothing written).
            ValueTooLarge: A value or the whole request is over its bound (nothing sent).
        """
        request = _txn_request(ops, expect, fence)
        _check_size(ops, request)
        response = await self._call("Txn", request)
        if response.succeeded:
            revision = int(response.header.revision)
            jobs = self.keys.prefix(Kind.JOBS)
            if any(op.key.startswith(jobs) for op in ops):
                self.jobs_written = max(self.jobs_written, revision)
            return revision
        ranges = [r.response_range for r in response.responses]
        if fence is not None:
            kvs = ranges[-1].kvs
            if not kvs or kvs[0].create_revision != fence.revision:
                raise FenceLost()
        moved = [
            e.key
            for e, r in zip(expect, ranges, strict=False)
            if (r.kvs[0].mod_revision if r.kvs else 0) != e.mod_revision
        ]
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
        response = await self._call("LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_s))
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
        await self._call("LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id))

    async def snapshot(self) -> Snapshot:
        """Jobs, nodes, agents, models, allocations and replica statuses at one revision."""
        jobs, revision = await self.list_jobs()
        k = self.keys
        nodes, _ = await self.scan(k.prefix(Kind.NODES), pb.Node, revision=revision)
        agents, _ = await self.scan(k.prefix(Kind.AGENTS), pb.Member, revision=revision)
        models, _ = await self.scan(k.prefix(Kind.MODELS), pb.JobModel, revision=revision)
        replicas, _ = await self.scan(k.prefix(Kind.REPLICAS), pb.ReplicaStatus, revision=revision)
        tenants, _ = await self.scan(k.prefix(Kind.TENANTS), pb.Tenant, revision=revision)
        return Snapshot(
            revision=revision,
            jobs={e.value.id: e for e in jobs},
            nodes={e.value.name: e.value for e in nodes},
            agents=[e.value for e in agents],
            models={e.value.job_id: e.value for e in models},
            replicas=[e.value for e in replicas],
            tenants=[e.value for e in tenants],
        )

    # -- typed entities ------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> Entry[pb.Job] | None:
        """A job record."""
        return await self.get(self.keys.job(job_id), pb.Job)

    async def list_jobs(self) -> tuple[list[Entry[pb.Job]], int]:
        """Every job record (key order = id order) and the revision read."""
        return await self.scan(self.keys.prefix(Kind.JOBS), pb.Job)

    async def create_job(
        self, job: pb.Job, seed: tuple[pb.ObservationProfile, pb.JobModel] | None = None
    ) -> tuple[pb.Job, bool]:
        """Store a new job unless its request id was seen; returns (stored job, created).

        The request index and the job are written in one transaction that requires the index to
        be absent, so two concurrent submits with one request id create one job. A `seed`
        (pollux.service.seeding) is the job's first profile and model, written with it.
        """
        k = self.keys
        index = k.request(job.request_id)
        for _ in range(5):
            ops = [Put(index, job.id.encode()), Put(k.job(job.id), job.SerializeToString())]
            expect = [Expect(index, 0), Expect(k.job(job.id), 0)]
            if seed is not None:
                profile, model = seed
                ops += [
                    Put(k.observations(job.id), profile.SerializeToString()),
                    Put(k.model(job.id), model.SerializeToString()),
                ]
                expect += [Expect(k.observations(job.id), 0), Expect(k.model(job.id), 0)]
            try:
                await self.txn(ops, expect=expect)
                return job, True
            except Conflict:
                response = await self._call("Range", rpc.RangeRequest(key=index))
                if not response.kvs:
                    continue  # the job id collided, not the request id: caller's id is unique
                existing = await self.get_job(bytes(response.kvs[0].value).decode())
                if existing is not None:
                    return existing.value, False
        raise StoreError(f"could not store job {job.id}: repeated conflicts")

    async def job_of_request(self, request_id: str) -> Entry[pb.Job] | None:
        """The job a submit with `request_id` created, if one did and it still exists."""
        response = await self._call("Range", rpc.RangeRequest(key=self.keys.request(request_id)))
        if not response.kvs:
            return None
        return await self.get_job(bytes(response.kvs[0].value).decode())

    async def update_job(self, job: pb.Job, *, expected: int, fence: Fence | None = None) -> int:
        """Replace a job record read at mod revision `expected`; returns the new revision."""
        key = self.keys.job(job.id)
        return await self.txn(
            [Put(key, job.SerializeToString())], expect=[Expect(key, expected)], fence=fence
        )

    async def delete_job(self, job: pb.Job, *, expected: int) -> None:
        """Delete a job with its request index, model, observations, allocation and replicas."""
        k = self.keys
        await self.txn(
            [*record_deletes(k, job), *side_state_deletes(k, job)],
            expect=[Expect(k.job(job.id), expected)],
        )

    async def list_nodes(self) -> tuple[list[Entry[pb.Node]], int]:
        """Registered nodes."""
        return await self.scan(self.keys.prefix(Kind.NODES), pb.Node)

    async def register_node(self, node: pb.Node, *, lease: int) -> int:
        """(Re-)register a node under its launcher's lease."""
        return await self.put(self.keys.node(node.name), node, lease=lease)

    async def list_agents(self) -> tuple[list[Entry[pb.Member]], int]:
        """Registered agents."""
        return await self.scan(self.keys.prefix(Kind.AGENTS), pb.Member)

    async def register_agent(self, agent: pb.Member, *, lease: int) -> int:
        """(Re-)register an agent under its lease."""
        return await self.put(self.keys.agent(agent.id), agent, lease=lease)

    async def get_model(self, job_id: str) -> Entry[pb.JobModel] | None:
        """A job's latest model."""
        return await self.get(self.keys.model(job_id), pb.JobModel)

    async def get_timeline(self, job_id: str) -> Entry[pb.JobTimeline] | None:
        """A job's timeline; None before its first point."""
        return await self.get(self.keys.timeline(job_id), pb.JobTimeline)

    async def get_profile(self, job_id: str) -> Entry[pb.ObservationProfile] | None:
        """A job's observation profile."""
        return await self.get(self.keys.observations(job_id), pb.ObservationProfile)

    async def save_profile_and_model(
        self,
        profile: pb.ObservationProfile,
        model: pb.JobModel | None,
        *,
        expected: int,
        timeline: pb.JobTimeline | None = None,
    ) -> int:
        """Write a job's profile (read at `expected`; 0 = new), its model and timeline, at once.

        Model and timeline only when given. Only while the job exists: a deleted job's agent
        cannot resurrect its keys.

        Raises:
            Conflict: The profile changed since `expected`, or the job is gone (nothing written).
            ValueTooLarge: The profile or model is over its bound (nothing sent).
        """
        k = self.keys
        job_key = k.job(profile.job_id)
        ops: list[Put | Delete] = [Put(k.observations(profile.job_id), profile.SerializeToString())]
        if model is not None:
            ops.append(Put(k.model(profile.job_id), model.SerializeToString()))
        if timeline is not None:
            ops.append(Put(k.timeline(profile.job_id), timeline.SerializeToString()))
        compare = [_compare_mod(Expect(k.observations(profile.job_id), expected))]
        compare.append(
            rpc.Compare(
                key=job_key, target=rpc.Compare.VERSION, result=rpc.Compare.GREATER, version=0
            )
        )
        request = rpc.TxnRequest(
            compare=compare,
            success=[_op(op) for op in ops],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=job_key))],
        )
        _check_size(ops, request)
        response = await self._call("Txn", request)
        if response.succeeded:
            return int(response.header.revision)
        if not response.responses[0].response_range.kvs:
            raise Conflict(job_key)
        raise Conflict(k.observations(profile.job_id))

    async def list_allocations(self) -> tuple[dict[str, Entry[pb.Allocation]], int]:
        """Every allocation by job id, and the revision read."""
        prefix = self.keys.prefix(Kind.ALLOCATIONS)
        response = await self._call(
            "Range", rpc.RangeRequest(key=prefix, range_end=_prefix_end(prefix))
        )
        allocations = {
            self.keys.name_of(bytes(kv.key), Kind.ALLOCATIONS): self._entry(kv, pb.Allocation)
            for kv in response.kvs
        }
        return allocations, int(response.header.revision)

    async def put_replica_status(self, status: pb.ReplicaStatus, *, lease: int = 0) -> int:
        """Record a replica's phase (launchers)."""
        return await self.put(self.keys.replica(status.job_id, status.rank), status, lease=lease)

    async def list_replica_statuses(
        self, job_id: str | None = None
    ) -> tuple[list[Entry[pb.ReplicaStatus]], int]:
        """Replica statuses of one job, or of every job."""
        prefix = self.keys.replicas_of(job_id) if job_id else self.keys.prefix(Kind.REPLICAS)
        return await self.scan(prefix, pb.ReplicaStatus)

    async def latest_decisions(self, limit: int) -> list[pb.Decision]:
        """The most recent decisions, newest first."""
        entries = await self.newest(self.keys.prefix(Kind.DECISIONS), pb.Decision, limit=limit)
        return [e.value for e in entries]
