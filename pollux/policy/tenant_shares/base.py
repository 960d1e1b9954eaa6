"""The protocol every tenant-share method follows, and what its first level returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from pollux.policy.problem import Problem
from pollux.policy.quota import Quota
from pollux.policy.tenant_shares.ledger import Ledger
from pollux.policy.types import AllocationDecision

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

Search = Callable[[Quota], IntArray]
"""The per-job search within a quota (the greedy one, on the round's weighted problem)."""


@dataclass(frozen=True, slots=True)
class Division:
    """A method's first level: each tenant's GPU budget, and each job's tenant weight factor.

    Attributes:
        quota: The most GPUs each tenant may hold this round.
        tilt: Each job's tenant factor of its weight (`pollux.policy.weights`), largest 1;
            None: the method does not weigh jobs.
    """

    quota: Quota
    tilt: FloatArray | None


class TenantShares(Protocol):
    """How busy tenants get their shares: a first level, the search, a repair, a memory.

    The policy runs: `divide` on the round's problem (weighted by every other factor),
    the greedy search of the problem weighted by the division's tilt too, `repair`, then
    `remember` on the final decision; what `remember` returns comes back as `ledger`.
    """

    @property
    def name(self) -> str:
        """The method's setting name (`scheduling.tenant_shares`)."""
        ...

    def divide(self, problem: Problem, ledger: Ledger | None) -> Division:
        """This round's budgets and tenant weights."""
        ...

    def repair(
        self, problem: Problem, quota: Quota, placed: IntArray, search: Search
    ) -> tuple[Quota, IntArray]:
        """The final quota and placement after the search placed `placed` within `quota`."""
        ...

    def remember(
        self,
        ledger: Ledger | None,
        quota: Quota,
        problem: Problem,
        decision: AllocationDecision[Ledger],
    ) -> Ledger | None:
        """What the next round needs to know (the shares owed), or None."""
        ...


class NoRepair:
    """A mixin for methods whose search result is final and that keep no memory."""

    def repair(
        self, problem: Problem, quota: Quota, placed: IntArray, search: Search
    ) -> tuple[Quota, IntArray]:
        """The search's result as it is."""
        return quota, placed

    def remember(
        self,
        ledger: Ledger | None,
        quota: Quota,
        problem: Problem,
        decision: AllocationDecision[Ledger],
    ) -> Ledger | None:
        """Nothing: the next round starts afresh."""
        return None
