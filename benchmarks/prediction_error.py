"""Completion-time predictions on the simulator: predicted at submission vs actual JCT.

Each published workload runs in the simulator under Pollux (`--policy pollux` or
`pollux-jct`). When a job first appears in a round, the cluster is forecast forward from that
round's state with the same policy (`pollux.policy.forecast`), as `pollux-cli estimate` does
live: the new job borrows the latest fitted model of an earlier job of its application and
declares its true size. Jobs whose application has no model yet get no prediction and are
counted apart. The error of a job is |predicted JCT − actual| / actual. Forecast rounds are
coarser than the simulator's (300 s by default) to bound the cost; future arrivals are unknown
to the forecast, so on a busy cluster predictions run early (the signed median says by how
much).

    python benchmarks/prediction_error.py [--policy pollux-jct] [--load 1.0] [--workloads 1,2]
        [--forecast-round 300] [--processes 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

try:
    from benchmarks.wrapped import WrappedPolicy
except ImportError:  # run as a script: this folder is on the path
    from wrapped import WrappedPolicy  # type: ignore[import-not-found, no-redef]
from pollux.goodput import GoodputModel
from pollux.policy.forecast import forecast
from pollux.policy.registry import make_policy
from pollux.policy.types import AllocationDecision, ClusterState, M, Policy
from pollux.sim.application import load_published_applications
from pollux.sim.runner import spec_for
from pollux.sim.simulator import simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import load_workload


class Predicting(WrappedPolicy[M]):
    """The simulator's policy, forecasting each job's completion at its first round."""

    def __init__(
        self, inner: Policy[M], *, round_s: float, restart_delay_s: float, max_replicas: int
    ) -> None:
        super().__init__(inner)
        self.max_replicas = max_replicas
        self.round_s = round_s
        self.restart_delay_s = restart_delay_s
        self.models: dict[str, GoodputModel] = {}
        self.seen: set[str] = set()
        self.predicted: dict[str, float] = {}
        """Predicted JCT per job (seconds from submission)."""
        self.forecast_seconds = 0.0

    def allocate(
        self, state: ClusterState, memory: M | None, rng: np.random.Generator
    ) -> AllocationDecision[M]:
        """Forecast each job new this round, then the wrapped policy's round."""
        for job in state.jobs:
            if job.model is not None:
                self.models[_application(job.name)] = job.model
        for job in state.jobs:
            if job.name in self.seen:
                continue
            self.seen.add(job.name)
            model = self.models.get(_application(job.name))
            if model is None or job.remaining_work is None or job.model is not None:
                continue
            view = replace(
                state,
                jobs=tuple(replace(j, model=model) if j is job else j for j in state.jobs),
            )
            started = time.perf_counter()
            # The simulator's caps: its max_replicas, and ncf on one GPU (its rule).
            caps = {
                j.name: 1 if _application(j.name) == "ncf" else self.max_replicas
                for j in state.jobs
            }
            result = forecast(
                view,
                self.inner,
                round_s=self.round_s,
                restart_delay_s=self.restart_delay_s,
                caps=caps,
                until=job.name,
            )
            self.forecast_seconds += time.perf_counter() - started
            if job.name in result.completion:
                self.predicted[job.name] = result.completion[job.name] - job.submission_time
        return self.inner.allocate(state, memory, rng)


def _application(name: str) -> str:
    return name.rsplit("-", 1)[0]


@dataclass(frozen=True)
class Outcome:
    """One workload's predictions."""

    workload: str
    errors: list[float]
    """Signed relative errors (predicted − actual) / actual, per predicted job."""
    jobs: int
    forecast_s: float
    wall_s: float


def run_workload(args: tuple[Path, str, float]) -> Outcome:
    path, policy_name, round_s = args
    started = time.perf_counter()
    spec = spec_for(policy_name)
    policy, config = make_policy(spec.policy), spec.config
    predicting = Predicting(
        policy,
        round_s=round_s,
        restart_delay_s=config.restart_delay,
        max_replicas=config.max_replicas,
    )
    result = simulate(load_workload(path), load_published_applications(), predicting, config)
    errors = [
        (predicted - result.jcts[name]) / result.jcts[name]
        for name, predicted in predicting.predicted.items()
        if result.jcts.get(name, 0) > 0
    ]
    return Outcome(
        path.stem,
        errors,
        len(result.jcts),
        predicting.forecast_seconds,
        time.perf_counter() - started,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="pollux", choices=("pollux", "pollux-jct"))
    parser.add_argument("--load", default="1.0", choices=("0.5", "1.0", "1.5"))
    parser.add_argument("--workloads", default="", help="e.g. 1,2 (default: all eight)")
    parser.add_argument("--forecast-round", type=float, default=300.0, help="seconds")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    folder = default_data_root() / ("workloads" if args.load == "1.0" else f"workloads-{args.load}")
    wanted = {f"workload-{w}" for w in args.workloads.split(",") if w}
    paths = sorted(
        (p for p in folder.glob("workload-*.csv") if not wanted or p.stem in wanted),
        key=lambda p: int(p.stem.split("-")[1]),
    )
    if not paths:
        print(f"no workloads under {folder}", file=sys.stderr)
        return 2
    tasks = [(p, args.policy, args.forecast_round) for p in paths]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        outcomes = pool.map(run_workload, tasks)
    errors = np.array([e for o in outcomes for e in o.errors])
    print(f"policy {args.policy}, load {args.load}x, forecast rounds {args.forecast_round:g} s")
    print(f"{'workload':<12} {'jobs':>5} {'predicted':>9} {'median |err|':>12} {'p90 |err|':>9}")
    for o in outcomes:
        err = np.abs(o.errors) if o.errors else np.array([np.nan])
        print(
            f"{o.workload:<12} {o.jobs:>5} {len(o.errors):>9} {np.median(err):>12.1%} "
            f"{np.percentile(err, 90):>9.1%}"
        )
    total = sum(o.jobs for o in outcomes)
    print(
        f"all: {len(errors)} of {total} jobs predicted at submission (the others were their "
        f"application's first); |error| median {np.median(np.abs(errors)):.1%}, "
        f"p90 {np.percentile(np.abs(errors), 90):.1%}; signed median {np.median(errors):+.1%}"
    )
    print(
        f"forecast time {sum(o.forecast_s for o in outcomes):.0f} s in "
        f"{len(errors)} forecasts; wall {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
