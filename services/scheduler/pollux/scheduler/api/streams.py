"""WatchJobs and StreamLogs: server streams, served from the replica's mirror and launchers.

WatchJobs streams come from the replica's mirror and its one feed of job changes, never an etcd
watch each, so a stream costs the same at any number of jobs and streams; one too slow for the
feed is ended. StreamLogs relays a replica's log from its launcher (pollux.scheduler.logs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pollux.scheduler.access import check_person, owner_filter, redacted
from pollux.scheduler.api.base import Context, ServicerBase
from pollux.service import auth
from pollux.service.errors import NotFound, Unavailable
from pollux.service.feed import FeedOverflow, JobChange, Subscription
from pollux.service.mirror import ClusterMirror
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

WATCH_READ = 100
"""Job records a WatchJobs stream reads from etcd at a time while it lists."""

MIRROR_WAIT_S = 10.0
"""How long a stream waits for a starting replica's mirror before answering UNAVAILABLE."""


class JobStreams(ServicerBase):
    """The server-streaming RPCs."""

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
            async for response in self._watch_one(request.job_id, context):
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

    async def _watch_one(
        self, reference: str, context: Context
    ) -> AsyncIterator[spb.WatchJobsResponse]:
        """One job (id, prefix or name), then each change, until it is deleted.

        Its record is read by key and its changes come from the replica's feed, so following
        a job costs the same at any number of jobs and streams.
        """
        job, _ = await self._job(reference, "WatchJobs", context)
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

    async def StreamLogs(
        self, request: lpb.StreamLogsRequest, context: Context
    ) -> AsyncIterator[lpb.StreamLogsResponse]:
        """A replica's log, relayed from its launcher (pollux.scheduler.logs).

        The launcher is asked for the resolved job's id, never for the reference as given.
        """
        job, _ = await self._job(request.job_id, "StreamLogs", context)
        async for response in self.logs.stream(job, request):
            yield response


async def _next(changes: Subscription) -> JobChange:
    """The next change of a stream's subscription; a stream too slow for it ends."""
    try:
        return await changes.next()
    except FeedOverflow as error:
        raise Unavailable(
            f"this watch fell behind the cluster's changes ({error}) and was ended: read "
            "faster, or watch again"
        ) from error
