"""A full log disk (ENOSPC) never fails a service's calls, and the service says so.

The log stream is /dev/full, where every write fails with ENOSPC as on a full file system; a
real scheduler replica (real etcd, real gRPC) keeps answering and reports the dropped lines
in ClusterStatus until writing works again.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest
import structlog
from prometheus_client import REGISTRY

from pollux.service.logging import LOG_HEALTH, SafeLoggerFactory
from pollux.v1 import scheduler_service_pb2 as spb
from tests.integration.test_scheduler import Replica, spec

FULL = Path("/dev/full")


def log_to(stream: TextIO) -> None:
    structlog.configure(
        processors=[structlog.processors.JSONRenderer()],
        logger_factory=SafeLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def dropped(reason: str) -> float:
    value = REGISTRY.get_sample_value("pollux_log_lines_dropped_total", {"reason": reason})
    return value or 0.0


@pytest.fixture
def full_disk() -> Iterator[TextIO]:
    if not FULL.exists():
        pytest.skip("no /dev/full on this system")
    stream = FULL.open("w")
    try:
        yield stream
    finally:
        with contextlib.suppress(OSError):  # what is still buffered cannot be written either
            stream.close()


async def test_a_full_log_disk_drops_lines_counts_them_and_recovers(
    replica: Replica, full_disk: TextIO
) -> None:
    before = dropped("ENOSPC")
    log_to(full_disk)
    structlog.get_logger("test").info("into_a_full_disk", n=1)  # does not raise
    reply = await replica.stub.SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="r-1"))
    assert reply.created, "calls succeed while their log lines cannot be written"
    assert dropped("ENOSPC") > before
    status = await replica.stub.ClusterStatus(spb.ClusterStatusRequest())
    warning = next(w for w in status.warnings if "cannot write its log" in w)
    assert "ENOSPC: its disk is full" in warning
    assert "pollux_log_lines_dropped" in warning

    good = io.StringIO()
    log_to(good)
    structlog.get_logger("test").info("space_again")
    written = good.getvalue().splitlines()
    assert '"event": "log_lines_dropped"' in written[0]
    assert '"reason": "ENOSPC"' in written[0]
    assert '"event": "space_again"' in written[1]
    assert LOG_HEALTH.warnings() == []
    status = await replica.stub.ClusterStatus(spb.ClusterStatusRequest())
    assert not [w for w in status.warnings if "cannot write its log" in w]
