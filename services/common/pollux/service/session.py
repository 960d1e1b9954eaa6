"""One etcd lease kept alive, and one rule for when it is lost (after etcd's `concurrency.Session`).

Every lease holder of the control plane uses this module: scheduler replicas back their election
key with a `LeaseSession`; agents and launchers keep their registration with a
`LeasedRegistration`, which opens a new session and registers again whenever one is lost.

The rule for "lost" is the same everywhere: the lease is refreshed every ttl/3, and it is lost
as soon as etcd answers that it has expired, or once no refresh has succeeded for a whole ttl
since the last confirmation (after that etcd may have expired it and another process may act on
that, so its holder must behave as if it had). `lost` fires once and stays set; a lost session
is never revived, its holder opens a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog

from pollux.service.store import Store, StoreError, cancel_and_wait

log = structlog.get_logger(__name__)


class LeaseSession:
    """A lease of `ttl_s` seconds kept alive in the background until closed or lost.

    Args:
        store: The cluster state store.
        ttl_s: Lease time-to-live: the holder's keys outlive a dead holder by at most this long.
        holder: What holds the lease, for logs ("leader", "agent", "node").
        clock: Monotonic seconds (injected for tests).
        on_confirmed: Called with the clock time a successful grant or refresh was *sent*
            (etcd's ttl runs from some time after it): a launcher's watchdog deadline.
    """

    def __init__(
        self,
        store: Store,
        ttl_s: int,
        *,
        holder: str,
        clock: Callable[[], float] = time.monotonic,
        on_confirmed: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.holder = holder
        self.lease_id = 0
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._clock = clock
        self._on_confirmed = on_confirmed
        self._confirmed_at = 0.0
        """When the last successful grant or refresh was sent: a conservative anchor, since
        etcd restarts the ttl when it receives the request, which is later."""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Grant the lease and start keeping it alive.

        Raises:
            StoreError: etcd did not grant a lease.
        """
        sent_at = self._clock()
        self.lease_id = await self.store.grant_lease(self.ttl_s)
        self._confirm(sent_at)
        self._task = asyncio.create_task(
            self._keep_alive(), name=f"{self.holder}-lease-{self.lease_id:x}"
        )

    @property
    def alive(self) -> bool:
        """Whether the lease is granted and not (known to be) lost."""
        return self.lease_id != 0 and not self.lost.is_set()

    def expires_within(self) -> float:
        """Seconds until the lease may have expired at etcd, counted from the last confirmation."""
        return max(0.0, self._confirmed_at + self.ttl_s - self._clock())

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
            log.warning("lease_lost", holder=self.holder, lease=f"{self.lease_id:x}", reason=reason)

    async def refresh(self) -> bool:
        """Refresh once and apply the rule; returns whether the lease is still held."""
        if self.lost.is_set():
            return False
        # A refresh may not outlive the lease: one that hangs (etcd frozen, a stuck stream)
        # is cut off when a ttl has passed since the last confirmation, and the rule applies.
        sent_at = self._clock()
        budget = max(self._confirmed_at + self.ttl_s - sent_at, 0.001)
        try:
            remaining = await asyncio.wait_for(self.store.keep_alive(self.lease_id), budget)
        except (StoreError, OSError, TimeoutError) as error:
            log.warning("lease_keepalive_failed", holder=self.holder, error=repr(error))
            if self._clock() - self._confirmed_at >= self.ttl_s:
                self._lose("no keep-alive succeeded for a whole ttl")
            return not self.lost.is_set()
        if remaining <= 0:
            self._lose("etcd reports the lease expired")
            return False
        self._confirm(sent_at)
        return True

    def _confirm(self, sent_at: float) -> None:
        self._confirmed_at = sent_at
        if self._on_confirmed is not None:
            self._on_confirmed(sent_at)

    async def _keep_alive(self) -> None:
        while await self.refresh():
            await asyncio.sleep(self.ttl_s / 3)

    async def close(self, *, revoke: bool = True) -> None:
        """Stop the keep-alive and (by default) revoke the lease, deleting its keys now."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        was_alive = self.alive
        if not self.lost.is_set():
            self.lost_reason = "closed"
            self.lost.set()
        if revoke and was_alive:
            try:
                await self.store.revoke_lease(self.lease_id)
            except (StoreError, OSError) as error:
                log.warning("lease_revoke_failed", holder=self.holder, error=str(error))


class LeasedRegistration:
    """A registration kept under a lease, renewed under a new lease whenever one is lost.

    Args:
        store: The cluster state store.
        ttl_s: Lease time-to-live.
        register: Writes the registration under the lease id it is given.
        holder: What registers, for logs ("agent", "node").
        on_lost: Called (synchronously) when a lease is lost, before registering again: a
            launcher stops its replicas there, since the cluster already counts it as gone.
        retry_s: Seconds between attempts to register again; ttl/3 by default.
        on_confirmed: Passed to every `LeaseSession` the registration opens.
    """

    def __init__(
        self,
        store: Store,
        ttl_s: int,
        register: Callable[[int], Awaitable[object]],
        *,
        holder: str,
        on_lost: Callable[[str], object] | None = None,
        retry_s: float | None = None,
        on_confirmed: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.holder = holder
        self._register = register
        self._on_lost = on_lost
        self._on_confirmed = on_confirmed
        self._retry_s = ttl_s / 3 if retry_s is None else retry_s
        self._session: LeaseSession | None = None
        self._task: asyncio.Task[None] | None = None
        self.losses = 0

    @property
    def lease_id(self) -> int:
        """The lease the registration is held under now, or 0 while it is not held."""
        session = self._session
        return session.lease_id if session is not None and session.alive else 0

    async def start(self) -> None:
        """Register once (errors propagate), then keep the registration in the background.

        Raises:
            StoreError: The first registration failed.
        """
        await self._open()
        self._task = asyncio.create_task(self._supervise(), name=f"{self.holder}-registration")

    async def _open(self) -> None:
        # The session is adopted only once the key is written under it; a failed write
        # revokes the new lease so nothing is left behind.
        session = LeaseSession(
            self.store, self.ttl_s, holder=self.holder, on_confirmed=self._on_confirmed
        )
        await session.start()
        try:
            await self._register(session.lease_id)
        except BaseException:
            await session.close(revoke=True)
            raise
        self._session = session
        log.info("registered", holder=self.holder, lease=f"{session.lease_id:x}")

    async def _supervise(self) -> None:
        while (session := self._session) is not None:
            await session.lost.wait()
            self.losses += 1
            if self._on_lost is not None:
                try:
                    self._on_lost(session.lost_reason)
                except Exception:  # the holder's reaction must not end the registration
                    log.exception("on_lost_failed", holder=self.holder)
            await session.close(revoke=False)
            while True:
                try:
                    await self._open()
                    break
                except (StoreError, OSError) as error:
                    log.warning("register_failed", holder=self.holder, error=str(error))
                    await asyncio.sleep(self._retry_s)

    async def close(self, *, revoke: bool = True) -> None:
        """Stop renewing and (by default) revoke the lease, which deregisters at once."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._session is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._session.close(revoke=revoke)
            self._session = None
