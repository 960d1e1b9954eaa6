"""The scheduler's in-memory mirror of etcd (pollux.service.mirror) against a real etcd."""

from __future__ import annotations

import asyncio

from pollux.service.mirror import ClusterMirror
from pollux.service.store import Put, Store, cancel_and_wait
from pollux.v1 import types_pb2 as pb
from tests.waiting import eventually


def job(job_id: str, state: int) -> pb.Job:
    return pb.Job(id=job_id, state=state)  # type: ignore[arg-type]


async def test_the_mirror_keeps_the_active_state_and_only_counts_finished_jobs(
    store: Store,
) -> None:
    k = store.keys
    await store.put(k.job("before"), job("before", pb.JOB_STATE_RUNNING))
    await store.put(k.job("old"), job("old", pb.JOB_STATE_SUCCEEDED))
    changes: list[None] = []
    mirror = ClusterMirror(store, on_change=lambda: changes.append(None))
    await mirror.start()
    try:
        # Listed at start: the active job in full, the finished one by state only.
        assert set(mirror.snapshot().jobs) == {"before"}
        assert mirror.state_counts() == {pb.JOB_STATE_RUNNING: 1, pb.JOB_STATE_SUCCEEDED: 1}

        revision = await store.put(k.job("new"), job("new", pb.JOB_STATE_PENDING))
        await store.put(k.node("n1"), pb.Node(name="n1", gpus=4))
        await store.put(k.model("new"), pb.JobModel(job_id="new"))
        await store.put(k.model("old"), pb.JobModel(job_id="old"))
        await store.put_replica_status(pb.ReplicaStatus(job_id="new", node="n1", rank=0))
        assert await mirror.jobs.wait_for(revision, 5.0)

        def caught_up() -> bool:
            snap = mirror.snapshot()
            return bool(snap.nodes) and bool(snap.replicas) and "new" in snap.models

        await eventually(caught_up, 5, "the mirror to apply every change")
        snap = mirror.snapshot()
        assert set(snap.jobs) == {"before", "new"}
        assert snap.jobs["new"].mod_revision == revision, "conditional writes use it"
        assert set(snap.models) == {"new"}, "a finished job's model is not a round's business"
        assert changes, "changes trigger rounds"

        # A job that finishes leaves the active state; a deleted one is forgotten.
        await store.put(k.job("before"), job("before", pb.JOB_STATE_CANCELLED))
        await eventually(lambda: "before" not in mirror.snapshot().jobs, 5, "the finish")
        deleted = await store.get(k.job("old"), pb.Job)
        assert deleted is not None
        await store.delete_job(deleted.value, expected=deleted.mod_revision)
        await eventually(
            lambda: mirror.state_counts() == {pb.JOB_STATE_PENDING: 1, pb.JOB_STATE_CANCELLED: 1},
            5,
            "the delete",
        )
    finally:
        await mirror.stop()


async def test_a_large_prefix_is_listed_in_pages_at_one_revision(store: Store) -> None:
    k = store.keys
    await store.txn(
        [
            Put(k.job(f"j{i:02d}"), job(f"j{i:02d}", STATES[i % 2]).SerializeToString())
            for i in range(30)
        ]
    )
    mirror = ClusterMirror(store)
    mirror.jobs.page = 7  # five pages, the last one short
    await mirror.start()
    try:
        assert len(mirror.snapshot().jobs) == 15
        assert mirror.state_counts() == {pb.JOB_STATE_RUNNING: 15, pb.JOB_STATE_FAILED: 15}
    finally:
        await mirror.stop()


async def test_catching_up_makes_every_earlier_write_visible(store: Store) -> None:
    mirror = ClusterMirror(store)
    await mirror.start()
    try:
        await store.put(store.keys.job("late"), job("late", pb.JOB_STATE_PENDING))
        await store.put(store.keys.node("n9"), pb.Node(name="n9", gpus=1))
        assert await mirror.catch_up(5.0)
        snap = mirror.snapshot()
        assert "late" in snap.jobs
        assert "n9" in snap.nodes
    finally:
        await mirror.stop()


STATES = (pb.JOB_STATE_RUNNING, pb.JOB_STATE_FAILED)


async def test_the_job_index_pages_every_job_in_creation_order_with_filters(store: Store) -> None:
    k = store.keys
    for i in range(30):
        record = job(f"j{i:02d}", STATES[i % 2])
        record.spec.name = "big" if i % 3 == 0 else "small"
        record.create_time.FromNanoseconds((1000 - i) * 10**9)  # newest ids first
        await store.put(k.job(record.id), record)
    mirror = ClusterMirror(store)
    await mirror.start()
    try:
        seen: list[bytes] = []
        after = None
        while True:
            keys, more = mirror.page(
                states={pb.JOB_STATE_FAILED}, name_prefix="", labels={}, after=after, limit=4
            )
            seen.extend(keys)
            if not more:
                break
            after = mirror.summaries[keys[-1]].order
        expected = [k.job(f"j{i:02d}") for i in range(29, -1, -1) if i % 2]
        assert seen == expected, "every failed job once, oldest first"
        big, _ = mirror.page(states=set(), name_prefix="big", labels={}, after=None, limit=100)
        assert len(big) == 10
        gone = await store.get(k.job("j27"), pb.Job)
        assert gone is not None
        await store.delete_job(gone.value, expected=gone.mod_revision)
        assert await mirror.catch_up(5.0)
        await eventually(lambda: k.job("j27") not in mirror.summaries, 5, "the delete")
        keys, _ = mirror.page(states=set(), name_prefix="", labels={}, after=None, limit=100)
        assert len(keys) == 29
    finally:
        await mirror.stop()


async def test_stopping_while_the_watches_are_created_always_stops(store: Store) -> None:
    """`start` returns as soon as every prefix is listed, so a `stop` right after it lands
    while the watches are being created, where aetcd's `wait_for` can swallow a cancel (a
    CI run hung here for its whole timeout). Stop must finish every time."""
    await store.put(store.keys.job("j"), job("j", pb.JOB_STATE_RUNNING))
    for _ in range(40):
        mirror = ClusterMirror(store)
        await mirror.start()
        stopping = asyncio.create_task(mirror.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
        if not done:  # a cancel of `stop` reaches the watch and ends it: clean up, then fail
            await cancel_and_wait(stopping)
        assert done, "stop hung: a swallowed cancel left a mirror following etcd"
        assert not mirror._tasks
