"""Users try to jam a secure local cluster: open streams and submits, or stalled log follows.

Default mode: in a secure `LocalCluster`, `mallory` opens `--streams` streams at the leader (3/4
WatchJobs, 1/4 StreamLogs) and sends `--submits` submits, 64 at a time, while the schedulers'
memory, the leader and `victor`'s `ls` latency are sampled; then victor's job must be placed
within two rounds. Targets: RSS peak < 400 MB, 0 leader changes, `ls` <= 1 s.
`--stalled-follows`: `--users` users each run a job writing `--write-mb-s` MB/s and open
`--follows` StreamLogs follows of it that read one message and stall for `--hold-s` s
(initial reader window `--reader-window-kib`, 0: gRPC's growing one); per-user caps admit them,
the replica's stays 1024. Targets: leader RSS growth <= STALLED_FOLLOW_MB per open stream
(architecture.md §9), 0 leader changes, admin `ls` <= 0.1 s while held. Exit 1 on a miss.

    python benchmarks/abuse.py [--streams 800] [--submits 3000] [--raise-stream-caps]
    python benchmarks/abuse.py --stalled-follows [--users 3] [--follows 400] [--write-mb-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from pollux.service.local_cluster import LocalCluster
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import admin_service_pb2_grpc as apb_grpc
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb

TENANT = ""
"""Both users are in the default tenant (the same tenant: its caps are shared)."""
LS_PAGE = 21
"""What `pollux-cli ls` asks for on a 24-line terminal (a screen and one more)."""
CONCURRENT_SUBMITS = 64
STALLED_FOLLOW_MB = 0.25
"""The leader's memory budget per stalled follow stream (docs/architecture.md §9)."""
ADMIN_LS_S = 0.1
"""The admin's `ls` target while stalled follows are held."""
STREAMS_PER_CHANNEL = 100
"""Streams a client puts on one HTTP/2 connection (a connection takes 100 at a time)."""
PLACED = {pb.JOB_STATE_ALLOCATED, pb.JOB_STATE_RUNNING, pb.JOB_STATE_SUCCEEDED}


def _spec(name: str, seconds: float) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        command=["python", "-c", f"import time; time.sleep({seconds})"],
        batch=pb.BatchLimits(initial_batch_size=8),
    )


def _channel(address: str, ca: bytes, token: str, window_kib: int = 0) -> grpc.aio.Channel:
    """A channel of its own; `window_kib`: a fixed HTTP/2 stream window (0: gRPC's, growing)."""
    credentials = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(ca), grpc.access_token_call_credentials(token)
    )
    options: list[tuple[str, int]] = [("grpc.use_local_subchannel_pool", 1)]
    if window_kib:
        options += [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window_kib * 1024)]
    return grpc.aio.secure_channel(address, credentials, options=options)


# -- mallory, in her own process ---------------------------------------------------------------


@dataclass
class Attack:
    """What mallory's process reports back."""

    streams_open: int = 0
    streams_refused: Counter[str] = field(default_factory=Counter)
    submits_accepted: int = 0
    submits_refused: Counter[str] = field(default_factory=Counter)
    submit_seconds: float = 0.0
    refusal: str = ""


async def _attack(
    address: str, ca: bytes, token: str, plan: tuple[int, int, float], done: Any, close: Any
) -> Attack:
    """Mallory's streams, then her submits; `done` once submitted, streams kept to `close`."""
    streams, submits, job_s = plan
    out = Attack()
    # One channel per 100 streams: a channel's HTTP/2 connection takes 100 streams at a time.
    channels = [_channel(address, ca, token) for _ in range(max(1, streams // 100 + 1))]
    stubs = [spb_grpc.SchedulerServiceStub(c) for c in channels]
    anchor = await stubs[0].SubmitJob(
        spb.SubmitJobRequest(spec=_spec("mallory-anchor", 3600), request_id=uuid.uuid4().hex)
    )
    running = {pb.JOB_STATE_RUNNING}  # its replica runs: its log can be followed
    while (await stubs[0].GetJob(spb.GetJobRequest(job_id=anchor.job.id))).job.state not in running:
        await asyncio.sleep(0.2)
    calls: list[Any] = []

    async def open_one(i: int) -> None:
        stub = stubs[i % len(stubs)]
        if i % 4 == 3:
            call = stub.StreamLogs(lpb.StreamLogsRequest(job_id=anchor.job.id, follow=True))
        else:
            call = stub.WatchJobs(spb.WatchJobsRequest())
        calls.append(call)
        try:
            await call.read()
            out.streams_open += 1
        except grpc.aio.AioRpcError as error:
            out.streams_refused[error.code().name] += 1
            out.refusal = out.refusal or str(error.details())

    await asyncio.gather(*(open_one(i) for i in range(streams)))
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(submits):
        queue.put_nowait(i)

    async def submitter() -> None:
        stub = stubs[0]
        while not queue.empty():
            queue.get_nowait()
            request = spb.SubmitJobRequest(
                spec=_spec("mallory-flood", job_s), request_id=uuid.uuid4().hex
            )
            try:
                await stub.SubmitJob(request, timeout=30)
                out.submits_accepted += 1
            except grpc.aio.AioRpcError as error:
                out.submits_refused[error.code().name] += 1

    started = time.perf_counter()
    await asyncio.gather(*(submitter() for _ in range(CONCURRENT_SUBMITS)))
    out.submit_seconds = time.perf_counter() - started
    done.set()  # victor submits now; mallory's streams stay open until told to close
    while not close.is_set():
        await asyncio.sleep(0.2)
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    return out


def _mallory(
    address: str,
    ca: bytes,
    token: str,
    plan: tuple[int, int, float],
    done: Any,
    close: Any,
    pipe: Any,
) -> None:
    """Mallory's process: the attack, its report sent through `pipe`."""
    pipe.send(asyncio.run(_attack(address, ca, token, plan, done, close)))


# -- the cluster and the measurements ----------------------------------------------------------


def rss_mb(pid: int) -> float:
    """Resident memory of a process, MB (from /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    """CPU seconds a process has used, user and system (from /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """Samples the schedulers' RSS every 0.1 s in a thread."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError):
                    self.peak[name] = max(self.peak[name], rss_mb(pid))
            self._stop.wait(0.1)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Watch:
    """Leader ids and victor's ls latencies seen while mallory attacks."""

    leaders: list[str] = field(default_factory=list)
    ls_s: list[float] = field(default_factory=list)
    ls_errors: Counter[str] = field(default_factory=Counter)
    status_errors: int = 0


async def _watch(
    addresses: list[str], ca: bytes, admin: str, victor: str, stop: asyncio.Event
) -> Watch:
    out = Watch()
    admins = [spb_grpc.SchedulerServiceStub(_channel(a, ca, admin)) for a in addresses]
    mine = [spb_grpc.SchedulerServiceStub(_channel(a, ca, victor)) for a in addresses]
    turn = 0
    while not stop.is_set():
        turn += 1
        try:
            status = await admins[turn % len(admins)].ClusterStatus(
                spb.ClusterStatusRequest(), timeout=5
            )
            if not out.leaders or out.leaders[-1] != status.leader_id:
                out.leaders.append(status.leader_id)
        except grpc.aio.AioRpcError:
            out.status_errors += 1
        started = time.perf_counter()
        try:
            await mine[turn % len(mine)].ListJobs(
                spb.ListJobsRequest(page_size=LS_PAGE, newest_first=True), timeout=30
            )
            out.ls_s.append(time.perf_counter() - started)
        except grpc.aio.AioRpcError as error:
            out.ls_errors[error.code().name] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return out


@dataclass
class Placed:
    """Victor's job: how long it waited, counted three ways, and where it queued.

    Attributes:
        rounds: Rounds that saw it waiting, the one that placed it included: the round of
            its allocation less the first round seen recording it (Explain's), plus one;
            placed before a poll saw such a round, the first round after the submit counts
            as that (an upper bound). -1: not placed within the deadline.
        since_submit: Rounds the leader ran from just before the submit until it was seen
            placed (an upper bound: a round under way at the submit, and rounds run while
            the placement was being read, count too).
        seconds: From the submit until it was seen placed.
        position: Its place in the queue right after the submit (Explain's).
        pending: The queue's length then.
    """

    rounds: int
    since_submit: int
    seconds: float
    position: int
    pending: int


async def _victims_job(address: str, ca: bytes, admin: str, victor: str) -> Placed:
    """Victor's submit: rounds and seconds until his job holds a GPU, its queue position."""
    jobs = spb_grpc.SchedulerServiceStub(_channel(address, ca, victor))
    status = spb_grpc.SchedulerServiceStub(_channel(address, ca, admin))
    first = (await status.ClusterStatus(spb.ClusterStatusRequest(), timeout=10)).last_round
    started = time.perf_counter()
    reply = await jobs.SubmitJob(
        spb.SubmitJobRequest(spec=_spec("victor-train", 5), request_id=uuid.uuid4().hex),
        timeout=10,
    )
    queued = await jobs.Explain(spb.ExplainRequest(job_id=reply.job.id), timeout=10)
    position, pending = queued.queue_position, queued.pending_jobs
    seen = queued.round.round if queued.HasField("round") else 0
    deadline = started + 600
    while time.perf_counter() < deadline:
        job = (await jobs.GetJob(spb.GetJobRequest(job_id=reply.job.id), timeout=10)).job
        if job.state in PLACED:
            seconds = time.perf_counter() - started
            now = (await status.ClusterStatus(spb.ClusterStatusRequest(), timeout=10)).last_round
            rounds = job.allocation.round - (seen or first + 1) + 1
            return Placed(rounds, now - first, seconds, position, pending)
        if not seen:  # the first round that records his job: Explain names it
            explained = await jobs.Explain(spb.ExplainRequest(job_id=reply.job.id), timeout=10)
            seen = explained.round.round if explained.HasField("round") else 0
        await asyncio.sleep(0.1)
    return Placed(-1, -1, time.perf_counter() - started, position, pending)


async def _tokens(
    address: str, ca: bytes, admin: str, users: Sequence[str] = ("mallory", "victor")
) -> dict[str, str]:
    stub = apb_grpc.AdminServiceStub(_channel(address, ca, admin))
    made = {}
    for user in users:
        reply = await stub.CreateToken(apb.CreateTokenRequest(user=user, tenant=TENANT), timeout=10)
        made[user] = reply.secret
    return made


async def _leader_address(addresses: list[str], ca: bytes, admin: str) -> str:
    stub = spb_grpc.SchedulerServiceStub(_channel(addresses[0], ca, admin))
    while True:
        status = await stub.ClusterStatus(spb.ClusterStatusRequest(), timeout=10)
        if status.leader_address:
            return str(status.leader_address)
        await asyncio.sleep(0.2)


def run(args: argparse.Namespace, workdir: Path) -> int:
    if args.raise_stream_caps:
        os.environ["POLLUX_SCHEDULER_LIMITS__STREAMS_PER_PRINCIPAL"] = str(args.streams + 10)
        os.environ["POLLUX_SCHEDULER_LIMITS__STREAMS_PER_REPLICA"] = str(args.streams + 100)
    cluster = LocalCluster(
        workdir,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        schedulers=2,
        agents=1,
        interval_s=args.interval,
        secure=True,
        dashboard=False,
    )
    with cluster:
        assert cluster.admin_token is not None
        assert cluster.ca_file is not None
        ca, admin = cluster.ca_file.read_bytes(), cluster.admin_token
        addresses = cluster.scheduler_addresses
        tokens = asyncio.run(_tokens(addresses[0], ca, admin))
        leader = asyncio.run(_leader_address(addresses, ca, admin))
        pids = {n: p.process.pid for n, p in cluster.procs.items() if n.startswith("scheduler")}
        before = {n: rss_mb(pid) for n, pid in pids.items()}
        context = multiprocessing.get_context("spawn")
        done, close = context.Event(), context.Event()
        receive, send = context.Pipe(duplex=False)
        plan = (args.streams, args.submits, args.job_s)
        mallory = context.Process(
            target=_mallory, args=(leader, ca, tokens["mallory"], plan, done, close, send)
        )

        async def measure() -> tuple[Watch, Placed]:
            stop = asyncio.Event()
            watching = asyncio.create_task(_watch(addresses, ca, admin, tokens["victor"], stop))
            while not done.is_set():
                await asyncio.sleep(0.2)
            placed = await _victims_job(leader, ca, admin, tokens["victor"])
            close.set()
            stop.set()
            return await watching, placed

        started = time.perf_counter()
        with Sampler(pids) as sampler:
            mallory.start()
            watch, placed = asyncio.run(measure())
            attack: Attack = receive.recv()
            mallory.join(60)
        elapsed = time.perf_counter() - started
    changes = max(0, len([x for x in watch.leaders if x]) - 1)
    peak = max(sampler.peak.values())
    ls_max = max(watch.ls_s) if watch.ls_s else float("nan")
    caps = "raised" if args.raise_stream_caps else "default"
    print(
        f"cluster: 2 schedulers, {args.nodes} nodes x {args.gpus} slots, "
        f"interval {args.interval} s; stream caps {caps}; {elapsed:.0f} s"
    )
    print(
        f"mallory streams: {attack.streams_open} open, refused {dict(attack.streams_refused)}"
        + (f" ({attack.refusal[:120]})" if attack.refusal else "")
    )
    print(
        f"mallory submits: {attack.submits_accepted} accepted, refused "
        f"{dict(attack.submits_refused)} in {attack.submit_seconds:.1f} s"
    )
    for name in sorted(pids):
        print(f"{name} RSS: {before[name]:.0f} MB before, peak {sampler.peak[name]:.0f} MB")
    print(f"scheduler RSS peak: {peak:.0f} MB (target < 400)")
    print(f"leader changes: {changes} (target 0; ClusterStatus errors {watch.status_errors})")
    ls_median = statistics.median(watch.ls_s) if watch.ls_s else float("nan")
    print(
        f"victor's ls: median {ls_median:.3f} s, "
        f"max {ls_max:.3f} s over {len(watch.ls_s)} (target <= 1 s; errors {dict(watch.ls_errors)})"
    )
    within = 0 <= placed.rounds <= 2
    print(f"victor's job queued at position {placed.position} of {placed.pending} pending jobs")
    print(
        f"victor's job placed by the {_ordinal(placed.rounds)} round that saw it, "
        f"{placed.seconds:.1f} s after its submit ({placed.since_submit} rounds ran meanwhile, "
        f"placement rounds included; target within two rounds: {'yes' if within else 'no'})"
    )
    ok = peak < 400 and changes == 0 and ls_max <= 1.0 and within
    return 0 if ok else 1


# -- stalled log followers (--stalled-follows) -------------------------------------------------

WRITER = """
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
line = "x" * 999 + "\\n"
tick = 0.05
chunk = line * max(1, round(rate * tick / len(line)))
start = due = time.monotonic()
while due < start + seconds:
    sys.stdout.write(chunk)
    sys.stdout.flush()
    due += tick
    time.sleep(max(0.0, due - time.monotonic()))
"""
"""A job's command: lines of 1,000 bytes at `rate` bytes/s for `seconds` s."""


def _writer_spec(name: str, rate: float, seconds: float) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        command=["python", "-c", WRITER, str(rate), str(seconds)],
        batch=pb.BatchLimits(initial_batch_size=8),
        max_replicas=1,
    )


@dataclass
class Follows:
    """What one user's process reports back."""

    user: str
    opened: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    refusal: str = ""
    open_s: float = 0.0
    rss_mb: float = 0.0
    """The process's RSS when told to close: what its stalled streams took in."""


async def _follow(
    address: str,
    ca: bytes,
    user: tuple[str, str],
    plan: tuple[str, int, int],
    opened: Any,
    close: Any,
) -> Follows:
    """`count` follows of `job_id`, each read once, held until `close`; `opened` once open.

    `plan`: (job_id, count, the readers' HTTP/2 window in KiB: 0 for gRPC's own).
    """
    job_id, count, window_kib = plan
    out = Follows(user[0])
    channels = [
        _channel(address, ca, user[1], window_kib)
        for _ in range(max(1, -(-count // STREAMS_PER_CHANNEL)))
    ]
    stubs = [spb_grpc.SchedulerServiceStub(c) for c in channels]
    calls: list[Any] = []

    async def open_one(i: int) -> None:
        call = stubs[i % len(stubs)].StreamLogs(lpb.StreamLogsRequest(job_id=job_id, follow=True))
        calls.append(call)
        try:
            await call.read()  # the first message; never another
            out.opened += 1
        except grpc.aio.AioRpcError as error:
            out.refused[error.code().name] += 1
            out.refusal = out.refusal or str(error.details())

    started = time.perf_counter()
    await asyncio.gather(*(open_one(i) for i in range(count)))
    out.open_s = time.perf_counter() - started
    opened.set()
    while not close.is_set():
        await asyncio.sleep(0.2)
    out.rss_mb = rss_mb(os.getpid())
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    return out


def _follower(
    address: str,
    ca: bytes,
    user: tuple[str, str],
    plan: tuple[str, int, int],
    opened: Any,
    close: Any,
    pipe: Any,
) -> None:
    """A user's process: their follows, the report sent through `pipe`."""
    pipe.send(asyncio.run(_follow(address, ca, user, plan, opened, close)))


@dataclass
class AdminWatch:
    """The leader ids seen and the admin's `ls` latencies, by phase ("opening", "held")."""

    leaders: list[str] = field(default_factory=list)
    ls_s: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)


async def _admin_watch(
    addresses: list[str], leader: str, ca: bytes, admin: str, phase: list[str], stop: Any
) -> AdminWatch:
    """ClusterStatus of each replica in turn, and the admin's `ls` at the leader, 4 a second."""
    out = AdminWatch()
    statuses = [spb_grpc.SchedulerServiceStub(_channel(a, ca, admin)) for a in addresses]
    jobs = spb_grpc.SchedulerServiceStub(_channel(leader, ca, admin))
    turn = 0
    while not stop.is_set():
        turn += 1
        try:
            status = await statuses[turn % len(statuses)].ClusterStatus(
                spb.ClusterStatusRequest(), timeout=5
            )
            if not out.leaders or out.leaders[-1] != status.leader_id:
                out.leaders.append(status.leader_id)
        except grpc.aio.AioRpcError as error:
            out.errors[f"ClusterStatus {error.code().name}"] += 1
        now = phase[0]
        started = time.perf_counter()
        try:
            await jobs.ListJobs(
                spb.ListJobsRequest(page_size=LS_PAGE, newest_first=True), timeout=30
            )
            out.ls_s.setdefault(now, []).append(time.perf_counter() - started)
        except grpc.aio.AioRpcError as error:
            out.errors[f"ListJobs {error.code().name}"] += 1
        await asyncio.sleep(0.25)
    return out


async def _writers(
    address: str, ca: bytes, tokens: dict[str, str], rate: float, seconds: float
) -> dict[str, str]:
    """Each user's writing job, submitted and running: {user: job id}."""
    jobs = {}
    for user, token in tokens.items():
        stub = spb_grpc.SchedulerServiceStub(_channel(address, ca, token))
        reply = await stub.SubmitJob(
            spb.SubmitJobRequest(
                spec=_writer_spec(f"{user}-writer", rate, seconds), request_id=uuid.uuid4().hex
            ),
            timeout=10,
        )
        jobs[user] = reply.job.id
    for user, job_id in jobs.items():
        stub = spb_grpc.SchedulerServiceStub(_channel(address, ca, tokens[user]))
        deadline = time.monotonic() + 120
        while True:
            job = (await stub.GetJob(spb.GetJobRequest(job_id=job_id), timeout=10)).job
            if job.state == pb.JOB_STATE_RUNNING:
                break
            if job.state not in (pb.JOB_STATE_PENDING, pb.JOB_STATE_ALLOCATED):
                raise RuntimeError(f"{user}'s writer is {pb.JobState.Name(job.state)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{user}'s writer did not start within 120 s")
            await asyncio.sleep(0.2)
    await asyncio.sleep(3.0)  # its launcher's ring fills with lines a follower is sent first
    return jobs


@dataclass
class FollowRun:
    """One `--stalled-follows` run's figures."""

    leader: str
    """The leader's process name."""
    before: dict[str, float]
    """RSS of the schedulers and launchers (MB) with the writers running, before the follows."""
    peak: dict[str, float]
    held: dict[str, float]
    """RSS at the end of the hold."""
    cpu: dict[str, float]
    """CPU seconds used during the hold."""
    watch: AdminWatch
    opening_s: float
    reports: list[Follows]


def _followers(
    context: Any,
    leader: str,
    ca: bytes,
    tokens: dict[str, str],
    jobs: dict[str, str],
    args: argparse.Namespace,
) -> tuple[Any, list[tuple[Any, Any, Any]]]:
    """(the close event, [(process, opened event, report pipe)]): one process per user."""
    close = context.Event()
    followers = []
    for user, token in tokens.items():
        opened = context.Event()
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_follower,
            args=(
                leader,
                ca,
                (user, token),
                (jobs[user], args.follows, args.reader_window_kib),
                opened,
                close,
                send,
            ),
        )
        followers.append((process, opened, receive))
    return close, followers


def _measure_follows(args: argparse.Namespace, cluster: LocalCluster) -> FollowRun:
    """The writers, then the users' follows held while the leader is sampled and watched."""
    assert cluster.admin_token is not None
    assert cluster.ca_file is not None
    ca, admin = cluster.ca_file.read_bytes(), cluster.admin_token
    addresses = cluster.scheduler_addresses
    users = [f"follower-{i}" for i in range(args.users)]
    tokens = asyncio.run(_tokens(addresses[0], ca, admin, users))
    leader = asyncio.run(_leader_address(addresses, ca, admin))
    job_s = args.hold_s + 600  # the writers outlive the measurement
    jobs = asyncio.run(_writers(leader, ca, tokens, args.write_mb_s * 1e6, job_s))
    leader_name = next(n for n, p in cluster.procs.items() if p.address == leader)
    pids = {
        n: p.process.pid for n, p in cluster.procs.items() if n.startswith(("scheduler", "node"))
    }
    before = {n: rss_mb(pid) for n, pid in pids.items()}
    close, followers = _followers(
        multiprocessing.get_context("spawn"), leader, ca, tokens, jobs, args
    )

    async def measure() -> tuple[AdminWatch, float, dict[str, float], dict[str, float]]:
        phase = ["opening"]
        stop = asyncio.Event()
        watching = asyncio.create_task(_admin_watch(addresses, leader, ca, admin, phase, stop))
        started = time.perf_counter()
        for process, _, _ in followers:
            process.start()
        while not all(opened.is_set() for _, opened, _ in followers):
            await asyncio.sleep(0.2)
        opening = time.perf_counter() - started
        phase[0] = "held"
        cpu = {n: cpu_s(pid) for n, pid in pids.items()}
        await asyncio.sleep(args.hold_s)
        cpu = {n: cpu_s(pid) - cpu[n] for n, pid in pids.items()}
        held = {n: rss_mb(pid) for n, pid in pids.items()}
        stop.set()
        return await watching, opening, held, cpu

    with Sampler(pids) as sampler:
        watch, opening, held, cpu = asyncio.run(measure())
        close.set()
        reports: list[Follows] = [receive.recv() for _, _, receive in followers]
        for process, _, _ in followers:
            process.join(60)
    return FollowRun(leader_name, before, sampler.peak, held, cpu, watch, opening, reports)


def run_follows(args: argparse.Namespace, workdir: Path) -> int:
    """The `--stalled-follows` measurement (see the module doc)."""
    os.environ["POLLUX_SCHEDULER_LIMITS__STREAMS_PER_PRINCIPAL"] = str(args.follows + 10)
    if args.raise_stream_caps:
        total = args.users * args.follows + 100
        os.environ["POLLUX_SCHEDULER_LIMITS__STREAMS_PER_REPLICA"] = str(total)
    cluster = LocalCluster(
        workdir,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        schedulers=2,
        agents=1,
        interval_s=args.interval,
        secure=True,
        dashboard=False,
    )
    started = time.perf_counter()
    with cluster:
        out = _measure_follows(args, cluster)
    elapsed = time.perf_counter() - started
    opened = sum(r.opened for r in out.reports)
    changes = max(0, len([x for x in out.watch.leaders if x]) - 1)
    grown = out.peak[out.leader] - out.before[out.leader]
    budget = opened * STALLED_FOLLOW_MB
    caps = "raised" if args.raise_stream_caps else "default (1024)"
    print(
        f"cluster: 2 schedulers, {args.nodes} nodes x {args.gpus} slots; "
        f"{args.users} users x {args.follows} stalled follows of a job of theirs writing "
        f"{args.write_mb_s:g} MB/s; readers' window "
        f"{f'{args.reader_window_kib} KiB' if args.reader_window_kib else 'gRPC default'}; "
        f"streams_per_principal {args.follows + 10}, "
        f"streams_per_replica {caps}; {elapsed:.0f} s"
    )
    for r in out.reports:
        refusal = f" ({r.refusal[:120]})" if r.refusal else ""
        print(
            f"{r.user}: {r.opened} open in {r.open_s:.1f} s, refused {dict(r.refused)}{refusal}; "
            f"their process's RSS {r.rss_mb:.0f} MB"
        )
    for name in sorted(out.before):
        role = " (leader)" if name == out.leader else ""
        print(
            f"{name}{role} RSS: {out.before[name]:.0f} MB before, peak {out.peak[name]:.0f} MB, "
            f"{out.held[name]:.0f} MB after {args.hold_s:g} s held; CPU while held "
            f"{out.cpu[name] / args.hold_s:.0%} of a core"
        )
    print(
        f"leader RSS growth: {grown:.0f} MB for {opened} stalled follows, "
        f"{grown / max(1, opened) * 1024:.0f} KiB each "
        f"(budget {STALLED_FOLLOW_MB * 1024:.0f} KiB each: {budget:.0f} MB)"
    )
    print(f"leader changes: {changes} (target 0; errors {dict(out.watch.errors)})")
    opening_ls = out.watch.ls_s.get("opening", [])
    if opening_ls:
        print(
            f"admin's ls while the follows open ({out.opening_s:.0f} s): median "
            f"{statistics.median(opening_ls):.3f} s, max {max(opening_ls):.3f} s"
        )
    held_ls = out.watch.ls_s.get("held", [])
    if held_ls:
        print(
            f"admin's ls while they are held: median {statistics.median(held_ls):.3f} s, "
            f"max {max(held_ls):.3f} s over {len(held_ls)} (target <= {ADMIN_LS_S} s)"
        )
    ok = opened > 0 and grown <= budget and changes == 0 and held_ls != []
    return 0 if ok and max(held_ls) <= ADMIN_LS_S else 1


def _ordinal(n: int) -> str:
    if n < 0:
        return "none (not placed)"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=800)
    parser.add_argument("--submits", type=int, default=3000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=2, help="CPU slots per node")
    parser.add_argument("--interval", type=float, default=5.0, help="scheduling interval, s")
    parser.add_argument(
        "--job-s", type=float, default=3.0, help="seconds each of mallory's jobs runs"
    )
    parser.add_argument("--raise-stream-caps", action="store_true")
    parser.add_argument(
        "--stalled-follows", action="store_true", help="measure stalled log followers instead"
    )
    parser.add_argument("--users", type=int, default=3, help="--stalled-follows: users")
    parser.add_argument(
        "--follows", type=int, default=400, help="--stalled-follows: follows per user"
    )
    parser.add_argument(
        "--write-mb-s", type=float, default=2.0, help="--stalled-follows: each job's log, MB/s"
    )
    parser.add_argument(
        "--hold-s", type=float, default=30.0, help="--stalled-follows: seconds held open"
    )
    parser.add_argument(
        "--reader-window-kib",
        type=int,
        default=64,
        help="--stalled-follows: the readers' fixed HTTP/2 stream window (gRPC's initial one); "
        "0: gRPC's default, grown by bandwidth probing to megabytes, which the leader fills "
        "(relays) before the streams stall",
    )
    parser.add_argument(
        "--workdir", type=Path, help="the cluster's directory, kept (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    measure = run_follows if args.stalled_follows else run
    if args.workdir is not None:  # kept, with the cluster's logs
        return measure(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="pollux-abuse-") as workdir:
        return measure(args, Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
