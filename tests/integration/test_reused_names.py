"""A name reused run after run, on a real scheduler: it means the current run, and says so.

Slurm and Ray users reuse job names: a name means the active job of that name, else the
newest; only two active jobs of one name are ambiguous. A real etcd and an in-process
scheduler replica (tests/integration/test_scheduler.py's `Replica`); `pollux-cli` runs as a
user runs it, through the real client over gRPC, in a thread beside the server's loop.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pollux.client import cli
from pollux.client.client import Client
from pollux.scheduler.api.base import RESOLVED_ID_KEY, RESOLVED_NOTE_KEY
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb
from tests.integration.test_job_references import submit
from tests.integration.test_scheduler import Replica
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(90)


async def finished(replica: Replica, job: pb.Job) -> pb.Job:
    """Cancel a (pending) job and wait until its round has finished it."""
    await replica.stub.CancelJob(spb.CancelJobRequest(job_id=job.id))

    async def done() -> pb.Job | None:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got if got.state == pb.JOB_STATE_CANCELLED else None

    return await eventually(done, 20, f"{job.id} to be cancelled")


async def resolved(replica: Replica, reference: str) -> tuple[pb.Job, dict[str, str]]:
    """GetJob by `reference`: the job and the initial metadata the server sent."""
    call = replica.stub.GetJob(spb.GetJobRequest(job_id=reference))
    response = await call
    metadata = {k: v for k, v in (await call.initial_metadata()) or () if isinstance(v, str)}
    return response.job, metadata


def cli_run(address: str, *argv: str) -> int:
    return cli.main(list(argv), connect=lambda args: Client(address, timeout_s=10))


async def test_a_reused_name_means_the_newest_finished_job_and_says_so(
    replica: Replica, capfd: pytest.CaptureFixture[str]
) -> None:
    runs = [await finished(replica, await submit(replica, "ddp-plain", f"r-{i}")) for i in range(3)]

    job, metadata = await resolved(replica, "ddp-plain")
    assert job.id == runs[-1].id
    assert metadata[RESOLVED_ID_KEY] == runs[-1].id
    note = metadata[RESOLVED_NOTE_KEY]
    assert note.startswith(
        f"ddp-plain: the newest of 3 jobs of that name, {runs[-1].id} (CANCELLED"
    )
    assert note.endswith(" ago)")

    # Every command that takes a job resolves the same way; the CLI says which on stderr.
    address = replica.app.address
    capfd.readouterr()
    for command in ("describe", "explain", "logs"):
        code = await asyncio.to_thread(cli_run, address, command, "ddp-plain")
        err = capfd.readouterr().err
        assert "the newest of 3 jobs of that name" in err, (command, err)
        assert runs[-1].id in err
        if command != "logs":  # a cancelled job that never ran has no log: an error of its own
            assert code == 0, (command, err)
    assert await asyncio.to_thread(cli_run, address, "delete", "ddp-plain") == 0
    assert "deleted ddp-plain" in capfd.readouterr().out
    # The newest is gone: the name now means the newest of the other two.
    job, metadata = await resolved(replica, "ddp-plain")
    assert job.id == runs[1].id
    assert "the newest of 2 jobs" in metadata[RESOLVED_NOTE_KEY]


async def test_the_active_job_of_a_name_wins_and_two_active_ones_are_ambiguous(
    replica: Replica,
) -> None:
    running = await submit(replica, "sweep", "r-0")  # pending: the cluster has no nodes
    later = [await finished(replica, await submit(replica, "sweep", f"r-{i}")) for i in (1, 2)]
    assert all(j.create_time.ToNanoseconds() > running.create_time.ToNanoseconds() for j in later)

    job, metadata = await resolved(replica, "sweep")
    assert job.id == running.id, "an active job of the name is what the name means"
    assert metadata[RESOLVED_NOTE_KEY].startswith(
        f"sweep: the active one of 3 jobs of that name, {running.id} (PENDING"
    )
    cancelled = await replica.stub.CancelJob(spb.CancelJobRequest(job_id="sweep"))
    assert cancelled.job.id == running.id

    twin_a = await submit(replica, "twin", "t-1")
    twin_b = await submit(replica, "twin", "t-2")
    await finished(replica, await submit(replica, "twin", "t-3"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.Explain(spb.ExplainRequest(job_id="twin"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = caught.value.details() or ""
    assert "names 2 active jobs" in message
    assert message.index(twin_b.id) < message.index(twin_a.id), "newest first"
    assert "use the id" in message

    # A name carried by one job only says nothing more.
    solo = await submit(replica, "solo", "s-1")
    job, metadata = await resolved(replica, "solo")
    assert job.id == solo.id
    assert RESOLVED_NOTE_KEY not in metadata


async def test_dashboard_name_prints_the_page_of_the_job_the_name_means(
    replica: Replica, capfd: pytest.CaptureFixture[str]
) -> None:
    runs = [await finished(replica, await submit(replica, "ddp-plain", f"r-{i}")) for i in range(2)]
    replica.app.servicer.dashboard_url = "https://127.0.0.1:8443/"
    capfd.readouterr()
    code = await asyncio.to_thread(cli_run, replica.app.address, "dashboard", "ddp-plain")
    out, err = capfd.readouterr()
    assert code == 0, err
    assert f"https://127.0.0.1:8443/#/jobs/{runs[-1].id}" in out.splitlines()  # + server logs
    assert "the newest of 2 jobs of that name" in err
