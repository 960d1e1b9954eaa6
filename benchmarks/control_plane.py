"""Control-plane figures on a real local cluster (etcd + scheduler replicas as processes).

1. Submit latency (p50/p99) with 100 concurrent clients each submitting once a second, then
   the maximum submit throughput with 100 clients in a closed loop; clients are spread over
   the replicas the way clients given the full server list spread.
2. Leader failover over 20 `kill -9` cycles: seconds from the kill until a replica reports a
   new leader (max and median); the killed replica is restarted each cycle.
3. Deposed leaders: 3 cycles pause the leader (SIGSTOP) until another leads, then resume it;
   a decision record the old leader wrote after that is a fenced write that got through (0).
4. Jobs lost: every acknowledged submit (failovers included) must be listed at the end (0).

    python benchmarks/control_plane.py [--clients 100] [--seconds 10] [--cycles 20]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import grpc

from pollux.service.local_cluster import LocalCluster
from pollux.service.store import Store
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc as spb_grpc
from pollux.v1 import types_pb2 as pb

SPEC = pb.JobSpec(name="bench", command=["true"], batch=pb.BatchLimits(initial_batch_size=32))


async def submit_load(
    addresses: list[str], clients: int, seconds: float, period: float = 0.0
) -> tuple[list[float], set[str]]:
    """Submits from `clients` concurrent clients; returns latencies (s) and acknowledged ids.

    With `period` 0 each client submits again as soon as it is acknowledged (closed loop: the
    maximum throughput). Otherwise each submits once every `period` seconds (open loop: the
    latency one user sees while 100 clients share the service).
    """
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs = [spb_grpc.SchedulerServiceStub(c) for c in channels]
    latencies: list[float] = []
    accepted: set[str] = set()
    deadline = time.perf_counter() + seconds

    async def client(i: int) -> None:
        stub = stubs[i % len(stubs)]
        if period:
            await asyncio.sleep(period * i / clients)  # spread the clients' phases
        while time.perf_counter() < deadline:
            request = spb.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex)
            started = time.perf_counter()
            response = await stub.SubmitJob(request, timeout=10)
            latencies.append(time.perf_counter() - started)
            accepted.add(response.job.id)
            if period:
                await asyncio.sleep(max(0.0, period - (time.perf_counter() - started)))

    await asyncio.gather(*(client(i) for i in range(clients)))
    for channel in channels:
        await channel.close()
    return latencies, accepted


async def leader_of(addresses: list[str]) -> str:
    """The leader id any live replica reports ('' if none answers or none leads)."""
    for address in addresses:
        async with grpc.aio.insecure_channel(address) as channel:
            try:
                status = await spb_grpc.SchedulerServiceStub(channel).ClusterStatus(
                    spb.ClusterStatusRequest(), timeout=1
                )
            except grpc.aio.AioRpcError:
                continue
            return str(status.leader_id)
    return ""


async def submit_one(addresses: list[str]) -> str | None:
    """One submit to any replica that answers; the job id, or None if none did."""
    for address in addresses:
        async with grpc.aio.insecure_channel(address) as channel:
            try:
                response = await spb_grpc.SchedulerServiceStub(channel).SubmitJob(
                    spb.SubmitJobRequest(spec=SPEC, request_id=uuid.uuid4().hex), timeout=2
                )
            except grpc.aio.AioRpcError:
                continue
            return str(response.job.id)
    return None


async def failover(cluster: LocalCluster, cycles: int, accepted: set[str]) -> list[float]:
    """Kill the leader `cycles` times; seconds until a new leader is reported, per cycle."""
    times: list[float] = []
    for _ in range(cycles):
        leader = ""
        while not leader:
            leader = await leader_of(cluster.scheduler_addresses)
            await asyncio.sleep(0.05)
        cluster.kill(leader, signal.SIGKILL)
        killed = time.perf_counter()
        new = ""
        while not new or new == leader:
            job = await submit_one(cluster.scheduler_addresses)  # submits keep working
            if job is not None:
                accepted.add(job)
            new = await leader_of(cluster.scheduler_addresses)
            await asyncio.sleep(0.02)
        times.append(time.perf_counter() - killed)
        cluster.start_scheduler(leader)
    return times


async def deposed_writes(cluster: LocalCluster, cycles: int) -> int:
    """Pause leaders until replaced, resume them; count their decisions after replacement."""
    store = await Store.connect(cluster.etcd_endpoint)
    violations = 0
    try:
        for _ in range(cycles):
            leader = ""
            while not leader:
                leader = await leader_of(cluster.scheduler_addresses)
            proc = cluster.procs[leader].process
            proc.send_signal(signal.SIGSTOP)
            new = ""
            while not new or new == leader:
                live = [
                    a for a in cluster.scheduler_addresses if a != cluster.procs[leader].address
                ]
                new = await leader_of(live)
                await asyncio.sleep(0.05)
            latest = await store.latest_decisions(1)
            takeover_round = latest[0].round if latest else 0
            proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(cluster.interval_s * 3)
            for decision in await store.latest_decisions(50):
                if decision.round > takeover_round and decision.scheduler_id == leader:
                    violations += 1
    finally:
        await store.close()
    return violations


async def count_lost(addresses: list[str], accepted: set[str]) -> int:
    """Acknowledged job ids missing from ListJobs."""
    listed: set[str] = set()
    async with grpc.aio.insecure_channel(addresses[0]) as channel:
        stub = spb_grpc.SchedulerServiceStub(channel)
        token = ""
        while True:
            page = await stub.ListJobs(
                spb.ListJobsRequest(page_size=1000, page_token=token), timeout=30
            )
            listed.update(j.id for j in page.jobs)
            token = page.next_page_token
            if not token:
                break
    return len(accepted - listed)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace, workdir: Path) -> None:
    cluster = LocalCluster(
        workdir,
        nodes=0,
        schedulers=args.schedulers,
        agents=0,
        interval_s=1.0,
        lease_ttl_s=args.lease_ttl,
        secure=False,  # raw stubs measure the control plane, not TLS handshakes
    ).start()
    try:
        await asyncio.sleep(1.0)
        latencies, accepted = await submit_load(
            cluster.scheduler_addresses, args.clients, args.seconds, period=args.period
        )
        rate = len(latencies) / args.seconds
        print(
            f"submit, {args.clients} clients each every {args.period:g} s ({rate:.0f}/s): "
            f"latency p50 {pct(latencies, 0.5) * 1e3:.1f} ms, "
            f"p99 {pct(latencies, 0.99) * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms"
        )
        latencies, more = await submit_load(cluster.scheduler_addresses, args.clients, args.seconds)
        accepted |= more
        rate = len(latencies) / args.seconds
        print(
            f"submit, closed loop: {len(latencies)} jobs by {args.clients} concurrent clients "
            f"in {args.seconds:.0f} s = {rate:.0f}/s over {args.schedulers} replicas; "
            f"latency p50 {pct(latencies, 0.5) * 1e3:.1f} ms, "
            f"p99 {pct(latencies, 0.99) * 1e3:.1f} ms"
        )
        times = await failover(cluster, args.cycles, accepted)
        print(
            f"failover over {len(times)} kill -9 cycles (lease TTL {args.lease_ttl} s): "
            f"median {statistics.median(times):.2f} s, max {max(times):.2f} s"
        )
        violations = await deposed_writes(cluster, args.pauses)
        print(
            f"writes accepted from a deposed (paused, then resumed) leader: {violations} "
            f"over {args.pauses} cycles"
        )
        lost = await count_lost(cluster.scheduler_addresses, accepted)
        print(f"jobs lost: {lost} of {len(accepted)} acknowledged")
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--period", type=float, default=1.0, help="open-loop submit period, s")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--pauses", type=int, default=3)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--lease-ttl", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pollux-bench-") as workdir:
        asyncio.run(run(args, Path(workdir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
