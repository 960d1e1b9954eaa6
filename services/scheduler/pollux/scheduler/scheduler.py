"""A scheduler replica: campaigns for leadership and, while leading, runs scheduling rounds.

Every replica serves reads and submits (the servicer); only the leader allocates. While
leading, rounds run every `interval_s` and on events (jobs, nodes, models or replica statuses
change), debounced; under `scheduling.event_rounds = "place"` (the default) an event round only
places jobs that never ran on free GPUs and the periodic rounds keep their own clock. Each
round's writes are fenced on the leader key, and losing the session cancels the round in
flight before anything else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from prometheus_client import Counter, Gauge, Histogram

from pollux.policy.registry import make_policy
from pollux.policy.types import Policy
from pollux.scheduler import accounting
from pollux.scheduler.accounting import day_of
from pollux.scheduler.cluster_metrics import CLUSTER
from pollux.scheduler.config import SchedulerConfig
from pollux.scheduler.cycle import KnownJob, Recorded, RoundPlan, plan_round
from pollux.scheduler.leader import Election, LeadershipLost
from pollux.scheduler.retention import Swept, plan_sweep, sweep
from pollux.scheduler.tokens import TokenBook
from pollux.service import audit
from pollux.service.keys import Kind
from pollux.service.mirror import ClusterMirror
from pollux.service.session import LeaseSession
from pollux.service.store import (
    MAX_TXN_BYTES,
    Conflict,
    Delete,
    Expect,
    Fence,
    FenceLost,
    Put,
    Snapshot,
    Store,
    StoreError,
    ValueTooLarge,
    cancel_and_wait,
    txn_bytes,
)
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

ROUNDS = Counter("pollux_scheduler_rounds_total", "Scheduling rounds", ["outcome"])
ROUND_SECONDS = Histogram("pollux_scheduler_round_seconds", "Round duration", ["phase"])
LEADER = Gauge("pollux_scheduler_is_leader", "1 while this replica leads")
JOBS_PER_TXN = 40
"""Jobs per commit transaction: 2 ops each stays under etcd's default 128 ops per txn."""

Group = tuple[list[Put | Delete], list[Expect]]


def chunked(groups: list[Group], *, max_jobs: int, max_bytes: int) -> list[list[Group]]:
    """Split per-job write groups into transactions by count and by serialized bytes, in order.

    A group weighs what it adds to a transaction request (`txn_bytes`: sizes add up exactly).
    A group is never split (a job's record and allocation change together); a group larger
    than `max_bytes` alone makes a transaction of its own (which the store then refuses).
    """
    out: list[list[Group]] = []
    current: list[Group] = []
    size = 0
    for group in groups:
        ops, expect = group
        weight = txn_bytes(ops, expect)
        if current and (len(current) >= max_jobs or size + weight > max_bytes):
            out.append(current)
            current, size = [], 0
        current.append(group)
        size += weight
    if current:
        out.append(current)
    return out


def commit_batches(groups: list[Group], fence: Fence) -> list[list[Group]]:
    """A round's job writes as the chunks of fenced transactions the store accepts, in order.

    Each chunk holds at most `JOBS_PER_TXN` jobs and, merged (`merged`) with the fence's
    compare, at most the store's `MAX_TXN_BYTES`. A job record is bounded (its spec by
    SubmitJob validation, its history by the lifecycle), so one job always fits.
    """
    budget = MAX_TXN_BYTES - txn_bytes((), fence=fence)
    return chunked(groups, max_jobs=JOBS_PER_TXN, max_bytes=budget)


def merged(chunk: list[Group]) -> Group:
    """One transaction's ops and compares from a chunk of per-job groups."""
    return [op for ops, _ in chunk for op in ops], [e for _, expect in chunk for e in expect]


@dataclass
class Leadership:
    """What a replica knows about leadership right now."""

    leading: bool = False
    fence: Fence | None = None


class Scheduler:
    """One scheduler replica.

    Args:
        store: The cluster state store.
        config: The replica's configuration.
        address: gRPC address other processes use to reach this replica.
        clock: Wall-clock seconds (injected for tests).
        on_leadership: Called with True/False when leadership is won or lost.
    """

    def __init__(
        self,
        store: Store,
        config: SchedulerConfig,
        address: str,
        *,
        clock: Callable[[], float] = time.time,
        on_leadership: Callable[[bool], object] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.member = pb.Member(id=config.id, address=address)
        self.clock = clock
        self.policy: Policy[Any] = make_policy(config.scheduling.policy_spec())
        """The policy the configuration names (pollux.policy.registry)."""
        self.rng = np.random.default_rng(config.scheduling.seed)
        self.leadership = Leadership()
        self.last_round = 0
        self._memory: Any = None
        """The policy's memory, as its last full round returned it (its own type)."""
        self._wake = asyncio.Event()
        self._on_leadership = on_leadership
        self._session: LeaseSession | None = None
        self._stopping = False
        self.mirror = ClusterMirror(store, on_change=self.trigger)
        """The active state, mirrored from etcd (pollux.service.mirror): what rounds read."""
        self._committed = 0
        """Revision of this term's last round commit (0: none yet this term)."""
        self._recorded: dict[str, Recorded] | None = None
        """Each job's decision as this term's records hold it (cycle.Recorded)."""
        self._known: dict[str, KnownJob] | None = None
        """Each active job's JobInfo as the last round built it (cycle.KnownJob)."""
        self._next_full = 0.0
        """Event-loop time of the next periodic (full) round under event_rounds = "place"."""

    def trigger(self) -> None:
        """Ask for a round soon (debounced); harmless on followers."""
        self._wake.set()

    async def run(self) -> None:
        """Mirror the cluster; campaign, lead, and campaign again after a loss; until cancelled."""
        CLUSTER.add(self.mirror)
        try:
            await self.mirror.start()
            await self._campaign_forever()
        finally:
            CLUSTER.remove(self.mirror)
            await self.mirror.stop()

    async def _campaign_forever(self) -> None:
        while not self._stopping:
            session = LeaseSession(self.store, self.config.lease_ttl_s, holder="leader")
            try:
                await session.start()
                self._session = session
                election = Election(session, self.member)
                fence = await election.campaign()
                await self._lead(session, fence)
            except (LeadershipLost, StoreError, OSError) as error:
                log.warning("leadership_interrupted", error=str(error))
                await asyncio.sleep(0.5)
            finally:
                self._set_leading(None)
                await session.close(revoke=True)

    async def stop(self) -> None:
        """Resign (revoking the lease, so a standby takes over at once)."""
        self._stopping = True
        if self._session is not None:
            await self._session.close(revoke=True)

    def _set_leading(self, fence: Fence | None) -> None:
        leading = fence is not None
        changed = leading != self.leadership.leading
        self.leadership = Leadership(leading, fence)
        LEADER.set(1 if leading else 0)
        if changed:
            log.info("leadership_changed", leading=leading, scheduler_id=self.member.id)
            if self._on_leadership is not None:
                self._on_leadership(leading)

    async def _lead(self, session: LeaseSession, fence: Fence) -> None:
        self._set_leading(fence)
        self._memory = None  # warm starts are per leader term, keyed by job id
        self._committed = 0  # a term's first round checks the mirror against etcd
        self._recorded = None  # ...and records every job
        self._known = None
        decisions = await self.store.latest_decisions(1)
        self.last_round = decisions[0].round if decisions else 0
        janitor = asyncio.create_task(self._retain(fence))
        placement = False  # a term starts with a full round
        loop = asyncio.get_running_loop()
        try:
            while not session.lost.is_set():
                # The periodic clock runs from each full round's start (set before the round,
                # so that a full round that fails still waits an interval for the next).
                full_due = loop.time() + self.config.scheduling.interval_s
                if not placement:
                    self._next_full = full_due
                round_task = asyncio.create_task(self.run_round(fence, placement=placement))
                lost = asyncio.create_task(session.lost.wait())
                done, _ = await asyncio.wait(
                    {round_task, lost}, return_when=asyncio.FIRST_COMPLETED
                )
                if lost in done:
                    await cancel_and_wait(round_task)  # losing the lease cancels the round
                    raise LeadershipLost()
                lost.cancel()
                try:
                    decision = round_task.result()
                except FenceLost as error:
                    raise LeadershipLost() from error
                except Conflict as error:
                    log.info("round_conflict_retrying", key=error.key.decode())
                    ROUNDS.labels("conflict").inc()
                    await asyncio.sleep(0.1)
                    continue
                except ValueTooLarge as error:
                    # A bound was broken (a bug, not a lost leadership): keep leading, say so
                    # loudly, and retry at the next interval rather than re-campaign in a loop.
                    log.error("round_too_large", key=error.key.decode(), error=str(error))
                    ROUNDS.labels("too_large").inc()
                else:
                    if not decision.placement:  # asked to place, it ran full (tenants)
                        self._next_full = full_due
                placement = await self._wait_for_next()
        finally:
            await cancel_and_wait(janitor)

    async def _retain(self, fence: Fence) -> None:
        """Sweep finished jobs out of etcd every `sweep_interval_s` while leading (retention.py)."""
        retention = self.config.retention
        swept = Swept()
        sampled = self.clock()
        while True:
            try:
                now = self.clock()
                active = [e.value for e in self.mirror.snapshot().jobs.values()]
                speedups = await accounting.speedups_of(self.store, active)
                usage = accounting.sample(active, speedups, since=sampled, now=now)
                sampled = now  # a sample that fails to store is lost, never booked twice
                await accounting.record(self.store, usage, fence)
                jobs, _ = await self.store.list_jobs()
                plan = plan_sweep(jobs, self.clock(), retention=retention, swept=swept)
                if plan.side_state or plan.kept or plan.expired:
                    side_state, records = await sweep(self.store, plan, fence, swept)
                    log.info("finished_jobs_swept", side_state=side_state, records=records)
                await self._prune_records(fence)
            except FenceLost:
                return  # the round loop notices the lost leadership
            except StoreError as error:
                log.warning("retention_sweep_failed", error=str(error))
            await asyncio.sleep(retention.sweep_interval_s)

    async def _prune_records(self, fence: Fence) -> None:
        """Delete what outlived its retention: audit and usage records, expired tokens."""
        retention = self.config.retention
        now = self.clock()
        ops = await audit.prune_ops(
            self.store,
            now_s=now,
            max_age_s=retention.audit_days * 86400,
            max_records=retention.audit_max_records,
        )
        usage = self.store.keys.prefix(Kind.USAGE)
        first_kept = self.store.keys.usage_day(day_of(now - retention.usage_days * 86400))
        ops.append(Delete(usage, end=first_kept))
        ops.extend(Delete(e.key) for e in await TokenBook(self.store, self.clock).expired())
        await self.store.txn(ops, fence=fence)

    async def _wait_for_next(self) -> bool:
        """Wait for the next round: the periodic one, or an event's; True for a placement round.

        Under event_rounds = "full" any round restarts the periodic timer; under "place" an
        event round only places new jobs, and the periodic rounds keep their own clock.
        """
        scheduling = self.config.scheduling
        loop = asyncio.get_running_loop()
        place = scheduling.event_rounds == "place"
        timeout = max(0.0, self._next_full - loop.time()) if place else scheduling.interval_s
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            self._wake.clear()
            return False
        await asyncio.sleep(scheduling.debounce_s)
        self._wake.clear()
        return place and loop.time() < self._next_full

    async def _read(self) -> Snapshot:
        """What a round plans from: the mirror, once it is known to be fresh.

        Fresh means: it holds this term's last commit, or, for a term's first round, every
        write made before the round began (`ClusterMirror.catch_up`). A round whose mirror is
        not fresh within an interval (a watch re-listing) reads etcd in full instead: a round
        never plans from a state older than what this leader wrote.
        """
        wait = min(self.config.scheduling.interval_s, 5.0)
        if self._committed:
            fresh = await self.mirror.jobs.wait_for(self._committed, wait)
        else:  # a term's first round: everything written before it, by anyone
            fresh = await self.mirror.catch_up(wait)
        if fresh:
            return self.mirror.snapshot()
        log.warning("mirror_lagging", committed=self._committed, mirrored=self.mirror.jobs.revision)
        return await self.store.snapshot()

    async def run_round(self, fence: Fence, *, placement: bool = False) -> pb.Decision:
        """Snapshot → plan → fenced commit → decision record.

        With `placement`, only jobs that never ran are placed on free GPUs (cycle.plan_round).
        """
        number = self.last_round + 1
        with structlog.contextvars.bound_contextvars(round=number, role="leader"):
            started = time.perf_counter()
            snapshot = await self._read()
            read = time.perf_counter()
            # CPU-bound: planned in a worker thread so the event loop keeps serving RPCs
            # (the GIL is handed back every few milliseconds instead of after the round).
            plan = await asyncio.to_thread(
                plan_round,
                snapshot,
                self.policy,
                self._memory,
                self.rng,
                now=self.clock(),
                round_number=number,
                scheduler_id=self.member.id,
                recorded=self._recorded,
                known=self._known,
                placement=placement,
            )
            planned = time.perf_counter()
            await self._commit(plan, fence, number)
            committed = time.perf_counter()
            self._memory = plan.memory
            self._recorded = plan.recorded
            self._known = plan.known
            self.last_round = number
            ROUND_SECONDS.labels("snapshot").observe(read - started)
            ROUND_SECONDS.labels("policy").observe(planned - read)
            ROUND_SECONDS.labels("commit").observe(committed - planned)
            ROUNDS.labels("committed").inc()
            log.info(
                "round_committed",
                jobs=plan.active_jobs,
                recorded=len(plan.decision.jobs),
                changed=len(plan.jobs),
                gpus=plan.held_gpus,
                placement=plan.decision.placement,
                objective=round(plan.decision.objective, 6),
                snapshot_ms=round((read - started) * 1e3, 1),
                policy_ms=round((planned - read) * 1e3, 1),
                commit_ms=round((committed - planned) * 1e3, 1),
                revision=snapshot.revision,
            )
            return plan.decision

    async def _commit_chunk(self, chunk: list[Group], fence: Fence) -> None:
        """Commit one chunk; a job changed since the snapshot is left out, not the round.

        A burst of cancels or submits changes job records while a round commits; re-planning
        the whole round at each such conflict could keep every round from finishing while
        the burst lasts. The job that moved is planned again by the next round instead (safe:
        each job's writes are independent, see `cycle.takes_gpus`).
        """
        while chunk:
            ops, expect = merged(chunk)
            try:
                self._committed = await self.store.txn(ops, expect=expect, fence=fence)
                return
            except Conflict as error:
                changed = set(error.keys)
                moved = [g for g in chunk if any(e.key in changed for e in g[1])]
                if not moved:
                    raise
                log.info("round_jobs_changed_concurrently", jobs=len(moved))
                ROUNDS.labels("job_skipped").inc(len(moved))
                chunk = [g for g in chunk if g not in moved]

    async def _commit(self, plan: RoundPlan[Any], fence: Fence, number: int) -> None:
        keys = self.store.keys
        groups: list[Group] = []
        for job, expected in plan.jobs:
            ops: list[Put | Delete] = [Put(keys.job(job.id), job.SerializeToString())]
            if job.id in plan.allocations:
                allocation = plan.allocations[job.id]
                if allocation is None:
                    ops.append(Delete(keys.allocation(job.id)))
                else:
                    ops.append(Put(keys.allocation(job.id), allocation.SerializeToString()))
            groups.append((ops, [Expect(keys.job(job.id), expected)]))
        # Each job's record and allocation change together; a round's jobs are committed in
        # chunks (etcd limits ops and bytes per txn), every chunk fenced. The decision goes last.
        for chunk in commit_batches(groups, fence):
            await self._commit_chunk(chunk, fence)
        history = self.config.scheduling.decision_history
        tail: list[Put | Delete] = [Put(keys.decision(number), plan.decision.SerializeToString())]
        if number > history:
            tail.append(Delete(keys.decision(number - history)))
        await self.store.txn(tail, fence=fence)
