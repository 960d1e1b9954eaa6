"""The etcd layer alone on real etcd: `EtcdKV` with no key layout, `EtcdMaintenance` alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from pollux.service.etcd import client as etcd_client
from pollux.service.etcd.errors import Conflict, StoreError
from pollux.service.etcd.kv import Delete, EtcdKV, Exists, Expect, Put, prefix_end
from pollux.service.etcd.maintenance import EtcdMaintenance
from pollux.service.etcd_target import EndpointError
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer


@pytest.fixture
async def kv(etcd: EtcdServer, root: str) -> AsyncIterator[EtcdKV]:
    kv = await EtcdKV.connect(etcd.endpoint)
    try:
        yield kv
    finally:
        await kv.txn([Delete(root.encode() + b"/", prefix=True)])
        await kv.close()


def node(name: str) -> pb.Node:
    return pb.Node(name=name, gpus=4)


async def test_reads_see_writes_in_key_order_at_one_revision(kv: EtcdKV, root: str) -> None:
    prefix = f"{root}/n/".encode()
    first = await kv.put(prefix + b"b", node("b"))
    last = await kv.txn([Put(prefix + b"a", node("a").SerializeToString())])
    assert last > first
    entries, revision = await kv.scan(prefix, pb.Node)
    assert [e.value.name for e in entries] == ["a", "b"]
    assert [e.key for e in entries] == [prefix + b"a", prefix + b"b"]
    assert revision >= last
    before, _ = await kv.scan(prefix, pb.Node, revision=first)
    assert [e.value.name for e in before] == ["b"]
    assert await kv.list_keys(prefix) == [prefix + b"a", prefix + b"b"]
    assert await kv.first_keys(prefix, 1) == [prefix + b"a"]
    assert await kv.count(prefix) == 2
    assert [e.value.name for e in await kv.newest(prefix, pb.Node, limit=1)] == ["b"]
    found = await kv.get_many([prefix + b"b", prefix + b"gone"], pb.Node)
    assert found[0] is not None
    assert found[0].value.name == "b"
    assert found[1] is None
    assert await kv.get_bytes(prefix + b"a") == node("a").SerializeToString()
    assert await kv.get_bytes(prefix + b"gone") is None


async def test_pages_cover_the_prefix_at_the_first_pages_revision(kv: EtcdKV, root: str) -> None:
    prefix = f"{root}/p/".encode()
    await kv.txn(
        [Put(prefix + f"{i:02}".encode(), node(str(i)).SerializeToString()) for i in range(5)]
    )
    names: list[str] = []
    revisions = set()
    async for entries, revision in kv.scan_pages(prefix, pb.Node, page=2):
        if not names:  # written after the first page: not seen by the later ones
            await kv.put(prefix + b"99", node("late"))
        names += [e.value.name for e in entries]
        revisions.add(revision)
    assert names == ["0", "1", "2", "3", "4"]
    assert len(revisions) == 1


async def test_newest_change_reports_only_writes_after_a_revision(kv: EtcdKV, root: str) -> None:
    prefix = f"{root}/c/".encode()
    written = await kv.put(prefix + b"x", node("x"))
    assert await kv.newest_change(prefix, after=written) == 0
    again = await kv.put(prefix + b"y", node("y"))
    assert await kv.newest_change(prefix, after=written) == again


async def test_exists_precondition_names_the_missing_key(kv: EtcdKV, root: str) -> None:
    owner, child = f"{root}/owner".encode(), f"{root}/child".encode()
    with pytest.raises(Conflict) as raised:
        await kv.txn([Put(child, b"v")], expect=[Exists(owner)])
    assert raised.value.keys == (owner,)
    assert await kv.get_bytes(child) is None
    await kv.put(owner, node("o"))
    await kv.txn([Put(child, b"v")], expect=[Exists(owner), Expect(child, 0)])
    assert await kv.get_bytes(child) == b"v"


async def test_tracked_prefix_remembers_the_last_write_through_it(kv: EtcdKV, root: str) -> None:
    tracked = f"{root}/jobs/".encode()
    kv.track_writes(tracked)
    assert kv.written(tracked) == 0
    await kv.put(f"{root}/other".encode(), node("o"))
    assert kv.written(tracked) == 0
    revision = await kv.put(tracked + b"j", node("j"))
    assert kv.written(tracked) == revision


async def test_a_leased_key_lives_as_long_as_its_lease(kv: EtcdKV, root: str) -> None:
    key = f"{root}/leased".encode()
    lease = await kv.grant_lease(30)
    await kv.put(key, node("n"), lease=lease)
    entry = await kv.get(key, pb.Node)
    assert entry is not None
    assert entry.lease == lease
    assert 0 < await kv.keep_alive(lease) <= 30
    await kv.revoke_lease(lease)
    assert await kv.get(key, pb.Node) is None
    assert await kv.keep_alive(lease) <= 0


async def test_closing_a_borrowed_connection_leaves_it_open(kv: EtcdKV, root: str) -> None:
    borrowed = EtcdKV(kv._client)
    await borrowed.close()
    await kv.put(f"{root}/still".encode(), node("s"))


async def test_a_malformed_endpoint_is_refused() -> None:
    with pytest.raises(EndpointError):
        await etcd_client.dial("no-port-here")


def test_prefix_end_is_the_first_key_past_the_prefix() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


@pytest.fixture
def own_etcd() -> Iterator[EtcdServer]:
    """An etcd of the test's own: compaction would cut the shared one's history."""
    server = EtcdServer.start()
    try:
        yield server
    finally:
        server.stop()


async def test_maintenance_reports_compacts_and_defragments(own_etcd: EtcdServer) -> None:
    kv = await EtcdKV.connect(own_etcd.endpoint)
    try:
        maintenance = EtcdMaintenance(kv)
        old = await kv.put(b"/k", node("old"))
        latest = await kv.put(b"/k", node("new"))
        status = await maintenance.member_status()
        assert status.revision >= latest
        assert status.alarms == ()
        assert 0 < status.db_in_use <= status.db_size
        await maintenance.compact(latest)
        await maintenance.compact(latest)  # compacting again is no error
        with pytest.raises(StoreError):
            await kv.scan(b"/k", pb.Node, revision=old)
        await maintenance.defragment()
        await maintenance.disarm_nospace()  # no alarm: nothing to clear
        entry = await kv.get(b"/k", pb.Node)
        assert entry is not None
        assert entry.value.name == "new"
    finally:
        await kv.close()


async def test_a_watch_from_a_compacted_revision_fails(own_etcd: EtcdServer) -> None:
    kv = await EtcdKV.connect(own_etcd.endpoint)
    try:
        old = await kv.put(b"/w/a", node("a"))
        latest = await kv.put(b"/w/a", node("b"))
        await EtcdMaintenance(kv).compact(latest)

        async def first() -> None:
            async for _ in kv.watch(b"/w/", start_revision=old):
                return

        with pytest.raises(StoreError):
            await asyncio.wait_for(first(), 10)
    finally:
        await kv.close()
