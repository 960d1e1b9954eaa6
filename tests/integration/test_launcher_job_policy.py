"""The launcher's job policy on a real launcher (CPU slots) with real etcd and real processes.

Each job's replicas run under a uid of the job's own, claimed in etcd, and own the job's
checkpoint, log and scratch directories (0700; logs 0600): one job can read nothing of
another's, nor the launcher's key. A job the policy refuses exits 127 with the reason, saying
what to fix, in its log, and nothing of it is created. The directories the replicas must reach
(working dir, roots) live in a world-traversable directory of their own under /tmp.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import detect
from pollux.launcher.job_policy import DEFAULT_JOB_UIDS, JobPolicy, RunAs
from pollux.launcher.main import LauncherApp
from pollux.launcher.workspaces import Workspaces
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
    """A directory every user may traverse (for the working dir and the roots)."""
    path = Path(tempfile.mkdtemp(prefix="pollux-policy-", dir="/tmp"))
    path.chmod(0o755)
    (path / "work").mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def config_for(etcd: EtcdServer, root: str, shared: Path, policy: JobPolicy) -> LauncherConfig:
    return LauncherConfig(
        etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
        server=ServerConfig(listen="127.0.0.1:0", grace_s=1.0),
        node_name="n1",
        gpus=2,
        lease_ttl_s=5,
        checkpoint_root=shared / "checkpoints",
        log_root=shared / "logs",
        scratch_root=shared / "scratch",
        default_stop_grace_s=5.0,
        resync_s=1.0,
        barrier_poll_s=0.1,
        job_policy=policy,
    )


@pytest.fixture
async def app(
    etcd: EtcdServer, root: str, store: Store, shared: Path
) -> AsyncIterator[LauncherApp]:
    policy = JobPolicy(allowed_roots=(shared / "work",))
    launcher = LauncherApp(config_for(etcd, root, shared, policy), detect(2), store)
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


def private(path: Path, uid: int, mode: int) -> bool:
    info = path.lstat()
    return (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, uid, mode)


async def test_each_job_runs_under_its_own_uid_and_owns_its_private_directories(
    app: LauncherApp, store: Store, shared: Path
) -> None:
    script = 'echo "$HOME $TMPDIR $USER"; umask; ' + REPORT
    uids = {}
    for job_id in ("j-a", "j-b"):
        spec = pb.JobSpec(
            name="who", command=["/bin/sh", "-c", script], working_dir=str(shared / "work")
        )
        status = await run(store, job_id, spec)
        replica = app.launcher.find(job_id, 0)
        assert replica is not None
        assert status.exit_code == 0, replica.log.tail(0)[0]
        claim = await store.get(store.keys.job_user(job_id), pb.JobUser)
        assert claim is not None
        uid = claim.value.uid
        assert DEFAULT_JOB_UIDS[0] <= uid <= DEFAULT_JOB_UIDS[1]
        checkpoints = shared / "checkpoints" / job_id
        assert (checkpoints / "who").read_text().split() == [str(uid), str(uid)]
        assert private(checkpoints, uid, 0o700)
        assert private(checkpoints / "who", uid, 0o600)  # the replica's umask is 077
        logs = shared / "logs" / job_id
        assert private(logs, uid, 0o700)
        assert private(logs / "1-0.log", uid, 0o600)
        scratch = shared / "scratch" / job_id
        for directory in (scratch, scratch / "home", scratch / "tmp"):
            assert private(directory, uid, 0o700)
        home_tmp_user, umask, *_ = replica.log.tail(0)[0]
        assert home_tmp_user == f"{scratch / 'home'} {scratch / 'tmp'} pollux-{uid}"
        assert umask == "0077"
        uids[job_id] = uid
    assert uids["j-a"] != uids["j-b"]
    # The uid is the job's for good: asked again (its next generation, another node or
    # launcher process, with nothing remembered), the same claim is read from etcd.
    fresh = Workspaces(app.launcher.config, store, uid=os.geteuid(), live=lambda _: True)
    assert await fresh.job_user("j-a") == RunAs(uids["j-a"], uids["j-a"])


async def test_a_job_reads_nothing_of_another_job_nor_the_launchers_keys(
    app: LauncherApp, store: Store, shared: Path
) -> None:
    victim = pb.JobSpec(
        name="victim",
        command=["/bin/sh", "-c", 'echo secret-output; echo s3cret > "$POLLUX_CHECKPOINT_DIR/s"'],
    )
    assert (await run(store, "j-victim", victim)).exit_code == 0
    key = shared / "launcher-key.pem"  # where a launcher's key lives: root's, 0600
    key.write_text("KEY")
    key.chmod(0o600)
    targets = [
        shared / "checkpoints" / "j-victim" / "s",
        shared / "logs" / "j-victim" / "1-0.log",
        shared / "scratch" / "j-victim" / "home",
        key,
    ]
    attempt = "; ".join(
        f"{'ls' if t.name == 'home' else 'cat'} {t} || echo refused:{t.name}" for t in targets
    )
    spec = pb.JobSpec(name="thief", command=["/bin/sh", "-c", attempt])
    status = await run(store, "j-thief", spec)
    replica = app.launcher.find("j-thief", 0)
    assert replica is not None
    lines = replica.log.tail(0)[0]
    assert status.exit_code == 0, lines
    assert [line for line in lines if line.startswith("refused:")] == [
        "refused:s",
        "refused:1-0.log",
        "refused:home",
        "refused:launcher-key.pem",
    ], lines
    assert not any("s3cret" in line or "secret-output" in line or line == "KEY" for line in lines)


async def test_a_refused_job_fails_with_what_to_fix_and_nothing_is_created(
    app: LauncherApp, store: Store, shared: Path
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
    assert (shared / "logs" / "j-etc" / "1-0.log").read_text() == line + "\n"
    # The status carries the reason too, for the job's history (`describe`).
    assert status.output_tail == line
    assert not (shared / "checkpoints" / "j-etc").exists()
    assert not (shared / "scratch" / "j-etc").exists()
    assert await store.get(store.keys.job_user("j-etc"), pb.JobUser) is None
    assert not Path("/etc/oops").exists()
    # The slot is free again: an acceptable job runs.
    ok = pb.JobSpec(name="ok", command=["/bin/sh", "-c", "exit 0"])
    assert (await run(store, "j-ok", ok)).exit_code == 0


async def test_one_configured_user_for_every_job_still_works_when_the_operator_insists(
    etcd: EtcdServer, root: str, store: Store, shared: Path
) -> None:
    policy = JobPolicy(allowed_roots=(shared / "work",), run_as_uid=NOBODY)
    app = LauncherApp(config_for(etcd, root, shared, policy), detect(2), store)
    await app.start()
    try:
        assert app.launcher.workspaces.run_as is not None
        assert not app.launcher.workspaces.per_job_uids
        spec = pb.JobSpec(
            name="who", command=["/bin/sh", "-c", REPORT], working_dir=str(shared / "work")
        )
        status = await run(store, "j-who", spec)
        replica = app.launcher.find("j-who", 0)
        assert replica is not None
        assert status.exit_code == 0, replica.log.tail(0)[0]
        checkpoints = shared / "checkpoints" / "j-who"
        gid = app.launcher.workspaces.run_as.gid
        assert (checkpoints / "who").read_text().split() == [str(NOBODY), str(gid)]
        assert checkpoints.stat().st_uid == NOBODY
        assert (checkpoints / ".pollux-generation").read_text() == "1\n"
        assert replica.log.tail(0)[0] == [str(shared / "work")]
        assert await store.get(store.keys.job_user("j-who"), pb.JobUser) is None
    finally:
        await app.stop()
