"""Running workloads (one or a directory of them, in parallel) and writing run directories.

A run directory holds `run.json` (settings), `summary.json` (the published format: per-job JCTs,
per-workload averages and their mean; with several users, also each user's mean JCT) and one
`<workload>.jsonl` per workload with a record per scheduling round. `pollux-sim compare` reads
them back (`pollux.sim.report`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pollux.policy.registry import PolicySpec, make_policy
from pollux.sim.application import load_published_applications
from pollux.sim.simulator import SimConfig, simulate
from pollux.sim.traces import default_data_root
from pollux.sim.workload import (
    Flood,
    WorkloadJob,
    assign_owners,
    assign_tenants,
    load_workload,
)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What to simulate: a policy (name and settings), on a cluster, with the simulator's settings.

    The policy's restart delay is the simulator's (`SimConfig.restart_delay`), set by
    `spec_for`. `owners`: give the workload's jobs to that many users round-robin
    (`assign_owners`; 0: the one user of the published workloads, "user-0" beside a
    flood); `flood`: a user who adds a backlog (`Flood`).
    """

    policy: PolicySpec
    config: SimConfig
    owners: int = 0
    flood: Flood | None = None

    @property
    def users(self) -> bool:
        """Whether the jobs have several users (each user's mean JCT is then reported)."""
        return self.owners > 1 or self.flood is not None


def workload_files(target: Path) -> list[Path]:
    """The workload CSVs of a file or a directory, in natural order (workload-2 before -10)."""
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise FileNotFoundError(f"{target}: no such workload file or directory")
    files = sorted(target.glob("*.csv"), key=lambda p: _natural(p.stem))
    if not files:
        raise FileNotFoundError(f"{target}: no *.csv workloads")
    return files


def infer_load(target: Path) -> str | None:
    """Job load of a published workload folder: workloads → 1.0, workloads-0.5 → 0.5."""
    folder = target if target.is_dir() else target.parent
    match = re.fullmatch(r"workloads(?:-(\d+(?:\.\d+)?))?", folder.name)
    if not match:
        return None
    return match.group(1) or "1.0"


def workload_for(path: Path, spec: RunSpec) -> list[WorkloadJob]:
    """The workload file `path` as `spec` runs it: its owners, flood and tenants assigned.

    With tenants configured and a workload that names none, jobs go to tenants by a hash of
    their names (`assign_tenants`).
    """
    workload = load_workload(path)
    if spec.owners or spec.flood is not None:
        workload = assign_owners(workload, max(spec.owners, 1))
    if spec.flood is not None:
        workload = spec.flood.added_to(workload)
    tenants = spec.config.tenants
    if tenants and not any(job.tenant for job in workload):
        workload = assign_tenants(workload, [t.name for t in tenants])
    return workload


def run_one(path: Path, spec: RunSpec, log_path: Path | None) -> dict[str, float]:
    """Simulate one workload (`workload_for`); its JCTs. Writes the per-round log if asked."""
    return _simulate(workload_for(path, spec), spec, log_path)


def _simulate(
    workload: list[WorkloadJob], spec: RunSpec, log_path: Path | None
) -> dict[str, float]:
    policy = make_policy(spec.policy)
    apps = load_published_applications(default_data_root() / "traces")
    if log_path is None:
        return simulate(workload, apps, policy, spec.config).jcts
    with log_path.open("w") as log:

        def write(record: dict[str, Any]) -> None:
            log.write(json.dumps(record, separators=(",", ":")) + "\n")

        return simulate(workload, apps, policy, spec.config, on_round=write).jcts


Result = tuple[str, dict[str, float], dict[str, str]]
"""One workload's name, its JCT by job and its owner by job."""


def _run_entry(args: tuple[Path, RunSpec, Path | None]) -> Result:
    path, spec, log_path = args
    workload = workload_for(path, spec)
    return path.stem, _simulate(workload, spec, log_path), {j.name: j.owner for j in workload}


def run(
    target: Path,
    spec: RunSpec,
    output: Path,
    *,
    processes: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Simulate every workload of `target` and write the run directory `output`.

    Returns:
        summary.json's content: "jcts", "avgs", "mean" and, with several users (`RunSpec.users`),
        "users": each user's job count and mean JCT over the jobs of every workload.
    """
    files = workload_files(target)
    output.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tasks = [(path, spec, output / f"{path.stem}.jsonl") for path in files]
    jcts: dict[str, dict[str, float]] = {}
    owners: dict[str, dict[str, str]] = {}
    workers = max(1, min(processes or os.cpu_count() or 1, len(tasks)))
    if workers == 1:
        results = map(_run_entry, tasks)
        for name, result, owned in results:
            jcts[name], owners[name] = result, owned
            _report(progress, name, result, len(jcts), len(tasks), started)
    else:
        # One process per workload already fills the CPUs; BLAS threads in each would only
        # spin against each other (measured: 2 workloads on 2 cores, 193 s → 25 s).
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for name, result, owned in pool.imap_unordered(_run_entry, tasks):
                jcts[name], owners[name] = result, owned
                _report(progress, name, result, len(jcts), len(tasks), started)
    ordered = {name: jcts[name] for name in sorted(jcts, key=_natural)}
    avgs = {name: sum(v.values()) / len(v) for name, v in ordered.items()}
    summary: dict[str, Any] = {
        "jcts": ordered,
        "avgs": avgs,
        "mean": sum(avgs.values()) / len(avgs),
    }
    if spec.users:
        summary["users"] = per_user(ordered, owners)
    (output / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    info = {
        "policy": spec.policy.name,
        "mode": spec.config.timing,
        "load": infer_load(target),
        "interval": spec.config.interval,
        "event_delay": spec.config.event_delay,
        "event_rounds": spec.config.event_rounds,
        "interference": spec.config.interference,
        "seed": spec.config.seed,
        "nodes": spec.config.nodes,
        "gpus_per_node": spec.config.gpus_per_node,
        "sync_model": spec.config.sync_model.value,
        "workloads": list(ordered),
        **({"tenants": [asdict(t) for t in spec.config.tenants]} if spec.config.tenants else {}),
        **({"owners": spec.owners} if spec.owners else {}),
        **({"flood": asdict(spec.flood)} if spec.flood is not None else {}),
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    (output / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    return summary


def per_user(
    jcts: dict[str, dict[str, float]], owners: dict[str, dict[str, str]]
) -> dict[str, dict[str, float]]:
    """Each owner's job count ("jobs") and mean JCT ("mean_jct", s) over every workload's jobs."""
    mine: dict[str, list[float]] = {}
    for workload, per_job in jcts.items():
        for job, jct in per_job.items():
            mine.setdefault(owners[workload][job], []).append(jct)
    return {
        owner: {"jobs": len(values), "mean_jct": sum(values) / len(values)}
        for owner, values in sorted(mine.items(), key=lambda item: _natural(item[0]))
    }


def spec_for(
    policy: str, *, owners: int = 0, flood: Flood | None = None, **overrides: Any
) -> RunSpec:
    """A RunSpec for policy `policy` (a registry name) with simulator overrides (interval …).

    Raises:
        PolicySpecError: `policy` names no policy (the message lists those that exist).
    """
    config = replace(SimConfig(), **overrides)
    spec = PolicySpec.parse(policy, restart_delay_s=config.restart_delay)
    return RunSpec(spec, config, owners, flood)


def _report(
    progress: Callable[[str], None] | None,
    name: str,
    jcts: dict[str, float],
    done: int,
    total: int,
    started: float,
) -> None:
    if progress is not None:
        avg = sum(jcts.values()) / len(jcts)
        progress(
            f"[{done}/{total}] {name}: average JCT {avg:.1f} s "
            f"({time.perf_counter() - started:.0f} s elapsed)"
        )


def _natural(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def stderr_progress(line: str) -> None:
    """Progress lines for an interactive terminal (silent when stderr is not a TTY)."""
    if sys.stderr.isatty():
        print(line, file=sys.stderr, flush=True)
