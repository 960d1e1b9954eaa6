"""Per-job uids: every job's replicas run under a uid of their own, the same on every node.

A root launcher runs each job's replicas as that job's uid (a gid of the same number, no
supplementary groups), so a job can read no other job's files and none of the launcher's. The
uid must be the same on every node (a checkpoint directory on shared storage outlives a
generation) and never shared by two live jobs, so it is claimed in etcd, not derived: the first
launcher to start the job creates ``job-users/jobs/<job>`` and ``job-users/uids/<uid>`` in one
transaction that requires both absent, probing ``job_policy.job_uids`` in order from a point
derived from the job id (so concurrent claims rarely meet); every other launcher and later
generation reads the claim. A launcher's sweep releases it (`release`) once the job's files'
retention has passed, and before a reused uid is given out its leftovers are removed
(`job_files.reclaim`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pollux.service.store import Conflict, Delete, Entry, Expect, Put, Store, StoreError
from pollux.v1 import types_pb2 as pb

PROBE_BATCH = 64
"""Candidate uids read per etcd round trip while looking for a free one."""


class NoFreeUid(StoreError):
    """Every uid of the range is claimed: the job cannot start here until claims are released."""


def first_candidate(job_id: str, low: int, high: int) -> int:
    """Where the search for a job's uid starts: a point of [low, high] derived from its id."""
    size = high - low + 1
    digest = hashlib.sha256(job_id.encode()).digest()
    return low + int.from_bytes(digest[:8], "big") % size


def candidates(job_id: str, low: int, high: int) -> list[int]:
    """Every uid of [low, high], from the job's first candidate on, wrapping around."""
    start = first_candidate(job_id, low, high)
    return [*range(start, high + 1), *range(low, start)]


async def claimed_uid(store: Store, job_id: str) -> Entry[pb.JobUser] | None:
    """The job's claim, if it has one."""
    return await store.get(store.keys.job_user(job_id), pb.JobUser)


async def claim(store: Store, job_id: str, uid_range: Sequence[int]) -> int:
    """The job's uid: its existing claim, or a free uid of `uid_range` claimed now.

    Raises:
        NoFreeUid: Every uid of the range is claimed.
        StoreError: etcd failed (the caller retries on its next pass).
    """
    existing = await claimed_uid(store, job_id)
    if existing is not None:
        return existing.value.uid
    keys = store.keys
    low, high = uid_range[0], uid_range[1]
    order = candidates(job_id, low, high)
    for start in range(0, len(order), PROBE_BATCH):
        batch = order[start : start + PROBE_BATCH]
        held = await store.get_many([keys.job_uid(uid) for uid in batch], pb.JobUser)
        for uid, entry in zip(batch, held, strict=True):
            if entry is not None:
                continue
            record = pb.JobUser(job_id=job_id, uid=uid)
            record.claim_time.GetCurrentTime()
            value = record.SerializeToString()
            by_job, by_uid = keys.job_user(job_id), keys.job_uid(uid)
            try:
                await store.txn(
                    [Put(by_job, value), Put(by_uid, value)],
                    expect=[Expect(by_job, 0), Expect(by_uid, 0)],
                )
            except Conflict as conflict:
                if by_job in conflict.keys:  # another launcher claimed for this job first
                    raced = await claimed_uid(store, job_id)
                    if raced is not None:
                        return raced.value.uid
                continue  # the uid went to another job meanwhile: try the next one
            return uid
    raise NoFreeUid(
        f"every uid of job_policy.job_uids [{low}, {high}] is claimed by a job that is running "
        "or whose files are still retained: widen the range on every launcher or shorten "
        "file_retention_s"
    )


async def claims(store: Store) -> list[Entry[pb.JobUser]]:
    """Every job's claim (by job key)."""
    entries, _ = await store.scan(store.keys.job_users(), pb.JobUser)
    return entries


async def release(store: Store, entry: Entry[pb.JobUser]) -> bool:
    """Delete a claim (both keys) if it is unchanged since read; whether this call deleted it."""
    keys = store.keys
    claim_key = keys.job_user(entry.value.job_id)
    try:
        await store.txn(
            [Delete(claim_key), Delete(keys.job_uid(entry.value.uid))],
            expect=[Expect(claim_key, entry.mod_revision)],
        )
    except Conflict:
        return False  # another launcher released it first
    return True
