"""A full disk: how a replica's failure on one is recognised, and what the scheduler does then.

The launcher reads ENOSPC/EDQUOT from a failed replica's last output lines (its only window on
the replica's errno) and sets ReplicaStatus.disk_full; the scheduler then fails the job at
once, saying why, instead of restarting it onto the same full disk. Any other failure is
restarted up to max_failures, as before. A service's own log line that cannot be written is
dropped and counted, never raised.
"""

from __future__ import annotations

import errno
import io

from pollux.launcher.replica import mentions_disk_full
from pollux.scheduler.cycle import RoundPlan, _reconcile
from pollux.service.logging import LogHealth, SafeLogger
from pollux.v1 import types_pb2 as pb


def test_enospc_and_edquot_are_recognised_in_any_of_their_spellings() -> None:
    for line in (
        "OSError: [Errno 28] No space left on device: '/ckpt/model.pt.tmp'",
        "RuntimeError: [enforce fail at inline_container.cc:595] . PytorchStreamWriter failed "
        "writing file data/0: file write failed: No space left on device",
        "write error: ENOSPC",
        "tar: ./x: Cannot write: Disk quota exceeded",
        f"[Errno {errno.EDQUOT}] quota",
    ):
        assert mentions_disk_full(["epoch 3", line, "exiting"]) == line
    assert mentions_disk_full(["a", "ValueError: lr must be > 0", "no spaces here"]) == ""
    # The last mention wins (the closest to the exit).
    assert mentions_disk_full(["No space left on device (1)", "No space left on device (2)"]) == (
        "No space left on device (2)"
    )


def running_job(max_failures: int = 3) -> pb.Job:
    job = pb.Job(
        id="j-full",
        spec=pb.JobSpec(name="full", command=["train"], max_failures=max_failures),
        state=pb.JOB_STATE_RUNNING,
    )
    job.allocation.nodes[:] = ["n1", "n1"]
    job.allocation.generation = 4
    return job


def exited(rank: int, code: int, *, disk_full: bool = False, tail: str = "") -> pb.ReplicaStatus:
    return pb.ReplicaStatus(
        job_id="j-full",
        node="n1",
        rank=rank,
        generation=4,
        phase=pb.REPLICA_PHASE_EXITED,
        exit_code=code,
        disk_full=disk_full,
        output_tail=tail,
    )


def test_a_replica_that_failed_on_a_full_disk_fails_its_job_at_once() -> None:
    job = running_job(max_failures=3)
    tail = "OSError: [Errno 28] No space left on device: '/ckpt/x'"
    statuses = {0: exited(0, 1, disk_full=True, tail=tail), 1: exited(1, 143)}
    nodes = {"n1": pb.Node(name="n1", gpus=2)}
    assert _reconcile(job, statuses, nodes, 1000.0, 7, RoundPlan())
    assert job.state == pb.JOB_STATE_FAILED
    assert job.history[-1].reason == (
        "replica 0 on n1 exited 1 on a full disk, not restarted (free space, then resubmit): "
        + tail
    )
    assert not job.allocation.nodes  # its GPUs are free


def test_any_other_failure_is_restarted_as_before() -> None:
    job = running_job(max_failures=3)
    statuses = {0: exited(0, 1, tail="ValueError: lr"), 1: exited(1, 143)}
    nodes = {"n1": pb.Node(name="n1", gpus=2)}
    assert _reconcile(job, statuses, nodes, 1000.0, 7, RoundPlan())
    assert job.state != pb.JOB_STATE_FAILED
    assert job.failures == 1
    assert "restart 1/3: ValueError: lr" in job.history[-1].reason


class _Disk(io.StringIO):
    full = True

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)


def test_a_log_line_that_cannot_be_written_is_dropped_and_counted_not_raised() -> None:
    disk = _Disk()
    health = LogHealth()
    logger = SafeLogger(disk, health)
    logger.info("one")
    logger.error("two")
    assert (health.dropped, health.reason) == (2, "ENOSPC")
    disk.full = False
    logger.warning("three")
    lines = disk.getvalue().splitlines()
    assert lines[0].startswith('{"event": "log_lines_dropped", "level": "warning", "count": 2')
    assert lines[1:] == ["three"]
    assert health.dropped == 0
