"""The knobs of the Pollux objective, and the error a policy raises on input it cannot use.

A leaf of the policy package: `types`, `valuation` and `problem` import from here and it
imports none of them, so those modules form no import circle.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class PolicyInputError(ValueError):
    """A cluster state a policy cannot act on (e.g. an allocation naming an unknown node).

    Attributes:
        field: The offending part of the state, e.g. ``"jobs[job-3].allocation"``.
        problem: What is wrong with it.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class Normalisation(enum.Enum):
    """What a speedup of 1.0 means.

    Attributes:
        FAIR_SHARE: The goodput of an equal split of the cluster (the published artifact,
            `A:pollux.py` Problem.__init__): weighs jobs by how much better than a fair share
            they do.
        ONE_GPU: The best goodput on one GPU (the paper's definition, §3.3).
    """

    FAIR_SHARE = "fair_share"
    ONE_GPU = "one_gpu"


@dataclass(frozen=True, slots=True)
class PolluxParams:
    """Knobs of the Pollux objective; the defaults are the published configuration.

    Attributes:
        p: Exponent of the power mean over job speedups: -1 (default) is the paper's fairness
            trade-off, 1 maximises total speedup, very negative approaches max-min fairness.
        restart_delay: Seconds a re-allocation costs, for the restart factor; 0 disables it.
        normalisation: What speedup 1.0 means (see `Normalisation`).
        interference_avoidance: At most one distributed job per node.
        max_nodes_per_job: Most nodes one job may span (the artifact uses 16); None: no cap.
        epsilon: Offset added to scaled speedups so a job without GPUs weighs 1/epsilon.
    """

    p: float = -1.0
    restart_delay: float = 30.0
    normalisation: Normalisation = Normalisation.FAIR_SHARE
    interference_avoidance: bool = True
    max_nodes_per_job: int | None = 16
    epsilon: float = 1e-3

    def __post_init__(self) -> None:
        if not math.isfinite(self.p):
            raise PolicyInputError("params.p", f"must be finite, got {self.p}")
        if self.restart_delay < 0:
            raise PolicyInputError("params.restart_delay", "must be ≥ 0")
        if self.max_nodes_per_job is not None and self.max_nodes_per_job < 1:
            raise PolicyInputError("params.max_nodes_per_job", "must be ≥ 1 or None")
        if not self.epsilon > 0:
            raise PolicyInputError("params.epsilon", "must be > 0")
