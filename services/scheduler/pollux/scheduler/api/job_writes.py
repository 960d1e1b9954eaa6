"""SubmitJob, CancelJob, DeleteJob: conditional writes to etcd that any replica makes.

No leadership is needed: a new job is a create-if-absent on its request id, a cancel sets a
flag with an optimistic-concurrency check, and the leader acts on them in its next round, which
each write triggers. A person's submits are bounded per user and tenant
(pollux.scheduler.limits), checked and written one at a time per tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator

import structlog

from pollux.scheduler.access import check_person, redacted
from pollux.scheduler.api.base import Context, ServicerBase
from pollux.scheduler.lifecycle import TERMINAL, state_name
from pollux.scheduler.validation import normalised, validate_submit
from pollux.service import auth
from pollux.service.errors import FailedPrecondition, ResourceExhausted
from pollux.service.seeding import seeded
from pollux.service.store import Conflict
from pollux.terminal import quoted
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)
MAX_REASON = 500
"""Longest cancel reason kept (the job record is bounded; see Job.cancel_reason)."""


def cancel_reason(caller: str, reason: str) -> str:
    """``caller: reason`` as one printable line of at most `MAX_REASON` characters.

    It ends up in the job's history, which the CLI prints line by line.
    """
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    said = f"{caller}: {text}" if text else caller
    return said if len(said) <= MAX_REASON else said[: MAX_REASON - 1] + "…"


class JobWrites(ServicerBase):
    """The RPCs that create, cancel and delete jobs."""

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

    async def CancelJob(
        self, request: spb.CancelJobRequest, context: Context
    ) -> spb.CancelJobResponse:
        """Flag the job; the leader stops it in the next round (triggered now)."""
        reference, told = request.job_id, context
        for _ in range(10):
            # A retry after a conflict re-reads the job the reference resolved to at first.
            job, revision = await self._job(reference, "CancelJob", told)
            reference, told = job.id, None
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
        job, revision = await self._job(request.job_id, "DeleteJob", context)
        if job.state not in TERMINAL:
            raise FailedPrecondition(
                f"job {job.id} is {state_name(job.state)}; "
                "cancel it first (pollux-cli cancel) and delete it once it has stopped"
            )
        await self.store.delete_job(job, expected=revision)
        log.info("job_deleted", job_id=job.id)
        return spb.DeleteJobResponse()
