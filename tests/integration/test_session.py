"""The one lease session and the registration built on it, against real etcd.

The rule under test: a lease is lost when etcd says it expired, or when no refresh succeeded for
a whole ttl; a registration that loses its lease tells its holder once and registers again under
a new lease; closing revokes, so the key is gone at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from pollux.service.session import LeasedRegistration, LeaseSession
from pollux.service.store import Store, StoreUnavailable
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually


async def test_a_session_outlives_its_ttl_while_refreshed(store: Store) -> None:
    session = LeaseSession(store, 2, holder="test")
    await session.start()
    try:
        await asyncio.sleep(3)  # longer than the ttl: only refreshes keep it
        assert session.alive
        assert await store.keep_alive(session.lease_id) > 0
    finally:
        await session.close()
    assert not session.alive
    assert await store.keep_alive(session.lease_id) <= 0  # revoked


async def test_a_revoked_lease_is_lost_at_the_next_refresh(store: Store) -> None:
    session = LeaseSession(store, 3, holder="test")
    await session.start()
    try:
        await store.revoke_lease(session.lease_id)  # what etcd does when it expires a lease
        await asyncio.wait_for(session.lost.wait(), timeout=3)
        assert session.lost_reason == "etcd reports the lease expired"
    finally:
        await session.close()


@pytest.fixture
def private_etcd() -> Iterator[EtcdServer]:
    """An etcd of this test's own, which the test may freeze."""
    server = EtcdServer.start()
    try:
        yield server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


async def test_an_unreachable_etcd_loses_the_lease_after_one_ttl(
    private_etcd: EtcdServer,
) -> None:
    store = await Store.connect(private_etcd.endpoint, "/pollux-test", timeout_s=1.0)
    session = LeaseSession(store, 3, holder="test")

    async def granted() -> bool:
        # A just-started etcd on a busy machine may take longer than the store's short
        # timeout (kept short so that the frozen etcd below fails calls fast) to grant one.
        try:
            await session.start()
        except StoreUnavailable:
            return False
        return True

    try:
        await eventually(granted, 30, "the private etcd to grant a lease")
        os.kill(private_etcd.process.pid, signal.SIGSTOP)
        frozen_at = asyncio.get_running_loop().time()
        await asyncio.wait_for(session.lost.wait(), timeout=8)
        waited = asyncio.get_running_loop().time() - frozen_at
        assert session.lost_reason == "no keep-alive succeeded for a whole ttl"
        # Lost a ttl after the last confirmation, which came at most ttl/3 before the freeze.
        assert waited >= session.ttl_s * 2 / 3 - 0.1
    finally:
        os.kill(private_etcd.process.pid, signal.SIGCONT)
        await session.close(revoke=False)
        await store.close()


async def test_a_refresh_that_hangs_loses_the_lease_after_one_ttl(store: Store) -> None:
    session = LeaseSession(store, 2, holder="test")
    await session.start()
    try:

        async def hang(lease_id: int) -> int:
            await asyncio.Event().wait()  # a keep-alive stream that never answers
            return 0

        store.keep_alive = hang  # type: ignore[method-assign]
        stuck_at = asyncio.get_running_loop().time()
        await asyncio.wait_for(session.lost.wait(), timeout=5)
        assert session.lost_reason == "no keep-alive succeeded for a whole ttl"
        assert asyncio.get_running_loop().time() - stuck_at <= session.ttl_s + 0.5
    finally:
        await session.close(revoke=False)


async def test_a_registration_reregisters_under_a_new_lease_after_a_loss(store: Store) -> None:
    lost: list[str] = []
    member = pb.Member(id="a-1", address="127.0.0.1:1")

    async def register(lease: int) -> None:
        await store.register_agent(member, lease=lease)

    registration = LeasedRegistration(store, 3, register, holder="agent", on_lost=lost.append)
    await registration.start()
    try:
        first = registration.lease_id
        assert first != 0
        await store.revoke_lease(first)  # the key goes with it

        async def registered_again() -> bool:
            entries, _ = await store.list_agents()
            return [e.lease for e in entries] == [registration.lease_id] != [first]

        await eventually(registered_again, timeout=5, what="the agent registered again")
        assert lost == ["etcd reports the lease expired"]
        assert registration.losses == 1
    finally:
        await registration.close()
    entries, _ = await store.list_agents()
    assert entries == []  # closing revoked the lease: deregistered at once


async def test_a_holder_whose_reaction_fails_is_still_registered_again(store: Store) -> None:
    async def register(lease: int) -> None:
        await store.register_agent(pb.Member(id="a-2", address="127.0.0.1:2"), lease=lease)

    def explode(reason: str) -> None:
        raise RuntimeError("the holder's own bug")

    registration = LeasedRegistration(store, 3, register, holder="agent", on_lost=explode)
    await registration.start()
    try:
        first = registration.lease_id
        await store.revoke_lease(first)

        async def registered_again() -> bool:
            return registration.lease_id not in (0, first)

        await eventually(registered_again, 5, "the registration to be renewed")
    finally:
        await registration.close()


async def test_a_failed_first_registration_raises_and_leaves_no_lease(store: Store) -> None:
    async def refuse(lease: int) -> None:
        raise OSError("no")

    registration = LeasedRegistration(store, 3, refuse, holder="agent")
    with pytest.raises(OSError, match="no"):
        await registration.start()
    assert registration.lease_id == 0
    await registration.close()
