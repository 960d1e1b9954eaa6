"""Cluster gauges read at scrape time from the replica's mirror: jobs by state, GPUs.

Counting at scrape time rather than setting gauges in each round means every replica — leader
or standby — exports the same current figures from its own mirror, and a standby's do not go
stale. The mirror keeps both counts current, so a scrape costs a pass over the active jobs.
"""

from __future__ import annotations

from collections.abc import Iterator

import prometheus_client
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pollux.service.mirror import ClusterMirror
from pollux.v1 import types_pb2 as pb

_ACTIVE = frozenset(
    {pb.JOB_STATE_PENDING, pb.JOB_STATE_ALLOCATED, pb.JOB_STATE_RUNNING, pb.JOB_STATE_RESCALING}
)


class ClusterCollector(Collector):
    """`pollux_jobs{state}` and `pollux_gpus{kind="total"|"allocated"}` of the mirrors added.

    One collector per process (a registry refuses two with the same names); in-process tests
    run several replicas, so it reports the newest ready mirror added.
    """

    def __init__(self) -> None:
        self._mirrors: list[ClusterMirror] = []

    def add(self, mirror: ClusterMirror) -> None:
        """Report this mirror (a replica starting)."""
        self._mirrors.append(mirror)

    def remove(self, mirror: ClusterMirror) -> None:
        """Stop reporting it (a replica stopping)."""
        if mirror in self._mirrors:
            self._mirrors.remove(mirror)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges, empty until a mirror has listed the cluster."""
        jobs = GaugeMetricFamily(
            "pollux_jobs", "Jobs by state, as this replica sees them.", labels=["state"]
        )
        gpus = GaugeMetricFamily(
            "pollux_gpus",
            "GPUs of registered nodes (total) and held by jobs (allocated).",
            labels=["kind"],
        )
        mirror = next((m for m in reversed(self._mirrors) if m.ready), None)
        if mirror is not None:
            counts = mirror.state_counts()
            for state in pb.JobState.values():
                if state != pb.JOB_STATE_UNSPECIFIED:
                    name = pb.JobState.Name(state).removeprefix("JOB_STATE_")
                    jobs.add_metric([name], counts.get(state, 0))
            total = sum(e.value.gpus for e in mirror.nodes.entries.values())
            allocated = sum(
                len(e.value.allocation.nodes)
                for e in mirror.jobs.entries.values()
                if e.value.state in _ACTIVE
            )
            gpus.add_metric(["total"], total)
            gpus.add_metric(["allocated"], allocated)
        yield jobs
        yield gpus


CLUSTER = ClusterCollector()
prometheus_client.REGISTRY.register(CLUSTER)
