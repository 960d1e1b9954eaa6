"""NodeLauncher on real etcd with real replica processes (CPU slots, `gpus = 2`).

Each test runs one in-process launcher (its gRPC server on 127.0.0.1:0) under the test's own
key root, writes jobs and allocations the way the scheduler does, and watches what happens:
the processes' environments (each replica dumps its env to a file), their statuses in etcd,
their logs over gRPC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import detect
from pollux.launcher.main import LauncherApp
from pollux.service.config import ConfigError, EtcdConfig, ServerConfig
from pollux.service.ownership import ranked
from pollux.service.store import Delete, Store
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import launcher_service_pb2_grpc as lgrpc
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.job_python import job_python
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)

REPLICA = """\
import json, os, signal, sys, time
out = os.environ["OUT_DIR"]
tag = os.environ["POLLUX_ALLOCATION_GEN"] + "-" + os.environ["RANK"]

def record(name, data):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)

def on_term(signum, frame):
    print("got SIGTERM, checkpointing", flush=True)
    record("term-" + tag, {"t": time.time_ns()})
    sys.exit(143)

signal.signal(signal.SIGTERM, on_term)
record("env-" + tag, {"t": time.time_ns(), "cwd": os.getcwd(), "env": dict(os.environ)})
for i in range(int(os.environ.get("LINES", "3"))):
    print(f"rank {os.environ['RANK']} line {i}", flush=True)
if os.environ.get("MODE") == "exit":
    sys.exit(int(os.environ["EXIT_CODE"]))
trigger = os.environ.get("TRIGGER", "")
while True:
    if trigger and os.path.exists(trigger):
        print("after trigger", flush=True)
        sys.exit(0)
    time.sleep(0.05)
"""


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    path.chmod(0o777)  # written by the replicas, which run under their job's own uid
    return path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "replica.py"
    path.write_text(REPLICA)
    return path


def make_config(etcd: EtcdServer, root: str, tmp_path: Path) -> LauncherConfig:
    return LauncherConfig(
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(listen="127.0.0.1:0", grace_s=1.0),
        node_name="n1",
        gpus=2,
        lease_ttl_s=5,
        checkpoint_root=tmp_path / "checkpoints",
        log_root=tmp_path / "logs",
        scratch_root=tmp_path / "scratch",
        default_stop_grace_s=5.0,
        resync_s=1.0,
        barrier_poll_s=0.1,
    )


@pytest.fixture
async def app(
    etcd: EtcdServer, root: str, store: Store, tmp_path: Path
) -> AsyncIterator[LauncherApp]:
    launcher = LauncherApp(make_config(etcd, root, tmp_path), detect(2), store)
    await launcher.start()
    try:
        yield launcher
    finally:
        await launcher.stop()


@pytest.fixture
async def stub(app: LauncherApp) -> AsyncIterator[lgrpc.LauncherServiceStub]:
    async with grpc.aio.insecure_channel(app.address) as channel:
        yield lgrpc.LauncherServiceStub(channel)


async def submit(
    store: Store, job_id: str, script: Path, out: Path, working_dir: str = "", **env: str
) -> None:
    spec = pb.JobSpec(
        name="train",
        command=[job_python(), str(script)],
        env={"OUT_DIR": str(out), **env},
        working_dir=working_dir,
        stop_grace_s=5,
    )
    await store.create_job(pb.Job(id=job_id, request_id=f"req-{job_id}", spec=spec))


async def allocate(store: Store, job_id: str, *nodes: str, generation: int) -> None:
    await store.put(
        store.keys.allocation(job_id), pb.Allocation(nodes=list(nodes), generation=generation)
    )


async def statuses(store: Store, job_id: str) -> dict[int, pb.ReplicaStatus]:
    entries, _ = await store.list_replica_statuses(job_id)
    return {e.value.rank: e.value for e in entries}


def phases_are(store: Store, job_id: str, want: dict[int, tuple[int, str]]) -> Callable[[], Any]:
    """A check: rank → (generation, phase) of every status is `want`."""

    async def check() -> bool:
        got = await statuses(store, job_id)
        return {
            r: (s.generation, pb.ReplicaPhase.Name(s.phase).removeprefix("REPLICA_PHASE_").lower())
            for r, s in got.items()
        } == want

    return check


def record(out: Path, name: str) -> dict[str, Any] | None:
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None


async def test_replicas_start_with_the_environment_contract(
    app: LauncherApp, store: Store, script: Path, out: Path, tmp_path: Path
) -> None:
    for agent_id in ("agent-a", "agent-b", "agent-c"):
        await store.register_agent(pb.Member(id=agent_id, address=f"{agent_id}:50052"), lease=0)
    await submit(store, "j-env", script, out, working_dir=str(tmp_path), LR="0.1", RANK="99")
    await allocate(store, "j-env", "n1", "n1", generation=1)

    envs = [await eventually(lambda r=r: record(out, f"env-1-{r}")) for r in (0, 1)]
    await eventually(phases_are(store, "j-env", {0: (1, "running"), 1: (1, "running")}))

    owner_first = ",".join(f"{a}:50052" for a in ranked("j-env", ["agent-a", "agent-b", "agent-c"]))
    ports = set()
    for rank, record_ in enumerate(envs):
        env = record_["env"]
        assert record_["cwd"] == str(tmp_path)
        assert env["POLLUX_JOB_ID"] == "j-env"
        assert env["POLLUX_AGENT_ADDR"] == owner_first
        assert env["POLLUX_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints" / "j-env")
        assert env["POLLUX_ALLOCATION_GEN"] == "1"
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)  # the contract beats the job's env
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["POLLUX_NUM_NODES"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert 29500 <= int(env["MASTER_PORT"]) <= 29999
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["LR"] == "0.1"
        ports.add(env["MASTER_PORT"])
    assert len(ports) == 1
    assert (tmp_path / "checkpoints" / "j-env").is_dir()
    # The directory is fenced for generation 1 before its replicas start.
    assert (tmp_path / "checkpoints" / "j-env" / ".pollux-generation").read_text() == "1\n"

    running = await statuses(store, "j-env")
    assert all(s.pid > 0 and s.node == "n1" for s in running.values())
    log_file = tmp_path / "logs" / "j-env" / "1-0.log"
    assert (await eventually(lambda: log_file.exists() and log_file.read_text())).startswith(
        "rank 0 line 0\n"
    )

    await store.txn([Delete(store.keys.allocation("j-env"))])  # cancel
    await eventually(phases_are(store, "j-env", {0: (1, "exited"), 1: (1, "exited")}))
    assert {s.exit_code for s in (await statuses(store, "j-env")).values()} == {143}
    assert record(out, "term-1-0")
    assert record(out, "term-1-1")
    assert "got SIGTERM, checkpointing" in log_file.read_text()


async def test_exit_codes_are_reported(
    app: LauncherApp, store: Store, script: Path, out: Path
) -> None:
    await submit(store, "j-ok", script, out, MODE="exit", EXIT_CODE="0")
    await submit(store, "j-bad", script, out, MODE="exit", EXIT_CODE="3")
    spec = pb.JobSpec(name="missing", command=["/nonexistent/train"])
    await store.create_job(pb.Job(id="j-missing", request_id="req-missing", spec=spec))
    await allocate(store, "j-ok", "n1", generation=1)
    await allocate(store, "j-bad", "n1", generation=4)
    await eventually(phases_are(store, "j-ok", {0: (1, "exited")}))
    await eventually(phases_are(store, "j-bad", {0: (4, "exited")}))
    assert (await statuses(store, "j-ok"))[0].exit_code == 0
    assert (await statuses(store, "j-bad"))[0].exit_code == 3
    await allocate(store, "j-missing", "n1", generation=1)  # the slots are free again
    await eventually(phases_are(store, "j-missing", {0: (1, "exited")}))
    assert (await statuses(store, "j-missing"))[0].exit_code == 127
    missing = app.launcher.find("j-missing", 0)
    assert missing is not None
    assert "cannot start" in missing.log.tail(0)[0][0]
    # An exited replica is not restarted by the launcher: the scheduler decides. Two more
    # passes prove the launcher looked again after the exit.
    seen = app.launcher.passes
    await eventually(lambda: app.launcher.passes >= seen + 2, 10, "two reconcile passes")
    assert len([r for r in app.launcher.replicas() if r.job_id == "j-bad"]) == 1


NUL_SPECS = {
    "command": {"command": ["echo", "a\x00b"]},
    "env value": {"command": ["true"], "env": {"TOKEN": "a\x00b"}},
    "working dir": {"command": ["true"], "working_dir": "/tmp/a\x00b"},
}


@pytest.mark.parametrize("where", sorted(NUL_SPECS), ids=lambda w: f"NUL byte in the {w}")
async def test_a_replica_that_cannot_start_fails_cleanly_and_frees_its_slot(
    app: LauncherApp, store: Store, script: Path, out: Path, where: str
) -> None:
    # Such a spec never passes the scheduler's validation; written straight to etcd (or by an
    # older scheduler), the launcher must still fail the replica, not leak its slot.
    spec = pb.JobSpec(name="nul", **NUL_SPECS[where])
    await store.create_job(pb.Job(id="j-nul", request_id="req-nul", spec=spec))
    await allocate(store, "j-nul", "n1", "n1", generation=1)  # both slots
    await eventually(phases_are(store, "j-nul", {0: (1, "exited"), 1: (1, "exited")}))
    assert {s.exit_code for s in (await statuses(store, "j-nul")).values()} == {127}
    failed = app.launcher.find("j-nul", 0)
    assert failed is not None
    assert "cannot start" in failed.log.tail(0)[0][0]
    # Both slots are free again: a two-replica job starts on them.
    await submit(store, "j-next", script, out)
    await allocate(store, "j-next", "n1", "n1", generation=1)
    await eventually(phases_are(store, "j-next", {0: (1, "running"), 1: (1, "running")}))


async def test_generation_change_stops_old_replicas_before_starting_new_ones(
    app: LauncherApp, store: Store, script: Path, out: Path
) -> None:
    await submit(store, "j-gen", script, out)
    await allocate(store, "j-gen", "n1", "n1", generation=1)
    await eventually(phases_are(store, "j-gen", {0: (1, "running"), 1: (1, "running")}))
    for rank in (0, 1):  # their SIGTERM handlers are installed
        await eventually(lambda rank=rank: record(out, f"env-1-{rank}"))

    await allocate(store, "j-gen", "n1", generation=2)
    started = await eventually(lambda: record(out, "env-2-0"))
    stopped = [record(out, f"term-1-{r}") for r in (0, 1)]
    assert all(stopped), "old replicas were SIGTERMed"
    assert max(s["t"] for s in stopped if s) < started["t"], "no two generations at once"
    assert started["env"]["WORLD_SIZE"] == "1"
    got = await eventually(phases_are(store, "j-gen", {0: (2, "running"), 1: (1, "exited")}))
    assert got
    assert (await statuses(store, "j-gen"))[1].exit_code == 143
    # A log reader gets the newest replica of a rank, or the oldest of at least a generation.
    generation_of = {
        minimum: getattr(app.launcher.find("j-gen", 0, minimum), "generation", None)
        for minimum in (0, 1, 2, 3)
    }
    assert generation_of == {0: 2, 1: 1, 2: 2, 3: None}


async def test_new_generation_waits_for_old_replicas_on_other_nodes(
    app: LauncherApp, store: Store, script: Path, out: Path
) -> None:
    lease = await store.grant_lease(30)
    await store.register_node(pb.Node(name="n2", address="127.0.0.2:1", gpus=1), lease=lease)
    for job_id in ("j-wait", "j-gone"):
        (out / job_id).mkdir(mode=0o777)
        (out / job_id).chmod(0o777)
        await submit(store, job_id, script, out / job_id)
        await store.put_replica_status(
            pb.ReplicaStatus(
                job_id=job_id, node="n2", rank=1, generation=1, phase=pb.REPLICA_PHASE_RUNNING
            )
        )
        await allocate(store, job_id, "n1", generation=2)

    # The launcher looked (passes after the allocations) and holds both at the barrier.
    seen = app.launcher.passes
    await eventually(
        lambda: app.launcher.passes >= seen + 2 and app.launcher.waiting, 10, "the barrier"
    )
    assert not list(out.glob("*/env-*")), "started while generation 1 still runs on n2"

    await store.put_replica_status(
        pb.ReplicaStatus(
            job_id="j-wait",
            node="n2",
            rank=1,
            generation=1,
            phase=pb.REPLICA_PHASE_EXITED,
            exit_code=143,
        )
    )
    await eventually(phases_are(store, "j-wait", {0: (2, "running"), 1: (1, "exited")}))
    await eventually(lambda: record(out / "j-wait", "env-2-0"))
    assert (await statuses(store, "j-gone"))[1].phase == pb.REPLICA_PHASE_RUNNING
    assert not record(out / "j-gone", "env-2-0")

    await store.revoke_lease(lease)  # n2 is gone: its replicas count as gone with it
    await eventually(phases_are(store, "j-gone", {0: (2, "running"), 1: (1, "running")}))
    await eventually(lambda: record(out / "j-gone", "env-2-0"))


async def test_orphan_of_a_previous_launcher_is_closed_then_the_job_moves_on(
    app: LauncherApp, store: Store, script: Path, out: Path
) -> None:
    await submit(store, "j-orphan", script, out)
    await store.put_replica_status(
        pb.ReplicaStatus(
            job_id="j-orphan", node="n1", rank=0, generation=1, phase=pb.REPLICA_PHASE_RUNNING
        )
    )
    await allocate(store, "j-orphan", "n1", generation=2)
    await eventually(phases_are(store, "j-orphan", {0: (2, "running")}))
    await eventually(lambda: record(out, "env-2-0"))


async def test_stream_logs_tail_and_follow(
    app: LauncherApp,
    stub: lgrpc.LauncherServiceStub,
    store: Store,
    script: Path,
    out: Path,
    tmp_path: Path,
) -> None:
    trigger = tmp_path / "trigger"
    await submit(store, "j-logs", script, out, LINES="5", TRIGGER=str(trigger))
    await allocate(store, "j-logs", "n1", generation=3)
    await eventually(
        lambda: (
            app.launcher.find("j-logs", 0) and app.launcher.find("j-logs", 0).log.tail(0)[1] == 5
        )
    )  # type: ignore[union-attr]

    tail = [m async for m in stub.StreamLogs(lpb.StreamLogsRequest(job_id="j-logs", tail_lines=2))]
    assert [line for m in tail for line in m.lines] == ["rank 0 line 3", "rank 0 line 4"]
    assert {m.generation for m in tail} == {3}

    follow = stub.StreamLogs(lpb.StreamLogsRequest(job_id="j-logs", follow=True))
    queue: asyncio.Queue[lpb.StreamLogsResponse | None] = asyncio.Queue()

    async def pump() -> None:
        async for message in follow:
            await queue.put(message)
        await queue.put(None)

    task = asyncio.create_task(pump())
    first = await asyncio.wait_for(queue.get(), 5)
    assert first is not None
    assert list(first.lines) == [f"rank 0 line {i}" for i in range(5)]
    trigger.touch()
    lines: list[str] = []
    while (message := await asyncio.wait_for(queue.get(), 10)) is not None:
        lines.extend(message.lines)
    assert lines == ["after trigger"]  # then the stream ends: the replica exited
    await task
    await eventually(phases_are(store, "j-logs", {0: (3, "exited")}))

    listed = await stub.ListReplicas(lpb.ListReplicasRequest(job_id="j-logs"))
    assert [(r.job_id, r.rank, r.generation, r.phase, r.exit_code) for r in listed.replicas] == [
        ("j-logs", 0, 3, pb.REPLICA_PHASE_EXITED, 0)
    ]


async def test_stream_logs_errors(stub: lgrpc.LauncherServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        async for _ in stub.StreamLogs(lpb.StreamLogsRequest(job_id="nope", rank=0)):
            pass
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        async for _ in stub.StreamLogs(lpb.StreamLogsRequest(job_id="")):
            pass
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "job_id" in (invalid.value.details() or "")
    assert (await stub.ListReplicas(lpb.ListReplicasRequest())).replicas == []


async def test_registration_lives_until_shutdown_which_stops_replicas(
    etcd: EtcdServer, root: str, store: Store, script: Path, out: Path, tmp_path: Path
) -> None:
    app = LauncherApp(make_config(etcd, root, tmp_path), detect(2), store)
    await app.start()
    try:
        nodes, _ = await store.list_nodes()
        assert [(n.value.name, n.value.gpus, n.value.gpu_type, n.value.address) for n in nodes] == [
            ("n1", 2, "cpu-slot", app.address)
        ]
        assert nodes[0].lease != 0
        await submit(store, "j-stop", script, out)
        await allocate(store, "j-stop", "n1", generation=1)
        await eventually(phases_are(store, "j-stop", {0: (1, "running")}))
    finally:
        await app.stop()
    assert (await store.list_nodes())[0] == []
    got = await statuses(store, "j-stop")
    assert (got[0].phase, got[0].exit_code) == (pb.REPLICA_PHASE_EXITED, 143)


async def test_lost_lease_stops_replicas_and_registers_again(
    app: LauncherApp, store: Store, script: Path, out: Path
) -> None:
    await submit(store, "j-lease", script, out)
    await allocate(store, "j-lease", "n1", generation=1)
    await eventually(lambda: record(out, "env-1-0"))
    nodes, _ = await store.list_nodes()
    old_lease = nodes[0].lease
    await store.revoke_lease(old_lease)  # what an etcd partition longer than the ttl does

    # The rest of the cluster now counts n1 as gone, so n1 must not keep running replicas.
    await eventually(phases_are(store, "j-lease", {0: (1, "exited")}))
    assert (await statuses(store, "j-lease"))[0].exit_code == 143

    async def registered_again() -> bool:
        entries, _ = await store.list_nodes()
        return bool(entries) and entries[0].lease not in (0, old_lease)

    await eventually(registered_again)


async def test_a_node_name_held_by_another_live_launcher_is_refused(
    etcd: EtcdServer, root: str, store: Store, tmp_path: Path
) -> None:
    lease = await store.grant_lease(30)
    await store.register_node(pb.Node(name="n1", address="10.9.9.9:7000", gpus=8), lease=lease)
    config = dataclasses.replace(make_config(etcd, root, tmp_path), lease_ttl_s=2)
    app = LauncherApp(config, detect(2), store)
    try:
        with pytest.raises(ConfigError, match=r"node_name: 'n1' is registered .* 10\.9\.9\.9:7000"):
            await app.start()
    finally:
        await app.stop()
    nodes, _ = await store.list_nodes()
    assert [n.value.address for n in nodes] == ["10.9.9.9:7000"]  # left alone
