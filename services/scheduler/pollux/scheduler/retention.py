"""Finished jobs leave etcd: their side state after a grace period, their records after retention.

Nothing else ever removes what a job leaves behind, and every round and ClusterStatus read
grows with it, until etcd's quota stops the cluster. The leader sweeps every
`sweep_interval_s`:

- a job that ended more than `finished_grace_s` ago loses its side state — replica statuses,
  model, observation profile, allocation and idempotency key (`store.side_state_deletes`). The
  grace lets a launcher's late exit report land and lets `describe` show the last replicas for
  a while; a SubmitJob retried after it creates a new job;
- a job that ended more than `retention_days` ago loses its record and its timeline too
  (`store.record_deletes`), so GetJob answers NOT_FOUND from then on; until then it stays
  queryable, and its timeline can be plotted.

The plan is a pure function of the job records and the clock (`plan_sweep`); `sweep` applies
it in fenced transactions (a deposed leader deletes nothing), each conditional on the record's
mod revision, so a record that changed meanwhile (deleted by its user) is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import prometheus_client
import structlog

from pollux.scheduler.lifecycle import TERMINAL
from pollux.service.store import (
    Conflict,
    Delete,
    Entry,
    Expect,
    Fence,
    Put,
    Store,
    record_deletes,
    side_state_deletes,
)
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

SWEPT = prometheus_client.Counter(
    "pollux_scheduler_retention_swept_total",
    "Finished jobs cleaned up by the leader, by what went (side_state, record).",
    ["what"],
)
JOBS_PER_TXN = 40
"""Jobs per sweep transaction (up to 6 deletes each, under etcd's default 128 ops)."""


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What one sweep deletes.

    Attributes:
        side_state: Finished jobs (record, mod revision) whose side state goes; records stay.
        expired: Finished jobs whose record goes too.
    """

    side_state: list[Entry[pb.Job]] = field(default_factory=list)
    expired: list[Entry[pb.Job]] = field(default_factory=list)


def plan_sweep(
    jobs: Iterable[Entry[pb.Job]],
    now: float,
    *,
    grace_s: float,
    retention_s: float,
    swept: set[str],
) -> SweepPlan:
    """Which finished jobs lose their side state, and which their record, at `now`.

    Args:
        jobs: Every job record.
        now: Wall-clock seconds.
        grace_s: Side state goes this long after a job ends.
        retention_s: The record goes this long after a job ends.
        swept: Jobs whose side state this leader already removed (skipped, so a sweep of
            100k finished jobs writes nothing new).
    """
    plan = SweepPlan()
    for entry in jobs:
        job = entry.value
        if job.state not in TERMINAL or not job.HasField("finish_time"):
            continue
        age = now - job.finish_time.ToNanoseconds() / 1e9
        if age >= retention_s:
            plan.expired.append(entry)
        elif age >= grace_s and job.id not in swept:
            plan.side_state.append(entry)
    return plan


async def sweep(store: Store, plan: SweepPlan, fence: Fence, swept: set[str]) -> tuple[int, int]:
    """Apply a plan in fenced batches; returns (side states removed, records removed).

    `swept` is updated: jobs whose side state went are added, deleted records removed.

    Raises:
        FenceLost: Leadership was lost (nothing more is deleted).
    """
    work = [(e, False) for e in plan.side_state] + [(e, True) for e in plan.expired]
    counts = [0, 0]
    for start in range(0, len(work), JOBS_PER_TXN):
        batch = work[start : start + JOBS_PER_TXN]
        if not await _apply(store, batch, fence):
            # A record changed since it was read (deleted or edited by its user): go job by
            # job, skipping the one that moved; the next sweep reads it again.
            batch = [item for item in batch if await _apply(store, [item], fence)]
        for entry, expired in batch:
            counts[expired] += 1
            SWEPT.labels("record" if expired else "side_state").inc()
            if expired:
                swept.discard(entry.value.id)
            else:
                swept.add(entry.value.id)
    return counts[0], counts[1]


async def _apply(store: Store, batch: list[tuple[Entry[pb.Job], bool]], fence: Fence) -> bool:
    """One fenced transaction for a batch; False if a record changed since it was read."""
    keys = store.keys
    ops: list[Put | Delete] = []
    expect = []
    for entry, expired in batch:
        ops.extend(side_state_deletes(keys, entry.value))
        if expired:
            ops.extend(record_deletes(keys, entry.value))
        expect.append(Expect(keys.job(entry.value.id), entry.mod_revision))
    try:
        await store.txn(ops, expect=expect, fence=fence)
    except Conflict:
        return False
    return True
