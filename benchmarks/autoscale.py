"""Goodput-driven autoscaling against a throughput-based autoscaler and a fixed cluster.

Pollux §5.4's setting on the published traces: 4-GPU nodes (g4dn.12xlarge, $3.912/h), 1 to 16
nodes, 3-minute provisioning, 60 s rounds, faithful Pollux. Cases: one ImageNet ResNet-50 job
alone (the paper's), and a busy published 1.0× workload (--workloads). Schemes, the SAME
settings in every case: goodput (`pollux.autoscale.GOODPUT_RULE`, adaptive jobs); throughput
(after Or et al., MLSys'20: `THROUGHPUT_RULE`, jobs sizing batches for throughput alone);
fixed (16 nodes, adaptive jobs). Prints node-hours, cost, mean JCT, makespan, utilisation.

    python benchmarks/autoscale.py [--cases imagenet,busy] [--workloads 6] [--delay 180]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pollux.autoscale import GOODPUT_RULE, THROUGHPUT_RULE, NodePool
from pollux.policy.registry import PolicySpec, make_policy
from pollux.sim.application import load_published_applications
from pollux.sim.autoscaling import AutoscaleConfig, AutoscaleResult, simulate_autoscaled
from pollux.sim.simulator import SimConfig
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob, load_workload

PRICE = 3.912  # g4dn.12xlarge, on demand, $ per hour
SCHEMES = ("goodput", "throughput", "fixed")


@dataclass(frozen=True)
class Case:
    """A workload to run under every scheme."""

    name: str
    workload: tuple[WorkloadJob, ...]


def pool(max_nodes: int) -> NodePool:
    """The one pool every autoscaled scheme uses."""
    return NodePool(
        "g4dn",
        gpu_type="t4",
        gpus_per_node=4,
        min_nodes=1,
        max_nodes=max_nodes,
        cost_per_node_hour=PRICE,
    )


def run(case: Case, scheme: str, delay: float, max_nodes: int) -> dict[str, object]:
    apps = load_published_applications(default_data_root() / "traces")
    policy = make_policy(PolicySpec("pollux"))
    if scheme == "fixed":
        scaling = AutoscaleConfig.fixed(max_nodes, 4, PRICE)
    else:
        rule = GOODPUT_RULE if scheme == "goodput" else THROUGHPUT_RULE
        scaling = AutoscaleConfig((pool(max_nodes),), rule, provisioning_delay_s=delay)
    started = time.perf_counter()
    result = simulate_autoscaled(
        case.workload, apps, policy, SimConfig(), scaling, efficiency_blind=scheme == "throughput"
    )
    return summary(case.name, scheme, result, time.perf_counter() - started)


def summary(case: str, scheme: str, r: AutoscaleResult, wall: float) -> dict[str, object]:
    peak = max((ready + prov for _, ready, prov in r.sizes), default=0)
    return {
        "case": case,
        "scheme": scheme,
        "node_hours": r.node_hours,
        "cost": r.total_cost,
        "mean_jct": r.sim.average_jct,
        "makespan": r.sim.makespan,
        "utilisation": r.utilisation,
        "peak_nodes": peak,
        "restarts": sum(r.sim.restarts.values()) / max(len(r.sim.restarts), 1),
        "changes": len(r.decisions),
        "sizes": [list(s) for s in r.sizes],
        "wall_s": wall,
    }


def cases(names: list[str], workloads: list[int]) -> list[Case]:
    out = []
    root = default_data_root()
    for name in names:
        if name == "imagenet":
            job = WorkloadJob("imagenet-0", 0.0, "imagenet", 24, 3200)
            out.append(Case("imagenet", (job,)))
        elif name == "busy":
            for w in workloads:
                jobs = load_workload(root / "workloads" / f"workload-{w}.csv")
                out.append(Case(f"busy-w{w}", tuple(jobs)))
        else:
            raise SystemExit(f"unknown case {name!r} (imagenet, busy)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="imagenet,busy")
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--workloads", default="6", help="published 1.0x workloads for busy")
    parser.add_argument("--delay", type=float, default=180.0, help="provisioning delay, s")
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    todo = [
        (case, scheme)
        for case in cases(args.cases.split(","), [int(w) for w in args.workloads.split(",")])
        for scheme in args.schemes.split(",")
    ]
    # Each run in a fresh process with one BLAS thread: threads only spin against each other
    # on the small fits of a simulation (measured: 16x slower on 2 busy cores).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, args.processes), mp_context=spawn) as pool_:
        futures = [pool_.submit(run, c, s, args.delay, args.max_nodes) for c, s in todo]
        rows = [f.result() for f in futures]
    print(
        f"provisioning delay {args.delay:.0f} s, 1-{args.max_nodes} nodes of 4 GPUs at "
        f"${PRICE}/node-hour, faithful Pollux policy, 60 s rounds"
    )
    header = (
        f"{'case':<12} {'scheme':<11} {'node-h':>8} {'cost $':>8} {'mean JCT s':>11} "
        f"{'makespan s':>11} {'util':>5} {'peak':>4} {'rst/job':>7}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['case']:<12} {row['scheme']:<11} {row['node_hours']:>8.1f} "
            f"{row['cost']:>8.1f} {row['mean_jct']:>11.1f} {row['makespan']:>11.1f} "
            f"{row['utilisation']:>5.2f} {row['peak_nodes']:>4} {row['restarts']:>7.2f}"
        )
    by = {(r["case"], r["scheme"]): r for r in rows}
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = by.get((case, "goodput"))
        if mine is None:
            continue
        for base in ("throughput", "fixed"):
            other = by.get((case, base))
            if other is None:
                continue
            cost = float(mine["cost"]) / float(other["cost"]) - 1  # type: ignore[arg-type]
            jct = float(mine["mean_jct"]) / float(other["mean_jct"]) - 1  # type: ignore[arg-type]
            print(f"{case}: goodput vs {base}: cost {cost:+.1%}, mean JCT {jct:+.1%}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
