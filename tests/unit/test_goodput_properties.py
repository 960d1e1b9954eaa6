"""Properties of efficiency, throughput and the batch choice, checked with hypothesis."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.goodput import (
    GoodputModel,
    GradParams,
    PerfParams,
    SyncModel,
    best_batch,
    efficiency,
    speedup_table,
    throughput,
)

positive = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)
times = st.floats(min_value=1e-5, max_value=10.0)
grads = st.builds(GradParams, sqr=st.floats(0, 1e3), var=st.floats(1e-6, 1e3))
perfs = st.builds(
    PerfParams,
    times,
    st.floats(1e-7, 1e-1),
    times,
    times,
    times,
    times,
    st.floats(1.0, 10.0),
    st.sampled_from(list(SyncModel)),
)


@given(grad=grads, m0=st.integers(1, 4096), batches=st.lists(st.integers(1, 10**6), min_size=2))
def test_efficiency_is_in_unit_interval_and_non_increasing(grad, m0, batches):
    batches = np.sort(np.array(batches))
    eff = efficiency(grad, m0, batches)
    assert np.all(eff > 0)
    assert np.all(eff <= 1 + 1e-12)
    assert np.all(np.diff(eff) <= 1e-12)


@given(
    perf=perfs,
    nodes=st.integers(1, 16),
    extra=st.integers(0, 48),
    steps=st.integers(0, 8),
    m=st.integers(1, 2048),
)
def test_throughput_increases_with_the_per_gpu_batch(perf, nodes, extra, steps, m):
    replicas = nodes + extra
    a = throughput(perf, nodes, replicas, m, steps)
    b = throughput(perf, nodes, replicas, m + 1, steps)
    assert b > a


@st.composite
def models(draw):
    m0 = draw(st.integers(1, 512))
    top = draw(st.integers(m0, m0 * 64))
    lo = draw(st.integers(1, min(top, 256)))
    hi = draw(st.integers(lo, top))
    accumulation = draw(st.booleans())
    if not accumulation and hi < m0:
        accumulation = True
    return GoodputModel(
        draw(perfs),
        draw(grads),
        init_batch_size=m0,
        max_batch_size=top,
        min_atomic_bsz=lo,
        max_atomic_bsz=hi,
        accumulation=accumulation,
    )


@settings(max_examples=200)
@given(
    model=models(),
    nodes=st.lists(st.integers(1, 16), min_size=1, max_size=8),
    extra=st.lists(st.integers(0, 64), min_size=1, max_size=8),
)
def test_chosen_batch_respects_every_bound(model, nodes, extra):
    size = min(len(nodes), len(extra))
    n = np.array(nodes[:size])
    k = n + np.array(extra[:size])
    choice = best_batch(model, n, k)
    lo, hi = model.atomic_bsz_range
    feasible = choice.goodput > 0
    m, s = choice.atomic_bsz[feasible], choice.accum_steps[feasible]
    total = choice.total_batch_size(k)[feasible]
    assert np.all((m >= lo) & (m <= hi))
    assert np.all(s >= 0)
    assert np.all(total <= model.max_batch_size)
    # Rounding the per-GPU batch down may lose at most one sample per micro-batch below M0.
    assert np.all(total >= model.init_batch_size - k[feasible] * (s + 1))
    if not model.accumulation:
        assert np.all(s == 0)
    # An allocation whose smallest micro-batches already overshoot the maximum is infeasible,
    # and infeasible allocations report no configuration.
    assert not np.any(feasible & (k * lo > model.max_batch_size))
    assert np.all(choice.atomic_bsz[~feasible] == 0)
    assert np.all(choice.accum_steps[~feasible] == 0)


@settings(max_examples=50)
@given(model=models())
def test_speedup_table_is_relative_to_one_gpu(model):
    if best_batch(model, 1, 1).goodput <= 0:
        return
    table = speedup_table(model, max_nodes=4, max_replicas=16, gpus_per_node=4)
    assert table[1, 1] == 1.0
    assert table[0, 0] == 0.0
    assert np.all(table >= 0)
    assert np.all(np.isfinite(table))
    nodes, replicas = np.nonzero(table)
    choice = best_batch(model, nodes, replicas)
    np.testing.assert_allclose(
        table[nodes, replicas], choice.goodput / best_batch(model, 1, 1).goodput, rtol=1e-12
    )
