"""The agent process logic: registration, membership, and the three operations on a job.

All of a job's state lives in etcd (its observation profile and model, written together by one
compare-and-swap transaction), so any agent answers for any job correctly; rendezvous ownership
only decides who keeps the job's profile cached in memory, which saves the etcd reads of the
report path. A stale cache is harmless: the write then fails its compare, the agent re-reads
and applies the report again. Within one agent, operations on a job are serialised by a per-job
lock, so a job's replicas reporting to their owner never conflict with each other.

A report is validated by `report_check.check_report` before it is merged (against its job's
limits and its replica's earlier reports); the per-replica time budgets are this agent's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog

from pollux.agent.batch_config import BatchConfigError, choose
from pollux.agent.config import AgentConfig
from pollux.agent.profile import (
    already_applied,
    build_model,
    can_fit,
    fit_profile,
    merge_report,
    observation_count,
    perf_to_pb,
    report_weights,
    shape_key,
    with_config,
)
from pollux.agent.report_check import (
    JobBounds,
    ReplicaBudgets,
    check_report,
    claimed_seconds,
)
from pollux.agent.timeline import appended, point_of
from pollux.goodput import GoodputError
from pollux.service import ownership
from pollux.service.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from pollux.service.keys import Kind
from pollux.service.session import LeasedRegistration
from pollux.service.store import (
    Conflict,
    Entry,
    Store,
    StoreError,
    cancel_and_wait,
    decode,
)
from pollux.terminal import quoted
from pollux.v1 import agent_service_pb2 as api
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 8
"""Compare-and-swap attempts per operation before answering UNAVAILABLE (retry is safe)."""
MAX_FIT_TIMES = 4096
"""Last-fit times kept before stale ones are dropped (jobs served, owned or not)."""


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """What `Agent.report_metrics` did, for the response, logs and metrics.

    Attributes:
        applied: False when the report had been applied before.
        observations: Optimizer steps in the job's profile afterwards.
        fit_seconds: Seconds the throughput fit took, or None when none ran.
        fit_failed: Whether a fit ran and failed (the previous parameters were kept).
        attempts: Compare-and-swap attempts used.
    """

    applied: bool
    observations: int
    fit_seconds: float | None = None
    fit_failed: bool = False
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class _Cached:
    """An owned job's profile as last written or read, the model written with it, its limits."""

    profile: Entry[pb.ObservationProfile] | None
    model: pb.JobModel | None
    limits: pb.BatchLimits
    bounds: JobBounds
    """What the job's reports are checked against (its batch and replica limits)."""
    timeline: pb.JobTimeline | None = None
    """The job's timeline as written with the profile (None before its first point)."""


class Agent:
    """One agent: serves any job, caches the jobs it owns.

    Args:
        store: The cluster state.
        config: Agent settings (id, lease TTL, refit interval, hysteresis).
        clock: Wall-clock seconds; drives refit intervals and model timestamps.
        rng: Randomness for retry back-off jitter.
    """

    def __init__(
        self,
        store: Store,
        config: AgentConfig,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.id = config.agent_id
        self._store = store
        self._config = config
        self._clock = clock
        self._rng = rng or random.Random()
        self._address = ""
        self._registration: LeasedRegistration | None = None
        self._live: frozenset[str] = frozenset()
        self._addresses: dict[str, str] = {}
        """Live agent id → address, as the membership watch last saw them."""
        self._cache: dict[str, _Cached] = {}
        self._last_fit: dict[str, float] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._budgets = ReplicaBudgets()
        """Training seconds each replica may still claim (report_check.ReplicaBudgets)."""
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def live_agents(self) -> frozenset[str]:
        """Ids of the registered agents, as last seen by the membership watch."""
        return self._live

    def owns(self, job_id: str) -> bool:
        """Whether this agent is the job's rendezvous owner among the live agents."""
        return ownership.owner(job_id, self._live) == self.id

    async def start(self, address: str) -> None:
        """Register as `address` under a lease and start the registration and membership tasks."""
        self._address = address
        registration = LeasedRegistration(
            self._store, self._config.lease_ttl_s, self._register, holder="agent"
        )
        await registration.start()
        self._registration = registration
        entries, revision = await self._store.list_agents()
        self._addresses = {e.value.id: e.value.address for e in entries}
        self._set_live(frozenset(self._addresses))
        self._tasks = [
            asyncio.create_task(self._watch_members(revision), name=f"agent-members-{self.id}"),
        ]

    async def stop(self) -> None:
        """Stop the background tasks and revoke the lease, which deregisters the agent."""
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks = []
        if self._registration is not None:
            await self._registration.close(revoke=True)
            self._registration = None
        log.info("agent_deregistered", agent_id=self.id)

    async def _register(self, lease: int) -> None:
        member = pb.Member(id=self.id, address=self._address)
        await self._store.register_agent(member, lease=lease)

    async def _watch_members(self, revision: int) -> None:
        prefix = self._store.keys.prefix(Kind.AGENTS)
        while True:
            try:
                async for event in self._store.watch(prefix, start_revision=revision + 1):
                    agent_id = self._store.keys.name_of(event.key, Kind.AGENTS)
                    if event.value is None:
                        self._addresses.pop(agent_id, None)
                    else:
                        member = decode(pb.Member, event.value, event.key)
                        self._addresses[agent_id] = member.address
                    revision = event.revision
                    self._set_live(frozenset(self._addresses))
            except StoreError as error:  # compacted (or unreachable): re-list, then watch again
                log.warning("agent_membership_relist", error=str(error))
                try:
                    entries, revision = await self._store.list_agents()
                except StoreError:
                    await asyncio.sleep(1.0)
                    continue
                self._addresses = {e.value.id: e.value.address for e in entries}
                self._set_live(frozenset(self._addresses))

    def agents_for(self, job_id: str) -> list[str]:
        """Addresses of the live agents in the job's rendezvous order (its owner first)."""
        return [self._addresses[i] for i in ownership.ranked(job_id, self._addresses)]

    def _set_live(self, live: frozenset[str]) -> None:
        if live == self._live:
            return
        self._live = live
        for job_id in [j for j in self._cache if not self.owns(j)]:
            self._forget(job_id)
        log.info("agent_membership", agents=sorted(live), cached_jobs=len(self._cache))

    def _forget(self, job_id: str) -> None:
        self._cache.pop(job_id, None)

    def _fitted(self, job_id: str, now: float) -> None:
        """Record a fit; entries older than the refit interval mean "fit due" like no entry."""
        self._last_fit[job_id] = now
        if len(self._last_fit) > MAX_FIT_TIMES:
            horizon = now - self._config.refit_min_interval_s
            self._last_fit = {j: t for j, t in self._last_fit.items() if t > horizon}

    @contextlib.asynccontextmanager
    async def _job_lock(self, job_id: str) -> AsyncIterator[None]:
        """Serialise this agent's operations on one job; the entry lives while it is used."""
        lock, users = self._locks.get(job_id, (asyncio.Lock(), 0))
        self._locks[job_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[job_id]
            if users == 1:
                del self._locks[job_id]
            else:
                self._locks[job_id] = (lock, users - 1)

    # -- state access --------------------------------------------------------------------------

    async def _load(self, job_id: str, *, fresh: bool) -> _Cached:
        """The job's limits, profile and model: from the owner's cache unless `fresh`.

        Raises:
            NotFound: The job does not exist.
        """
        cached = self._cache.get(job_id)
        if cached is not None and not fresh:
            return cached
        job = await self._store.get_job(job_id)
        if job is None:
            self._forget(job_id)
            self._last_fit.pop(job_id, None)
            raise NotFound(f"job {quoted(job_id)} not found")
        profile = await self._store.get_profile(job_id)
        # Read after the profile: the model is then at least as new as it, and the profile's
        # compare-and-swap guarantees it is exactly the one written with it.
        model = await self._store.get_model(job_id)
        timeline = await self._store.get_timeline(job_id)
        spec = job.value.spec
        state = _Cached(
            profile,
            model.value if model else None,
            spec.batch,
            JobBounds.of(spec.batch, spec.max_replicas),
            timeline.value if timeline else None,
        )
        self._remember(job_id, state)
        return state

    def _remember(self, job_id: str, state: _Cached) -> None:
        if self.owns(job_id):
            self._cache[job_id] = state
        else:
            self._forget(job_id)

    async def _save(
        self,
        job_id: str,
        state: _Cached,
        profile: pb.ObservationProfile,
        model: pb.JobModel | None,
        timeline: pb.JobTimeline | None = None,
    ) -> int | None:
        """Write profile (and model, timeline) if unchanged since read; None on a lost race.

        Raises:
            NotFound: The job was deleted meanwhile.
        """
        expected = state.profile.mod_revision if state.profile is not None else 0
        try:
            revision = await self._store.save_profile_and_model(
                profile, model, expected=expected, timeline=timeline
            )
        except Conflict as error:
            self._forget(job_id)
            if error.key == self._store.keys.job(job_id):
                self._last_fit.pop(job_id, None)
                raise NotFound(f"job {quoted(job_id)} not found (deleted)") from error
            return None
        created = state.profile.create_revision if state.profile is not None else revision
        entry = Entry(profile, revision, created)
        self._remember(
            job_id,
            _Cached(
                entry,
                model or state.model,
                state.limits,
                state.bounds,
                timeline or state.timeline,
            ),
        )
        return revision

    async def _back_off(self, attempt: int) -> None:
        await asyncio.sleep(self._rng.uniform(0, min(0.2, 0.005 * 2**attempt)))

    # -- operations ----------------------------------------------------------------------------

    async def report_metrics(self, request: api.ReportMetricsRequest) -> ReportOutcome:
        """Validate a report, merge it into the job's profile, refit if due, publish the model.

        Raises:
            InvalidArgument: The report is malformed, implausible, breaks its job's limits or
                claims more training time than its replica can have had
                (`report_check.check_report`); nothing was applied.
            NotFound: The job does not exist.
            Unavailable: The profile kept changing under us; the report was not applied.
        """
        job_id = request.job_id
        replica = (job_id, request.generation, request.rank)
        claimed = claimed_seconds(request.observations)
        async with self._job_lock(job_id):
            for attempt in range(1, MAX_ATTEMPTS + 1):
                state = await self._load(job_id, fresh=attempt > 1)
                current = state.profile.value if state.profile else pb.ObservationProfile()
                now = self._clock()
                # A retry of an applied report claims no new training time.
                budgets = None if already_applied(current, request) else self._budgets
                problems = check_report(request, state.bounds, budgets=budgets, now=now)
                if problems:
                    raise InvalidArgument(problems)
                merge = merge_report(current, request)
                if not merge.applied:
                    return ReportOutcome(False, observation_count(current), attempts=attempt)
                if attempt == 1:
                    _log_clipped(request)
                throughput = (
                    state.model.throughput
                    if state.model is not None and state.model.HasField("throughput")
                    else None
                )
                fit_seconds, fit_failed = None, False
                if can_fit(merge.profile) and self._fit_due(
                    job_id, merge.new_configuration, throughput, now
                ):
                    started = time.perf_counter()
                    try:
                        # In a thread: a fit takes milliseconds of CPU the event loop must not.
                        fit = await asyncio.to_thread(fit_profile, merge.profile, throughput)
                    except GoodputError as error:
                        fit, fit_failed = None, True
                        log.warning("agent_fit_failed", job_id=job_id, error=str(error))
                    fit_seconds = time.perf_counter() - started
                    if fit is not None:
                        throughput = perf_to_pb(fit.params)
                        log.info(
                            "agent_fit",
                            job_id=job_id,
                            loss=fit.loss,
                            converged=fit.converged,
                            starts=fit.starts,
                            seconds=round(fit_seconds, 4),
                        )
                model = build_model(
                    merge.profile, state.limits, throughput, agent_id=self.id, now_s=now
                )
                timeline = self._timeline(job_id, request, merge.profile, model, state, now)
                if await self._save(job_id, state, merge.profile, model, timeline) is None:
                    log.info("agent_report_conflict", job_id=job_id, attempt=attempt)
                    await self._back_off(attempt)
                    continue
                self._budgets.charge(replica, claimed, now)
                if fit_seconds is not None:
                    self._fitted(job_id, now)
                return ReportOutcome(
                    True, observation_count(merge.profile), fit_seconds, fit_failed, attempt
                )
        raise Unavailable(
            f"job {quoted(job_id)}: profile changed concurrently {MAX_ATTEMPTS} times"
        )

    def _timeline(
        self,
        job_id: str,
        request: api.ReportMetricsRequest,
        profile: pb.ObservationProfile,
        model: pb.JobModel,
        state: _Cached,
        now: float,
    ) -> pb.JobTimeline | None:
        """The job's timeline with this report's point, or None when no point is due."""
        try:
            point = point_of(request, profile, model, state.limits, now)
        except GoodputError as error:  # limits the goodput model refuses: no point, no harm
            log.warning("agent_timeline_point_failed", job_id=job_id, error=str(error))
            return None
        if point is None:
            return None
        return appended(
            state.timeline or pb.JobTimeline(job_id=job_id),
            point,
            interval_s=self._config.timeline_interval_s,
        )

    def _fit_due(
        self,
        job_id: str,
        new_configuration: bool,
        throughput: pb.ThroughputParams | None,
        now: float,
    ) -> bool:
        last = self._last_fit.get(job_id)
        return (
            new_configuration
            or throughput is None
            or last is None
            or now - last >= self._config.refit_min_interval_s
        )

    async def get_batch_config(
        self, job_id: str, num_nodes: int, num_replicas: int
    ) -> pb.BatchConfig:
        """The batch configuration for an allocation shape, remembered for hysteresis.

        Raises:
            NotFound: The job does not exist.
            FailedPrecondition: The allocation admits no configuration within the limits.
            Unavailable: The profile kept changing under us.
        """
        shape = shape_key(num_nodes, num_replicas)
        async with self._job_lock(job_id):
            for attempt in range(1, MAX_ATTEMPTS + 1):
                state = await self._load(job_id, fresh=True)
                profile = state.profile.value if state.profile else pb.ObservationProfile()
                last = profile.last_configs.get(shape)
                try:
                    config = choose(
                        state.limits,
                        state.model,
                        num_nodes,
                        num_replicas,
                        last=last,
                        hysteresis=self._config.hysteresis,
                    )
                except (BatchConfigError, GoodputError) as error:
                    raise FailedPrecondition(f"job {quoted(job_id)}: {error}") from error
                if last is not None and _same_batch(last, config):
                    return config
                updated = with_config(profile, job_id, shape, config)
                if await self._save(job_id, state, updated, None) is not None:
                    log.info(
                        "agent_batch_config_changed",
                        job_id=job_id,
                        shape=shape,
                        local_batch_size=config.local_batch_size,
                        accum_steps=config.accum_steps,
                        previous=last.local_batch_size if last is not None else None,
                    )
                    return config
                await self._back_off(attempt)
        raise Unavailable(
            f"job {quoted(job_id)}: profile changed concurrently {MAX_ATTEMPTS} times"
        )

    async def get_model(self, job_id: str) -> pb.JobModel:
        """The job's latest published model, read from etcd.

        Raises:
            NotFound: The job does not exist, or has no model yet (nothing reported).
        """
        entry = await self._store.get_model(job_id)
        if entry is not None:
            return entry.value
        if await self._store.get_job(job_id) is None:
            raise NotFound(f"job {quoted(job_id)} not found")
        raise NotFound(f"job {quoted(job_id)} has no model yet: no metrics have been reported")


def _log_clipped(request: api.ReportMetricsRequest) -> None:
    """Say so when a report's steps were clipped to its bounded weight (`report_weights`)."""
    claimed = sum(obs.count for obs in request.observations)
    kept = sum(report_weights(request.observations))
    if kept < claimed:
        log.info(
            "agent_report_clipped",
            job_id=request.job_id,
            generation=request.generation,
            rank=request.rank,
            seq=request.seq,
            claimed_steps=claimed,
            kept_steps=kept,
        )


def _same_batch(a: pb.BatchConfig, b: pb.BatchConfig) -> bool:
    return (a.local_batch_size, a.accum_steps, a.total_batch_size) == (
        b.local_batch_size,
        b.accum_steps,
        b.total_batch_size,
    )
