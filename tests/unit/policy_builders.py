"""Small builders for policy tests: readable jobs, nodes and states."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from pollux.goodput import GoodputModel, GradParams, PerfParams
from pollux.policy import ClusterState, JobInfo, NodeInfo
from pollux.policy.exploration import FAITHFUL
from pollux.policy.types import AllocationDecision, JobExplain, JobSizing, TenantSpec

NOW = 3600.0


def model(
    noise: float = 50.0, *, alpha_n: float = 0.15, max_atomic: int = 512, max_batch: int = 4096
) -> GoodputModel:
    """A cifar-like goodput model; larger `noise` means larger batches stay efficient."""
    perf = PerfParams(0.02, 0.0007, alpha_n, 0.01, 0.03, 0.004, 2.0)
    return GoodputModel(
        perf,
        GradParams(sqr=1.0, var=noise),
        init_batch_size=128,
        max_batch_size=max_batch,
        min_atomic_bsz=32,
        max_atomic_bsz=max_atomic,
        accumulation=True,
    )


def nodes(count: int, gpus: int = 4) -> tuple[NodeInfo, ...]:
    return tuple(NodeInfo(f"n{i}", gpus) for i in range(count))


def job(
    name: str,
    *,
    on: tuple[str, ...] = (),
    age: float = 1800.0,
    restarts: int = 0,
    max_replicas: int = 16,
    min_replicas: int = 0,
    noise: float | None = 50.0,
    attained: float = 0.0,
) -> JobInfo:
    return JobInfo(
        name=name,
        submission_time=NOW - age,
        allocation=on,
        restarts=restarts,
        attained_service=attained,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        model=model(noise) if noise is not None else None,
    )


def state(jobs: list[JobInfo], cluster: tuple[NodeInfo, ...], now: float = NOW) -> ClusterState:
    return ClusterState(now=now, nodes=cluster, jobs=tuple(jobs))


def random_state(rng: np.random.Generator, num_nodes: int = 8) -> ClusterState:
    """A random cluster: jobs of varied scalability, some running, some without a model."""
    cluster = nodes(num_nodes)
    jobs = []
    free = {n.name: n.gpus for n in cluster}
    for j in range(int(rng.integers(1, 3 * num_nodes))):
        running: tuple[str, ...] = ()
        if rng.random() < 0.5:
            node = str(rng.choice(list(free)))
            take = int(rng.integers(0, free[node] + 1))
            free[node] -= take
            running = (node,) * take
        jobs.append(
            job(
                f"j{j}",
                on=running,
                age=float(rng.uniform(30, 7200)),
                restarts=int(rng.integers(0, 5)),
                max_replicas=int(rng.choice([1, 2, 4, 8, 16, 32])),
                noise=float(rng.uniform(1, 500)) if rng.random() < 0.8 else None,
            )
        )
    return state(jobs, cluster)


class ScriptedPolicy:
    """A test policy: faithful Pollux's answers to the `Policy` protocol; scripts `allocate`."""

    name = "scripted"
    sizing = JobSizing.ADAPTIVE
    exploration = FAITHFUL
    needs_oracle = False
    objective_text = ""
    explain_params = None
    user_fairness = True

    def replica_limit(self, profiled: int, held: int, cap: int) -> int:
        """Pollux's exploration limit within `cap`."""
        return max(1, min(cap, FAITHFUL.limit(profiled, held)))


class Fixed(ScriptedPolicy):
    """A policy that answers the allocations it was built with ("holds N" as each reason)."""

    name = "fixed"

    def __init__(self, allocations: dict[str, tuple[str, ...]]) -> None:
        self.allocations = allocations

    def allocate(
        self, state: ClusterState, memory: object | None, rng: np.random.Generator
    ) -> AllocationDecision:
        """The fixed allocations, whatever the state."""
        explain = {j: JobExplain(1.0, 1.0, f"holds {len(n)}") for j, n in self.allocations.items()}
        return AllocationDecision(self.allocations, explain, objective=1.0)


THREE_TENANTS = {
    "guarantees": st.lists(st.integers(0, 12), min_size=3, max_size=3),
    "weights": st.lists(st.floats(0.25, 4.0), min_size=3, max_size=3),
    "caps": st.lists(st.integers(0, 20), min_size=3, max_size=3),
}
"""Hypothesis strategies for `tenant_specs` of three tenants (pass as ``@given(**...)``)."""


def tenant_specs(
    guarantees: list[int], weights: list[float], caps: list[int]
) -> tuple[TenantSpec, ...]:
    """Tenants a, b, c … with guarantees clipped to their caps (cap 0: none)."""
    return tuple(
        TenantSpec(name, min(g, c) if c else g, w, c)
        for name, g, w, c in zip(
            "abcdefgh"[: len(guarantees)], guarantees, weights, caps, strict=True
        )
    )


def labelled(base: ClusterState, names: str, specs: tuple[TenantSpec, ...]) -> ClusterState:
    """`base` with job i in tenant ``names[i % len(names)]`` and the tenant table `specs`."""
    jobs = tuple(replace(j, tenant=names[i % len(names)]) for i, j in enumerate(base.jobs))
    return replace(base, jobs=jobs, tenants=specs)
