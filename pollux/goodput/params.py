"""Plain parameter types of the goodput model (Pollux paper §3.1–3.2).

`PerfParams` are the seven throughput parameters, `GradParams` the gradient statistics behind
the noise scale, and `GoodputModel` bundles them with a job's batch-size limits: everything the
scheduler needs to predict a job's goodput on any allocation.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields

from pollux import checks
from pollux.goodput._validate import finite_scalar
from pollux.goodput.errors import InvalidInputError


class SyncModel(enum.Enum):
    """How gradient-synchronisation time grows with the size of an allocation.

    Both forms choose the "most significant link": the network when the replicas span more than
    one node, else the node-local interconnect, else nothing (one replica).

    Attributes:
        LINEAR: The published form: ``alpha + beta * max(K - 2, 0)`` for both links, a
            retrogression that grows without bound with the number of replicas K.
        RING: Ring all-reduce: a ring of ``n`` members moves ``2(n-1)/n`` of the gradient over
            each link, so time saturates as the ring grows:
            ``alpha + beta * (1 - 2/n)``, where ``alpha`` is the time of a 2-member ring and
            ``alpha + beta`` the limit of a very large one. The node-local ring has ``n = K``
            members; the network ring crosses each node once, so it has ``n = N`` members.
            This extrapolates from few nodes to many far better than `LINEAR`
            (see ``benchmarks/model_accuracy.py``).
    """

    LINEAR = "linear"
    RING = "ring"


GAMMA_MAX = 10.0
"""Upper bound of the overlap exponent; the published code uses 10 as a stand-in for max()."""


@dataclass(frozen=True, slots=True)
class PerfParams:
    """The seven throughput-model parameters, in the published order (seconds).

    Attributes:
        alpha_c: Fixed compute time of one micro-batch (paper: α_grad).
        beta_c: Compute time per sample of a micro-batch (paper: β_grad).
        alpha_n: Sync time of the smallest cross-node configuration (paper: α_sync^node).
        beta_n: Retrogression of cross-node sync as the allocation grows (paper: β_sync^node).
        alpha_r: Sync time of the smallest single-node configuration (paper: α_sync^local).
        beta_r: Retrogression of single-node sync (paper: β_sync^local).
        gamma: Overlap of compute and sync in [1, 10]: 1 is none (times add), 10 stands in for
            full overlap (the longer one wins).
        sync_model: The shape of sync-time growth the retrogression terms multiply.
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float
    sync_model: SyncModel = SyncModel.RING

    def __post_init__(self) -> None:
        for f in fields(self)[:6]:
            finite_scalar(f.name, getattr(self, f.name), minimum=0.0, strict=True)
        finite_scalar("gamma", self.gamma, minimum=1.0)
        if self.gamma > GAMMA_MAX:
            raise InvalidInputError("gamma", f"must be ≤ {GAMMA_MAX}, got {self.gamma}")
        if not isinstance(self.sync_model, SyncModel):
            raise InvalidInputError("sync_model", f"must be a SyncModel, got {self.sync_model!r}")

    def as_tuple(self) -> tuple[float, float, float, float, float, float, float]:
        """The seven numbers in the published order (alpha_c … gamma)."""
        return (
            self.alpha_c,
            self.beta_c,
            self.alpha_n,
            self.beta_n,
            self.alpha_r,
            self.beta_r,
            self.gamma,
        )


@dataclass(frozen=True, slots=True)
class GradParams:
    """Gradient statistics behind the gradient noise scale (paper §3.1, reference §1.2).

    Attributes:
        sqr: Estimate of |G|², the squared norm of the true (pre-conditioned) gradient; ≥ 0.
        var: Estimate of tr(Σ)/M0, the noise variance of a gradient on an M0-sample batch; ≥ 0.
            With ``sqr == 0`` and ``var > 0`` every batch size is perfectly efficient.
    """

    sqr: float
    var: float

    def __post_init__(self) -> None:
        finite_scalar("grad.sqr", self.sqr, minimum=0.0)
        finite_scalar("grad.var", self.var, minimum=0.0)
        if self.sqr == 0.0 and self.var == 0.0:
            raise InvalidInputError(
                "grad",
                "sqr and var cannot both be 0: the gradient noise scale is undefined "
                "(use GradParams(sqr=0, var=1) for 'no statistics yet')",
            )

    @property
    def noise_scale(self) -> float:
        """The pre-conditioned gradient noise scale φ / M0 = var / sqr (infinite if sqr = 0)."""
        return math.inf if self.sqr == 0.0 else self.var / self.sqr


UNKNOWN_GRAD = GradParams(sqr=0.0, var=1.0)
"""Statistics to assume before a job has reported any: efficiency 1 at every batch size."""


@dataclass(frozen=True, slots=True)
class GoodputModel:
    """Everything needed to predict one job's goodput on any allocation.

    Attributes:
        perf: Fitted throughput parameters.
        grad: Latest gradient statistics.
        init_batch_size: M0, the user's reference total batch size (samples).
        max_batch_size: Largest total batch size the job may use (samples), ≥ M0.
        min_atomic_bsz: Smallest per-GPU micro-batch (samples).
        max_atomic_bsz: Largest per-GPU micro-batch that fits in GPU memory (samples).
        accumulation: Whether gradient accumulation may be used to reach larger batches.
    """

    perf: PerfParams
    grad: GradParams
    init_batch_size: int
    max_batch_size: int
    min_atomic_bsz: int = 1
    max_atomic_bsz: int | None = None
    accumulation: bool = False

    def __post_init__(self) -> None:
        m0 = _positive_int("init_batch_size", self.init_batch_size)
        top = _positive_int("max_batch_size", self.max_batch_size)
        if m0 > top:
            raise InvalidInputError(
                "init_batch_size",
                f"M0={m0} exceeds max_batch_size={top}; raise "
                "max_batch_size to at least the initial batch size",
            )
        lo = _positive_int("min_atomic_bsz", self.min_atomic_bsz)
        hi = (
            top
            if self.max_atomic_bsz is None
            else _positive_int("max_atomic_bsz", self.max_atomic_bsz)
        )
        if lo > hi:
            raise InvalidInputError("min_atomic_bsz", f"{lo} exceeds max_atomic_bsz={hi}")
        if lo > top:
            raise InvalidInputError(
                "min_atomic_bsz", f"{lo} exceeds max_batch_size={top}: no allocation could run"
            )
        if not self.accumulation and m0 > hi:
            raise InvalidInputError(
                "max_atomic_bsz",
                f"a single GPU cannot hold the initial batch M0={m0} in "
                f"micro-batches of at most {hi} without gradient accumulation; "
                "enable accumulation or raise max_atomic_bsz",
            )
        if not isinstance(self.perf, PerfParams):
            raise InvalidInputError("perf", f"must be PerfParams, got {type(self.perf).__name__}")
        if not isinstance(self.grad, GradParams):
            raise InvalidInputError("grad", f"must be GradParams, got {type(self.grad).__name__}")

    @property
    def atomic_bsz_range(self) -> tuple[int, int]:
        """(min, max) per-GPU micro-batch size, with the maximum resolved."""
        hi = self.max_batch_size if self.max_atomic_bsz is None else self.max_atomic_bsz
        return self.min_atomic_bsz, hi


def _positive_int(field: str, value: object) -> int:
    return checks.whole_number(
        value, least=1, reals=True, error=lambda problem: InvalidInputError(field, str(problem))
    )
