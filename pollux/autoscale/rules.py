"""Autoscaling rules as values: which signal they read and the band they keep it in.

A `BandRule` keeps the cluster's utility (predicted useful work per GPU, as a fraction of each
job's first GPU; `pollux.autoscale.curves`) inside [lower, upper]: above `upper` the jobs
would use more GPUs well, so the cluster grows; below `lower` GPUs are wasted, so it shrinks;
either way to the largest size whose utility stays ≥ `lower`. Inside the band nothing moves,
which keeps a cluster from flapping on small changes of the models.

- `GOODPUT_RULE` (Pollux §5.4): goodput, U = 2/3, L = 1/2. A job early in training, whose
  statistical efficiency at large batches is low, gets a small cluster, which grows as its
  gradient noise scale rises.
- `THROUGHPUT_RULE` (the baseline, after Or et al., MLSys'20): throughput at the largest batch
  that fits, the same band; it scales while the throughput per GPU stays near linear,
  whatever the batch does to statistical efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pollux.autoscale.curves import Signal
from pollux.autoscale.types import AutoscaleInputError


@dataclass(frozen=True, slots=True)
class BandRule:
    """Keep the utility of `signal` within [lower, upper] (see the module docstring).

    Attributes:
        name: The rule's name, as decisions report it.
        signal: Goodput or throughput.
        upper: Grow when the utility at the current size is above this, in (0, 1].
        lower: Shrink when it is below this, and size the cluster to the largest whose
            utility is at least this; in (0, upper].
    """

    name: str
    signal: Signal
    upper: float
    lower: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.upper) and 0 < self.upper <= 1):
            raise AutoscaleInputError("rule.upper", f"must be in (0, 1], got {self.upper}")
        if not (math.isfinite(self.lower) and 0 < self.lower <= self.upper):
            raise AutoscaleInputError(
                "rule.lower", f"must be in (0, upper={self.upper}], got {self.lower}"
            )


GOODPUT_RULE = BandRule("goodput", Signal.GOODPUT, upper=2 / 3, lower=1 / 2)
"""Pollux's goodput-driven autoscaling (§5.4): U = 2/3, L = 1/2."""

THROUGHPUT_RULE = BandRule("throughput", Signal.THROUGHPUT, upper=2 / 3, lower=1 / 2)
"""The throughput-based baseline: the same band on throughput scaling."""

RULES = {rule.name: rule for rule in (GOODPUT_RULE, THROUGHPUT_RULE)}
"""Every named rule, the default first."""
