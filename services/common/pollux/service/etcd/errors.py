"""The store's failures, as the services catch and map them (pollux.service.errors)."""

from __future__ import annotations

from collections.abc import Sequence


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
