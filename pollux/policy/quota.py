"""What tenants are due: the round's tenants as arrays, their entitlements and GPU budgets.

`Quota` is what a tenant-share method (`pollux.policy.tenant_shares`) hands the greedy search:
the most GPUs each tenant may hold this round. Entitlements E_t are the GPUs a tenant would own
in a static partition: its guarantee plus its weight's part of the rest, water-filled under
the caps (docs/policy.md, "Tenants").

Jobs naming no tenant, or one no `TenantSpec` defines, form one implicit default tenant "":
weight 1, no guarantee, no cap. One tenant and not one per unknown name, so that inventing
names gains nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from pollux.policy.types import ClusterState, JobInfo, TenantSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_TENANT = ""
"""Name of the implicit tenant of jobs whose tenant no `TenantSpec` defines."""

NO_CAP = 2**62
"""The cap of a tenant without one (more GPUs than any cluster has)."""


@dataclass(frozen=True, slots=True)
class Tenants:
    """The round's tenants as arrays, and each job's tenant.

    Attributes:
        names: Tenant names, in the order of `ClusterState.tenants`, then "" if any job is in
            the default tenant.
        guarantee: Guaranteed GPUs per tenant (as configured, not yet scaled).
        weight: Weight per tenant.
        cap: Cap per tenant in GPUs (a very large number when there is none).
        of_job: Index into `names` of each job's tenant.
    """

    names: tuple[str, ...]
    guarantee: IntArray
    weight: FloatArray
    cap: IntArray
    of_job: IntArray

    @classmethod
    def of(cls, specs: Sequence[TenantSpec], jobs: Sequence[JobInfo]) -> Tenants:
        """Tenant arrays for `specs`, adding the default tenant when a job needs it."""
        index = {spec.name: i for i, spec in enumerate(specs)}
        default = len(specs)
        of_job = np.array([index.get(job.tenant, default) for job in jobs], dtype=np.int64)
        rows = list(specs)
        names = [spec.name for spec in rows]
        guarantee = [spec.guarantee_gpus for spec in rows]
        weight = [spec.weight for spec in rows]
        cap = [spec.cap or NO_CAP for spec in rows]
        if (of_job == default).any():
            names.append(DEFAULT_TENANT)
            guarantee.append(0)
            weight.append(1.0)
            cap.append(NO_CAP)
        return cls(
            names=tuple(names),
            guarantee=np.array(guarantee, dtype=np.int64),
            weight=np.array(weight, dtype=np.float64),
            cap=np.array(cap, dtype=np.int64),
            of_job=of_job,
        )

    @classmethod
    def of_state(cls, state: ClusterState) -> Tenants:
        """`of` the state's tenants and jobs."""
        return cls.of(state.tenants, state.jobs)


@dataclass(frozen=True, slots=True)
class Quota:
    """Level 1's answer for one round: the most GPUs each tenant may hold.

    Attributes:
        tenants: The tenants and each job's tenant.
        budget: Most GPUs each tenant may hold this round (Σ ≤ the cluster's GPUs).
        entitled: E_t among the tenants with demand (0 for those without).
        floor: GPUs set aside first: its guarantee, or what its jobs can use if that is less.
        ceiling: Most GPUs it may get: its cap, or what its jobs can use if that is less.
        goodput: Predicted goodput (sum of speedups) of each tenant on its budget.
    """

    tenants: Tenants
    budget: IntArray
    entitled: FloatArray
    floor: IntArray
    ceiling: IntArray
    goodput: FloatArray

    @property
    def of_job(self) -> IntArray:
        """Index of each job's tenant (into `tenants.names`, `budget` …)."""
        return self.tenants.of_job

    def lent(self) -> Quota:
        """The quota with every budget raised to the tenant's cap (for otherwise idle GPUs)."""
        return replace(self, budget=np.maximum(self.budget, self.tenants.cap))

    def usage(self, held: npt.ArrayLike) -> IntArray:
        """GPUs each tenant holds, given the GPUs each job holds."""
        counts = np.bincount(self.of_job, weights=held, minlength=self.budget.size)
        return np.asarray(np.rint(counts), dtype=np.int64)


def entitlements(
    guarantee: npt.ArrayLike, weight: npt.ArrayLike, cap: npt.ArrayLike, total: int
) -> FloatArray:
    """E_t, each tenant's entitled GPUs out of `total` (see the module docstring).

    Guarantees adding up to more than `total` are scaled down in proportion; the rest of the
    GPUs is split by weight, and whatever a cap stops a tenant from taking is split again
    among the uncapped ones (water-filling). The result adds up to `total` unless every tenant
    is capped below it.
    """
    g = np.asarray(guarantee, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    limit = np.minimum(np.asarray(cap, dtype=np.float64), float(total))
    if g.sum() > total:
        g = g * (total / g.sum())
    share = np.minimum(g, limit)
    rest = total - share.sum()
    open_ = share < limit
    while rest > 1e-9 * max(total, 1) and open_.any():
        add = np.zeros_like(share)
        add[open_] = rest * w[open_] / w[open_].sum()
        add = np.minimum(add, limit - share)
        share += add
        rest -= add.sum()
        open_ = share < limit - 1e-9
    return share


def entitled_floors(tenants: Tenants, ceiling: IntArray, total: int) -> tuple[FloatArray, IntArray]:
    """E_t among the tenants with demand (`ceiling` > 0) and each tenant's floor.

    The floor is its guarantee (scaled down in proportion when the guarantees of the tenants
    with demand add up to more than `total`), in whole GPUs, at most its `ceiling`.
    """
    active = ceiling > 0
    entitled = np.zeros(len(tenants.names))
    entitled[active] = entitlements(
        tenants.guarantee[active], tenants.weight[active], tenants.cap[active], total
    )
    scaled = tenants.guarantee.astype(np.float64)
    if scaled[active].sum() > total:
        scaled *= total / scaled[active].sum()
    floor = np.minimum(np.floor(scaled + 1e-9).astype(np.int64), ceiling)
    return entitled, floor
