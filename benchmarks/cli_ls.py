"""How fast `pollux-cli` answers a person on a busy cluster: `ls`, `describe NAME`, `logs`.

A secure local cluster (etcd, one scheduler with TLS and tokens; no launchers) is filled with
`--jobs` job records written straight into etcd (the API would take minutes per 10k), spread
over `--users` owners, a few dozen names and a year of creation times, a tenth of them still
PENDING. Then each command is run as a user runs it — a fresh `pollux-cli` process over TLS
with the admin token — `--repeat` times, and the median and worst wall time printed, with the
in-process ListJobs latency for comparison (the rest is Python start-up and TLS).

    python benchmarks/cli_ls.py [--jobs 10000] [--users 20] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pollux.service.local_cluster import LocalCluster
from pollux.service.store import MAX_TXN_BYTES, Put, Store
from pollux.v1 import types_pb2 as pb

NAMES = [f"{w}-{n}" for w in ("resnet", "bert", "yolo", "gpt", "dcgan", "ncf") for n in range(8)]
YEAR_S = 365 * 86400.0


async def seed(store: Store, count: int, users: int, rng: random.Random) -> list[pb.Job]:
    """Write `count` job records (owners, names, creation times spread), in big transactions."""
    now = time.time()
    jobs: list[pb.Job] = []
    ops: list[Put] = []
    size = 0
    for i in range(count):
        created = now - rng.uniform(0, YEAR_S)
        job = pb.Job(
            id=f"j-{uuid.UUID(int=rng.getrandbits(128)).hex[:10]}",
            request_id=uuid.UUID(int=rng.getrandbits(128)).hex,
            owner=f"user{i % users}",
            spec=pb.JobSpec(
                name=rng.choice(NAMES),
                command=["python", "train.py"],
                batch=pb.BatchLimits(initial_batch_size=128, max_batch_size=1024),
            ),
        )
        job.create_time.FromNanoseconds(int(created * 1e9))
        job.history.add(state=pb.JOB_STATE_PENDING, reason="submitted")
        if rng.random() < 0.9:
            job.state = pb.JOB_STATE_SUCCEEDED
            job.finish_time.FromNanoseconds(int((created + 3600) * 1e9))
            job.history.add(state=pb.JOB_STATE_SUCCEEDED, reason="every replica exited 0")
        else:
            job.state = pb.JOB_STATE_PENDING
        jobs.append(job)
        value = job.SerializeToString()
        if ops and (len(ops) >= 100 or size + len(value) > MAX_TXN_BYTES // 2):
            await store.txn(ops)
            ops, size = [], 0
        ops.append(Put(store.keys.job(job.id), value))
        size += len(value) + 64
    if ops:
        await store.txn(ops)
    return jobs


def timed_cli(cluster: LocalCluster, args: list[str], repeat: int) -> tuple[float, float, str]:
    """(median s, worst s, last stdout) of `pollux-cli ARGS` run as fresh processes."""
    env = {
        **os.environ,
        "POLLUX_CONFIG": str(cluster.workdir / "no-config.toml"),
        "POLLUX_SERVER": cluster.scheduler_addresses[0],
        "POLLUX_CA": str(cluster.ca_file),
        "POLLUX_TOKEN": cluster.admin_token or "",
        "LINES": "24",
    }
    times = []
    out = ""
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "pollux.client.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=120,
        )
        times.append(time.perf_counter() - started)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"pollux-cli {' '.join(args)}: {done.stderr}")
        out = done.stdout or done.stderr
    return statistics.median(times), max(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="pollux-cli-ls-"))
    with LocalCluster(workdir, nodes=0, schedulers=0, agents=0) as cluster:

        async def fill() -> list[pb.Job]:
            store = await Store.connect(cluster.etcd_endpoint, tls=cluster.etcd_tls())
            try:
                return await seed(store, args.jobs, args.users, rng)
            finally:
                await store.close()

        started = time.perf_counter()
        jobs = asyncio.run(fill())
        print(f"seeded {len(jobs)} jobs in {time.perf_counter() - started:.1f} s")
        scheduler = cluster.start_scheduler("scheduler-0")
        # Time a warm replica (what users meet): until its mirror has listed every job, reads
        # fall back to etcd scans. How long that listing takes is printed too.
        deadline = time.monotonic() + 300
        while "mirror_ready" not in scheduler.log.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the scheduler's mirror never became ready")
            time.sleep(0.1)
        ready = json.loads(
            next(line for line in scheduler.log.read_text().splitlines() if "mirror_ready" in line)
        )
        print(f"the scheduler's index listed {ready['jobs']} jobs in {ready['seconds']} s")
        newest = max(jobs, key=lambda j: j.create_time.ToNanoseconds())
        unique = newest.id[2:8]
        commands = [
            ["ls"],
            ["ls", "--state", "PENDING"],
            ["ls", "--user", "user3", "--limit", "50"],
            ["ls", "--name-prefix", "gpt-", "--state", "SUCCEEDED"],
            ["describe", unique],
            ["describe", newest.spec.name],  # a reused name: its active job, else its newest
        ]
        print(f"{'command':<52} {'median s':>9} {'worst s':>8}  first line")
        for command in commands:
            median, worst, out = timed_cli(cluster, command, args.repeat)
            first = out.splitlines()[1 if command[0] == "ls" else 0][:60] if out else ""
            label = "pollux-cli " + " ".join(command)
            print(f"{label:<52} {median:9.3f} {worst:8.3f}  {first}")
        baseline, _, _ = timed_cli(cluster, ["--version"], args.repeat)
        print(f"{'pollux-cli --version (start-up alone)':<52} {baseline:9.3f}")


if __name__ == "__main__":
    main()
