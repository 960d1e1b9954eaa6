"""One user's backlog on a real scheduler (real etcd, TLS, tokens): another user's job still starts.

Two users of one tenant: alice holds every GPU and queues many more jobs, bob submits one.
The placement round that first sees bob's job preempts one of alice's for it: bob is owed a
first GPU before alice's second (`pollux.policy.placement.owed_moves`). Then, bob holding
one GPU and queueing a second job, a GPU that alice frees goes to bob's job, not to her
oldest waiting one (`pollux.policy.owners.next_in_turn`): within two rounds. Rounds are
counted from their own numbers and decision records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from pollux.scheduler.config import SchedulerConfig, SchedulingConfig
from pollux.scheduler.main import SchedulerApp
from pollux.service import pki
from pollux.service.bootstrap import create_token
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(120)

BACKLOG = 24
"""alice's jobs: more than the cluster's GPUs many times over (her burst is 50)."""


class Cluster:
    """A TLS scheduler replica and stubs per token (closed with it)."""

    def __init__(self, app: SchedulerApp, ca: bytes) -> None:
        self.app = app
        self.ca = ca
        self.channels: list[grpc.aio.Channel] = []

    def channel(self, token: str) -> grpc.aio.Channel:
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(self.ca), grpc.access_token_call_credentials(token)
        )
        channel = grpc.aio.secure_channel(self.app.address, credentials)
        self.channels.append(channel)
        return channel


@pytest.fixture
async def cluster(
    etcd: EtcdServer, root: str, store: Store, tmp_path: Path
) -> AsyncIterator[Cluster]:
    ca = pki.create_ca(tmp_path)
    identity = pki.issue(ca, tmp_path, "scheduler", "service", hosts=("127.0.0.1",))
    store.tls = TlsFiles(ca.cert, identity.cert, identity.key)
    # Periodic rounds 30 s apart: within the test every round but the term's first one is an
    # event's placement round (the live default), each run 0.05 s after a change.
    cfg = SchedulerConfig(
        id="s-1",
        lease_ttl_s=2,
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(grace_s=0),
        scheduling=SchedulingConfig(interval_s=30.0, debounce_s=0.05),
    )
    app = SchedulerApp(store=store, config=replace(cfg))
    await app.start()
    made = Cluster(app, ca.cert.read_bytes())
    try:
        yield made
    finally:
        for channel in made.channels:
            await channel.close()
        await app.stop()
        store.tls = None


def one_gpu_job(name: str) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        command=["python", "-c", "pass"],
        batch=pb.BatchLimits(initial_batch_size=8),
        max_replicas=1,
    )


async def backlog(
    cluster: Cluster, store: Store, gpus: int
) -> tuple[dict[str, spb_grpc.SchedulerServiceStub], list[str], list[str]]:
    """alice's BACKLOG jobs, `gpus` of them running on the one node: stubs, hers, running."""
    admin = apb_grpc.AdminServiceStub(cluster.channel(await create_token(store, "root")))
    stubs = {}
    for user in ("alice", "bob"):
        token = await admin.CreateToken(apb.CreateTokenRequest(user=user, tenant=""))
        stubs[user] = spb_grpc.SchedulerServiceStub(cluster.channel(token.secret))
    await eventually(lambda: cluster.app.scheduler.last_round >= 1, what="the term's round")
    lease = await store.grant_lease(30)
    await store.register_node(pb.Node(name="n1", gpus=gpus, address="127.0.0.1:1"), lease=lease)
    alice = []
    for i in range(BACKLOG):
        request = spb.SubmitJobRequest(spec=one_gpu_job(f"alice-{i}"), request_id=f"alice-{i}")
        alice.append((await stubs["alice"].SubmitJob(request)).job.id)

    async def all_held() -> list[str]:
        held = await holding(store, alice)
        return held if len(held) == gpus else []

    running = await eventually(all_held, timeout=30.0, what="alice's jobs on every GPU")
    return stubs, alice, running


async def holding(store: Store, job_ids: list[str]) -> list[str]:
    """The jobs of `job_ids` that hold GPUs."""
    jobs = [(await store.get_job(job_id)) for job_id in job_ids]
    return [e.value.id for e in jobs if e is not None and e.value.allocation.nodes]


async def bobs_first_job(
    cluster: Cluster, store: Store, gpus: int
) -> tuple[dict[str, spb_grpc.SchedulerServiceStub], list[str], list[str]]:
    """alice's backlog on `gpus` GPUs, then bob's job, placed by the first round that sees it.

    Returns the stubs, alice's jobs and those of hers that still hold GPUs.
    """
    stubs, alice, running = await backlog(cluster, store, gpus)
    request = spb.SubmitJobRequest(spec=one_gpu_job("bob"), request_id="bob")
    bob = (await stubs["bob"].SubmitJob(request)).job.id
    seen = await eventually(lambda: _rounds_with(store, bob), what="a round that saw bob's job")
    assert seen[0][1], f"the first round that saw bob's job, {seen[0][0]}, did not place it"
    (record,) = [r for r in await store.latest_decisions(1000) if r.round == seen[0][0]]
    assert record.placement, "a placement round: nobody but one of alice's jobs moved"
    (preempted,) = [e for e in record.jobs if e.job_id in running and e.changed]
    assert not preempted.nodes
    assert "preempted" in preempted.reason
    still = await holding(store, alice)
    assert sorted(still) == sorted(set(running) - {preempted.job_id}), "no waiting job ran"
    return stubs, alice, still


@pytest.mark.parametrize("gpus", [2, 4])
async def test_the_round_that_sees_the_other_users_job_moves_a_gpu_to_it(
    cluster: Cluster, store: Store, gpus: int
) -> None:
    await bobs_first_job(cluster, store, gpus)


async def test_a_freed_gpu_goes_to_the_user_holding_fewer_not_to_the_backlog(
    cluster: Cluster, store: Store
) -> None:
    stubs, alice, running = await bobs_first_job(cluster, store, gpus=3)
    # bob holds one GPU and alice two: he is owed nothing, his second job waits.
    request = spb.SubmitJobRequest(spec=one_gpu_job("bob-2"), request_id="bob-2")
    bob = (await stubs["bob"].SubmitJob(request)).job.id
    seen = await eventually(lambda: _rounds_with(store, bob), what="a round that saw bob's job")
    assert not seen[0][1], "no GPU was free when bob's second job was first seen"
    # The GPU frees in the round that applies the cancel: that round, or the one after if a
    # round was already under way, must give it to bob (alice then holds one, as he does,
    # and queues more).
    before = cluster.app.scheduler.last_round
    await stubs["alice"].CancelJob(spb.CancelJobRequest(job_id=running[0]))
    await eventually(lambda: holding(store, [bob]), timeout=30.0, what="bob's job on a GPU")

    async def placing() -> list[tuple[int, list[str]]]:
        # A round writes its jobs before its record.
        rounds = await _rounds_with(store, bob)
        return rounds if any(nodes for _, nodes in rounds) else []

    rounds = await eventually(placing, what="the record of the round that placed bob's job")
    placed = next(round_ for round_, nodes in rounds if nodes)
    assert placed - before <= 2, f"bob's job was placed {placed - before} rounds after the cancel"
    assert sorted(await holding(store, alice)) == sorted(running[1:]), "no waiting job of hers ran"
    explained = await stubs["alice"].Explain(spb.ExplainRequest(job_id=alice[-1]))
    assert explained.job.state == pb.JOB_STATE_PENDING


async def _rounds_with(store: Store, job_id: str) -> list[tuple[int, list[str]]]:
    """(round, nodes) of every recorded decision for `job_id`, oldest first.

    A round records every job it sees for the first time, so the first is the first round
    that saw the job; every round after it saw it too.
    """
    return sorted(
        (record.round, list(entry.nodes))
        for record in await store.latest_decisions(1000)
        for entry in record.jobs
        if entry.job_id == job_id
    )
