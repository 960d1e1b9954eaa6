"""Trace-driven cluster simulator (the semantics of the published Pollux simulator).

Jobs advance through the measured traces of their application: step times come from the
placement traces, gradient statistics and progress from the validation runs. Every `interval`
seconds the policy (the same code the Scheduler service runs) re-allocates GPUs; a changed
allocation costs `restart_delay` seconds of no progress. With `SimConfig.event_delay` a round
also runs that long after each submission and completion, as the live scheduler's debounced
trigger does; what it does (a full round, or a placement round) is decided as the live
scheduler decides it (`pollux.policy.rounds`). Jobs size themselves as the policy says
(`Policy.sizing`): adaptive jobs fit their own throughput model from the step times they
experience and choose their batch size with it, as the real agent does. Tenants
(`SimConfig.tenants`) reach the policy in every round's `ClusterState`. The simulation is
deterministic for a given seed.
"""

from __future__ import annotations

import bisect
import math
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pollux.goodput import (
    UNKNOWN_GRAD,
    GoodputModel,
    GradParams,
    PerfParams,
    SyncModel,
    best_batch,
    fit_perf_params,
)
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.jct import resize_history
from pollux.policy.rounds import decide_round, runs_full
from pollux.policy.types import (
    ClusterState,
    JobInfo,
    JobSizing,
    M,
    NodeInfo,
    OracleInfo,
    Policy,
    TenantSpec,
)
from pollux.sim.application import Application, split_fixed_batch
from pollux.sim.workload import WorkloadJob

NCF_BATCH = 32768  # the published simulator runs ncf at a fixed batch on one GPU (§5.2)
MAX_REPLICAS = 64  # the published cap on any job's replicas in the simulator (§4.1)


EVENT_ROUNDS = ("full", "place")
"""What an event-triggered round does (`SimConfig.event_rounds`)."""

ReplicaLimit = Callable[[int, int, int], int]
"""A policy's `replica_limit(profiled, held, cap)`."""

POLLUX_LIMIT: ReplicaLimit = PolluxPolicy().replica_limit
"""Faithful Pollux's replica limit (the default of a `SimJob`)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Simulator settings; the defaults are the published ones.

    Attributes:
        nodes: Number of nodes.
        gpus_per_node: GPUs per node (the traces cover up to 4).
        interval: Seconds between scheduling rounds.
        restart_delay: Seconds without progress after each re-allocation.
        interference: Slowdown (0–1) of distributed jobs that share a node with another
            distributed job.
        seed: Seed of the random generator handed to the policy.
        sync_model: Sync-time shape the jobs' throughput fits use (LINEAR is published).
        max_replicas: Cap on any job's replicas.
        tenants: Tenants with guarantees, weights and caps; () (published): one shared pool.
        restart_delays: Per-application restart delays, (application, seconds) pairs, that
            replace `restart_delay` for those applications (measured pauses differ by model:
            Sia measured 15-250 s); () (published): `restart_delay` for every job. A job that
            has started once reports its own pause to the policy (`JobInfo.restart_pause_s`).
        undeclared_fraction: Fraction of jobs (chosen by a CRC-32 of their names, so the
            same jobs at every load and seed) that declare no remaining work to the policy;
            0 (default): every job declares it (`JobInfo.remaining_work`).
        share_profiles: Whether a job starts from the step times the newest earlier run of
            its application had measured when it was submitted (a cluster that remembers how
            each model runs on its hardware, as the live scheduler's profile seeding does;
            `SimJob.adopt`). False (published): each job profiles itself from nothing,
            growing as far as the policy's `replica_limit` lets it past its largest observed size.
        event_delay: Seconds after a job's submission or completion at which an extra round
            runs: the live scheduler's event-triggered rounds (`scheduling.debounce_s`, 1 s
            there). None (published): rounds only every `interval`, so a submission waits
            for the next one.
        event_rounds: What those extra rounds do. "full": re-plan every job, the periodic
            schedule restarting from the round. "place": only place jobs that never ran on
            free GPUs (`pollux.policy.placement`), periodic rounds keeping their own clock
            (the live `scheduling.event_rounds`). With tenants every round is a full one
            (`pollux.policy.rounds`).
    """

    nodes: int = 16
    gpus_per_node: int = 4
    interval: float = 60.0
    restart_delay: float = 30.0
    interference: float = 0.0
    seed: int = 0
    sync_model: SyncModel = SyncModel.LINEAR
    max_replicas: int = MAX_REPLICAS
    tenants: tuple[TenantSpec, ...] = ()
    restart_delays: tuple[tuple[str, float], ...] = ()
    undeclared_fraction: float = 0.0
    share_profiles: bool = False
    event_delay: float | None = None
    event_rounds: str = "full"

    def __post_init__(self) -> None:
        if self.nodes < 1 or not 1 <= self.gpus_per_node <= 4:
            raise ValueError("need nodes ≥ 1 and 1 ≤ gpus_per_node ≤ 4 (traces cover ≤ 4)")
        if self.interval <= 0 or self.restart_delay < 0 or not 0 <= self.interference < 1:
            raise ValueError("need interval > 0, restart_delay ≥ 0, 0 ≤ interference < 1")
        if any(not delay >= 0 for _, delay in self.restart_delays):
            raise ValueError("need every per-application restart delay ≥ 0")
        if not 0 <= self.undeclared_fraction <= 1:
            raise ValueError("need 0 ≤ undeclared_fraction ≤ 1")
        if self.event_delay is not None and not 0 <= self.event_delay < self.interval:
            raise ValueError("need 0 ≤ event_delay < interval (None: periodic rounds only)")
        if self.event_rounds not in EVENT_ROUNDS:
            raise ValueError(
                f"event_rounds must be one of {EVENT_ROUNDS}, not {self.event_rounds!r}"
            )
        if self.event_rounds != "full" and self.event_delay is None:
            raise ValueError(f"event_rounds={self.event_rounds!r} needs an event_delay")

    @property
    def timing(self) -> str:
        """How rounds are timed: "periodic" (published), "events-full" or "events-place"."""
        return "periodic" if self.event_delay is None else f"events-{self.event_rounds}"

    def delay_of(self, application: str) -> float:
        """Restart delay of a job of `application` (seconds)."""
        for name, delay in self.restart_delays:
            if name == application:
                return float(delay)
        return self.restart_delay

    def declares(self, name: str) -> bool:
        """Whether the job called `name` declares its remaining work."""
        if self.undeclared_fraction <= 0:
            return True
        return zlib.crc32(name.encode()) / 2**32 >= self.undeclared_fraction


@dataclass(slots=True)
class SimJob:
    """A job's mutable simulation state (reference §5.2)."""

    spec: WorkloadJob
    app: Application
    sizing: JobSizing
    sync_model: SyncModel
    target_batch: int | None = None
    target_replicas: int | None = None
    allocation: tuple[int, ...] = ()
    atomic_bsz: int = 0
    accum_steps: int = 0
    replica_limit: ReplicaLimit = POLLUX_LIMIT
    needs_oracle: bool = False
    profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    perf: PerfParams | None = None
    grad: tuple[float, float] | None = None
    progress: float = 0.0
    epoch: int = 0
    clock: float = 0.0
    rescale_time: float = 0.0
    attained_service: float = 0.0
    restarts: int | None = None
    completion_time: float | None = None
    seeded: bool = False
    resize_record: tuple[int, int, int] = (0, 0, 0)
    """(resizes, reversals, last_resize), as `JobInfo` has them (`jct.resize_history`)."""

    @classmethod
    def create(
        cls,
        spec: WorkloadJob,
        app: Application,
        sizing: JobSizing,
        sync_model: SyncModel,
        replica_limit: ReplicaLimit = POLLUX_LIMIT,
        needs_oracle: bool = False,
    ) -> SimJob:
        """A job as submitted, sized as `sizing` says, growing as `replica_limit` lets it."""
        job = cls(
            spec=spec,
            app=app,
            sizing=sizing,
            sync_model=sync_model,
            replica_limit=replica_limit,
            needs_oracle=needs_oracle,
        )
        if sizing is JobSizing.ADAPTIVE:
            if app.name == "ncf":
                job.target_batch = NCF_BATCH
        else:
            job.target_batch = spec.batch_size
            if sizing is JobSizing.FIXED:
                job.target_replicas = spec.num_replicas
        return job

    @classmethod
    def under(
        cls, spec: WorkloadJob, app: Application, policy: Policy[M], sync_model: SyncModel
    ) -> SimJob:
        """A job as submitted under `policy` (its sizing, replica limit and oracle)."""
        return cls.create(
            spec, app, policy.sizing, sync_model, policy.replica_limit, policy.needs_oracle
        )

    # -- derived state ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The workload's job name."""
        return self.spec.name

    @property
    def completed(self) -> bool:
        """Whether the job has finished its last epoch."""
        return self.completion_time is not None

    @property
    def placement(self) -> tuple[int, ...]:
        """Replicas per node in node order, zeros dropped (e.g. (4, 2))."""
        counts = Counter(self.allocation)
        return tuple(counts[n] for n in sorted(counts))

    @property
    def batch_size(self) -> int:
        """Total batch size M = K·m·(s+1) (0 without GPUs)."""
        return len(self.allocation) * self.atomic_bsz * (self.accum_steps + 1)

    def max_replicas(self, cap: int) -> int:
        """Most replicas the policy may give the job (reference §4.1, simulator rule)."""
        app = self.app
        if app.name == "ncf":
            return 1
        if self.sizing is JobSizing.FIXED:
            return self.target_replicas or 1
        by_batch = (self.target_batch or app.max_batch_size) // app.min_local_bsz
        if self.sizing is JobSizing.FIXED_BATCH:
            return max(1, by_batch)  # its oracle is the truth: no exploration
        profiled = max((k for _, k, _ in self.profile), default=0)
        return self.replica_limit(profiled, 0, max(1, min(cap, by_batch)))

    def goodput_model(self) -> GoodputModel | None:
        """The job's own goodput model, once it has fitted its throughput."""
        if self.perf is None:
            return None
        app = self.app
        return GoodputModel(
            self.perf,
            self._grad_params(),
            init_batch_size=app.init_batch_size,
            max_batch_size=app.max_batch_size,
            min_atomic_bsz=app.min_local_bsz,
            max_atomic_bsz=app.max_local_bsz,
            accumulation=True,
        )

    def _grad_params(self) -> GradParams:
        if self.grad is None:
            return UNKNOWN_GRAD
        sqr, var = max(self.grad[0], 0.0), max(self.grad[1], 0.0)
        return UNKNOWN_GRAD if sqr == 0.0 and var == 0.0 else GradParams(sqr, var)

    # -- batch size -------------------------------------------------------------------------

    def update_local_bsz(self) -> None:
        """Re-choose (m, s) for the current allocation (reference §5.2)."""
        replicas = len(self.allocation)
        if replicas == 0:
            return
        app = self.app
        model = self.goodput_model() if self.target_batch is None else None
        if model is not None:
            choice = best_batch(model, len(self.placement), replicas)
            m, s = int(choice.atomic_bsz), int(choice.accum_steps)
            if m == 0:  # no feasible batch on this allocation: smallest split of M0
                m, s = split_fixed_batch(app.init_batch_size, replicas, app)
        else:
            target = self.target_batch or max(app.init_batch_size, app.min_local_bsz * replicas)
            m, s = split_fixed_batch(target, replicas, app)
        self.atomic_bsz = min(m, app.max_batch_size // (replicas * (s + 1)))
        self.accum_steps = s

    def reallocate(self, allocation: tuple[int, ...], restart_delay: float) -> None:
        """Apply a new allocation; a non-empty one costs a checkpoint-restart (§5.2)."""
        if self.restarts is not None:
            self.resize_record = resize_history(
                *self.resize_record, len(self.allocation), len(allocation)
            )
        self.allocation = allocation
        if allocation:
            self.update_local_bsz()
            self.rescale_time = restart_delay
            self.restarts = 0 if self.restarts is None else self.restarts + 1
        else:
            self.atomic_bsz = 0
            self.accum_steps = 0

    # -- advancing time ---------------------------------------------------------------------

    def step(self, seconds: float, interference: float) -> None:
        """Advance the job's clock by `seconds` (reference §5.3)."""
        if not self.allocation or self.completed:
            self.clock += seconds
            return
        replicas = len(self.allocation)
        delay = min(self.rescale_time, seconds)
        self.clock += delay
        self.attained_service += delay * replicas
        self.rescale_time -= delay
        seconds -= delay
        app = self.app
        while seconds > 0 and not self.completed:
            rate = self._rate(interference, observe=True)
            target = app.progress(self.epoch + 1)
            if self.progress + rate * seconds < target:
                self.progress += rate * seconds
                self.clock += seconds
                self.attained_service += seconds * replicas
                seconds = 0.0
            else:
                self.epoch += 1
                delta = float(round((target - self.progress) / rate))  # whole seconds (§5.3)
                self.progress = target
                if self.epoch > app.completion_epoch:
                    self.completion_time = self.clock + delta
                self.clock += delta
                self.attained_service += delta * replicas
                seconds -= delta
                self.update_local_bsz()
        self.clock += max(seconds, 0.0)

    def _rate(self, interference: float, *, observe: bool = False) -> float:
        """Progress per second on the current allocation, in the current epoch.

        With `observe`, the job also measures what it runs (`_observe`), as a step does.
        """
        app = self.app
        placement = self.placement
        batch = self.batch_size
        scale = batch / app.init_batch_size
        step_time, sync_time = app.throughput(placement, self.atomic_bsz)
        sqr, var = app.grad_stats(_clamp_batch(app, batch), self.epoch)
        gain = (var + sqr) / (var / scale + sqr) if var / scale + sqr > 0 else 1.0
        if observe:
            self._observe(len(placement), len(self.allocation), step_time, sync_time, sqr, var)
        iteration = step_time + (step_time - sync_time) * self.accum_steps
        return gain / iteration * (1.0 - interference)

    def seconds_to_finish(self, interference: float) -> float:
        """Seconds until the job completes at its current speed (inf: without GPUs).

        Exact in its last epoch; earlier, the speed changes at each epoch boundary, so it is
        an estimate (`seconds_to_epoch_end` is exact).
        """
        return self._seconds_to(self.app.final_progress, interference)

    def seconds_to_epoch_end(self, interference: float) -> float:
        """Seconds until the job's current epoch ends (inf: without GPUs)."""
        return self._seconds_to(self.app.progress(self.epoch + 1), interference)

    def _seconds_to(self, progress: float, interference: float) -> float:
        if not self.allocation or self.completed:
            return math.inf
        rate = self._rate(interference)
        left = max(progress - self.progress, 0.0)
        return self.rescale_time + (left / rate if rate > 0 else math.inf)

    def adopt(self, shared: dict[tuple[int, int, int], tuple[float, float]]) -> None:
        """Add the configurations other jobs of this application measured, and refit.

        Step times depend on the model, the placement and the per-GPU batch, not on the job,
        so another run's measurements are this job's too; its own rows win where both exist.
        Gradient statistics stay the job's own.
        """
        if self.sizing is not JobSizing.ADAPTIVE or shared.keys() <= self.profile.keys():
            return
        for key, times in shared.items():
            self.profile.setdefault(key, times)
        self._refit()

    def _observe(
        self, nodes: int, replicas: int, step_time: float, sync_time: float, sqr: float, var: float
    ) -> None:
        """Record gradient statistics and, for a new configuration, refit the throughput."""
        self.grad = (sqr, var)
        key = (nodes, replicas, self.atomic_bsz)
        if key in self.profile:
            return
        self.profile[key] = (step_time, sync_time)
        if self.sizing is JobSizing.ADAPTIVE:
            self._refit()

    def _refit(self) -> None:
        """Fit the throughput parameters to every configuration in the profile."""
        n, k, m = (np.array(c) for c in zip(*self.profile, strict=True))
        times = np.array(list(self.profile.values()))
        self.perf = fit_perf_params(
            n,
            k,
            m,
            times[:, 0] - times[:, 1],
            times[:, 0],
            sync_model=self.sync_model,
            initial=self.perf,
        ).params

    # -- policy view --------------------------------------------------------------------------

    def info(self, now: float, node_names: Sequence[str], config: SimConfig) -> JobInfo:
        """How the policy sees this job at time `now`.

        Its declared remaining work is the progress target less its progress (M0-steps,
        `Application.progress`), unless `config` makes it one that declares nothing; its
        restart pause is reported once it has paid one (started), with per-model delays only.
        """
        oracle = self._oracle(config) if self.needs_oracle else None
        remaining = (
            max(self.app.final_progress - self.progress, 0.0)
            if config.declares(self.name)
            else None
        )
        pause = (
            config.delay_of(self.app.name)
            if config.restart_delays and self.restarts is not None
            else None
        )
        return JobInfo(
            name=self.name,
            submission_time=self.spec.submission_time,
            allocation=tuple(node_names[n] for n in self.allocation),
            restarts=self.restarts or 0,
            resizes=self.resize_record[0],
            reversals=self.resize_record[1],
            last_resize=self.resize_record[2],
            attained_service=self.attained_service,
            max_replicas=self.max_replicas(config.max_replicas),
            model=self.goodput_model() if self.sizing is JobSizing.ADAPTIVE else None,
            target_replicas=self.target_replicas,
            target_batch_size=self.target_batch,
            oracle=oracle,
            tenant=self.spec.tenant,
            owner=self.spec.owner,
            remaining_work=remaining,
            restart_pause_s=pause,
        )

    def _oracle(self, config: SimConfig) -> OracleInfo:
        """True step times and remaining iterations from the traces (reference §6.1)."""
        app, batch = self.app, self.target_batch or self.app.init_batch_size
        top = min(self.max_replicas(config.max_replicas), config.nodes * config.gpus_per_node)
        times = np.full(top + 1, np.inf)
        for k in range(1, top + 1):
            times[k] = app.consolidated_step_time(k, batch, config.gpus_per_node)
        if self.epoch > app.completion_epoch:
            remaining = 1.0
        else:
            remaining = app.iteration(batch, app.completion_epoch) - app.iteration(
                batch, self.epoch
            )
        return OracleInfo(step_time=times, remaining_iterations=max(remaining, 1.0))

    def record(self) -> dict[str, Any]:
        """This job's entry in the per-round log (reference §7.6)."""
        return {
            "name": self.name,
            "epoch": self.epoch,
            "progress": self.progress,
            "num_restarts": self.restarts,
            "allocation": list(self.allocation),
            "placement": list(self.placement),
            "batch_size": self.batch_size,
            "accum_steps": self.accum_steps,
            "submission_time": self.spec.submission_time,
            "completion_time": self.completion_time,
            "grad_params": list(self.grad) if self.grad is not None else None,
        }


def _clamp_batch(app: Application, batch: int) -> float:
    """Validation traces cover [M0, max batch]; rounding may step just outside."""
    return float(min(max(batch, app.init_batch_size), app.max_batch_size))


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of one simulated workload.

    Attributes:
        jcts: Job completion time (completion − submission, seconds) per job.
        makespan: Time at which the last job completed.
        rounds: Number of scheduling rounds run.
        restarts: Re-allocations per job (the first allocation is not one).
        gpu_seconds: GPU-seconds each job held (restart pauses included).
    """

    jcts: dict[str, float]
    makespan: float
    rounds: int
    restarts: dict[str, int] = field(default_factory=dict)
    gpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def average_jct(self) -> float:
        """Mean JCT over the workload's jobs."""
        return float(np.mean(list(self.jcts.values())))


RoundHook = Callable[[dict[str, Any]], None]


def simulate(
    workload: Sequence[WorkloadJob],
    apps: dict[str, Application],
    policy: Policy[M],
    config: SimConfig = SimConfig(),
    *,
    on_round: RoundHook | None = None,
    max_time: float = 30 * 24 * 3600.0,
) -> SimResult:
    """Run a workload to completion under `policy` (reference §5.4).

    Args:
        workload: Jobs in submission order.
        apps: Application models by name.
        policy: The cluster policy.
        config: Simulator settings.
        on_round: Called with each round's log record (JSON-serialisable, §7.6 format).
        max_time: Give up (RuntimeError) if jobs are still running after this much simulated
            time, so that a policy that starves a job cannot hang the simulator.
    """
    missing = sorted({j.application for j in workload} - set(apps))
    if missing:
        raise ValueError(f"workload uses applications without traces: {missing}")
    jobs = [
        SimJob.under(spec, apps[spec.application], policy, config.sync_model) for spec in workload
    ]
    node_names = [f"n{i}" for i in range(config.nodes)]
    nodes = tuple(NodeInfo(name, config.gpus_per_node) for name in node_names)
    index = {name: i for i, name in enumerate(node_names)}
    rng = np.random.default_rng(config.seed)
    memory: M | None = None
    runs = _runs_by_application(jobs)
    now, rounds = 0.0, 0
    periodic_due = config.interval
    place_on_events = config.event_rounds == "place"
    arrivals = sorted({job.spec.submission_time for job in jobs})
    while not all(job.completed for job in jobs):
        if now > max_time:
            raise RuntimeError(f"jobs still running after {max_time:.0f} s of simulated time")
        seen = now if rounds else -math.inf
        now, periodic = _advance(jobs, now, config, arrivals, seen=seen, due=periodic_due)
        placement = place_on_events and not periodic
        active = [j for j in jobs if j.spec.submission_time <= now and not j.completed]
        for job in jobs:
            if job.completed and job.allocation:
                job.allocation = ()
        if active and config.share_profiles:
            _seed_profiles(active, runs)
        infos = tuple(j.info(now, node_names, config) for j in active)
        state = ClusterState(now, nodes, infos, config.tenants)
        if runs_full(state, placement):
            periodic_due = now + config.interval  # a full round restarts the periodic clock
        if active:
            memory = _plan_round(active, state, policy, memory, rng, placement, index, config)
        rounds += 1
        if on_round is not None:
            on_round(_round_record(now, config, jobs))
    done = {j.name: (j.spec.submission_time, j.completion_time or 0.0) for j in jobs}
    jcts = {name: end - start for name, (start, end) in done.items()}
    makespan = max(end for _, end in done.values())
    return SimResult(
        jcts=jcts,
        makespan=float(makespan),
        rounds=rounds,
        restarts={j.name: j.restarts or 0 for j in jobs},
        gpu_seconds={j.name: j.attained_service for j in jobs},
    )


def _plan_round(
    active: Sequence[SimJob],
    state: ClusterState,
    policy: Policy[M],
    memory: M | None,
    rng: np.random.Generator,
    placement: bool,
    index: Mapping[str, int],
    config: SimConfig,
) -> M | None:
    """Decide one round (`pollux.policy.rounds`) and apply it; returns the policy's memory."""
    decided = decide_round(state, policy, memory, rng, placement=placement)
    planned = decided.planned
    allocations = decided.decision.allocations
    for job in active:
        if planned is not None and job.name not in planned:
            continue
        new = tuple(sorted(index[n] for n in allocations.get(job.name, ())))
        if new != job.allocation:
            job.reallocate(new, config.delay_of(job.app.name))
    return decided.memory


def _advance(
    jobs: Sequence[SimJob],
    now: float,
    config: SimConfig,
    arrivals: Sequence[float],
    *,
    seen: float,
    due: float,
) -> tuple[float, bool]:
    """Run every job from `now` to the next round; returns its time and whether it is periodic.

    `arrivals` are the sorted submission times; those up to `seen` (the last round's time,
    −inf before the first) were seen by a round. `due` is the next periodic round's time.

    Periodic rounds (published): at `due`. With `config.event_delay`, earlier when a job is
    submitted or completes: `event_delay` after the first such event, as the live
    scheduler's debounced trigger runs one. A completion is found by stepping epoch by epoch
    through the jobs that may finish before the next round (`SimJob.seconds_to_finish`)
    rather than past it: on published workloads the round follows within the delay and a
    second for all but about one completion in 300.
    """
    if config.event_delay is None:
        slow = _interference(jobs, config.interference)
        for job in jobs:
            job.step(due - now, slow.get(job.name, 0.0))
        return due, True
    periodic_due = due
    delay = config.event_delay
    position = bisect.bisect_right(arrivals, seen)
    if position < len(arrivals):
        due = min(due, arrivals[position] + delay)
    while now < due:
        slow = _interference(jobs, config.interference)
        # Step no further than the end of the epoch of any job that may finish this interval.
        ends = [
            job.seconds_to_epoch_end(slow.get(job.name, 0.0))
            for job in jobs
            if job.seconds_to_finish(slow.get(job.name, 0.0)) < due - now
        ]
        span = min(due - now, max(1.0, float(math.ceil(min(ends)))) if ends else due - now)
        running = [job for job in jobs if not job.completed]
        for job in jobs:
            job.step(span, slow.get(job.name, 0.0))
        now = due if span == due - now else now + span  # exactly on time: the clock stays whole
        for job in running:
            if job.completion_time is not None:
                due = min(due, max(job.completion_time + delay, now))
    return now, due == periodic_due


def _runs_by_application(jobs: Sequence[SimJob]) -> dict[str, list[SimJob]]:
    """Each application's jobs in submission order (ties: workload order)."""
    runs: dict[str, list[SimJob]] = {}
    for job in sorted(jobs, key=lambda j: j.spec.submission_time):
        runs.setdefault(job.app.name, []).append(job)
    return runs


def _seed_profiles(active: Sequence[SimJob], runs: Mapping[str, Sequence[SimJob]]) -> None:
    """Seed each newly active job once from the newest earlier run of its application.

    The earlier run is the newest one submitted before the job that has a throughput fit,
    running or finished, as the live scheduler seeds a submission from the owner's newest
    earlier job of the same name. Its profile includes what it was seeded with, so a chain
    of re-runs carries every configuration measured before.
    """
    for job in active:
        if job.seeded:
            continue
        job.seeded = True
        earlier = runs[job.app.name]
        position = next(i for i, other in enumerate(earlier) if other is job)
        for other in reversed(earlier[:position]):
            if other.perf is not None and other.sizing is JobSizing.ADAPTIVE:
                job.adopt(dict(other.profile))
                break


def _interference(jobs: Sequence[SimJob], slowdown: float) -> dict[str, float]:
    """Slowdown of each distributed job that shares a node with another distributed one."""
    if slowdown <= 0:
        return {}
    distributed = [j for j in jobs if len(set(j.allocation)) > 1]
    per_node = Counter(n for j in distributed for n in set(j.allocation))
    crowded = {n for n, c in per_node.items() if c > 1}
    return {j.name: slowdown for j in distributed if crowded & set(j.allocation)}


def _round_record(now: float, config: SimConfig, jobs: Sequence[SimJob]) -> dict[str, Any]:
    return {
        "timestamp": now,
        "num_nodes": config.nodes,
        "num_gpus": config.nodes * config.gpus_per_node,
        "submitted_jobs": [j.record() for j in jobs if j.spec.submission_time <= now],
    }
