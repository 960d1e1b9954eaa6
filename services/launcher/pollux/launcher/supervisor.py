"""The replicas this node runs or ran recently: started, stopped, and their exits reported.

Each replica runs in a background task from its start to its reported exit: any exception
while preparing or starting it is a clean replica failure (exit `SPAWN_FAILED`, reported like
any other), so the launcher's loops go on. A stop is one task per replica however often it is
asked for. Exits are kept for the servicer (logs, ListReplicas) up to `replica_history`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import prometheus_client
import structlog

from pollux.launcher.replica import PLANNED_STOP, LaunchSpec, Replica
from pollux.launcher.replica_log import DISK_FULL_ERRNOS
from pollux.launcher.statuses import StatusWriter, exit_outcome
from pollux.service.store import StoreError

REPLICAS_STARTED = prometheus_client.Counter(
    "pollux_launcher_replicas_started_total", "Replica processes started on this node."
)
REPLICA_EXITS = prometheus_client.Counter(
    "pollux_launcher_replica_exits_total",
    "Replica exits on this node by outcome (success, planned_stop, failure).",
    ["outcome"],
)
REPLICAS_RUNNING = prometheus_client.Gauge(
    "pollux_launcher_replicas_running", "Replicas alive on this node."
)
REPLICA_DISK_FULL = prometheus_client.Counter(
    "pollux_launcher_replica_disk_full_total",
    "Replicas that failed on a full disk (ENOSPC/EDQUOT); their jobs fail rather than restart.",
)


class Supervisor:
    """This node's replicas and the background tasks that run them.

    Args:
        node_name: This node.
        statuses: Writes the replicas' statuses.
        fenced: Whether the watchdog's deadline passed (a kill then was the fence's).
        exited: Called after each reported exit (the launcher looks again).
    """

    def __init__(
        self,
        node_name: str,
        statuses: StatusWriter,
        *,
        fenced: Callable[[], bool],
        exited: Callable[[], None],
    ) -> None:
        self._statuses = statuses
        self._fenced = fenced
        self._exited = exited
        self._replicas: dict[tuple[str, int, int], Replica] = {}
        self._stops: dict[tuple[str, int, int], asyncio.Task[int]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._log = structlog.get_logger(__name__).bind(node_id=node_name)

    # -- queries -------------------------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return key in self._replicas

    def all(self) -> list[Replica]:
        """Every replica known, in start order."""
        return list(self._replicas.values())

    def live(self) -> list[Replica]:
        """The replicas whose process runs."""
        return [r for r in self._replicas.values() if r.alive]

    def alive(self, job_id: str, generation: int | None = None) -> bool:
        """Whether a replica of the job (of that generation) runs here."""
        return any(
            r.alive and r.job_id == job_id and (generation is None or r.generation == generation)
            for r in self._replicas.values()
        )

    def free_slots(self, slots: Iterable[int]) -> list[int]:
        """The slots no live replica holds."""
        held = {r.slot for r in self._replicas.values() if r.alive}
        return [slot for slot in slots if slot not in held]

    def replicas(self, job_id: str = "") -> list[Replica]:
        """Replicas this node runs or ran recently, newest generation first."""
        chosen = [r for r in self._replicas.values() if not job_id or r.job_id == job_id]
        return sorted(chosen, key=lambda r: (-r.generation, r.job_id, r.rank))

    def find(self, job_id: str, rank: int, min_generation: int = 0) -> Replica | None:
        """A replica of (job, rank) on this node, or None.

        The newest one if `min_generation` is 0, else the oldest of at least that generation,
        so that a follower asking for the one after its last sees each in turn.
        """
        mine = [r for r in self.replicas(job_id) if r.rank == rank]
        if min_generation == 0:
            return mine[0] if mine else None
        newer = [r for r in mine if r.generation >= min_generation]
        return newer[-1] if newer else None

    def prune(self, history: int) -> None:
        """Forget the oldest reported exits beyond `history`."""
        done = sorted(
            (r for r in self._replicas.values() if not r.alive and r.exit_reported),
            key=lambda r: r.exited_at or 0.0,
        )
        for replica in done[: max(0, len(done) - history)]:
            del self._replicas[replica.key]
        REPLICAS_RUNNING.set(sum(r.alive for r in self._replicas.values()))

    # -- tasks ---------------------------------------------------------------------------------

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a background task that `drain` waits for."""
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def run(self, replica: Replica, prepare: Callable[[], LaunchSpec]) -> None:
        """Start a replica (its status already claimed) and supervise it to its exit."""
        self._replicas[replica.key] = replica
        self.spawn(self._supervise(replica, prepare))

    def stop(self, replica: Replica, reason: str) -> asyncio.Task[int]:
        """Stop a replica gracefully (once, however often asked); the stop's task."""
        task = self._stops.get(replica.key)
        if task is None:
            self._log.info(
                "replica_stop_requested",
                job_id=replica.job_id,
                generation=replica.generation,
                rank=replica.rank,
                reason=reason,
            )
            task = asyncio.create_task(replica.stop())
            self._stops[replica.key] = task
            task.add_done_callback(lambda _: self._stops.pop(replica.key, None))
        return task

    def fence(self) -> int:
        """Kill every live replica now, without grace; how many."""
        live = self.live()
        for replica in live:
            self.spawn(self._fence(replica))
        return len(live)

    async def _fence(self, replica: Replica) -> None:
        await replica.fence()

    async def drain(self, timeout_s: float) -> None:
        """Wait for the background tasks (exit reports, reaps); cancel what outlives timeout."""
        pending = {t for t in self._background if not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=timeout_s)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _supervise(self, replica: Replica, prepare: Callable[[], LaunchSpec]) -> None:
        """Prepare and run one replica to its reported exit."""
        try:
            await replica.start(prepare())
        except Exception as error:
            self._log.exception("replica_start_crashed", job_id=replica.job_id, rank=replica.rank)
            full = isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS
            replica.fail_to_start(
                f"cannot start the replica: {type(error).__name__}: {error}", disk_full=full
            )
        if replica.pid:
            REPLICAS_STARTED.inc()
            with contextlib.suppress(StoreError):  # the pid is informative; the exit is not
                replica.status_revision = await self._statuses.write(
                    replica.status(), expected=replica.status_revision
                )
        code = await replica.wait()
        if replica.killed(code) and self._fenced():
            replica.mark_fenced()  # the watchdog killed it: the node's lease had lapsed
            code = PLANNED_STOP
        REPLICA_EXITS.labels(exit_outcome(code)).inc()
        if replica.disk_full:
            REPLICA_DISK_FULL.inc()
            self._log.error(
                "replica_disk_full",
                job_id=replica.job_id,
                generation=replica.generation,
                rank=replica.rank,
                exit_code=code,
                line=replica.disk_full[-200:],
                action="the job fails rather than restarting onto the same full disk",
            )
        await self._statuses.report_exit(replica.status(), expected=replica.status_revision)
        replica.exit_reported = True
        self._exited()
