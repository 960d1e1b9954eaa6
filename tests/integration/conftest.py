"""Fixtures of the integration tier: one scheduler replica on the session's etcd."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pollux.service.store import Store
from tests.etcd_server import EtcdServer
from tests.integration.test_scheduler import Replica, config


@pytest.fixture
async def replica(etcd: EtcdServer, root: str, store: Store) -> AsyncIterator[Replica]:
    """A started scheduler replica ("s-1") under the test's key root, stopped afterwards."""
    r = await Replica(store, config(etcd, root, "s-1")).start()
    try:
        yield r
    finally:
        await r.stop()
