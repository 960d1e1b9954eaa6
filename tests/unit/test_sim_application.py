"""The trace-driven application model answers with the published semantics (reference §5.5-§6.1)."""

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.sim.application import (
    PUBLISHED_OVERRIDES,
    Application,
    InvalidArgumentError,
    TraceRangeError,
    canonical_placement,
    load_published_applications,
    placement_id,
    split_fixed_batch,
)
from pollux.sim.traces import ApplicationTrace, default_data_root, load_applications

# Reference §5.6 table: M0, max M, [min, max] local bsz, max_epochs, final progress.
PUBLISHED = {
    "bert": (12, 384, 4, 12, 2, 14774),
    "cifar10": (128, 4096, 32, 1024, 100, 39063),
    "deepspeech2": (20, 640, 10, 80, 80, 28536),
    "imagenet": (200, 12800, 20, 200, 90, 576526),
    "ncf": (256, 32768, 32, 32768, 10, 194174),
    "yolov3": (8, 512, 4, 8, 50, 103444),
}
NAMES = sorted(PUBLISHED)


@pytest.fixture(scope="module")
def traces() -> dict[str, ApplicationTrace]:
    return load_applications(default_data_root() / "traces")


@pytest.fixture(scope="module")
def apps() -> dict[str, Application]:
    return load_published_applications()


def fresh(traces: dict[str, ApplicationTrace], name: str) -> Application:
    """An application with empty memos, for tests that must see a computed (not cached) value."""
    return Application.from_trace(traces[name], **PUBLISHED_OVERRIDES.get(name, {}))


def placement_rows(trace: ApplicationTrace, placement: str) -> dict[int, tuple[float, float]]:
    p = trace.placements
    return {
        int(m): (float(st_), float(sy))
        for pl, m, st_, sy in zip(p.placement, p.atomic_bsz, p.step_time, p.sync_time, strict=True)
        if pl == placement
    }


def spread(num_replicas: int, num_nodes: int) -> tuple[int, ...]:
    """K replicas over N nodes as evenly as possible (each node 1-4)."""
    base, extra = divmod(num_replicas, num_nodes)
    return tuple(base + (i < extra) for i in range(num_nodes))


# -- constants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_constants_match_the_published_table(apps, name):
    app = apps[name]
    m0, max_m, lo, hi, epochs, final = PUBLISHED[name]
    assert (app.name, app.init_batch_size, app.max_batch_size) == (name, m0, max_m)
    assert (app.min_local_bsz, app.max_local_bsz, app.max_epochs) == (lo, hi, epochs)
    assert round(app.progress(app.max_epochs)) == final
    assert app.final_progress == app.progress(app.max_epochs)
    assert app.completion_epoch == epochs - 1


def test_only_yolov3_is_overridden(traces, apps):
    assert dict(PUBLISHED_OVERRIDES) == {"yolov3": {"max_local_bsz": 8}}
    assert Application.from_trace(traces["yolov3"]).max_local_bsz == 16  # what the trace measures
    for name in NAMES:
        if name != "yolov3":
            assert apps[name].max_local_bsz == Application.from_trace(traces[name]).max_local_bsz


@pytest.mark.parametrize(
    "override", [3, 17, 8.5, math.nan], ids=["below-min", "above-measured", "fraction", "nan"]
)
def test_an_override_outside_the_measured_batches_is_refused(traces, override):
    with pytest.raises(InvalidArgumentError) as info:
        Application.from_trace(traces["yolov3"], max_local_bsz=override)
    assert info.value.argument == "max_local_bsz"


@pytest.mark.parametrize("name", ["cifar10", "deepspeech2", "yolov3"])
def test_metric_direction_is_inferred_from_the_smallest_batch_run(apps, traces, name):
    first = traces[name].validation[apps[name].init_batch_size].metric
    assert apps[name].metric_increases == bool(first[0] < first[-1])
    assert apps[name].metric_increases == (name == "cifar10")


# -- placements --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        ((1, 2, 2, 4), 1224),
        ((2, 4, 1, 2), 1224),
        ((2, 1), 12),
        ((1, 2), 12),
        ((0, 4, 0, 1, 2, 2), 1224),
        ((1, 2, 1, 2), 1212),
        ((1, 1, 2, 2), 1122),
        ((3,), 3),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_placement_ids_are_the_smallest_rotation(placement, expected):
    assert placement_id(placement) == expected


@pytest.mark.parametrize(
    "placement",
    [(), (0, 0), (1, -1), (1.5, 2), ("1",)],
    ids=["empty", "zeros", "neg", "frac", "str"],
)
def test_a_malformed_placement_is_refused(apps, placement):
    with pytest.raises(InvalidArgumentError):
        canonical_placement(placement)
    with pytest.raises(InvalidArgumentError):
        apps["bert"].throughput(placement, 8)


# -- throughput --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_throughput_equals_every_measured_row(traces, name):
    app = fresh(traces, name)
    p = traces[name].placements
    for placement, m, step, sync in zip(
        p.placement, p.atomic_bsz, p.step_time, p.sync_time, strict=True
    ):
        assert app.throughput(tuple(int(c) for c in placement), int(m)) == (step, sync)


@pytest.mark.parametrize("name", NAMES)
def test_throughput_is_linear_between_two_measured_batches(traces, name):
    rows = placement_rows(traces[name], "1224")
    lo, hi = sorted(rows)[:2]
    step, sync = fresh(traces, name).throughput((1, 2, 2, 4), (lo + hi) / 2)
    assert step == pytest.approx((rows[lo][0] + rows[hi][0]) / 2, rel=1e-12)
    assert sync == pytest.approx((rows[lo][1] + rows[hi][1]) / 2, rel=1e-12)
    quarter = lo + (hi - lo) / 4
    step, _ = fresh(traces, name).throughput((2, 2, 4, 1), quarter)
    assert step == pytest.approx(0.75 * rows[lo][0] + 0.25 * rows[hi][0], rel=1e-12)


def test_rotations_share_a_measurement_and_permutations_do_not(apps, traces):
    app = apps["cifar10"]
    assert app.throughput((2, 1), 64) == app.throughput((1, 2), 64)
    assert app.throughput((2, 1), 64) == placement_rows(traces["cifar10"], "12")[64]
    assert app.throughput((4, 1, 2, 2), 64) == app.throughput((1, 2, 2, 4), 64)
    assert app.throughput((1, 1, 2, 2), 64) == placement_rows(traces["cifar10"], "1122")[64]
    assert app.throughput((1, 2, 1, 2), 64) == placement_rows(traces["cifar10"], "1212")[64]
    assert app.throughput((1, 1, 2, 2), 64) != app.throughput((1, 2, 1, 2), 64)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("nodes", [6, 8, 12, 16])
def test_larger_placements_reproduce_scalability_rows(traces, name, nodes):
    app = fresh(traces, name)
    s = traces[name].scalability
    rows = np.flatnonzero(s.num_nodes == nodes)
    assert rows.size
    for row in rows:
        placement = spread(int(s.num_replicas[row]), nodes)
        step, sync = app.throughput(placement, int(s.atomic_bsz[row]))
        assert step == pytest.approx(s.step_time[row], rel=1e-9)
        assert sync == pytest.approx(s.sync_time[row], rel=1e-9, abs=1e-12)


def test_only_node_and_replica_counts_matter_beyond_four_nodes(apps):
    app = apps["imagenet"]
    assert app.throughput((2, 2, 2, 2, 2, 2), 40) == app.throughput((1, 3, 1, 3, 2, 2), 40)


def test_node_counts_above_sixteen_are_queried_as_sixteen(apps, traces):
    s = traces["bert"].scalability
    row = np.flatnonzero((s.num_nodes == 16) & (s.num_replicas == 20) & (s.atomic_bsz == 8))[0]
    step, _ = apps["bert"].throughput((1,) * 20, 8)
    assert step == pytest.approx(s.step_time[row], rel=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_five_nodes_lie_between_four_and_six_node_data(apps, traces, name):
    app = apps[name]
    checked = 0
    for m in placement_rows(traces[name], "1111"):
        try:
            five = app.throughput((1, 1, 1, 1, 1), m)
        except TraceRangeError:  # yolov3's 6-node data stops at m = 8
            continue
        four, six = app.throughput((1, 1, 1, 1), m), app.throughput((1,) * 6, m)
        for i in range(2):
            assert min(four[i], six[i]) <= five[i] <= max(four[i], six[i])
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize(
    ("name", "placement", "local_bsz"),
    [
        ("bert", (1,), 3),
        ("bert", (1, 2, 2, 4), 13),
        ("cifar10", (4, 4, 4, 4), 1024),  # this placement was measured only up to 725
        ("cifar10", (8,), 64),  # 8 GPUs on one node: no measurement near it
        ("cifar10", (4,) * 17, 64),  # 68 replicas: beyond the 64 measured
        ("yolov3", (4,) * 5, 16),  # the 6-node data stops at 8
    ],
    ids=["below", "above", "short-grid", "big-node", "68-replicas", "five-node-hull"],
)
def test_queries_outside_the_traces_raise(apps, name, placement, local_bsz):
    with pytest.raises(TraceRangeError) as info:
        apps[name].throughput(placement, local_bsz)
    error = info.value
    assert (error.app, error.placement, error.local_bsz) == (
        name,
        canonical_placement(placement),
        local_bsz,
    )
    assert name in str(error)


@pytest.mark.parametrize("local_bsz", [0, -4, math.nan, math.inf, "8"], ids=repr)
def test_a_malformed_batch_is_refused(apps, local_bsz):
    with pytest.raises(InvalidArgumentError):
        apps["bert"].throughput((1,), local_bsz)


def test_memoised_answers_are_identical(traces):
    app = fresh(traces, "deepspeech2")
    first = app.throughput((2, 4), 33)
    assert app.throughput((2, 4), 33) is first
    assert app.throughput((4, 2), 33) is first  # computed once per rotation class
    assert app.throughput([2, 4], 33) == first  # an unhashable placement still works
    assert app.throughput((2, 4), 33.0) is first
    assert app.throughput((2, 4), 33) == fresh(traces, "deepspeech2").throughput((2, 4), 33)
    grads = app.grad_stats(60, 5)
    assert app.grad_stats(60, 5) is grads
    assert app.consolidated_step_time(6, 320) is app.consolidated_step_time(6, 320)
    with pytest.raises(TraceRangeError):  # a failed query is not cached as anything
        app.throughput((2, 4), 81)
    with pytest.raises(TraceRangeError):
        app.throughput((2, 4), 81)


# -- validation traces -------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_grad_stats_at_a_validated_batch_are_the_csv_row(apps, traces, name):
    app = apps[name]
    for batch, run in traces[name].validation.items():
        for epoch in (0, app.max_epochs // 2, app.max_epochs - 1):
            assert app.grad_stats(batch, epoch) == (run.grad_sqr[epoch], run.grad_var[epoch])
            assert app.iteration(batch, epoch) == run.iteration[epoch]
            assert app.metric(batch, epoch) == run.metric[epoch]


@pytest.mark.parametrize("name", NAMES)
def test_grad_stats_halfway_between_validated_batches_are_the_mean(apps, traces, name):
    app = apps[name]
    (lo, low), (hi, high) = list(traces[name].validation.items())[1:3]
    epoch = app.max_epochs - 1
    sqr, var = app.grad_stats((lo + hi) / 2, epoch)
    assert sqr == pytest.approx((low.grad_sqr[epoch] + high.grad_sqr[epoch]) / 2, rel=1e-12)
    assert var == pytest.approx((low.grad_var[epoch] + high.grad_var[epoch]) / 2, rel=1e-12)
    iters = app.iteration((lo + hi) / 2, epoch)
    assert iters == pytest.approx((low.iteration[epoch] + high.iteration[epoch]) / 2)


@pytest.mark.parametrize(
    ("batch_size", "epoch"),
    [(127, 0), (4097, 0), (128, 100), (128, -1), (4096, 1000)],
    ids=["below-M0", "above-max", "epoch-past-last", "negative-epoch", "far-epoch"],
)
def test_validation_queries_outside_the_traces_raise(apps, batch_size, epoch):
    app = apps["cifar10"]
    for query in (app.grad_stats, app.iteration, app.metric):
        with pytest.raises(TraceRangeError) as info:
            query(batch_size, epoch)
        assert (info.value.app, info.value.batch_size, info.value.epoch) == (
            "cifar10",
            batch_size,
            epoch,
        )


@pytest.mark.parametrize(
    ("batch_size", "epoch"),
    [(math.nan, 0), (-1, 0), (256, 1.5), (256, "1")],
    ids=["nan-batch", "negative-batch", "fractional-epoch", "str-epoch"],
)
def test_malformed_validation_queries_are_refused(apps, batch_size, epoch):
    with pytest.raises(InvalidArgumentError):
        apps["cifar10"].grad_stats(batch_size, epoch)


@pytest.mark.parametrize("name", NAMES)
def test_progress_is_the_minimum_over_runs_after_e_epochs(apps, traces, name):
    app, runs = apps[name], traces[name].validation.values()
    assert app.progress(0) == 0.0
    assert app.progress(1) == min(run.progress[0] for run in runs)
    assert app.progress(app.max_epochs) == min(run.progress[-1] for run in runs)
    steps = np.diff([app.progress(e) for e in range(app.max_epochs + 1)])
    assert np.all(steps > 0)
    for epoch in (-1, app.max_epochs + 1):
        with pytest.raises(TraceRangeError):
            app.progress(epoch)
    assert app.progress(np.int64(1)) == app.progress(1)


@pytest.mark.parametrize("name", ["cifar10", "deepspeech2"])
def test_best_metric_is_the_running_best_before_an_epoch(apps, traces, name):
    app = apps[name]
    best = max if app.metric_increases else min
    assert app.best_metric(app.init_batch_size, 0) is None
    metric = traces[name].validation[app.init_batch_size].metric
    for epoch in (1, 5, app.max_epochs):
        assert app.best_metric(app.init_batch_size, epoch) == best(metric[:epoch])
    with pytest.raises(TraceRangeError):
        app.best_metric(app.init_batch_size, app.max_epochs + 1)


def test_remaining_iterations_for_the_optimus_oracle(apps, traces):
    app, run = apps["cifar10"], traces["cifar10"].validation[2048]
    remaining = app.iteration(2048, app.completion_epoch) - app.iteration(2048, 10)
    assert remaining == run.iteration[-1] - run.iteration[10]


# -- the fixed-batch split and the Optimus step time -------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_consolidated_step_time_on_one_gpu_at_m0_is_the_trace(apps, traces, name):
    app = apps[name]
    step = app.consolidated_step_time(1, app.init_batch_size)
    assert split_fixed_batch(app.init_batch_size, 1, app) == (app.init_batch_size, 0)
    assert step == app.throughput((1,), app.init_batch_size)[0]
    measured = placement_rows(traces[name], "1")
    if app.init_batch_size in measured:  # cifar10 and ncf measured 129 and 257, not M0
        assert step == measured[app.init_batch_size][0]


def test_consolidated_step_time_adds_accumulation_compute(apps):
    app = apps["imagenet"]  # max per-GPU 200: 6 GPUs at 3200 → b = 534, s = 2, m = 178
    assert split_fixed_batch(3200, 6, app) == (178, 2)
    step, sync = app.throughput((4, 2), 178)
    assert app.consolidated_step_time(6, 3200) == step + (step - sync) * 2
    step, sync = app.throughput((2, 2, 2), 178)
    assert app.consolidated_step_time(6, 3200, gpus_per_node=2) == step + (step - sync) * 2


@pytest.mark.parametrize(
    ("name", "batch_size", "expected"),
    [("cifar10", 256, (128, 1)), ("bert", 24, (12, 1)), ("ncf", 32768, (16384, 1))],
    ids=["cifar10-256", "bert-24", "ncf-32768"],
)
def test_one_gpu_above_m0_always_accumulates(apps, name, batch_size, expected):
    assert split_fixed_batch(batch_size, 1, apps[name]) == expected


def test_the_split_is_capped_by_the_largest_validated_batch(apps):
    app = apps["bert"]  # 10 GPUs at 384: b = 39 → s = 3, m = 10; cap 384 // 40 = 9
    assert split_fixed_batch(384, 10, app) == (9, 3)
    with pytest.raises(TraceRangeError):
        split_fixed_batch(384, 385, app)
    with pytest.raises(InvalidArgumentError):
        split_fixed_batch(0, 1, app)
    with pytest.raises(InvalidArgumentError):
        split_fixed_batch(384, 1.5, app)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    replicas=st.integers(1, 64),
    scale=st.floats(0.0, 1.0),
)
def test_split_never_exceeds_the_caps_and_covers_the_target(apps, name, replicas, scale):
    app = apps[name]
    low = max(app.init_batch_size, replicas * app.min_local_bsz)
    if low > app.max_batch_size:
        return
    batch = round(low + scale * (app.max_batch_size - low))
    m, s = split_fixed_batch(batch, replicas, app)
    assert 1 <= m <= app.max_local_bsz
    assert s >= 0
    assert replicas * m * (s + 1) <= app.max_batch_size
    if replicas == 1 and batch > app.init_batch_size:
        assert s >= 1
    uncapped = math.ceil(math.ceil(batch / replicas) / (s + 1))
    if m == uncapped:
        assert replicas * m * (s + 1) >= batch


# -- value semantics ---------------------------------------------------------------------------


def test_applications_and_errors_survive_pickling(traces):
    app = fresh(traces, "ncf")
    app.throughput((1,) * 6, 1024)  # builds the 3-D interpolator, which is not shipped
    copy = pickle.loads(pickle.dumps(app))
    assert copy.throughput((1,) * 6, 1024) == app.throughput((1,) * 6, 1024)
    assert copy.throughput((1,) * 7, 1024) == app.throughput((1,) * 7, 1024)
    error = pickle.loads(pickle.dumps(TraceRangeError("ncf", "x", placement=(1,), local_bsz=3.0)))
    assert (error.app, error.placement, error.local_bsz, str(error)) == ("ncf", (1,), 3.0, "ncf: x")
    bad = pickle.loads(pickle.dumps(InvalidArgumentError("epoch", 1.5, "must be an integer")))
    assert (bad.argument, bad.value, str(bad)) == ("epoch", 1.5, "epoch=1.5: must be an integer")


def test_from_trace_is_deterministic_and_frozen(traces, apps):
    again = Application.from_trace(traces["bert"])
    assert again.batch_sizes == apps["bert"].batch_sizes == (12, 24, 48, 96, 192, 384)
    with pytest.raises(AttributeError):
        again.max_epochs = 3
