"""The cluster state in etcd, typed by entity: jobs, nodes, agents, models, allocations.

`Store` is the generic `EtcdKV` (pollux.service.etcd.kv: typed reads, fenced transactions,
watches, leases) with Pollux's key layout (`Keys`) and the domain operations every service
shares on top. Its names are re-exported here, so services import the store's vocabulary
(`Put`, `Conflict`, `Fence` ...) from one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pollux.service.etcd import client as etcd_client
from pollux.service.etcd.errors import (
    NOSPACE_MESSAGE,
    Conflict,
    CorruptValue,
    FenceLost,
    StoreError,
    StoreFull,
    StoreUnavailable,
    ValueTooLarge,
)
from pollux.service.etcd.kv import (
    MAX_TXN_BYTES,
    MAX_VALUE_BYTES,
    Delete,
    Entry,
    EtcdKV,
    Exists,
    Expect,
    Fence,
    Put,
    WatchEvent,
    cancel_and_wait,
    decode,
    txn_bytes,
)
from pollux.service.etcd.maintenance import MemberStatus
from pollux.service.keys import DEFAULT_ROOT, Keys, Kind
from pollux.service.tls import TlsFiles
from pollux.v1 import types_pb2 as pb

__all__ = [
    "MAX_TXN_BYTES",
    "MAX_VALUE_BYTES",
    "NOSPACE_MESSAGE",
    "Conflict",
    "CorruptValue",
    "Delete",
    "Entry",
    "Exists",
    "Expect",
    "Fence",
    "FenceLost",
    "MemberStatus",
    "Put",
    "Snapshot",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "ValueTooLarge",
    "WatchEvent",
    "cancel_and_wait",
    "decode",
    "record_deletes",
    "side_state_deletes",
    "txn_bytes",
]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster state at one etcd revision (what a scheduling round reads).

    Attributes:
        revision: The etcd revision every part reflects.
        jobs: Job records by id, with their mod revisions for the round's conditional writes.
        nodes: Registered nodes by name.
        agents: Registered agents.
        models: Latest job models by job id.
        replicas: Replica statuses of every job.
        tenants: The tenants an admin defined (their guarantees, weights and caps).
    """

    revision: int
    jobs: dict[str, Entry[pb.Job]]
    nodes: dict[str, pb.Node]
    agents: list[pb.Member]
    models: dict[str, pb.JobModel]
    replicas: list[pb.ReplicaStatus]
    tenants: list[pb.Tenant] = field(default_factory=list)


def side_state_deletes(
    keys: Keys, job: pb.Job, *, keep_profile: bool = False
) -> list[Put | Delete]:
    """Deletes of everything stored for a job besides its record.

    That is its idempotency key, model, observation profile, allocation and replica statuses:
    what serves a running job. Its timeline is not: it is the finished job's picture, and goes
    with the record (`record_deletes`). With `keep_profile`, the model and observation profile
    stay: a finished run's measurements that a later run of its name is seeded from.
    """
    deletes: list[Put | Delete] = [
        Delete(keys.request(job.request_id)),
        Delete(keys.allocation(job.id)),
        Delete(keys.replicas_of(job.id), prefix=True),
    ]
    if not keep_profile:
        deletes += [Delete(keys.model(job.id)), Delete(keys.observations(job.id))]
    return deletes


def record_deletes(keys: Keys, job: pb.Job) -> list[Put | Delete]:
    """Deletes of a job's record and what lives as long as it (its timeline)."""
    return [Delete(keys.job(job.id)), Delete(keys.timeline(job.id))]


class Store(EtcdKV):
    """The cluster state in etcd, typed by entity.

    Args:
        client: A connected aetcd client (the store does not own it unless made by `connect`).
        root: Key root (`Keys.root`); tests use a unique root each.
        owned: Whether `close` closes the client.
        tls: The TLS files the client was dialled with (None: plaintext).
    """

    def __init__(
        self,
        client: Any,
        root: str = DEFAULT_ROOT,
        *,
        owned: bool = False,
        tls: TlsFiles | None = None,
    ) -> None:
        super().__init__(client, owned=owned, tls=tls)
        self.keys = Keys(root)
        self.track_writes(self.keys.prefix(Kind.JOBS))

    @classmethod
    async def connect(
        cls,
        endpoint: str,
        root: str = DEFAULT_ROOT,
        *,
        timeout_s: float = 5.0,
        tls: TlsFiles | None = None,
    ) -> Store:
        """Connect to etcd (`etcd.client.dial`); the store owns the connection.

        Raises:
            ValueError: A malformed endpoint (etcd_target.EndpointError).
            StoreUnavailable: etcd could not be reached.
        """
        client = await etcd_client.dial(endpoint, timeout_s=timeout_s, tls=tls)
        return cls(client, root, owned=True, tls=tls)

    @property
    def jobs_written(self) -> int:
        """Revision of the last job-record write made through this store.

        Read your writes: a replica's mirror waits for it before answering a listing.
        """
        return self.written(self.keys.prefix(Kind.JOBS))

    async def snapshot(self) -> Snapshot:
        """Jobs, nodes, agents, models, allocations and replica statuses at one revision."""
        jobs, revision = await self.list_jobs()
        k = self.keys
        nodes, _ = await self.scan(k.prefix(Kind.NODES), pb.Node, revision=revision)
        agents, _ = await self.scan(k.prefix(Kind.AGENTS), pb.Member, revision=revision)
        models, _ = await self.scan(k.prefix(Kind.MODELS), pb.JobModel, revision=revision)
        replicas, _ = await self.scan(k.prefix(Kind.REPLICAS), pb.ReplicaStatus, revision=revision)
        tenants, _ = await self.scan(k.prefix(Kind.TENANTS), pb.Tenant, revision=revision)
        return Snapshot(
            revision=revision,
            jobs={e.value.id: e for e in jobs},
            nodes={e.value.name: e.value for e in nodes},
            agents=[e.value for e in agents],
            models={e.value.job_id: e.value for e in models},
            replicas=[e.value for e in replicas],
            tenants=[e.value for e in tenants],
        )

    # -- typed entities ------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> Entry[pb.Job] | None:
        """A job record."""
        return await self.get(self.keys.job(job_id), pb.Job)

    async def list_jobs(self) -> tuple[list[Entry[pb.Job]], int]:
        """Every job record (key order = id order) and the revision read."""
        return await self.scan(self.keys.prefix(Kind.JOBS), pb.Job)

    async def create_job(
        self, job: pb.Job, seed: tuple[pb.ObservationProfile, pb.JobModel] | None = None
    ) -> tuple[pb.Job, bool]:
        """Store a new job unless its request id was seen; returns (stored job, created).

        The request index and the job are written in one transaction that requires the index to
        be absent, so two concurrent submits with one request id create one job. A `seed`
        (pollux.service.seeding) is the job's first profile and model, written with it.
        """
        k = self.keys
        index = k.request(job.request_id)
        for _ in range(5):
            ops = [Put(index, job.id.encode()), Put(k.job(job.id), job.SerializeToString())]
            expect = [Expect(index, 0), Expect(k.job(job.id), 0)]
            if seed is not None:
                profile, model = seed
                ops += [
                    Put(k.observations(job.id), profile.SerializeToString()),
                    Put(k.model(job.id), model.SerializeToString()),
                ]
                expect += [Expect(k.observations(job.id), 0), Expect(k.model(job.id), 0)]
            try:
                await self.txn(ops, expect=expect)
                return job, True
            except Conflict:
                held = await self.get_bytes(index)
                if held is None:
                    continue  # the job id collided, not the request id: caller's id is unique
                existing = await self.get_job(held.decode())
                if existing is not None:
                    return existing.value, False
        raise StoreError(f"could not store job {job.id}: repeated conflicts")

    async def job_of_request(self, request_id: str) -> Entry[pb.Job] | None:
        """The job a submit with `request_id` created, if one did and it still exists."""
        held = await self.get_bytes(self.keys.request(request_id))
        return None if held is None else await self.get_job(held.decode())

    async def update_job(self, job: pb.Job, *, expected: int, fence: Fence | None = None) -> int:
        """Replace a job record read at mod revision `expected`; returns the new revision."""
        key = self.keys.job(job.id)
        return await self.txn(
            [Put(key, job.SerializeToString())], expect=[Expect(key, expected)], fence=fence
        )

    async def delete_job(self, job: pb.Job, *, expected: int) -> None:
        """Delete a job with its request index, model, observations, allocation and replicas."""
        k = self.keys
        await self.txn(
            [*record_deletes(k, job), *side_state_deletes(k, job)],
            expect=[Expect(k.job(job.id), expected)],
        )

    async def list_nodes(self) -> tuple[list[Entry[pb.Node]], int]:
        """Registered nodes."""
        return await self.scan(self.keys.prefix(Kind.NODES), pb.Node)

    async def register_node(self, node: pb.Node, *, lease: int) -> int:
        """(Re-)register a node under its launcher's lease."""
        return await self.put(self.keys.node(node.name), node, lease=lease)

    async def list_agents(self) -> tuple[list[Entry[pb.Member]], int]:
        """Registered agents."""
        return await self.scan(self.keys.prefix(Kind.AGENTS), pb.Member)

    async def register_agent(self, agent: pb.Member, *, lease: int) -> int:
        """(Re-)register an agent under its lease."""
        return await self.put(self.keys.agent(agent.id), agent, lease=lease)

    async def get_model(self, job_id: str) -> Entry[pb.JobModel] | None:
        """A job's latest model."""
        return await self.get(self.keys.model(job_id), pb.JobModel)

    async def get_timeline(self, job_id: str) -> Entry[pb.JobTimeline] | None:
        """A job's timeline; None before its first point."""
        return await self.get(self.keys.timeline(job_id), pb.JobTimeline)

    async def get_profile(self, job_id: str) -> Entry[pb.ObservationProfile] | None:
        """A job's observation profile."""
        return await self.get(self.keys.observations(job_id), pb.ObservationProfile)

    async def save_profile_and_model(
        self,
        profile: pb.ObservationProfile,
        model: pb.JobModel | None,
        *,
        expected: int,
        timeline: pb.JobTimeline | None = None,
    ) -> int:
        """Write a job's profile (read at `expected`; 0 = new), its model and timeline, at once.

        Model and timeline only when given. Only while the job exists: a deleted job's agent
        cannot resurrect its keys.

        Raises:
            Conflict: The profile changed since `expected`, or the job is gone (nothing written).
            ValueTooLarge: The profile or model is over its bound (nothing sent).
        """
        k = self.keys
        job_key = k.job(profile.job_id)
        ops: list[Put | Delete] = [Put(k.observations(profile.job_id), profile.SerializeToString())]
        if model is not None:
            ops.append(Put(k.model(profile.job_id), model.SerializeToString()))
        if timeline is not None:
            ops.append(Put(k.timeline(profile.job_id), timeline.SerializeToString()))
        # The job's presence first: a deleted job is named as the conflict.
        return await self.txn(
            ops, expect=[Exists(job_key), Expect(k.observations(profile.job_id), expected)]
        )

    async def list_allocations(self) -> tuple[dict[str, Entry[pb.Allocation]], int]:
        """Every allocation by job id, and the revision read."""
        entries, revision = await self.scan(self.keys.prefix(Kind.ALLOCATIONS), pb.Allocation)
        return {self.keys.name_of(e.key, Kind.ALLOCATIONS): e for e in entries}, revision

    async def put_replica_status(self, status: pb.ReplicaStatus, *, lease: int = 0) -> int:
        """Record a replica's phase (launchers)."""
        return await self.put(self.keys.replica(status.job_id, status.rank), status, lease=lease)

    async def list_replica_statuses(
        self, job_id: str | None = None
    ) -> tuple[list[Entry[pb.ReplicaStatus]], int]:
        """Replica statuses of one job, or of every job."""
        prefix = self.keys.replicas_of(job_id) if job_id else self.keys.prefix(Kind.REPLICAS)
        return await self.scan(prefix, pb.ReplicaStatus)

    async def latest_decisions(self, limit: int) -> list[pb.Decision]:
        """The most recent decisions, newest first."""
        entries = await self.newest(self.keys.prefix(Kind.DECISIONS), pb.Decision, limit=limit)
        return [e.value for e in entries]
