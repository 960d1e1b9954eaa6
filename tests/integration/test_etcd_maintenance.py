"""etcd out of space, and back (pollux.service.maintenance), with a real etcd and scheduler.

A small-quota etcd is filled until it raises its NOSPACE alarm. From then on it takes no writes
(not even a lease grant, so no scheduler can lead): the services must say so plainly, and once
space is freed they must compact, defragment and disarm the alarm by themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest

from pollux.service.maintenance import MaintenanceSettings
from pollux.service.store import NOSPACE_MESSAGE, Delete, Put, Store, StoreFull
from pollux.v1 import scheduler_service_pb2 as spb
from tests.etcd_server import EtcdServer
from tests.integration.test_scheduler import Replica, config, spec
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(120)

QUOTA = 8 * 1024 * 1024


@pytest.fixture
def small_etcd() -> Iterator[EtcdServer]:
    server = EtcdServer.start(f"--quota-backend-bytes={QUOTA}")
    try:
        yield server
    finally:
        server.stop()


async def fill(store: Store) -> int:
    """Write 100 KB values until etcd refuses for lack of space; how many it took."""
    for number in range(10 * QUOTA // 100_000):
        try:
            await store.txn(
                [Put(store.keys.root.encode() + f"/junk/{number}".encode(), b"x" * 100_000)]
            )
        except StoreFull:
            return number
    raise AssertionError("etcd never ran out of space")


async def test_a_full_etcd_is_reported_plainly_and_recovers_once_space_is_freed(
    small_etcd: EtcdServer,
) -> None:
    store = await Store.connect(small_etcd.endpoint, "/pollux-test")
    settings = MaintenanceSettings(interval_s=0.5, compact_retention_s=1.0)
    cfg = replace(config(small_etcd, "/pollux-test", "s-1"), maintenance=settings)
    replica = await Replica(store, cfg).start()
    try:
        assert await fill(store) > 10

        # Every write is refused with one clear line, and ClusterStatus says why.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="full"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "out of space" in str(refused.value.details())

        async def warned() -> bool:
            status = await replica.stub.ClusterStatus(spb.ClusterStatusRequest())
            return list(status.warnings) == [NOSPACE_MESSAGE]

        await eventually(warned, 20, "ClusterStatus to report NOSPACE")

        # Space is freed (deletes are allowed under the alarm): the services recover alone.
        await store.txn([Delete(store.keys.root.encode() + b"/junk/", prefix=True)])

        async def submitted() -> bool:
            try:
                await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="after"))
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                return False
            return True

        await eventually(submitted, 30, "a submit to succeed after space was freed")

        async def all_clear() -> bool:
            status = await replica.stub.ClusterStatus(spb.ClusterStatusRequest())
            return list(status.warnings) == []

        # Warnings are what a replica saw at its last check: clear within one.
        await eventually(all_clear, 10, "the warning to clear")
        await eventually(lambda: replica.scheduler.leadership.leading, 30, "a leader again")
    finally:
        await replica.stop()
        await store.close()
