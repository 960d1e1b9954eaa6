"""The generation barrier: a job never runs two generations at once (checkpoint safety).

A new generation's replicas start only when every replica status of an older generation of
the job — on any node — is EXITED, or names a node that is no longer registered. Starting is
then made safe against races by writing the new replicas' RUNNING statuses *before* spawning
them, in one etcd transaction that requires the allocation to be unchanged since it was read
and the status keys to be unchanged since the barrier read them (`claim`): a launcher that saw
a stale allocation, or that raced another node's write, spawns nothing. Pure functions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pollux.service.keys import Keys
from pollux.service.store import Entry, Expect, Put
from pollux.v1 import types_pb2 as pb


def blockers(
    statuses: Sequence[Entry[pb.ReplicaStatus]], generation: int, nodes: Collection[str]
) -> list[Entry[pb.ReplicaStatus]]:
    """The statuses of an older generation that may still run (not EXITED, node registered)."""
    return [
        entry
        for entry in statuses
        if entry.value.generation < generation
        and entry.value.phase != pb.REPLICA_PHASE_EXITED
        and entry.value.node in nodes
    ]


def describe(entry: Entry[pb.ReplicaStatus]) -> str:
    """A blocker as the barrier's log line names it: node/rank@generation."""
    status = entry.value
    return f"{status.node}/{status.rank}@{status.generation}"


def claim(
    keys: Keys,
    job_id: str,
    allocation_revision: int,
    starting: Sequence[pb.ReplicaStatus],
    seen: Mapping[int, Entry[pb.ReplicaStatus]],
) -> tuple[list[Put], list[Expect]]:
    """The conditional write of the starting replicas' statuses (ops, preconditions).

    Args:
        keys: The key layout.
        job_id: The job.
        allocation_revision: Mod revision of the allocation the launch follows.
        starting: The statuses of this node's replicas of the new generation.
        seen: The job's statuses by rank, as the barrier read them.
    """
    expect = [Expect(keys.allocation(job_id), allocation_revision)]
    for status in starting:
        held = seen.get(status.rank)
        expect.append(Expect(keys.replica(job_id, status.rank), held.mod_revision if held else 0))
    ops = [Put(keys.replica(job_id, s.rank), s.SerializeToString()) for s in starting]
    return ops, expect
