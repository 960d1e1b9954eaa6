"""One training application as the simulator sees it, from its published traces (§5.5-§5.6).

Nothing is trained: step time, gradient statistics and progress per epoch are read from the
application's measurements, with the published semantics: throughput interpolated in the
per-GPU batch over a measured placement (3-D over nodes, replicas and batch from 5 nodes up);
gradient statistics, iterations and metrics interpolated in the total batch between the two
validated batches around it; progress the least any validated run had made after an epoch.
It also answers the Optimus oracle's "true" step time (reference §6.1).

Every table is precomputed and every answer memoised (the simulator asks millions of times).
A query outside the measured data raises `TraceRangeError` naming it, where the published
code asserted or returned NaN; a malformed argument raises `InvalidArgumentError`. Pure and
deterministic: its caches are its only mutable state.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy.interpolate import LinearNDInterpolator

from pollux import checks
from pollux.sim.traces import (
    ApplicationTrace,
    FloatArray,
    ThroughputTrace,
    TraceFormatError,
    default_data_root,
    load_applications,
)

__all__ = [
    "MAX_INTERPOLATED_NODES",
    "PUBLISHED_OVERRIDES",
    "Application",
    "InvalidArgumentError",
    "TraceRangeError",
    "canonical_placement",
    "load_published_applications",
    "placement_id",
    "split_fixed_batch",
]

PUBLISHED_OVERRIDES: Final[Mapping[str, Mapping[str, int]]] = {
    # The yolov3 trace measures per-GPU batches up to 16, but the published simulator caps them
    # at 8 (reference §5.6 table, "override; the trace goes to 16").
    "yolov3": {"max_local_bsz": 8},
}
"""Per-application constructor overrides that reproduce the published simulator's constants."""

MAX_INTERPOLATED_NODES: Final = 16
"""Node counts above this are queried as this many nodes (reference §5.5 step 3, §9 item 2)."""

# Slack used by the published batch split so that an exact quotient does not round up
# (reference §5.2 "Fixed target M").
_CEIL_SLACK: Final = 1e-8


class TraceRangeError(ValueError):
    """A query lies outside what the traces measured, so any answer would be an extrapolation.

    The published simulator asserts (or would return NaN) here (reference §5.5 step 4, §5.6);
    raising a typed error instead keeps a bad configuration from quietly skewing a simulation.
    Fields that do not apply to the failed query are None.

    Attributes:
        app: Name of the application whose traces were queried.
        placement: Canonical placement (smallest rotation, zeros dropped) of a throughput query.
        local_bsz: Per-GPU batch size of a throughput query.
        batch_size: Total batch size of a validation-trace query.
        epoch: Epoch of a validation-trace query.
    """

    def __init__(
        self,
        app: str,
        problem: str,
        *,
        placement: tuple[int, ...] | None = None,
        local_bsz: float | None = None,
        batch_size: float | None = None,
        epoch: int | None = None,
    ) -> None:
        super().__init__(f"{app}: {problem}")
        self.app = app
        self.problem = problem
        self.placement = placement
        self.local_bsz = local_bsz
        self.batch_size = batch_size
        self.epoch = epoch

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only attributes would be lost by the default exception pickling, and the
        # simulator may run workloads in worker processes that send errors back.
        kwargs = {
            "placement": self.placement,
            "local_bsz": self.local_bsz,
            "batch_size": self.batch_size,
            "epoch": self.epoch,
        }
        return (_rebuild_range_error, (self.app, self.problem, kwargs))


def _rebuild_range_error(app: str, problem: str, kwargs: dict[str, Any]) -> TraceRangeError:
    return TraceRangeError(app, problem, **kwargs)


class InvalidArgumentError(ValueError):
    """An argument is malformed (wrong type, NaN, negative, empty), whatever the traces hold.

    Distinct from `TraceRangeError`: this one is a caller bug, not a query the data cannot answer.

    Attributes:
        argument: Name of the offending argument.
        value: The value that was passed.
    """

    def __init__(self, argument: str, value: object, requirement: str) -> None:
        super().__init__(f"{argument}={value!r}: {requirement}")
        self.argument = argument
        self.value = value
        self.requirement = requirement

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.argument, self.value, self.requirement))


# -- argument checks ------------------------------------------------------------------------------


def _integer(argument: str, value: object, *, minimum: int | None = None) -> int:
    """`value` as an int (≥ `minimum` when given).

    Any integer-valued real is accepted (2, 2.0, np.int64(2)), so that whether a call is valid
    never depends on what the memos already hold: a memo hit compares keys by value.
    """
    try:
        return checks.whole_number(value, least=minimum, reals=True)
    except checks.Problem as problem:
        raise InvalidArgumentError(argument, value, problem.requirement) from None


def _positive(argument: str, value: object) -> float:
    """`value` as a finite float > 0."""
    try:
        return checks.real_number(value, above=0)
    except checks.Problem as problem:
        raise InvalidArgumentError(argument, value, problem.requirement) from None


# -- placements -----------------------------------------------------------------------------------


def canonical_placement(placement: Sequence[int]) -> tuple[int, ...]:
    """The placement's zero-free, lexicographically smallest rotation (reference §5.5 step 1).

    Placements equal up to rotation share one measurement, e.g. (2, 1) and (1, 2); permutations
    in general do not, e.g. (1, 1, 2, 2) and (1, 2, 1, 2) are distinct.

    Args:
        placement: Replicas per node, in node order; zero entries (nodes without a replica) are
            ignored.

    Returns:
        The canonical tuple.

    Raises:
        InvalidArgumentError: An entry is not a non-negative integer, or no entry is positive.
    """
    counts = tuple(_integer("placement entry", c, minimum=0) for c in placement)
    counts = tuple(c for c in counts if c)
    if not counts:
        raise InvalidArgumentError("placement", placement, "needs at least one replica")
    return min(counts[i:] + counts[:i] for i in range(len(counts)))


def placement_id(placement: Sequence[int]) -> int:
    """The placements.csv id: the canonical placement's counts as decimal digits, (1,2,2,4) → 1224.

    The encoding is only unambiguous for per-node counts ≤ 9, which is all the traces hold;
    lookups inside this module therefore key on `canonical_placement` tuples instead.

    Raises:
        InvalidArgumentError: As `canonical_placement`.
    """
    return int("".join(str(c) for c in canonical_placement(placement)))


def _consolidated(num_replicas: int, gpus_per_node: int) -> tuple[int, ...]:
    """Full nodes first, remainder on the last node (the Optimus oracle's placement, §6.1)."""
    full, rest = divmod(num_replicas, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


# -- the batch split ------------------------------------------------------------------------------


def split_fixed_batch(batch_size: int, num_replicas: int, app: Application) -> tuple[int, int]:
    """Split a fixed total batch over K replicas into (per-GPU batch m, extra accumulation steps s).

    The published rule for jobs with a target batch size (reference §5.2 "Fixed target M", used
    by the Optimus oracle in §6.1): accumulate only as much as the per-GPU memory cap
    `max_local_bsz` forces, except that a single GPU above M0 always accumulates at least once,
    and never let K·m·(s+1) exceed the largest validated batch size.

    Args:
        batch_size: Target total batch size M (≥ 1).
        num_replicas: Number of replicas K (≥ 1).
        app: The application whose M0, batch-size cap and per-GPU cap apply.

    Returns:
        (m, s), with K·m·(s+1) ≤ app.max_batch_size and m ≤ app.max_local_bsz.

    Raises:
        InvalidArgumentError: A non-integer or non-positive argument.
        TraceRangeError: K replicas cannot share even one sample each under the largest
            validated batch size (K·(s+1) > max_batch_size).
    """
    total = _integer("batch_size", batch_size, minimum=1)
    replicas = _integer("num_replicas", num_replicas, minimum=1)
    local = math.ceil(total / replicas - _CEIL_SLACK)
    accum = math.ceil(local / app.max_local_bsz - _CEIL_SLACK) - 1
    if replicas == 1 and total > app.init_batch_size:
        accum = max(accum, 1)
    atomic = math.ceil(local / (accum + 1) - _CEIL_SLACK)
    atomic = min(atomic, app.max_batch_size // (replicas * (accum + 1)))
    if atomic < 1:
        raise TraceRangeError(
            app.name,
            f"{replicas} replicas × {accum + 1} micro-batches exceed the largest validated "
            f"batch size {app.max_batch_size}",
            batch_size=total,
        )
    return atomic, accum


# -- throughput tables ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Curve:
    """One measured placement: step and sync time against the per-GPU batch, ascending."""

    local_bsz: FloatArray
    step_time: FloatArray
    sync_time: FloatArray

    def at(self, local_bsz: float) -> tuple[float, float] | None:
        """Linear interpolation (reference §5.5 step 2); None outside the measured batches.

        np.interp returns the stored value exactly at a measured batch size.
        """
        xs = self.local_bsz
        if not xs[0] <= local_bsz <= xs[-1]:
            return None
        return (
            float(np.interp(local_bsz, xs, self.step_time)),
            float(np.interp(local_bsz, xs, self.sync_time)),
        )


class _Scatter:
    """3-D linear interpolation over (num_nodes, num_replicas, local_bsz) (reference §5.5 step 3).

    The Delaunay triangulation is built on first use: most applications in a workload never
    span five or more nodes, and building it costs milliseconds per application.
    """

    __slots__ = ("_interpolator", "_points", "_values")

    def __init__(self, points: FloatArray, values: FloatArray) -> None:
        self._points = points
        self._values = values
        self._interpolator: LinearNDInterpolator | None = None

    def __call__(self, num_nodes: int, num_replicas: int, local_bsz: float) -> tuple[float, float]:
        """(step, sync) at the query; NaN where it lies outside the points' convex hull."""
        if self._interpolator is None:
            self._interpolator = LinearNDInterpolator(self._points, self._values)
        query = np.array([[num_nodes, num_replicas, local_bsz]], dtype=np.float64)
        step, sync = self._interpolator(query)[0]
        return float(step), float(sync)

    def __getstate__(self) -> tuple[FloatArray, FloatArray]:
        # The triangulation is rebuilt on demand rather than shipped to worker processes.
        return self._points, self._values

    def __setstate__(self, state: tuple[FloatArray, FloatArray]) -> None:
        self._points, self._values = state
        self._interpolator = None


def _curves(trace: ApplicationTrace) -> dict[tuple[int, ...], _Curve]:
    """Per canonical placement, its rows of placements.csv sorted by local_bsz."""
    rows: defaultdict[tuple[int, ...], list[int]] = defaultdict(list)
    for index, text in enumerate(trace.placements.placement):
        rows[canonical_placement([int(ch) for ch in text])].append(index)
    curves = {}
    p = trace.placements
    for placement, indices in rows.items():
        idx = np.array(indices)
        order = idx[np.argsort(p.atomic_bsz[idx], kind="stable")]
        xs = p.atomic_bsz[order].astype(np.float64)
        if np.any(np.diff(xs) == 0):
            raise TraceFormatError(
                Path(trace.name) / "placements.csv",
                f"placement {''.join(map(str, placement))} (up to rotation) has two rows with the "
                "same local_bsz",
            )
        curves[placement] = _Curve(xs, p.step_time[order], p.sync_time[order])
    return curves


def _scatter(trace: ApplicationTrace) -> _Scatter:
    """Per-(N, K, m) means of placements.csv plus every scalability.csv row (§5.5 step 3)."""
    rows = ThroughputTrace.concat(trace.placements.mean_by_configuration(), trace.scalability)
    points = np.stack([rows.num_nodes, rows.num_replicas, rows.atomic_bsz], axis=1)
    values = np.stack([rows.step_time, rows.sync_time], axis=1)
    return _Scatter(points.astype(np.float64), values)


# -- the application ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Application:
    """Everything the simulator and the baselines read from one application's traces.

    Build it with `Application.from_trace` (or `load_published_applications`); the underscored
    fields are precomputed tables, listed so the object stays a plain, picklable dataclass.

    Attributes:
        name: Application name (the trace directory's name).
        init_batch_size: M0, the smallest validated total batch size.
        max_batch_size: The largest validated total batch size.
        min_local_bsz: Smallest per-GPU batch measured in placements.csv.
        max_local_bsz: Largest per-GPU batch a replica may use (measured maximum unless
            overridden, as for yolov3).
        max_epochs: Epochs in a full training run (rows of the validation files).
        batch_sizes: The validated total batch sizes, ascending.
        metric_increases: Whether a larger validation metric is better (from the smallest-batch
            run's first and last rows, reference §5.6).
    """

    name: str
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    max_epochs: int
    batch_sizes: tuple[int, ...]
    metric_increases: bool
    _curves: Mapping[tuple[int, ...], _Curve] = field(repr=False)
    _scatter: _Scatter = field(repr=False)
    # Progress threshold after e epochs, e = 0..max_epochs (reference §5.6).
    _progress: tuple[float, ...] = field(repr=False)
    # Per validated batch size (rows, ascending) and epoch (columns 0..max_epochs-1).
    _grad_sqr: FloatArray = field(repr=False)
    _grad_var: FloatArray = field(repr=False)
    _iteration: FloatArray = field(repr=False)
    _metric: FloatArray = field(repr=False)
    # Best metric over the first e rows, e = 1..max_epochs at column e-1.
    _best_metric: FloatArray = field(repr=False)
    # Memos. Keys are as the caller passed them, so a hit costs no canonicalisation.
    _throughput_memo: dict[tuple[Any, Any], tuple[float, float]] = field(
        default_factory=dict, init=False, repr=False
    )
    _canonical_memo: dict[tuple[tuple[int, ...], float], tuple[float, float]] = field(
        default_factory=dict, init=False, repr=False
    )
    _grad_memo: dict[tuple[Any, Any], tuple[float, float]] = field(
        default_factory=dict, init=False, repr=False
    )
    _step_memo: dict[tuple[Any, Any, Any], float] = field(
        default_factory=dict, init=False, repr=False
    )

    @classmethod
    def from_trace(
        cls, trace: ApplicationTrace, *, max_local_bsz: int | None = None
    ) -> Application:
        """Precompute every table of one application from its traces.

        Args:
            trace: The application's traces, as `pollux.sim.traces.load_application` reads them.
            max_local_bsz: Per-GPU batch cap to use instead of the largest measured one
                (`PUBLISHED_OVERRIDES` lists the published caps). It must lie within the
                measured per-GPU batches, since throughput outside them is unknown.

        Returns:
            The application model.

        Raises:
            InvalidArgumentError: `max_local_bsz` is not a measured-range integer.
            TraceFormatError: The traces contradict themselves (a placement measured twice at
                one batch size, or a largest validated batch below the smallest per-GPU batch).
        """
        low, high = trace.atomic_bsz_range
        if max_local_bsz is not None:
            max_local_bsz = _integer("max_local_bsz", max_local_bsz, minimum=low)
            if max_local_bsz > high:
                raise InvalidArgumentError(
                    "max_local_bsz",
                    max_local_bsz,
                    f"must not exceed the largest measured per-GPU batch {high} of {trace.name}",
                )
        if trace.max_batch_size < low:
            raise TraceFormatError(
                Path(trace.name),
                f"largest validated batch {trace.max_batch_size} is below the smallest "
                f"per-GPU batch {low}",
            )
        runs = list(trace.validation.values())  # ascending batch size (traces.py sorts them)
        # The published default when files disagree in length; in the data they never do.
        epochs = min(len(run.progress) for run in runs)

        def table(column: str) -> FloatArray:
            return np.stack([getattr(run, column)[:epochs] for run in runs]).astype(np.float64)

        metric = table("metric")
        increases = bool(metric[0, 0] < metric[0, -1])
        accumulate = np.maximum.accumulate if increases else np.minimum.accumulate
        progress = table("progress").min(axis=0)
        return cls(
            name=trace.name,
            init_batch_size=trace.init_batch_size,
            max_batch_size=trace.max_batch_size,
            min_local_bsz=low,
            max_local_bsz=high if max_local_bsz is None else max_local_bsz,
            max_epochs=epochs,
            batch_sizes=tuple(run.batch_size for run in runs),
            metric_increases=increases,
            _curves=_curves(trace),
            _scatter=_scatter(trace),
            _progress=(0.0, *(float(p) for p in progress)),
            _grad_sqr=table("grad_sqr"),
            _grad_var=table("grad_var"),
            _iteration=table("iteration"),
            _metric=metric,
            _best_metric=accumulate(metric, axis=1),
        )

    # -- constants ------------------------------------------------------------------------------

    @property
    def completion_epoch(self) -> int:
        """The last epoch of a run: a job finishes once its epoch count passes this.

        No application defines a target metric, so the published completion rule reduces to
        max_epochs − 1 (reference §5.3 step g, §6.1).
        """
        return self.max_epochs - 1

    @property
    def final_progress(self) -> float:
        """Progress at which a job is complete: `progress(max_epochs)` (reference §5.3)."""
        return self._progress[-1]

    # -- throughput -----------------------------------------------------------------------------

    def throughput(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """True (step_time, sync_time) in seconds of one optimizer step without accumulation.

        Reference §5.5: a placement measured in placements.csv (every one of 1-4 nodes with 1-4
        GPUs each) is interpolated linearly in `local_bsz`; any other placement is interpolated
        linearly in (num_nodes capped at 16, num_replicas, local_bsz) over the node-count-only
        data, so for 5+ nodes how the replicas spread across nodes does not matter.

        Answers are memoised without bound: a simulation asks about a few thousand distinct
        (placement, per-GPU batch) pairs, millions of times each.

        Args:
            placement: Replicas per node in node order; zeros are ignored, and rotations are the
                same placement.
            local_bsz: Per-GPU micro-batch size m.

        Returns:
            (step_time, sync_time); step_time − sync_time is the compute time of a micro-batch.

        Raises:
            TraceRangeError: `local_bsz` outside the placement's measured range, or a query
                outside the convex hull of the 3-D data (e.g. more than 4 GPUs on a node of a
                1-4 node placement, or more than 64 replicas).
            InvalidArgumentError: An empty or negative placement, or a non-positive `local_bsz`.
        """
        try:
            hit = self._throughput_memo.get((placement, local_bsz))
        except TypeError:  # an unhashable placement (a list): let the slow path normalise it
            hit = None
        if hit is not None:
            return hit
        return self._throughput_miss(placement, local_bsz)

    def _throughput_miss(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        canonical = canonical_placement(placement)
        m = _positive("local_bsz", local_bsz)
        result = self._canonical_memo.get((canonical, m))
        if result is None:
            result = self._interpolate_throughput(canonical, m)
            self._canonical_memo[canonical, m] = result
        self._throughput_memo[tuple(placement), local_bsz] = result
        return result

    def _interpolate_throughput(self, placement: tuple[int, ...], m: float) -> tuple[float, float]:
        curve = self._curves.get(placement)
        if curve is not None:  # (reference §5.5 step 2)
            result = curve.at(m)
            if result is None:
                raise TraceRangeError(
                    self.name,
                    f"local_bsz {m:g} is outside the measured "
                    f"[{curve.local_bsz[0]:g}, {curve.local_bsz[-1]:g}] of placement "
                    f"{placement_id(placement)}",
                    placement=placement,
                    local_bsz=m,
                )
            return result
        nodes = min(len(placement), MAX_INTERPOLATED_NODES)  # (reference §5.5 step 3)
        replicas = sum(placement)
        step, sync = self._scatter(nodes, replicas, m)
        if not (math.isfinite(step) and math.isfinite(sync)):  # (reference §5.5 step 4)
            raise TraceRangeError(
                self.name,
                f"(num_nodes={nodes}, num_replicas={replicas}, local_bsz={m:g}) of placement "
                f"{placement} lies outside the measured configurations",
                placement=placement,
                local_bsz=m,
            )
        return step, sync

    def consolidated_step_time(
        self, num_replicas: int, batch_size: int, gpus_per_node: int = 4
    ) -> float:
        """The Optimus oracle's true seconds per optimizer step on K GPUs (reference §6.1).

        Assumes the tightest placement (`gpus_per_node` per node, remainder on the last node)
        and the published fixed-batch split (`split_fixed_batch`), then adds the compute time of
        each extra accumulation micro-batch: step + (step − sync)·s.

        Args:
            num_replicas: GPU count K (≥ 1).
            batch_size: Fixed total batch size M (≥ 1).
            gpus_per_node: GPUs per node (≥ 1).

        Returns:
            Seconds per optimizer step.

        Raises:
            TraceRangeError: The split or the placement falls outside the traces.
            InvalidArgumentError: A non-integer or non-positive argument.
        """
        key = (num_replicas, batch_size, gpus_per_node)
        hit = self._step_memo.get(key)
        if hit is not None:
            return hit
        K = _integer("num_replicas", num_replicas, minimum=1)
        per_node = _integer("gpus_per_node", gpus_per_node, minimum=1)
        m, s = split_fixed_batch(batch_size, K, self)
        step, sync = self.throughput(_consolidated(K, per_node), m)
        result = step + (step - sync) * s
        self._step_memo[key] = result
        return result

    # -- validation traces ----------------------------------------------------------------------

    def progress(self, epoch: int) -> float:
        """Progress (M0-equivalent steps) a job must reach to have finished `epoch` epochs.

        The minimum over validated batch sizes of the progress after `epoch` epochs, and 0 for
        epoch 0 (reference §5.6), so no batch size is penalised by another run's noise.

        Args:
            epoch: Number of completed epochs, 0..max_epochs.

        Raises:
            TraceRangeError: `epoch` outside [0, max_epochs].
            InvalidArgumentError: `epoch` is not an integer.
        """
        if type(epoch) is int and 0 <= epoch <= self.max_epochs:
            return self._progress[epoch]
        e = _integer("epoch", epoch)
        if not 0 <= e <= self.max_epochs:
            raise TraceRangeError(
                self.name, f"epoch {e} is outside [0, {self.max_epochs}]", epoch=e
            )
        return self._progress[e]

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """True (grad_sqr, grad_var) during `epoch` of a run at total batch `batch_size`.

        Row `epoch` of the validation files, interpolated linearly in the batch size between the
        validated sizes bracketing it (reference §5.3 step c, §5.6).

        Args:
            batch_size: Total batch size M, within [init_batch_size, max_batch_size].
            epoch: 0-based epoch, within [0, max_epochs).

        Raises:
            TraceRangeError: `batch_size` or `epoch` outside the validated range.
            InvalidArgumentError: A NaN or non-positive batch size, or a non-integer epoch.
        """
        key = (batch_size, epoch)
        hit = self._grad_memo.get(key)
        if hit is not None:
            return hit
        M, e = self._check_row(batch_size, epoch, last=self.max_epochs - 1)
        result = (
            self._along_batch(self._grad_sqr, M, e),
            self._along_batch(self._grad_var, M, e),
        )
        self._grad_memo[key] = result
        return result

    def iteration(self, batch_size: float, epoch: int) -> float:
        """Cumulative optimizer steps at the end of `epoch` (0-based) of a run at `batch_size`.

        Row `epoch`, interpolated in batch size (reference §5.6). The Optimus oracle's remaining
        iterations are iteration(M, completion_epoch) − iteration(M, current epoch) (§6.1).

        Raises:
            TraceRangeError: `batch_size` or `epoch` outside the validated range
                ([init_batch_size, max_batch_size] and [0, max_epochs)).
            InvalidArgumentError: A NaN or non-positive batch size, or a non-integer epoch.
        """
        M, e = self._check_row(batch_size, epoch, last=self.max_epochs - 1)
        return self._along_batch(self._iteration, M, e)

    def metric(self, batch_size: float, epoch: int) -> float:
        """Validation metric after `epoch` (0-based) of a run at `batch_size`, interpolated.

        Raises:
            TraceRangeError: `batch_size` or `epoch` outside the validated range.
            InvalidArgumentError: A NaN or non-positive batch size, or a non-integer epoch.
        """
        M, e = self._check_row(batch_size, epoch, last=self.max_epochs - 1)
        return self._along_batch(self._metric, M, e)

    def best_metric(self, batch_size: float, epoch: int) -> float | None:
        """Best validation metric over the first `epoch` epochs of a run at `batch_size`.

        "Best" is the running max, or min where the metric falls (`metric_increases`); each
        bracketing run's running best is interpolated in batch size (reference §5.6).

        Args:
            batch_size: Total batch size M, within [init_batch_size, max_batch_size].
            epoch: Number of completed epochs, 0..max_epochs.

        Returns:
            The best metric, or None for epoch 0 (nothing has been validated yet).

        Raises:
            TraceRangeError: `batch_size` or `epoch` outside the validated range.
            InvalidArgumentError: A NaN or non-positive batch size, or a non-integer epoch.
        """
        M, e = self._check_row(batch_size, epoch, last=self.max_epochs)
        if e == 0:
            return None
        return self._along_batch(self._best_metric, M, e - 1)

    def _check_row(self, batch_size: float, epoch: int, *, last: int) -> tuple[float, int]:
        M = _positive("batch_size", batch_size)
        e = _integer("epoch", epoch)
        if not self.init_batch_size <= M <= self.max_batch_size:
            raise TraceRangeError(
                self.name,
                f"batch size {M:g} is outside the validated "
                f"[{self.init_batch_size}, {self.max_batch_size}]",
                batch_size=M,
                epoch=e,
            )
        if not 0 <= e <= last:
            raise TraceRangeError(
                self.name, f"epoch {e} is outside [0, {last}]", batch_size=M, epoch=e
            )
        return M, e

    def _along_batch(self, table: FloatArray, batch_size: float, column: int) -> float:
        """Linear interpolation of `table[:, column]` in batch size (reference §5.6).

        A validated batch size returns its own row exactly; the caller has range-checked.
        """
        sizes = self.batch_sizes
        upper = bisect.bisect_left(sizes, batch_size)
        if sizes[upper] == batch_size:
            return float(table[upper, column])
        lo, hi = sizes[upper - 1], sizes[upper]
        below, above = table[upper - 1, column], table[upper, column]
        return float(((batch_size - lo) * above + (hi - batch_size) * below) / (hi - lo))


def load_published_applications(traces_dir: Path | str | None = None) -> dict[str, Application]:
    """Every application under a traces/ directory, with the published overrides applied.

    Args:
        traces_dir: The folder holding one sub-folder per application; the published data set
            (`default_data_root() / "traces"`) when None.

    Returns:
        Applications keyed by name.

    Raises:
        TraceFormatError: A trace is missing or malformed.
    """
    root = Path(traces_dir) if traces_dir is not None else default_data_root() / "traces"
    return {
        name: Application.from_trace(trace, **PUBLISHED_OVERRIDES.get(name, {}))
        for name, trace in load_applications(root).items()
    }
