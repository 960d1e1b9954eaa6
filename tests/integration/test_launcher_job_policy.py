"""The launcher's job policy on a real launcher (CPU slots) with real etcd and real processes.

A replica runs as the configured unprivileged user and can write its checkpoint directory; a
job the policy refuses exits 127 with the reason, saying what to fix, in its log, and nothing
of it is created. pytest's tmp_path is private to root (mode 0700 parents), so the directories
the replica user must reach live in a world-traversable directory of their own under /tmp.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import detect
from pollux.launcher.job_policy import JobPolicy
from pollux.launcher.main import LauncherApp
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Store
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching the replica user needs root"),
]

NOBODY = 65534
REPORT = 'id -u > "$POLLUX_CHECKPOINT_DIR/who"; id -g >> "$POLLUX_CHECKPOINT_DIR/who"; pwd'


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may traverse (for the working and checkpoint dirs)."""
    path = Path(tempfile.mkdtemp(prefix="pollux-policy-", dir="/tmp"))
    path.chmod(0o755)
    (path / "work").mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
async def app(
    etcd: EtcdServer, root: str, store: Store, shared: Path, tmp_path: Path
) -> AsyncIterator[LauncherApp]:
    config = LauncherConfig(
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(listen="127.0.0.1:0", grace_s=1.0),
        node_name="n1",
        gpus=2,
        lease_ttl_s=5,
        checkpoint_root=shared / "checkpoints",
        log_root=tmp_path / "logs",
        default_stop_grace_s=5.0,
        resync_s=1.0,
        barrier_poll_s=0.1,
        job_policy=JobPolicy(allowed_roots=(shared / "work",), run_as_uid=NOBODY),
    )
    launcher = LauncherApp(config, detect(2), store)
    await launcher.start()
    try:
        yield launcher
    finally:
        await launcher.stop()


async def run(store: Store, job_id: str, spec: pb.JobSpec) -> pb.ReplicaStatus:
    """Start the job's one replica and wait for its exit status."""
    await store.create_job(pb.Job(id=job_id, request_id=f"req-{job_id}", spec=spec))
    await store.put(store.keys.allocation(job_id), pb.Allocation(nodes=["n1"], generation=1))

    async def exited() -> pb.ReplicaStatus | None:
        entries, _ = await store.list_replica_statuses(job_id)
        done = [e.value for e in entries if e.value.phase == pb.REPLICA_PHASE_EXITED]
        return done[0] if done else None

    return await eventually(exited)


async def test_replicas_run_as_the_configured_user_and_own_their_checkpoint_dir(
    app: LauncherApp, store: Store, shared: Path
) -> None:
    assert app.launcher.run_as is not None
    spec = pb.JobSpec(
        name="who", command=["/bin/sh", "-c", REPORT], working_dir=str(shared / "work")
    )
    status = await run(store, "j-who", spec)
    replica = app.launcher.find("j-who", 0)
    assert replica is not None
    assert status.exit_code == 0, replica.log.tail(0)[0]
    checkpoints = shared / "checkpoints" / "j-who"
    assert (checkpoints / "who").read_text().split() == [str(NOBODY), str(app.launcher.run_as.gid)]
    assert (checkpoints / "who").stat().st_uid == NOBODY  # written by the replica itself
    assert checkpoints.stat().st_uid == NOBODY
    assert (checkpoints / ".pollux-generation").read_text() == "1\n"
    assert replica.log.tail(0)[0] == [str(shared / "work")]


async def test_a_refused_job_fails_with_what_to_fix_and_nothing_is_created(
    app: LauncherApp, store: Store, shared: Path, tmp_path: Path
) -> None:
    spec = pb.JobSpec(
        name="etc",
        command=["/bin/sh", "-c", "touch oops"],
        working_dir="/etc",
        env={"LD_PRELOAD": "/tmp/evil.so"},
    )
    status = await run(store, "j-etc", spec)
    assert status.exit_code == 127
    replica = app.launcher.find("j-etc", 0)
    assert replica is not None
    (line,) = replica.log.tail(0)[0]
    assert line.startswith(
        "pollux-launcher: cannot start the replica: working_dir /etc is outside the allowed "
        f"roots {shared / 'work'}: set job_policy.allowed_roots on the launcher or use a "
        "directory under them; env variable LD_PRELOAD is refused, as it makes programs the "
        "launcher starts load other code"
    )
    assert (tmp_path / "logs" / "j-etc" / "1-0.log").read_text() == line + "\n"
    # The status carries the reason too, for the job's history (`describe`).
    assert status.output_tail == line
    assert not (shared / "checkpoints" / "j-etc").exists()
    assert not Path("/etc/oops").exists()
    # The slot is free again: an acceptable job runs.
    ok = pb.JobSpec(name="ok", command=["/bin/sh", "-c", "exit 0"])
    assert (await run(store, "j-ok", ok)).exit_code == 0
