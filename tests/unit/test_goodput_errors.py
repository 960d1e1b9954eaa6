"""Every invalid input raises InvalidInputError naming the field; NaN never leaks through."""

import math

import numpy as np
import pytest

from pollux.goodput import (
    GoodputModel,
    GradParams,
    InvalidInputError,
    PerfParams,
    best_batch,
    efficiency,
    fit_perf_params,
    gain,
    goodput,
    speedup,
    speedup_table,
    step_times,
    throughput,
)

PERF = PerfParams(0.1, 0.001, 0.2, 0.05, 0.05, 0.01, 1.5)
GRAD = GradParams(sqr=1.0, var=5.0)
GOOD_OBS = ([1, 2], [1, 4], [32, 64], [0.1, 0.2], [0.1, 0.3])


def model(**overrides):
    fields = {
        "perf": PERF,
        "grad": GRAD,
        "init_batch_size": 128,
        "max_batch_size": 1024,
        "min_atomic_bsz": 16,
        "max_atomic_bsz": 256,
        "accumulation": True,
    }
    fields.update(overrides)
    return GoodputModel(**fields)


def fit_with(index, value):
    cols = [list(c) for c in GOOD_OBS]
    cols[index] = value
    return fit_perf_params(*cols)


@pytest.mark.parametrize(
    ("index", "value", "field"),
    [
        (3, [-0.1, 0.2], "accum_step_time"),
        (4, [0.1, 0.0], "optim_step_time"),
        (3, [math.nan, 0.2], "accum_step_time"),
        (4, [0.1, math.inf], "optim_step_time"),
        (2, [0, 64], "atomic_bsz"),
        (0, [3, 2], "num_nodes"),
        (1, [1, 2.5], "num_replicas"),
        (1, [1], "num_replicas"),
        (0, [[1, 2]], "num_nodes"),
    ],
    ids=[
        "negative accumulation time",
        "zero optimizer time",
        "NaN time",
        "infinite time",
        "zero batch",
        "more nodes than replicas",
        "fractional replicas",
        "column too short",
        "two-dimensional column",
    ],
)
def test_bad_observations_are_rejected_by_name(index, value, field):
    with pytest.raises(InvalidInputError) as err:
        fit_with(index, value)
    assert err.value.field == field
    assert field in str(err.value)


def test_empty_observations_are_rejected():
    with pytest.raises(InvalidInputError, match="no observations"):
        fit_perf_params([], [], [], [], [])


def test_max_starts_must_be_positive():
    with pytest.raises(InvalidInputError, match="max_starts"):
        fit_perf_params(*GOOD_OBS, max_starts=0)


@pytest.mark.parametrize(
    ("sqr", "var", "field"),
    [
        (math.nan, 1.0, "grad.sqr"),
        (1.0, math.inf, "grad.var"),
        (-1.0, 1.0, "grad.sqr"),
        (1.0, -1e-9, "grad.var"),
        (0.0, 0.0, "grad"),
    ],
    ids=["NaN sqr", "infinite var", "negative sqr", "negative var", "both zero"],
)
def test_bad_gradient_statistics_are_rejected(sqr, var, field):
    with pytest.raises(InvalidInputError) as err:
        GradParams(sqr=sqr, var=var)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("index", "value", "field"),
    [
        (0, 0.0, "alpha_c"),
        (1, -1.0, "beta_c"),
        (2, math.nan, "alpha_n"),
        (6, 0.5, "gamma"),
        (6, 11.0, "gamma"),
    ],
    ids=["zero alpha_c", "negative beta_c", "NaN alpha_n", "gamma below 1", "gamma above 10"],
)
def test_bad_throughput_parameters_are_rejected(index, value, field):
    values = list(PERF.as_tuple())
    values[index] = value
    with pytest.raises(InvalidInputError) as err:
        PerfParams(*values)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"init_batch_size": 2048}, "init_batch_size"),
        ({"init_batch_size": 0}, "init_batch_size"),
        ({"max_batch_size": 100.5}, "max_batch_size"),
        ({"min_atomic_bsz": 300}, "min_atomic_bsz"),
        ({"max_atomic_bsz": 64, "accumulation": False}, "max_atomic_bsz"),
        ({"perf": (0.1,) * 7}, "perf"),
        ({"grad": None}, "grad"),
    ],
    ids=[
        "M0 above the maximum batch",
        "zero M0",
        "fractional maximum",
        "min above max atomic",
        "M0 does not fit one GPU without accumulation",
        "perf not PerfParams",
        "grad not GradParams",
    ],
)
def test_bad_models_are_rejected(overrides, field):
    with pytest.raises(InvalidInputError) as err:
        model(**overrides)
    assert err.value.field == field


def test_numpy_integers_are_accepted_as_batch_sizes():
    assert model(init_batch_size=np.int64(128)).init_batch_size == 128


@pytest.mark.parametrize(
    "call",
    [
        lambda: step_times(PERF, 3, 2, 32),
        lambda: throughput(PERF, 1, 1, 32, -1),
        lambda: throughput(PERF, 1, 1, math.nan),
        lambda: best_batch(model(), [2, 1], [1, 1]),
        lambda: best_batch(model(), 0, 1),
        lambda: best_batch(model(), 1, 1, num_candidates=0),
        lambda: goodput(model(), 1, [1, 2], [32, 32, 32]),
        lambda: efficiency(GRAD, 0, 128),
        lambda: efficiency(GRAD, 128, [128, math.nan]),
        lambda: gain(GRAD, 0),
        lambda: speedup(model(), 1, 0),
        lambda: speedup(model(), 2, 1),
        lambda: speedup_table(model(), 0, 4),
        lambda: speedup_table(model(), 4, 4, gpus_per_node=0),
    ],
    ids=[
        "N > K",
        "negative accumulation steps",
        "NaN batch",
        "N > K in an array",
        "zero nodes",
        "no candidates",
        "shapes do not broadcast",
        "zero M0",
        "NaN batch size",
        "zero scale",
        "nodes without replicas",
        "N > K for speedup",
        "empty table",
        "zero GPUs per node",
    ],
)
def test_bad_queries_are_rejected(call):
    with pytest.raises(InvalidInputError):
        call()


def test_speedup_without_a_feasible_single_gpu_batch_is_an_error_not_nan():
    narrow = model(init_batch_size=100, max_batch_size=100, min_atomic_bsz=55, max_atomic_bsz=60)
    with pytest.raises(InvalidInputError, match="one GPU"):
        speedup_table(narrow, 2, 4)
