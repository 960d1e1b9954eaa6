"""Tenants on the published workloads: each tenant's goodput vs what it is entitled to.

Jobs of the eight published 160-job workloads (16 × 4 GPUs) go to 2-4 tenants by a hash of
their names (`pollux.sim.workload.assign_tenants`). Each configuration runs a Pollux policy
(`--policy`) with the tenants' guarantees, weights and caps and a tenant-share method
(`--shares`); the baseline is single-tenant Pollux on the same workloads. It prints each
tenant's share of goodput against its entitlement ("off"), its goodput against what it would
get alone on its entitled GPUs ("÷alone") and mean JCT. docs/results.md ("Tenants") defines
every figure and option and holds the measured tables.

    python benchmarks/multi_tenant.py [--quick] [--load 1.0] [--policy pollux-jct] [--processes 2]
        [--shares budgets|weights|deficits|isolation] [--assign hash|round_robin]
        [--demand equal|entitled]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

try:
    from benchmarks.wrapped import WrappedPolicy
except ImportError:  # run as a script: this folder is on the path
    from wrapped import WrappedPolicy  # type: ignore[import-not-found, no-redef]
from pollux.policy import greedy
from pollux.policy.params import PolluxParams
from pollux.policy.problem import Problem
from pollux.policy.quota import Tenants, entitlements
from pollux.policy.registry import TENANT_SHARES, PolicySpec, make_policy
from pollux.policy.tenant_shares import Ledger
from pollux.policy.tenant_shares.common import isolated_goodput
from pollux.policy.tenant_shares.isolation import FLOOR
from pollux.policy.types import AllocationDecision, ClusterState, TenantSpec
from pollux.sim.application import load_published_applications
from pollux.sim.runner import spec_for
from pollux.sim.simulator import simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import WorkloadJob, assign_tenants, load_workload

T = TenantSpec
CONFIGS: dict[str, tuple[TenantSpec, ...]] = {
    "2 equal": (T("a"), T("b")),
    "2 weights 2:1": (T("a", weight=2.0), T("b")),
    "3 equal, one capped at 12": (T("a"), T("b"), T("c", cap_gpus=12)),
    "3 one guaranteed 24": (T("a", guarantee_gpus=24), T("b"), T("c")),
    "4 weights 1:1:2:4": (T("a"), T("b"), T("c", weight=2.0), T("d", weight=4.0)),
    "4 guarantee, cap, weights": (
        T("a", guarantee_gpus=16),
        T("b", cap_gpus=8),
        T("c", weight=2.0),
        T("d", guarantee_gpus=8, weight=1.0, cap_gpus=16),
    ),
}
QUICK = ("2 weights 2:1", "3 equal, one capped at 12", "4 guarantee, cap, weights")
QUICK_WORKLOADS = ("workload-1", "workload-5")

Jobs = tuple[tuple[str, float, int, int], ...]
"""Per job in a round: (name, speedup, GPUs, demand = min(max_replicas, N))."""

Round = tuple[Jobs, dict[str, list[float]]]
"""A round's jobs, and per configuration each tenant's isolated goodput (`isolated_goodput`)."""

Labels = dict[str, tuple[tuple[TenantSpec, ...], dict[str, str]]]
"""Per configuration to measure: its tenants and each job's tenant."""


class Recorder(WrappedPolicy[Ledger]):
    """A Pollux policy, keeping what each round gave every job and what tenants are owed.

    `observed`: the configurations whose isolated goodputs to record each round (the run's
    own, or for the single-tenant baseline every configuration, with its labelling).
    """

    def __init__(self, spec: PolicySpec, observed: Labels | None = None) -> None:
        super().__init__(make_policy(spec))
        self.rounds: list[Round] = []
        self.observed = observed or {}

    def allocate(
        self, state: ClusterState, memory: Ledger | None, rng: np.random.Generator
    ) -> AllocationDecision[Ledger]:
        """The policy's decision, recorded."""
        decision = self.inner.allocate(state, memory, rng)
        total = sum(node.gpus for node in state.nodes)
        jobs = tuple(
            (
                job.name,
                decision.explain[job.name].speedup,
                len(decision.allocations[job.name]),
                min(job.max_replicas, total),
            )
            for job in state.jobs
        )
        self.rounds.append((jobs, self.isolated(state)))
        return decision

    def isolated(self, state: ClusterState) -> dict[str, list[float]]:
        """Per observed configuration, each tenant's isolated goodput I_t this round.

        The same goodput models and unit as the policy's (a `Problem` of the round, the count
        phase's utilities, `isolated_goodput`), whatever the policy itself was told.
        """
        if not state.jobs or not state.nodes or not self.observed:
            return {}
        problem = Problem(state, PolluxParams())
        utilities = greedy.count_utilities(problem)[0]
        out = {}
        for config, (specs, tenant_of) in self.observed.items():
            labelled = [replace(job, tenant=tenant_of[job.name]) for job in state.jobs]
            alone = isolated_goodput(problem, utilities, Tenants.of(specs, labelled))
            out[config] = alone.goodput[: len(specs)].tolist()
        return out


Assign = Literal["hash", "round_robin"]
Demand = Literal["equal", "entitled"]


def simulate_one(
    task: tuple[str, Path, str, Assign, Demand, tuple[str, ...], str],
) -> tuple[str, str, dict[str, float], list[Round]]:
    """Run one workload under one configuration ("" = single-tenant baseline).

    The baseline records the isolated goodputs of every configuration of `observe`. The
    third field is the tenant-share method, the last the policy ("pollux" or "pollux-jct"),
    the baseline's too.
    """
    config_name, path, shares, how, demand, observe, policy = task
    specs = CONFIGS.get(config_name, ())
    config = replace(spec_for(policy).config, tenants=specs)
    workload = load_workload(path)
    if specs:
        workload = _labelled(path, specs, how, demand)
    observed: Labels = {}
    for name in (config_name,) if specs else observe:
        labelled = _labelled(path, CONFIGS[name], how, demand)
        observed[name] = (CONFIGS[name], {job.name: job.tenant for job in labelled})
    apps = load_published_applications(default_data_root() / "traces")
    recorder = Recorder(PolicySpec(policy, tenant_shares=shares), observed)
    result = simulate(workload, apps, recorder, config)
    return config_name, path.stem, result.jcts, recorder.rounds


@dataclass(frozen=True, slots=True)
class Shares:
    """Each tenant's goodput over the rounds in which all were busy.

    Attributes:
        goodput: Mean per-round share of the cluster's goodput.
        gpus: Mean per-round share of the GPUs held.
        isolated: Goodput summed over those rounds ÷ isolated goodput I_t summed over them.
        below: Fraction of those rounds in which the tenant got less than FLOOR · I_t.
    """

    goodput: np.ndarray
    gpus: np.ndarray
    isolated: np.ndarray
    below: np.ndarray
    busy_rounds: int
    rounds: int


def shares(
    runs: Sequence[tuple[list[Round], dict[str, str]]],
    specs: Sequence[TenantSpec],
    config: str,
) -> Shares:
    """Shares and isolation ratios over all-busy rounds of every run (rounds, job → tenant)."""
    index = {spec.name: i for i, spec in enumerate(specs)}
    goodput, gpus, got, alone, total_rounds = [], [], [], [], 0
    for rounds, tenant_of in runs:
        for record, isolated in rounds:
            total_rounds += 1
            g, k, unmet = np.zeros(len(specs)), np.zeros(len(specs)), np.zeros(len(specs))
            for name, speedup, held, want in record:
                t = index[tenant_of[name]]
                g[t] += speedup
                k[t] += held
                unmet[t] += want - held
            if (unmet > 0).all() and g.sum() > 0:
                goodput.append(g / g.sum())
                gpus.append(k / max(k.sum(), 1))
                got.append(g)
                alone.append(np.array(isolated[config]))
    empty = np.full(len(specs), np.nan)
    if not goodput:
        return Shares(empty, empty, empty, empty, 0, total_rounds)
    got_, alone_ = np.array(got), np.array(alone)
    return Shares(
        goodput=np.mean(goodput, axis=0),
        gpus=np.mean(gpus, axis=0),
        isolated=got_.sum(axis=0) / np.maximum(alone_.sum(axis=0), 1e-12),
        below=np.mean(got_ < FLOOR * alone_ - 1e-9, axis=0),
        busy_rounds=len(goodput),
        rounds=total_rounds,
    )


def report(
    name: str,
    specs: tuple[TenantSpec, ...],
    results: dict[tuple[str, str], tuple[dict[str, float], list[Round]]],
    workloads: list[Path],
    gpus: int,
    how: Assign = "hash",
    demand: Demand = "equal",
) -> tuple[bool, bool, bool | None]:
    """Print one configuration's table; whether it meets the isolation, share and JCT targets.

    The JCT verdict is None for a configuration with a cap (see the module docstring).
    """
    entitled = _entitled(specs, gpus)
    entitlement = entitled / entitled.sum()
    tenant_runs, base_runs = [], []
    tenant_jcts: dict[str, list[float]] = {t.name: [] for t in specs}
    base_jcts: dict[str, list[float]] = {t.name: [] for t in specs}
    for path in workloads:
        tenant_of = {job.name: job.tenant for job in _labelled(path, specs, how, demand)}
        jcts, rounds = results[(name, path.stem)]
        base, base_rounds = results[("", path.stem)]
        tenant_runs.append((rounds, tenant_of))
        base_runs.append((base_rounds, tenant_of))
        for job, tenant in tenant_of.items():
            tenant_jcts[tenant].append(jcts[job])
            base_jcts[tenant].append(base[job])
    ours, baseline = shares(tenant_runs, specs, name), shares(base_runs, specs, name)
    jct = float(np.mean([v for vs in tenant_jcts.values() for v in vs]))
    base_jct = float(np.mean([v for vs in base_jcts.values() for v in vs]))
    off = ours.goodput / entitlement - 1
    print(f"\n== {name}: {len(workloads)} workloads, {gpus} GPUs ==")
    print(
        f"all tenants busy in {ours.busy_rounds} of {ours.rounds} rounds "
        f"(single-tenant Pollux: {baseline.busy_rounds} of {baseline.rounds})"
    )
    print(
        f"{'tenant':<7}{'guar.':>6}{'weight':>7}{'cap':>5}{'E (GPUs)':>10}{'entitled':>10}"
        f"{'goodput':>9}{'off':>8}{'GPUs':>7}{'÷alone':>8}{'<0.9':>6} | "
        f"{'1-tenant goodput':>16}{'off':>8}{'÷alone':>8} | {'JCT (s)':>8}{'1-tenant':>9}"
    )
    for t, spec in enumerate(specs):
        base_off = baseline.goodput[t] / entitlement[t] - 1
        print(
            f"{spec.name:<7}{spec.guarantee_gpus:>6}{spec.weight:>7.1f}{spec.cap or '-':>5}"
            f"{entitled[t]:>10.1f}{entitlement[t]:>10.3f}{ours.goodput[t]:>9.3f}"
            f"{off[t]:>+8.1%}{ours.gpus[t]:>7.3f}{ours.isolated[t]:>8.2f}{ours.below[t]:>6.0%} | "
            f"{baseline.goodput[t]:>16.3f}{base_off:>+8.1%}{baseline.isolated[t]:>8.2f} | "
            f"{np.mean(tenant_jcts[spec.name]):>8.0f}{np.mean(base_jcts[spec.name]):>9.0f}"
        )
    ok_share = bool(np.all(np.abs(off) <= 0.10))
    ok_alone = bool(np.all(ours.isolated >= FLOOR))
    capped = any(t.cap is not None for t in specs)
    ok_jct = None if capped else jct <= 1.05 * base_jct
    verdict = "n/a (a cap binds)" if ok_jct is None else ("yes" if ok_jct else "NO")
    print(
        f"mean JCT {jct:.1f} s vs single-tenant Pollux {base_jct:.1f} s "
        f"({jct / base_jct - 1:+.1%}); goodput ≥ {FLOOR} × isolated: "
        f"{'yes' if ok_alone else 'NO'} (single-tenant Pollux: "
        f"{'yes' if np.all(baseline.isolated >= FLOOR) else 'no'}); shares of goodput "
        f"within ±10 %: {'yes' if ok_share else 'NO'}; JCT within 5 %: {verdict}"
    )
    return ok_alone, ok_share, ok_jct


def _entitled(specs: Sequence[TenantSpec], gpus: int) -> np.ndarray:
    """E_t of every tenant, all with demand, on a cluster of `gpus` GPUs."""
    return entitlements(
        [t.guarantee_gpus for t in specs],
        [t.weight for t in specs],
        [t.cap or 2**62 for t in specs],
        gpus,
    )


def _labelled(
    path: Path, specs: Sequence[TenantSpec], how: Assign, demand: Demand
) -> list[WorkloadJob]:
    """The workload's jobs given to the tenants, in equal numbers or in proportion to E_t."""
    shares = None
    if demand == "entitled":
        cluster = spec_for("pollux").config
        shares = _entitled(specs, cluster.nodes * cluster.gpus_per_node).tolist()
    return assign_tenants(load_workload(path), [t.name for t in specs], how, shares)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 configurations, 2 workloads")
    parser.add_argument("--load", default="1.0", help="published job load: 0.5, 1.0 or 1.5")
    parser.add_argument("--configs", help="comma-separated configuration names (default: all)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--save", type=Path, help="write the raw results (JSON) here")
    parser.add_argument("--replay", type=Path, help="report saved results instead of simulating")
    parser.add_argument(
        "--shares",
        choices=TENANT_SHARES,
        default=TENANT_SHARES[0],
        help="how the policy gives tenants their shares (scheduling.tenant_shares)",
    )
    parser.add_argument(
        "--policy",
        choices=["pollux", "pollux-jct"],
        default="pollux",
        help="the Pollux policy, for the tenants and the single-tenant baseline alike",
    )
    parser.add_argument(
        "--assign",
        choices=["hash", "round_robin"],
        default="hash",
        help="how jobs go to tenants (pollux.sim.workload.assign_tenants)",
    )
    parser.add_argument(
        "--demand",
        choices=["equal", "entitled"],
        default="equal",
        help="jobs per tenant: about equal, or in proportion to its entitlement",
    )
    args = parser.parse_args(argv)
    folder = default_data_root() / ("workloads" if args.load == "1.0" else f"workloads-{args.load}")
    workloads = sorted(folder.glob("*.csv"), key=lambda p: int(p.stem.split("-")[-1]))
    names = list(CONFIGS)
    if args.quick:
        names = list(QUICK)
        workloads = [p for p in workloads if p.stem in QUICK_WORKLOADS]
    if args.configs:
        names = [n.strip() for n in args.configs.split(",")]
        unknown = [n for n in names if n not in CONFIGS]
        if unknown:
            parser.error(f"unknown configurations {unknown}; choose from {list(CONFIGS)}")
    how: Assign = args.assign
    demand: Demand = args.demand
    observe = tuple(names)
    tasks = [
        (name, path, args.shares, how, demand, observe, args.policy)
        for name in ["", *names]
        for path in workloads
    ]
    started = time.perf_counter()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    results: dict[tuple[str, str], tuple[dict[str, float], list[Round]]] = {}
    if args.replay:
        saved = json.loads(args.replay.read_text())
        for config_name, stem, jcts, rounds in saved:
            results[(config_name, stem)] = (
                jcts,
                [(tuple(map(tuple, jobs)), isolated) for jobs, isolated in rounds],
            )
        tasks = []
    with multiprocessing.get_context("spawn").Pool(max(1, args.processes)) as pool:
        for config_name, stem, jcts, rounds in pool.imap_unordered(simulate_one, tasks):
            results[(config_name, stem)] = (jcts, rounds)
            print(
                f"[{len(results)}/{len(tasks)}] {config_name or 'single-tenant'} {stem} "
                f"({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    if args.save:
        rows = [[c, stem, jcts, rounds] for (c, stem), (jcts, rounds) in results.items()]
        args.save.write_text(json.dumps(rows, separators=(",", ":")))
    cluster = spec_for("pollux").config
    gpus = cluster.nodes * cluster.gpus_per_node
    print(
        f"load {args.load}x, policy {args.policy}, tenant shares by {args.shares}, "
        f"jobs to tenants by {how}, {demand} demand, "
        f"workloads: {', '.join(p.stem for p in workloads)}"
    )
    verdicts = [report(n, CONFIGS[n], results, workloads, gpus, how, demand) for n in names]
    alone_met = sum(ok for ok, _, _ in verdicts)
    shares_met = sum(ok for _, ok, _ in verdicts)
    judged = [ok for _, _, ok in verdicts if ok is not None]
    print(
        f"\nevery tenant ≥ {FLOOR} × its isolated goodput in {alone_met} of {len(verdicts)} "
        f"configurations; shares of goodput within ±10 % in {shares_met} of {len(verdicts)}; "
        f"mean JCT within 5 % in {sum(judged)} of the {len(judged)} without caps"
    )
    print(f"total wall time: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
