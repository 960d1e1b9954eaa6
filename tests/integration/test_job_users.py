"""Per-job uids claimed in real etcd: one per job, never one for two live jobs, released after.

Launchers of several nodes claim at the same time; whatever the interleaving, a job gets one
uid (the same for every launcher that asks) and no two jobs share one. A full range is a clear
error; a released uid can be claimed again.
"""

from __future__ import annotations

import asyncio

import pytest

from pollux.launcher import job_users
from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb

pytestmark = pytest.mark.timeout(60)


async def test_concurrent_claims_give_each_job_one_uid_and_no_uid_two_jobs(store: Store) -> None:
    uid_range = (5000, 5007)
    jobs = [f"j-{n}" for n in range(8)]
    # Every job asked for by three "launchers" at once.
    asked = [job for job in jobs for _ in range(3)]
    got = await asyncio.gather(*(job_users.claim(store, job, uid_range) for job in asked))
    by_job: dict[str, set[int]] = {}
    for job, uid in zip(asked, got, strict=True):
        by_job.setdefault(job, set()).add(uid)
    assert all(len(uids) == 1 for uids in by_job.values()), by_job
    uids = [next(iter(by_job[job])) for job in jobs]
    assert sorted(uids) == list(range(5000, 5008))  # all distinct, all in range
    for job, uid in zip(jobs, uids, strict=True):
        by_uid = await store.get(store.keys.job_uid(uid), pb.JobUser)
        assert by_uid is not None
        assert by_uid.value.job_id == job
    # Asked again later, a job gets the same uid.
    assert await job_users.claim(store, "j-3", uid_range) == uids[3]


async def test_a_full_range_is_a_clear_error_until_a_uid_is_released(store: Store) -> None:
    uid_range = (7000, 7001)
    first = await job_users.claim(store, "j-a", uid_range)
    await job_users.claim(store, "j-b", uid_range)
    with pytest.raises(
        job_users.NoFreeUid, match=r"every uid of job_policy.job_uids \[7000, 7001\]"
    ):
        await job_users.claim(store, "j-c", uid_range)
    (claim_a,) = [c for c in await job_users.claims(store) if c.value.job_id == "j-a"]
    assert await job_users.release(store, claim_a)
    assert not await job_users.release(store, claim_a)  # gone already: nothing to do
    assert await store.get(store.keys.job_uid(first), pb.JobUser) is None
    assert await job_users.claim(store, "j-c", uid_range) == first


def test_the_search_starts_at_a_point_of_the_job_and_covers_the_whole_range() -> None:
    order = job_users.candidates("j-1234", 100, 163)
    assert sorted(order) == list(range(100, 164))
    assert order[0] == job_users.first_candidate("j-1234", 100, 163)
    assert job_users.first_candidate("j-1234", 100, 163) == job_users.first_candidate(
        "j-1234", 100, 163
    )
