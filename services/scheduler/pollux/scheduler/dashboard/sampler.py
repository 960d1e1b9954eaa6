"""Cluster utilisation over time: this replica's bounded in-memory ring of samples.

Every `interval_s` the dashboard samples ClusterStatus (allocated and total GPUs, per node,
and running / pending jobs) into a ring of at most `capacity` samples (24 h at 10 s by
default, a few MiB at 500 nodes). It is a view for the page, not a record: each replica keeps
its own from the time it started, and a restart forgets it. The durable history is Prometheus
(every service's `metrics_listen`) and the Grafana dashboards over it (deploy/grafana/).
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from pollux.v1 import scheduler_service_pb2 as spb

log = structlog.get_logger(__name__)

MAX_NODE_SERIES = 32
"""Nodes whose own series /api/v1/utilisation returns (by name); the totals cover them all."""
DEFAULT_POINTS = 720
"""Points returned when the query does not say (the ring is thinned evenly to them)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at one moment.

    Per-node values are arrays aligned with `nodes`, a tuple shared by consecutive samples
    while the set of nodes is unchanged, so a sample costs a few bytes per node.
    """

    time_s: float
    total_gpus: int
    allocated_gpus: int
    running_jobs: int
    pending_jobs: int
    nodes: tuple[str, ...]
    node_gpus: array[int]
    node_allocated: array[int]


class UtilisationRing:
    """The last `capacity` samples, oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.samples: deque[Sample] = deque(maxlen=capacity)
        self._nodes: tuple[str, ...] = ()

    def add(self, status: spb.ClusterStatusResponse, time_s: float) -> Sample:
        """Record ClusterStatus's answer at `time_s`."""
        names = tuple(n.node.name for n in status.nodes)
        if names != self._nodes:
            self._nodes = names  # else share the previous tuple
        by_state = status.jobs_by_state
        sample = Sample(
            time_s=time_s,
            total_gpus=status.total_gpus,
            allocated_gpus=status.allocated_gpus,
            running_jobs=by_state.get("RUNNING", 0) + by_state.get("RESCALING", 0),
            pending_jobs=by_state.get("PENDING", 0),
            nodes=self._nodes,
            node_gpus=array("l", (n.node.gpus for n in status.nodes)),
            node_allocated=array("l", (n.allocated_gpus for n in status.nodes)),
        )
        self.samples.append(sample)
        return sample

    def view(self, points: int = DEFAULT_POINTS) -> dict[str, Any]:
        """Columns for a chart: at most `points` samples, evenly thinned, the newest kept.

        ``nodes`` holds the series of at most `MAX_NODE_SERIES` nodes of the newest sample
        (null where a node was absent); ``nodes_truncated`` says when there were more.
        """
        samples = list(self.samples)
        if len(samples) > points > 0:
            stride = len(samples) / points
            picked = [samples[int(i * stride)] for i in range(points - 1)]
            samples = [*picked, samples[-1]]
        names = sorted(samples[-1].nodes) if samples else []
        plotted = names[:MAX_NODE_SERIES]
        series: dict[str, tuple[list[int | None], list[int | None]]] = {
            name: ([], []) for name in plotted
        }
        indexes: dict[int, dict[str, int]] = {}  # consecutive samples share one node tuple
        for sample in samples:
            index = indexes.get(id(sample.nodes))
            if index is None:
                index = indexes[id(sample.nodes)] = {n: i for i, n in enumerate(sample.nodes)}
            for name, (gpus, allocated) in series.items():
                at = index.get(name)
                gpus.append(None if at is None else sample.node_gpus[at])
                allocated.append(None if at is None else sample.node_allocated[at])
        nodes = [
            {"name": name, "gpus": gpus, "allocated": allocated}
            for name, (gpus, allocated) in series.items()
        ]
        return {
            "capacity": self.samples.maxlen,
            "times": [s.time_s for s in samples],
            "total_gpus": [s.total_gpus for s in samples],
            "allocated_gpus": [s.allocated_gpus for s in samples],
            "running_jobs": [s.running_jobs for s in samples],
            "pending_jobs": [s.pending_jobs for s in samples],
            "nodes": nodes,
            "nodes_truncated": len(names) > len(plotted),
        }


async def sample_forever(
    ring: UtilisationRing,
    status: Callable[[], Awaitable[spb.ClusterStatusResponse]],
    interval_s: float,
    clock: Callable[[], float] = time.time,
) -> None:
    """Add a sample now and every `interval_s` (a failed read is logged once and skipped)."""
    failing = False
    while True:
        try:
            ring.add(await status(), clock())
            if failing:
                log.info("dashboard_sampling_recovered")
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if not failing:
                log.warning("dashboard_sampling_failed", error=f"{type(error).__name__}: {error}")
            failing = True
        await asyncio.sleep(interval_s)
