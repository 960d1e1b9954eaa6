"""Restarts per job per minute on the demo's local cluster: do short rounds make jobs flap?

`pollux-up`'s cluster (2 nodes × 2 CPU slots, 5 s rounds, the default policy) runs `--jobs`
copies of the sample elastic job (examples/elastic_job.yaml, shortened with `--epochs`),
submitted `--gap` seconds apart so that they compete for the 4 slots. For every job it prints
its restarts, its running minutes (first allocation to completion), its restarts per running
minute, and the GPU counts it went through; then the mean and the worst.

    python benchmarks/restart_rate.py [--jobs 3] [--gap 20] [--epochs 6]

Target (issue 32): at most 1 restart per job per minute. Exit 1 if a job exceeds it or fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pollux.client import JobSpec
from pollux.service.local_cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
JOB_FILE = REPO / "examples" / "elastic_job.yaml"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _spec(index: int, epochs: int) -> JobSpec:
    spec = JobSpec.from_file(JOB_FILE)
    command = list(spec.command)
    command[command.index("--epochs") + 1] = str(epochs)
    return replace(spec, name=f"flap-{index}", command=tuple(command))


def _gpu_path(history: list[str]) -> str:
    """``1 → 2 → 4``: the GPU counts a job's reasons name, in order."""
    counts = []
    for reason in history:
        for word, unit in zip(reason.split(), reason.split()[1:], strict=False):
            if unit.rstrip(":,;)") in ("GPU", "GPUs") and word.isdigit():
                counts.append(word)
                break
    return " → ".join(counts) or "-"


def run(args: argparse.Namespace, workdir: Path) -> int:
    with (
        LocalCluster(
            workdir, nodes=2, gpus_per_node=2, schedulers=1, agents=1, interval_s=args.interval
        ) as cluster,
        cluster.client() as client,
    ):
        ids = []
        for index in range(args.jobs):
            ids.append(client.submit(_spec(index, args.epochs)).id)
            time.sleep(args.gap)
        deadline = time.monotonic() + args.timeout
        jobs = [client.get_job(i) for i in ids]
        while not all(j.state in TERMINAL for j in jobs):
            if time.monotonic() > deadline:
                print(f"timed out after {args.timeout} s", file=sys.stderr)
                return 1
            time.sleep(2)
            jobs = [client.get_job(i) for i in ids]
    rates = []
    print(f"{'job':10} {'state':10} {'restarts':>8} {'minutes':>8} {'per min':>8}  GPUs")
    for job in jobs:
        times = [t.time for t in job.history if t.state in ("ALLOCATED", "RUNNING") and t.time]
        started = times[0] if times else job.create_time
        end = job.finish_time or started
        minutes = max((end - started).total_seconds() / 60, 1e-9) if started and end else 1e-9
        rate = job.restarts / minutes
        rates.append(rate)
        path = _gpu_path([t.reason for t in job.history])
        print(
            f"{job.spec.name:10} {job.state:10} {job.restarts:8d} {minutes:8.2f} {rate:8.2f}"
            f"  {path}"
        )
    print(
        f"mean {sum(rates) / len(rates):.2f} restarts/job/min, worst {max(rates):.2f} (target <= 1)"
    )
    ok = all(j.state == "SUCCEEDED" for j in jobs) and max(rates) <= 1.0
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--gap", type=float, default=20.0, help="seconds between submits")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--interval", type=float, default=5.0, help="scheduling interval, s")
    parser.add_argument("--timeout", type=float, default=1200.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pollux-flap-") as tmp:
        Path(tmp).chmod(0o711)
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
