"""People's API tokens: verified by every scheduler replica, stored hashed in etcd.

A token record (`pb.ApiToken`) is read from etcd on first use and cached for `CACHE_S`, so a
busy client costs no etcd read per call, and a revoked or expired token is refused by every
replica within that time (at once by the replica that revoked it). Expired records are
deleted by the leader's retention sweep (`expired`), so the prefix holds only live tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from pollux.service import auth
from pollux.service.errors import Unauthenticated
from pollux.service.keys import Kind
from pollux.service.store import Entry, Store
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

CACHE_S = 2.0
"""How long a replica trusts what it read of a token (revocation delay on other replicas)."""
MAX_CACHED = 10_000


class TokenBook:
    """Verifies bearer tokens against their records (see the module doc).

    Args:
        store: The cluster state.
        clock: Wall-clock seconds (expiry) — monotonic time bounds the cache.
    """

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._cache: dict[str, tuple[float, pb.ApiToken | None]] = {}

    def forget(self, token_id: str) -> None:
        """Drop a cached record (after a revoke on this replica)."""
        self._cache.pop(token_id, None)

    async def _record(self, token_id: str, max_age_s: float) -> pb.ApiToken | None:
        now = time.monotonic()
        cached = self._cache.get(token_id)
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        entry = await self.store.get(self.store.keys.token(token_id), pb.ApiToken)
        record = entry.value if entry is not None else None
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()  # unknown ids cannot grow it without bound
        self._cache[token_id] = (now, record)
        return record

    async def verify(self, text: str, *, max_age_s: float | None = None) -> auth.Principal:
        """The principal a token proves, from a record at most `max_age_s` old (`CACHE_S`).

        Raises:
            Unauthenticated: Malformed, unknown, revoked or expired.
        """
        parsed = auth.parse_token(text)
        if parsed is None:
            raise Unauthenticated("that is not a Pollux token (pollux_<id>_<secret>)")
        token_id, secret = parsed
        record = await self._record(token_id, CACHE_S if max_age_s is None else max_age_s)
        if record is None or not auth.token_matches(secret, record.secret_sha256):
            raise Unauthenticated(
                f"token {token_id} is unknown or revoked: ask an admin for a new one "
                "(pollux-cli admin token create)"
            )
        if record.HasField("expire_time") and record.expire_time.ToNanoseconds() <= int(
            self.clock() * 1e9
        ):
            raise Unauthenticated(
                f"token {token_id} expired at {record.expire_time.ToJsonString()}: "
                "ask an admin for a new one"
            )
        return auth.Principal(record.user, record.role, record.tenant, via="token")

    async def expired(self) -> list[Entry[pb.ApiToken]]:
        """Every token past its expiry (the retention sweep deletes them)."""
        entries, _ = await self.store.scan(self.store.keys.prefix(Kind.TOKENS), pb.ApiToken)
        now = int(self.clock() * 1e9)
        return [
            e
            for e in entries
            if e.value.HasField("expire_time") and e.value.expire_time.ToNanoseconds() <= now
        ]
