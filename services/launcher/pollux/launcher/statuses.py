"""Replica status writes: each conditional on the writer's own last write of the key.

Statuses are unleased (the scheduler reads exit codes after a node is gone). A replica's exit is
written conditionally on its own last status write, so a late report from a partitioned node
never overwrites the status of a newer generation's replica of the same rank.
"""

from __future__ import annotations

import asyncio

import structlog

from pollux.launcher.replica import PLANNED_STOP
from pollux.service.store import Conflict, Expect, Put, Store, StoreError
from pollux.v1 import types_pb2 as pb


def exit_outcome(code: int) -> str:
    """How the scheduler reads an exit code: success, planned_stop or failure."""
    if code == 0:
        return "success"
    return "planned_stop" if code == PLANNED_STOP else "failure"


class StatusWriter:
    """Writes this node's replica statuses.

    Args:
        store: The cluster state.
        node_name: This node (for the log lines).
    """

    def __init__(self, store: Store, node_name: str) -> None:
        self.store = store
        self._log = structlog.get_logger(__name__).bind(node_id=node_name)

    async def write(self, status: pb.ReplicaStatus, *, expected: int) -> int:
        """Write a status if its key is still at mod revision `expected`; the new revision.

        Raises:
            Conflict: Another writer (a newer generation's launcher) owns the key now.
            StoreError: etcd failed.
        """
        key = self.store.keys.replica(status.job_id, status.rank)
        return await self.store.txn(
            [Put(key, status.SerializeToString())], expect=[Expect(key, expected)]
        )

    async def report_exit(self, status: pb.ReplicaStatus, *, expected: int) -> None:
        """Write an exit status until etcd takes it, or a newer writer owns the key."""
        fields = {"job_id": status.job_id, "generation": status.generation, "rank": status.rank}
        delay = 0.25
        while True:
            try:
                await self.write(status, expected=expected)
            except Conflict:
                self._log.info("replica_status_superseded", **fields)
                return
            except StoreError as error:
                self._log.warning("replica_status_failed", error=str(error), **fields)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            self._log.info(
                "replica_reported",
                exit_code=status.exit_code,
                outcome=exit_outcome(status.exit_code),
                **fields,
            )
            return
