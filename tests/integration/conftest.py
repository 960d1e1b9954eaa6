"""Integration fixtures: one real etcd per session, a fresh key root and store per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from pollux.service.store import Delete, Store
from tests.etcd_server import EtcdServer


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def root() -> str:
    return f"/pollux-test/{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(etcd: EtcdServer, root: str) -> AsyncIterator[Store]:
    store = await Store.connect(etcd.endpoint, root)
    try:
        yield store
    finally:
        await store.txn([Delete(root.encode() + b"/", prefix=True)])
        await store.close()
