"""GetJob, ListJobs, GetJobTimeline: jobs as the API shows them, one page at a time.

Pages come from the replica's mirror index when it has one (only the page's records are read
from etcd), else from every job record; jobs are redacted and carry `estimated_completion`
where the replica's forecast or the job's model says.
"""

from __future__ import annotations

import base64

from pollux.scheduler.access import check_person, owner_filter, redacted
from pollux.scheduler.api.base import Context, ServicerBase, creation_order
from pollux.scheduler.cycle import seconds_left
from pollux.scheduler.lifecycle import ACTIVE
from pollux.service import auth
from pollux.service.errors import InvalidArgument, PermissionDenied
from pollux.terminal import quoted
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

MAX_PAGE_BYTES = 2 * 1024 * 1024
"""A ListJobs page ends before this many bytes of jobs (gRPC's default limit is 4 MiB): a
page holds `page_size` jobs or fewer, and always at least one."""

_LONGEST_ESTIMATE_S = 10 * 365 * 86400.0
"""Estimates beyond ten years say only "not soon": they are left out rather than shown."""


def _page_token(job: pb.Job) -> str:
    return base64.urlsafe_b64encode(f"{job.create_time.ToNanoseconds()}/{job.id}".encode()).decode()


class JobReads(ServicerBase):
    """The RPCs that read jobs."""

    async def GetJob(self, request: spb.GetJobRequest, context: Context) -> spb.GetJobResponse:
        """One job."""
        job, _ = await self._job(request.job_id, "GetJob", context)
        return spb.GetJobResponse(job=(await self._shown([job]))[0])

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
        return spb.ListJobsResponse(jobs=await self._shown(page), next_page_token=token)

    async def _shown(self, jobs: list[pb.Job]) -> list[pb.Job]:
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
            for j in sorted((e.value for e in listed), key=creation_order, reverse=newest)
            if (not states or j.state in states)
            and j.spec.name.startswith(request.name_prefix)
            and all(j.spec.labels.get(k) == v for k, v in labels.items())
            and (
                after is None
                or (creation_order(j) < after if newest else creation_order(j) > after)
            )
            and (owner is None or j.owner == owner)
        ]
        return selected[:size], len(selected) > size

    async def GetJobTimeline(
        self, request: spb.GetJobTimelineRequest, context: Context
    ) -> spb.GetJobTimelineResponse:
        """The job's timeline as its agent recorded it (empty before its first report)."""
        job, _ = await self._job(request.job_id, "GetJobTimeline", context)
        entry = await self.store.get_timeline(job.id)
        timeline = entry.value if entry is not None else pb.JobTimeline()
        timeline.job_id = job.id
        return spb.GetJobTimelineResponse(timeline=timeline)
