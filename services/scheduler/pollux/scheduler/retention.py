"""Finished jobs leave etcd: their side state after a grace period, their records after retention.

Nothing else removes what a job leaves behind, and every round and ClusterStatus read grows
with it until etcd's quota stops the cluster. The leader sweeps every `sweep_interval_s`: a
job ended over `finished_grace_s` ago loses its side state (replica statuses, model, profile,
allocation, idempotency key: `store.side_state_deletes`; the grace lets a late exit report
land and `describe` show the last replicas), except that the newest run of each owner's job
name keeps its model and profile for `profile_days` more (at most `profile_max_jobs`), so a
re-run still starts from what its name measured (`pollux.service.seeding`); a job ended over
`retention_days` ago loses its record and timeline too (`store.record_deletes`: GetJob then
answers NOT_FOUND). The plan is a pure function of the records and the clock (`plan_sweep`);
`sweep` applies it in fenced transactions (a deposed leader deletes nothing), each conditional
on the record's mod revision, so a record that changed meanwhile is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import prometheus_client
import structlog

from pollux.scheduler.config import RetentionConfig
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
    "Finished jobs cleaned up by the leader, by what went (side_state, side_state_but_profile, "
    "record).",
    ["what"],
)
JOBS_PER_TXN = 40
"""Jobs per sweep transaction (up to 6 deletes each, under etcd's default 128 ops)."""
_WHOLE, _KEPT, _RECORD = "side_state", "side_state_but_profile", "record"
"""What a sweep removes of a job (also the `what` label of SWEPT)."""


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What one sweep deletes.

    Attributes:
        side_state: Finished jobs (record, mod revision) whose side state goes; records stay.
        kept: Finished jobs whose side state goes except their model and profile.
        expired: Finished jobs whose record goes too.
    """

    side_state: list[Entry[pb.Job]] = field(default_factory=list)
    kept: list[Entry[pb.Job]] = field(default_factory=list)
    expired: list[Entry[pb.Job]] = field(default_factory=list)


@dataclass(slots=True)
class Swept:
    """What this leader already removed, so a sweep of 100k finished jobs writes nothing new.

    Attributes:
        whole: Jobs whose whole side state went.
        kept: Jobs whose side state went except their model and profile.
    """

    whole: set[str] = field(default_factory=set)
    kept: set[str] = field(default_factory=set)


def plan_sweep(
    jobs: Iterable[Entry[pb.Job]],
    now: float,
    *,
    retention: RetentionConfig,
    swept: Swept,
) -> SweepPlan:
    """Which finished jobs lose their side state, and which their record, at `now`.

    Args:
        jobs: Every job record.
        now: Wall-clock seconds.
        retention: The grace, the profile window and cap, and the record retention.
        swept: What this leader already removed (skipped).
    """
    jobs = list(jobs)
    grace_s = retention.finished_grace_s
    profile_s = grace_s + retention.profile_days * 86400
    plan = SweepPlan()
    graced: list[tuple[Entry[pb.Job], float]] = []
    for entry in jobs:
        job = entry.value
        if job.state not in TERMINAL or not job.HasField("finish_time"):
            continue
        ended = job.finish_time.ToNanoseconds() / 1e9
        age = now - ended
        if age >= retention.retention_days * 86400:
            plan.expired.append(entry)
        elif age >= grace_s:
            graced.append((entry, ended))
    newest = _newest_of_each_name(jobs)
    candidates = sorted(
        (
            (entry, ended)
            for entry, ended in graced
            if entry.value.id in newest and now - ended < profile_s
        ),
        key=lambda item: (-item[1], item[0].value.id),
    )
    keep = {entry.value.id for entry, _ in candidates[: retention.profile_max_jobs]}
    for entry, _ in graced:
        job_id = entry.value.id
        if job_id in keep:
            if job_id not in swept.kept and job_id not in swept.whole:
                plan.kept.append(entry)
        elif job_id not in swept.whole:  # includes a kept one now superseded or too old
            plan.side_state.append(entry)
    return plan


def _newest_of_each_name(jobs: list[Entry[pb.Job]]) -> set[str]:
    """The id of each owner's newest job (by creation) of each name, finished or not."""
    newest: dict[tuple[str, str], pb.Job] = {}
    for entry in jobs:
        job = entry.value
        name = (job.owner, job.spec.name)
        held = newest.get(name)
        if held is None or _created(job) > _created(held):
            newest[name] = job
    return {job.id for job in newest.values()}


def _created(job: pb.Job) -> tuple[int, str]:
    return job.create_time.ToNanoseconds(), job.id


async def sweep(store: Store, plan: SweepPlan, fence: Fence, swept: Swept) -> tuple[int, int]:
    """Apply a plan in fenced batches; returns (side states removed, records removed).

    `swept` is updated with what went; a deleted record leaves it.

    Raises:
        FenceLost: Leadership was lost (nothing more is deleted).
    """
    work = (
        [(e, _WHOLE) for e in plan.side_state]
        + [(e, _KEPT) for e in plan.kept]
        + [(e, _RECORD) for e in plan.expired]
    )
    counts = {_WHOLE: 0, _KEPT: 0, _RECORD: 0}
    for start in range(0, len(work), JOBS_PER_TXN):
        batch = work[start : start + JOBS_PER_TXN]
        if not await _apply(store, batch, fence):
            # A record changed since it was read (deleted or edited by its user): go job by
            # job, skipping the one that moved; the next sweep reads it again.
            batch = [item for item in batch if await _apply(store, [item], fence)]
        for entry, what in batch:
            job_id = entry.value.id
            counts[what] += 1
            SWEPT.labels(what).inc()
            swept.kept.discard(job_id)
            swept.whole.discard(job_id)
            if what == _WHOLE:
                swept.whole.add(job_id)
            elif what == _KEPT:
                swept.kept.add(job_id)
    return counts[_WHOLE] + counts[_KEPT], counts[_RECORD]


async def _apply(store: Store, batch: list[tuple[Entry[pb.Job], str]], fence: Fence) -> bool:
    """One fenced transaction for a batch; False if a record changed since it was read."""
    keys = store.keys
    ops: list[Put | Delete] = []
    expect = []
    for entry, what in batch:
        ops.extend(side_state_deletes(keys, entry.value, keep_profile=what == _KEPT))
        if what == _RECORD:
            ops.extend(record_deletes(keys, entry.value))
        expect.append(Expect(keys.job(entry.value.id), entry.mod_revision))
    try:
        await store.txn(ops, expect=expect, fence=fence)
    except Conflict:
        return False
    return True
