"""Simulated autoscaled clusters: node pools that grow and shrink, billed by the node-hour.

`simulate_autoscaled` runs a workload as `pollux.sim.simulator.simulate` does (the same jobs,
traces, policy and round loop helpers), but on nodes that come and go: before each periodic
round the autoscaler (`pollux.autoscale.autoscale`) sees the jobs and the nodes and decides;
requested nodes join `AutoscaleConfig.provisioning_delay_s` later (at the first round after
that), released ones leave at once, and drained ones are withheld from the policy, which moves
their jobs (one restart each), and leave after the round. Every node is billed from its
request to its release (or to the end of the workload). A fixed cluster is the same run with
one pool whose minimum is its maximum, so the three cases of benchmarks/autoscale.py differ
only in the settings. `simulate` itself is untouched: the published figures do not depend on
this module.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pollux.autoscale import (
    GOODPUT_RULE,
    AutoscaleDecision,
    AutoscaleState,
    BandRule,
    NodePool,
    NodeStatus,
    PoolHistory,
    autoscale,
)
from pollux.goodput import UNKNOWN_GRAD, GoodputModel
from pollux.policy.rounds import runs_full
from pollux.policy.types import ClusterState, M, NodeInfo, Policy
from pollux.sim.application import Application
from pollux.sim.simulator import SimConfig, SimJob, SimResult, _advance, _plan_round
from pollux.sim.workload import WorkloadJob

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """How the simulated cluster scales.

    Attributes:
        pools: The node pools (the traces cover nodes of up to 4 GPUs; all GPUs alike).
        rule: The autoscaling rule (`pollux.autoscale.rules`).
        provisioning_delay_s: Seconds from a node's request until it can run replicas
            (cloud instances take 2-5 minutes to boot and join), ≥ 0.
        initial_nodes: Nodes per pool at time 0, ready; missing pools start at their minimum.
        enabled: False: never call the autoscaler (a fixed cluster of the initial nodes).
    """

    pools: tuple[NodePool, ...]
    rule: BandRule = GOODPUT_RULE
    provisioning_delay_s: float = 180.0
    initial_nodes: tuple[tuple[str, int], ...] = ()
    enabled: bool = True

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("need at least one node pool")
        if any(p.gpus_per_node > 4 for p in self.pools):
            raise ValueError("the traces cover nodes of at most 4 GPUs")
        if not (math.isfinite(self.provisioning_delay_s) and self.provisioning_delay_s >= 0):
            raise ValueError("need a finite provisioning_delay_s ≥ 0")
        names = {p.name for p in self.pools}
        for name, count in self.initial_nodes:
            if name not in names or count < 0:
                raise ValueError(f"initial_nodes: {name!r} is no pool, or {count} < 0")

    @classmethod
    def fixed(
        cls, nodes: int, gpus_per_node: int = 4, cost_per_node_hour: float = 1.0
    ) -> AutoscaleConfig:
        """A cluster of `nodes` nodes that never scales."""
        pool = NodePool(
            "fixed",
            gpus_per_node=gpus_per_node,
            min_nodes=nodes,
            max_nodes=nodes,
            cost_per_node_hour=cost_per_node_hour,
        )
        return cls((pool,), initial_nodes=(("fixed", nodes),), enabled=False)


@dataclass(slots=True)
class _Node:
    name: str
    pool: NodePool
    requested: float
    ready_at: float
    released: float | None = None
    draining: bool = False
    idle_since: float | None = None


@dataclass(frozen=True, slots=True)
class AutoscaleResult:
    """Outcome of an autoscaled run.

    Attributes:
        sim: JCTs, makespan, restarts and GPU-seconds, as `simulate` reports them.
        node_seconds: Billed node-seconds per pool.
        cost: Billed cost per pool (node-hours × the pool's price).
        billed_gpu_seconds: GPU-seconds of every billed node.
        sizes: (time, ready nodes, provisioning nodes) after each change of the fleet.
        decisions: Autoscaling decisions that changed something, as (time, reason).
    """

    sim: SimResult
    node_seconds: dict[str, float]
    cost: dict[str, float]
    billed_gpu_seconds: float
    sizes: tuple[tuple[float, int, int], ...] = ()
    decisions: tuple[tuple[float, str], ...] = field(default=())

    @property
    def node_hours(self) -> float:
        """Billed node-hours over every pool."""
        return sum(self.node_seconds.values()) / HOUR

    @property
    def total_cost(self) -> float:
        """Billed cost over every pool."""
        return sum(self.cost.values())

    @property
    def utilisation(self) -> float:
        """GPU-seconds the jobs held (restart pauses included) over GPU-seconds billed."""
        held = sum(self.sim.gpu_seconds.values())
        return held / self.billed_gpu_seconds if self.billed_gpu_seconds > 0 else math.nan


@dataclass(slots=True)
class EfficiencyBlindJob(SimJob):
    """A job that sizes its batch for throughput alone, as a throughput-based system does.

    Its own model sees efficiency 1 at every batch and no gradient accumulation, so it runs
    the largest per-GPU batch that fits, K·m in all (within the maximum total batch): the
    weak scaling of Or et al. The simulator still charges the true statistical efficiency of
    that batch (`SimJob._rate`).
    """

    def goodput_model(self) -> GoodputModel | None:
        """The job's model, blind to statistical efficiency and without accumulation."""
        model = SimJob.goodput_model(self)
        if model is None:
            return None
        return replace(model, grad=UNKNOWN_GRAD, accumulation=False)


RoundHook = Callable[[dict[str, Any]], None]


def simulate_autoscaled(
    workload: Sequence[WorkloadJob],
    apps: dict[str, Application],
    policy: Policy[M],
    config: SimConfig,
    scaling: AutoscaleConfig,
    *,
    efficiency_blind: bool = False,
    on_round: RoundHook | None = None,
    max_time: float = 30 * 24 * 3600.0,
) -> AutoscaleResult:
    """Run a workload to completion on an autoscaled cluster (see the module docstring).

    Args:
        workload: Jobs in submission order.
        apps: Application models by name.
        policy: The cluster policy.
        config: Simulator settings; its `nodes` and `gpus_per_node` are replaced by the pools'.
        scaling: The pools, the rule and the provisioning delay.
        efficiency_blind: Jobs choose their batch for throughput alone (`EfficiencyBlindJob`).
        on_round: Called with each round's log record.
        max_time: Give up (RuntimeError) past this much simulated time.
    """
    cluster = ElasticCluster(apps, policy, config, scaling, efficiency_blind=efficiency_blind)
    for spec in workload:
        cluster.submit(spec)
    while not cluster.idle:
        if cluster.now > max_time:
            raise RuntimeError(f"jobs still running after {max_time:.0f} s of simulated time")
        cluster.step()
        if on_round is not None:
            on_round(cluster.record())
    return cluster.result()


class ElasticCluster:
    """A simulated cluster stepped round by round, to which jobs can be added as it runs.

    `simulate_autoscaled` submits a whole workload up front; a driver that decides what to
    run from what finished (a hyper-parameter search) submits and cancels between `step`s.
    """

    def __init__(
        self,
        apps: dict[str, Application],
        policy: Policy[M],
        config: SimConfig,
        scaling: AutoscaleConfig,
        *,
        efficiency_blind: bool = False,
    ) -> None:
        gpn = max(p.gpus_per_node for p in scaling.pools)
        self.config = replace(
            config, nodes=sum(p.max_nodes for p in scaling.pools), gpus_per_node=gpn
        )
        self.apps = apps
        self.policy = policy
        self.scaling = scaling
        self.kind = EfficiencyBlindJob if efficiency_blind else SimJob
        self.jobs: list[SimJob] = []
        self.cancelled: set[str] = set()
        self.fleet = _Fleet(scaling)
        self.rng = np.random.default_rng(config.seed)
        self.memory: Any = None
        self.now = 0.0
        self.rounds = 0
        self.periodic_due = self.config.interval
        self._arrivals: list[float] = []

    def submit(self, spec: WorkloadJob) -> SimJob:
        """Add a job (its submission time may lie ahead; not before `now`).

        Raises:
            ValueError: An application without traces, a duplicate name, or a time past.
        """
        if spec.application not in self.apps:
            raise ValueError(f"no traces for application {spec.application!r}")
        if any(j.name == spec.name for j in self.jobs):
            raise ValueError(f"a job named {spec.name!r} exists already")
        if spec.submission_time < self.now:
            raise ValueError(f"{spec.name}: submission time {spec.submission_time} is past")
        job = self.kind.under(
            spec, self.apps[spec.application], self.policy, self.config.sync_model
        )
        job.clock = self.now  # a job's clock runs with the cluster's from its creation
        self.jobs.append(job)
        bisect.insort(self._arrivals, spec.submission_time)
        return job

    def cancel(self, name: str) -> None:
        """Stop a job now: it completes at `now` and frees its GPUs at the next round.

        Raises:
            KeyError: No job is called `name`.
        """
        job = self.job(name)
        if not job.completed:
            job.completion_time = self.now
            self.cancelled.add(name)

    def job(self, name: str) -> SimJob:
        """The job called `name`.

        Raises:
            KeyError: No job is called `name`.
        """
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(f"no job called {name!r}")

    @property
    def idle(self) -> bool:
        """Whether every submitted job has completed."""
        return all(job.completed for job in self.jobs)

    def step(self) -> None:
        """Run the jobs to the next round, then autoscale (periodic rounds) and allocate."""
        config, fleet, jobs = self.config, self.fleet, self.jobs
        seen = self.now if self.rounds else -math.inf
        now, periodic = _advance(
            jobs, self.now, config, self._arrivals, seen=seen, due=self.periodic_due
        )
        self.now = now
        placement = config.event_rounds == "place" and not periodic
        active = [j for j in jobs if j.spec.submission_time <= now and not j.completed]
        for job in jobs:
            if job.completed and job.allocation:
                job.allocation = ()
        fleet.join(now, jobs)
        infos = tuple(j.info(now, fleet.names, config) for j in active)
        if periodic and self.scaling.enabled:
            fleet.apply(now, autoscale(fleet.state(now, infos), self.scaling.rule))
        usable = fleet.usable()
        names = {n.name for n in usable}
        infos = tuple(
            replace(i, allocation=tuple(n for n in i.allocation if n in names)) for i in infos
        )
        state = ClusterState(now, usable, infos, config.tenants)
        if runs_full(state, placement):
            self.periodic_due = now + config.interval
        if active:
            self.memory = _plan_round(
                active, state, self.policy, self.memory, self.rng, placement, fleet.index, config
            )
        fleet.release_drained(now, jobs)
        self.rounds += 1

    def record(self) -> dict[str, Any]:
        """The last round's log record (the fleet and each submitted job)."""
        return self.fleet.record(self.now, self.jobs)

    def result(self) -> AutoscaleResult:
        """JCTs, cost and utilisation of the jobs so far (completed ones)."""
        done = {
            j.name: (j.spec.submission_time, j.completion_time or 0.0)
            for j in self.jobs
            if j.completed
        }
        makespan = max((end for _, end in done.values()), default=0.0)
        sim = SimResult(
            jcts={name: end - start for name, (start, end) in done.items()},
            makespan=float(makespan),
            rounds=self.rounds,
            restarts={j.name: j.restarts or 0 for j in self.jobs},
            gpu_seconds={j.name: j.attained_service for j in self.jobs},
        )
        return self.fleet.bill(sim)


class _Fleet:
    """The simulated nodes: their pools, requests, readiness, drains and releases."""

    def __init__(self, scaling: AutoscaleConfig) -> None:
        self.scaling = scaling
        self.nodes: list[_Node] = []
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.history: dict[str, PoolHistory] = {}
        self.sizes: list[tuple[float, int, int]] = []
        self.decisions: list[tuple[float, str]] = []
        self._now = 0.0
        initial = dict(scaling.initial_nodes)
        for pool in scaling.pools:
            for _ in range(initial.get(pool.name, pool.min_nodes)):
                self._request(pool, 0.0, ready_at=0.0)
        self._note_size(0.0)

    def _request(self, pool: NodePool, now: float, *, ready_at: float) -> None:
        name = f"{pool.name}-{sum(1 for n in self.nodes if n.pool is pool)}"
        node = _Node(name, pool, requested=now, ready_at=ready_at)
        node.idle_since = ready_at
        self.index[name] = len(self.names)
        self.names.append(name)
        self.nodes.append(node)

    def live(self) -> list[_Node]:
        """Nodes requested and not released."""
        return [n for n in self.nodes if n.released is None]

    def usable(self) -> tuple[NodeInfo, ...]:
        """Ready, non-draining nodes, as the policy sees them."""
        return tuple(
            NodeInfo(n.name, n.pool.gpus_per_node)
            for n in self.live()
            if n.ready_at <= self._now and not n.draining
        )

    def join(self, now: float, jobs: Sequence[SimJob]) -> None:
        """Advance the fleet's clock to `now` and note which nodes went idle."""
        self._now = now
        used = self._used(jobs)
        for node in self.live():
            if used.get(node.name, 0) > 0:
                node.idle_since = None
            elif node.idle_since is None:
                node.idle_since = now

    def _used(self, jobs: Sequence[SimJob]) -> dict[str, int]:
        used: dict[str, int] = {}
        for job in jobs:
            for n in job.allocation:
                used[self.names[n]] = used.get(self.names[n], 0) + 1
        return used

    def state(self, now: float, infos: tuple[Any, ...]) -> AutoscaleState:
        """What the autoscaler sees."""
        used: dict[str, int] = {}
        for info in infos:
            for n in info.allocation:
                used[n] = used.get(n, 0) + 1
        nodes = tuple(
            NodeStatus(
                n.name,
                n.pool.name,
                ready=n.ready_at <= now,
                used_gpus=used.get(n.name, 0),
                idle_since=n.idle_since,
                draining=n.draining,
            )
            for n in self.live()
        )
        return AutoscaleState(now, infos, self.scaling.pools, nodes, dict(self.history))

    def apply(self, now: float, decision: AutoscaleDecision) -> None:
        """Carry out a decision: request, release and drain nodes; note the pools' history."""
        by_name = {n.name: n for n in self.live()}
        changed = False
        for pool in self.scaling.pools:
            verdict = decision.pools[pool.name]
            history = self.history.get(pool.name, PoolHistory())
            for _ in range(verdict.add):
                self._request(pool, now, ready_at=now + self.scaling.provisioning_delay_s)
            for name in verdict.remove:
                by_name[name].released = now
            for name in verdict.drain:
                by_name[name].draining = True
            if verdict.add:
                history = replace(history, last_scale_up=now)
            if verdict.desired < verdict.current and (verdict.remove or verdict.drain):
                history = replace(history, last_scale_down=now)
            self.history[pool.name] = history
            if verdict.add or verdict.remove or verdict.drain:
                changed = True
                self.decisions.append((now, f"{pool.name}: {verdict.reason}"))
        if changed:
            self._note_size(now)

    def release_drained(self, now: float, jobs: Sequence[SimJob]) -> None:
        """Release drained nodes that the round emptied."""
        used = self._used(jobs)
        gone = [n for n in self.live() if n.draining and used.get(n.name, 0) == 0]
        for node in gone:
            node.released = now
        if gone:
            self._note_size(now)

    def _note_size(self, now: float) -> None:
        live = self.live()
        ready = sum(1 for n in live if n.ready_at <= now)
        self.sizes.append((now, ready, len(live) - ready))

    def record(self, now: float, jobs: Sequence[SimJob]) -> dict[str, Any]:
        """One round's log record: the fleet and each submitted job."""
        live = self.live()
        return {
            "timestamp": now,
            "num_nodes": sum(1 for n in live if n.ready_at <= now),
            "provisioning": sum(1 for n in live if n.ready_at > now),
            "num_gpus": sum(n.pool.gpus_per_node for n in live if n.ready_at <= now),
            "submitted_jobs": [j.record() for j in jobs if j.spec.submission_time <= now],
        }

    def bill(self, sim: SimResult) -> AutoscaleResult:
        """Bill every node from its request to its release (live ones: to the makespan)."""
        end = sim.makespan
        seconds: dict[str, float] = {p.name: 0.0 for p in self.scaling.pools}
        gpu_seconds = 0.0
        for node in self.nodes:
            held = max(0.0, min(node.released if node.released is not None else end, end))
            held -= min(node.requested, end)
            seconds[node.pool.name] += held
            gpu_seconds += held * node.pool.gpus_per_node
        pools = {p.name: p for p in self.scaling.pools}
        cost = {name: s / HOUR * pools[name].cost_per_node_hour for name, s in seconds.items()}
        return AutoscaleResult(
            sim, seconds, cost, gpu_seconds, tuple(self.sizes), tuple(self.decisions)
        )
