"""Per-type goodput models: one fit per type, and models for types a job has not run on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.goodput import (
    GoodputModel,
    GradParams,
    InvalidInputError,
    Observations,
    PerfParams,
    step_times,
)
from pollux.goodput.throughput import TINY
from pollux.goodput.typed import (
    OneGpuSteps,
    TypedProfile,
    bootstrap,
    fit_by_type,
    models_by_type,
    transfer,
)

SLOW = PerfParams(0.04, 0.002, 0.3, 0.05, 0.05, 0.01, 1.5)
FAST = PerfParams(0.01, 0.0004, 0.08, 0.01, 0.01, 0.002, 1.5)


def observations(perf: PerfParams) -> Observations:
    """Noise-free mean step times of `perf` on a grid of (N, K, m)."""
    rows = [(n, k, m) for n, k in ((1, 1), (1, 2), (1, 4), (2, 8), (4, 16)) for m in (32, 64, 128)]
    n, k, m = (np.array(c, dtype=np.float64) for c in zip(*rows, strict=True))
    accum, optim = step_times(perf, n, k, m)
    return Observations.from_columns(n, k, m, accum, optim)


def model(perf: PerfParams, max_atomic: int = 256) -> GoodputModel:
    return GoodputModel(
        perf,
        GradParams(1.0, 20.0),
        init_batch_size=128,
        max_batch_size=4096,
        min_atomic_bsz=16,
        max_atomic_bsz=max_atomic,
        accumulation=True,
    )


def test_each_type_gets_its_own_fit():
    profile = TypedProfile({"t4": observations(SLOW), "a100": observations(FAST)})
    fits = fit_by_type(profile)
    assert set(fits) == {"t4", "a100"}
    for gpu_type, _truth in (("t4", SLOW), ("a100", FAST)):
        obs = profile.observations[gpu_type]
        _, predicted = step_times(
            fits[gpu_type].params, obs.num_nodes, obs.num_replicas, obs.atomic_bsz
        )
        assert np.allclose(predicted, obs.optim_step_time, rtol=0.05), gpu_type
    # The fast type's fitted compute is faster than the slow type's at every batch.
    m = np.array([32.0, 128.0])
    fast = fits["a100"].params.alpha_c + fits["a100"].params.beta_c * m
    slow = fits["t4"].params.alpha_c + fits["t4"].params.beta_c * m
    assert (fast < slow).all()


def test_a_bad_type_is_named_in_the_error():
    bad = Observations(*(np.array([1.0]) for _ in range(4)), np.array([np.nan]))
    with pytest.raises(InvalidInputError, match=r"observations\[a100\]"):
        fit_by_type(TypedProfile({"a100": bad}))


@settings(max_examples=40, deadline=None)
@given(ratio=st.floats(0.1, 10.0), m=st.lists(st.integers(8, 512), min_size=1, max_size=4))
def test_transfer_scales_compute_and_pins_sync_optimistic(ratio, m):
    ms = np.array(sorted(set(m)), dtype=np.float64)
    moved = transfer(SLOW, ms, np.full(ms.size, ratio))
    # A constant ratio moves the compute line exactly, at every batch.
    grid = np.array([16.0, 100.0, 700.0])
    expected = (SLOW.alpha_c + SLOW.beta_c * grid) * ratio
    assert np.allclose(moved.alpha_c + moved.beta_c * grid, expected, rtol=1e-6)
    assert moved.alpha_r == moved.beta_r == TINY
    assert moved.alpha_n > moved.alpha_r
    assert moved.alpha_n < 10 * TINY
    assert moved.gamma == SLOW.gamma


def test_transfer_follows_a_ratio_that_grows_with_the_batch():
    ms = np.array([32.0, 256.0])
    moved = transfer(SLOW, ms, np.array([0.9, 0.3]))  # large batches gain most
    compute = moved.alpha_c + moved.beta_c * ms
    assert np.allclose(compute, (SLOW.alpha_c + SLOW.beta_c * ms) * [0.9, 0.3])


def test_transfer_rejects_missing_or_bad_ratios():
    with pytest.raises(InvalidInputError):
        transfer(SLOW, np.zeros(0), np.zeros(0))
    with pytest.raises(InvalidInputError):
        transfer(SLOW, np.array([32.0]), np.array([0.0]))


def test_bootstrap_order_own_then_transfer_then_as_known():
    own = model(FAST)
    known = {"t4": model(SLOW)}
    assert bootstrap({**known, "a100": own}, "a100") is own
    # No seed: the known model as it is (ratio 1), so the policy tries the type.
    assert bootstrap(known, "a100") is known["t4"]
    seed = OneGpuSteps(
        {"t4": {32: 0.1, 64: 0.16}, "a100": {32: 0.05, 64: 0.06}}, max_atomic_bsz={"a100": 1024}
    )
    moved = bootstrap(known, "a100", seed)
    assert moved is not None
    assert moved.max_atomic_bsz == 1024
    assert moved.perf.alpha_c + moved.perf.beta_c * 64 < SLOW.alpha_c + SLOW.beta_c * 64
    assert moved.grad == known["t4"].grad
    assert moved.init_batch_size == 128
    assert bootstrap({}, "a100", seed) is None


def test_a_seed_without_common_batches_falls_back_to_ratio_one():
    known = {"t4": model(SLOW)}
    seed = OneGpuSteps({"t4": {32: 0.1}, "a100": {64: 0.05}})
    assert bootstrap(known, "a100", seed) is known["t4"]


def test_seed_validation():
    with pytest.raises(InvalidInputError, match="seconds"):
        OneGpuSteps({"t4": {0: 0.1}})
    with pytest.raises(InvalidInputError):
        OneGpuSteps({"t4": {32: -1.0}})


def test_models_by_type_covers_every_type():
    known = {"t4": model(SLOW)}
    out = models_by_type(known, frozenset({"t4", "a100", "h100"}))
    assert set(out) == {"t4", "a100", "h100"}
    assert models_by_type({}, ("a100",)) == {}
    fitted = replace(known["t4"], perf=FAST)
    assert models_by_type({"a100": fitted}, ("a100",))["a100"] is fitted
