"""`python -m pollux.launcher.main` as a real process: health, registration, SIGTERM, bad config."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.job_python import job_python
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


def launch(etcd: EtcdServer, store: Store, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "POLLUX_LAUNCHER_ETCD__ROOT": store.keys.root}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pollux.launcher.main",
            "--etcd",
            etcd.endpoint,
            "--node-name",
            "e2e-node",
            "--listen",
            "127.0.0.1:0",
            "--checkpoint-root",
            str(tmp_path / "ck"),
            "--log-root",
            str(tmp_path / "logs"),
            "--scratch-root",
            str(tmp_path / "scratch"),
            # A launcher that is not root would share its uid with its replicas: told so.
            *(() if os.geteuid() == 0 else ("--insecure",)),
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def registered_node(store: Store) -> pb.Node:
    async def node() -> pb.Node | None:
        nodes, _ = await store.list_nodes()
        return nodes[0].value if nodes else None

    found: pb.Node = await eventually(node, 15, "the node to register")
    return found


async def run_sleeper(store: Store, job_id: str) -> int:
    """Allocate a sleeping one-replica job to the node; returns its replica's pid once running."""
    command = [job_python(), "-c", "import time; time.sleep(60)"]
    spec = pb.JobSpec(name="sleep", command=command)
    await store.create_job(pb.Job(id=job_id, request_id=f"r-{job_id}", spec=spec))
    await store.put(store.keys.allocation(job_id), pb.Allocation(nodes=["e2e-node"], generation=1))

    async def running_pid() -> int:
        entries, _ = await store.list_replica_statuses(job_id)
        running = bool(entries) and entries[0].value.phase == pb.REPLICA_PHASE_RUNNING
        return entries[0].value.pid if running else 0

    pid: int = await eventually(running_pid, 15, "the replica to run")
    return pid


async def test_launcher_process_serves_registers_and_exits_cleanly_on_sigterm(
    etcd: EtcdServer, store: Store, tmp_path: Path
) -> None:
    process = launch(etcd, store, tmp_path, "--gpus", "2")
    try:
        node = await registered_node(store)
        assert (node.name, node.gpus, node.gpu_type) == ("e2e-node", 2, "cpu-slot")

        async with grpc.aio.insecure_channel(node.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "pollux.v1.LauncherService"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

        # A running replica is stopped gracefully on shutdown, and its exit recorded.
        await run_sleeper(store, "j-e2e")
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, output
        assert (await store.list_nodes())[0] == []
        entries, _ = await store.list_replica_statuses("j-e2e")
        assert (entries[0].value.phase, entries[0].value.exit_code) == (
            pb.REPLICA_PHASE_EXITED,
            143,
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_bad_configuration_lists_every_problem_and_exits_2(
    etcd: EtcdServer, store: Store, tmp_path: Path
) -> None:
    process = launch(etcd, store, tmp_path, "--gpus", "0", "--etcd", "no-port")
    output, _ = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 2, output
    assert "gpus" in output
    assert "etcd.endpoint" in output
    assert (await store.list_nodes())[0] == []


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_replicas_die_with_a_launcher_that_is_killed(
    etcd: EtcdServer, store: Store, tmp_path: Path
) -> None:
    # Otherwise the cluster re-places the job while the orphan keeps training on the same
    # checkpoint directory: two copies of one job.
    process = launch(etcd, store, tmp_path, "--gpus", "1")
    try:
        await registered_node(store)
        pid = await run_sleeper(store, "j-orphan")
        assert _alive(pid)
        process.kill()  # kill -9: the launcher gets no chance to stop anything
        process.wait()
        await eventually(lambda: not _alive(pid), 10, "the replica to die with its launcher")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
