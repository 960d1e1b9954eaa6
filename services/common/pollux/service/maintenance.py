"""etcd kept healthy by the schedulers: compaction, defragmentation, NOSPACE recovery.

etcd keeps every revision until compacted and the freed pages until defragmented; at its quota
it raises NOSPACE and serves only reads and deletes (no submit, no lease grant, so no new
leader). The leader compacts to the revision it saw `compact_retention_s` ago and defragments
one member at a time once enough of its file is free; every replica watches the alarm, says
so while it is raised, and recovers (compact, defragment, disarm once the file shrank) as soon
as deletes or a raised quota made room. docs/architecture.md §3 has the whole story.

`needs_defragment` and `compaction_target` are the pure decisions; `EtcdMaintainer` is the
loop around them over `pollux.service.etcd.maintenance.EtcdMaintenance`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import prometheus_client
import structlog

from pollux.service.etcd.errors import NOSPACE_MESSAGE, StoreError
from pollux.service.etcd.kv import EtcdKV
from pollux.service.etcd.maintenance import EtcdMaintenance, MemberStatus
from pollux.service.etcd_target import split_endpoints

log = structlog.get_logger(__name__)

NOSPACE = prometheus_client.Gauge(
    "pollux_etcd_nospace", "1 while etcd's NOSPACE alarm is raised (the cluster takes no writes)."
)
DB_BYTES = prometheus_client.Gauge(
    "pollux_etcd_db_bytes", "etcd database file size per member.", ["member"]
)
MAINTENANCE = prometheus_client.Counter(
    "pollux_etcd_maintenance_total",
    "etcd maintenance actions taken (compact, defragment, disarm).",
    ["action"],
)

RECOVERED_SHARE = 0.9
"""A NOSPACE alarm is disarmed once the database file is at most this share of its size when
the alarm was seen (space was freed); disarming sooner would only raise it again."""


@dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """When to compact and defragment.

    Attributes:
        interval_s: Seconds between checks (a tenth of it while NOSPACE is raised).
        compact_retention_s: History kept by the leader's compaction.
        defrag_min_bytes: A member is defragmented only with at least this many free bytes...
        defrag_ratio: ...making up at least this share of its file.
    """

    interval_s: float = 60.0
    compact_retention_s: float = 300.0
    defrag_min_bytes: int = 64 * 1024 * 1024
    defrag_ratio: float = 0.5

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        if self.interval_s <= 0:
            out.append("interval_s: must be > 0")
        if self.compact_retention_s < self.interval_s:
            out.append("compact_retention_s: must be >= interval_s")
        if self.defrag_min_bytes < 0:
            out.append("defrag_min_bytes: must be >= 0")
        if not 0 < self.defrag_ratio <= 1:
            out.append("defrag_ratio: must be in (0, 1]")
        return out


def needs_defragment(status: MemberStatus, settings: MaintenanceSettings) -> bool:
    """Whether a member's file holds enough free pages to be worth a defragmentation."""
    free = status.db_size - status.db_in_use
    return free >= settings.defrag_min_bytes and free >= settings.defrag_ratio * status.db_size


def compaction_target(
    samples: deque[tuple[float, int]], now: float, retention_s: float
) -> int | None:
    """The newest revision seen at least `retention_s` before `now` (older samples dropped)."""
    target = None
    while samples and now - samples[0][0] >= retention_s:
        target = samples.popleft()[1]
    return target


class EtcdMaintainer:
    """The maintenance loop of one scheduler replica.

    Args:
        endpoints: Every etcd member, comma-separated (the services' `etcd.endpoint`).
        timeout_s: Deadline of an ordinary etcd request.
        settings: When to compact and defragment.
        leading: Whether this replica leads now (routine compaction and defragmentation are
            the leader's; NOSPACE recovery is everyone's).
        connect: Opens a connection to one member (tests inject their own).
    """

    def __init__(
        self,
        endpoints: str,
        *,
        timeout_s: float,
        settings: MaintenanceSettings,
        leading: Callable[[], bool],
        connect: Callable[[str], asyncio.Future[EtcdKV]] | None = None,
    ) -> None:
        self.members = [f"{host}:{port}" for host, port in split_endpoints(endpoints)]
        self.settings = settings
        self._leading = leading
        self._timeout_s = timeout_s
        self._connect = connect
        self._stores: dict[str, EtcdKV] = {}
        self._samples: deque[tuple[float, int]] = deque()
        self._full_size = 0
        self._told_at = 0.0
        self.nospace = False
        """Whether the last check found the NOSPACE alarm raised."""

    def warnings(self) -> list[str]:
        """Lines for ClusterStatus: what is wrong with etcd now, if anything."""
        return [NOSPACE_MESSAGE] if self.nospace else []

    async def run(self) -> None:
        """Check every interval (faster while NOSPACE is raised) until cancelled."""
        try:
            while True:
                try:
                    await self.check()
                except StoreError as error:
                    log.warning("etcd_maintenance_failed", error=str(error))
                period = self.settings.interval_s
                await asyncio.sleep(period / 10 if self.nospace else period)
        finally:
            for store in self._stores.values():
                with contextlib.suppress(Exception):
                    await store.close()

    async def _store(self, member: str) -> EtcdMaintenance:
        store = self._stores.get(member)
        if store is None:
            if self._connect is not None:
                store = await self._connect(member)
            else:
                store = await EtcdKV.connect(member, timeout_s=self._timeout_s)
            self._stores[member] = store
        return EtcdMaintenance(store)

    async def _statuses(self) -> dict[str, MemberStatus]:
        found = {}
        for member in self.members:
            try:
                found[member] = await (await self._store(member)).member_status()
            except StoreError as error:  # a member down is etcd's business, not a stop
                log.info("etcd_member_unreachable", member=member, error=str(error))
        return found

    async def check(self) -> None:
        """One pass: measure every member, then recover, compact or defragment as needed."""
        statuses = await self._statuses()
        for member, status in statuses.items():
            DB_BYTES.labels(member).set(status.db_size)
        raised = any("NOSPACE" in s.alarms for s in statuses.values())
        NOSPACE.set(1 if raised else 0)
        if raised:
            await self._recover(statuses)
            return
        if self.nospace:
            log.info("etcd_space_recovered")
        self.nospace = False
        self._full_size = 0
        if not statuses or not self._leading():
            self._samples.clear()
            return
        now = time.monotonic()
        self._samples.append((now, max(s.revision for s in statuses.values())))
        target = compaction_target(self._samples, now, self.settings.compact_retention_s)
        if target is not None:
            member = next(iter(statuses))
            await (await self._store(member)).compact(target)
            MAINTENANCE.labels("compact").inc()
            log.info("etcd_compacted", revision=target)
        for member, status in statuses.items():
            if needs_defragment(status, self.settings):
                await self._defragment(member, status)
                break  # one member per pass: the others keep serving meanwhile

    async def _defragment(self, member: str, status: MemberStatus) -> None:
        log.info("etcd_defragmenting", member=member, db_size=status.db_size)
        await (await self._store(member)).defragment()
        MAINTENANCE.labels("defragment").inc()

    async def _recover(self, statuses: dict[str, MemberStatus]) -> None:
        size = max(s.db_size for s in statuses.values())
        self._full_size = max(self._full_size, size)
        self.nospace = True
        now = time.monotonic()
        if now - self._told_at >= self.settings.interval_s:
            self._told_at = now
            log.error("etcd_out_of_space", db_size=size, message=NOSPACE_MESSAGE)
        first = next(iter(statuses))
        await (await self._store(first)).compact(max(s.revision for s in statuses.values()))
        for member in statuses:
            await (await self._store(member)).defragment()
        MAINTENANCE.labels("defragment").inc()
        after = await self._statuses()
        if after and max(s.db_size for s in after.values()) <= RECOVERED_SHARE * self._full_size:
            await (await self._store(first)).disarm_nospace()
            MAINTENANCE.labels("disarm").inc()
            self.nospace = False
            self._full_size = 0
            NOSPACE.set(0)
            log.warning("etcd_nospace_disarmed", db_size=max(s.db_size for s in after.values()))
