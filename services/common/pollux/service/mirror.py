"""The cluster's active state mirrored in memory from etcd watches (the informer pattern).

Reading every job, model and status ever written took seconds per round with tens of thousands
of finished jobs, and grew forever. So each scheduler replica keeps a `ClusterMirror`: each
prefix a round needs is listed once and followed by a watch from the next revision, so a round
costs what changed, not what exists. Only the *active* part is kept in full (non-terminal jobs
with their models and replica statuses, nodes, agents); every job is also in a small
creation-ordered index (`JobSummary`, also by owner) that ClusterStatus counts, ListJobs pages
and SubmitJob's queue limits count, and every job change goes, decoded once, to the `JobFeed`
that fans it out to WatchJobs streams (pollux.service.feed).

Freshness: a mirror lags etcd by a watch delivery, yet rounds stay correct: every job write is
conditional on the mod revision the mirror holds, a leader waits for its own last commit
(`wait_for`) before planning again, and a broken or compacted watch re-lists its prefix.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog
from google.protobuf.message import Message

from pollux.service.feed import JobChange, JobFeed
from pollux.service.keys import Kind
from pollux.service.store import (
    Entry,
    Snapshot,
    Store,
    StoreError,
    WatchEvent,
    cancel_and_wait,
    decode,
)
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What ListJobs filters and orders by, for one job (finished ones included)."""

    order: tuple[int, str]
    """(creation time in ns, id): the listing order."""
    state: int
    name: str
    labels: tuple[tuple[str, str], ...]
    owner: str = ""
    tenant: str = ""
    revision: int = 0
    """The mod revision of the record summarised (0: not known)."""

    @classmethod
    def of(cls, job: pb.Job, revision: int = 0) -> JobSummary:
        """The summary of a job record (written at `revision`)."""
        return cls(
            (job.create_time.ToNanoseconds(), job.id),
            int(job.state),
            job.spec.name,
            tuple(sorted(job.spec.labels.items())),
            job.owner,
            job.tenant,
            revision,
        )

    def stub(self) -> pb.Job:
        """What the summary knows of the job, as a record (a deleted job's last word)."""
        state = pb.JobState.Name(self.state)
        job = pb.Job(id=self.order[1], owner=self.owner, tenant=self.tenant, state=state)
        job.spec.name = self.name
        job.spec.labels.update(dict(self.labels))
        job.create_time.FromNanoseconds(self.order[0])
        return job

    def matches(
        self, states: set[int], name_prefix: str, labels: dict[str, str], owner: str | None = None
    ) -> bool:
        """Whether ListJobs' filters select this job (`owner` None: anyone's)."""
        if owner is not None and self.owner != owner:
            return False
        if states and self.state not in states:
            return False
        if not self.name.startswith(name_prefix):
            return False
        mine = dict(self.labels)
        return all(mine.get(k) == v for k, v in labels.items())


def named(summaries: Iterable[JobSummary], text: str, owner: str | None) -> list[JobSummary]:
    """The jobs `text` can mean, newest first (a job reference of the API).

    The job with that id; else those whose id starts with it (``3f9a`` matches ``j-3f9a…``
    too); else those with that name. Only jobs of `owner` when given (a user names only their own).
    """
    visible = [j for j in summaries if owner is None or j.owner == owner]
    rules: tuple[Callable[[JobSummary], bool], ...] = (
        lambda j: j.order[1] == text,
        lambda j: _id_matches(j.order[1], text),
        lambda j: j.name == text,
    )
    for matches in rules:
        found = [j for j in visible if matches(j)]
        if found:
            return sorted(found, key=lambda j: j.order, reverse=True)
    return []


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a job reference means among the jobs a caller may see (`resolve_reference`).

    Attributes:
        job: The job it means; None when it names none, or several it cannot choose between.
        matches: Every job it matched, newest first.
        by_name: Whether it matched by name (not by id or id prefix).
        ambiguous: The jobs to choose between when `job` is None and there are matches:
            all matches of an id prefix, the active jobs of a name.
    """

    job: JobSummary | None
    matches: tuple[JobSummary, ...]
    by_name: bool
    ambiguous: tuple[JobSummary, ...] = ()


def resolve_reference(matches: list[JobSummary], text: str) -> Resolved:
    """The one job a reference means, from `named`'s matches (newest first): the API's rule.

    An id or a unique id prefix means that job; a prefix of several ids is ambiguous. A name
    means the active (not finished) job of that name if it has one, else the newest job of
    that name, so a name reused run after run means the current run; only two or more active
    jobs of one name are ambiguous. The only place this rule is written: every RPC that takes
    a job (and so every `pollux-cli` command and the dashboard) resolves through it.
    """
    found = tuple(matches)
    by_name = bool(found) and not any(_id_matches(j.order[1], text) for j in found)
    if len(found) <= 1:
        return Resolved(found[0] if found else None, found, by_name)
    if not by_name:
        return Resolved(None, found, by_name, found)
    active = tuple(j for j in found if j.state not in TERMINAL_STATES)
    if len(active) > 1:
        return Resolved(None, found, by_name, active)
    return Resolved(active[0] if active else found[0], found, by_name)


def _id_matches(job_id: str, text: str) -> bool:
    """Whether `text` is `job_id` or a prefix of it, with or without ``j-``."""
    return job_id.startswith(text) or job_id.startswith("j-" + text)


Indexed = tuple[tuple[int, str], bytes]
"""(order, key) of a job: what the mirror's indexes hold, sorted."""


def _remove(index: list[Indexed], item: Indexed) -> None:
    at = bisect.bisect_left(index, item)
    if at < len(index) and index[at] == item:
        del index[at]


TERMINAL_STATES = frozenset({pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED})
RELIST_DELAY_S = 1.0
"""Pause before re-listing a prefix whose watch failed (etcd unreachable, compacted)."""


@dataclass
class PrefixMirror(Generic[M]):
    """One etcd prefix in memory: listed, then kept current by a watch.

    Attributes:
        kind: The key kind mirrored.
        cls: Its message type.
        keep: Which values are kept in full.
        on_change: Called after each applied change (a round trigger).
        on_seen: Called with (key, value, revision) for every value listed or changed, kept
            or not, and (key, None, revision) for a delete: the jobs index and feed.
    """

    kind: Kind
    cls: type[M]
    keep: Callable[[M], bool] = lambda _: True
    on_change: Callable[[bytes], None] | None = None
    on_seen: Callable[[bytes, M | None, int], None] | None = None
    entries: dict[bytes, Entry[M]] = field(default_factory=dict)
    revision: int = 0
    """The highest etcd revision applied (the list's, then each event's)."""
    page: int = 1000
    """Keys per listing request."""
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    _listed: set[bytes] = field(default_factory=set)
    """Every key under the prefix as last known (kept or not)."""

    async def run(self, store: Store) -> None:
        """List, then follow, forever; re-list after any watch failure."""
        prefix = store.keys.prefix(self.kind)
        while True:
            try:
                revision = await self._list(store, prefix)
                async for event in store.watch(prefix, start_revision=revision + 1):
                    self._apply(event)
            except StoreError as error:
                log.warning("mirror_relisting", kind=str(self.kind), error=str(error))
                await asyncio.sleep(RELIST_DELAY_S)
            except Exception:  # a dead mirror would freeze rounds: log, re-list, go on
                log.exception("mirror_crashed", kind=str(self.kind))
                await asyncio.sleep(RELIST_DELAY_S)

    async def _list(self, store: Store, prefix: bytes) -> int:
        """Replace the mirror by a listing; returns the listing's revision.

        Page by page, so the part not kept (finished jobs) is never held whole.
        """
        entries: dict[bytes, Entry[M]] = {}
        revision = 0
        seen: set[bytes] = set()
        async for batch, at in store.scan_pages(prefix, self.cls, page=self.page):
            revision = at
            for entry in batch:
                seen.add(entry.key)
                if self.keep(entry.value):
                    entries[entry.key] = entry
                if self.on_seen is not None:
                    self.on_seen(entry.key, entry.value, entry.mod_revision)
        if self.on_seen is not None:  # keys gone while the watch was down
            for key in self._listed - seen:
                self.on_seen(key, None, revision)
        self._listed = seen
        self._replace(entries, revision)
        return revision

    def _replace(self, entries: dict[bytes, Entry[M]], revision: int) -> None:
        self.entries = entries
        self._advance(revision)
        self.ready.set()
        if self.on_change is not None:
            self.on_change(b"")

    def _apply(self, event: WatchEvent) -> None:
        if event.value is None:
            self.entries.pop(event.key, None)
            self._listed.discard(event.key)
            if self.on_seen is not None:
                self.on_seen(event.key, None, event.revision)
        else:
            try:
                value = decode(self.cls, event.value, event.key)
            except StoreError as error:
                log.error("mirror_value_corrupt", key=event.key.decode(), error=str(error))
                return
            if self.keep(value):
                previous = self.entries.get(event.key)
                created = previous.create_revision if previous else event.revision
                self.entries[event.key] = Entry(value, event.revision, created, key=event.key)
            else:
                self.entries.pop(event.key, None)
            self._listed.add(event.key)
            if self.on_seen is not None:
                self.on_seen(event.key, value, event.revision)
        self._advance(event.revision)
        if self.on_change is not None:
            self.on_change(event.key)

    def _advance(self, revision: int) -> None:
        self.revision = max(self.revision, revision)
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_for(self, revision: int, timeout: float) -> bool:
        """Wait until this mirror has applied `revision` (a write under its prefix at it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.revision < revision:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)
        return True

    def values(self) -> list[M]:
        """Every kept value."""
        return [entry.value for entry in self.entries.values()]


class ClusterMirror:
    """The active cluster state a round and ClusterStatus read, mirrored from etcd.

    Args:
        store: The cluster state store.
        on_change: Called with the changed key's kind after each change a round should see
            (jobs, nodes, replica statuses; not model refreshes, which wait for the next
            periodic round).
    """

    def __init__(self, store: Store, on_change: Callable[[], None] | None = None) -> None:
        self.store = store
        self._on_change = on_change
        self.summaries: dict[bytes, JobSummary] = {}
        """Every job by key, summarised (`JobSummary`)."""
        self._order: list[tuple[tuple[int, str], bytes]] = []
        """(order, key) of every job, sorted: ListJobs' index."""
        self._owned: dict[str, list[tuple[tuple[int, str], bytes]]] = {}
        """The same per owner: a user's listings and watches walk only their own jobs."""
        self._counts: Counter[int] = Counter()
        """Jobs per state, kept as summaries change (ClusterStatus)."""
        self._pending: Counter[tuple[str, str]] = Counter()
        """PENDING jobs per ("owner", name) and ("tenant", name) (SubmitJob's limits)."""
        self.feed = JobFeed()
        """Every job change, fanned out to WatchJobs streams (pollux.service.feed)."""
        self.jobs: PrefixMirror[pb.Job] = PrefixMirror(
            Kind.JOBS,
            pb.Job,
            keep=lambda job: job.state not in TERMINAL_STATES,
            on_change=self._changed,
            on_seen=self._summarise,
        )
        self.nodes: PrefixMirror[pb.Node] = PrefixMirror(
            Kind.NODES, pb.Node, on_change=self._changed
        )
        self.agents: PrefixMirror[pb.Member] = PrefixMirror(Kind.AGENTS, pb.Member)
        self.models: PrefixMirror[pb.JobModel] = PrefixMirror(Kind.MODELS, pb.JobModel)
        self.replicas: PrefixMirror[pb.ReplicaStatus] = PrefixMirror(
            Kind.REPLICAS, pb.ReplicaStatus, on_change=self._changed
        )
        self.tenants: PrefixMirror[pb.Tenant] = PrefixMirror(
            Kind.TENANTS, pb.Tenant, on_change=self._changed
        )
        self._mirrors: tuple[PrefixMirror[Any], ...] = (
            self.jobs,
            self.nodes,
            self.agents,
            self.models,
            self.replicas,
            self.tenants,
        )
        self._tasks: list[asyncio.Task[None]] = []

    def _changed(self, key: bytes) -> None:
        if self._on_change is not None:
            self._on_change()

    def _summarise(self, key: bytes, job: pb.Job | None, revision: int) -> None:
        old = self.summaries.pop(key, None)
        if old is not None:
            self._counts[old.state] -= 1
            _remove(self._order, (old.order, key))
            owned = self._owned.get(old.owner)
            if owned is not None:
                _remove(owned, (old.order, key))
                if not owned:
                    del self._owned[old.owner]
            if old.state == pb.JOB_STATE_PENDING:
                self._pending[("owner", old.owner)] -= 1
                self._pending[("tenant", old.tenant)] -= 1
        if job is not None:
            summary = JobSummary.of(job, revision)
            self.summaries[key] = summary
            self._counts[summary.state] += 1
            bisect.insort(self._order, (summary.order, key))
            bisect.insort(self._owned.setdefault(summary.owner, []), (summary.order, key))
            if summary.state == pb.JOB_STATE_PENDING:
                self._pending[("owner", summary.owner)] += 1
                self._pending[("tenant", summary.tenant)] += 1
        if job is not None:
            if old is None or old.revision != revision:  # not the same record listed again
                self.feed.publish(JobChange(key, job, revision))
        elif old is not None:
            self.feed.publish(JobChange(key, old.stub(), revision, deleted=True))

    def listing(self, owner: str | None) -> tuple[list[bytes], int]:
        """The keys of every job (or `owner`'s) in creation order, and the revision applied.

        Taken with no await in between, so a feed subscription made just before it receives
        every change after that revision.
        """
        index = self._order if owner is None else self._owned.get(owner, [])
        return [key for _, key in index], self.jobs.revision

    def pending(self, *, owner: str | None = None, tenant: str | None = None) -> int:
        """PENDING jobs of an owner, or of a tenant's users ("" is the default tenant)."""
        if owner is not None:
            return self._pending[("owner", owner)]
        return self._pending[("tenant", tenant or "")]

    def page(
        self,
        *,
        states: set[int],
        name_prefix: str,
        labels: dict[str, str],
        after: tuple[int, str] | None,
        limit: int,
        owner: str | None = None,
        newest_first: bool = False,
    ) -> tuple[list[bytes], bool]:
        """The next `limit` matching jobs' keys in listing order, and whether more match.

        `after` is the (creation ns, id) of the last job of the previous page (None: first);
        with `newest_first` the walk goes from the newest job backwards.
        """
        walk: Iterable[tuple[tuple[int, str], bytes]]
        index = self._order if owner is None else self._owned.get(owner, [])
        if newest_first:
            end = len(index) if after is None else bisect.bisect_left(index, (after,))
            walk = (index[i] for i in range(end - 1, -1, -1))
        else:
            start = 0 if after is None else bisect.bisect_right(index, (after, b"\xff"))
            walk = itertools.islice(index, start, None)
        keys: list[bytes] = []
        for _, key in walk:
            if self.summaries[key].matches(states, name_prefix, labels, owner):
                if len(keys) == limit:
                    return keys, True
                keys.append(key)
        return keys, False

    def named(self, text: str, owner: str | None = None) -> list[JobSummary]:
        """The jobs `text` can mean (module function `named`), newest first."""
        if owner is None:
            return named(self.summaries.values(), text, owner)
        return named((self.summaries[k] for _, k in self._owned.get(owner, ())), text, owner)

    async def start(self) -> None:
        """Start following etcd; returns once every prefix is listed."""
        self._tasks = [
            asyncio.create_task(m.run(self.store), name=f"mirror-{m.kind}") for m in self._mirrors
        ]
        started = asyncio.get_running_loop().time()
        await asyncio.gather(*(m.ready.wait() for m in self._mirrors))
        log.info(
            "mirror_ready",
            jobs=len(self.summaries),
            active_jobs=len(self.jobs.entries),
            seconds=round(asyncio.get_running_loop().time() - started, 3),
        )

    async def stop(self) -> None:
        """Stop following.

        `cancel_and_wait`, not one `cancel()`: a cancel that reaches a watch being created is
        swallowed by aetcd's `wait_for`, and the mirror would then follow etcd forever.
        """
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks = []

    async def catch_up(self, timeout: float, *, jobs_only: bool = False) -> bool:
        """Wait until every prefix (or the jobs') holds every write made before this call.

        One keys-only request per prefix asks etcd for its newest change after the mirror's
        revision; the mirror then waits for its watch to deliver it (deletes do not show this
        way; a job deleted meanwhile is skipped by its reader). False on timeout.
        """
        for mirror in (self.jobs,) if jobs_only else self._mirrors:
            prefix = self.store.keys.prefix(mirror.kind)
            newest = await self.store.newest_change(prefix, after=mirror.revision)
            if newest and not await mirror.wait_for(newest, timeout):
                return False
        return True

    @property
    def ready(self) -> bool:
        """Whether every prefix has been listed at least once."""
        return all(m.ready.is_set() for m in self._mirrors)

    def snapshot(self) -> Snapshot:
        """The active state now, as a round reads it (a copy: later changes do not leak in)."""
        jobs = {entry.value.id: entry for entry in self.jobs.entries.values()}
        return Snapshot(
            revision=min(m.revision for m in self._mirrors),
            jobs=jobs,
            nodes={n.name: n for n in self.nodes.values()},
            agents=self.agents.values(),
            models={m.job_id: m for m in self.models.values() if m.job_id in jobs},
            replicas=[r for r in self.replicas.values() if r.job_id in jobs],
            tenants=self.tenants.values(),
        )

    def state_counts(self) -> dict[int, int]:
        """Jobs per state, finished ones included."""
        return {state: n for state, n in self._counts.items() if n > 0}
