"""The etcd key layout (design.md §3): the only place that spells a key.

Every key lives under a root prefix (default ``/pollux/v1``; tests use a unique root each, so
one etcd serves many tests). Ids are validated before they reach a key, so a key can never
escape its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ROOT = "/pollux/v1"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builder for one deployment root.

    Attributes:
        root: Root prefix without a trailing slash, e.g. ``/pollux/v1``.
    """

    root: str = DEFAULT_ROOT

    def _key(self, *parts: str) -> bytes:
        return "/".join((self.root, *parts)).encode()

    def prefix(self, kind: str) -> bytes:
        """Prefix of every key of a kind, e.g. ``prefix("jobs")`` → ``/pollux/v1/jobs/``."""
        return self._key(kind, "")

    def leader(self, lease_id: int) -> bytes:
        """Election key of a scheduler session (lease id in hex, as etcd's recipe)."""
        return self._key("leader", f"{lease_id:x}")

    def job(self, job_id: str) -> bytes:
        """A job record (spec, status, history)."""
        return self._key("jobs", job_id)

    def request(self, request_id: str) -> bytes:
        """Idempotency index: SubmitJob request id → job id."""
        return self._key("requests", request_id)

    def node(self, name: str) -> bytes:
        """A node registration (leased by its launcher)."""
        return self._key("nodes", name)

    def agent(self, agent_id: str) -> bytes:
        """An agent registration (leased by the agent)."""
        return self._key("agents", agent_id)

    def model(self, job_id: str) -> bytes:
        """A job's latest fitted model."""
        return self._key("models", job_id)

    def observations(self, job_id: str) -> bytes:
        """A job's observation profile."""
        return self._key("observations", job_id)

    def allocation(self, job_id: str) -> bytes:
        """A job's allocation (what launchers watch)."""
        return self._key("allocations", job_id)

    def replica(self, job_id: str, rank: int) -> bytes:
        """A replica's status, written by the launcher running it."""
        return self._key("replicas", job_id, f"{rank:05d}")

    def replicas_of(self, job_id: str) -> bytes:
        """Prefix of a job's replica statuses."""
        return self._key("replicas", job_id, "")

    def decision(self, round_number: int) -> bytes:
        """A round's decision record (zero-padded so keys sort by round)."""
        return self._key("decisions", f"{round_number:020d}")

    def name_of(self, key: bytes, kind: str) -> str:
        """The id part of a key of a kind: ``name_of(job("j-1"), "jobs")`` → ``"j-1"``."""
        head = self.prefix(kind)
        if not key.startswith(head):
            raise ValueError(f"{key!r} is not a {kind} key under {self.root}")
        return key[len(head) :].decode()
