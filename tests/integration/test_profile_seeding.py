"""Profile seeding live: a real scheduler and a real agent on real etcd and loopback gRPC.

An earlier run's reports reach its agent; a re-run of the same name by the same owner starts
from that run's step times and fit; the re-run's own reports win over the seed; the seed goes
away with the job; another owner's or another name's job seeds nothing.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest

from pollux.agent.profile import fit_profile, perf_from_pb
from pollux.goodput import step_times
from pollux.scheduler.config import RetentionConfig, SchedulerConfig
from pollux.service.seeding import fit_rows
from pollux.service.store import Delete, Store
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.integration.test_agent_service import LIMITS, PERF, observation, report, running_agent
from tests.integration.test_scheduler import Replica, config
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def spec(name: str) -> pb.JobSpec:
    return pb.JobSpec(name=name, command=["python", "-c", "pass"], batch=LIMITS)


def seeding(etcd: EtcdServer, root: str, name: str) -> SchedulerConfig:
    """A pollux-jct scheduler's config with seeding on."""
    base = config(etcd, root, name, policy="pollux-jct")
    return replace(base, scheduling=replace(base.scheduling, seed_profiles=True))


async def submit(replica: Replica, name: str, request_id: str) -> pb.Job:
    request = spb.SubmitJobRequest(spec=spec(name), request_id=request_id)
    return (await replica.stub.SubmitJob(request)).job


@pytest.fixture
async def replica(etcd: EtcdServer, root: str, store: Store) -> AsyncIterator[Replica]:
    r = await Replica(store, seeding(etcd, root, "s-seed")).start()
    try:
        yield r
    finally:
        await r.stop()


async def test_a_rerun_starts_from_the_earlier_runs_step_times_and_fit(
    etcd: EtcdServer, root: str, store: Store, replica: Replica
) -> None:
    first = await submit(replica, "resnet", "seed-1")
    assert await store.get_profile(first.id) is None, "nothing to seed the first run from"
    async with running_agent(etcd, root, "agent-a") as agent:
        measured = [observation(1, 1, 64), observation(1, 4, 64), observation(2, 8, 64)]
        await agent.stub.ReportMetrics(report(1, *measured, job_id=first.id))
        earlier = await store.get_model(first.id)
        assert earlier is not None
        assert earlier.value.HasField("throughput")

        second = await submit(replica, "resnet", "seed-2")
        profile, model = await store.get_profile(second.id), await store.get_model(second.id)
        assert profile is not None
        assert model is not None
        assert profile.value.seeded_from == model.value.seeded_from == first.id
        assert not profile.value.observations
        got = {(o.num_nodes, o.num_replicas) for o in profile.value.seed_observations}
        assert got == {(1, 1), (1, 4), (2, 8)}
        assert model.value.throughput == earlier.value.throughput
        assert model.value.max_profiled_replicas == 8
        assert model.value.batch == LIMITS

        # Explain shows where the model came from.
        explained = await replica.stub.Explain(spb.ExplainRequest(job_id=second.id))
        assert explained.model.seeded_from == first.id

        # The re-run's own measurement of (1, 4) is slower than the seed's: its own wins.
        slow = observation(1, 4, 64)
        slow.accum_step_time_s *= 2
        slow.optim_step_time_s *= 2
        await agent.stub.ReportMetrics(report(1, slow, job_id=second.id))
        after = await store.get_profile(second.id)
        assert after is not None
        assert list(after.value.seed_observations) == list(profile.value.seed_observations)
        rows = {(o.num_nodes, o.num_replicas): o for o in fit_rows(after.value)}
        assert rows[(1, 4)].optim_step_time_s == slow.optim_step_time_s
        fitted = await store.get_model(second.id)
        assert fitted is not None
        assert fitted.value.agent_id == "agent-a"
        assert fitted.value.seeded_from == first.id
        assert fitted.value.throughput != model.value.throughput, "refitted with its own row"
        _, own = step_times(perf_from_pb(fitted.value.throughput), 1, 4, 64)
        _, seed = step_times(PERF, 1, 4, 64)
        assert float(own) > float(seed) * 1.2

        # A third run is seeded from the newest earlier one, and carries the first one's rows.
        third = await submit(replica, "resnet", "seed-3")
        chained = await store.get_profile(third.id)
        assert chained is not None
        assert chained.value.seeded_from == second.id
        rows = {(o.num_nodes, o.num_replicas): o for o in chained.value.seed_observations}
        assert set(rows) == {(1, 1), (1, 4), (2, 8)}
        assert rows[(1, 4)].optim_step_time_s == slow.optim_step_time_s
        assert fit_profile(chained.value, previous=None) is not None

    # The seed is the new job's own state: deleting the job deletes it.
    await replica.stub.CancelJob(spb.CancelJobRequest(job_id=third.id))

    async def cancelled() -> bool:
        job = (await replica.stub.GetJob(spb.GetJobRequest(job_id=third.id))).job
        return job.state == pb.JOB_STATE_CANCELLED

    await eventually(cancelled)
    await replica.stub.DeleteJob(spb.DeleteJobRequest(job_id=third.id))
    assert await store.get_profile(third.id) is None
    assert await store.get_model(third.id) is None


async def test_only_the_owners_jobs_of_the_same_name_with_a_fit_seed_a_submission(
    etcd: EtcdServer, root: str, store: Store, replica: Replica
) -> None:
    async with running_agent(etcd, root, "agent-a") as agent:
        bobs = pb.Job(id="j-bob", request_id="bob-1", owner="bob", spec=spec("resnet"))
        await store.create_job(bobs)
        await agent.stub.ReportMetrics(report(1, observation(1, 2, 64), job_id=bobs.id))
        assert (await store.get_model(bobs.id)) is not None
        mine = await submit(replica, "resnet", "mine-1")  # the caller is "local", not bob
        assert await store.get_profile(mine.id) is None, "another owner's run seeds nothing"
        longer = await submit(replica, "resnet-large", "large-1")  # a name "resnet" prefixes
        await agent.stub.ReportMetrics(report(1, observation(1, 2, 64), job_id=longer.id))
        again = await submit(replica, "resnet", "mine-2")
        assert await store.get_profile(again.id) is None, "another name seeds nothing"
        large = await submit(replica, "resnet-large", "large-2")
        assert (await store.get_profile(large.id)) is not None, "its own name does"
        # A fitted model whose profile is gone (deleted between the two reads) seeds nothing.
        orphan = await submit(replica, "vit", "vit-1")
        await store.put(
            store.keys.model(orphan.id),
            pb.JobModel(job_id=orphan.id, throughput=pb.ThroughputParams(alpha_c=0.1)),
        )
        vit = await submit(replica, "vit", "vit-2")
        assert await store.get_profile(vit.id) is None
        assert await store.get_model(vit.id) is None
        # An earlier run that has reported nothing the fit can use seeds nothing either.
        unfitted = await submit(replica, "gpt", "gpt-1")
        rerun = await submit(replica, "gpt", "gpt-2")
        assert await store.get_profile(unfitted.id) is None
        assert await store.get_profile(rerun.id) is None


@pytest.mark.parametrize(
    ("policy", "seed_profiles"),
    [("pollux-jct", None), ("pollux", None), ("pollux-jct", False)],
    ids=["jct-default", "faithful-default", "jct-set-off"],
)
async def test_seeding_is_off_by_default_and_can_be_turned_off(
    etcd: EtcdServer, root: str, store: Store, policy: str, seed_profiles: bool | None
) -> None:
    base = config(etcd, root, "s-noseed", policy=policy)
    off = base
    if seed_profiles is not None:
        off = replace(base, scheduling=replace(base.scheduling, seed_profiles=seed_profiles))
    r = await Replica(store, off).start()
    try:
        async with running_agent(etcd, root, "agent-a") as agent:
            first = await submit(r, "resnet", "off-1")
            await agent.stub.ReportMetrics(report(1, observation(1, 2, 64), job_id=first.id))
            assert (await store.get_model(first.id)) is not None
            second = await submit(r, "resnet", "off-2")
            assert await store.get_profile(second.id) is None
            assert await store.get_model(second.id) is None
    finally:
        await r.stop()


async def test_a_rerun_after_retention_swept_the_earlier_run_is_still_seeded_from_it(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    """Retention keeps the newest finished run's model and profile until a newer run has them."""
    base = seeding(etcd, root, "s-retain")
    quick = RetentionConfig(finished_grace_s=0.3, sweep_interval_s=0.1, profile_days=1.0)
    r = await Replica(store, replace(base, retention=quick)).start()
    try:
        async with running_agent(etcd, root, "agent-a") as agent:
            first = await submit(r, "resnet", "retain-1")
            await agent.stub.ReportMetrics(report(1, observation(1, 4, 64), job_id=first.id))
            await finish(r, store, first)
            assert await store.get_model(first.id) is not None, "the newest run's model stays"
            assert await store.get_profile(first.id) is not None, "and so does its profile"

            second = await submit(r, "resnet", "retain-2")
            seed = await store.get_profile(second.id)
            assert seed is not None
            assert seed.value.seeded_from == first.id

            async def superseded() -> bool:
                return (
                    await store.get_model(first.id) is None
                    and await store.get_profile(first.id) is None
                )

            await eventually(superseded, 15, "the superseded run's model and profile to go")
            await finish(r, store, second)
            assert await store.get_profile(second.id) is not None, "it is the newest run now"
    finally:
        await r.stop()


async def finish(replica: Replica, store: Store, job: pb.Job) -> None:
    """Cancel a job and wait until the sweep has taken its side state (its idempotency key)."""
    await replica.stub.CancelJob(spb.CancelJobRequest(job_id=job.id))

    async def swept() -> bool:
        return not await store.list_keys(store.keys.request(job.request_id))

    await eventually(swept, 15, "the finished job's side state to be swept")


async def test_a_submit_whose_seed_read_meets_a_stalled_etcd_fails_cleanly_and_is_retried(
    root: str,
) -> None:
    """etcd stops answering (SIGSTOP) while SubmitJob reads the seed: UNAVAILABLE, no job.

    The seed is read before the create transaction, so the failure leaves nothing behind; the
    client's retry with the same request id, once etcd answers again, creates the job once,
    seeded, and a second retry returns that job.
    """
    etcd = EtcdServer.start()
    store = await Store.connect(etcd.endpoint, root, timeout_s=1.0)
    r = await Replica(store, seeding(etcd, root, "s-stall")).start()
    try:
        async with running_agent(etcd, root, "agent-a") as agent:
            first = await submit(r, "resnet", "stall-1")
            await agent.stub.ReportMetrics(report(1, observation(1, 4, 64), job_id=first.id))
            assert await store.get_model(first.id) is not None
            request = spb.SubmitJobRequest(spec=spec("resnet"), request_id="stall-2")
            etcd.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await r.stub.SubmitJob(request, timeout=20)
            finally:
                etcd.process.send_signal(signal.SIGCONT)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()

            async def listed() -> list[pb.Job] | None:
                try:
                    jobs = (await r.stub.ListJobs(spb.ListJobsRequest(), timeout=5)).jobs
                except grpc.aio.AioRpcError:
                    return None  # etcd is back, the replica's connection not yet
                return list(jobs)

            jobs = await eventually(listed, 20, "the scheduler to answer again")
            assert [j.id for j in jobs] == [first.id], "the failed submit created nothing"

            retried = await r.stub.SubmitJob(request, timeout=10)
            assert retried.created
            profile = await store.get_profile(retried.job.id)
            assert profile is not None
            assert profile.value.seeded_from == first.id
            again = await r.stub.SubmitJob(request, timeout=10)
            assert (again.created, again.job.id) == (False, retried.job.id)
    finally:
        await r.stop()
        await store.txn([Delete(root.encode() + b"/", prefix=True)])
        await store.close()
        etcd.stop()
