"""A job its launcher refuses (its working dir, its environment) fails at once, unretried.

The launcher marks such a replica's status `refused`: every start would be refused alike, so
restarting it only spends its max_failures and other jobs' rounds. A start refused for a
passing reason (no free job uid) is not marked and is retried as any failure is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pollux.launcher.replica import SPAWN_FAILED, LaunchSpec, Replica
from pollux.scheduler.cycle import RoundPlan, _reconcile
from pollux.scheduler.lifecycle import clipped
from pollux.v1 import types_pb2 as pb

OUTSIDE = (
    "pollux-launcher: cannot start the replica: working_dir /etc is outside the allowed roots "
    "/tmp, /var/tmp, /srv, /home: set job_policy.allowed_roots on the launcher or use a "
    "directory under them"
)


def running_job() -> pb.Job:
    job = pb.Job(
        id="j-ref",
        spec=pb.JobSpec(name="ref", command=["train"], max_failures=3),
        state=pb.JOB_STATE_ALLOCATED,
    )
    job.allocation.nodes[:] = ["n1", "n1"]
    job.allocation.generation = 2
    return job


def exited(rank: int, *, refused: bool) -> pb.ReplicaStatus:
    return pb.ReplicaStatus(
        job_id="j-ref",
        node="n1",
        rank=rank,
        generation=2,
        phase=pb.REPLICA_PHASE_EXITED,
        exit_code=SPAWN_FAILED,
        output_tail=OUTSIDE,
        refused=refused,
    )


def test_a_job_its_launcher_refuses_fails_at_once_with_the_launchers_reason() -> None:
    job = running_job()
    statuses = {0: exited(0, refused=True), 1: exited(1, refused=True)}
    assert _reconcile(job, statuses, {"n1": pb.Node(name="n1", gpus=2)}, 10.0, 3, RoundPlan())
    assert job.state == pb.JOB_STATE_FAILED
    assert job.history[-1].reason == clipped(
        "replica 0 on n1 was refused by its launcher, not restarted (fix the job, then "
        f"resubmit): {OUTSIDE}"
    )
    assert not job.allocation.nodes


def test_a_start_refused_for_a_passing_reason_is_retried() -> None:
    job = running_job()
    statuses = {0: exited(0, refused=False), 1: exited(1, refused=False)}
    assert _reconcile(job, statuses, {"n1": pb.Node(name="n1", gpus=2)}, 10.0, 3, RoundPlan())
    assert job.state != pb.JOB_STATE_FAILED
    assert job.failures == 1


def test_the_launcher_marks_a_final_refusal_in_the_replicas_status(tmp_path: Path) -> None:
    async def start(final: bool) -> pb.ReplicaStatus:
        replica = Replica(
            job_id="j-ref", generation=2, rank=0, node="n1", slot=0, grace_s=1.0, ring_lines=10
        )
        spec = LaunchSpec(
            ["train"], {}, None, tmp_path / "r.log", refusal="no", refusal_final=final
        )
        await replica.start(spec)
        return replica.status()

    final, passing = asyncio.run(start(True)), asyncio.run(start(False))
    assert (final.exit_code, final.refused) == (SPAWN_FAILED, True)
    assert final.output_tail == "pollux-launcher: cannot start the replica: no"
    assert (passing.exit_code, passing.refused) == (SPAWN_FAILED, False)
