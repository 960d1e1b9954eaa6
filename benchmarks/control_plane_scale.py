"""Control-plane scale: rounds, reads, memory and etcd size with many jobs and nodes.

For each scenario (nodes × active jobs × finished jobs: every combination, or those `--only
N:A:F,...` names), on a fresh local etcd and one real scheduler process: register `nodes` nodes
of 4 GPUs under leases; write `finished` CANCELLED records ended an hour ago straight into etcd
(what 30 days of retention keeps); submit `active` jobs through the API; once a round has seen
them all, measure `--rounds` rounds from the scheduler's `round_committed` lines (p50, p99,
each phase's p50); time ClusterStatus and the first `pollux-cli ls` page and read the peak RSS;
cancel every active job at once and measure the longest gap between rounds; and measure etcd's
database after compaction, now and in the steady state once the decision history is full (the
days to etcd's 2 GiB quota).

    python benchmarks/control_plane_scale.py [--nodes 16,500] [--active 160,10000]
        [--finished 0,100000] [--rounds 10] [--interval 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc

from pollux.service.etcd.maintenance import EtcdMaintenance
from pollux.service.keys import Kind
from pollux.service.local_cluster import LocalCluster
from pollux.service.store import MAX_TXN_BYTES, Put, Store
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb

GPUS_PER_NODE = 4
ACTIVE_STATES = [
    pb.JOB_STATE_PENDING,
    pb.JOB_STATE_ALLOCATED,
    pb.JOB_STATE_RUNNING,
    pb.JOB_STATE_RESCALING,
]
QUOTA_BYTES = 2 * 1024**3
DECISION_HISTORY = 1000
SPEC = pb.JobSpec(
    name="scale",
    command=["python", "train.py"],
    batch=pb.BatchLimits(initial_batch_size=128, max_batch_size=1024),
)


async def register_nodes(store: Store, count: int) -> None:
    """Register `count` nodes of 4 GPUs under one lease, as launchers do."""
    lease = await store.grant_lease(3600)
    for i in range(count):
        node = pb.Node(name=f"node-{i:04d}", address=f"127.0.0.1:{10000 + i}", gpus=GPUS_PER_NODE)
        await store.register_node(node, lease=lease)


async def seed_finished(store: Store, count: int) -> None:
    """Write `count` CANCELLED job records that ended an hour ago, in large transactions."""
    ended = time.time() - 3600
    ops: list[Put] = []
    size = 0
    for i in range(count):
        job = pb.Job(id=f"j-done{i:07d}", request_id=uuid.uuid4().hex, spec=SPEC)
        job.state = pb.JOB_STATE_CANCELLED
        job.create_time.FromNanoseconds(int((ended - 600) * 1e9))
        job.finish_time.FromNanoseconds(int(ended * 1e9))
        job.history.add(state=pb.JOB_STATE_PENDING, reason="submitted")
        job.history.add(state=pb.JOB_STATE_CANCELLED, reason="cancelled by user")
        value = job.SerializeToString()
        if ops and (len(ops) >= 100 or size + len(value) > MAX_TXN_BYTES // 2):
            await store.txn(ops)
            ops, size = [], 0
        ops.append(Put(store.keys.job(job.id), value))
        size += len(value) + 64
    if ops:
        await store.txn(ops)


async def cancel_all(address: str) -> tuple[float, int]:
    """Cancel every active job with 64 calls in flight; (seconds, jobs cancelled)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = spb_grpc.SchedulerServiceStub(channel)
        ids: list[str] = []
        token = ""
        while True:
            page = await stub.ListJobs(
                spb.ListJobsRequest(page_size=1000, page_token=token, states=ACTIVE_STATES),
                timeout=60,
            )
            ids.extend(job.id for job in page.jobs)
            token = page.next_page_token
            if not token:
                break
        queue = iter(ids)
        started = time.perf_counter()

        async def worker() -> None:
            for job_id in queue:
                await stub.CancelJob(spb.CancelJobRequest(job_id=job_id), timeout=60)

        await asyncio.gather(*(worker() for _ in range(64)))
    return time.perf_counter() - started, len(ids)


async def live_bytes(store: Store) -> int:
    """Bytes etcd holds for live keys: compacted to now, then its in-use size."""
    maintenance = EtcdMaintenance(store)
    member = await maintenance.member_status()
    await maintenance.compact(member.revision)
    return (await maintenance.member_status()).db_in_use


async def live_growth(store: Store, log: Path, count: int) -> float:
    """KiB etcd's live data grew by over `count` rounds, once the decision history is full.

    The scheduler keeps the last `DECISION_HISTORY` decision records, so etcd grows until that
    many rounds have run; from then on every round's record replaces the oldest one.
    """

    async def until(total: int) -> None:
        while len(rounds(log, 0.0)) < total:
            await asyncio.sleep(1.0)

    start = len(rounds(log, 0.0))
    await until(start + DECISION_HISTORY)
    before = await live_bytes(store)
    await until(start + DECISION_HISTORY + count)
    return round((await live_bytes(store) - before) / 1024, 1)


def longest_gap(records: list[dict[str, Any]]) -> float:
    """The longest time between consecutive rounds' log lines, seconds."""
    stamps = sorted(_stamp(r) for r in records)
    return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)


def _stamp(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")).timestamp()


async def submit(address: str, count: int) -> float:
    """Submit `count` jobs through the API with 64 calls in flight; seconds it took."""
    started = time.perf_counter()
    queue = iter(range(count))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = spb_grpc.SchedulerServiceStub(channel)

        async def worker() -> None:
            for _ in queue:
                request = spb.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex)
                await stub.SubmitJob(request, timeout=60)

        await asyncio.gather(*(worker() for _ in range(64)))
    return time.perf_counter() - started


def rounds(log: Path, after: float) -> list[dict[str, Any]]:
    """The scheduler's `round_committed` lines logged after `after` (epoch seconds)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if '"round_committed"' not in line:
            continue
        record = json.loads(line)
        if _stamp(record) >= after:
            found.append(record)
    return found


async def timed(call: Callable[[], Awaitable[object]], repeat: int = 10) -> float:
    """Median seconds of `repeat` awaits of `call()`."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident set, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def scenario(
    nodes: int, active: int, finished: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One scenario on a fresh etcd and scheduler; its figures."""
    workdir = Path(tempfile.mkdtemp(prefix="pollux-scale-"))
    cluster = LocalCluster(  # plaintext: raw stubs measure rounds, not TLS handshakes
        workdir, nodes=0, schedulers=0, agents=0, interval_s=args.interval, secure=False
    ).start()
    store = await Store.connect(cluster.etcd_endpoint)
    try:
        await register_nodes(store, nodes)
        await seed_finished(store, finished)
        scheduler = cluster.start_scheduler("scheduler-0")
        submit_s = await submit(scheduler.address, active)
        # Measure only rounds that saw every job (the first one after the submits).
        ready = time.time() + args.interval + 1
        await asyncio.sleep(args.interval * (args.rounds + 2) + 2)
        measured = [r for r in rounds(scheduler.log, ready) if r["jobs"] >= min(active, 1)]
        measured = measured[-args.rounds :]
        totals = [(r["snapshot_ms"] + r["policy_ms"] + r["commit_ms"]) / 1e3 for r in measured]
        async with grpc.aio.insecure_channel(scheduler.address) as channel:
            stub = spb_grpc.SchedulerServiceStub(channel)
            status_s = await timed(lambda: stub.ClusterStatus(spb.ClusterStatusRequest()))
            ls_s = await timed(lambda: stub.ListJobs(spb.ListJobsRequest(page_size=100)))
        rss = peak_rss_mib(scheduler.process.pid)
        growth = None
        if args.flat_rounds:
            growth = await live_growth(store, scheduler.log, args.flat_rounds)
        # A burst: every active job cancelled at once; rounds must keep coming meanwhile.
        burst_from = time.time()
        cancel_s, cancelled = await cancel_all(scheduler.address)
        await asyncio.sleep(args.interval * 3 + 2)
        burst = rounds(scheduler.log, burst_from)
        live = await live_bytes(store)
        decisions = await store.latest_decisions(1)
        decision_bytes = decisions[0].ByteSize() if decisions else 0
        kept = len(await store.list_keys(store.keys.prefix(Kind.DECISIONS)))
        steady = live + max(0, DECISION_HISTORY - kept) * decision_bytes
        return {
            "nodes": nodes,
            "gpus": nodes * GPUS_PER_NODE,
            "active": active,
            "finished": finished,
            "submit_s": round(submit_s, 1),
            "rounds": len(totals),
            "round_p50_s": round(pct(totals, 0.5), 3) if totals else None,
            "round_p99_s": round(pct(totals, 0.99), 3) if totals else None,
            "snapshot_p50_ms": _p50(measured, "snapshot_ms"),
            "policy_p50_ms": _p50(measured, "policy_ms"),
            "commit_p50_ms": _p50(measured, "commit_ms"),
            "cluster_status_ms": round(status_s * 1e3, 1),
            "ls_first_page_ms": round(ls_s * 1e3, 1),
            "scheduler_peak_rss_mib": round(rss),
            f"etcd_live_growth_over_{args.flat_rounds}_rounds_kib": growth,
            "cancel_burst_jobs": cancelled,
            "cancel_burst_s": round(cancel_s, 1),
            "longest_round_gap_in_burst_s": round(longest_gap(burst), 2),
            "etcd_live_mib": round(live / 1024**2, 1),
            "etcd_steady_state_mib": round(steady / 1024**2, 1),
            "days_to_quota": "never" if steady < QUOTA_BYTES else "steady state over quota",
        }
    finally:
        await store.close()
        cluster.stop()


def _p50(records: list[dict[str, Any]], key: str) -> float | None:
    return round(statistics.median(r[key] for r in records), 1) if records else None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="16,500")
    parser.add_argument("--active", default="160,10000")
    parser.add_argument("--finished", default="0,100000")
    parser.add_argument("--only", default="", help="N:A:F scenarios, comma-separated")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--flat-rounds", type=int, default=0, help="also measure etcd growth over N more rounds"
    )
    args = parser.parse_args()
    if args.only:
        chosen = [tuple(int(x) for x in s.split(":")) for s in args.only.split(",")]
    else:
        chosen = list(
            itertools.product(
                *(
                    [int(x) for x in getattr(args, name).split(",")]
                    for name in ("nodes", "active", "finished")
                )
            )
        )
    results = []
    for nodes, active, finished in chosen:
        result = await scenario(nodes, active, finished, args)
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
