"""Compare simulator runs with each other and with the published Pollux results.

A reimplementation is only credible if it reproduces the paper, so `pollux-sim compare` turns run
directories (written by `pollux-sim run`) into the figures the paper reports: average and p99 job
completion time (JCT), makespan, restarts per job and GPU utilisation, side by side with the
published simulator results (data/pollux-osdi21/paper-results) and as the JCT-vs-load
plot of Fig. 8a. File reading is confined to the `load_*` functions, which validate everything
they read and raise `ReportError` naming the file; the metrics, the table and the plot are
functions of the loaded frozen dataclasses, so they can be checked on hand-made data.

Run directory layout: `run.json` (policy, round timing, load, interval, workloads), `summary.json`
(the published summary format, §7.5) and, optionally, one `<workload>.jsonl` per workload (one
record per scheduling round, §7.6, plus `num_gpus`). Without a workload's log only the JCT figures
are known; the others are None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from pollux import checks

if TYPE_CHECKING:
    from matplotlib.axes import Axes

S = TypeVar("S")
T = TypeVar("T")

ReferenceKey = tuple[str, float]
"""(policy, load) of a published result, e.g. ("pollux", 1.0)."""

PLOT_TITLE = "Average JCT vs job load (cf. Pollux paper Fig. 8a)"
_REFERENCE_FILE = re.compile(r"^(?P<policy>.+)-(?P<load>\d+(?:\.\d+)?)\.json$")
_MARKERS = ("o", "s", "^", "D", "v", "P")
_HEADERS = (
    "policy",
    "mode",
    "load",
    "workloads",
    "mean JCT (s)",
    "p99 JCT (s)",
    "makespan (s)",
    "restarts/job",
    "GPU util (%)",
    "ref mean JCT (s)",
    "JCT ratio",
    "ref p99 JCT (s)",
    "p99 ratio",
)
_LEFT_ALIGNED = 2  # policy and mode are text; every later column is a number
_TABLE_NOTE = "ratios are ours / reference; '-' = not available"


class ReportError(ValueError):
    """A run directory or reference file is missing, malformed or inconsistent.

    Attributes:
        path: The offending file or directory, or None when no file is to blame.
        problem: What is wrong.
    """

    def __init__(self, problem: str, path: Path | None = None) -> None:
        super().__init__(f"{path}: {problem}" if path is not None else problem)
        self.path = path
        self.problem = problem


class _ShapeError(Exception):
    """Decoded JSON of the wrong shape; the loader adds the file name."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The settings of a run that the report uses (from run.json).

    Attributes:
        policy: Scheduling policy (`pollux.policy.registry.POLICY_NAMES`).
        mode: How rounds were timed (`SimConfig.timing`): "periodic" is the published
            semantics (older run directories say "faithful" or "jct", the policy's mode).
        load: Job load relative to the 160-job workloads (0.5, 1.0, 1.5), or None for a
            workload set that is not one of the published loads.
        interval: Seconds between scheduling rounds.
        workloads: Workload names, e.g. ("workload-1", ...).
    """

    policy: str
    mode: str
    load: float | None
    interval: float
    workloads: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RoundUsage:
    """GPU use during one scheduling round (one log record).

    Attributes:
        timestamp: Start of the round, seconds; its allocations hold for one interval.
        num_gpus: GPUs in the cluster.
        allocated_gpus: GPUs allocated to jobs that have not completed. The published
            simulator keeps finished jobs' last allocations in rounds where no job is active;
            those GPUs do no work and are not counted.
    """

    timestamp: float
    num_gpus: int
    allocated_gpus: int


@dataclass(frozen=True, slots=True)
class FinalJob:
    """A job as the last log record describes it.

    Attributes:
        submission_time: Seconds from the start of the trace.
        num_restarts: Re-allocations after the first; None if it was never allocated.
    """

    submission_time: float
    num_restarts: int | None


@dataclass(frozen=True, slots=True)
class WorkloadLog:
    """What the report needs from a workload's per-round log.

    Attributes:
        rounds: One entry per record, in file order.
        final_jobs: Every job in the last record, by name.
    """

    rounds: tuple[RoundUsage, ...]
    final_jobs: Mapping[str, FinalJob]


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    """The outcome of one workload in one run.

    Attributes:
        name: Workload name, e.g. "workload-1".
        jcts: JCT in seconds by job name (from summary.json).
        log: The per-round log, or None when the run directory has none for this workload.
            When present, its last record lists every job in `jcts` (`load_run` checks).
    """

    name: str
    jcts: Mapping[str, float]
    log: WorkloadLog | None


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run directory, loaded.

    Attributes:
        directory: Where it was read from.
        info: Its settings.
        workloads: Its workloads, in run.json order.
    """

    directory: Path
    info: RunInfo
    workloads: tuple[WorkloadResult, ...]


@dataclass(frozen=True, slots=True)
class WorkloadMetrics:
    """The figures of one workload. The log-based ones are None when there is no log.

    Attributes:
        workload: Workload name.
        num_jobs: Jobs with a JCT.
        mean_jct: Mean JCT, seconds.
        p99_jct: 99th percentile JCT (numpy, linear interpolation), seconds.
        makespan: Seconds from the start of the trace to the last completion, i.e. the max over
            jobs of submission time + JCT (as the published plot scripts compute it).
        restarts_per_job: Mean over jobs of their final restart count (never allocated = 0).
        gpu_utilisation: Fraction in [0, 1] of the cluster's GPU-time that was allocated to
            unfinished jobs, from the first round to the last completion (`gpu_utilisation`).
    """

    workload: str
    num_jobs: int
    mean_jct: float
    p99_jct: float
    makespan: float | None
    restarts_per_job: float | None
    gpu_utilisation: float | None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The workloads of one (policy, mode, load), with their means.

    Each mean is over workloads, as the paper averages per-workload figures (§5.8). A log-based
    mean is None unless every workload has a log, so that it never mixes different workload sets.

    Attributes:
        policy: Scheduling policy.
        mode: Simulator mode.
        load: Job load, or None.
        workloads: Per-workload figures, pooled from every run with this (policy, mode, load).
    """

    policy: str
    mode: str
    load: float | None
    workloads: tuple[WorkloadMetrics, ...]

    @property
    def num_jobs(self) -> float | None:
        """Mean jobs per workload."""
        return _mean_of(w.num_jobs for w in self.workloads)

    @property
    def mean_jct(self) -> float | None:
        """Mean over workloads of the mean JCT, seconds (the paper's headline figure)."""
        return _mean_of(w.mean_jct for w in self.workloads)

    @property
    def p99_jct(self) -> float | None:
        """Mean over workloads of the p99 JCT, seconds."""
        return _mean_of(w.p99_jct for w in self.workloads)

    @property
    def makespan(self) -> float | None:
        """Mean over workloads of the makespan, seconds."""
        return _mean_of(w.makespan for w in self.workloads)

    @property
    def restarts_per_job(self) -> float | None:
        """Mean over workloads of the restarts per job."""
        return _mean_of(w.restarts_per_job for w in self.workloads)

    @property
    def gpu_utilisation(self) -> float | None:
        """Mean over workloads of the GPU utilisation, as a fraction."""
        return _mean_of(w.gpu_utilisation for w in self.workloads)


@dataclass(frozen=True, slots=True)
class ReferenceResult:
    """A published result (one `<policy>-<load>.json` in summary format).

    Attributes:
        policy: Scheduling policy.
        load: Job load.
        mean_jct: Mean over workloads of the mean JCT, seconds.
        p99_jct: Mean over workloads of the p99 JCT, seconds.
    """

    policy: str
    load: float
    mean_jct: float
    p99_jct: float


# --- Metrics -----------------------------------------------------------------------------------


def _mean_of(values: Iterable[float | None]) -> float | None:
    """Mean of `values`, or None if there are none or any is None."""
    given = list(values)
    present = [v for v in given if v is not None]
    if not present or len(present) < len(given):
        return None
    return float(np.mean(present))


def mean_jct(jcts: Mapping[str, float]) -> float:
    """Mean JCT of one workload, seconds."""
    return float(np.mean(list(jcts.values())))


def p99_jct(jcts: Mapping[str, float]) -> float:
    """99th percentile JCT of one workload (linear interpolation), seconds."""
    return float(np.percentile(list(jcts.values()), 99))


def makespan(jcts: Mapping[str, float], jobs: Mapping[str, FinalJob]) -> float:
    """Time of the last completion: max over jobs of submission time + JCT, seconds."""
    return max(jobs[name].submission_time + jct for name, jct in jcts.items())


def restarts_per_job(jcts: Mapping[str, float], jobs: Mapping[str, FinalJob]) -> float:
    """Mean final restart count of the jobs in `jcts`; a never-allocated job counts 0."""
    counts = [jobs[name].num_restarts for name in jcts]
    return float(np.mean([0 if n is None else n for n in counts]))


def gpu_utilisation(rounds: Sequence[RoundUsage], interval: float, end: float) -> float | None:
    """Fraction of the cluster's GPU-time allocated to unfinished jobs.

    Utilisation = Σ_rounds allocated GPUs × held time ÷ (num_gpus × span), where span runs from
    the first round to `end` (the last completion) and a round's allocation is held for one
    interval, cut at `end` so that a final partial round counts only up to the last completion.
    A job finishing inside a round keeps its GPUs to the round's end, as in the simulator, so
    those idle GPU-seconds count as allocated. num_gpus is the first round's: the simulator's
    cluster does not change size (§5.1).

    Args:
        rounds: The log's rounds, the first one earliest.
        interval: Seconds between rounds.
        end: Time of the last job completion, seconds.

    Returns:
        The fraction, or None for an empty log or a log that starts after `end`.
    """
    if not rounds or rounds[0].timestamp >= end:
        return None
    span = end - rounds[0].timestamp
    held = sum(r.allocated_gpus * max(0.0, min(interval, end - r.timestamp)) for r in rounds)
    return held / (rounds[0].num_gpus * span)


def workload_metrics(result: WorkloadResult, interval: float) -> WorkloadMetrics:
    """All figures of one workload.

    Args:
        result: The workload's JCTs and optional log (whose last record lists every job).
        interval: Seconds between scheduling rounds in its run.
    """
    jcts = result.jcts
    log = result.log
    if log is None:
        end = restarts = utilisation = None
    else:
        end = makespan(jcts, log.final_jobs)
        restarts = restarts_per_job(jcts, log.final_jobs)
        utilisation = gpu_utilisation(log.rounds, interval, end)
    return WorkloadMetrics(
        workload=result.name,
        num_jobs=len(jcts),
        mean_jct=mean_jct(jcts),
        p99_jct=p99_jct(jcts),
        makespan=end,
        restarts_per_job=restarts,
        gpu_utilisation=utilisation,
    )


def _order(policy: str, mode: str, load: float | None) -> tuple[bool, float, str, str]:
    """Sort key: by load (unknown loads last), then policy, then mode."""
    return (load is None, 0.0 if load is None else load, policy, mode)


def summarize_runs(runs: Iterable[RunResult]) -> list[RunSummary]:
    """One summary per (policy, mode, load), sorted by load, policy and mode.

    Runs sharing a (policy, mode, load) are pooled: their workloads are averaged together. That
    covers a workload set split over several directories and repeated seeds of one set alike.
    """
    pooled: dict[tuple[str, str, float | None], list[WorkloadMetrics]] = {}
    for run in runs:
        key = (run.info.policy, run.info.mode, run.info.load)
        metrics = [workload_metrics(w, run.info.interval) for w in run.workloads]
        pooled.setdefault(key, []).extend(metrics)
    return [
        RunSummary(policy, mode, load, tuple(metrics))
        for (policy, mode, load), metrics in sorted(pooled.items(), key=lambda kv: _order(*kv[0]))
    ]


def reference_result(
    policy: str, load: float, jcts: Mapping[str, Mapping[str, float]]
) -> ReferenceResult:
    """The figures of a published result, computed as ours are: per workload, then averaged.

    Args:
        policy: Scheduling policy.
        load: Job load.
        jcts: JCT by job by workload, as in summary.json.
    """
    return ReferenceResult(
        policy=policy,
        load=load,
        mean_jct=float(np.mean([mean_jct(w) for w in jcts.values()])),
        p99_jct=float(np.mean([p99_jct(w) for w in jcts.values()])),
    )


# --- Table -------------------------------------------------------------------------------------


def _text(value: float | None, spec: str) -> str:
    """`value` formatted with `spec`, or "-" when missing."""
    return "-" if value is None else format(value, spec)


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    """The ratio ours / theirs, or None when either is missing."""
    if ours is None or theirs is None:
        return None
    return ours / theirs


def _row(run: RunSummary, ref: ReferenceResult | None) -> tuple[str, ...]:
    """The table cells of one run."""
    ref_mean = None if ref is None else ref.mean_jct
    ref_p99 = None if ref is None else ref.p99_jct
    utilisation = run.gpu_utilisation
    return (
        run.policy,
        run.mode,
        "-" if run.load is None else str(run.load),
        str(len(run.workloads)),
        _text(run.mean_jct, ".1f"),
        _text(run.p99_jct, ".1f"),
        _text(run.makespan, ".1f"),
        _text(run.restarts_per_job, ".2f"),
        _text(None if utilisation is None else 100 * utilisation, ".1f"),
        _text(ref_mean, ".1f"),
        _text(_ratio(run.mean_jct, ref_mean), ".3f"),
        _text(ref_p99, ".1f"),
        _text(_ratio(run.p99_jct, ref_p99), ".3f"),
    )


def _align(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as lines of aligned columns: text left-aligned, numbers right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if i < _LEFT_ALIGNED else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def compare_table(
    runs: Sequence[RunSummary], reference: Mapping[ReferenceKey, ReferenceResult]
) -> str:
    """A plain-text table of `runs`, one row each, sorted by load then policy.

    Args:
        runs: Run summaries, e.g. from `summarize_runs`.
        reference: Published results by (policy, load); a run's round timing does not matter
            for the match, because the published results are the reference for every timing.

    Returns:
        The header, a rule, one line per run and a note on the ratio columns.
    """
    ordered = sorted(runs, key=lambda r: _order(r.policy, r.mode, r.load))
    rows = [_row(r, None if r.load is None else reference.get((r.policy, r.load))) for r in ordered]
    header, *body = _align([_HEADERS, *rows])
    return "\n".join([header, "-" * len(header), *body, _TABLE_NOTE])


# --- Plot --------------------------------------------------------------------------------------


def _series(runs: Sequence[RunSummary]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(load, mean JCT) points by (policy, mode), sorted by load; runs without a load skipped."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for run in runs:
        jct = run.mean_jct
        if run.load is not None and jct is not None:
            series.setdefault((run.policy, run.mode), []).append((run.load, jct))
    return {key: sorted(points) for key, points in sorted(series.items())}


def _reference_series(
    reference: Mapping[ReferenceKey, ReferenceResult],
) -> dict[str, list[tuple[float, float]]]:
    """(load, mean JCT) points by policy, sorted by load."""
    series: dict[str, list[tuple[float, float]]] = {}
    for ref in reference.values():
        series.setdefault(ref.policy, []).append((ref.load, ref.mean_jct))
    return {policy: sorted(points) for policy, points in sorted(series.items())}


def _draw(
    axes: Axes,
    runs: Sequence[RunSummary],
    reference: Mapping[ReferenceKey, ReferenceResult],
) -> None:
    """Ours as solid lines, one marker per mode; published as dashed, one colour per policy."""
    ours = _series(runs)
    published = _reference_series(reference)
    policies = sorted({policy for policy, _ in ours} | set(published))
    colour = {policy: f"C{i % 10}" for i, policy in enumerate(policies)}
    modes = sorted({mode for _, mode in ours})
    marker = {mode: _MARKERS[i % len(_MARKERS)] for i, mode in enumerate(modes)}
    for (policy, mode), points in ours.items():
        loads, jcts = zip(*points, strict=True)
        axes.plot(
            loads, jcts, "-", marker=marker[mode], color=colour[policy], label=f"{policy} ({mode})"
        )
    for policy, points in published.items():
        loads, jcts = zip(*points, strict=True)
        axes.plot(
            loads, jcts, "--", marker="x", color=colour[policy], label=f"{policy} (published)"
        )


def plot_jct_vs_load(
    runs: Sequence[RunSummary],
    reference: Mapping[ReferenceKey, ReferenceResult],
    path: Path,
) -> None:
    """Write a PNG of mean JCT against job load, ours against the published results.

    Uses matplotlib's object API (no pyplot, so no global backend and no display needed).

    Args:
        runs: Run summaries; those without a load are left out.
        reference: Published results by (policy, load).
        path: Where to write the PNG.

    Raises:
        ReportError: matplotlib is not installed, or the file cannot be written.
    """
    try:
        # Imported on use: matplotlib is the optional `sim` extra, needed only for plots.
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as err:
        raise ReportError("plotting needs matplotlib: install pollux[sim]") from err
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    _draw(axes, runs, reference)
    axes.set_xlabel("job load (× the 160-job workloads)")
    axes.set_ylabel("average JCT (s)")
    axes.set_title(PLOT_TITLE)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    try:
        figure.savefig(path, format="png", dpi=120)
    except OSError as err:
        raise ReportError(f"cannot write the plot: {err.strerror}", path) from err


# --- Loading -----------------------------------------------------------------------------------


def _kind(value: object) -> str:
    """The JSON name of `value`'s type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _object(value: object, what: str) -> dict[str, object]:
    """`value` as a JSON object, else `_ShapeError`."""
    if not isinstance(value, dict):
        raise _ShapeError(f"{what} must be an object, not {_kind(value)}")
    return value


def _member(obj: object, key: str) -> object:
    """Field `key` of a JSON object, else `_ShapeError`."""
    fields = _object(obj, f"the value holding {key!r}")
    if key not in fields:
        raise _ShapeError(f"missing field {key!r}")
    return fields[key]


def _shape(what: str) -> checks.ErrorOf:
    """The `_ShapeError` of a value `what` (a key, quoted) that fails a `pollux.checks` check."""
    return lambda problem: _ShapeError(f"{what} {problem}")


def _as_number(value: object, what: str) -> float:
    """`value` as a float if it is a finite JSON number, else `_ShapeError`."""
    return checks.real_number(value, error=_shape(what))


def _number(obj: object, key: str) -> float:
    """Numeric field `key`."""
    return _as_number(_member(obj, key), repr(key))


def _positive(obj: object, key: str) -> float:
    """Numeric field `key`, > 0."""
    return checks.real_number(_member(obj, key), above=0, error=_shape(repr(key)))


def _optional_integer(obj: object, key: str) -> int | None:
    """Integer or null field `key`."""
    value = _member(obj, key)
    if value is None:
        return None
    return checks.whole_number(value, error=_shape(f"{key!r} (or null)"))


def _string(obj: object, key: str) -> str:
    """Non-empty string field `key`."""
    return checks.text(_member(obj, key), non_empty=True, error=_shape(repr(key)))


def _array(obj: object, key: str) -> list[object]:
    """Array field `key`."""
    value = _member(obj, key)
    if not isinstance(value, list):
        raise _ShapeError(f"{key!r} must be an array, not {_kind(value)}")
    return value


def _parse_load(value: object) -> float | None:
    """run.json's load: null, or a positive number or numeric string ("1.0")."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _ShapeError(f"'load' must be null or a number, not {value!r}") from None
    return checks.real_number(value, above=0, error=_shape("'load'"))


def _parse_run_info(raw: object) -> RunInfo:
    """The fields of run.json that the report uses."""
    workloads = tuple(_as_workload_name(w) for w in _array(raw, "workloads"))
    if not workloads or len(set(workloads)) != len(workloads):
        raise _ShapeError("'workloads' must list at least one workload, each once")
    return RunInfo(
        policy=_string(raw, "policy"),
        mode=_string(raw, "mode"),
        load=_parse_load(_member(raw, "load")),
        interval=_positive(raw, "interval"),
        workloads=workloads,
    )


def _as_workload_name(value: object) -> str:
    """A workload name from run.json's list."""
    if not isinstance(value, str) or not value:
        raise _ShapeError("'workloads' must hold non-empty strings")
    return value


def _parse_jcts(raw: object) -> dict[str, dict[str, float]]:
    """summary.json's "jcts": JCT by job by workload; every workload has at least one job."""
    jcts: dict[str, dict[str, float]] = {}
    for workload, jobs in _object(_member(raw, "jcts"), "'jcts'").items():
        per_job = _object(jobs, f"'jcts.{workload}'")
        if not per_job:
            raise _ShapeError(f"'jcts.{workload}' has no jobs")
        jcts[workload] = {
            job: _as_number(v, f"'jcts.{workload}.{job}'") for job, v in per_job.items()
        }
    return jcts


def _round_usage(record: object) -> RoundUsage:
    """The GPU use in one log record."""
    num_gpus = checks.whole_number(
        _member(record, "num_gpus"), least=1, reals=True, error=_shape("'num_gpus'")
    )
    allocated = sum(
        len(_array(job, "allocation"))
        for job in _array(record, "submitted_jobs")
        if _member(job, "completion_time") is None
    )
    return RoundUsage(_number(record, "timestamp"), num_gpus, allocated)


def _final_jobs(record: object) -> dict[str, FinalJob]:
    """The jobs of the last log record, by name."""
    return {
        _string(job, "name"): FinalJob(
            submission_time=_number(job, "submission_time"),
            num_restarts=_optional_integer(job, "num_restarts"),
        )
        for job in _array(record, "submitted_jobs")
    }


def _read_json(path: Path) -> object:
    """The decoded content of a JSON file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ReportError("file not found", path) from None
    except OSError as err:
        raise ReportError(f"cannot read: {err.strerror}", path) from err
    try:
        decoded: object = json.loads(data)
    except json.JSONDecodeError as err:
        raise ReportError(f"invalid JSON at line {err.lineno}: {err.msg}", path) from None
    except ValueError as err:  # not UTF-8
        raise ReportError(f"not a JSON text: {err}", path) from None
    return decoded


def _parse_file(path: Path, parse: Callable[[object], T]) -> T:
    """`parse` applied to a JSON file's content; shape errors name the file."""
    raw = _read_json(path)
    try:
        return parse(raw)
    except _ShapeError as err:
        raise ReportError(str(err), path) from None


def _at_line(path: Path, number: int, parse: Callable[[S], T], value: S) -> T:
    """`parse(value)` for line `number` of a JSON-lines file; errors name the file and line."""
    try:
        return parse(value)
    except json.JSONDecodeError as err:
        problem = f"invalid JSON at column {err.colno}: {err.msg}"
    except (ValueError, _ShapeError) as err:  # ValueError: not UTF-8
        problem = str(err)
    raise ReportError(f"line {number}: {problem}", path)


def load_log(path: Path) -> WorkloadLog:
    """Read a per-round JSON-lines log, keeping only what the report needs.

    Raises:
        ReportError: The file cannot be read, has no records, or a record is malformed (the
            message gives the line).
    """
    try:
        handle = path.open("rb")
    except OSError as err:
        raise ReportError(f"cannot read: {err.strerror}", path) from err
    rounds = []
    last: tuple[int, object] | None = None
    with handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                record = _at_line(path, number, json.loads, line)
                rounds.append(_at_line(path, number, _round_usage, record))
                last = (number, record)
    if last is None:
        raise ReportError("no records", path)
    return WorkloadLog(tuple(rounds), _at_line(path, last[0], _final_jobs, last[1]))


def _workload(directory: Path, name: str, jcts: Mapping[str, float]) -> WorkloadResult:
    """One workload of a run: its JCTs and, if the run has one, its checked log."""
    path = directory / f"{name}.jsonl"
    if not path.exists():
        return WorkloadResult(name, jcts, None)
    log = load_log(path)
    missing = sorted(set(jcts) - set(log.final_jobs))
    if missing:
        raise ReportError(
            f"the last record lacks {len(missing)} job(s) that summary.json has JCTs for, "
            f"e.g. {missing[0]!r}",
            path,
        )
    return WorkloadResult(name, jcts, log)


def load_run(directory: Path | str) -> RunResult:
    """Read a run directory: run.json, summary.json and each workload's log if present.

    Raises:
        ReportError: A file is missing or malformed, or the files disagree (summary.json's
            workloads differ from run.json's, or a log's last record lacks a job with a JCT).
    """
    root = Path(directory)
    info = _parse_file(root / "run.json", _parse_run_info)
    jcts = _parse_file(root / "summary.json", _parse_jcts)
    if set(jcts) != set(info.workloads):
        raise ReportError(
            f"its workloads {sorted(jcts)} differ from run.json's {sorted(info.workloads)}",
            root / "summary.json",
        )
    workloads = tuple(_workload(root, name, jcts[name]) for name in info.workloads)
    return RunResult(root, info, workloads)


def load_reference(directory: Path | str) -> dict[ReferenceKey, ReferenceResult]:
    """Read the published results: every `<policy>-<load>.json` (summary format) in a directory.

    Other files are ignored, so the directory may hold notes or other experiments.

    Returns:
        The results by (policy, load).

    Raises:
        ReportError: Not a directory, no such file in it, or a malformed one.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ReportError("not a directory of published results", root)
    results: dict[ReferenceKey, ReferenceResult] = {}
    for path in sorted(root.iterdir()):
        match = _REFERENCE_FILE.match(path.name)
        if match is not None:
            policy, load = match["policy"], float(match["load"])
            jcts = _parse_file(path, _parse_jcts)
            results[policy, load] = reference_result(policy, load, jcts)
    if not results:
        raise ReportError("no <policy>-<load>.json files", root)
    return results


def compare_main(dirs: Sequence[Path], reference: Path | None, plot: Path | None) -> str:
    """`pollux-sim compare`: load runs, tabulate them against the reference, maybe plot.

    Args:
        dirs: Run directories.
        reference: Directory of published results, or None to compare runs only.
        plot: Where to write the JCT-vs-load PNG, or None for no plot.

    Returns:
        The text to print: the table, and where the plot went.

    Raises:
        ReportError: No directories, or a file cannot be read, parsed or written.
    """
    if not dirs:
        raise ReportError("no run directories to compare")
    summaries = summarize_runs(load_run(d) for d in dirs)
    published = load_reference(reference) if reference is not None else {}
    text = compare_table(summaries, published)
    if plot is not None:
        plot_jct_vs_load(summaries, published, plot)
        text += f"\nplot written to {plot}"
    return text
