"""Policy time per round on clusters of several GPU types (issue 30): median, p90 and min.

Synthetic rounds of the typed policy on Sia's three-type cluster (6 aws × 4, 2 dgx-ext × 8,
3 rtx × 8 = 64 GPUs) and 8 and 32 times it, with 160, 1000 and 10 000 active jobs of the
Philly mix, each with a goodput model per type fitted on that type's traces; each later
round starts from the last decision 60 s on, running jobs' gradient statistics moved, as
live. Without Sia's data (`--sia-data PATH`, or $POLLUX_SIA_DATA) the project's own traces
stand in (the Pollux T4 traces plus two derived faster types).

    python benchmarks/hetero_policy_time.py [--sia-data PATH] [--policy pollux-jct]
        [--cases 64:160,512:1000,2048:10000] [--rounds N] [--exact]

The certified gap is recomputed outside the timed call; --exact compares with scipy's MILP.
The min is the closest to an idle machine; the CPU time per round is printed too.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pollux.goodput import GoodputModel, GradParams, PerfParams, fit_perf_params
from pollux.policy import Allocation, ClusterState, JobInfo, NodeInfo
from pollux.policy.assignment import exact
from pollux.policy.params import PolluxParams
from pollux.policy.registry import PolicySpec, make_policy
from pollux.policy.typed_problem import typed_problem
from pollux.policy.typed_round import options, solve

ROOT = Path(__file__).resolve().parent.parent
MIX = {"cifar10": 0.77, "deepspeech2": 0.09, "bert": 0.07, "yolov3": 0.05, "imagenet": 0.02}
SIA_CLUSTER = (("aws", 6, 4), ("dgx-ext", 2, 8), ("rtx", 3, 8))
OWN_CLUSTER = (("t4", 6, 4), ("fast", 2, 8), ("faster", 3, 8))
OWN_SPEED = {"t4": (1.0, 1.0), "fast": (2.5, 2.0), "faster": (5.0, 3.0)}  # compute, sync
MAX_REPLICAS = 64


@dataclass(frozen=True)
class TypeFit:
    """One (model, type)'s throughput fit and per-GPU batch limits."""

    perf: PerfParams
    min_atomic: int
    max_atomic: int


@dataclass(frozen=True)
class App:
    """One model: per-type fits, M0, the largest batch and per-epoch gradient statistics."""

    fits: dict[str, TypeFit]
    init_batch: int
    max_batch: int
    grads: list[tuple[float, float]]


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def throughput_rows(folder: Path, suffix: str) -> tuple[np.ndarray, ...]:
    """(N, K, m, step, sync) of placements<suffix>.csv and scalability<suffix>.csv, by header."""
    n, k, m, step, sync = [], [], [], [], []
    for row in read_rows(folder / f"placements{suffix}.csv"):
        p = row["placement"]
        n.append(len(p))
        k.append(sum(int(c) for c in p))
        m.append(int(row["local_bsz"]))
        step.append(float(row["step_time"]))
        sync.append(float(row["sync_time"]))
    scal = folder / f"scalability{suffix}.csv"
    if scal.exists():
        for row in read_rows(scal):
            n.append(int(row["num_nodes"]))
            k.append(int(row["num_replicas"]))
            m.append(int(row["local_bsz"]))
            step.append(float(row["step_time"]))
            sync.append(float(row["sync_time"]))
    return tuple(np.array(c, dtype=np.float64) for c in (n, k, m, step, sync))


def fit(rows: tuple[np.ndarray, ...]) -> TypeFit:
    """One throughput fit on the mean step times per (N, K, m)."""
    n, k, m, step, sync = rows
    keys, inverse = np.unique(np.stack([n, k, m], 1), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    count = np.bincount(inverse)
    st, sy = np.bincount(inverse, step) / count, np.bincount(inverse, sync) / count
    params = fit_perf_params(keys[:, 0], keys[:, 1], keys[:, 2], st - sy, st).params
    single = n == 1
    return TypeFit(params, int(m.min()), int(m[single].max() if single.any() else m.max()))


def validation(folder: Path) -> tuple[int, int, list[tuple[float, float]]]:
    runs = {}
    for path in folder.glob("validation-*.csv"):
        match = re.fullmatch(r"validation-(\d+)\.csv", path.name)
        if match:
            runs[int(match.group(1))] = path
    m0 = min(runs)
    grads = [(float(r["grad_sqr"]), float(r["grad_var"])) for r in read_rows(runs[m0])]
    return m0, max(runs), [(max(a, 0.0), max(b, 1e-9)) for a, b in grads]


def sia_apps(root: Path) -> dict[str, App]:
    out = {}
    for name in MIX:
        folder = root / "traces" / name
        m0, top, grads = validation(folder)
        fits = {t: fit(throughput_rows(folder, f"-{t}")) for t, _, _ in SIA_CLUSTER}
        out[name] = App(fits, m0, top, grads)
    return out


def own_apps(root: Path) -> dict[str, App]:
    out = {}
    for name in MIX:
        folder = root / name
        m0, top, grads = validation(folder)
        t4 = fit(throughput_rows(folder, ""))
        fits = {}
        for t, (compute, sync) in OWN_SPEED.items():
            p = t4.perf
            perf = replace(
                p,
                alpha_c=p.alpha_c / compute,
                beta_c=p.beta_c / compute,
                alpha_n=p.alpha_n / sync,
                beta_n=p.beta_n / sync,
                alpha_r=p.alpha_r / sync,
                beta_r=p.beta_r / sync,
            )
            fits[t] = TypeFit(perf, t4.min_atomic, t4.max_atomic)
        out[name] = App(fits, m0, top, grads)
    return out


def models(app: App, grad: tuple[float, float]) -> dict[str, GoodputModel]:
    g = GradParams(*grad)
    return {
        t: GoodputModel(
            f.perf,
            g,
            init_batch_size=app.init_batch,
            max_batch_size=app.max_batch,
            min_atomic_bsz=f.min_atomic,
            max_atomic_bsz=max(f.max_atomic, f.min_atomic),
            accumulation=True,
        )
        for t, f in app.fits.items()
    }


def first_state(
    apps: dict[str, App],
    cluster: tuple[tuple[str, int, int], ...],
    scale: int,
    jobs: int,
    seed: int,
) -> ClusterState:
    """Round 0: every job new (no allocation), as the module docstring says."""
    rng = np.random.default_rng(seed)
    nodes = tuple(
        NodeInfo(f"{t}-{i}", g, t) for t, count, g in cluster for i in range(count * scale)
    )
    types = [t for t, _, _ in cluster]
    names = list(MIX)
    now = 30_000.0
    out = []
    for j, a in enumerate(rng.choice(len(names), size=jobs, p=list(MIX.values()))):
        app = apps[names[a]]
        per_type = models(app, app.grads[int(rng.integers(len(app.grads)))])
        profiled = int(rng.choice([0, 1, 2, 4, 8, 16], p=[0.1, 0.3, 0.2, 0.2, 0.1, 0.1]))
        allowed = None
        if rng.random() < 0.1:
            pick = rng.choice(types, size=int(rng.integers(1, 3)), replace=False)
            allowed = frozenset(str(t) for t in pick)
        out.append(
            JobInfo(
                name=f"job-{j}",
                submission_time=now - float(rng.uniform(0, 20_000)),
                restarts=int(rng.integers(0, 4)),
                max_replicas=min(MAX_REPLICAS, max(4, 4 * profiled)),
                model=per_type[types[0]],
                models=per_type,
                gpu_types=allowed,
                remaining_work=float(rng.uniform(1e3, 5e5)),
            )
        )
    return ClusterState(now, nodes, tuple(out))


def next_state(
    state: ClusterState, allocations: Mapping[str, Allocation], rng: np.random.Generator
) -> ClusterState:
    """60 s later: the decision applied; running jobs' gradient statistics moved."""
    node_type = {n.name: n.gpu_type for n in state.nodes}
    jobs = []
    for info in state.jobs:
        alloc = tuple(allocations[info.name])
        per_type = info.models
        restarts = info.restarts + int(bool(info.allocation) and alloc != info.allocation)
        if alloc:
            factor = math.exp(float(rng.normal(0.0, 0.05)))
            per_type = {
                t: replace(m, grad=GradParams(m.grad.sqr, m.grad.var * factor))
                for t, m in per_type.items()
            }
        current = node_type[alloc[0]] if alloc else next(iter(per_type))
        jobs.append(
            replace(
                info,
                allocation=alloc,
                restarts=restarts,
                attained_service=info.attained_service + 60.0 * len(alloc),
                models=per_type,
                model=per_type[current],
            )
        )
    return replace(state, now=state.now + 60.0, jobs=tuple(jobs))


def run_case(
    apps: dict[str, App],
    cluster: tuple[tuple[str, int, int], ...],
    gpus: int,
    jobs: int,
    rounds: int,
    policy_name: str,
    compare: bool,
) -> None:
    base = sum(count * g for _, count, g in cluster)
    scale = max(1, gpus // base)
    state = first_state(apps, cluster, scale, jobs, seed=gpus + jobs)
    policy = make_policy(PolicySpec(policy_name))
    rng = np.random.default_rng(0)
    memory = None
    times, cpu, gaps, placed, to_milp, milp_ms = [], [], [], [], [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        decision = policy.allocate(state, memory, rng)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        memory = decision.memory
        # The certificate, recomputed outside the timed call (the same problem and solver).
        params = policy.explain_params or PolluxParams()
        if policy_name == "pollux-jct":
            params = replace(params, p=0.0)
        problem = typed_problem(state, params)
        result = solve(problem)
        gaps.append(result.gap)
        if compare:
            # The solver's assignment against the exact MILP on the same options (before
            # placement, which both would share).
            opts = options(problem)
            start = time.perf_counter()
            best = exact(opts, time_limit=120.0)
            milp_ms.append((time.perf_counter() - start) * 1e3)
            value = result.assignment.value
            to_milp.append((best.value - value) / max(best.value, 1e-12))
        placed.append(sum(1 for a in decision.allocations.values() if a))
        state = next_state(state, dict(decision.allocations), rng)
    warm = np.array(times[1:]) * 1e3
    warm_cpu = np.array(cpu[1:]) * 1e3
    print(
        f"{scale * base:5d} GPUs {jobs:6d} jobs {policy_name}: round 0 {times[0] * 1e3:7.1f} ms; "
        f"rounds 1-{rounds - 1}: median {np.median(warm):7.1f} ms, "
        f"p90 {np.percentile(warm, 90):7.1f} ms, min {warm.min():7.1f} ms "
        f"(CPU median {np.median(warm_cpu):7.1f} ms) | "
        f"jobs placed (median) {int(np.median(placed))}, certified gap ≤ {max(gaps) * 100:.4f} %",
        flush=True,
    )
    if compare:
        print(
            f"      vs the exact MILP: worst {max(to_milp) * 100:.4f} % below it over "
            f"{len(to_milp)} rounds (MILP median {np.median(milp_ms):.0f} ms)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sia-data",
        type=Path,
        default=Path(os.environ["POLLUX_SIA_DATA"]) if os.environ.get("POLLUX_SIA_DATA") else None,
    )
    parser.add_argument("--policy", default="pollux-jct", choices=["pollux-jct", "pollux"])
    parser.add_argument("--cases", default="64:160,512:1000,2048:10000", help="GPUS:JOBS,...")
    parser.add_argument("--rounds", type=int, default=0, help="per case (0: 21, 11, 6)")
    parser.add_argument(
        "--exact", action="store_true", help="also solve each round's MILP (cases ≤ 1000 jobs)"
    )
    args = parser.parse_args()
    if args.sia_data is not None and (args.sia_data / "traces").is_dir():
        apps, cluster = sia_apps(args.sia_data), SIA_CLUSTER
        print(f"Sia traces from {args.sia_data}: cluster {cluster} × scale")
    else:
        apps, cluster = own_apps(ROOT / "data" / "pollux-osdi21" / "traces"), OWN_CLUSTER
        print(f"no Sia traces at {args.sia_data}: the project's T4 traces + derived types")
    for case in args.cases.split(","):
        gpus, jobs = (int(x) for x in case.split(":"))
        rounds = args.rounds or (21 if jobs <= 200 else 11 if jobs <= 2000 else 6)
        run_case(apps, cluster, gpus, jobs, rounds, args.policy, args.exact and jobs <= 1000)


if __name__ == "__main__":
    main()
