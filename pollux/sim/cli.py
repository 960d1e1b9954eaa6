"""`pollux-sim`: command line of the trace-driven simulator and its model tools."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pollux.goodput import (
    GoodputError,
    GoodputModel,
    GradParams,
    SyncModel,
    best_batch,
    fit_perf_params,
    speedup_table,
    step_times,
)
from pollux.policy.registry import POLICY_NAMES
from pollux.policy.types import TenantSpec
from pollux.sim.report import ReportError, compare_main
from pollux.sim.runner import run, spec_for, stderr_progress
from pollux.sim.simulator import EVENT_ROUNDS
from pollux.sim.traces import (
    ApplicationTrace,
    ThroughputTrace,
    TraceFormatError,
    default_data_root,
    load_application,
    load_applications,
)
from pollux.sim.workload import Flood


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="pollux-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser(
        "fit",
        help="fit and print the goodput model of application traces",
        description="Fit the throughput model of each application on the "
        "placements that use at most --max-nodes nodes, report its "
        "error on the larger ones and print the speedup table.",
    )
    fit.add_argument(
        "apps",
        nargs="*",
        type=Path,
        help="application trace folders (default: every published application)",
    )
    fit.add_argument(
        "--max-nodes",
        type=int,
        default=2,
        help="fit on placements with at most this many nodes (default 2)",
    )
    fit.add_argument(
        "--sync-model",
        choices=[m.value for m in SyncModel],
        default=SyncModel.RING.value,
        help="shape of sync-time growth",
    )
    run = sub.add_parser(
        "run",
        help="simulate a workload (or a folder of them in parallel)",
        description="Simulate workloads under a policy and write DIR/summary.json "
        "(published format), DIR/run.json and one DIR/<workload>.jsonl "
        "per workload with a record per scheduling round.",
    )
    run.add_argument("workload", type=Path, help="a workload CSV or a folder of them")
    run.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default="pollux",
        help="pollux (default): Pollux as published; pollux-jct: the live default, jobs "
        "weighted by their declared remaining work to lower mean JCT; optimus, tiresias: the "
        "paper's baselines (docs/configuration.md)",
    )
    run.add_argument("--interval", type=float, default=60.0, help="seconds between rounds")
    run.add_argument(
        "--event-delay",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also run a round this long after each submission and completion, as the live "
        "scheduler does (its debounce_s, 1 s); default: every --interval only (published)",
    )
    run.add_argument(
        "--event-rounds",
        choices=EVENT_ROUNDS,
        default="full",
        help="with --event-delay, what those rounds do: full: re-plan every job (the timer "
        "restarts); place: only place jobs that never ran on free GPUs, periodic rounds "
        "keeping their own clock (the live scheduler's scheduling.event_rounds)",
    )
    run.add_argument(
        "--interference",
        type=float,
        default=0.0,
        help="slowdown (0-1) of distributed jobs sharing a node",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--nodes", type=int, default=16)
    run.add_argument("--gpus-per-node", type=int, default=4)
    run.add_argument(
        "--processes", type=int, default=None, help="parallel workloads (default: one per CPU)"
    )
    run.add_argument("--output", type=Path, required=True, help="run directory to write")
    run.add_argument(
        "--tenant",
        action="append",
        type=parse_tenant,
        default=[],
        metavar="NAME[:GUARANTEE[:WEIGHT[:CAP]]]",
        help="a tenant (repeat for each); jobs go to tenants by a hash of their names",
    )
    run.add_argument(
        "--owners",
        type=int,
        default=0,
        metavar="N",
        help="give the workload's jobs to N users (user-0 …) round-robin; the users of a "
        "tenant share it alike, and each user's mean JCT is reported (default: one user, "
        "as published)",
    )
    run.add_argument(
        "--flood",
        type=parse_flood,
        default=None,
        metavar="COUNT[@SECONDS]",
        help="a user 'flood' also submits COUNT copies of the workload's jobs at once, at "
        "SECONDS (default 0); the workload's jobs are then user-0's unless --owners says",
    )
    compare = sub.add_parser(
        "compare", help="compare run directories with each other and with the published results"
    )
    compare.add_argument("runs", nargs="+", type=Path, help="run directories")
    compare.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="folder of published <policy>-<load>.json results (default: the "
        "bundled paper-results)",
    )
    compare.add_argument("--no-reference", action="store_true", help="compare runs only")
    compare.add_argument("--plot", type=Path, default=None, help="write a JCT-vs-load PNG here")
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "compare":
            reference = (
                None
                if args.no_reference
                else (args.reference or default_data_root() / "paper-results")
            )
            print(compare_main(args.runs, reference, args.plot))
            return 0
        apps = (
            [load_application(p) for p in args.apps]
            if args.apps
            else list(load_applications(default_data_root() / "traces").values())
        )
        for app in apps:
            print_fit(app, args.max_nodes, SyncModel(args.sync_model))
    except (TraceFormatError, GoodputError, ReportError, ValueError, FileNotFoundError) as err:
        print(f"pollux-sim: error: {err}", file=sys.stderr)
        return 2
    return 0


def parse_tenant(text: str) -> TenantSpec:
    """A `TenantSpec` from NAME[:GUARANTEE[:WEIGHT[:CAP]]], e.g. "research:16:2:32"."""
    parts = text.split(":")
    if not parts[0] or len(parts) > 4:
        raise argparse.ArgumentTypeError(f"expected NAME[:GUARANTEE[:WEIGHT[:CAP]]], got {text!r}")
    try:
        guarantee = int(parts[1]) if len(parts) > 1 else 0
        weight = float(parts[2]) if len(parts) > 2 else 1.0
        cap = int(parts[3]) if len(parts) > 3 else None
        return TenantSpec(parts[0], guarantee, weight, cap)
    except ValueError as err:  # PolicyInputError is a ValueError too
        raise argparse.ArgumentTypeError(f"tenant {text!r}: {err}") from None


def parse_flood(text: str) -> Flood:
    """A `Flood` from COUNT[@SECONDS], e.g. "100@3600"."""
    try:
        return Flood.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _run(args: argparse.Namespace) -> int:
    spec = spec_for(
        args.policy,
        interval=args.interval,
        event_delay=args.event_delay,
        event_rounds=args.event_rounds,
        interference=args.interference,
        seed=args.seed,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        tenants=tuple(args.tenant),
        owners=args.owners,
        flood=args.flood,
    )
    summary = run(
        args.workload, spec, args.output, processes=args.processes, progress=stderr_progress
    )
    for name, avg in summary["avgs"].items():
        print(f"{name}: average JCT {avg:.1f} s")
    for user, figures in summary.get("users", {}).items():
        print(f"user {user}: mean JCT {figures['mean_jct']:.1f} s over {figures['jobs']:.0f} jobs")
    print(f"mean of workload averages: {summary['mean']:.1f} s  (written to {args.output})")
    return 0


def print_fit(app: ApplicationTrace, max_nodes: int, sync_model: SyncModel) -> None:
    """Fit one application and print parameters, held-out error and speedups."""
    rows = ThroughputTrace.concat(app.placements, app.scalability)
    train = rows.select(rows.num_nodes <= max_nodes).mean_by_configuration()
    test = rows.select(rows.num_nodes > max_nodes)
    if len(train) == 0:
        raise TraceFormatError(Path(app.name), f"no placements with ≤ {max_nodes} nodes to fit")
    fit = fit_perf_params(
        train.num_nodes,
        train.num_replicas,
        train.atomic_bsz,
        train.accum_time,
        train.step_time,
        sync_model=sync_model,
    )
    p = fit.params
    print(
        f"== {app.name}: {len(train)} configurations with ≤ {max_nodes} nodes, "
        f"{sync_model.value} sync model, {'converged' if fit.converged else 'NOT converged'}"
    )
    print(f"   compute  alpha_c={p.alpha_c:.4g} s  beta_c={p.beta_c:.4g} s/sample")
    print(
        f"   network  alpha_n={p.alpha_n:.4g} s  beta_n={p.beta_n:.4g} s   "
        f"local alpha_r={p.alpha_r:.4g} s  beta_r={p.beta_r:.4g} s   gamma={p.gamma:.3g}"
    )
    if fit.pinned:
        pinned = ", ".join(sorted(fit.pinned))
        print(f"   pinned (not identifiable from these placements): {pinned}")
    if len(test):
        _, predicted = step_times(p, test.num_nodes, test.num_replicas, test.atomic_bsz)
        err = np.abs(predicted - test.step_time) / test.step_time * 100
        print(
            f"   step-time error on {len(test)} rows with > {max_nodes} nodes: "
            f"median {np.median(err):.1f} %, p90 {np.percentile(err, 90):.1f} %"
        )

    run = app.validation[app.init_batch_size]
    epoch = len(run.grad_sqr) // 2
    grad = GradParams(sqr=max(float(run.grad_sqr[epoch]), 0.0), var=float(run.grad_var[epoch]))
    low, high = app.atomic_bsz_range
    model = GoodputModel(
        p,
        grad,
        init_batch_size=app.init_batch_size,
        max_batch_size=app.max_batch_size,
        min_atomic_bsz=low,
        max_atomic_bsz=high,
        accumulation=True,
    )
    table = speedup_table(model, max_nodes=16, max_replicas=64, gpus_per_node=4)
    columns = [1, 2, 4, 8, 16, 32, 64]
    print(
        f"   speedup over one GPU at epoch {epoch} (noise scale var/sqr = "
        f"{grad.noise_scale:.3g}; M0={app.init_batch_size}, max batch {app.max_batch_size}):"
    )
    print("        " + "".join(f"K={k:<6}" for k in columns))
    for n in (1, 2, 4, 8, 16):
        cells = "".join(f"{table[n, k]:<8.2f}" if table[n, k] > 0 else " " * 8 for k in columns)
        print(f"   N={n:<3} {cells}")
    n_best, k_best = np.unravel_index(np.argmax(table), table.shape)
    choice = best_batch(model, int(n_best), int(k_best))
    m, s = int(choice.atomic_bsz), int(choice.accum_steps)
    print(
        f"   best allocation: {k_best} GPUs on {n_best} nodes, per-GPU batch {m} × "
        f"{s + 1} micro-batches = total {k_best * m * (s + 1)}, speedup {table.max():.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
