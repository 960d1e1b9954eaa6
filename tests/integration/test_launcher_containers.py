"""Jobs with an image on a real launcher running real podman containers (CPU slots).

The replica is a stdlib-only ``python3 -c`` script in a tiny local base image: Debian bookworm
from debootstrap (the machines reach no image registry), built once by
``scripts/build_test_base_image.sh`` and kept as ``localhost/pollux-test-base:bookworm`` (its
rootfs tarball cached under /var/cache/pollux-test-base). The module is skipped, saying why,
without root, podman, or a base image it can build. Every container a test starts is removed
(by the launcher, whose removal is what is tested, and again at teardown by label).

This machine's podman needs ``--runtime runc`` and explicit ulimits (docs: the shared
containers note), which is what the launcher's ``runtime_flags`` are for.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from pollux.launcher.config import LauncherConfig
from pollux.launcher.containers import FENCE_LABEL, remove_fenced
from pollux.launcher.fence import fence_token
from pollux.launcher.gpus import detect
from pollux.launcher.job_policy import JobPolicy
from pollux.launcher.main import LauncherApp
from pollux.launcher.watchdog import killer
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.store import Delete, Store
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("POLLUX_TEST_BASE_IMAGE", "localhost/pollux-test-base:bookworm")
PODMAN = shutil.which("podman")
FLAGS = ("--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
"""What every podman run needs on this kind of machine (crun fails on its hybrid cgroups)."""
USER = 1234
"""The job policy's replica user (not nobody, so the default is not what is seen)."""

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="running containers as another user needs root"),
    pytest.mark.skipif(
        PODMAN is None, reason="podman is not installed (apt-get install -y podman runc)"
    ),
]

CONTRACT = """
import json, os, sys
names = ["POLLUX_JOB_ID", "POLLUX_ALLOCATION_GEN", "POLLUX_CHECKPOINT_DIR", "RANK", "WORLD_SIZE",
         "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "POLLUX_NODE_FENCE",
         "POLLUX_AGENT_ADDR", "GREETING", "TOKEN", "PATH"]
shm = os.statvfs("/dev/shm")
print(json.dumps({"env": {n: os.environ.get(n) for n in names}, "uid": os.getuid(),
                  "gid": os.getgid(), "cwd": os.getcwd(),
                  "shm_mb": shm.f_blocks * shm.f_frsize // 2**20,
                  "data": open("/data/input.txt").read()}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
path = os.path.join(os.environ["POLLUX_CHECKPOINT_DIR"], "ckpt")
with open(path + ".tmp", "w") as out:
    out.write("step 1\\n")
os.replace(path + ".tmp", path)
"""

GRACEFUL = """
import signal, sys, time
def stop(*_):
    print("checkpointing on SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(300)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
print("ready", flush=True)
while True:
    time.sleep(1)
"""

NO_HANDLER = 'import time; print("ready", flush=True); time.sleep(300)'


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert PODMAN is not None
    return subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=120, check=check)


@pytest.fixture(scope="module")
def base_image() -> str:
    """The local base image: built (once, cached) if missing; skip when podman cannot run it."""
    if _podman("image", "exists", IMAGE, check=False).returncode != 0:
        build = subprocess.run(
            [REPO / "scripts" / "build_test_base_image.sh", IMAGE],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if build.returncode != 0:
            pytest.skip(f"cannot build the base image {IMAGE}: {build.stderr.strip()[-400:]}")
    probe = _podman("run", "--rm", *FLAGS, "--network=host", IMAGE, "python3", "-V", check=False)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run {IMAGE} here: {probe.stderr.strip()[-400:]}")
    return IMAGE


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may traverse (checkpoints, and a directory jobs may mount)."""
    path = Path(tempfile.mkdtemp(prefix="pollux-containers-", dir="/tmp"))
    path.chmod(0o755)
    (path / "data").mkdir(mode=0o755)
    (path / "data" / "input.txt").write_text("mounted from the host")
    try:
        yield path
    finally:
        shutil.rmtree(path)


class Apps:
    """Launchers of node n1, one at a time; whichever still runs is stopped at teardown."""

    def __init__(self, start: Callable[[str, str | None], Awaitable[LauncherApp]]) -> None:
        self._start = start
        self.running: list[LauncherApp] = []

    async def __call__(self, runtime: str = "podman", socket: str | None = None) -> LauncherApp:
        """A launcher; with `socket`, one that drives podman through that API socket."""
        app = await self._start(runtime, socket)
        self.running.append(app)
        return app

    async def stop(self, app: LauncherApp) -> None:
        self.running.remove(app)
        await app.stop()


MakeApp = Apps


@pytest.fixture
async def make_app(
    etcd: EtcdServer, root: str, store: Store, shared: Path, tmp_path: Path, base_image: str
) -> AsyncIterator[MakeApp]:
    """Start launchers of node n1 (stopped at teardown, its containers removed by label)."""
    assert PODMAN is not None

    async def start(runtime: str, socket: str | None) -> LauncherApp:
        remote = ("--remote", "--url", f"unix://{socket}") if socket else ()
        config = LauncherConfig(
            etcd=EtcdConfig(endpoint=etcd.endpoint, root=root),
            server=ServerConfig(listen="127.0.0.1:0", grace_s=1.0),
            node_name="n1",
            gpus=4,
            lease_ttl_s=5,
            checkpoint_root=shared / "checkpoints",
            log_root=tmp_path / "logs",
            scratch_root=tmp_path / "scratch",
            default_stop_grace_s=5.0,
            resync_s=1.0,
            barrier_poll_s=0.1,
            job_policy=JobPolicy(run_as_uid=USER, run_as_gid=USER),
            runtime=runtime,
            # A remote client takes no --runtime: the service's own configuration picks it.
            runtime_flags=FLAGS[2:] if socket else FLAGS,
            runtime_global_flags=remote,
            container_mounts_allowed=(shared / "data",),
        )
        app = LauncherApp(config, detect(4), store)
        await app.start()
        return app

    apps = Apps(start)
    try:
        yield apps
    finally:
        for app in list(apps.running):
            await apps.stop(app)
        remove_fenced("podman", (PODMAN,), fence_token(etcd.endpoint, root, "n1"))


async def submit(store: Store, job_id: str, spec: pb.JobSpec) -> None:
    await store.create_job(pb.Job(id=job_id, request_id=f"req-{job_id}", spec=spec))
    await store.put(store.keys.allocation(job_id), pb.Allocation(nodes=["n1"], generation=1))


async def exited(store: Store, job_id: str, timeout: float = 30.0) -> pb.ReplicaStatus:
    async def done() -> pb.ReplicaStatus | None:
        entries, _ = await store.list_replica_statuses(job_id)
        statuses = [e.value for e in entries if e.value.phase == pb.REPLICA_PHASE_EXITED]
        return statuses[0] if statuses else None

    status: pb.ReplicaStatus = await eventually(done, timeout, f"{job_id} to exit")
    return status


def container(job_id: str, script: str, **fields: object) -> pb.JobSpec:
    return pb.JobSpec(name="c", image=IMAGE, command=["python3", "-c", script], **fields)  # type: ignore[arg-type]


def exists(name: str) -> bool:
    return _podman("container", "exists", name, check=False).returncode == 0


async def test_a_container_replica_gets_the_contract_and_writes_its_checkpoint_as_the_user(
    make_app: MakeApp, store: Store, shared: Path, tmp_path: Path
) -> None:
    app = await make_app()
    started = time.monotonic()
    spec = container(
        "j-ctr",
        CONTRACT,
        env={"GREETING": "hello"},
        secret_env={"TOKEN": "s3cret"},
        working_dir="/tmp",
        shm_size_mb=96,
        mounts=[pb.Mount(host_path=str(shared / "data"), container_path="/data", read_only=True)],
    )
    await submit(store, "j-ctr", spec)
    status = await exited(store, "j-ctr")
    replica = app.launcher.find("j-ctr", 0)
    assert replica is not None
    lines = replica.log.tail(0)[0]
    assert status.exit_code == 0, lines
    report = json.loads(lines[0])
    env = report["env"]
    checkpoint_dir = shared / "checkpoints" / "j-ctr"
    assert env["POLLUX_JOB_ID"] == "j-ctr"
    assert env["POLLUX_ALLOCATION_GEN"] == "1"
    assert env["POLLUX_CHECKPOINT_DIR"] == str(checkpoint_dir)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("0", "1", "0")
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"].isdigit()
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU slot
    assert env["POLLUX_NODE_FENCE"] == app.launcher.fence_token
    assert (env["GREETING"], env["TOKEN"]) == ("hello", "s3cret")
    assert env["PATH"] != os.environ.get("PATH")  # the image's, not the launcher's
    assert (report["uid"], report["gid"]) == (USER, USER)
    assert report["cwd"] == "/tmp"
    assert report["shm_mb"] == 96
    assert report["data"] == "mounted from the host"
    assert "to stderr" in lines
    # The checkpoint, written inside the container, is on the host, owned by the job's user.
    ckpt = checkpoint_dir / "ckpt"
    assert ckpt.read_text() == "step 1\n"
    assert (ckpt.stat().st_uid, ckpt.stat().st_gid) == (USER, USER)
    assert (checkpoint_dir / ".pollux-generation").read_text() == "1\n"
    # The log file holds the same output; the container is gone.
    log_file = (tmp_path / "logs" / "j-ctr" / "1-0.log").read_text().splitlines()
    assert log_file == lines
    assert not exists("pollux-j-ctr-1-0")
    # Exit codes pass through.
    await submit(store, "j-three", container("j-three", "import sys; sys.exit(3)"))
    assert (await exited(store, "j-three")).exit_code == 3
    print(f"two container replicas in {time.monotonic() - started:.1f} s")


async def test_stop_is_sigterm_then_grace_then_kill_and_removes_the_container(
    make_app: MakeApp, store: Store
) -> None:
    app = await make_app()
    await submit(store, "j-grace", container("j-grace", GRACEFUL))
    await submit(store, "j-plain", container("j-plain", NO_HANDLER))
    await submit(store, "j-stub", container("j-stub", STUBBORN, stop_grace_s=1))

    def ready(job_id: str) -> Callable[[], bool]:
        def check() -> bool:
            replica = app.launcher.find(job_id, 0)
            return replica is not None and "ready" in replica.log.tail(0)[0]

        return check

    await submit(store, "j-fence", container("j-fence", GRACEFUL))
    for job_id in ("j-grace", "j-plain", "j-stub", "j-fence"):
        await eventually(ready(job_id), 30.0, f"{job_id} to start")
        assert exists(f"pollux-{job_id}-1-0")
    # The fence (the node's lease lapsed): SIGKILL at once, no checkpoint; a planned stop.
    fenced = app.launcher.find("j-fence", 0)
    assert fenced is not None
    assert await fenced.fence() == 143
    assert (await exited(store, "j-fence")).exit_code == 143
    assert "checkpointing on SIGTERM" not in fenced.log.tail(0)[0]
    assert not exists("pollux-j-fence-1-0")
    # Deleting the allocations stops the replicas (SIGTERM, grace, SIGKILL).
    for job_id in ("j-grace", "j-plain", "j-stub"):
        await store.txn([Delete(store.keys.allocation(job_id))])
    grace, plain, stub = [await exited(store, j) for j in ("j-grace", "j-plain", "j-stub")]
    assert grace.exit_code == 143  # its handler checkpointed and exited 143
    assert plain.exit_code == 143  # died of SIGTERM (no handler; --init at PID 1)
    assert stub.exit_code == -9  # ignored SIGTERM: killed after its 1 s grace, as a process is
    replica = app.launcher.find("j-grace", 0)
    assert replica is not None
    assert "checkpointing on SIGTERM" in replica.log.tail(0)[0]
    stubborn = app.launcher.find("j-stub", 0)
    assert stubborn is not None
    assert "ignoring SIGTERM" in stubborn.log.tail(0)[0]
    for job_id in ("j-grace", "j-plain", "j-stub"):
        assert not exists(f"pollux-{job_id}-1-0")


@pytest.fixture
def podman_socket(tmp_path: Path) -> Iterator[str]:
    """A ``podman system service`` on a socket of its own, as a containerised launcher uses."""
    assert PODMAN is not None
    socket = tmp_path / "podman.sock"
    service = subprocess.Popen(
        [PODMAN, "system", "service", "--time=0", f"unix://{socket}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket.exists(), "podman system service did not make its socket"
        yield str(socket)
    finally:
        service.terminate()
        try:
            service.wait(10)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()


async def test_a_launcher_drives_podman_through_its_socket_as_it_would_from_a_container(
    make_app: MakeApp, store: Store, podman_socket: str
) -> None:
    # A remote client forwards no signal: the stop goes to the container by name, and the
    # replica still checkpoints on SIGTERM and reports 143; the runtime says it is rootful.
    app = await make_app(socket=podman_socket)
    assert app.launcher.runtime.client[1:] == ("--remote", "--url", f"unix://{podman_socket}")
    await submit(store, "j-remote", container("j-remote", GRACEFUL))

    def ready() -> bool:
        replica = app.launcher.find("j-remote", 0)
        return replica is not None and "ready" in replica.log.tail(0)[0]

    await eventually(ready, 30.0, "j-remote to start")
    assert exists("pollux-j-remote-1-0")
    await store.txn([Delete(store.keys.allocation("j-remote"))])
    assert (await exited(store, "j-remote")).exit_code == 143
    replica = app.launcher.find("j-remote", 0)
    assert replica is not None
    assert "checkpointing on SIGTERM" in replica.log.tail(0)[0]
    assert not exists("pollux-j-remote-1-0")
    await submit(store, "j-remote-3", container("j-remote-3", "import sys; sys.exit(3)"))
    assert (await exited(store, "j-remote-3")).exit_code == 3


async def test_a_restarted_launcher_and_the_watchdog_remove_the_nodes_containers(
    make_app: MakeApp, store: Store, etcd: EtcdServer, root: str
) -> None:
    assert PODMAN is not None
    token = fence_token(etcd.endpoint, root, "n1")

    def leftover(name: str, fence: str) -> None:
        # No POLLUX_NODE_FENCE in its environment: only its label can find it.
        _podman("run", "-d", *FLAGS, "--network=host", "--name", name, "--label",
                f"{FENCE_LABEL}={fence}", IMAGE, "sleep", "300")  # fmt: skip

    leftover("pollux-j-old-1-0", token)
    leftover("pollux-other-node", "n2@0123456789abcdef")
    try:
        await make_app()
        assert not exists("pollux-j-old-1-0")
        assert exists("pollux-other-node")  # another node's (or cluster's) is not touched
        # The watchdog's sweep (its lease deadline passed) removes them the same way.
        leftover("pollux-j-old-2-0", token)
        assert killer(("podman", PODMAN))(token) == []  # no process carries the token
        assert not exists("pollux-j-old-2-0")
    finally:
        _podman("rm", "--force", "--time", "0", "--ignore", "pollux-other-node", check=False)


async def test_a_job_with_an_image_is_refused_where_it_cannot_run(
    make_app: MakeApp, store: Store, shared: Path
) -> None:
    process = await make_app(runtime="process")
    await submit(store, "j-img", container("j-img", "print(1)"))
    status = await exited(store, "j-img")
    assert status.exit_code == 127
    replica = process.launcher.find("j-img", 0)
    assert replica is not None
    assert replica.log.tail(0)[0] == [
        f"pollux-launcher: cannot start the replica: job j-img names image {IMAGE} but "
        "launcher n1 has runtime = process: set runtime = podman or docker on the launcher, "
        "or submit without --image"
    ]
    assert not (shared / "checkpoints" / "j-img").exists()
    await make_app.stop(process)
    # A podman launcher refuses a mount outside container_mounts_allowed.
    podman = await make_app()
    etc = pb.Mount(host_path="/etc", container_path="/host-etc", read_only=True)
    await submit(store, "j-etc", container("j-etc", "print(1)", mounts=[etc]))
    assert (await exited(store, "j-etc")).exit_code == 127
    replica = podman.launcher.find("j-etc", 0)
    assert replica is not None
    assert replica.log.tail(0)[0] == [
        "pollux-launcher: cannot start the replica: mount of /etc is not allowed on n1 "
        f"(container_mounts_allowed: {shared / 'data'}): have the operator allow it or drop "
        "the mount"
    ]
