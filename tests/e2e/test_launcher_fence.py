"""The launcher-side fence with real processes: watchdog, restart sweep (launcher/fence.py).

A launcher that stops acting (SIGSTOP) past its lease must not leave its replicas training:
the cluster re-places their jobs as soon as etcd expires the node. And a launcher that comes
back on a node must first kill whatever replicas of that node still run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pollux.launcher.fence import FENCE_VAR, fence_token
from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb
from tests.e2e.test_launcher_process import REPO, registered_node, run_sleeper
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(90)

TTL_S = 3


def start_launcher(etcd: EtcdServer, store: Store, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "POLLUX_LAUNCHER_ETCD__ROOT": store.keys.root,
        "POLLUX_LAUNCHER_LEASE_TTL_S": str(TTL_S),
    }
    with (tmp_path / "launcher.log").open("ab") as log:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "pollux.launcher.main", "--etcd", etcd.endpoint),
                *("--node-name", "e2e-node", "--listen", "127.0.0.1:0", "--gpus", "1"),
                *("--checkpoint-root", str(tmp_path / "ck"), "--log-root", str(tmp_path / "logs")),
                *("--scratch-root", str(tmp_path / "scratch")),
                # A launcher that is not root would share its uid with its replicas: told so.
                *(() if os.geteuid() == 0 else ("--insecure",)),
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def watchdog_of(launcher_pid: int) -> int:
    """The pid of the launcher's watchdog child, or 0."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == launcher_pid and b"pollux.launcher.watchdog" in cmdline:
            return int(entry.name)
    return 0


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


async def test_a_stopped_launchers_replicas_die_before_its_node_lease_expires(
    etcd: EtcdServer, store: Store, tmp_path: Path
) -> None:
    launcher = start_launcher(etcd, store, tmp_path)
    try:
        await registered_node(store)
        pid = await run_sleeper(store, "j-stopped")

        # A watchdog that dies is replaced, and the replacement holds the same deadline.
        first = await eventually(lambda: watchdog_of(launcher.pid), 10, "the watchdog")
        os.kill(first, signal.SIGKILL)
        await eventually(lambda: watchdog_of(launcher.pid) not in (0, first), 10, "a new watchdog")
        assert alive(pid), "the replica kept running while its watchdog was replaced"

        launcher.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        replica_dead_at = node_gone_at = None
        while node_gone_at is None and time.monotonic() - stopped_at < 4 * TTL_S:
            now = time.monotonic()
            if replica_dead_at is None and not alive(pid):
                replica_dead_at = now
            if not (await store.list_nodes())[0]:
                node_gone_at = now
            await asyncio.sleep(0.05)
        assert node_gone_at is not None, "etcd expired the stopped launcher's lease"
        assert replica_dead_at is not None, "the replica was still running when the node left"
        assert replica_dead_at <= node_gone_at
        assert replica_dead_at - stopped_at < TTL_S

        # Resumed, the launcher finds its lease lost, registers again and records the
        # fenced replica as a planned stop (the scheduler re-places the job; no failure).
        launcher.send_signal(signal.SIGCONT)
        await registered_node(store)

        async def exit_code() -> int | None:
            entries, _ = await store.list_replica_statuses("j-stopped")
            status = entries[0].value
            return status.exit_code if status.phase == pb.REPLICA_PHASE_EXITED else None

        assert await eventually(exit_code, 15, "the fenced replica's exit") == 143
    finally:
        stop(launcher)


async def test_a_restarted_launcher_kills_its_nodes_stray_replicas_before_registering(
    etcd: EtcdServer, store: Store, tmp_path: Path
) -> None:
    # Processes marked as this node's replicas that no launcher supervises (their launcher
    # died and neither the parent-death signal nor the watchdog reached them), beside one
    # marked for another node on the same host.
    def marked(node: str) -> subprocess.Popen[bytes]:
        token = fence_token(etcd.endpoint, store.keys.root, node)
        return subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            env={**os.environ, FENCE_VAR: token},
            start_new_session=True,
        )

    strays = [marked("e2e-node"), marked("e2e-node")]
    bystander = marked("other-node")
    launcher = start_launcher(etcd, store, tmp_path)
    try:
        await registered_node(store)
        assert not any(alive(p.pid) for p in strays), "strays were killed before registering"
        assert alive(bystander.pid), "another node's replica is left alone"
        assert [p.wait(5) for p in strays] == [-signal.SIGKILL] * 2
    finally:
        stop(launcher)
        for process in [*strays, bystander]:
            if process.poll() is None:
                process.kill()
                process.wait()
