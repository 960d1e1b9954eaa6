"""Private conversions between the client's dataclasses and ``pollux.v1`` messages.

The only module of the client (with the transport in client.py) that knows protobuf exists;
everything public speaks `pollux.client.types`. Both directions are written for every type so
that a round trip can be tested, and so that fakes in tests can serve the real messages.

Conventions: enum values become short strings ("PENDING", "adascale", "ring"); an unset
Timestamp becomes None; an empty allocation (no nodes) becomes None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

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

M = TypeVar("M", bound=Message)
T = TypeVar("T")

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


# ---- like-named fields ----------------------------------------------------------------------
#
# Most client dataclasses mirror a message field for field, by name. These two copy every field
# the two share, each by its kind (scalar, repeated, map, Timestamp); what is not alike (a
# nested message, an enum, a field of another message) is given by the caller, so each
# conversion below names only what differs and a field added to both moves with no code.

_TIMESTAMP = timestamp_pb2.Timestamp.DESCRIPTOR.full_name


def _is_map(field: Any) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def _is_repeated(field: Any) -> bool:
    return bool(field.is_repeated)


def _to_message(value: Any, message: M, **given: Any) -> M:
    """Fill `message` from the like-named fields of the dataclass `value`, then from `given`.

    Sequences extend a repeated field, mappings update a map, datetimes set a Timestamp (None
    leaves it unset), a message is copied (None leaves it unset); fields the message does not
    have are skipped.
    """
    fields = message.DESCRIPTOR.fields_by_name
    shared = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.name in fields}
    for name, item in {**shared, **given}.items():
        field, target = fields[name], getattr(message, name)
        if item is None:
            continue
        if field.message_type is not None and field.message_type.full_name == _TIMESTAMP:
            time_to_proto(item, target)
        elif _is_map(field):
            target.update(item)
        elif _is_repeated(field):
            target.extend(item)
        elif field.message_type is not None:
            target.CopyFrom(item)
        else:
            setattr(message, name, item)
    return message


def _from_message(cls: type[T], *messages: Any, **given: Any) -> T:
    """The dataclass `cls` from `given` and the like-named fields of `messages`.

    Each field comes from the first message that has it. Repeated fields become tuples, maps
    dicts, Timestamps datetimes (None when unset), an ``optional`` scalar None when unset; a
    dataclass field no message has keeps its default unless given.
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        holder = next((m for m in messages if f.name in m.DESCRIPTOR.fields_by_name), None)
        if f.name in given or holder is None:
            continue
        field, item = holder.DESCRIPTOR.fields_by_name[f.name], getattr(holder, f.name)
        if field.message_type is not None and field.message_type.full_name == _TIMESTAMP:
            values[f.name] = time_from_proto(holder, f.name)
        elif _is_map(field):
            values[f.name] = dict(item)
        elif _is_repeated(field):
            values[f.name] = tuple(item)
        elif field.message_type is None and field.has_presence and not holder.HasField(f.name):
            values[f.name] = None
        else:
            values[f.name] = item
    return cls(**values, **given)


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
    _to_message(allocation, target)


def allocation_from_proto(message: pb.Allocation) -> Allocation | None:
    """The allocation, or None when it holds no GPUs."""
    return _from_message(Allocation, message) if message.nodes else None


def _transition_to_proto(transition: Transition) -> pb.StateTransition:
    return _to_message(transition, pb.StateTransition(), state=state_number(transition.state))


def _transition_from_proto(message: pb.StateTransition) -> Transition:
    return _from_message(Transition, message, state=state_name(message.state))


def job_to_proto(job: Job) -> pb.Job:
    """The API message of a job (used by fakes and round-trip tests)."""
    return _to_message(
        job,
        pb.Job(),
        spec=spec_to_proto(job.spec),
        state=state_number(job.state),
        history=[_transition_to_proto(t) for t in job.history],
        allocation=None if job.allocation is None else _to_message(job.allocation, pb.Allocation()),
    )


def job_from_proto(message: pb.Job) -> Job:
    """The job carried by an API message."""
    return _from_message(
        Job,
        message,
        spec=spec_from_proto(message.spec),
        state=state_name(message.state),
        history=tuple(_transition_from_proto(t) for t in message.history),
        allocation=allocation_from_proto(message.allocation),
    )


# ---- explain ---------------------------------------------------------------------------------


def decision_to_proto(decision: JobDecision) -> pb.JobDecision:
    """The API message of a job's decision."""
    return _to_message(decision, pb.JobDecision())


def decision_from_proto(message: pb.JobDecision) -> JobDecision:
    """A job's decision from its API message."""
    return _from_message(JobDecision, message)


def round_to_proto(info: RoundInfo) -> pb.Decision:
    """The API message of a round (its jobs left empty, as Explain sends it)."""
    return _to_message(info, pb.Decision())


def round_from_proto(message: pb.Decision) -> RoundInfo:
    """Round number, time, policy and objective of a decision record."""
    return _from_message(RoundInfo, message)


def batch_to_proto(batch: BatchConfig) -> pb.BatchConfig:
    """The API message of a batch configuration."""
    return _to_message(batch, pb.BatchConfig())


def batch_from_proto(message: pb.BatchConfig) -> BatchConfig:
    """A batch configuration from its API message."""
    return _from_message(BatchConfig, message)


_BATCH_LIMITS = tuple(pb.BatchLimits.DESCRIPTOR.fields_by_name)
"""The batch limits a model summary carries flat (in the message, in `batch`)."""


def model_to_proto(job_id: str, model: ModelSummary) -> pb.JobModel:
    """The API message of a model summary for job `job_id`."""
    out = _to_message(
        model,
        pb.JobModel(job_id=job_id),
        batch=pb.BatchLimits(**{name: getattr(model, name) for name in _BATCH_LIMITS}),
        throughput=None,
    )
    if model.progress is not None:
        out.work.progress = model.progress
        if model.remaining_work is not None:
            out.work.remaining = model.remaining_work
        if model.rescale_pause_s is not None:
            out.work.rescale_pause_s = model.rescale_pause_s
    if model.throughput is not None:
        t = model.throughput
        _to_message(t, out.throughput, sync_model=_SYNC_NUMBERS[t.sync_model])
    return out


def model_from_proto(message: pb.JobModel) -> ModelSummary:
    """A model summary from the job's published model."""
    throughput = None
    if message.HasField("throughput"):
        t = message.throughput
        throughput = _from_message(
            ThroughputParams,
            t,
            sync_model=_SYNC_NAMES.get(t.sync_model, f"sync_model_{t.sync_model}"),
        )
    return _from_message(
        ModelSummary, message, message.batch, throughput=throughput, **_work_from_proto(message)
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
    change = explanation.last_change
    model = explanation.model
    return _to_message(
        explanation,
        spb.ExplainResponse(),
        job=job_to_proto(explanation.job),
        decision=_optional(decision_to_proto, explanation.decision),
        round=_optional(round_to_proto, explanation.round),
        model=None if model is None else model_to_proto(explanation.job.id, model),
        batch=_optional(batch_to_proto, explanation.batch),
        last_change=_optional(_transition_to_proto, change),
        alternatives=[_to_message(a, spb.ExplainAlternative()) for a in explanation.alternatives],
        holders=[_to_message(h, spb.ExplainHolder()) for h in explanation.holders],
        batch_choice=_optional(
            lambda choice: _to_message(choice, spb.ExplainBatch()), explanation.batch_choice
        ),
        allocation_decision=_optional(decision_to_proto, explanation.allocation_decision),
        allocation_round=_optional(round_to_proto, explanation.allocation_round),
    )


def explanation_from_proto(message: spb.ExplainResponse) -> Explanation:
    """An explanation from an Explain reply; absent parts become None."""

    def part(name: str, convert: Callable[[Any], Any]) -> Any:
        return convert(getattr(message, name)) if message.HasField(name) else None

    return _from_message(
        Explanation,
        message,
        job=job_from_proto(message.job),
        decision=part("decision", decision_from_proto),
        round=part("round", round_from_proto),
        model=part("model", model_from_proto),
        batch=part("batch", batch_from_proto),
        last_change=part("last_change", _transition_from_proto),
        alternatives=tuple(_from_message(Alternative, a) for a in message.alternatives),
        holders=tuple(_from_message(Holder, h) for h in message.holders),
        batch_choice=part("batch_choice", lambda b: _from_message(BatchChoice, b)),
        allocation_decision=part("allocation_decision", decision_from_proto),
        allocation_round=part("allocation_round", round_from_proto),
    )


def _optional(convert: Callable[[Any], M], value: Any) -> M | None:
    return None if value is None else convert(value)


# ---- cluster ---------------------------------------------------------------------------------


def node_to_proto(node: NodeStatus) -> spb.NodeStatus:
    """The API message of a node's status."""
    return _to_message(node, spb.NodeStatus(), node=_to_message(node, pb.Node()))


def node_from_proto(message: spb.NodeStatus) -> NodeStatus:
    """A node's status from its API message (the node's own fields are in `node`)."""
    return _from_message(NodeStatus, message.node, message)


def cluster_to_proto(status: ClusterStatus) -> spb.ClusterStatusResponse:
    """The ClusterStatus reply that carries `status`."""
    return _to_message(
        status,
        spb.ClusterStatusResponse(),
        nodes=[node_to_proto(n) for n in status.nodes],
        agents=[_to_message(a, pb.Member()) for a in status.agents],
    )


def cluster_from_proto(message: spb.ClusterStatusResponse) -> ClusterStatus:
    """The cluster status from a ClusterStatus reply."""
    return _from_message(
        ClusterStatus,
        message,
        nodes=tuple(node_from_proto(n) for n in message.nodes),
        agents=tuple(_from_message(Member, a) for a in message.agents),
    )


def estimate_from_proto(message: spb.EstimateJobResponse) -> JobEstimate:
    """A job estimate from an EstimateJob reply."""
    return _from_message(JobEstimate, message)
