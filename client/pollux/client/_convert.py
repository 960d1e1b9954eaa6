"""Private conversions between the client's dataclasses and ``pollux.v1`` messages.

The only module of the client (with the transport in client.py) that knows protobuf exists;
everything public speaks `pollux.client.types`. Both directions are written for every type so
that a round trip can be tested, and so that fakes in tests can serve the real messages.

Conventions: enum values become short strings ("PENDING", "adascale", "ring"); an unset
Timestamp becomes None; an empty allocation (no nodes) becomes None.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf import timestamp_pb2

from pollux import jobspec
from pollux.client.types import (
    SCALING_RULES,
    Allocation,
    Alternative,
    BatchChoice,
    BatchConfig,
    ClusterStatus,
    Explanation,
    Holder,
    Job,
    JobDecision,
    JobEstimate,
    JobSpec,
    Member,
    ModelSummary,
    NodeStatus,
    RoundInfo,
    ThroughputParams,
    Transition,
)
from pollux.jobspec import wire
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

_STATE_PREFIX = "JOB_STATE_"
_STATE_NAMES: dict[int, str] = {
    v.number: v.name.removeprefix(_STATE_PREFIX) for v in pb.JobState.DESCRIPTOR.values
}
_STATE_NUMBERS: dict[str, int] = {name: number for number, name in _STATE_NAMES.items()}
_SYNC_NAMES: dict[int, str] = {
    pb.SYNC_MODEL_UNSPECIFIED: "ring",  # the API's default shape
    pb.SYNC_MODEL_RING: "ring",
    pb.SYNC_MODEL_LINEAR: "linear",
}
_SYNC_NUMBERS: dict[str, int] = {"ring": pb.SYNC_MODEL_RING, "linear": pb.SYNC_MODEL_LINEAR}


# ---- scalars ---------------------------------------------------------------------------------


def state_name(number: int) -> str:
    """Short name of a JobState value; ``STATE_<n>`` for a value this client does not know."""
    return _STATE_NAMES.get(number, f"STATE_{number}")


def state_number(name: str) -> int:
    """JobState value of a short or full state name, case-insensitively.

    Raises:
        KeyError: The name is not a job state.
    """
    return _STATE_NUMBERS[name.upper().removeprefix(_STATE_PREFIX)]


def time_from_proto(message: Any, name: str) -> datetime | None:
    """The Timestamp field `name` of `message` as an aware UTC datetime, None when unset."""
    if not message.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=UTC)


def time_to_proto(value: datetime | None, target: timestamp_pb2.Timestamp) -> None:
    """Set `target` from `value` (naive datetimes are taken as UTC); leave it unset for None."""
    if value is None:
        return
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    target.FromDatetime(value)


# ---- jobs ------------------------------------------------------------------------------------


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    """The API message of a spec (the job-spec contract's table places each key)."""
    return wire.to_message({key: getattr(spec, key) for key in jobspec.KEYS})


def spec_from_proto(message: pb.JobSpec) -> JobSpec:
    """The spec carried by an API message; an unset or unknown scaling rule is adascale."""
    values = wire.values_of(message)
    if values["scaling_rule"] not in SCALING_RULES:
        values["scaling_rule"] = "adascale"  # the API's default rule
    return JobSpec(**values)


def allocation_to_proto(allocation: Allocation, target: pb.Allocation) -> None:
    """Fill `target` from `allocation`."""
    target.nodes.extend(allocation.nodes)
    target.generation = allocation.generation
    target.round = allocation.round
    time_to_proto(allocation.time, target.time)


def allocation_from_proto(message: pb.Allocation) -> Allocation | None:
    """The allocation, or None when it holds no GPUs."""
    if not message.nodes:
        return None
    return Allocation(
        nodes=tuple(message.nodes),
        generation=message.generation,
        time=time_from_proto(message, "time"),
        round=message.round,
    )


def job_to_proto(job: Job) -> pb.Job:
    """The API message of a job (used by fakes and round-trip tests)."""
    out = pb.Job(
        id=job.id,
        spec=spec_to_proto(job.spec),
        request_id=job.request_id,
        cancel_requested=job.cancel_requested,
        restarts=job.restarts,
        failures=job.failures,
        attained_gpu_seconds=job.attained_gpu_seconds,
        owner=job.owner,
        tenant=job.tenant,
    )
    out.state = state_number(job.state)  # type: ignore[assignment]
    for transition in job.history:
        entry = out.history.add(state=state_number(transition.state), reason=transition.reason)
        time_to_proto(transition.time, entry.time)
    time_to_proto(job.create_time, out.create_time)
    time_to_proto(job.finish_time, out.finish_time)
    time_to_proto(job.estimated_completion, out.estimated_completion)
    if job.allocation is not None:
        allocation_to_proto(job.allocation, out.allocation)
    return out


def job_from_proto(message: pb.Job) -> Job:
    """The job carried by an API message."""
    return Job(
        id=message.id,
        spec=spec_from_proto(message.spec),
        request_id=message.request_id,
        state=state_name(message.state),
        history=tuple(
            Transition(state=state_name(t.state), time=time_from_proto(t, "time"), reason=t.reason)
            for t in message.history
        ),
        create_time=time_from_proto(message, "create_time"),
        finish_time=time_from_proto(message, "finish_time"),
        cancel_requested=message.cancel_requested,
        restarts=message.restarts,
        failures=message.failures,
        allocation=allocation_from_proto(message.allocation),
        attained_gpu_seconds=message.attained_gpu_seconds,
        owner=message.owner,
        tenant=message.tenant,
        estimated_completion=time_from_proto(message, "estimated_completion"),
    )


# ---- explain ---------------------------------------------------------------------------------


def decision_to_proto(decision: JobDecision) -> pb.JobDecision:
    """The API message of a job's decision."""
    return pb.JobDecision(
        job_id=decision.job_id,
        nodes=list(decision.nodes),
        speedup=decision.speedup,
        restart_penalty=decision.restart_penalty,
        reason=decision.reason,
        changed=decision.changed,
    )


def decision_from_proto(message: pb.JobDecision) -> JobDecision:
    """A job's decision from its API message."""
    return JobDecision(
        job_id=message.job_id,
        nodes=tuple(message.nodes),
        speedup=message.speedup,
        restart_penalty=message.restart_penalty,
        reason=message.reason,
        changed=message.changed,
    )


def round_to_proto(info: RoundInfo) -> pb.Decision:
    """The API message of a round (its jobs left empty, as Explain sends it)."""
    out = pb.Decision(
        round=info.round,
        policy=info.policy,
        objective=info.objective,
        snapshot_revision=info.snapshot_revision,
        scheduler_id=info.scheduler_id,
        placement=info.placement,
    )
    time_to_proto(info.time, out.time)
    return out


def round_from_proto(message: pb.Decision) -> RoundInfo:
    """Round number, time, policy and objective of a decision record."""
    return RoundInfo(
        round=message.round,
        time=time_from_proto(message, "time"),
        policy=message.policy,
        objective=message.objective,
        snapshot_revision=message.snapshot_revision,
        scheduler_id=message.scheduler_id,
        placement=message.placement,
    )


def batch_to_proto(batch: BatchConfig) -> pb.BatchConfig:
    """The API message of a batch configuration."""
    return pb.BatchConfig(
        local_batch_size=batch.local_batch_size,
        accum_steps=batch.accum_steps,
        total_batch_size=batch.total_batch_size,
        predicted_speedup=batch.predicted_speedup,
    )


def batch_from_proto(message: pb.BatchConfig) -> BatchConfig:
    """A batch configuration from its API message."""
    return BatchConfig(
        local_batch_size=message.local_batch_size,
        accum_steps=message.accum_steps,
        total_batch_size=message.total_batch_size,
        predicted_speedup=message.predicted_speedup,
    )


def model_to_proto(job_id: str, model: ModelSummary) -> pb.JobModel:
    """The API message of a model summary for job `job_id`."""
    out = pb.JobModel(
        job_id=job_id,
        grad_sqr=model.grad_sqr,
        grad_var=model.grad_var,
        batch=pb.BatchLimits(
            initial_batch_size=model.initial_batch_size,
            max_batch_size=model.max_batch_size,
            min_local_batch_size=model.min_local_batch_size,
            max_local_batch_size=model.max_local_batch_size,
        ),
        max_profiled_replicas=model.max_profiled_replicas,
        observations=model.observations,
        agent_id=model.agent_id,
        seeded_from=model.seeded_from,
    )
    if model.progress is not None:
        out.work.progress = model.progress
        if model.remaining_work is not None:
            out.work.remaining = model.remaining_work
        if model.rescale_pause_s is not None:
            out.work.rescale_pause_s = model.rescale_pause_s
    if model.throughput is not None:
        t = model.throughput
        out.throughput.CopyFrom(
            pb.ThroughputParams(
                alpha_c=t.alpha_c,
                beta_c=t.beta_c,
                alpha_n=t.alpha_n,
                beta_n=t.beta_n,
                alpha_r=t.alpha_r,
                beta_r=t.beta_r,
                gamma=t.gamma,
            )
        )
        out.throughput.sync_model = _SYNC_NUMBERS[t.sync_model]  # type: ignore[assignment]
    time_to_proto(model.update_time, out.update_time)
    return out


def model_from_proto(message: pb.JobModel) -> ModelSummary:
    """A model summary from the job's published model."""
    throughput = None
    if message.HasField("throughput"):
        t = message.throughput
        throughput = ThroughputParams(
            alpha_c=t.alpha_c,
            beta_c=t.beta_c,
            alpha_n=t.alpha_n,
            beta_n=t.beta_n,
            alpha_r=t.alpha_r,
            beta_r=t.beta_r,
            gamma=t.gamma,
            sync_model=_SYNC_NAMES.get(t.sync_model, f"sync_model_{t.sync_model}"),
        )
    return ModelSummary(
        agent_id=message.agent_id,
        observations=message.observations,
        max_profiled_replicas=message.max_profiled_replicas,
        throughput=throughput,
        grad_sqr=message.grad_sqr,
        grad_var=message.grad_var,
        initial_batch_size=message.batch.initial_batch_size,
        max_batch_size=message.batch.max_batch_size,
        min_local_batch_size=message.batch.min_local_batch_size,
        max_local_batch_size=message.batch.max_local_batch_size,
        update_time=time_from_proto(message, "update_time"),
        seeded_from=message.seeded_from,
        **_work_from_proto(message),
    )


def _work_from_proto(message: pb.JobModel) -> dict[str, float | None]:
    if not message.HasField("work"):
        return {}
    work = message.work
    return {
        "progress": work.progress,
        "remaining_work": work.remaining if work.HasField("remaining") else None,
        "rescale_pause_s": work.rescale_pause_s if work.HasField("rescale_pause_s") else None,
    }


def explanation_to_proto(explanation: Explanation) -> spb.ExplainResponse:
    """The Explain reply that carries `explanation`."""
    out = spb.ExplainResponse(job=job_to_proto(explanation.job))
    if explanation.decision is not None:
        out.decision.CopyFrom(decision_to_proto(explanation.decision))
    if explanation.round is not None:
        out.round.CopyFrom(round_to_proto(explanation.round))
    if explanation.model is not None:
        out.model.CopyFrom(model_to_proto(explanation.job.id, explanation.model))
    if explanation.batch is not None:
        out.batch.CopyFrom(batch_to_proto(explanation.batch))
    change = explanation.last_change
    if change is not None:
        out.last_change.state = state_number(change.state)  # type: ignore[assignment]
        out.last_change.reason = change.reason
        time_to_proto(change.time, out.last_change.time)
    for a in explanation.alternatives:
        out.alternatives.add(gpus=a.gpus, nodes=a.nodes, speedup=a.speedup, goodput=a.goodput)
    for h in explanation.holders:
        out.holders.add(
            job_id=h.job_id,
            gpus=h.gpus,
            speedup=h.speedup,
            speedup_without_one=h.speedup_without_one,
        )
    choice = explanation.batch_choice
    if choice is not None:
        out.batch_choice.CopyFrom(
            spb.ExplainBatch(
                batch_size=choice.batch_size,
                local_batch_size=choice.local_batch_size,
                accum_steps=choice.accum_steps,
                throughput=choice.throughput,
                efficiency=choice.efficiency,
                goodput=choice.goodput,
            )
        )
    out.queue_position = explanation.queue_position
    out.pending_jobs = explanation.pending_jobs
    out.objective = explanation.objective
    return out


def explanation_from_proto(message: spb.ExplainResponse) -> Explanation:
    """An explanation from an Explain reply; absent parts become None."""
    return Explanation(
        job=job_from_proto(message.job),
        decision=decision_from_proto(message.decision) if message.HasField("decision") else None,
        round=round_from_proto(message.round) if message.HasField("round") else None,
        model=model_from_proto(message.model) if message.HasField("model") else None,
        batch=batch_from_proto(message.batch) if message.HasField("batch") else None,
        last_change=Transition(
            state=state_name(message.last_change.state),
            time=time_from_proto(message.last_change, "time"),
            reason=message.last_change.reason,
        )
        if message.HasField("last_change")
        else None,
        alternatives=tuple(
            Alternative(gpus=a.gpus, nodes=a.nodes, speedup=a.speedup, goodput=a.goodput)
            for a in message.alternatives
        ),
        holders=tuple(
            Holder(
                job_id=h.job_id,
                gpus=h.gpus,
                speedup=h.speedup,
                speedup_without_one=h.speedup_without_one,
            )
            for h in message.holders
        ),
        batch_choice=BatchChoice(
            batch_size=message.batch_choice.batch_size,
            local_batch_size=message.batch_choice.local_batch_size,
            accum_steps=message.batch_choice.accum_steps,
            throughput=message.batch_choice.throughput,
            efficiency=message.batch_choice.efficiency,
            goodput=message.batch_choice.goodput,
        )
        if message.HasField("batch_choice")
        else None,
        queue_position=message.queue_position,
        pending_jobs=message.pending_jobs,
        objective=message.objective,
    )


# ---- cluster ---------------------------------------------------------------------------------


def node_to_proto(node: NodeStatus) -> spb.NodeStatus:
    """The API message of a node's status."""
    out = spb.NodeStatus(
        node=pb.Node(
            name=node.name,
            address=node.address,
            gpus=node.gpus,
            gpu_type=node.gpu_type,
            labels=dict(node.labels),
        ),
        allocated_gpus=node.allocated_gpus,
        jobs=list(node.jobs),
    )
    time_to_proto(node.register_time, out.node.register_time)
    return out


def node_from_proto(message: spb.NodeStatus) -> NodeStatus:
    """A node's status from its API message."""
    node = message.node
    return NodeStatus(
        name=node.name,
        address=node.address,
        gpus=node.gpus,
        gpu_type=node.gpu_type,
        labels=dict(node.labels),
        register_time=time_from_proto(node, "register_time"),
        allocated_gpus=message.allocated_gpus,
        jobs=tuple(message.jobs),
    )


def cluster_to_proto(status: ClusterStatus) -> spb.ClusterStatusResponse:
    """The ClusterStatus reply that carries `status`."""
    return spb.ClusterStatusResponse(
        nodes=[node_to_proto(n) for n in status.nodes],
        agents=[pb.Member(id=a.id, address=a.address) for a in status.agents],
        leader_id=status.leader_id,
        leader_address=status.leader_address,
        total_gpus=status.total_gpus,
        allocated_gpus=status.allocated_gpus,
        jobs_by_state=dict(status.jobs_by_state),
        last_round=status.last_round,
        answered_by=status.answered_by,
    )


def cluster_from_proto(message: spb.ClusterStatusResponse) -> ClusterStatus:
    """The cluster status from a ClusterStatus reply."""
    return ClusterStatus(
        nodes=tuple(node_from_proto(n) for n in message.nodes),
        agents=tuple(Member(id=a.id, address=a.address) for a in message.agents),
        leader_id=message.leader_id,
        leader_address=message.leader_address,
        total_gpus=message.total_gpus,
        allocated_gpus=message.allocated_gpus,
        jobs_by_state=dict(message.jobs_by_state),
        last_round=message.last_round,
        answered_by=message.answered_by,
        warnings=tuple(message.warnings),
    )


def estimate_from_proto(message: spb.EstimateJobResponse) -> JobEstimate:
    """A job estimate from an EstimateJob reply."""
    return JobEstimate(
        predicted_jct_s=message.predicted_jct_s,
        predicted_completion=time_from_proto(message, "predicted_completion"),
        reference_job_id=message.reference_job_id,
        work=message.work,
        rounds=message.rounds,
    )
