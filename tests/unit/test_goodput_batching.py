"""Batched goodput queries give exactly what separate `best_batch` calls give.

The scheduler batches the speedups it needs from many jobs, and several calls of one job, into
one vectorised evaluation; its decisions may only get faster, never different. numpy's
geomspace spaces a call's candidates by all of its columns (a column with an empty range
changes the others' last bits), so the batched path must reproduce each call's spacing.
"""

import numpy as np

from pollux.goodput import GoodputModel, GradParams, PerfParams, SyncModel, best_batch
from pollux.goodput.batch import GoodputModels, _divide_first, _geomspace


def models() -> list[GoodputModel]:
    """Models whose largest sizes cannot run (empty candidate ranges) mixed with ones that can."""
    out = []
    for i, (m0, top_factor, ring) in enumerate([(128, 32, False), (8, 2, True), (20, 4, False)]):
        out.append(
            GoodputModel(
                PerfParams(
                    0.02 + i / 100,
                    0.0007,
                    0.15,
                    0.05,
                    0.03,
                    0.004,
                    1.5 + i / 4,
                    sync_model=SyncModel.RING if ring else SyncModel.LINEAR,
                ),
                GradParams(sqr=1.0, var=20.0 + 50 * i),
                init_batch_size=m0,
                max_batch_size=m0 * top_factor,
                min_atomic_bsz=max(1, m0 // 4),
                max_atomic_bsz=m0 * 2,
                accumulation=i != 1,
            )
        )
    return out


def test_geomspace_is_numpys_per_call():
    rng = np.random.default_rng(0)
    for _ in range(200):
        low = rng.integers(1, 5000, size=12).astype(float)
        top = np.full(12, 4096.0)
        low = np.minimum(low, top)
        calls = rng.integers(0, 3, size=12)
        got = _geomspace(low, top, 50, _divide_first(low, top, 50, calls))
        for call in np.unique(calls):
            mine = calls == call
            np.testing.assert_array_equal(got[:, mine], np.geomspace(low[mine], top[mine], 50))


def test_batched_queries_equal_separate_best_batch_calls():
    rng = np.random.default_rng(1)
    zoo = models()
    index = rng.integers(0, len(zoo), size=300)
    replicas = rng.integers(1, 80, size=300)
    nodes = np.minimum(rng.integers(1, 17, size=300), replicas)
    calls = rng.integers(0, 4, size=300) * len(zoo) + index  # a call asks one model
    got = GoodputModels(zoo).best_goodput(index, nodes, replicas, calls=calls)
    for call in np.unique(calls):
        mine = calls == call
        expected = best_batch(zoo[int(index[mine][0])], nodes[mine], replicas[mine]).goodput
        np.testing.assert_array_equal(got[mine], expected)
