"""Client dataclasses survive a trip through the pollux.v1 messages, and back."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.client import _convert as convert
from pollux.client.types import (
    JOB_STATES,
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
    JobSpec,
    Member,
    ModelSummary,
    Mount,
    NodeStatus,
    RoundInfo,
    ThroughputParams,
    Transition,
)
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=False)
# Protobuf strings are UTF-8: no lone surrogates.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
WORDS = st.dictionaries(TEXT, TEXT, max_size=3)
TIMES = st.none() | st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
STATES = st.sampled_from(JOB_STATES)


specs = st.builds(
    JobSpec,
    name=TEXT,
    command=st.lists(TEXT, max_size=4).map(tuple),
    initial_batch_size=U32,
    env=WORDS,
    working_dir=TEXT,
    max_batch_size=U32,
    min_local_batch_size=U32,
    max_local_batch_size=U32,
    scaling_rule=st.sampled_from(SCALING_RULES),
    max_replicas=U32,
    max_failures=U32,
    stop_grace_s=U32,
    labels=WORDS,
    image=TEXT,
    shm_size_mb=U32,
    mounts=st.lists(st.builds(Mount, TEXT, TEXT, read_only=st.booleans()), max_size=2).map(tuple),
)
allocations = st.builds(
    Allocation,
    nodes=st.lists(TEXT, min_size=1, max_size=6).map(tuple),
    generation=U64,
    time=TIMES,
    round=U64,
)
jobs = st.builds(
    Job,
    id=TEXT,
    spec=specs,
    request_id=TEXT,
    state=STATES,
    history=st.lists(st.builds(Transition, STATES, TIMES, TEXT), max_size=4).map(tuple),
    create_time=TIMES,
    finish_time=TIMES,
    cancel_requested=st.booleans(),
    restarts=U32,
    failures=U32,
    allocation=st.none() | allocations,
    attained_gpu_seconds=FLOATS,
)
throughputs = st.builds(
    ThroughputParams,
    *[FLOATS] * 7,
    sync_model=st.sampled_from(["ring", "linear"]),
)
models = st.builds(
    ModelSummary,
    agent_id=TEXT,
    observations=U64,
    max_profiled_replicas=U32,
    throughput=st.none() | throughputs,
    grad_sqr=FLOATS,
    grad_var=FLOATS,
    initial_batch_size=U32,
    max_batch_size=U32,
    min_local_batch_size=U32,
    max_local_batch_size=U32,
    update_time=TIMES,
    progress=st.none() | FLOATS,
    remaining_work=st.none() | FLOATS,
    rescale_pause_s=st.none() | FLOATS,
).filter(lambda m: m.progress is not None or (m.remaining_work, m.rescale_pause_s) == (None, None))
explanations = st.builds(
    Explanation,
    job=jobs,
    decision=st.none()
    | st.builds(
        JobDecision,
        TEXT,
        st.lists(TEXT, max_size=4).map(tuple),
        FLOATS,
        FLOATS,
        TEXT,
        st.booleans(),
    ),
    round=st.none() | st.builds(RoundInfo, U64, TIMES, TEXT, FLOATS, I64, TEXT, st.booleans()),
    model=st.none() | models,
    batch=st.none() | st.builds(BatchConfig, U32, U32, U32, FLOATS),
    last_change=st.none() | st.builds(Transition, STATES, TIMES, TEXT),
    alternatives=st.lists(st.builds(Alternative, U32, U32, FLOATS, FLOATS), max_size=3).map(tuple),
    holders=st.lists(st.builds(Holder, TEXT, U32, FLOATS, FLOATS), max_size=3).map(tuple),
    batch_choice=st.none() | st.builds(BatchChoice, U32, U32, U32, FLOATS, FLOATS, FLOATS),
    queue_position=U32,
    pending_jobs=U32,
    objective=TEXT,
)
clusters = st.builds(
    ClusterStatus,
    nodes=st.lists(
        st.builds(
            NodeStatus,
            name=TEXT,
            address=TEXT,
            gpus=U32,
            gpu_type=TEXT,
            labels=WORDS,
            register_time=TIMES,
            allocated_gpus=U32,
            jobs=st.lists(TEXT, max_size=4).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
    agents=st.lists(st.builds(Member, TEXT, TEXT), max_size=3).map(tuple),
    leader_id=TEXT,
    leader_address=TEXT,
    total_gpus=U32,
    allocated_gpus=U32,
    jobs_by_state=st.dictionaries(TEXT, U32, max_size=3),
    last_round=U64,
    answered_by=TEXT,
)


@given(specs)
def test_spec_round_trips(spec):
    assert convert.spec_from_proto(convert.spec_to_proto(spec)) == spec


@given(jobs)
def test_job_round_trips(job):
    assert convert.job_from_proto(convert.job_to_proto(job)) == job


@given(jobs)
def test_job_round_trips_through_the_wire(job):
    wire = convert.job_to_proto(job).SerializeToString()
    assert convert.job_from_proto(pb.Job.FromString(wire)) == job


@settings(max_examples=50)
@given(explanations)
def test_explanation_round_trips(explanation):
    assert convert.explanation_from_proto(convert.explanation_to_proto(explanation)) == explanation


@settings(max_examples=50)
@given(clusters)
def test_cluster_status_round_trips(cluster):
    assert convert.cluster_from_proto(convert.cluster_to_proto(cluster)) == cluster


def test_unset_times_and_empty_allocation_become_none():
    job = convert.job_from_proto(pb.Job(id="j-1", state=pb.JOB_STATE_PENDING))
    assert job.create_time is None
    assert job.finish_time is None
    assert job.allocation is None
    assert job.gpus == 0
    released = pb.Job(id="j-1", allocation=pb.Allocation(generation=4, round=9))
    assert convert.job_from_proto(released).allocation is None


def test_times_are_aware_utc_to_the_microsecond():
    job = pb.Job()
    job.create_time.FromDatetime(datetime(2024, 5, 1, 12, 30, 5, 123456, tzinfo=UTC))
    created = convert.job_from_proto(job).create_time
    assert created == datetime(2024, 5, 1, 12, 30, 5, 123456, tzinfo=UTC)
    assert created is not None
    assert created.utcoffset() is not None


def test_naive_datetimes_are_taken_as_utc():
    stamp = pb.Job().create_time
    convert.time_to_proto(datetime(2024, 1, 1, 0, 0, 1), stamp)
    assert stamp.seconds == 1704067201


def test_states_and_enums_become_short_strings():
    message = pb.Job(state=pb.JOB_STATE_RESCALING)
    message.history.add(state=pb.JOB_STATE_PENDING, reason="submitted")
    job = convert.job_from_proto(message)
    assert job.state == "RESCALING"
    assert job.history[0] == Transition("PENDING", None, "submitted")


def test_an_unknown_state_from_a_newer_server_is_kept_readable():
    assert convert.state_name(42) == "STATE_42"
    assert convert.state_name(pb.JOB_STATE_UNSPECIFIED) == "UNSPECIFIED"


@pytest.mark.parametrize("name", ["running", "RUNNING", "JOB_STATE_RUNNING", "Running"])
def test_state_names_are_case_insensitive(name):
    assert convert.state_number(name) == pb.JOB_STATE_RUNNING


def test_unknown_state_name_raises_key_error():
    with pytest.raises(KeyError):
        convert.state_number("sleeping")


@pytest.mark.parametrize(
    ("wire", "want"),
    [
        (pb.SCALING_RULE_UNSPECIFIED, "adascale"),
        (pb.SCALING_RULE_ADASCALE, "adascale"),
        (pb.SCALING_RULE_LINEAR, "linear"),
        (pb.SCALING_RULE_SQRT, "sqrt"),
        (pb.SCALING_RULE_NONE, "none"),
    ],
)
def test_scaling_rule_defaults_to_adascale(wire, want):
    assert convert.spec_from_proto(pb.JobSpec(scaling_rule=wire)).scaling_rule == want


def test_spec_batch_limits_go_to_the_batch_message():
    spec = JobSpec("a", ("x",), 128, max_batch_size=1024, max_local_batch_size=256)
    message = convert.spec_to_proto(spec)
    assert (message.batch.initial_batch_size, message.batch.max_batch_size) == (128, 1024)
    assert message.batch.max_local_batch_size == 256
    assert message.scaling_rule == pb.SCALING_RULE_ADASCALE


def test_explanation_parts_absent_on_the_wire_are_none():
    explanation = convert.explanation_from_proto(spb.ExplainResponse(job=pb.Job(id="j-1")))
    assert explanation.decision is None
    assert explanation.round is None
    assert explanation.model is None
    assert explanation.batch is None


def test_model_without_a_fit_has_no_throughput():
    model = convert.model_from_proto(pb.JobModel(job_id="j", observations=3))
    assert model.throughput is None
    assert model.observations == 3
