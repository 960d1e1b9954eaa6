"""The etcd key layout (docs/architecture.md §3): the only place that spells a key.

Every key lives under a root prefix (default ``/pollux/v1``; tests use a unique root each, so
one etcd serves many tests). The kinds of key are the `Kind` enum, so a prefix or an id is
asked for by kind (``keys.prefix(Kind.JOBS)``), never by a string spelled elsewhere. Ids are
validated before they reach a key, so a key can never escape its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

DEFAULT_ROOT = "/pollux/v1"


class Kind(StrEnum):
    """The kinds of key under a root, each the first path segment after it."""

    LEADER = "leader"
    """Scheduler election keys, leased by each replica's session."""
    JOBS = "jobs"
    """Job records: spec, status, transition history."""
    REQUESTS = "requests"
    """SubmitJob idempotency index: request id → job id."""
    NODES = "nodes"
    """Node registrations, leased by their launchers."""
    AGENTS = "agents"
    """Agent registrations, leased by the agents."""
    MODELS = "models"
    """Each job's latest fitted model, written by its agent."""
    OBSERVATIONS = "observations"
    """Each job's observation profile, so a new agent resumes the fit."""
    TIMELINES = "timelines"
    """Each job's sampled life (bounded), written by its agent with the profile."""
    ALLOCATIONS = "allocations"
    """Each job's allocation: what launchers watch."""
    REPLICAS = "replicas"
    """Replica statuses, by job and rank, written by launchers."""
    DECISIONS = "decisions"
    """Decision records of scheduling rounds (bounded history)."""
    TOKENS = "tokens"
    """People's API tokens (secret digests only), by token id; expired ones are removed."""
    TENANTS = "tenants"
    """Tenants (teams) with their GPU guarantee, weight and cap."""
    USAGE = "usage"
    """Per-day usage by tenant and user; outlives jobs, kept for the usage retention."""
    AUDIT = "audit"
    """Audit records of mutations, by time (bounded count and age)."""
    SECRETS = "secrets"
    """Cluster secrets: the key job credentials are made with."""
    JOB_USERS = "job-users"
    """Each job's replica uid, by job and by uid (launchers claim and release them)."""


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builder for one deployment root.

    Attributes:
        root: Root prefix without a trailing slash, e.g. ``/pollux/v1``.
    """

    root: str = DEFAULT_ROOT

    def _key(self, *parts: str) -> bytes:
        return "/".join((self.root, *parts)).encode()

    def prefix(self, kind: Kind) -> bytes:
        """Prefix of every key of a kind: ``prefix(Kind.JOBS)`` → ``/pollux/v1/jobs/``."""
        return self._key(kind, "")

    def leader(self, lease_id: int) -> bytes:
        """Election key of a scheduler session (lease id in hex, as etcd's recipe)."""
        return self._key(Kind.LEADER, f"{lease_id:x}")

    def job(self, job_id: str) -> bytes:
        """A job record (spec, status, history)."""
        return self._key(Kind.JOBS, job_id)

    def request(self, request_id: str) -> bytes:
        """Idempotency index: SubmitJob request id → job id."""
        return self._key(Kind.REQUESTS, request_id)

    def node(self, name: str) -> bytes:
        """A node registration (leased by its launcher)."""
        return self._key(Kind.NODES, name)

    def agent(self, agent_id: str) -> bytes:
        """An agent registration (leased by the agent)."""
        return self._key(Kind.AGENTS, agent_id)

    def model(self, job_id: str) -> bytes:
        """A job's latest fitted model."""
        return self._key(Kind.MODELS, job_id)

    def observations(self, job_id: str) -> bytes:
        """A job's observation profile."""
        return self._key(Kind.OBSERVATIONS, job_id)

    def timeline(self, job_id: str) -> bytes:
        """A job's timeline (`pb.JobTimeline`)."""
        return self._key(Kind.TIMELINES, job_id)

    def allocation(self, job_id: str) -> bytes:
        """A job's allocation (what launchers watch)."""
        return self._key(Kind.ALLOCATIONS, job_id)

    def replica(self, job_id: str, rank: int) -> bytes:
        """A replica's status, written by the launcher running it."""
        return self._key(Kind.REPLICAS, job_id, f"{rank:05d}")

    def replicas_of(self, job_id: str) -> bytes:
        """Prefix of a job's replica statuses."""
        return self._key(Kind.REPLICAS, job_id, "")

    def decision(self, round_number: int) -> bytes:
        """A round's decision record (zero-padded so keys sort by round)."""
        return self._key(Kind.DECISIONS, f"{round_number:020d}")

    def token(self, token_id: str) -> bytes:
        """An API token record."""
        return self._key(Kind.TOKENS, token_id)

    def tenant(self, name: str) -> bytes:
        """A tenant."""
        return self._key(Kind.TENANTS, name)

    def usage(self, day: str, tenant: str, user: str) -> bytes:
        """One day's usage of a user of a tenant (day first: old days are one range)."""
        return self._key(Kind.USAGE, day, tenant or "-", user)

    def usage_day(self, day: str) -> bytes:
        """Prefix of one day's usage records."""
        return self._key(Kind.USAGE, day, "")

    def audit(self, time_ns: int, nonce: str) -> bytes:
        """An audit record (zero-padded time first, so keys sort by time)."""
        return self._key(Kind.AUDIT, f"{time_ns:020d}-{nonce}")

    def job_credential_key(self) -> bytes:
        """The secret job credentials are derived from."""
        return self._key(Kind.SECRETS, "job-credential-key")

    def job_user(self, job_id: str) -> bytes:
        """The uid claim of a job (`pb.JobUser`), by job id."""
        return self._key(Kind.JOB_USERS, "jobs", job_id)

    def job_users(self) -> bytes:
        """Prefix of every job's uid claim, by job id."""
        return self._key(Kind.JOB_USERS, "jobs", "")

    def job_uid(self, uid: int) -> bytes:
        """The uid claim of a uid (`pb.JobUser`), zero-padded so keys sort by uid."""
        return self._key(Kind.JOB_USERS, "uids", f"{uid:010d}")

    def name_of(self, key: bytes, kind: Kind) -> str:
        """The id part of a key of a kind: ``name_of(job("j-1"), Kind.JOBS)`` → ``"j-1"``."""
        head = self.prefix(kind)
        if not key.startswith(head):
            raise ValueError(f"{key!r} is not a {kind} key under {self.root}")
        return key[len(head) :].decode()
