"""Throughput-model accuracy on held-out placements of the published traces.

For each application, fit on placements that use at most 2 nodes (mean time per configuration,
as a job's profile holds it) and predict the step time of every placement on ≥ 3 nodes and
every scalability.csv row (up to 16 nodes × 64 GPUs). Prints, per application and overall, the
median and 90th-percentile absolute percentage error of our fit (ring sync model, checked
multi-start) beside the published procedure (linear sync model, one start, §1.4), then a
second protocol that mirrors how the scheduler explores (fit on K ≤ k, predict k < K ≤ 2k),
the time to fit, and the time to compute a full 64×64 speedup table.

Usage: python benchmarks/model_accuracy.py [--data DIR]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pollux.goodput import (
    GoodputModel,
    GradParams,
    PerfParams,
    SyncModel,
    fit_perf_params,
    speedup_table,
    step_times,
)
from pollux.sim.traces import (
    ApplicationTrace,
    ThroughputTrace,
    default_data_root,
    load_applications,
)

Fitter = Callable[[ThroughputTrace], PerfParams]


def fit_ours(trace: ThroughputTrace) -> PerfParams:
    return fit_perf_params(
        trace.num_nodes,
        trace.num_replicas,
        trace.atomic_bsz,
        trace.accum_time,
        trace.step_time,
        sync_model=SyncModel.RING,
    ).params


def fit_published(trace: ThroughputTrace) -> PerfParams:
    return fit_perf_params(
        trace.num_nodes,
        trace.num_replicas,
        trace.atomic_bsz,
        trace.accum_time,
        trace.step_time,
        sync_model=SyncModel.LINEAR,
        max_starts=1,
    ).params


FITTERS: dict[str, Fitter] = {"ours": fit_ours, "published": fit_published}


def percent_errors(params: PerfParams, test: ThroughputTrace) -> np.ndarray:
    _, predicted = step_times(params, test.num_nodes, test.num_replicas, test.atomic_bsz)
    return np.asarray(np.abs(predicted - test.step_time) / test.step_time * 100)


def node_split(app: ApplicationTrace) -> tuple[ThroughputTrace, ThroughputTrace]:
    p = app.placements
    train = p.select(p.num_nodes <= 2).mean_by_configuration()
    test = ThroughputTrace.concat(p.select(p.num_nodes >= 3), app.scalability)
    return train, test


def doubling_splits(app: ApplicationTrace) -> list[tuple[ThroughputTrace, ThroughputTrace]]:
    everything = ThroughputTrace.concat(app.placements, app.scalability)
    k = everything.num_replicas
    return [
        (
            everything.select(k <= top).mean_by_configuration(),
            everything.select((k > top) & (k <= 2 * top)),
        )
        for top in (2, 4, 8, 16, 32)
    ]


def summary(errors: np.ndarray) -> str:
    return f"{np.median(errors):7.1f} {np.percentile(errors, 90):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder holding traces/ (default: the published data set)",
    )
    args = parser.parse_args()
    root = args.data or default_data_root()
    apps = load_applications(root / "traces")

    print(
        "Fit on placements with ≤ 2 nodes; predict step time on ≥ 3-node placements and "
        "scalability.csv (absolute % error)"
    )
    print(
        f"{'application':<12} {'train':>5} {'test':>5} | {'ours median':>11} {'p90':>7} | "
        f"{'published median':>16} {'p90':>7}"
    )
    totals: dict[str, list[np.ndarray]] = {name: [] for name in FITTERS}
    fit_seconds: dict[str, list[float]] = {name: [] for name in FITTERS}
    for name, app in apps.items():
        train, test = node_split(app)
        cells = []
        for fitter_name, fitter in FITTERS.items():
            start = time.perf_counter()
            params = fitter(train)
            fit_seconds[fitter_name].append(time.perf_counter() - start)
            errors = percent_errors(params, test)
            totals[fitter_name].append(errors)
            cells.append(summary(errors))
        print(f"{name:<12} {len(train):>5} {len(test):>5} | {cells[0]:>19} | {cells[1]:>24}")
    overall = {n: np.concatenate(v) for n, v in totals.items()}
    print(
        f"{'overall':<12} {'':>5} {len(overall['ours']):>5} | {summary(overall['ours']):>19} | "
        f"{summary(overall['published']):>24}"
    )

    print("\nScheduler-style exploration: fit on K ≤ k, predict k < K ≤ 2k (k = 2 … 32), all apps")
    for fitter_name, fitter in FITTERS.items():
        errors = np.concatenate(
            [
                percent_errors(fitter(train), test)
                for app in apps.values()
                for train, test in doubling_splits(app)
            ]
        )
        print(
            f"  {fitter_name:<10} median {np.median(errors):5.1f} %   p90 "
            f"{np.percentile(errors, 90):5.1f} %   ({errors.size} predictions)"
        )

    print(
        "\nFit time per application (ms): "
        + ", ".join(f"{n} median {np.median(s) * 1e3:.1f}" for n, s in fit_seconds.items())
    )

    cifar_train, _ = (
        node_split(apps["cifar10"]) if "cifar10" in apps else node_split(next(iter(apps.values())))
    )
    model = GoodputModel(
        fit_ours(cifar_train),
        GradParams(sqr=1.0, var=10.0),
        init_batch_size=128,
        max_batch_size=4096,
        min_atomic_bsz=32,
        max_atomic_bsz=1024,
        accumulation=True,
    )
    speedup_table(model, 64, 64)  # warm-up
    samples = []
    for _ in range(200):
        start = time.perf_counter()
        speedup_table(model, 64, 64)
        samples.append(time.perf_counter() - start)
    print(
        f"Full 64×64 speedup table (N ≤ 64 nodes, K ≤ 64 replicas, 50 batch candidates each): "
        f"median {np.median(samples) * 1e3:.2f} ms, p95 {np.percentile(samples, 95) * 1e3:.2f} ms"
    )
    print(f"published fitting (§1.4) overall median error: {np.median(overall['published']):.1f} %")
    print(f"overall median error: {np.median(overall['ours']):.1f} %")


if __name__ == "__main__":
    main()
