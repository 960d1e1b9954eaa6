"""Inputs and outputs shared by every cluster policy (Pollux, Optimus+Oracle, Tiresias).

A policy is a pure function of a `ClusterState` snapshot, the `memory` it returned last round,
and a random generator: no clock, ids or randomness of its own, so that the simulator and the
scheduler service get the same decision from the same inputs, and a recorded decision can be
replayed. Allocations name a node per replica; the same node repeated means several replicas
(GPUs) on it. Tenants (teams with GPU guarantees, weights and caps) are optional: a state
without them is scheduled exactly as before they existed (`pollux.policy.tenant_shares`).
The `Policy` protocol also says what callers need to know of a policy (how its jobs size
themselves, whether they need an oracle, how far they may grow), so no caller asks its name.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from pollux.goodput import GoodputModel
from pollux.policy.exploration import Exploration
from pollux.policy.params import PolicyInputError, PolluxParams

M = TypeVar("M")
"""A policy's memory between rounds (its own type: None, a ledger, Tiresias' queues)."""

Allocation = tuple[str, ...]
"""Node name of each replica, replicas of one node adjacent; () means no GPUs."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node that can run replicas.

    Attributes:
        name: Unique node name.
        gpus: Number of GPUs (replica slots) on the node, ≥ 1.
        gpu_type: The kind of its GPUs (e.g. "a100"); "" (the default) is one unnamed type.
            A job runs on nodes of one type only; with several types in a state the Pollux
            policies choose each job's type (`pollux.policy.typed_problem`).
    """

    name: str
    gpus: int
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class OracleInfo:
    """What Optimus+Oracle knows about a job (in the simulator: the truth from the traces).

    Attributes:
        step_time: Seconds per optimizer step at K replicas on a consolidated placement, indexed
            by K (entry 0 unused); its length - 1 is the most replicas that were evaluated.
        remaining_iterations: Optimizer steps left until the job completes.
    """

    step_time: npt.NDArray[np.float64]
    remaining_iterations: float


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One active job as the policy sees it.

    Attributes:
        name: Unique job name.
        submission_time: When the job was submitted (seconds, same clock as `ClusterState.now`).
        allocation: Its current allocation.
        restarts: Re-allocations so far (the first allocation is not a restart).
        attained_service: GPU-seconds the job has held so far.
        min_replicas: Fewest replicas it may run on once allocated (0: may be suspended).
        max_replicas: Most replicas it may be given.
        model: Its goodput model, or None before one has been fitted (Pollux assumes linear
            scaling then).
        target_replicas: A fixed GPU demand (Tiresias runs jobs at exactly this size).
        target_batch_size: A fixed total batch size (baselines that do not adapt it).
        oracle: Step times and remaining work (Optimus+Oracle).
        tenant: Name of the tenant (team) the job belongs to; "" or a name no `TenantSpec`
            defines puts it in the implicit default tenant (`pollux.policy.tenant_shares`).
        remaining_work: The job's declared remaining work, in the units the training library
            counts progress in: scale-invariant steps at the initial batch size M0 (one step
            on M0 samples = 1; a step on a larger batch counts its AdaScale gain), i.e. its
            progress target minus its progress. None: the job declared no size. Only the
            "jct" mode of the Pollux policy reads it (`pollux.policy.jct`).
        restart_pause_s: Seconds a re-allocation of this job costs (its measured checkpoint-
            restart pause); None: the policy's `PolluxParams.restart_delay`. Only the "jct"
            mode reads it; the faithful policy always uses the flat delay, as published.
        resizes: Changes of the job's GPU count after its first allocation (suspension and
            resumption included; a move to as many GPUs elsewhere is not one).
        reversals: Resizes that undid the direction of the one before (a grow after a
            shrink, a shrink after a grow). Only the "jct" mode reads these two
            (`pollux.policy.jct.reversal_odds`); `resize_history` keeps them.
        last_resize: Direction of the latest resize: +1 grew, −1 shrank, 0 none yet.
        models: Its goodput model on each GPU type it has one for (measured or bootstrapped,
            `pollux.goodput.typed`), keyed by `NodeInfo.gpu_type`; read-only. `model` stays
            the model of its current type, so single-type policies never read this. Empty
            (the default): `model` serves every type.
        gpu_types: The GPU types it may run on (a hard constraint); None (the default): any.
            Non-empty when set.

        owner: The user who submitted it. The users of a tenant share it alike, however
            many jobs each queues (`pollux.policy.owners`); jobs of one owner are scheduled
            exactly as jobs of no owner ("").
        label: What people call the job (its spec's name, which several jobs may share);
            "": `name`. Reasons name other jobs by it (`pollux.policy.problem`); the policy
            never decides by it.
    """

    name: str
    submission_time: float
    allocation: Allocation = ()
    restarts: int = 0
    attained_service: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 1
    model: GoodputModel | None = None
    target_replicas: int | None = None
    target_batch_size: int | None = None
    oracle: OracleInfo | None = None
    tenant: str = ""
    remaining_work: float | None = None
    restart_pause_s: float | None = None
    resizes: int = 0
    reversals: int = 0
    last_resize: int = 0
    models: Mapping[str, GoodputModel] = field(default_factory=dict)
    gpu_types: frozenset[str] | None = None

    def model_on(self, gpu_type: str) -> GoodputModel | None:
        """Its goodput model on `gpu_type`: that type's, else `model` (None: none fitted)."""
        return self.models.get(gpu_type, self.model)

    def allows(self, gpu_type: str) -> bool:
        """Whether it may run on GPUs of `gpu_type`."""
        return self.gpu_types is None or gpu_type in self.gpu_types

    owner: str = ""
    label: str = ""


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant (team) sharing the cluster, as an administrator defines it.

    Guarantees may add up to more than the cluster's GPUs (a cluster shrinks when nodes fail,
    and a fixed tenant table must not stop scheduling then): they are scaled down in
    proportion until they fit (`pollux.policy.tenant_shares.common.entitlements`).

    Attributes:
        name: Unique, non-empty tenant name ("" is the implicit default tenant).
        guarantee_gpus: GPUs the tenant gets whenever its jobs can use them, ≥ 0.
        weight: Its share of the unguaranteed GPUs' goodput relative to other tenants, > 0.
        cap_gpus: Most GPUs it may hold at once, ≥ guarantee_gpus; 0 or None: no cap.

    Raises:
        PolicyInputError: A field is out of range.
    """

    name: str
    guarantee_gpus: int = 0
    weight: float = 1.0
    cap_gpus: int | None = None

    def __post_init__(self) -> None:
        where = f"tenants[{self.name}]"
        if not isinstance(self.name, str) or not self.name:
            raise PolicyInputError("tenants[].name", "must be a non-empty string")
        if not isinstance(self.guarantee_gpus, int) or self.guarantee_gpus < 0:
            raise PolicyInputError(
                f"{where}.guarantee_gpus", f"must be an integer ≥ 0, got {self.guarantee_gpus}"
            )
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise PolicyInputError(f"{where}.weight", f"must be finite and > 0, got {self.weight}")
        cap = self.cap_gpus
        if cap is not None and (not isinstance(cap, int) or cap < 0):
            raise PolicyInputError(f"{where}.cap_gpus", f"must be an integer ≥ 0, got {cap}")
        if cap and cap < self.guarantee_gpus:
            raise PolicyInputError(
                f"{where}.cap_gpus",
                f"cap {cap} is below the guarantee {self.guarantee_gpus} (0 or None: no cap)",
            )

    @property
    def cap(self) -> int | None:
        """The cap in GPUs, None when there is none (0 means none)."""
        return self.cap_gpus or None


@dataclass(frozen=True, slots=True)
class ClusterState:
    """A consistent snapshot of the cluster for one scheduling round.

    Attributes:
        now: The round's time (seconds).
        nodes: Nodes in a stable order (the order breaks ties).
        jobs: Active (submitted, unfinished) jobs in submission order.
        tenants: The tenants with quotas; () (the default): one shared pool, no quotas.
    """

    now: float
    nodes: tuple[NodeInfo, ...]
    jobs: tuple[JobInfo, ...]
    tenants: tuple[TenantSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class JobExplain:
    """Why a job got what it got, for `pollux-cli explain` and the decision journal.

    Attributes:
        speedup: Predicted speedup of the new allocation (policy's own normalisation; 0 with
            no GPUs).
        penalty: Factor applied to the speedup for re-allocating (1.0 when unchanged).
        reason: One line a user can read, e.g. "unchanged", "scaled 2 → 4 GPUs",
            "pending: higher-priority jobs hold every GPU".
        gpu_type: The GPU type of the new allocation ("" with no GPUs, or on a cluster of
            one unnamed type).
        gpu_price: With several GPU types: the round's price of one GPU of `gpu_type` in
            the policy's utility (what a GPU of that type was worth at the margin); None
            when not priced.
        move_factor: The restart factor any re-allocation of the job was charged this
            round, moved or not (a new allocation's speedup counts times it); None: not said.
        one_more: Predicted speedup with one GPU more than chosen (on the fewest nodes that
            hold it); None: past `limit`, or not evaluated.
        limit: Most GPUs the round could give the job; None: not said.
        reference: (nodes, GPUs) of the allocation speedup 1.0 stands for (the job's fair
            share); None: not said.
    """

    speedup: float
    penalty: float
    reason: str
    gpu_type: str = ""
    gpu_price: float | None = None
    move_factor: float | None = None
    one_more: float | None = None
    limit: int | None = None
    reference: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class AllocationDecision(Generic[M]):
    """A policy's answer for one round.

    Attributes:
        allocations: New allocation of every job in the state (() for none).
        explain: Per-job explanation, same keys as `allocations`.
        objective: The value the policy maximised (policy-specific; NaN if none).
        memory: The policy's own state to pass back next round (Tiresias' queues, the
            tenants' ledger); None when it keeps none.
    """

    allocations: Mapping[str, Allocation]
    explain: Mapping[str, JobExplain]
    objective: float = float("nan")
    memory: M | None = field(default=None)


class JobSizing(enum.Enum):
    """How a policy's jobs size themselves (reference §5.2).

    Attributes:
        ADAPTIVE: Pollux: GPU count from the policy, batch size from the job's goodput model.
        FIXED_BATCH: Optimus+Oracle: GPU count from the policy, the job's own batch size.
        FIXED: Tiresias: the job's own GPU count and batch size.
    """

    ADAPTIVE = "adaptive"
    FIXED_BATCH = "fixed_batch"
    FIXED = "fixed"


class Policy(Protocol[M]):
    """What the simulator, the scheduler service and the forecasts call and ask of a policy.

    `M` is the type of the policy's memory between rounds.
    """

    @property
    def name(self) -> str:
        """The policy's registry name (`pollux.policy.registry.POLICY_NAMES`)."""
        ...

    @property
    def sizing(self) -> JobSizing:
        """How its jobs size themselves (GPU count and batch size)."""
        ...

    @property
    def exploration(self) -> Exploration:
        """How far a job may grow past what it has measured, and start when it has not."""
        ...

    @property
    def needs_oracle(self) -> bool:
        """Whether each job must carry an `OracleInfo` (step times, remaining work)."""
        ...

    @property
    def objective_text(self) -> str:
        """What the policy maximises when it moves a GPU, in words ("" if it trades none)."""
        ...

    @property
    def explain_params(self) -> PolluxParams | None:
        """The objective's parameters for Explain's counterfactuals (None: the defaults)."""
        ...

    @property
    def user_fairness(self) -> bool:
        """Whether the users of a tenant share it alike (`pollux.policy.owners`).

        Placement rounds (`pollux.policy.rounds`) then offer the free GPUs to the waiting
        jobs of the users holding the fewest first.
        """
        ...

    def replica_limit(self, profiled: int, held: int, cap: int) -> int:
        """Most replicas a job may be given this round (`JobInfo.max_replicas`), ≥ 1.

        Args:
            profiled: The most replicas the job has measured a step time on (0: none yet).
            held: The replicas it holds now.
            cap: The most its spec, the cluster and its batch limits allow, ≥ 1.
        """
        ...

    def allocate(
        self, state: ClusterState, memory: M | None, rng: np.random.Generator
    ) -> AllocationDecision[M]:
        """Choose every job's allocation for this round."""
        ...
