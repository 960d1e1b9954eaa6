"""Store contract on real etcd: typed round trips, optimistic concurrency, fencing, leases."""

from __future__ import annotations

import asyncio

import pytest

from pollux.scheduler.lifecycle import MAX_RECENT_HISTORY, transition
from pollux.service.keys import Kind
from pollux.service.store import (
    MAX_TXN_BYTES,
    MAX_VALUE_BYTES,
    Conflict,
    Delete,
    Expect,
    Fence,
    FenceLost,
    Put,
    Store,
    ValueTooLarge,
)
from pollux.v1 import types_pb2 as pb


def job(job_id: str, request_id: str = "") -> pb.Job:
    return pb.Job(
        id=job_id,
        request_id=request_id or f"req-{job_id}",
        state=pb.JOB_STATE_PENDING,
        spec=pb.JobSpec(name="train", command=["python", "-c", "pass"]),
    )


async def test_job_round_trip_keeps_every_field(store: Store) -> None:
    stored, created = await store.create_job(job("j-1"))
    assert created
    entry = await store.get_job("j-1")
    assert entry is not None
    assert entry.value == stored
    assert entry.mod_revision == entry.create_revision > 0


async def test_same_request_id_creates_one_job(store: Store) -> None:
    results = await asyncio.gather(*(store.create_job(job(f"j-{i}", "same")) for i in range(5)))
    created = [j for j, was_created in results if was_created]
    assert len(created) == 1
    assert {j.id for j, _ in results} == {created[0].id}
    jobs, _ = await store.list_jobs()
    assert [e.value.id for e in jobs] == [created[0].id]


async def test_update_with_stale_revision_conflicts_and_writes_nothing(store: Store) -> None:
    await store.create_job(job("j-1"))
    entry = await store.get_job("j-1")
    assert entry is not None
    first = pb.Job()
    first.CopyFrom(entry.value)
    first.state = pb.JOB_STATE_RUNNING
    await store.update_job(first, expected=entry.mod_revision)
    stale = pb.Job()
    stale.CopyFrom(entry.value)
    stale.state = pb.JOB_STATE_CANCELLED
    with pytest.raises(Conflict):
        await store.update_job(stale, expected=entry.mod_revision)
    after = await store.get_job("j-1")
    assert after is not None
    assert after.value.state == pb.JOB_STATE_RUNNING


async def test_fenced_write_fails_once_the_leader_key_is_gone(store: Store) -> None:
    lease = await store.grant_lease(5)
    key = store.keys.leader(lease)
    revision = await store.txn([Put(key, b"me", lease)], expect=[Expect(key, 0)])
    fence = Fence(key, revision)
    await store.txn([Put(store.keys.job("a"), b"")], fence=fence)
    await store.revoke_lease(lease)
    with pytest.raises(FenceLost):
        await store.txn([Put(store.keys.job("b"), b"")], fence=fence)
    assert await store.list_keys(store.keys.job("b")) == []


async def test_fence_of_a_recreated_key_is_rejected(store: Store) -> None:
    key = store.keys.leader(1)
    old = await store.txn([Put(key, b"old")])
    await store.txn([Put(store.keys.job("x"), b"")], fence=Fence(key, old))
    await store.txn([Put(key, b"")], expect=[Expect(key, old)])  # same key, same create rev
    await store.txn([Put(store.keys.job("y"), b"")], fence=Fence(key, old))
    await store.txn([Delete(key)])
    await store.txn([Put(key, b"new")])
    with pytest.raises(FenceLost):
        await store.txn([Put(store.keys.job("z"), b"")], fence=Fence(key, old))


async def test_watch_sees_changes_in_order_from_a_revision(store: Store) -> None:
    _, revision = await store.list_jobs()
    seen: list[tuple[bytes, bool]] = []

    async def consume() -> None:
        async for event in store.watch(store.keys.prefix(Kind.JOBS), start_revision=revision + 1):
            seen.append((event.key, event.value is None))
            if len(seen) == 2:
                return

    task = asyncio.create_task(consume())
    await store.create_job(job("j-1"))
    entry = await store.get_job("j-1")
    assert entry is not None
    await store.delete_job(entry.value, expected=entry.mod_revision)
    await asyncio.wait_for(task, 10)
    assert seen == [(store.keys.job("j-1"), False), (store.keys.job("j-1"), True)]


async def test_leased_registration_disappears_when_the_lease_is_revoked(store: Store) -> None:
    lease = await store.grant_lease(5)
    await store.register_node(pb.Node(name="n1", gpus=4), lease=lease)
    assert await store.keep_alive(lease) > 0
    nodes, _ = await store.list_nodes()
    assert [e.value.name for e in nodes] == ["n1"]
    await store.revoke_lease(lease)
    nodes, _ = await store.list_nodes()
    assert nodes == []
    assert await store.keep_alive(lease) <= 0


async def test_profile_of_a_deleted_job_is_not_written(store: Store) -> None:
    profile = pb.ObservationProfile(job_id="gone")
    with pytest.raises(Conflict):
        await store.save_profile_and_model(profile, None, expected=0)
    assert await store.get_profile("gone") is None


async def test_watch_delivers_every_key_of_one_transaction(store: Store) -> None:
    _, revision = await store.list_jobs()
    keys = [store.keys.job(f"t-{i}") for i in range(3)]
    seen: list[bytes] = []

    async def consume() -> None:
        async for event in store.watch(store.keys.prefix(Kind.JOBS), start_revision=revision + 1):
            seen.append(event.key)
            if len(seen) == 3:
                return

    task = asyncio.create_task(consume())
    await store.txn([Put(k, b"") for k in keys])
    await asyncio.wait_for(task, 10)
    assert seen == keys


async def test_an_oversized_value_is_refused_before_sending_and_nothing_is_written(
    store: Store,
) -> None:
    small, big = store.keys.job("small"), store.keys.job("big")
    # Under etcd's own 1.5 MiB limit: etcd alone would have taken it.
    with pytest.raises(ValueTooLarge) as caught:
        await store.txn([Put(small, b"ok"), Put(big, b"x" * (MAX_VALUE_BYTES + 1))])
    assert caught.value.key == big
    assert big.decode() in str(caught.value)
    assert str(MAX_VALUE_BYTES) in str(caught.value)
    assert await store.list_keys(store.keys.prefix(Kind.JOBS)) == []


async def test_an_oversized_transaction_is_refused_and_nothing_is_written(store: Store) -> None:
    keys = [store.keys.job(f"j-{i}") for i in range(3)]
    third = b"x" * (MAX_TXN_BYTES // 3 + 1)  # each value is fine, the three together are not
    with pytest.raises(ValueTooLarge) as caught:
        await store.txn([Put(k, third) for k in keys])
    assert caught.value.limit == MAX_TXN_BYTES
    assert str(MAX_TXN_BYTES) in str(caught.value)
    assert await store.list_keys(store.keys.prefix(Kind.JOBS)) == []
    await store.txn([Put(k, third) for k in keys[:2]])  # two of them fit
    assert await store.list_keys(store.keys.prefix(Kind.JOBS)) == keys[:2]


async def test_an_oversized_profile_is_refused_and_nothing_is_written(store: Store) -> None:
    await store.create_job(job("j-1"))
    profile = pb.ObservationProfile(job_id="j-1")
    for rank in range(MAX_VALUE_BYTES // 8):
        profile.applied_seq[f"1/{rank}"] = rank
    with pytest.raises(ValueTooLarge):
        await store.save_profile_and_model(profile, pb.JobModel(job_id="j-1"), expected=0)
    assert await store.get_profile("j-1") is None
    assert await store.get_model("j-1") is None


async def test_a_job_transitioned_many_times_keeps_a_bounded_history(store: Store) -> None:
    submitted = job("j-1")
    submitted.history.add(state=pb.JOB_STATE_PENDING, reason="submitted")
    await store.create_job(submitted)
    targets = [pb.JOB_STATE_ALLOCATED, pb.JOB_STATE_RUNNING]
    targets += [pb.JOB_STATE_RESCALING, pb.JOB_STATE_RUNNING] * 150
    for i, target in enumerate(targets):
        entry = await store.get_job("j-1")
        assert entry is not None
        transition(entry.value, target, float(i + 1), f"step {i} " + "n" * 1000)
        await store.update_job(entry.value, expected=entry.mod_revision)
    stored = await store.get_job("j-1")
    assert stored is not None
    history = stored.value.history
    assert len(history) == 1 + MAX_RECENT_HISTORY
    assert history[0].reason == "submitted"
    assert history[-1].reason.startswith(f"step {len(targets) - 1} ")
    assert stored.value.ByteSize() < 64 * 1024


async def test_a_conflict_names_every_key_that_moved(store: Store) -> None:
    k = store.keys
    read = {n: await store.put(k.job(n), pb.Job(id=n)) for n in ("a", "b", "c")}
    for moved in ("a", "c"):
        await store.put(k.job(moved), pb.Job(id=moved, restarts=1))
    with pytest.raises(Conflict) as conflict:
        await store.txn(
            [Put(k.job("b"), b"")], expect=[Expect(k.job(n), read[n]) for n in ("a", "b", "c")]
        )
    assert conflict.value.keys == (k.job("a"), k.job("c"))
