"""The dashboard of a real scheduler replica on real etcd: its JSON endpoints, over HTTPS with
API tokens on a TLS replica (each user sees their own jobs), and over plaintext as LOCAL on a
loopback one.

Requests are plain HTTP/1.1 over asyncio streams (the server is on this test's loop).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from pollux.scheduler.config import SchedulerConfig, SchedulingConfig
from pollux.scheduler.main import SchedulerApp
from pollux.service import pki
from pollux.service.bootstrap import create_token
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Store
from pollux.service.tls import TlsFiles
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json", self.headers
        return json.loads(self.body)


async def http(
    port: int,
    path: str,
    *,
    token: str | None = None,
    method: str = "GET",
    ca: Path | None = None,
    host: str = "127.0.0.1",
    raw: bytes | None = None,
) -> Answer:
    """One request; the server closes the connection after its answer."""
    context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if context else None
    )
    if raw is None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
        if token is not None:
            lines.append(f"Authorization: Bearer {token}")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode()
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


def spec(name: str = "train") -> pb.JobSpec:
    return pb.JobSpec(
        name=name, command=["python", "-c", "pass"], batch=pb.BatchLimits(initial_batch_size=32)
    )


def config(etcd: EtcdServer, root: str) -> SchedulerConfig:
    return SchedulerConfig(
        id="s-1",
        lease_ttl_s=2,
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(grace_s=0),
        scheduling=SchedulingConfig(interval_s=0.5, debounce_s=0.05),
        dashboard_listen="127.0.0.1:0",
        dashboard_sample_s=0.1,
    )


class Secure:
    """A TLS replica with its dashboard, and gRPC stubs per token."""

    def __init__(self, app: SchedulerApp, ca: Path) -> None:
        self.app = app
        self.ca = ca
        self.channels: list[grpc.aio.Channel] = []
        assert app.dashboard is not None
        self.port = app.dashboard.port

    def jobs(self, token: str) -> spb_grpc.SchedulerServiceStub:
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(self.ca.read_bytes()),
            grpc.access_token_call_credentials(token),
        )
        channel = grpc.aio.secure_channel(self.app.address, credentials)
        self.channels.append(channel)
        return spb_grpc.SchedulerServiceStub(channel)

    async def get(self, path: str, token: str | None = None, **kw: Any) -> Answer:
        return await http(self.port, path, token=token, ca=self.ca, **kw)


@pytest.fixture
async def secure(
    etcd: EtcdServer, root: str, store: Store, tmp_path: Path
) -> AsyncIterator[Secure]:
    ca = pki.create_ca(tmp_path)
    identity = pki.issue(ca, tmp_path, "scheduler", "service", hosts=("127.0.0.1",))
    store.tls = TlsFiles(ca.cert, identity.cert, identity.key)
    app = SchedulerApp(store=store, config=config(etcd, root))
    await app.start()
    s = Secure(app, ca.cert)
    try:
        yield s
    finally:
        for channel in s.channels:
            await channel.close()
        await app.stop()
        store.tls = None


async def test_the_page_is_public_and_the_api_wants_a_token(secure: Secure, store: Store) -> None:
    page = await secure.get("/")
    assert page.status == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert b'<script src="/app.js"' in page.body
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    script = await secure.get("/vendor/uplot/uPlot.iife.min.js")
    assert script.status == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert script.body.startswith(b"/*! https://github.com/leeoniya/uPlot")
    head = await secure.get("/style.css", method="HEAD")
    assert (head.status, head.body) == (200, b"")
    assert int(head.headers["content-length"]) > 100

    missing = await secure.get("/api/v1/jobs")
    assert missing.status == 401
    assert "no credential" in missing.json()["error"]
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert missing.headers["cache-control"] == "no-store"
    wrong = await secure.get("/api/v1/cluster", token="pollux_0123456789ab_" + "x" * 43)
    assert wrong.status == 401
    assert "unknown or revoked" in wrong.json()["error"]
    basic = await http(
        secure.port,
        "/api/v1/cluster",
        ca=secure.ca,
        raw=b"GET /api/v1/cluster HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YTpi\r\n\r\n",
    )
    assert basic.status == 401
    post = await secure.get("/api/v1/jobs", method="POST")
    assert (post.status, post.headers["allow"]) == (405, "GET, HEAD")

    admin = await create_token(store, "root")
    cluster = await secure.get("/api/v1/cluster", token=admin)
    assert cluster.status == 200
    assert cluster.json()["answered_by"] == "s-1"


async def test_users_see_their_own_jobs_and_admins_all(secure: Secure, store: Store) -> None:
    admin = await create_token(store, "root")
    alice = await create_token(store, "alice", role="user")
    bob = await create_token(store, "bob", role="user")
    older = (
        await secure.jobs(alice).SubmitJob(
            spb.SubmitJobRequest(spec=spec("alpha"), request_id="a1")
        )
    ).job
    newer = (
        await secure.jobs(alice).SubmitJob(spb.SubmitJobRequest(spec=spec("beta"), request_id="a2"))
    ).job
    bobs = (
        await secure.jobs(bob).SubmitJob(spb.SubmitJobRequest(spec=spec("alpha"), request_id="b1"))
    ).job

    mine = (await secure.get("/api/v1/jobs", alice)).json()
    assert [j["id"] for j in mine["jobs"]] == [newer.id, older.id], "newest first"
    assert mine["jobs"][0]["owner"] == "alice"
    assert mine["jobs"][0]["state"] == "JOB_STATE_PENDING"
    everyone = (await secure.get("/api/v1/jobs", admin)).json()
    assert [j["id"] for j in everyone["jobs"]] == [bobs.id, newer.id, older.id]
    named = (await secure.get("/api/v1/jobs?name_prefix=a&owner=bob", admin)).json()
    assert [j["id"] for j in named["jobs"]] == [bobs.id]
    pending = (await secure.get("/api/v1/jobs?state=pending,RUNNING&limit=1", admin)).json()
    assert [j["id"] for j in pending["jobs"]] == [bobs.id]
    assert pending["next_page_token"]
    second = await secure.get(
        f"/api/v1/jobs?limit=1&page_token={pending['next_page_token']}", admin
    )
    assert [j["id"] for j in second.json()["jobs"]] == [newer.id]

    # Another user's job answers as no job does (its id and owner cannot be probed).
    denied = await secure.get(f"/api/v1/jobs/{older.id}", bob)
    assert denied.status == 404
    assert "alice" not in denied.json()["error"]
    assert (await secure.get(f"/api/v1/jobs/{older.id}/timeline", bob)).status == 404
    assert (await secure.get(f"/api/v1/jobs/{older.id}/explain", bob)).status == 404
    others = await secure.get("/api/v1/jobs?owner=alice", bob)
    assert others.status == 403
    one = (await secure.get(f"/api/v1/jobs/{older.id}", alice)).json()
    assert one["job"]["id"] == older.id
    assert one["job"]["spec"]["batch"]["initial_batch_size"] == 32

    missing = await secure.get("/api/v1/jobs/j-nothere", admin)
    assert (missing.status, missing.json()["code"]) == (404, "NOT_FOUND")
    bad = await secure.get("/api/v1/jobs?state=sleepy&limit=0&colour=red", admin)
    assert bad.status == 400
    problem = bad.json()["error"]
    assert "state" in problem
    assert "limit" in problem
    assert "colour" in problem
    assert (await secure.get("/api/v1/nothing", admin)).status == 404


async def test_timeline_with_restarts_predicted_progress_and_explain(
    secure: Secure, store: Store
) -> None:
    alice = await create_token(store, "alice", role="user")
    # After the term's first round, the job's first record is the placement round that its
    # submission triggers (explain must find a reason there too).
    await eventually(lambda: store.latest_decisions(1), 10, "the scheduler's first round")
    job = (
        await secure.jobs(alice).SubmitJob(spb.SubmitJobRequest(spec=spec(), request_id="t"))
    ).job
    empty = (await secure.get(f"/api/v1/jobs/{job.id}/timeline", alice)).json()
    assert (empty["timeline"]["points"], empty["restarts"], empty["m0"]) == ([], [], 32)

    timeline = pb.JobTimeline(job_id=job.id)
    t0 = 1_700_000_000
    rows = [  # (seconds, generation, gpus, batch, predicted goodput, progress)
        (0, 1, 1, 32, 0.0, 0.0),
        (10, 1, 1, 32, 64.0, 5.0),
        (20, 1, 1, 64, 64.0, 25.0),
        (30, 2, 4, 128, 256.0, 40.0),
        (40, 2, 4, 128, 256.0, 110.0),
    ]
    for at, gen, gpus, batch, predicted, progress in rows:
        point = timeline.points.add(
            generation=gen,
            gpus=gpus,
            nodes=1,
            batch_size=batch,
            throughput=100.0 * gpus,
            efficiency=0.9,
            goodput=90.0 * gpus,
            predicted_goodput=predicted,
            progress=progress,
        )
        point.time.FromSeconds(t0 + at)
    await store.put(store.keys.timeline(job.id), timeline)

    answer = (await secure.get(f"/api/v1/jobs/{job.id[:6]}/timeline", alice)).json()
    assert answer["job_id"] == job.id
    assert answer["times"] == [float(t0 + r[0]) for r in rows]
    assert [p["generation"] for p in answer["timeline"]["points"]] == [1, 1, 1, 2, 2]
    assert answer["generations"] == [1, 2]
    [restart] = answer["restarts"]
    assert restart["generation"] == 2
    assert restart["from_generation"] == 1
    assert (restart["gpus_before"], restart["gpus_after"]) == (1, 4)
    assert restart["time_s"] == t0 + 30
    # From each generation's first predicted point, + predicted_goodput / M0 per second.
    assert answer["predicted_progress"] == [None, 5.0, 25.0, 40.0, 40.0 + 256 / 32 * 10]

    # Whenever it is asked, explain says why the job waits: from its state before a round
    # decided it, then from the latest record (the placement round, with no free GPU here,
    # then each periodic round's).
    before = (await secure.get(f"/api/v1/jobs/{job.id}/explain", alice)).json()
    assert before["job"]["id"] == job.id
    assert before["decision"]["reason"].startswith("pending: ")

    async def decided() -> Any:
        answer = (await secure.get(f"/api/v1/jobs/{job.id}/explain", alice)).json()
        return answer if "round" in answer else None

    explain = await eventually(decided, 10, "a recorded round that decided the job")
    assert explain["decision"]["job_id"] == job.id
    assert explain["decision"]["reason"] == "pending: no nodes in the cluster"
    assert "alternatives" in explain
    assert "queue_position" in explain


async def test_cluster_view_and_utilisation_over_time(secure: Secure, store: Store) -> None:
    admin = await create_token(store, "root")
    lease = await store.grant_lease(30)
    for name in ("node-b", "node-a"):
        await store.register_node(pb.Node(name=name, gpus=2, address="127.0.0.1:1"), lease=lease)

    async def sampled() -> Any:
        view = (await secure.get("/api/v1/utilisation", admin)).json()
        return view if view["total_gpus"] and view["total_gpus"][-1] == 4 else None

    view = await eventually(sampled, 10, "a utilisation sample of both nodes")
    assert view["interval_s"] == 0.1
    assert len(view["times"]) == len(view["allocated_gpus"]) == len(view["running_jobs"])
    assert [n["name"] for n in view["nodes"]] == ["node-a", "node-b"]
    assert view["nodes"][0]["gpus"][-1] == 2
    assert not view["nodes_truncated"]
    few = (await secure.get("/api/v1/utilisation?points=2", admin)).json()
    assert len(few["times"]) <= 2
    assert few["times"][-1] >= view["times"][-1]
    assert (await secure.get("/api/v1/utilisation?points=0", admin)).status == 400

    cluster = (await secure.get("/api/v1/cluster", admin)).json()
    assert [n["node"]["name"] for n in cluster["nodes"]] == ["node-a", "node-b"]
    assert cluster["total_gpus"] == 4
    assert cluster["job_gpus"] == {}


async def served_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return bytes(der)


async def test_a_renewed_certificate_is_served_from_the_next_connection(
    secure: Secure, store: Store, tmp_path: Path
) -> None:
    assert store.tls is not None
    _, cert_path, key_path = store.tls.paths
    before = await served_certificate(secure.port, secure.ca)
    ca = pki.Issued(secure.ca, tmp_path / "ca-key.pem")
    renewed = pki.issue(ca, tmp_path / "renewed", "scheduler", "service", hosts=("127.0.0.1",))
    key_path.write_bytes(renewed.key.read_bytes())
    cert_path.write_bytes(renewed.cert.read_bytes())
    after = await served_certificate(secure.port, secure.ca)
    assert after != before
    assert ssl.DER_cert_to_PEM_cert(after).strip() == renewed.cert.read_text().strip()
    admin = await create_token(store, "root")
    assert (await secure.get("/api/v1/cluster", admin)).status == 200


async def test_without_tls_everyone_is_local_on_loopback_hosts_only(
    etcd: EtcdServer, root: str, store: Store
) -> None:
    app = SchedulerApp(store=store, config=config(etcd, root))
    await app.start()
    try:
        assert app.dashboard is not None
        port = app.dashboard.port
        assert app.dashboard.url == f"http://127.0.0.1:{port}/"
        channel = grpc.aio.insecure_channel(app.address)
        job = (
            await spb_grpc.SchedulerServiceStub(channel).SubmitJob(
                spb.SubmitJobRequest(spec=spec(), request_id="i")
            )
        ).job
        await channel.close()
        listed = await http(port, "/api/v1/jobs")
        assert [j["id"] for j in listed.json()["jobs"]] == [job.id]
        assert (await http(port, "/api/v1/cluster", host="localhost:8080")).status == 200
        rebound = await http(port, "/api/v1/jobs", host="attacker.example:8080")
        assert rebound.status == 403
        assert "loopback host name" in rebound.json()["error"]
        assert (await http(port, "/", host="attacker.example")).status == 200, "static is public"
    finally:
        await app.stop()
    with pytest.raises(ConnectionRefusedError):
        await http(port, "/")
