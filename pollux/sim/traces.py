"""Readers for the published Pollux traces (files listed in data/pollux-osdi21/README.md).

Plain csv parsing into frozen dataclasses of numpy arrays. A malformed file raises
`TraceFormatError` naming the file, line and column, so a bad trace fails loudly instead of
skewing a simulation.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pollux import checks

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DATA_ENV = "POLLUX_DATA"
_VALIDATION = re.compile(r"^validation-(\d+)\.csv$")


class TraceFormatError(ValueError):
    """A trace file is missing or malformed.

    Attributes:
        path: The offending file.
        line: 1-based line number, or None for whole-file problems.
    """

    def __init__(self, path: Path, problem: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True)
class ThroughputTrace:
    """Measured step times, one row per measurement.

    Attributes:
        placement: Per-node replica counts as a digit string ("1224"), or "" where the source
            (scalability.csv) records only the node and replica counts.
        num_nodes: N per row.
        num_replicas: K per row.
        atomic_bsz: Per-GPU batch m per row.
        step_time: Seconds of an optimizer step (with gradient sync) per row.
        sync_time: Seconds of that step spent waiting for the all-reduce per row.
    """

    placement: tuple[str, ...]
    num_nodes: IntArray
    num_replicas: IntArray
    atomic_bsz: IntArray
    step_time: FloatArray
    sync_time: FloatArray

    def __len__(self) -> int:
        return len(self.placement)

    @property
    def accum_time(self) -> FloatArray:
        """Compute-only seconds of a micro-batch: step time minus sync wait."""
        return self.step_time - self.sync_time

    def select(self, mask: npt.NDArray[np.bool_]) -> ThroughputTrace:
        """The rows where `mask` is true."""
        return ThroughputTrace(
            placement=tuple(p for p, keep in zip(self.placement, mask, strict=True) if keep),
            num_nodes=self.num_nodes[mask],
            num_replicas=self.num_replicas[mask],
            atomic_bsz=self.atomic_bsz[mask],
            step_time=self.step_time[mask],
            sync_time=self.sync_time[mask],
        )

    def mean_by_configuration(self) -> ThroughputTrace:
        """One row per distinct (N, K, m) with mean step and sync times, as a job profile keeps.

        Placement strings are dropped ("") because rows with different placements merge.
        """
        keys = np.stack([self.num_nodes, self.num_replicas, self.atomic_bsz], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        counts = np.bincount(inverse)
        return ThroughputTrace(
            placement=("",) * len(unique),
            num_nodes=unique[:, 0],
            num_replicas=unique[:, 1],
            atomic_bsz=unique[:, 2],
            step_time=np.bincount(inverse, weights=self.step_time) / counts,
            sync_time=np.bincount(inverse, weights=self.sync_time) / counts,
        )

    @staticmethod
    def concat(*traces: ThroughputTrace) -> ThroughputTrace:
        """Rows of all `traces`, in order."""
        return ThroughputTrace(
            placement=tuple(p for t in traces for p in t.placement),
            num_nodes=np.concatenate([t.num_nodes for t in traces]),
            num_replicas=np.concatenate([t.num_replicas for t in traces]),
            atomic_bsz=np.concatenate([t.atomic_bsz for t in traces]),
            step_time=np.concatenate([t.step_time for t in traces]),
            sync_time=np.concatenate([t.sync_time for t in traces]),
        )


@dataclass(frozen=True, slots=True)
class ValidationRun:
    """One training run at a fixed total batch size, one row per epoch.

    Attributes:
        batch_size: Total batch size M of the run.
        progress: Cumulative progress at the end of each epoch (M0-equivalent steps).
        iteration: Cumulative optimizer steps at the end of each epoch.
        metric: Validation metric after each epoch.
        grad_sqr: Gradient-norm statistic during each epoch.
        grad_var: Gradient-variance statistic during each epoch (normalised to M0).
    """

    batch_size: int
    progress: FloatArray
    iteration: FloatArray
    metric: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray


@dataclass(frozen=True, slots=True)
class ApplicationTrace:
    """All traces of one application.

    Attributes:
        name: Application name (the directory name).
        placements: Rows of placements.csv (1–4 nodes).
        scalability: Rows of scalability.csv (larger clusters).
        validation: Runs keyed by total batch size, ascending.
    """

    name: str
    placements: ThroughputTrace
    scalability: ThroughputTrace
    validation: dict[int, ValidationRun]

    @property
    def init_batch_size(self) -> int:
        """M0: the smallest validated total batch size."""
        return min(self.validation)

    @property
    def max_batch_size(self) -> int:
        """The largest validated total batch size."""
        return max(self.validation)

    @property
    def atomic_bsz_range(self) -> tuple[int, int]:
        """(min, max) per-GPU batch size measured in placements.csv."""
        return int(self.placements.atomic_bsz.min()), int(self.placements.atomic_bsz.max())


def default_data_root() -> Path:
    """The published data set: `$POLLUX_DATA`, else the copy in this source tree."""
    env = os.environ.get(DATA_ENV)
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "data" / "pollux-osdi21"
    if not (root / "traces").is_dir():
        raise TraceFormatError(
            root,
            f"no traces/ directory here; set ${DATA_ENV} to the folder "
            "that holds traces/ and workloads/",
        )
    return root


def load_application(directory: Path | str) -> ApplicationTrace:
    """Read placements.csv, scalability.csv and every validation-<M>.csv of one application."""
    path = Path(directory)
    if not path.is_dir():
        raise TraceFormatError(path, "not a directory of application traces")
    runs = {}
    for entry in sorted(path.iterdir()):
        match = _VALIDATION.match(entry.name)
        if match:
            runs[int(match.group(1))] = _read_validation(entry, int(match.group(1)))
    if not runs:
        raise TraceFormatError(path, "no validation-<batch size>.csv files")
    return ApplicationTrace(
        name=path.name,
        placements=_read_placements(path / "placements.csv"),
        scalability=_read_scalability(path / "scalability.csv"),
        validation=dict(sorted(runs.items())),
    )


def load_applications(traces_dir: Path | str) -> dict[str, ApplicationTrace]:
    """Every application under a traces/ directory, keyed by name."""
    root = Path(traces_dir)
    apps = {p.name: load_application(p) for p in sorted(root.iterdir()) if p.is_dir()}
    if not apps:
        raise TraceFormatError(root, "no application directories")
    return apps


def _rows(path: Path, header: list[str]) -> list[tuple[int, list[str]]]:
    if not path.is_file():
        raise TraceFormatError(path, "file not found")
    with path.open(newline="") as f:
        reader = csv.reader(f)
        first = next(reader, None)
        if first != header:
            raise TraceFormatError(path, f"header must be {','.join(header)}, got {first}", 1)
        rows = [(i, row) for i, row in enumerate(reader, start=2) if row]
    for line, row in rows:
        if len(row) != len(header):
            raise TraceFormatError(path, f"expected {len(header)} columns, got {len(row)}", line)
    if not rows:
        raise TraceFormatError(path, "no data rows")
    return rows


def _number(path: Path, line: int, column: str, text: str, *, integer: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise TraceFormatError(path, f"{column}={text!r} is not a number", line) from None

    def error(problem: checks.Problem) -> TraceFormatError:
        return TraceFormatError(path, f"{column}={text!r} {problem.requirement}", line)

    if integer:
        return checks.whole_number(value, least=0, error=error)
    return checks.real_number(value, least=0, error=error)


def _read_placements(path: Path) -> ThroughputTrace:
    header = ["placement", "local_bsz", "step_time", "sync_time"]
    placement, nodes, replicas, bsz, step, sync = [], [], [], [], [], []
    for line, (p, m, st, sy) in _rows(path, header):
        if not p.isdigit() or "0" in p:
            raise TraceFormatError(path, f"placement={p!r} must be digits 1-9, one per node", line)
        placement.append(p)
        nodes.append(len(p))
        replicas.append(sum(int(c) for c in p))
        bsz.append(_number(path, line, "local_bsz", m, integer=True))
        step.append(_number(path, line, "step_time", st))
        sync.append(_number(path, line, "sync_time", sy))
    return _throughput(path, tuple(placement), nodes, replicas, bsz, step, sync)


def _read_scalability(path: Path) -> ThroughputTrace:
    header = ["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"]
    nodes, replicas, bsz, step, sync = [], [], [], [], []
    for line, (n, k, m, st, sy) in _rows(path, header):
        nodes.append(_number(path, line, "num_nodes", n, integer=True))
        replicas.append(_number(path, line, "num_replicas", k, integer=True))
        if not 1 <= nodes[-1] <= replicas[-1]:
            raise TraceFormatError(path, f"need 1 ≤ num_nodes ≤ num_replicas, got {n}, {k}", line)
        bsz.append(_number(path, line, "local_bsz", m, integer=True))
        step.append(_number(path, line, "step_time", st))
        sync.append(_number(path, line, "sync_time", sy))
    return _throughput(path, ("",) * len(nodes), nodes, replicas, bsz, step, sync)


def _throughput(
    path: Path,
    placement: tuple[str, ...],
    nodes: list[int] | list[float],
    replicas: list[int] | list[float],
    bsz: list[float],
    step: list[float],
    sync: list[float],
) -> ThroughputTrace:
    trace = ThroughputTrace(
        placement=placement,
        num_nodes=np.array(nodes, dtype=np.int64),
        num_replicas=np.array(replicas, dtype=np.int64),
        atomic_bsz=np.array(bsz, dtype=np.int64),
        step_time=np.array(step, dtype=np.float64),
        sync_time=np.array(sync, dtype=np.float64),
    )
    if np.any(trace.atomic_bsz < 1) or np.any(trace.step_time <= 0):
        raise TraceFormatError(path, "local_bsz must be ≥ 1 and step_time > 0 on every row")
    if np.any(trace.sync_time >= trace.step_time):
        raise TraceFormatError(path, "sync_time must be less than step_time on every row")
    return trace


def _read_validation(path: Path, batch_size: int) -> ValidationRun:
    header = ["progress", "iteration", "metric", "grad_sqr", "grad_var"]
    cols: list[list[float]] = [[] for _ in header]
    for line, row in _rows(path, header):
        for col, name, text in zip(cols, header, row, strict=True):
            value = _number(path, line, name, text) if name != "metric" else float(text)
            col.append(value)
    progress, iteration, metric, sqr, var = (np.array(c, dtype=np.float64) for c in cols)
    if np.any(np.diff(progress) < 0):
        raise TraceFormatError(path, "progress must not decrease from one epoch to the next")
    return ValidationRun(batch_size, progress, iteration, metric, sqr, var)
