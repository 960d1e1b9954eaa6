"""One scheduling round as a pure plan over a snapshot (docs/architecture.md §1 item 4).

`plan_round` takes the cluster `Snapshot` read at one etcd revision and returns every write
the round makes; the scheduler commits them in fenced transactions. The phases: (1) reconcile
replica reports with job states (running, succeeded, failed, planned stops, cancellations,
vanished nodes); (2) build the policy's `ClusterState` from the active jobs and their models;
(3) run the policy (pure, seeded) for a full round or a *placement* round (event-triggered
under `scheduling.event_rounds = "place"`: the jobs that never ran, on the free GPUs), decided
as the simulator decides it (pollux.policy.rounds); (4) diff against current allocations: new
allocations get the next generation, and job states follow (ALLOCATED, RESCALING, PENDING);
(5) the scheduler commits; (6) it records the decision. Nothing here performs I/O, reads a
clock or draws randomness of its own, so a round can be replayed from its snapshot.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

import numpy as np

from pollux.goodput import (
    UNKNOWN_GRAD,
    GoodputModel,
    GradParams,
    PerfParams,
    SyncModel,
    best_batch,
    iteration_time,
)
from pollux.goodput import errors as goodput_errors
from pollux.policy.jct import resize_history
from pollux.policy.rounds import decide_round
from pollux.policy.types import (
    ClusterState,
    JobInfo,
    M,
    NodeInfo,
    OracleInfo,
    Policy,
    TenantSpec,
)
from pollux.scheduler import failure_hints
from pollux.scheduler.explain import decision_entry
from pollux.scheduler.lifecycle import ACTIVE, transition
from pollux.service.store import Snapshot
from pollux.v1 import types_pb2 as pb

MAX_RECORDED_PENDING = 1000
"""Jobs without GPUs recorded per decision beyond those holding GPUs (etcd values stay small)."""
MAX_DECISION_BYTES = 256 * 1024
"""Bytes of a decision record's jobs past which jobs without GPUs are no longer recorded.

Jobs that hold or change GPUs are always recorded (their nodes add up to the cluster's GPUs:
2048 single-GPU jobs with the policies' one-line reasons fill about 250 KiB, under the store's
512 KiB per value); jobs without GPUs fill what is left of this budget. `explain` reads up to
50 records per call and the scheduler keeps `decision_history` of them, so a record stays far
smaller than a value may be.
"""
PLANNED_STOP = 143
"""Exit code of a replica that checkpointed after SIGTERM (docs/architecture.md §7)."""
REFRESH_ROUNDS = 25
"""A job whose decision (nodes, reason) did not change is recorded again after this many
rounds, so `explain`, which reads the last 50 records, always finds it; in between, decision
records list only what changed and stay small however many jobs are active."""


@dataclass(frozen=True, slots=True)
class KnownJob:
    """A job's `JobInfo` as the last round built it, with the inputs it was built from.

    A round builds a JobInfo for every active job; for a job whose record and model are the
    very objects of the last round (the mirror replaces objects on change, never mutates
    them) only the GPU time it has held moves on, so the rest is reused.
    """

    job: pb.Job
    model: pb.JobModel | None
    total_gpus: int
    info: JobInfo


@dataclass(frozen=True, slots=True)
class Recorded:
    """A job's decision as last written to a decision record (the scheduler keeps these)."""

    nodes: tuple[str, ...]
    reason: str
    round: int


@dataclass
class RoundPlan(Generic[M]):
    """Every write of one round.

    Attributes:
        jobs: Changed job records with the mod revision they were read at.
        allocations: New allocation per job id (put), or None (delete).
        decision: The decision record.
        memory: The policy's memory for the next round.
        recorded: Each active job's decision as the records hold it once this round is
            committed (pass to the next round).
        active_jobs: Jobs the policy planned for.
        held_gpus: GPUs the jobs hold once the round is committed.
        known: Each active job's `KnownJob` (pass to the next round).
    """

    jobs: list[tuple[pb.Job, int]] = field(default_factory=list)
    allocations: dict[str, pb.Allocation | None] = field(default_factory=dict)
    decision: pb.Decision = field(default_factory=pb.Decision)
    memory: M | None = None
    recorded: dict[str, Recorded] = field(default_factory=dict)
    active_jobs: int = 0
    held_gpus: int = 0
    known: dict[str, KnownJob] = field(default_factory=dict)


def plan_round(
    snapshot: Snapshot,
    policy: Policy[M],
    memory: M | None,
    rng: np.random.Generator,
    *,
    now: float,
    round_number: int,
    scheduler_id: str,
    recorded: Mapping[str, Recorded] | None = None,
    known: Mapping[str, KnownJob] | None = None,
    placement: bool = False,
) -> RoundPlan[M]:
    """Plan one round (see the module docstring).

    `recorded` and `known` are the previous round's `RoundPlan.recorded` and `.known` (None: a
    leader term's first round, which records every job and builds every JobInfo). With
    `placement`, only jobs that never ran are planned, on the GPUs no job holds; the policy's
    warm start stays the last full round's. With tenants every round is a full one (a
    placement cannot see the GPUs a tenant holds elsewhere).
    """
    plan: RoundPlan[M] = RoundPlan(memory=memory)
    changed: dict[str, pb.Job] = {}
    # Records are copied before the first change only (copy on write): most jobs of a large
    # cluster do not change in a round, and copying ten thousand of them costs more than
    # planning their GPUs.
    working: dict[str, pb.Job] = {
        job_id: entry.value
        for job_id, entry in snapshot.jobs.items()
        if entry.value.state in ACTIVE
    }
    statuses = _statuses_by_job(snapshot.replicas)

    # Phase 1: replica reports, cancellations and vanished nodes.
    for job_id, original in list(working.items()):
        if not (original.cancel_requested or original.allocation.nodes):
            continue  # nothing for phase 1 to apply to a job holding nothing
        job = _copy(original)
        if _reconcile(job, statuses.get(job_id, {}), snapshot.nodes, now, round_number, plan):
            working[job_id] = changed[job_id] = job

    # Phases 2-3: the policy over jobs still active.
    active = sorted(
        (j for j in working.values() if j.state in ACTIVE),
        key=lambda j: (j.create_time.ToNanoseconds(), j.id),
    )
    state = cluster_state(
        snapshot,
        active,
        now=now,
        policy=policy,
        info=lambda job, total: _known_info(
            job, snapshot.models.get(job.id), total, now, policy, known or {}, plan
        ),
    )
    total = sum(n.gpus for n in state.nodes)
    plan.active_jobs = len(active)
    decided = decide_round(state, policy, memory, rng, placement=placement)
    decision, planned = decided.decision, decided.planned
    plan.memory = decided.memory

    # Phase 4: diff and transitions.
    record = plan.decision
    record.round = round_number
    record.time.FromNanoseconds(int(now * 1e9))
    record.policy = policy.name
    record.objective = decision.objective if math.isfinite(decision.objective) else 0.0
    record.snapshot_revision = snapshot.revision
    record.scheduler_id = scheduler_id
    record.placement = planned is not None
    entries: list[pb.JobDecision] = []
    for job in active:
        old_nodes = tuple(job.allocation.nodes)
        if planned is not None and job.id not in planned:
            plan.held_gpus += len(old_nodes)  # kept as it is, and not recorded
            continue
        new_nodes = tuple(decision.allocations.get(job.id, ()))
        plan.held_gpus += len(new_nodes)
        explain = decision.explain.get(job.id)
        moved = new_nodes != old_nodes and Counter(new_nodes) != Counter(old_nodes)
        model = snapshot.models.get(job.id)
        entries.append(decision_entry(job.id, new_nodes, explain, moved, model))
        if not moved:
            continue
        reason = explain.reason if explain else "re-allocated"
        mine = changed.get(job.id) or _copy(job)
        _reallocate(mine, new_nodes, now, round_number, reason, plan)
        changed[job.id] = mine
    record.idle_gpus = max(0, int(total) - plan.held_gpus)
    previous = recorded or {}
    _remember(plan, entries, previous, round_number, max_entries=MAX_RECORDED_PENDING + int(total))
    if planned is not None:  # what records hold of the jobs this round left alone
        for job in active:
            if job.id not in planned and job.id in previous:
                plan.recorded[job.id] = previous[job.id]

    # Jobs that give GPUs up are written before jobs that take GPUs (see `takes_gpus`).
    ordered = sorted(
        changed.items(),
        key=lambda item: takes_gpus(snapshot.jobs[item[0]].value.allocation, item[1].allocation),
    )
    plan.jobs = [(job, snapshot.jobs[job_id].mod_revision) for job_id, job in ordered]
    return plan


def _remember(
    plan: RoundPlan[Any],
    entries: list[pb.JobDecision],
    previous: Mapping[str, Recorded],
    round_number: int,
    *,
    max_entries: int,
) -> None:
    """Record the decisions no recent record holds, and what records now hold of each job."""
    fresh = [e for e in entries if not _already_recorded(e, previous.get(e.job_id), round_number)]
    record = plan.decision
    record.unchanged_not_recorded = len(entries) - len(fresh)
    _record_jobs(record, fresh, max_entries=max_entries)
    written = {e.job_id for e in record.jobs}
    for decided in entries:
        job_id = decided.job_id
        if job_id in written:
            plan.recorded[job_id] = Recorded(tuple(decided.nodes), decided.reason, round_number)
        elif job_id in previous:
            plan.recorded[job_id] = previous[job_id]


def takes_gpus(old: pb.Allocation, new: pb.Allocation) -> bool:
    """Whether an allocation change holds more GPUs than before on some node.

    A round too large for one transaction commits in chunks, in plan order, so a round cut
    short (its leader deposed, a conflict, a crash) has applied a prefix. Writing every job
    that only gives GPUs up first means a cut in that part leaves nodes emptier than either
    plan, and only a cut among the takers can leave a node over-committed in etcd — and then
    only where a taker moves into GPUs that a mover not yet written still holds. That state is
    safe: a launcher starts a replica only on a free slot of its own node (placement waits
    otherwise) and a generation only after the previous one exited, so no GPU is ever used
    twice, and the next round plans again from what was committed.
    """
    before = Counter(old.nodes)
    return any(count > before[node] for node, count in Counter(new.nodes).items())


def _already_recorded(entry: pb.JobDecision, last: Recorded | None, round_number: int) -> bool:
    """Whether a record of the last `REFRESH_ROUNDS` rounds already says what `entry` says."""
    return (
        last is not None
        and not entry.changed
        and last.nodes == tuple(entry.nodes)
        and last.reason == entry.reason
        and round_number - last.round < REFRESH_ROUNDS
    )


def _record_jobs(record: pb.Decision, entries: list[pb.JobDecision], *, max_entries: int) -> None:
    """Record `entries` in order, bounded so a round's record stays a small etcd value.

    Every job that holds or changes GPUs is recorded. A job without GPUs is recorded while the
    record has fewer than `max_entries` jobs and its bytes fit in what the GPU holders leave of
    `MAX_DECISION_BYTES`; the others are counted in `pending_not_recorded` (explain then says
    "waiting for GPUs").
    """
    holders = [e for e in entries if e.nodes or e.changed]
    budget = MAX_DECISION_BYTES - sum(_entry_bytes(e) for e in holders)
    for entry in entries:
        if not (entry.nodes or entry.changed):
            if len(record.jobs) >= max_entries or _entry_bytes(entry) > budget:
                record.pending_not_recorded += 1
                continue
            budget -= _entry_bytes(entry)
        record.jobs.append(entry)


def _entry_bytes(entry: pb.JobDecision) -> int:
    """An entry's bytes in the record: its own, a tag and a length (under 4 bytes together)."""
    return int(entry.ByteSize()) + 4


def _statuses_by_job(
    replicas: list[pb.ReplicaStatus],
) -> dict[str, dict[int, pb.ReplicaStatus]]:
    out: dict[str, dict[int, pb.ReplicaStatus]] = {}
    for status in replicas:
        out.setdefault(status.job_id, {})[status.rank] = status
    return out


def _reconcile(
    job: pb.Job,
    statuses: dict[int, pb.ReplicaStatus],
    nodes: dict[str, pb.Node],
    now: float,
    round_number: int,
    plan: RoundPlan[Any],
) -> bool:
    """Apply what happened since the last round to one job; True if it changed."""
    allocation = job.allocation
    if job.cancel_requested:
        _release(job, now, plan)
        transition(job, pb.JOB_STATE_CANCELLED, now, f"cancelled by {job.cancel_reason or 'user'}")
        return True
    if not allocation.nodes:
        return False
    before = job.SerializeToString()
    lost = sorted({n for n in allocation.nodes if n not in nodes})
    if lost:
        _release(job, now, plan)
        job.restarts += 1
        transition(job, pb.JOB_STATE_PENDING, now, f"node {', '.join(lost)} left the cluster")
        return True
    current = [statuses.get(rank) for rank in range(len(allocation.nodes))]
    mine = [s for s in current if s is not None and s.generation == allocation.generation]
    exited = [s for s in mine if s.phase == pb.REPLICA_PHASE_EXITED]
    failed = [s for s in exited if s.exit_code not in (0, PLANNED_STOP)]
    if failed:
        first = min(failed, key=lambda s: s.rank)
        job.failures += 1
        what = f"replica {first.rank} on {first.node} exited {first.exit_code}"
        advice = failure_hints.hint(first.exit_code, first.output_tail)
        said = f" ({advice})" if advice else ""
        said += f": {first.output_tail}" if first.output_tail else ""
        full = next((s for s in failed if s.disk_full), None)
        refused = next((s for s in failed if s.refused), None)
        if refused is not None:
            # The launcher refuses the job itself: any restart would be refused alike.
            _release(job, now, plan)
            transition(
                job,
                pb.JOB_STATE_FAILED,
                now,
                f"replica {refused.rank} on {refused.node} was refused by its launcher, not "
                f"restarted (fix the job, then resubmit): {refused.output_tail}",
            )
        elif full is not None:
            # Restarting would only meet the same full disk (and fill it again): fail now.
            _release(job, now, plan)
            what = f"replica {full.rank} on {full.node} exited {full.exit_code}"
            transition(
                job,
                pb.JOB_STATE_FAILED,
                now,
                f"{what} on a full disk, not restarted (free space, then resubmit): "
                f"{full.output_tail}",
            )
        elif job.failures > job.spec.max_failures:
            _release(job, now, plan)
            transition(job, pb.JOB_STATE_FAILED, now, f"{what}; {job.failures} failures{said}")
        else:
            nodes_again = tuple(allocation.nodes)
            _reallocate(
                job,
                nodes_again,
                now,
                round_number,
                f"{what}; restart {job.failures}/{job.spec.max_failures}{said}",
                plan,
            )
        return True
    if len(exited) == len(allocation.nodes) and all(s.exit_code == 0 for s in exited):
        _release(job, now, plan)
        transition(job, pb.JOB_STATE_SUCCEEDED, now, "every replica exited 0")
        return True
    planned = [s for s in exited if s.exit_code == PLANNED_STOP]
    if planned:
        _reallocate(
            job,
            tuple(allocation.nodes),
            now,
            round_number,
            f"replica {planned[0].rank} stopped (exit 143) without a re-allocation; restarting",
            plan,
        )
        return True
    running = [s for s in mine if s.phase in (pb.REPLICA_PHASE_RUNNING, pb.REPLICA_PHASE_EXITED)]
    if len(running) == len(allocation.nodes) and job.state in (
        pb.JOB_STATE_ALLOCATED,
        pb.JOB_STATE_RESCALING,
    ):
        transition(
            job,
            pb.JOB_STATE_RUNNING,
            now,
            f"{len(running)} replica{'s' * (len(running) != 1)} running",
        )
    return job.SerializeToString() != before


def _copy(job: pb.Job) -> pb.Job:
    """A copy of a snapshot's record that a round may change."""
    mine = pb.Job()
    mine.CopyFrom(job)
    return mine


def _held_seconds(job: pb.Job, now: float) -> float:
    held = len(job.allocation.nodes) * max(0.0, now - job.allocation.time.ToNanoseconds() / 1e9)
    return job.attained_gpu_seconds + (held if job.allocation.nodes else 0.0)


def _release(job: pb.Job, now: float, plan: RoundPlan[Any]) -> None:
    """Take every GPU from a job (its launchers stop the replicas)."""
    if job.allocation.nodes:
        job.attained_gpu_seconds = _held_seconds(job, now)
        generation = job.allocation.generation
        job.ClearField("allocation")
        job.allocation.generation = generation
        plan.allocations[job.id] = None


def _reallocate(
    job: pb.Job,
    nodes: tuple[str, ...],
    now: float,
    round_number: int,
    reason: str,
    plan: RoundPlan[Any],
) -> None:
    """Give a job `nodes` as a new generation, moving its state to match."""
    had = bool(job.allocation.nodes)
    if had or job.allocation.generation > 0:  # it has held GPUs: not its first allocation
        job.resizes, job.reversals, job.last_resize = resize_history(
            job.resizes, job.reversals, job.last_resize, len(job.allocation.nodes), len(nodes)
        )
    job.attained_gpu_seconds = _held_seconds(job, now)
    generation = job.allocation.generation + 1
    job.ClearField("allocation")
    if not nodes:
        job.allocation.generation = generation - 1
        plan.allocations[job.id] = None
        job.restarts += 1
        transition(job, pb.JOB_STATE_PENDING, now, reason or "suspended")
        return
    job.allocation.nodes.extend(nodes)
    job.allocation.generation = generation
    job.allocation.time.FromNanoseconds(int(now * 1e9))
    job.allocation.round = round_number
    allocation = pb.Allocation()
    allocation.CopyFrom(job.allocation)
    plan.allocations[job.id] = allocation
    gpus = f"{len(nodes)} GPU{'s' if len(nodes) != 1 else ''} on {', '.join(sorted(set(nodes)))}"
    if had:
        job.restarts += 1
        transition(job, pb.JOB_STATE_RESCALING, now, f"{reason}: {gpus}")
    elif job.state == pb.JOB_STATE_PENDING:
        transition(job, pb.JOB_STATE_ALLOCATED, now, f"{reason}: {gpus}")
    else:
        transition(job, pb.JOB_STATE_RESCALING, now, f"{reason}: {gpus}")


def cluster_state(
    snapshot: Snapshot,
    active: Sequence[pb.Job],
    *,
    now: float,
    policy: Policy[Any],
    info: Callable[[pb.Job, int], JobInfo] | None = None,
) -> ClusterState:
    """`policy`'s view of `active` jobs (in submission order) on the snapshot's nodes.

    `info(job, total_gpus)` builds each JobInfo (a round reuses last round's); by default
    they are built afresh from the snapshot's models, as `Explain` does.
    """
    nodes = tuple(
        NodeInfo(name=n.name, gpus=int(n.gpus))
        for n in sorted(snapshot.nodes.values(), key=lambda n: n.name)
    )
    total = sum(n.gpus for n in nodes)
    if info is None:

        def info(job: pb.Job, total: int) -> JobInfo:
            return _job_info(job, snapshot.models.get(job.id), total, now, policy)

    return ClusterState(
        now=now,
        nodes=nodes,
        jobs=tuple(info(job, total) for job in active),
        tenants=tenant_specs(snapshot.tenants),
    )


def goodput_model(job: pb.Job, model: pb.JobModel | None) -> GoodputModel | None:
    """The policy's view of a job's published model, or None before a throughput fit."""
    if model is None or not model.HasField("throughput"):
        return None
    t = model.throughput
    limits = job.spec.batch
    try:
        grad = (
            GradParams(sqr=model.grad_sqr, var=model.grad_var)
            if model.grad_sqr > 0 or model.grad_var > 0
            else UNKNOWN_GRAD
        )
        return GoodputModel(
            perf=PerfParams(
                t.alpha_c,
                t.beta_c,
                t.alpha_n,
                t.beta_n,
                t.alpha_r,
                t.beta_r,
                max(t.gamma, 1.0),
                SyncModel.LINEAR if t.sync_model == pb.SYNC_MODEL_LINEAR else SyncModel.RING,
            ),
            grad=grad,
            init_batch_size=int(limits.initial_batch_size),
            max_batch_size=int(limits.max_batch_size or limits.initial_batch_size),
            min_atomic_bsz=int(limits.min_local_batch_size or 1),
            max_atomic_bsz=int(limits.max_local_batch_size) or None,
            accumulation=True,
        )
    except goodput_errors.GoodputError:
        return None  # an unusable model is treated as no model: linear-scaling assumption


def _known_info(
    job: pb.Job,
    model: pb.JobModel | None,
    total_gpus: int,
    now: float,
    policy: Policy[Any],
    known: Mapping[str, KnownJob],
    plan: RoundPlan[Any],
) -> JobInfo:
    """A job's JobInfo, reused from the last round when its inputs are the same objects."""
    last = known.get(job.id)
    if (
        last is not None
        and last.job is job
        and last.model is model
        and last.total_gpus == total_gpus
    ):
        info = last.info
        held = _held_seconds(job, now)
        if info.attained_service != held:
            info = dataclasses.replace(info, attained_service=held)
    else:
        info = _job_info(job, model, total_gpus, now, policy)
    plan.known[job.id] = KnownJob(job, model, total_gpus, info)
    return info


def batch_replicas(limits: pb.BatchLimits) -> int:
    """Most replicas the batch limits admit: max batch ÷ min local batch (at least 1)."""
    top = int(limits.max_batch_size or limits.initial_batch_size)
    return max(1, top // max(1, int(limits.min_local_batch_size or 1)))


def replica_cap(spec: pb.JobSpec, total_gpus: int) -> int:
    """The most replicas a job's spec (max_replicas), the cluster and its batch limits allow.

    A policy's `replica_limit` bounds the job further, as rounds, Explain and EstimateJob
    give it (`JobInfo.max_replicas`).
    """
    cap = min(spec.max_replicas or total_gpus, max(total_gpus, 1))
    return max(1, min(cap, batch_replicas(spec.batch)))


def _job_info(
    job: pb.Job,
    model: pb.JobModel | None,
    total_gpus: int,
    now: float,
    policy: Policy[Any],
) -> JobInfo:
    spec = job.spec
    profiled = int(model.max_profiled_replicas) if model is not None else 0
    max_replicas = policy.replica_limit(
        profiled, len(job.allocation.nodes), replica_cap(spec, total_gpus)
    )
    gm = goodput_model(job, model)
    remaining, pause = declared_work(model)
    oracle = _predicted_oracle(gm, max_replicas) if policy.needs_oracle else None
    return JobInfo(
        name=job.id,
        submission_time=job.create_time.ToNanoseconds() / 1e9,
        allocation=tuple(job.allocation.nodes),
        restarts=int(job.restarts),
        attained_service=_held_seconds(job, now),
        max_replicas=max_replicas,
        model=gm,
        target_replicas=max(1, min(int(spec.max_replicas or 1), total_gpus or 1)),
        target_batch_size=int(spec.batch.initial_batch_size),
        oracle=oracle,
        tenant=job.tenant,
        owner=job.owner,
        label=job.spec.name,
        remaining_work=remaining,
        restart_pause_s=pause,
        resizes=int(job.resizes),
        reversals=int(job.reversals),
        last_resize=int(job.last_resize),
    )


def seconds_left(job: pb.Job, model: pb.JobModel | None) -> float | None:
    """Predicted seconds until `job` completes on its current allocation, or None.

    Declared remaining work (M0-steps) x M0 / the goodput (M0-equivalent samples/s) its model
    predicts at the batch it would choose there: what `estimated_completion` adds to now.
    None when it holds no GPUs, declares no size or has no throughput model yet.
    """
    replicas = len(job.allocation.nodes)
    remaining, _ = declared_work(model)
    fitted = goodput_model(job, model) if remaining is not None and replicas else None
    if fitted is None or remaining is None:
        return None
    nodes = len(set(job.allocation.nodes))
    rate = float(best_batch(fitted, nodes, replicas).goodput)
    return remaining * fitted.init_batch_size / rate if rate > 0 else None


def declared_work(model: pb.JobModel | None) -> tuple[float | None, float | None]:
    """(remaining work in M0-steps, last rescale pause in s) of the job's latest work report.

    None for what it did not report (no size declared, no rescale yet, an older library).
    """
    if model is None or not model.HasField("work"):
        return None, None
    work = model.work
    return (
        work.remaining if work.HasField("remaining") else None,
        work.rescale_pause_s if work.HasField("rescale_pause_s") else None,
    )


def tenant_specs(tenants: list[pb.Tenant]) -> tuple[TenantSpec, ...]:
    """The policy's view of the admin's tenants (AdminService validated every field)."""
    return tuple(
        TenantSpec(
            name=t.name,
            guarantee_gpus=int(t.guarantee_gpus),
            weight=float(t.weight) or 1.0,
            cap_gpus=int(t.cap_gpus) or None,
        )
        for t in sorted(tenants, key=lambda t: t.name)
    )


def _predicted_oracle(model: GoodputModel | None, top: int) -> OracleInfo:
    """Optimus's inputs from the fitted model (no true oracle exists on a real cluster).

    Step times at K replicas are predicted on a consolidated placement at the initial batch;
    remaining work is unknown, so every job counts one unit and Optimus ranks jobs by their
    marginal speedup alone. Before a fit, linear scaling is assumed.
    """
    ks = np.arange(1, top + 1)
    if model is None:
        times = 1.0 / ks
    else:
        m0 = model.init_batch_size
        local = np.maximum(1, np.ceil(m0 / ks)).astype(np.int64)
        nodes = np.ones_like(ks)
        times = np.asarray(
            iteration_time(model.perf, nodes, ks, local, np.zeros_like(ks)), dtype=np.float64
        )
    step = np.concatenate(([np.inf], times))
    return OracleInfo(step_time=step, remaining_iterations=1.0)
