"""Goodput-driven cluster autoscaling (Pollux §5.4): how many nodes each pool should have.

Pure decisions over plain dataclasses, no I/O: a provisioner (the simulator's
`pollux.sim.autoscaling`, or a live one) builds an `AutoscaleState` from its jobs, pools and
nodes, calls `autoscale`, and carries out the `AutoscaleDecision` (docs/autoscaling.md)::

    decision = autoscale(AutoscaleState(now, jobs, pools, nodes, history), GOODPUT_RULE)
    decision.desired            # {"t4": 5}
    decision.pools["t4"].reason # "up 2 → 5 nodes: goodput per GPU 0.81 of ideal at 8 GPUs ..."
"""

from pollux.autoscale.curves import Signal, concave_majorant, job_curve, total_speedup
from pollux.autoscale.decide import autoscale, size_ladder
from pollux.autoscale.rules import GOODPUT_RULE, RULES, THROUGHPUT_RULE, BandRule
from pollux.autoscale.types import (
    AutoscaleDecision,
    AutoscaleInputError,
    AutoscaleState,
    NodePool,
    NodeStatus,
    PoolDecision,
    PoolHistory,
)

__all__ = [
    "GOODPUT_RULE",
    "RULES",
    "THROUGHPUT_RULE",
    "AutoscaleDecision",
    "AutoscaleInputError",
    "AutoscaleState",
    "BandRule",
    "NodePool",
    "NodeStatus",
    "PoolDecision",
    "PoolHistory",
    "Signal",
    "autoscale",
    "concave_majorant",
    "job_curve",
    "size_ladder",
    "total_speedup",
]
