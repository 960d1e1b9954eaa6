"""A policy that wraps another, for benchmarks that watch or extend what a policy does."""

from __future__ import annotations

from typing import Generic

import numpy as np

from pollux.policy.exploration import Exploration
from pollux.policy.params import PolluxParams
from pollux.policy.types import AllocationDecision, ClusterState, JobSizing, M, Policy


class WrappedPolicy(Generic[M]):
    """Everything of the `Policy` protocol delegated to `inner`; override `allocate`."""

    def __init__(self, inner: Policy[M]) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        """The wrapped policy's."""
        return self.inner.name

    @property
    def sizing(self) -> JobSizing:
        """The wrapped policy's."""
        return self.inner.sizing

    @property
    def exploration(self) -> Exploration:
        """The wrapped policy's."""
        return self.inner.exploration

    @property
    def needs_oracle(self) -> bool:
        """The wrapped policy's."""
        return self.inner.needs_oracle

    @property
    def objective_text(self) -> str:
        """The wrapped policy's."""
        return self.inner.objective_text

    @property
    def explain_params(self) -> PolluxParams | None:
        """The wrapped policy's."""
        return self.inner.explain_params

    @property
    def user_fairness(self) -> bool:
        """The wrapped policy's."""
        return self.inner.user_fairness

    def replica_limit(self, profiled: int, held: int, cap: int) -> int:
        """The wrapped policy's."""
        return self.inner.replica_limit(profiled, held, cap)

    def allocate(
        self, state: ClusterState, memory: M | None, rng: np.random.Generator
    ) -> AllocationDecision[M]:
        """The wrapped policy's decision."""
        return self.inner.allocate(state, memory, rng)
