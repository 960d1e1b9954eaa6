"""Each replica's completion-time predictions, refreshed from its mirror in the background.

Every `interval_s` the replica forecasts the cluster forward from its mirror's active state
with the policy it runs (`pollux.policy.forecast`, in a worker thread) and keeps each job's
predicted completion in memory. `GetJob` and `ListJobs` answer from it, falling back to a
job's time left on its current GPUs (`cycle.seconds_left`) when the latest forecast does not
cover the job (not yet run, or the job is newer). Nothing is written to etcd: every replica
computes its own from the same state, so there is no state to own or clean up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from pollux.policy.forecast import forecast
from pollux.policy.types import Policy
from pollux.scheduler.cycle import cluster_state
from pollux.scheduler.lifecycle import ACTIVE
from pollux.service.mirror import ClusterMirror
from pollux.service.store import cancel_and_wait

log = structlog.get_logger(__name__)

MAX_ROUNDS = 500
"""Most rounds one forecast plays: with 5-minute rounds, about 42 hours ahead."""


class Forecaster:
    """Keeps the latest forecast of a replica (module docstring).

    Args:
        mirror: The replica's cluster mirror.
        policy: The policy the scheduler runs.
        interval_s: Seconds between forecasts; 0 disables them.
        round_s: Seconds per forecast round (coarser than the scheduler's to bound the cost).
        restart_delay_s: Pause charged to a re-allocated job that measured none.
        live_round_s: The scheduler's own interval: an estimate's first rounds use it.
        clock: Wall-clock seconds.
    """

    def __init__(
        self,
        mirror: ClusterMirror,
        policy: Policy[Any],
        *,
        interval_s: float,
        round_s: float,
        restart_delay_s: float,
        live_round_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mirror = mirror
        self.policy = policy
        self.interval_s = interval_s
        self.round_s = round_s
        self.restart_delay_s = restart_delay_s
        self.live_round_s = live_round_s
        self.clock = clock
        self.completion: dict[str, float] = {}
        """Predicted completion (wall-clock seconds) per job of the latest forecast."""
        self.made_at = 0.0
        """When the latest forecast was made (0: none yet)."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start forecasting in the background (nothing when disabled)."""
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="forecaster")

    async def stop(self) -> None:
        """Stop forecasting."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def refresh(self) -> None:
        """Forecast once now from the mirror (when it has listed everything)."""
        if not self.mirror.ready:
            return
        snapshot = self.mirror.snapshot()
        active = sorted(
            (e.value for e in snapshot.jobs.values() if e.value.state in ACTIVE),
            key=lambda j: (j.create_time.ToNanoseconds(), j.id),
        )
        now = self.clock()
        state = cluster_state(
            snapshot,
            active,
            now=now,
            policy=self.policy,
        )
        caps = {job.id: int(job.spec.max_replicas) for job in active if job.spec.max_replicas}
        result = await asyncio.to_thread(
            forecast,
            state,
            self.policy,
            round_s=self.round_s,
            restart_delay_s=self.restart_delay_s,
            max_rounds=MAX_ROUNDS,
            caps=caps,
        )
        self.completion, self.made_at = result.completion, now
        log.debug(
            "forecast", jobs=len(active), predicted=len(result.completion), rounds=result.rounds
        )

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as error:  # the previous forecast stands; the next one retries
                log.warning("forecast_failed", error=repr(error))
            await asyncio.sleep(self.interval_s)
