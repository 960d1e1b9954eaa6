"""How useful each GPU count would be to the active jobs: per-job curves and cluster utility.

A job's curve c[K] is its predicted speedup on K GPUs packed onto as few nodes as possible,
over its speedup on one GPU (Pollux §3, `pollux.goodput.speedup_table`). The *signal* says
which speedup: goodput (throughput × statistical efficiency, Pollux's autoscaler) or throughput
alone (a throughput-based autoscaler, which ignores statistical efficiency). A job without a
fitted model is assumed to scale linearly, as the Pollux policy assumes, up to its replica
limit; no curve grows past the job's `max_replicas`.

The cluster's best total speedup on G GPUs, S(G), is found on the curves' concave majorants:
then the G largest increments over all jobs are the best split, S(G) is concave, and the
utility S(G) / G (useful work per GPU, as a fraction of each job's first GPU) never rises with
G, which makes "the largest cluster whose utility stays above L" well defined.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pollux.goodput import UNKNOWN_GRAD, GoodputModel, speedup_table
from pollux.policy.types import JobInfo

FloatArray = npt.NDArray[np.float64]


class Signal(enum.Enum):
    """What a job's speedup counts.

    Attributes:
        GOODPUT: Throughput × statistical efficiency at the best batch size (Pollux).
        THROUGHPUT: Samples per second at the throughput-maximising batch, statistical
            efficiency ignored (a throughput-based autoscaler).
    """

    GOODPUT = "goodput"
    THROUGHPUT = "throughput"


def job_curve(job: JobInfo, signal: Signal, gpus_per_node: int, max_gpus: int) -> FloatArray:
    """Speedup of `job` on K = 0..max_gpus consolidated GPUs (entry K), flat past its limit.

    Entries past the job's `max_replicas` repeat its value there: more GPUs add nothing.
    """
    top = max(0, min(job.max_replicas, max_gpus))
    curve = np.zeros(max_gpus + 1)
    if top == 0:
        return curve
    model = job.model
    if model is None:
        curve[1 : top + 1] = np.arange(1, top + 1, dtype=np.float64)
    else:
        if signal is Signal.THROUGHPUT:
            model = _throughput_only(model)
        nodes = -(-top // gpus_per_node)
        table = speedup_table(model, nodes, top, gpus_per_node=gpus_per_node)
        k = np.arange(1, top + 1)
        curve[1 : top + 1] = table[-(-k // gpus_per_node), k]
    curve[top + 1 :] = curve[top]
    return curve


def _throughput_only(model: GoodputModel) -> GoodputModel:
    """The same model blind to statistical efficiency (efficiency 1 at every batch size)."""
    return GoodputModel(
        model.perf,
        UNKNOWN_GRAD,
        init_batch_size=model.init_batch_size,
        max_batch_size=model.max_batch_size,
        min_atomic_bsz=model.atomic_bsz_range[0],
        max_atomic_bsz=model.atomic_bsz_range[1],
        accumulation=model.accumulation,
    )


def concave_majorant(curve: FloatArray) -> FloatArray:
    """The least concave function ≥ `curve` on 0..len−1 (its upper hull), non-decreasing.

    A curve that dips (e.g. when K first spans two nodes) is lifted to the chord over the
    dip: the GPUs of the dip are worth their share of the gain at its far end.
    """
    lifted = np.maximum.accumulate(curve)  # more GPUs can always be left idle
    hull: list[int] = [0]
    for k in range(1, len(lifted)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or under the chord a → k: drop it.
            if (lifted[b] - lifted[a]) * (k - a) <= (lifted[k] - lifted[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(k)
    return np.interp(np.arange(len(lifted)), hull, lifted[hull])


def total_speedup(curves: Sequence[FloatArray], max_gpus: int) -> FloatArray:
    """S(G) for G = 0..max_gpus: the best total speedup of the jobs on G GPUs (majorants)."""
    if not curves:
        return np.zeros(max_gpus + 1)
    steps = np.concatenate([np.diff(concave_majorant(c[: max_gpus + 1])) for c in curves])
    steps = np.sort(steps[steps > 0])[::-1][:max_gpus]
    total = np.zeros(max_gpus + 1)
    total[1 : len(steps) + 1] = np.cumsum(steps)
    total[len(steps) + 1 :] = total[len(steps)]
    return total


def utility(total: FloatArray, gpus: int) -> float:
    """S(G) / G at G = `gpus` (inf at 0 GPUs when some job could use one, NaN when none)."""
    if gpus > 0:
        return float(total[min(gpus, len(total) - 1)] / gpus)
    return float("inf") if len(total) > 1 and total[-1] > 0 else float("nan")
