"""A launcher on full disks, for real: small tmpfs mounts filled to ENOSPC, real replicas.

- The log filesystem full: replicas still start, exit and are reported, slots free up, the
  launcher stops promptly on request, and once space is freed the logs are written again.
- The checkpoint filesystem full: a replica that fails writing there (or whose directories
  cannot even be made) reports `disk_full`, with the error line, so its job fails at once.
- Finished jobs' directories are removed by the sweep after the retention and their uids
  released; a uid's leftovers of another job are removed before it is handed out again.

Mounting needs root: the module is skipped with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from benchmarks import disk_full
from pollux.launcher import job_files
from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import detect
from pollux.launcher.job_policy import JobPolicy, RunAs
from pollux.launcher.main import LauncherApp
from pollux.launcher.replica_log import LOG_WRITE_FAILURES
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Delete, Store
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.job_python import job_python
from tests.waiting import eventually

REASON = disk_full.unavailable()
pytestmark = [pytest.mark.timeout(90), pytest.mark.skipif(bool(REASON), reason=REASON)]


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-traversable directory holding the launcher's roots."""
    path = Path(tempfile.mkdtemp(prefix="pollux-disk-", dir="/tmp"))
    path.chmod(0o755)
    for name in ("checkpoints", "scratch"):
        (path / name).mkdir(mode=0o711)
        (path / name).chmod(0o711)
    (path / "logs").mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def make_config(etcd: EtcdServer, root: str, shared: Path, **changes: object) -> LauncherConfig:
    fields: dict[str, object] = {
        "etcd": EtcdConfig(endpoint=etcd.endpoint, root=root),
        "server": ServerConfig(listen="127.0.0.1:0", grace_s=1.0),
        "node_name": "n1",
        "gpus": 2,
        "lease_ttl_s": 5,
        "checkpoint_root": shared / "checkpoints",
        "log_root": shared / "logs",
        "scratch_root": shared / "scratch",
        "default_stop_grace_s": 5.0,
        "resync_s": 0.5,
        "barrier_poll_s": 0.1,
        "sweep_s": 3600.0,
        "job_policy": JobPolicy(allowed_roots=(shared,)),
        **changes,
    }
    return LauncherConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def app(
    etcd: EtcdServer, root: str, store: Store, shared: Path
) -> AsyncIterator[LauncherApp]:
    launcher = LauncherApp(make_config(etcd, root, shared), detect(2), store)
    await launcher.start()
    try:
        yield launcher
    finally:
        await launcher.stop()


async def submit(store: Store, job_id: str, script: str, *nodes: str, generation: int = 1) -> None:
    spec = pb.JobSpec(name=job_id, command=[job_python(), "-c", script], stop_grace_s=5)
    if await store.get_job(job_id) is None:
        await store.create_job(pb.Job(id=job_id, request_id=f"req-{job_id}", spec=spec))
    allocation = pb.Allocation(nodes=list(nodes or ["n1"]), generation=generation)
    await store.put(store.keys.allocation(job_id), allocation)


async def exits(store: Store, job_id: str, ranks: int = 1) -> dict[int, pb.ReplicaStatus]:
    async def done() -> dict[int, pb.ReplicaStatus] | None:
        entries, _ = await store.list_replica_statuses(job_id)
        got = {e.value.rank: e.value for e in entries if e.value.phase == pb.REPLICA_PHASE_EXITED}
        return got if len(got) == ranks else None

    return await eventually(done, 30)


LOUD = "import sys\nfor i in range(2000): print('line', i, 'x' * 200)\nsys.exit(0)"


async def test_a_full_log_disk_costs_log_lines_never_an_exit_or_a_slot(
    app: LauncherApp, store: Store, shared: Path
) -> None:
    logs = shared / "logs"
    failures_before = LOG_WRITE_FAILURES.labels("ENOSPC")._value.get()
    with disk_full.small_tmpfs(logs, 1 << 20):
        disk_full.fill(logs)
        assert "log_root" in app.launcher.workspaces.check_space()
        # Both slots, twice over: every exit is reported and the slots come back.
        for job_id in ("j-loud-1", "j-loud-2"):
            await submit(store, job_id, LOUD, "n1", "n1")
            statuses = await exits(store, job_id, ranks=2)
            assert {s.exit_code for s in statuses.values()} == {0}
        replica = app.launcher.find("j-loud-2", 0)
        assert replica is not None
        ring = replica.log.tail(0)[0]
        assert any("cannot write this replica's log file" in line for line in ring)
        assert "line 1999 " + "x" * 200 in ring  # StreamLogs still has the output
        assert LOG_WRITE_FAILURES.labels("ENOSPC")._value.get() > failures_before
        # Space freed: logs are written again, and the root is no longer full.
        disk_full.free(logs)
        assert app.launcher.workspaces.check_space() == set()
        await submit(store, "j-after", "print('written again')")
        await exits(store, "j-after")
        written = (logs / "j-after" / "1-0.log").read_text()
        assert written == "written again\n"


async def test_the_launcher_stops_on_request_with_its_log_disk_full(
    etcd: EtcdServer, root: str, store: Store, shared: Path
) -> None:
    app = LauncherApp(make_config(etcd, root, shared), detect(2), store)
    await app.start()
    logs = shared / "logs"
    with disk_full.small_tmpfs(logs, 1 << 20):
        try:
            disk_full.fill(logs)
            chatty = (
                "import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
                "while True:\n    print('x' * 1000, flush=True)\n    time.sleep(0.001)\n"
            )
            await submit(store, "j-chatty", chatty)

            async def running() -> bool:
                replica = app.launcher.find("j-chatty", 0)
                return replica is not None and replica.log.tail(1)[1] > 100

            await eventually(running)
        finally:
            # A hang here is the failure (the bound only keeps the test from hanging forever).
            await asyncio.wait_for(app.stop(), 60)
    status = (await exits(store, "j-chatty"))[0]
    assert status.exit_code == 143
    assert (await store.list_nodes())[0] == []  # deregistered


WRITE_MB = (
    "import os\n"
    "path = os.path.join(os.environ['POLLUX_CHECKPOINT_DIR'], 'model.pt')\n"
    "open(path, 'wb').write(b'\\0' * (512 << 10))\n"
)


async def test_a_replica_failing_on_a_full_checkpoint_disk_reports_disk_full(
    app: LauncherApp, store: Store, shared: Path
) -> None:
    checkpoints = shared / "checkpoints"
    with disk_full.small_tmpfs(checkpoints, 2 << 20):
        # Room for the launcher's small files, none for a checkpoint: the replica fails.
        disk_full.fill(checkpoints, leave=64 << 10)
        await submit(store, "j-ckpt", WRITE_MB)
        status = (await exits(store, "j-ckpt"))[0]
        assert status.exit_code == 1
        assert status.disk_full
        assert "No space left on device" in status.output_tail
        # Not even room to make the job's directories: the replica fails to start, saying so.
        disk_full.free(checkpoints)
        disk_full.fill(checkpoints)
        await submit(store, "j-nodir", "print('never')")
        status = (await exits(store, "j-nodir"))[0]
        assert status.exit_code == 127
        assert status.disk_full
        assert "No space left on device" in status.output_tail
        # Freed: the same kind of job runs.
        disk_full.free(checkpoints)
        await submit(store, "j-fine", WRITE_MB)
        assert (await exits(store, "j-fine"))[0].exit_code == 0


async def finish(store: Store, job_id: str, finished_s_ago: float) -> None:
    """Make the job's record terminal, finished that long ago, and drop its allocation."""
    entry = await store.get_job(job_id)
    assert entry is not None
    job = entry.value
    job.state = pb.JOB_STATE_SUCCEEDED
    job.finish_time.FromNanoseconds(int((time.time() - finished_s_ago) * 1e9))
    await store.update_job(job, expected=entry.mod_revision)
    await store.txn([Delete(store.keys.allocation(job_id))])


async def test_finished_jobs_files_go_after_the_retention_and_their_uid_is_released(
    etcd: EtcdServer, root: str, store: Store, shared: Path
) -> None:
    config = make_config(etcd, root, shared, file_retention_s=3600.0)
    app = LauncherApp(config, detect(2), store)
    await app.start()
    try:
        for job_id in ("j-old", "j-recent", "j-live"):
            await submit(store, job_id, "print('hi')")
            await exits(store, job_id)
        for root_dir in ("checkpoints", "logs", "scratch"):
            assert (shared / root_dir / "j-old").is_dir()
        await finish(store, "j-old", finished_s_ago=7200)  # past the retention
        await finish(store, "j-recent", finished_s_ago=60)  # within it
        # j-live keeps its record RUNNING-ish (never finished): kept whatever its age.
        claim = await store.get(store.keys.job_user("j-old"), pb.JobUser)
        assert claim is not None
        old_uid = claim.value.uid
        await app.launcher.workspaces.sweep()
        for root_dir in ("checkpoints", "logs", "scratch"):
            assert not (shared / root_dir / "j-old").exists()
            assert (shared / root_dir / "j-recent").is_dir()
            assert (shared / root_dir / "j-live").is_dir()
        assert await store.get(store.keys.job_user("j-old"), pb.JobUser) is None
        assert await store.get(store.keys.job_uid(old_uid), pb.JobUser) is None
        assert await store.get(store.keys.job_user("j-recent"), pb.JobUser) is not None
        # A job whose record is gone (deleted by the scheduler's retention) goes too, counted
        # from its directories' last change and its claim's time.
        await store.txn([Delete(store.keys.job("j-recent"))])
        await store.txn([Delete(store.keys.allocation("j-recent"))])
        await app.launcher.workspaces.sweep()
        assert (shared / "checkpoints" / "j-recent").is_dir()
        long_ago = time.time() - 7200
        for root_dir in ("checkpoints", "logs", "scratch"):
            directory = shared / root_dir / "j-recent"
            for entry in [directory, *directory.iterdir()]:
                os.utime(entry, (long_ago, long_ago), follow_symlinks=False)
        claim = await store.get(store.keys.job_user("j-recent"), pb.JobUser)
        assert claim is not None
        claim.value.claim_time.FromNanoseconds(int(long_ago * 1e9))
        for key in (store.keys.job_user("j-recent"), store.keys.job_uid(claim.value.uid)):
            await store.put(key, claim.value)
        await app.launcher.workspaces.sweep()
        assert not (shared / "checkpoints" / "j-recent").exists()
        assert not (shared / "logs" / "j-recent").exists()
        assert await store.get(store.keys.job_user("j-recent"), pb.JobUser) is None
    finally:
        await app.stop()


def test_a_uids_leftovers_of_another_job_are_removed_before_it_is_reused(shared: Path) -> None:
    uid = 1_879_060_000
    roots = [shared / "checkpoints", shared / "logs", shared / "scratch"]
    for root_dir in roots:
        for job_id, owner in (("j-before", uid), ("j-other", uid + 1)):
            job_files.make_private_dir(root_dir / job_id, RunAs(owner, owner))
    (shared / "checkpoints" / "j-before" / "model.pt").write_text("old weights")
    removed = job_files.reclaim(roots, uid, "j-next")
    assert sorted(removed) == sorted(root_dir / "j-before" for root_dir in roots)
    for root_dir in roots:
        assert not (root_dir / "j-before").exists()
        assert (root_dir / "j-other").is_dir()  # another uid's: untouched
    # The job's own directory is never "leftovers".
    job_files.make_private_dir(shared / "checkpoints" / "j-next", RunAs(uid, uid))
    assert job_files.reclaim(roots, uid, "j-next") == []
    assert os.stat(shared / "checkpoints" / "j-next").st_uid == uid
