"""What every SchedulerService concern shares: dependencies, job lookup, leader hints.

A job reference (id, unique id prefix or name) is resolved once per call (`_job`), ownership
is checked on the job it resolved to, and only that job's id goes further (to etcd, to a
launcher). Responses carry the current leader's id and address in trailing metadata
(`pollux-leader-id`, `pollux-leader-address`) so clients learn it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeAlias

import grpc
import structlog

from pollux.policy.registry import PolicySpec, make_policy
from pollux.policy.types import Policy
from pollux.scheduler.access import check_job, check_person, owner_filter
from pollux.scheduler.forecaster import Forecaster
from pollux.scheduler.leader import current_leader
from pollux.scheduler.lifecycle import TERMINAL, state_name
from pollux.scheduler.limits import LimitsConfig, SubmitLimits
from pollux.scheduler.logs import LauncherLogs
from pollux.service import auth
from pollux.service.errors import InvalidArgument, NotFound
from pollux.service.mirror import (
    ClusterMirror,
    JobSummary,
    Resolved,
    named,
    resolve_reference,
)
from pollux.service.rpc import annotate
from pollux.service.store import Entry, Store
from pollux.terminal import quoted
from pollux.v1 import types_pb2 as pb

log = structlog.get_logger(__name__)
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

MAX_JOB_REF = 128
"""Longest text taken as a job reference (ids are 12 characters, names at most 63)."""

AMBIGUOUS_SHOWN = 10
"""Candidates an ambiguous job reference's error lists."""
RESOLVED_ID_KEY = "pollux-resolved-job-id"
"""Initial metadata: the id of the job a name shared by several jobs was resolved to."""
RESOLVED_NOTE_KEY = "pollux-resolved-job"
"""Initial metadata: which job that name meant and why, in words (ASCII: names, ids, states)."""


def _ambiguous(text: str, resolved: Resolved) -> InvalidArgument:
    """The error of a reference that names several jobs it cannot choose between."""
    jobs = resolved.ambiguous
    listed = ", ".join(
        f"{j.order[1]} ({j.name}, {state_name(j.state)})" for j in jobs[:AMBIGUOUS_SHOWN]
    )
    more = f" and {len(jobs) - AMBIGUOUS_SHOWN} more" if len(jobs) > AMBIGUOUS_SHOWN else ""
    if resolved.by_name:
        problem = (
            f"{quoted(text)} names {len(jobs)} active jobs: {listed}{more}; use the id (or a "
            "unique prefix of it) of the one you mean"
        )
    else:
        problem = f"{quoted(text)} matches {len(jobs)} jobs: {listed}{more}; use more of the id"
    return InvalidArgument([("job_id", problem)], headline="ambiguous job reference")


def _resolution_note(text: str, job: pb.Job, count: int, now: float) -> str:
    """``ddp-plain: the newest of 3 jobs of that name, j-… (SUCCEEDED 5 min ago)``."""
    state = state_name(job.state)
    if job.state in TERMINAL:
        which = f"the newest of {count} jobs of that name"
        since = job.finish_time if job.HasField("finish_time") else job.create_time
        when = f"{state} {_ago(now - since.ToNanoseconds() / 1e9)}"
    else:
        which = f"the active one of {count} jobs of that name"
        when = f"{state}, submitted {_ago(now - job.create_time.ToNanoseconds() / 1e9)}"
    note = f"{text}: {which}, {job.id} ({when})"
    return note if note.isascii() else note.encode("ascii", "backslashreplace").decode()


def _ago(seconds: float) -> str:
    """``45 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``."""
    left = max(int(seconds), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if left >= size:
            return f"{left // size} {unit} ago"
    return f"{left} s ago"


def creation_order(job: pb.Job) -> tuple[int, str]:
    """A job's place in listing order: (creation time in ns, id)."""
    return job.create_time.ToNanoseconds(), job.id


class ServicerBase:
    """The state and helpers of one replica's SchedulerService.

    Args:
        store: The cluster state store.
        replica_id: This replica's id (ClusterStatus.answered_by).
        on_change: Called after a write a round should react to (the local scheduler's trigger).
        last_round: Returns the last round this replica ran or saw.
        clock: Wall-clock seconds.
        warnings: The replica's configuration warnings (ClusterStatus.warnings).
        mirror: The replica's mirror of the cluster state (None: read etcd).
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
        self.dashboard_url = ""
        """This replica's web dashboard, once it serves one (set by the service's main)."""
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

    async def _job(
        self, job_id: str, action: str, context: Context | None = None
    ) -> tuple[pb.Job, int]:
        """The job and its revision, if the caller may do `action` on it.

        A name that several of the caller's jobs carry is resolved by `resolve_reference`;
        which of them it meant is sent to the caller in the initial metadata
        (`RESOLVED_NOTE_KEY`, for `pollux-cli` to print) when `context` is given.
        """
        check_person(auth.current(), action)
        if not job_id:
            raise InvalidArgument([("job_id", "required: a job id, a unique prefix or a name")])
        entry = await self.store.get_job(job_id) if len(job_id) <= MAX_JOB_REF else None
        if entry is not None and not auth.may_act_on_job(auth.current(), entry.value.owner):
            # Another user's job is answered as one that does not exist, word for word: an
            # id (or its owner) must not be probed by the difference.
            entry = None
        note = ""
        if entry is None:
            entry, note = await self._named(job_id)
        check_job(auth.current(), entry.value, action)
        if entry.value.id != job_id:
            annotate(resolved_job_id=entry.value.id)
        if note and context is not None:
            await context.send_initial_metadata(
                ((RESOLVED_ID_KEY, entry.value.id), (RESOLVED_NOTE_KEY, note))
            )
        return entry.value, entry.mod_revision

    async def _named(self, text: str) -> tuple[Entry[pb.Job], str]:
        """The job `text` names as a unique id prefix or name (`resolve_reference`'s rule).

        Returns it with a note saying which job a name shared by several meant ("" otherwise).

        Raises:
            NotFound: It names none of the caller's jobs.
            InvalidArgument: It names several it cannot choose between; the message lists
                them, newest first.
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
        resolved = resolve_reference(found, text)
        if resolved.job is None and resolved.ambiguous:
            raise _ambiguous(text, resolved)
        entry = await self.store.get_job(resolved.job.order[1]) if resolved.job else None
        if entry is None:
            raise NotFound(
                f"job {quoted(text)} not found: no job you can see has that id, id prefix or name "
                "(pollux-cli ls lists jobs)"
            )
        note = ""
        if resolved.by_name and len(resolved.matches) > 1:
            note = _resolution_note(text, entry.value, len(resolved.matches), self.clock())
        return entry, note

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
        named = sorted((j for j in jobs if j.spec.name == name), key=creation_order, reverse=True)[
            :50
        ]
        models = await self.store.get_many(
            [self.store.keys.model(j.id) for j in named], pb.JobModel
        )
        for job, entry in zip(named, models, strict=True):
            if entry is not None and usable(entry.value):
                return job.id, entry.value
        return None
