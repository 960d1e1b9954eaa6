"""The goodput model: statistical efficiency × throughput, fitted online (Pollux §3).

Pure, vectorised numpy over plain dataclasses; no I/O. Typical use::

    fit = fit_perf_params(nodes, replicas, atomic_bsz, accum_time, optim_time)
    model = GoodputModel(fit.params, GradParams(sqr, var), init_batch_size=128,
                         max_batch_size=4096, min_atomic_bsz=32, max_atomic_bsz=1024,
                         accumulation=True)
    choice = best_batch(model, num_nodes=2, num_replicas=8)
    table = speedup_table(model, max_nodes=16, max_replicas=64, gpus_per_node=4)
"""

from pollux.goodput.batch import BatchChoice, best_batch, goodput
from pollux.goodput.efficiency import efficiency, gain
from pollux.goodput.errors import FitError, GoodputError, InvalidInputError
from pollux.goodput.fit import FitResult, Observations, fit_perf_params
from pollux.goodput.params import (
    UNKNOWN_GRAD,
    GoodputModel,
    GradParams,
    PerfParams,
    SyncModel,
)
from pollux.goodput.speedup import speedup, speedup_table
from pollux.goodput.throughput import iteration_time, step_times, throughput

__all__ = [
    "UNKNOWN_GRAD",
    "BatchChoice",
    "FitError",
    "FitResult",
    "GoodputError",
    "GoodputModel",
    "GradParams",
    "InvalidInputError",
    "Observations",
    "PerfParams",
    "SyncModel",
    "best_batch",
    "efficiency",
    "fit_perf_params",
    "gain",
    "goodput",
    "iteration_time",
    "speedup",
    "speedup_table",
    "step_times",
    "throughput",
]
