"""Reproduce the paper's simulator table: 3 policies × 3 job loads × 8 workloads.

Runs `pollux.sim` exactly as `pollux-sim run` does (one process per workload), then prints the
`pollux-sim compare` table against the published results and, per policy and load, our mean
JCT over the 8 workloads next to the published one. The last line is the total wall time.
`--workloads 6` runs a subset (its mean is then not comparable with the published one).

    python benchmarks/paper_table.py [--output DIR] [--policies pollux,tiresias] [--loads 1.0]
    python benchmarks/paper_table.py --loads 1.0 --workloads 6 --processes 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pollux.sim.report import compare_main
from pollux.sim.runner import run, spec_for, stderr_progress
from pollux.sim.traces import default_data_root

LOADS = ("0.5", "1.0", "1.5")
PAPER_POLICIES = ("pollux", "optimus", "tiresias")
"""The policies of the paper's table (`pollux` is Pollux as published)."""


def _workloads(load: str, numbers: list[int], scratch: Path) -> Path:
    """The published workloads of `load`, or a folder holding only those `numbers`."""
    name = "workloads" if load == "1.0" else f"workloads-{load}"
    folder = default_data_root() / name
    if not numbers:
        return folder
    # The folder's name keeps the load readable (`pollux.sim.runner.infer_load`).
    subset = scratch / name
    subset.mkdir(parents=True, exist_ok=True)
    for number in numbers:
        shutil.copy(folder / f"workload-{number}.csv", subset)
    return subset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="keep run directories here (default: temp)")
    parser.add_argument(
        "--policies", default=",".join(PAPER_POLICIES), help="registry names, comma-separated"
    )
    parser.add_argument("--loads", default=",".join(LOADS))
    parser.add_argument(
        "--workloads", default="", help="published workload numbers, e.g. 6 (default: all 8)"
    )
    parser.add_argument("--processes", type=int, default=None, help="default: one per CPU")
    parser.add_argument("--plot", type=Path, help="write the JCT-vs-load PNG here")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    loads = [load for load in args.loads.split(",") if load]
    numbers = sorted({int(x) for x in args.workloads.split(",") if x})
    reference = default_data_root() / "paper-results"

    with tempfile.TemporaryDirectory(prefix="pollux-paper-") as scratch:
        root = args.output or Path(scratch)
        started = time.perf_counter()
        dirs: list[Path] = []
        rows: list[tuple[str, str, float, float | None, float]] = []
        for policy in policies:
            for load in loads:
                out = root / f"{policy}-{load}"
                t0 = time.perf_counter()
                summary = run(
                    _workloads(load, numbers, root / f"inputs-{load}"),
                    spec_for(policy),
                    out,
                    processes=args.processes,
                    progress=stderr_progress,
                )
                wall = time.perf_counter() - t0
                published = _published_mean(reference / f"{policy}-{load}.json")
                rows.append((policy, load, float(summary["mean"]), published, wall))
                dirs.append(out)
                print(f"{policy} {load}x: {summary['mean']:.1f} s in {wall:.0f} s", file=sys.stderr)
        total = time.perf_counter() - started
        print(compare_main(dirs, reference, args.plot))
        print()
        print(f"{'policy':<10}{'load':>6}{'ours (s)':>12}{'published':>12}{'ratio':>8}{'wall':>8}")
        for policy, load, ours, published, wall in rows:
            ratio = f"{ours / published:.3f}" if published else "-"
            pub = f"{published:.1f}" if published else "-"
            print(f"{policy:<10}{load:>6}{ours:>12.1f}{pub:>12}{ratio:>8}{wall:>7.0f}s")
        print(f"total wall time: {total:.0f} s")
    return 0


def _published_mean(path: Path) -> float | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return float(data["mean"])


if __name__ == "__main__":
    sys.exit(main())
