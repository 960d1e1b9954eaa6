"""Which agent owns a job: rendezvous (highest-random-weight) hashing.

Every process that knows the live agent set (agents, launchers) computes the same owner for a
job without talking to anyone, and when an agent leaves only the jobs it owned move; when one
joins, it takes over only the jobs it now wins (docs/architecture.md §1 item 3). Weights come from
BLAKE2b, never Python's `hash()`, which is salted per process.

The launcher imports this module to order POLLUX_AGENT_ADDR (owner first, the rest as
fallbacks), so it imports nothing beyond the standard library.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def weight(job_id: str, agent_id: str) -> int:
    """The agent's 64-bit rendezvous weight for a job (the same in every process)."""
    digest = hashlib.blake2b(
        job_id.encode() + b"\0" + agent_id.encode(), digest_size=8, person=b"pollux-rv"
    ).digest()
    return int.from_bytes(digest, "big")


@overload
def ranked(job_id: str, agents: Iterable[str]) -> list[str]: ...


@overload
def ranked(job_id: str, agents: Iterable[T], *, key: Callable[[T], str]) -> list[T]: ...


def ranked(job_id: str, agents: Iterable[Any], *, key: Callable[[Any], str] = str) -> list[Any]:
    """Agents in order of preference for a job: the owner first, then its fallbacks.

    Args:
        job_id: The job.
        agents: Agent ids, or any objects (e.g. registrations) with `key` giving the id.
        key: The agent id of an element of `agents`; the element itself by default.

    Returns:
        A new list, highest weight first; ties (only possible for equal ids) break by id.
    """
    return sorted(agents, key=lambda a: (-weight(job_id, key(a)), key(a)))


def owner(job_id: str, agent_ids: Iterable[str]) -> str | None:
    """The agent that owns a job, or None when no agent is live."""
    best: tuple[int, str] | None = None
    for agent_id in agent_ids:
        candidate = (weight(job_id, agent_id), agent_id)
        if (
            best is None
            or candidate[0] > best[0]
            or (candidate[0] == best[0] and candidate[1] < best[1])
        ):
            best = candidate
    return None if best is None else best[1]
