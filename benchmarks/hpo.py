"""Hyper-parameter search in the simulator: trials sized by Pollux against 4 GPUs per trial.

Pollux §5.4's setting: 100 TPE trials of CIFAR-10 ResNet-18 (published traces), 4 at a time
on 16 GPUs, 60 s rounds. Schemes: pollux (adaptive trials; --policy), fixed (4 GPUs per trial
at M0 = 128, placed by Tiresias), fixed-tuned (4 GPUs at the batch that finishes soonest). The
sweep is the real driver (`pollux.hpo.driver.run_sweep`, Optuna TPE, seed 0) over
`pollux.sim.trials.SimTrials`; a trial reports the trace's accuracy less a synthetic penalty
of its parameters, which steers TPE but changes no trial's length. Prints mean trial JCT and
makespan.

    python benchmarks/hpo.py [--trials 100] [--concurrency 4] [--policy pollux]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor

import optuna

from pollux.hpo.driver import run_sweep
from pollux.hpo.spec import ParamValue, SweepSpec
from pollux.policy.registry import POLICY_NAMES, PolicySpec, make_policy
from pollux.sim.application import Application, load_published_applications
from pollux.sim.autoscaling import AutoscaleConfig, ElasticCluster
from pollux.sim.simulator import SimConfig
from pollux.sim.traces import default_data_root
from pollux.sim.trials import SimTrials

GPUS_PER_TRIAL = 4
SCHEMES = ("pollux", "fixed", "fixed-tuned")


def objective(params: Mapping[str, ParamValue], accuracy: float) -> float:
    """The trace's accuracy less a penalty for straying from lr = 0.1, momentum = 0.9."""
    lr = float(params["lr"])
    momentum = float(params["momentum"])
    return accuracy - 0.05 * math.log10(lr / 0.1) ** 2 - 0.5 * (momentum - 0.9) ** 2


def best_fixed_batch(app: Application, gpus: int) -> int:
    """The validated batch size that finishes a whole run soonest on `gpus` GPUs (one node)."""

    def seconds(batch: int) -> float:
        steps = app.iteration(batch, app.completion_epoch)
        return steps * app.consolidated_step_time(gpus, batch, 4)

    return min((int(b) for b in app.batch_sizes), key=seconds)


def sweep(trials: int, concurrency: int, job: Mapping[str, object]) -> SweepSpec:
    return SweepSpec.from_mapping(
        {
            "name": "cifar10",
            "objective": {"metric": "accuracy", "direction": "maximize"},
            "trials": trials,
            "concurrency": concurrency,
            "sampler": {"name": "tpe", "seed": 0},
            "pruner": {"name": "none"},
            "parameters": {
                "lr": {"type": "float", "low": 0.001, "high": 1.0, "log": True},
                "momentum": {"type": "float", "low": 0.5, "high": 0.99},
            },
            "job": dict(job),
        }
    )


def run(scheme: str, policy_name: str, trials: int, concurrency: int) -> dict[str, float]:
    apps = load_published_applications(default_data_root() / "traces")
    app = apps["cifar10"]
    if scheme == "pollux":
        policy = make_policy(PolicySpec(policy_name))
        job: dict[str, object] = {"application": "cifar10"}
    else:
        policy = make_policy(PolicySpec("tiresias"))
        tuned = scheme == "fixed-tuned"
        batch = best_fixed_batch(app, GPUS_PER_TRIAL) if tuned else app.init_batch_size
        job = {"application": "cifar10", "num_replicas": GPUS_PER_TRIAL, "batch_size": batch}
    cluster = ElasticCluster(apps, policy, SimConfig(), AutoscaleConfig.fixed(4))
    backend = SimTrials(cluster, "accuracy", objective)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    result = run_sweep(sweep(trials, concurrency, job), backend)
    outcome = cluster.result()
    jcts = list(outcome.sim.jcts.values())
    best = result.best
    return {
        "mean_jct": sum(jcts) / len(jcts),
        "makespan": outcome.sim.makespan,
        "utilisation": outcome.utilisation,
        "best": best.value if best and best.value is not None else math.nan,
        "batch": float(job.get("batch_size", 0) or 0),  # type: ignore[arg-type]
        "wall": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--policy", choices=POLICY_NAMES, default="pollux")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    # Each run in a fresh process with one BLAS thread: threads only spin against each other
    # on the small fits of a simulation (measured: 16x slower on 2 busy cores).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, args.processes), mp_context=spawn) as pool:
        futures = {
            s: pool.submit(run, s, args.policy, args.trials, args.concurrency) for s in SCHEMES
        }
        rows = {s: f.result() for s, f in futures.items()}
    print(
        f"{args.trials} trials, {args.concurrency} at a time, 16 GPUs (4 nodes x 4), cifar10; "
        f"pollux: policy {args.policy}; fixed: {GPUS_PER_TRIAL} GPUs per trial at batch "
        f"{rows['fixed']['batch']:.0f}, fixed-tuned at {rows['fixed-tuned']['batch']:.0f}"
    )
    print(
        f"{'scheme':<12} {'mean trial JCT':>15} {'makespan':>12} {'util':>5} {'best':>6} "
        f"{'wall':>6}"
    )
    for name, r in rows.items():
        print(
            f"{name:<12} {r['mean_jct'] / 60:>11.1f} min {r['makespan'] / 3600:>10.2f} h "
            f"{r['utilisation']:>5.2f} {r['best']:>6.3f} {r['wall']:>5.0f}s"
        )
    p = rows["pollux"]
    for base in ("fixed", "fixed-tuned"):
        f = rows[base]
        print(
            f"pollux vs {base}: mean trial JCT {p['mean_jct'] / f['mean_jct'] - 1:+.1%}, "
            f"makespan {p['makespan'] / f['makespan'] - 1:+.1%}"
        )


if __name__ == "__main__":
    main()
