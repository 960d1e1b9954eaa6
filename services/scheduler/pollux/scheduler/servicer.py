"""SchedulerService over gRPC: decode → validate → store → encode.

Every replica serves every RPC. Submits and cancels are plain conditional writes to etcd (no
leadership needed: a new job is a create-if-absent on its request id, a cancel sets a flag with
an optimistic-concurrency check); the leader acts on them in its next round, which each write
triggers. Responses carry the current leader's id and address in trailing metadata
(`pollux-leader-id`, `pollux-leader-address`) so clients learn it.

A job reference (id, unique id prefix or name) is resolved once per call (`_job`), ownership
is checked on the job it resolved to, and only that job's id goes further (to etcd, to a
launcher). Submits are bounded per user and tenant (pollux.scheduler.limits); WatchJobs streams
are served from the replica's mirror and its one feed of job changes, never an etcd watch each.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeAlias

import grpc
import structlog

from pollux.policy.registry import PolicySpec, make_policy
from pollux.policy.types import Policy
from pollux.scheduler.access import check_job, check_person, owner_filter, redacted
from pollux.scheduler.cycle import cluster_state, seconds_left
from pollux.scheduler.estimate import estimate, reference_work
from pollux.scheduler.explain import counterfactual
from pollux.scheduler.forecaster import Forecaster
from pollux.scheduler.leader import current_leader
from pollux.scheduler.lifecycle import ACTIVE, TERMINAL, state_name
from pollux.scheduler.limits import LimitsConfig, SubmitLimits
from pollux.scheduler.logs import LauncherLogs
from pollux.scheduler.validation import normalised, validate_submit
from pollux.service import auth
from pollux.service.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from pollux.service.feed import FeedOverflow, JobChange, Subscription
from pollux.service.mirror import ClusterMirror, JobSummary, named
from pollux.service.rpc import annotate
from pollux.service.seeding import seeded
from pollux.service.store import Conflict, Entry, Snapshot, Store
from pollux.terminal import quoted
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
MAX_JOB_REF = 128
"""Longest text taken as a job reference (ids are 12 characters, names at most 63)."""
AMBIGUOUS_SHOWN = 10
"""Candidates an ambiguous job reference's error lists."""
MAX_REASON = 500
"""Longest cancel reason kept (the job record is bounded; see Job.cancel_reason)."""
MAX_PAGE_BYTES = 2 * 1024 * 1024
"""A ListJobs page ends before this many bytes of jobs (gRPC's default limit is 4 MiB): a
page holds `page_size` jobs or fewer, and always at least one."""
WATCH_READ = 100
"""Job records a WatchJobs stream reads from etcd at a time while it lists."""
MIRROR_WAIT_S = 10.0
"""How long a stream waits for a starting replica's mirror before answering UNAVAILABLE."""


def _page_token(job: pb.Job) -> str:
    return base64.urlsafe_b64encode(f"{job.create_time.ToNanoseconds()}/{job.id}".encode()).decode()


def cancel_reason(caller: str, reason: str) -> str:
    """``caller: reason`` as one printable line of at most `MAX_REASON` characters.

    It ends up in the job's history, which the CLI prints line by line.
    """
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    said = f"{caller}: {text}" if text else caller
    return said if len(said) <= MAX_REASON else said[: MAX_REASON - 1] + "…"


def _order(job: pb.Job) -> tuple[int, str]:
    return job.create_time.ToNanoseconds(), job.id


class SchedulerServicer(spb_grpc.SchedulerServiceServicer):
    """The SchedulerService RPCs of one replica.

    Args:
        store: The cluster state store.
        replica_id: This replica's id (ClusterStatus.answered_by).
        on_change: Called after a write a round should react to (the local scheduler's trigger).
        last_round: Returns the last round this replica ran or saw.
        clock: Wall-clock seconds.
        policy: The replica's scheduling policy (None: the default policy). Explain and
            EstimateJob build their states as its rounds do, Explain's counterfactuals use its
            `explain_params` and name its objective, and EstimateJob forecasts with it when
            there is no forecaster.
        forecaster: The replica's forecasts, preferred for `estimated_completion`.
        seed_profiles: Whether submissions are seeded from earlier runs.
        limits: The per-user and per-tenant queue and submit-rate limits.
    """

    def __init__(
        self,
        store: Store,
        replica_id: str,
        on_change: Callable[[], None],
        last_round: Callable[[], int],
        clock: Callable[[], float] = time.time,
        *,
        warnings: Callable[[], list[str]] = list,
        mirror: ClusterMirror | None = None,
        policy: Policy[Any] | None = None,
        forecaster: Forecaster | None = None,
        seed_profiles: bool = True,
        limits: LimitsConfig | None = None,
    ) -> None:
        self.store = store
        self.submits = SubmitLimits(limits or LimitsConfig(), time.monotonic)
        """Queue and rate checks of people's submits (admins are not limited)."""
        self._submitting: dict[str, tuple[asyncio.Lock, int]] = {}
        """A lock per tenant: its users' limited submits are checked and written one at a
        time, so concurrent submits cannot all pass the same count."""
        self.policy: Policy[Any] = policy if policy is not None else make_policy(PolicySpec())
        """The replica's scheduling policy (see Args)."""
        self.seed_profiles = seed_profiles
        """Whether a submission starts from its owner's newest earlier run of the same name
        (pollux.service.seeding)."""
        self.forecaster = forecaster
        """The replica's completion-time forecasts (None: time left on current GPUs only)."""
        self.logs = LauncherLogs(store, store.tls)
        self.warnings = warnings
        self.mirror = mirror
        self.replica_id = replica_id
        self.on_change = on_change
        self.last_round = last_round
        self.clock = clock
        self._leader: pb.Member | None = None
        self._leader_at = -1e9

    async def _leader_metadata(self, context: Context) -> None:
        # Cached for a second: a hint for clients, not worth an etcd read per request.
        now = time.monotonic()
        if now - self._leader_at > 1.0:
            self._leader, self._leader_at = await current_leader(self.store), now
        leader = self._leader
        if leader is not None:
            context.set_trailing_metadata(
                (("pollux-leader-id", leader.id), ("pollux-leader-address", leader.address))
            )

    async def _job(self, job_id: str, action: str) -> tuple[pb.Job, int]:
        """The job and its revision, if the caller may do `action` on it."""
        check_person(auth.current(), action)
        if not job_id:
            raise InvalidArgument([("job_id", "required: a job id, a unique prefix or a name")])
        entry = await self.store.get_job(job_id) if len(job_id) <= MAX_JOB_REF else None
        if entry is None:
            entry = await self._named(job_id)
        check_job(auth.current(), entry.value, action)
        if entry.value.id != job_id:
            annotate(resolved_job_id=entry.value.id)
        return entry.value, entry.mod_revision

    async def _named(self, text: str) -> Entry[pb.Job]:
        """The one job `text` names as a unique id prefix or name (mirror.named's rule).

        Raises:
            NotFound: It names none of the caller's jobs.
            InvalidArgument: It names several; the message lists the newest of them.
        """
        owner = owner_filter(auth.current())
        found: list[JobSummary] = []
        if len(text) <= MAX_JOB_REF:
            mirror = self.mirror
            if (
                mirror is not None
                and mirror.ready
                and await mirror.jobs.wait_for(self.store.jobs_written, 2.0)
            ):
                found = mirror.named(text, owner)
            else:
                listed, _ = await self.store.list_jobs()
                found = named(map(JobSummary.of, (e.value for e in listed)), text, owner)
        if len(found) > 1:
            candidates = ", ".join(
                f"{j.order[1]} ({j.name}, {state_name(j.state)})" for j in found[:AMBIGUOUS_SHOWN]
            )
            more = (
                f" and {len(found) - AMBIGUOUS_SHOWN} more" if len(found) > AMBIGUOUS_SHOWN else ""
            )
            raise InvalidArgument(
                [
                    (
                        "job_id",
                        f"{quoted(text)} matches {len(found)} jobs: {candidates}{more}; "
                        "use the id (or more of it)",
                    )
                ],
                headline="ambiguous job reference",
            )
        entry = await self.store.get_job(found[0].order[1]) if found else None
        if entry is None:
            raise NotFound(
                f"job {quoted(text)} not found: no job you can see has that id, id prefix or name "
                "(pollux-cli ls lists jobs)"
            )
        return entry

    async def SubmitJob(
        self, request: spb.SubmitJobRequest, context: Context
    ) -> spb.SubmitJobResponse:
        """Validate completely, then create-if-absent on the request id."""
        caller = auth.current()
        check_person(caller, "SubmitJob")
        validate_submit(request.spec, request.request_id, request.HasField("spec"))
        if caller.is_admin:
            return await self._submit(request, context, caller)
        with self._tenant_lock(caller.tenant):
            async with self._submitting[caller.tenant][0]:
                try:
                    self._check_limits(caller)
                except ResourceExhausted:
                    earlier = await self.store.job_of_request(request.request_id)
                    if earlier is None or earlier.value.owner != caller.name:
                        raise
                    # A retry of a submit that was accepted: answer it as before.
                return await self._submit(request, context, caller)

    def _check_limits(self, caller: auth.Principal) -> None:
        """Refuse a person's submit past their or their tenant's PENDING or rate limit."""
        mirror = self.mirror
        if mirror is not None and mirror.ready:
            self.submits.check_queue(
                caller.name,
                caller.tenant,
                mirror.pending(owner=caller.name),
                mirror.pending(tenant=caller.tenant),
            )
        self.submits.take(caller.name, caller.tenant)

    @contextlib.contextmanager
    def _tenant_lock(self, tenant: str) -> Iterator[None]:
        """Keep `self._submitting[tenant]` while the block uses it; dropped when unused."""
        lock, users = self._submitting.get(tenant, (asyncio.Lock(), 0))
        self._submitting[tenant] = (lock, users + 1)
        try:
            yield
        finally:
            lock, users = self._submitting[tenant]
            if users == 1:
                del self._submitting[tenant]
            else:
                self._submitting[tenant] = (lock, users - 1)

    async def _submit(
        self, request: spb.SubmitJobRequest, context: Context, caller: auth.Principal
    ) -> spb.SubmitJobResponse:
        """Create the job of a validated, admitted submit (or find the request's earlier one)."""
        now = self.clock()
        job = pb.Job(
            id=f"j-{uuid.uuid4().hex[:10]}",
            spec=normalised(request.spec),
            request_id=request.request_id,
            state=pb.JOB_STATE_PENDING,
            owner=caller.name,
            tenant=caller.tenant,
        )
        job.create_time.FromNanoseconds(int(now * 1e9))
        entry = job.history.add(state=pb.JOB_STATE_PENDING, reason="submitted")
        entry.time.CopyFrom(job.create_time)
        seed = await self._seed(job, now) if self.seed_profiles else None
        stored, created = await self.store.create_job(job, seed)
        if not created and (stored.spec != job.spec or stored.owner != job.owner):
            raise FailedPrecondition(
                f"request_id {request.request_id!r} was already used for job {stored.id} "
                "with a different spec; use a new request_id"
            )
        if created:
            self.on_change()
            mirror = self.mirror
            if mirror is not None and not caller.is_admin:
                # The next limited submit counts this job (the tenant's lock is held).
                await mirror.jobs.wait_for(self.store.jobs_written, 2.0)
        log.info(
            "job_submitted",
            job_id=stored.id,
            created=created,
            name=stored.spec.name,
            owner=stored.owner,
            tenant=stored.tenant,
            seeded_from=seed[0].seeded_from if created and seed is not None else None,
        )
        await self._leader_metadata(context)
        return spb.SubmitJobResponse(job=redacted(stored), created=created)

    async def _seed(
        self, job: pb.Job, now: float
    ) -> tuple[pb.ObservationProfile, pb.JobModel] | None:
        """The profile and model `job` starts with: its owner's newest earlier fitted run's."""
        found = await self._newest(
            job.spec.name, job.owner, lambda model: model.HasField("throughput")
        )
        if found is None:
            return None
        source, model = found
        profile = await self.store.get_profile(source)
        if profile is None:
            return None
        return seeded(job, profile.value, model, now_s=now)

    async def GetJob(self, request: spb.GetJobRequest, context: Context) -> spb.GetJobResponse:
        """One job."""
        job, _ = await self._job(request.job_id, "GetJob")
        return spb.GetJobResponse(job=(await self._redacted_with_estimates([job]))[0])

    async def ListJobs(
        self, request: spb.ListJobsRequest, context: Context
    ) -> spb.ListJobsResponse:
        """Jobs in creation order, filtered, one page at a time (a user's own jobs only)."""
        check_person(auth.current(), "ListJobs")
        size = request.page_size or 100
        problems = []
        if not 1 <= size <= 1000:
            problems.append(("page_size", f"{request.page_size} must be 1-1000 (0 = 100)"))
        after: tuple[int, str] | None = None
        if request.page_token:
            try:
                raw = base64.urlsafe_b64decode(request.page_token.encode()).decode()
                nanos, _, job_id = raw.partition("/")
                after = (int(nanos), job_id)
            except ValueError:
                problems.append(("page_token", "not a token from a previous ListJobs response"))
        for state in request.states:
            if state not in pb.JobState.values() or state == pb.JOB_STATE_UNSPECIFIED:
                problems.append(("states", f"{state} is not a job state"))
        if problems:
            raise InvalidArgument(problems)
        selected, more = await self._select(request, after, size)
        page: list[pb.Job] = []
        total = 0
        for job in selected:
            weight = job.ByteSize()
            if len(page) >= size or (page and total + weight > MAX_PAGE_BYTES):
                break
            page.append(job)
            total += weight
        token = _page_token(page[-1]) if more or len(selected) > len(page) else ""
        jobs = await self._redacted_with_estimates(page)
        return spb.ListJobsResponse(jobs=jobs, next_page_token=token)

    async def _redacted_with_estimates(self, jobs: list[pb.Job]) -> list[pb.Job]:
        """`jobs` as the API shows them: redacted, with `estimated_completion` where known.

        From the replica's latest forecast when it covers the job, else its time left on its
        current GPUs; models come from the replica's mirror (no etcd read per job), else etcd.
        """
        out = [redacted(job) for job in jobs]
        now = self.clock()
        mirror = self.mirror
        forecast = self.forecaster.completion if self.forecaster is not None else {}
        for job in out:
            if job.state not in ACTIVE:
                continue
            if job.id in forecast:
                job.estimated_completion.FromNanoseconds(int(forecast[job.id] * 1e9))
                continue
            if not job.allocation.nodes:
                continue
            if mirror is not None and mirror.ready:
                cached = mirror.models.entries.get(self.store.keys.model(job.id))
            else:
                cached = await self.store.get_model(job.id)
            left = seconds_left(job, cached.value if cached is not None else None)
            if left is not None and left < _LONGEST_ESTIMATE_S:
                job.estimated_completion.FromNanoseconds(int((now + left) * 1e9))
        return out

    async def _select(
        self, request: spb.ListJobsRequest, after: tuple[int, str] | None, size: int
    ) -> tuple[list[pb.Job], bool]:
        """Up to `size` matching jobs in listing order after `after`; and whether more match.

        From the replica's mirror index when it has one (only the page's records are read
        from etcd, so a page costs the same at any number of finished jobs), else by reading
        every job. The index holds every job-record write this replica made (it waits for the
        last one) and other replicas' writes within a watch delivery, as a watch cache does.
        """
        states, labels = {int(s) for s in request.states}, dict(request.labels)
        owner = owner_filter(auth.current())
        if request.owner:
            if owner is not None and request.owner != owner:
                raise PermissionDenied(
                    f"{owner} may list only their own jobs, not {quoted(request.owner)}'s "
                    "(leave owner empty, or ask an admin)"
                )
            owner = request.owner
        newest = request.newest_first
        mirror = self.mirror
        if (
            mirror is not None
            and mirror.ready
            and await mirror.jobs.wait_for(self.store.jobs_written, 2.0)
        ):
            keys, more = mirror.page(
                states=states,
                name_prefix=request.name_prefix,
                labels=labels,
                after=after,
                limit=size,
                owner=owner,
                newest_first=newest,
            )
            entries = await self.store.get_many(keys, pb.Job)
            return [e.value for e in entries if e is not None], more
        listed, _ = await self.store.list_jobs()
        selected = [
            j
            for j in sorted((e.value for e in listed), key=_order, reverse=newest)
            if (not states or j.state in states)
            and j.spec.name.startswith(request.name_prefix)
            and all(j.spec.labels.get(k) == v for k, v in labels.items())
            and (after is None or (_order(j) < after if newest else _order(j) > after))
            and (owner is None or j.owner == owner)
        ]
        return selected[:size], len(selected) > size

    async def CancelJob(
        self, request: spb.CancelJobRequest, context: Context
    ) -> spb.CancelJobResponse:
        """Flag the job; the leader stops it in the next round (triggered now)."""
        for _ in range(10):
            job, revision = await self._job(request.job_id, "CancelJob")
            if job.state == pb.JOB_STATE_CANCELLED or job.cancel_requested:
                return spb.CancelJobResponse(job=redacted(job))
            if job.state in TERMINAL:
                raise FailedPrecondition(
                    f"job {job.id} already {state_name(job.state)}; nothing to cancel"
                )
            job.cancel_requested = True
            job.cancel_reason = cancel_reason(auth.current().name, request.reason)
            try:
                await self.store.update_job(job, expected=revision)
            except Conflict:
                await asyncio.sleep(0.01)
                continue
            self.on_change()
            log.info("job_cancel_requested", job_id=job.id, reason=quoted(request.reason, 200))
            await self._leader_metadata(context)
            return spb.CancelJobResponse(job=redacted(job))
        raise Conflict(self.store.keys.job(job.id))

    async def DeleteJob(
        self, request: spb.DeleteJobRequest, context: Context
    ) -> spb.DeleteJobResponse:
        """Remove a finished job and everything stored for it."""
        job, revision = await self._job(request.job_id, "DeleteJob")
        if job.state not in TERMINAL:
            raise FailedPrecondition(
                f"job {job.id} is {state_name(job.state)}; "
                "cancel it first (pollux-cli cancel) and delete it once it has stopped"
            )
        await self.store.delete_job(job, expected=revision)
        log.info("job_deleted", job_id=job.id)
        return spb.DeleteJobResponse()

    async def WatchJobs(
        self, request: spb.WatchJobsRequest, context: Context
    ) -> AsyncIterator[spb.WatchJobsResponse]:
        """Current jobs, then every change (a user's own jobs only).

        From the replica's mirror: the stream subscribes to its feed of job changes, takes the
        keys of the jobs it may see from the mirror's index (a user's from their own index:
        no other user's job is read), reads those records, then relays the changes.
        """
        caller = auth.current()
        check_person(caller, "WatchJobs")
        if request.job_id:
            async for response in self._watch_one(request.job_id):
                yield response
            return
        owner = owner_filter(caller)
        mirror = await self._live_mirror()
        with mirror.feed.subscribe(owner=owner) as changes:
            keys, listed_at = mirror.listing(owner)
            recent: dict[bytes, int] = {}
            """Listed records written after the listing's revision: the feed repeats them."""
            gone: set[bytes] = set()
            """Listed keys deleted before their read: the feed's delete is not news."""
            for start in range(0, len(keys), WATCH_READ):
                batch = keys[start : start + WATCH_READ]
                for key, entry in zip(batch, await self.store.get_many(batch, pb.Job), strict=True):
                    if entry is None:
                        gone.add(key)
                        continue
                    if entry.mod_revision > listed_at:
                        recent[key] = entry.mod_revision
                    yield spb.WatchJobsResponse(job=redacted(entry.value))
            while True:
                change = await _next(changes)
                sent = recent.pop(change.key, 0)
                if change.revision <= sent:
                    recent[change.key] = sent
                    continue
                if change.deleted and change.key in gone:
                    continue
                yield spb.WatchJobsResponse(job=redacted(change.job), deleted=change.deleted)

    async def _watch_one(self, reference: str) -> AsyncIterator[spb.WatchJobsResponse]:
        """One job (id, prefix or name), then each change, until it is deleted.

        Its record is read by key and its changes come from the replica's feed, so following
        a job costs the same at any number of jobs and streams.
        """
        job, _ = await self._job(reference, "WatchJobs")
        mirror = await self._live_mirror()
        key = self.store.keys.job(job.id)
        with mirror.feed.subscribe(key=key) as changes:
            entry = await self.store.get_job(job.id)
            if entry is None:
                raise NotFound(f"job {job.id} not found (deleted)")
            current, seen = entry.value, entry.mod_revision
            yield spb.WatchJobsResponse(job=redacted(current))
            while True:
                change = await _next(changes)
                if change.revision <= seen:
                    continue
                if change.deleted:
                    yield spb.WatchJobsResponse(job=redacted(current), deleted=True)
                    return
                current, seen = change.job, change.revision
                yield spb.WatchJobsResponse(job=redacted(current))

    async def _live_mirror(self) -> ClusterMirror:
        """The replica's mirror, listed and holding this replica's job writes.

        Raises:
            Unavailable: The replica has no mirror, or it is still listing etcd.
        """
        mirror = self.mirror
        if mirror is None:
            raise Unavailable("this replica serves no watches (it mirrors no state): use another")
        try:
            await asyncio.wait_for(mirror.jobs.ready.wait(), MIRROR_WAIT_S)
        except TimeoutError as error:
            raise Unavailable("this replica is still loading the cluster state: retry") from error
        await mirror.jobs.wait_for(self.store.jobs_written, 2.0)
        return mirror

    async def Explain(self, request: spb.ExplainRequest, context: Context) -> spb.ExplainResponse:
        """The job, its part of the latest decision that included it, its model."""
        job, _ = await self._job(request.job_id, "Explain")
        response = spb.ExplainResponse(job=redacted(job))
        for decision in await self.store.latest_decisions(50):
            mine = next((d for d in decision.jobs if d.job_id == job.id), None)
            if mine is not None:
                response.decision.CopyFrom(mine)
                response.round.CopyFrom(decision)
                response.round.ClearField("jobs")
                break
        if not response.HasField("decision") and job.state == pb.JOB_STATE_PENDING:
            response.decision.job_id = job.id
            response.decision.reason = "pending: waiting for GPUs behind other jobs"
        model = await self.store.get_model(job.id)
        if model is not None:
            response.model.CopyFrom(model.value)
        profile = await self.store.get_profile(job.id)
        if profile is not None and job.allocation.nodes:
            shape = f"{len(set(job.allocation.nodes))}/{len(job.allocation.nodes)}"
            if shape in profile.value.last_configs:
                response.batch.CopyFrom(profile.value.last_configs[shape])
        change = last_change(job)
        if change is not None:
            response.last_change.CopyFrom(change)
        response.objective = self.policy.objective_text
        if job.state in ACTIVE:
            await self._counterfactual(job.id, response)
        return response

    async def EstimateJob(
        self, request: spb.EstimateJobRequest, context: Context
    ) -> spb.EstimateJobResponse:
        """Forecast a job as if submitted now, borrowing an earlier run's model and size."""
        caller = auth.current()
        check_person(caller, "EstimateJob")
        validate_submit(request.spec, "estimate", request.HasField("spec"))
        spec = normalised(request.spec)
        found = await self._newest(
            spec.name, owner_filter(caller), lambda model: reference_work(model) is not None
        )
        if found is None:
            raise FailedPrecondition(
                f"no earlier job named {quoted(spec.name)} of yours has reported a throughput "
                "model and a declared size: run it once (the estimate uses its measured goodput "
                "and size; the training library declares the size with trainer.epochs(N))"
            )
        reference_id, model = found
        snapshot = await self._snapshot()
        now = self.clock()
        forecaster = self.forecaster
        policy = forecaster.policy if forecaster is not None else self.policy
        # The state's jobs explore as the forecasting policy lets them, the new one too.
        state = await asyncio.to_thread(
            cluster_state, snapshot, _active(snapshot), now=now, policy=policy
        )
        if not state.nodes:
            raise FailedPrecondition("the cluster has no nodes yet: nothing could run the job")
        result = await asyncio.to_thread(
            estimate,
            state,
            policy,
            spec,
            model,
            round_s=forecaster.round_s if forecaster is not None else 300.0,
            restart_delay_s=forecaster.restart_delay_s if forecaster is not None else 30.0,
        )
        if result is None:
            raise FailedPrecondition(
                f"the forecast did not finish {quoted(spec.name)} within its horizon: the "
                "cluster is too busy to say"
            )
        response = spb.EstimateJobResponse(
            predicted_jct_s=result.completion - now,
            reference_job_id=reference_id,
            work=result.work,
            rounds=result.rounds,
        )
        response.predicted_completion.FromNanoseconds(int(result.completion * 1e9))
        return response

    async def _newest(
        self, name: str, owner: str | None, usable: Callable[[pb.JobModel], bool]
    ) -> tuple[str, pb.JobModel] | None:
        """The newest job named `name` (the owner's, unless None) with a `usable` model.

        From the mirror's job index once it holds this replica's job writes (as ListJobs
        reads), else from etcd.
        """
        mirror = self.mirror
        if (
            mirror is not None
            and mirror.ready
            and await mirror.jobs.wait_for(self.store.jobs_written, 2.0)
        ):
            keys, _ = mirror.page(
                states=set(), name_prefix=name, labels={}, after=None, limit=1000, owner=owner
            )
            jobs = [e.value for e in await self.store.get_many(keys, pb.Job) if e is not None]
        else:
            listed, _ = await self.store.list_jobs()
            jobs = [e.value for e in listed if owner is None or e.value.owner == owner]
        named = sorted((j for j in jobs if j.spec.name == name), key=_order, reverse=True)[:50]
        models = await self.store.get_many(
            [self.store.keys.model(j.id) for j in named], pb.JobModel
        )
        for job, entry in zip(named, models, strict=True):
            if entry is not None and usable(entry.value):
                return job.id, entry.value
        return None

    async def _snapshot(self) -> Snapshot:
        """The active state: the mirror's when it has listed everything, else etcd's."""
        mirror = self.mirror
        if mirror is not None and mirror.ready:
            return mirror.snapshot()
        return await self.store.snapshot()

    async def _counterfactual(self, job_id: str, response: spb.ExplainResponse) -> None:
        """Fill Explain's counterfactuals from the live state (the mirror's, else etcd's)."""
        snapshot = await self._snapshot()
        active = _active(snapshot)
        state = await asyncio.to_thread(
            cluster_state, snapshot, active, now=self.clock(), policy=self.policy
        )
        try:
            found = await asyncio.to_thread(
                counterfactual, state, job_id, self.policy.explain_params
            )
        except KeyError:
            return  # finished between the read of the job and the snapshot
        for a in found.alternatives:
            response.alternatives.add(
                gpus=a.gpus, nodes=a.nodes, speedup=a.speedup, goodput=a.goodput
            )
        for h in found.holders:
            response.holders.add(
                job_id=h.job_id,
                gpus=h.gpus,
                speedup=h.speedup,
                speedup_without_one=h.speedup_without_one,
            )
        if found.batch is not None:
            b = found.batch
            response.batch_choice.CopyFrom(
                spb.ExplainBatch(
                    batch_size=b.batch_size,
                    local_batch_size=b.local_batch_size,
                    accum_steps=b.accum_steps,
                    throughput=b.throughput,
                    efficiency=b.efficiency,
                    goodput=b.goodput,
                )
            )
        response.queue_position = found.queue_position
        response.pending_jobs = found.pending_jobs

    async def ClusterStatus(
        self, request: spb.ClusterStatusRequest, context: Context
    ) -> spb.ClusterStatusResponse:
        """Nodes with their jobs, agents, leader, totals."""
        # The replica's mirror when it has one (pollux.service.mirror: the active state, so
        # this does not slow down as finished jobs accumulate), else etcd in full.
        mirror = self.mirror
        if mirror is not None and mirror.ready:
            snapshot = mirror.snapshot()
            states = mirror.state_counts()
        else:
            snapshot = await self.store.snapshot()
            states = {}
            for entry in snapshot.jobs.values():
                states[entry.value.state] = states.get(entry.value.state, 0) + 1
        by_node: dict[str, list[str]] = {}
        for entry in snapshot.jobs.values():
            job = entry.value
            if job.state in ACTIVE:
                for held in job.allocation.nodes:
                    by_node.setdefault(held, []).append(job.id)
        counts = {state_name(state): n for state, n in states.items()}
        response = spb.ClusterStatusResponse(
            agents=snapshot.agents,
            answered_by=self.replica_id,
            last_round=self.last_round(),
            warnings=self.warnings(),
        )
        for node_name in sorted(snapshot.nodes):
            node = snapshot.nodes[node_name]
            jobs = by_node.get(node_name, [])
            response.nodes.add(node=node, allocated_gpus=len(jobs), jobs=jobs)
            response.total_gpus += node.gpus
            response.allocated_gpus += len(jobs)
        for name, count in counts.items():
            response.jobs_by_state[name] = count
        leader = await current_leader(self.store)
        if leader is not None:
            response.leader_id = leader.id
            response.leader_address = leader.address
        decisions = await self.store.latest_decisions(1)
        if decisions:
            response.last_round = max(response.last_round, decisions[0].round)
        return response

    async def StreamLogs(
        self, request: lpb.StreamLogsRequest, context: Context
    ) -> AsyncIterator[lpb.StreamLogsResponse]:
        """A replica's log, relayed from its launcher (pollux.scheduler.logs).

        The launcher is asked for the resolved job's id, never for the reference as given.
        """
        job, _ = await self._job(request.job_id, "StreamLogs")
        async for response in self.logs.stream(job, request):
            yield response

    async def GetJobTimeline(
        self, request: spb.GetJobTimelineRequest, context: Context
    ) -> spb.GetJobTimelineResponse:
        """The job's timeline as its agent recorded it (empty before its first report)."""
        job, _ = await self._job(request.job_id, "GetJobTimeline")
        entry = await self.store.get_timeline(job.id)
        timeline = entry.value if entry is not None else pb.JobTimeline()
        timeline.job_id = job.id
        return spb.GetJobTimelineResponse(timeline=timeline)


async def _next(changes: Subscription) -> JobChange:
    """The next change of a stream's subscription; a stream too slow for it ends."""
    try:
        return await changes.next()
    except FeedOverflow as error:
        raise Unavailable(
            f"this watch fell behind the cluster's changes ({error}) and was ended: read "
            "faster, or watch again"
        ) from error


_GPU_CHANGES = (pb.JOB_STATE_ALLOCATED, pb.JOB_STATE_RESCALING)
_LONGEST_ESTIMATE_S = 10 * 365 * 86400.0
"""Estimates beyond ten years say only "not soon": they are left out rather than shown."""


def last_change(job: pb.Job) -> pb.StateTransition | None:
    """The newest transition that changed the job's GPUs; None while it never held any.

    Allocated, rescaled, or suspended (back to PENDING after the submission).
    """
    history = list(job.history)
    for index in range(len(history) - 1, -1, -1):
        entry = history[index]
        if entry.state in _GPU_CHANGES or (entry.state == pb.JOB_STATE_PENDING and index > 0):
            return entry
    return None


def _active(snapshot: Snapshot) -> list[pb.Job]:
    """The snapshot's active jobs in submission order (the policy's order)."""
    return sorted(
        (e.value for e in snapshot.jobs.values() if e.value.state in ACTIVE),
        key=lambda j: (j.create_time.ToNanoseconds(), j.id),
    )
