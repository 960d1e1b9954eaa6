"""Naming jobs, listing them newest first, cancel reasons and timelines on a real scheduler.

A real etcd and a real scheduler replica on loopback gRPC (tests/integration/test_scheduler.py's
`Replica`); the agent's timeline recording is exercised through the agent's own code path in
tests/integration/test_agent_service.py.
"""

from __future__ import annotations

import grpc
import pytest

from pollux.service.store import Store
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb
from tests.integration.test_scheduler import Replica, add_node, spec
from tests.waiting import eventually


async def submit(replica: Replica, name: str, request_id: str) -> pb.Job:
    response = await replica.stub.SubmitJob(
        spb.SubmitJobRequest(spec=spec(name), request_id=request_id)
    )
    return response.job


async def test_a_job_is_named_by_id_unique_prefix_or_unique_name(replica: Replica) -> None:
    solo = await submit(replica, "solo", "r-1")
    twin_a = await submit(replica, "twin", "r-2")
    twin_b = await submit(replica, "twin", "r-3")

    for reference in (solo.id, solo.id[:6], solo.id[2:8], "solo"):
        got = await replica.stub.GetJob(spb.GetJobRequest(job_id=reference))
        assert got.job.id == solo.id, reference

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.GetJob(spb.GetJobRequest(job_id="twin"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = caught.value.details() or ""
    assert "names 2 active jobs" in message  # a name of finished jobs: the newest
    # Newest first, each with what tells them apart.
    assert message.index(twin_b.id) < message.index(twin_a.id)
    assert "(twin, PENDING)" in message

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replica.stub.GetJob(spb.GetJobRequest(job_id="nobody"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "pollux-cli ls" in (caught.value.details() or "")

    # Every RPC that takes a job takes a reference: cancel by name, explain by prefix.
    cancelled = await replica.stub.CancelJob(spb.CancelJobRequest(job_id="solo"))
    assert cancelled.job.id == solo.id
    explained = await replica.stub.Explain(spb.ExplainRequest(job_id=twin_a.id[:9]))
    assert explained.job.id == twin_a.id


async def test_list_newest_first_pages_through_everything_once(replica: Replica) -> None:
    ids = [(await submit(replica, f"job-{i}", f"r-{i}")).id for i in range(7)]
    seen: list[str] = []
    token = ""
    while True:
        page = await replica.stub.ListJobs(
            spb.ListJobsRequest(page_size=3, page_token=token, newest_first=True)
        )
        seen += [j.id for j in page.jobs]
        token = page.next_page_token
        if not token:
            break
    assert seen == ids[::-1]
    oldest = await replica.stub.ListJobs(spb.ListJobsRequest(page_size=2))
    assert [j.id for j in oldest.jobs] == ids[:2]
    theirs = await replica.stub.ListJobs(spb.ListJobsRequest(owner="someone-else"))
    assert list(theirs.jobs) == []
    mine = await replica.stub.ListJobs(spb.ListJobsRequest(owner="local"))
    assert len(mine.jobs) == 7  # no authentication: every caller is "local"


async def test_a_cancel_reason_is_recorded_in_the_history(replica: Replica, store: Store) -> None:
    await add_node(store, "n1", 1)
    job = await submit(replica, "train", "r-1")
    await replica.stub.CancelJob(
        spb.CancelJobRequest(job_id=job.id, reason="wrong\nlearning rate\x00 ")
    )

    async def cancelled() -> pb.Job | None:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got if got.state == pb.JOB_STATE_CANCELLED else None

    final = await eventually(cancelled, 10, "the job to be cancelled")
    assert final.history[-1].reason == "cancelled by local: wrong learning rate"


async def test_a_timeline_is_empty_until_recorded_then_served_and_deleted_with_the_job(
    replica: Replica, store: Store
) -> None:
    job = await submit(replica, "train", "r-1")
    empty = await replica.stub.GetJobTimeline(spb.GetJobTimelineRequest(job_id="train"))
    assert empty.timeline.job_id == job.id
    assert list(empty.timeline.points) == []

    timeline = pb.JobTimeline(
        job_id=job.id,
        points=[pb.TimelinePoint(generation=1, gpus=2, batch_size=64, goodput=10.0)],
    )
    profile = pb.ObservationProfile(job_id=job.id)
    await store.save_profile_and_model(profile, None, expected=0, timeline=timeline)
    got = await replica.stub.GetJobTimeline(spb.GetJobTimelineRequest(job_id=job.id[:7]))
    assert got.timeline == timeline

    await replica.stub.CancelJob(spb.CancelJobRequest(job_id=job.id))

    async def finished() -> bool:
        got = (await replica.stub.GetJob(spb.GetJobRequest(job_id=job.id))).job
        return got.state == pb.JOB_STATE_CANCELLED

    await eventually(finished, 10, "the job to be cancelled")
    await replica.stub.DeleteJob(spb.DeleteJobRequest(job_id=job.id))
    assert await store.get_timeline(job.id) is None
