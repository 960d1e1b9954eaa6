"""Speedup tables: shape, masking of impossible allocations, agreement with point queries."""

import numpy as np
import pytest

from pollux.goodput import (
    GoodputModel,
    GradParams,
    PerfParams,
    best_batch,
    speedup,
    speedup_table,
)

MODEL = GoodputModel(
    PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0),
    GradParams(sqr=1.0, var=20.0),
    init_batch_size=128,
    max_batch_size=4096,
    min_atomic_bsz=32,
    max_atomic_bsz=512,
    accumulation=True,
)


def test_table_covers_every_allocation_of_the_cluster_shape():
    table = speedup_table(MODEL, max_nodes=4, max_replicas=16, gpus_per_node=4)
    assert table.shape == (5, 17)
    nodes, replicas = np.meshgrid(np.arange(5), np.arange(17), indexing="ij")
    possible = (nodes >= 1) & (nodes <= replicas) & (replicas <= 4 * nodes)
    assert np.all(table[possible] > 0)
    assert np.all(table[~possible] == 0)
    assert table[1, 1] == 1.0


def test_table_agrees_with_point_queries():
    table = speedup_table(MODEL, max_nodes=8, max_replicas=32)
    nodes = np.array([1, 1, 2, 4, 8, 0])
    replicas = np.array([1, 4, 8, 16, 32, 0])
    np.testing.assert_allclose(speedup(MODEL, nodes, replicas), table[nodes, replicas])
    base = best_batch(MODEL, 1, 1).goodput
    assert table[2, 8] == pytest.approx(float(best_batch(MODEL, 2, 8).goodput / base))


def test_allocations_too_large_for_the_maximum_batch_have_zero_speedup():
    # 4096 / 32 = 128 replicas is the most that can each take a 32-sample micro-batch.
    table = speedup_table(MODEL, max_nodes=1, max_replicas=160)
    assert table[1, 128] > 0
    assert np.all(table[1, 129:] == 0)


def test_consolidated_allocations_are_faster_than_spread_ones():
    table = speedup_table(MODEL, max_nodes=4, max_replicas=4)
    assert table[1, 4] > table[2, 4] >= table[4, 4]
