"""Replicas a previous launcher process of this node left running: stopped and closed.

A RUNNING status that names this node but no replica this process started belongs to a
previous launcher process that died without stopping it. Its process (if it still exists and
carries the job's environment, proc.py) is stopped, and the status is closed as a planned stop
(143): the launcher never restarts replicas itself; the scheduler re-allocates.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from pollux.launcher import proc
from pollux.launcher.replica import PLANNED_STOP
from pollux.launcher.statuses import StatusWriter
from pollux.service.store import Entry
from pollux.v1 import types_pb2 as pb

ReplicaKey = tuple[str, int, int]
"""(job id, generation, rank)."""


class OrphanReaper:
    """Finds and stops this node's orphaned replicas.

    Args:
        node_name: This node.
        statuses: Writes the orphans' closing statuses.
        grace_s: How long an orphan gets between SIGTERM and SIGKILL.
        known: Whether a replica is this process's own (never an orphan).
        spawn: Runs a background task the launcher waits for at shutdown.
        reaped: Called after each orphan's status is closed (the launcher looks again).
    """

    def __init__(
        self,
        node_name: str,
        statuses: StatusWriter,
        *,
        grace_s: float,
        known: Callable[[ReplicaKey], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        reaped: Callable[[], None],
    ) -> None:
        self.node_name = node_name
        self._statuses = statuses
        self._grace_s = grace_s
        self._known = known
        self._spawn = spawn
        self._reaped = reaped
        self._reaping: set[ReplicaKey] = set()
        self._log = structlog.get_logger(__name__).bind(node_id=node_name)

    def adopt_if_orphan(self, entry: Entry[pb.ReplicaStatus]) -> bool:
        """Start reaping the status's replica if it is an orphan of this node; whether it is."""
        status = entry.value
        key = (status.job_id, status.generation, status.rank)
        if (
            status.node != self.node_name
            or status.phase == pb.REPLICA_PHASE_EXITED
            or self._known(key)
            or key in self._reaping
        ):
            return False
        self._reaping.add(key)
        self._log.warning(
            "orphan_replica",
            job_id=status.job_id,
            generation=status.generation,
            rank=status.rank,
            pid=status.pid,
        )
        self._spawn(self.reap(entry))
        return True

    async def reap(self, entry: Entry[pb.ReplicaStatus]) -> None:
        """Stop a previous launcher process's replica and close its status."""
        status = pb.ReplicaStatus()
        status.CopyFrom(entry.value)
        code = PLANNED_STOP
        if status.pid and proc.is_replica(status.pid, status.job_id, status.generation):
            code = await proc.stop_foreign(status.pid, self._grace_s)
        status.phase = pb.REPLICA_PHASE_EXITED
        status.exit_code = code
        status.time.GetCurrentTime()
        await self._statuses.report_exit(status, expected=entry.mod_revision)
        self._reaping.discard((status.job_id, status.generation, status.rank))
        self._reaped()
