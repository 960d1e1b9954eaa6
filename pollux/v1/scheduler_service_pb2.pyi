import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from pollux.v1 import launcher_service_pb2 as _launcher_service_pb2
from pollux.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetJobTimelineRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobTimelineResponse(_message.Message):
    __slots__ = ("timeline",)
    TIMELINE_FIELD_NUMBER: _ClassVar[int]
    timeline: _types_pb2.JobTimeline
    def __init__(self, timeline: _Optional[_Union[_types_pb2.JobTimeline, _Mapping]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    request_id: str
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    created: bool
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "name_prefix", "labels", "page_size", "page_token", "newest_first", "owner")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATES_FIELD_NUMBER: _ClassVar[int]
    NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.JobState]
    name_prefix: str
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    newest_first: bool
    owner: str
    def __init__(self, states: _Optional[_Iterable[_Union[_types_pb2.JobState, str]]] = ..., name_prefix: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., newest_first: _Optional[bool] = ..., owner: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class WatchJobsResponse(_message.Message):
    __slots__ = ("job", "deleted")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    deleted: bool
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., deleted: _Optional[bool] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("job", "decision", "round", "model", "batch", "last_change", "alternatives", "holders", "batch_choice", "queue_position", "pending_jobs", "objective", "allocation_decision", "allocation_round")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    LAST_CHANGE_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_CHOICE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_DECISION_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ROUND_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    decision: _types_pb2.JobDecision
    round: _types_pb2.Decision
    model: _types_pb2.JobModel
    batch: _types_pb2.BatchConfig
    last_change: _types_pb2.StateTransition
    alternatives: _containers.RepeatedCompositeFieldContainer[ExplainAlternative]
    holders: _containers.RepeatedCompositeFieldContainer[ExplainHolder]
    batch_choice: ExplainBatch
    queue_position: int
    pending_jobs: int
    objective: str
    allocation_decision: _types_pb2.JobDecision
    allocation_round: _types_pb2.Decision
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., decision: _Optional[_Union[_types_pb2.JobDecision, _Mapping]] = ..., round: _Optional[_Union[_types_pb2.Decision, _Mapping]] = ..., model: _Optional[_Union[_types_pb2.JobModel, _Mapping]] = ..., batch: _Optional[_Union[_types_pb2.BatchConfig, _Mapping]] = ..., last_change: _Optional[_Union[_types_pb2.StateTransition, _Mapping]] = ..., alternatives: _Optional[_Iterable[_Union[ExplainAlternative, _Mapping]]] = ..., holders: _Optional[_Iterable[_Union[ExplainHolder, _Mapping]]] = ..., batch_choice: _Optional[_Union[ExplainBatch, _Mapping]] = ..., queue_position: _Optional[int] = ..., pending_jobs: _Optional[int] = ..., objective: _Optional[str] = ..., allocation_decision: _Optional[_Union[_types_pb2.JobDecision, _Mapping]] = ..., allocation_round: _Optional[_Union[_types_pb2.Decision, _Mapping]] = ...) -> None: ...

class EstimateJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class EstimateJobResponse(_message.Message):
    __slots__ = ("predicted_jct_s", "predicted_completion", "reference_job_id", "work", "rounds")
    PREDICTED_JCT_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_COMPLETION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    predicted_jct_s: float
    predicted_completion: _timestamp_pb2.Timestamp
    reference_job_id: str
    work: float
    rounds: int
    def __init__(self, predicted_jct_s: _Optional[float] = ..., predicted_completion: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reference_job_id: _Optional[str] = ..., work: _Optional[float] = ..., rounds: _Optional[int] = ...) -> None: ...

class ExplainAlternative(_message.Message):
    __slots__ = ("gpus", "nodes", "speedup", "goodput")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    nodes: int
    speedup: float
    goodput: float
    def __init__(self, gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., speedup: _Optional[float] = ..., goodput: _Optional[float] = ...) -> None: ...

class ExplainHolder(_message.Message):
    __slots__ = ("job_id", "gpus", "speedup", "speedup_without_one", "name")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_WITHOUT_ONE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    gpus: int
    speedup: float
    speedup_without_one: float
    name: str
    def __init__(self, job_id: _Optional[str] = ..., gpus: _Optional[int] = ..., speedup: _Optional[float] = ..., speedup_without_one: _Optional[float] = ..., name: _Optional[str] = ...) -> None: ...

class ExplainBatch(_message.Message):
    __slots__ = ("batch_size", "local_batch_size", "accum_steps", "throughput", "efficiency", "goodput")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    local_batch_size: int
    accum_steps: int
    throughput: float
    efficiency: float
    goodput: float
    def __init__(self, batch_size: _Optional[int] = ..., local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., throughput: _Optional[float] = ..., efficiency: _Optional[float] = ..., goodput: _Optional[float] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node", "allocated_gpus", "jobs")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_GPUS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    node: _types_pb2.Node
    allocated_gpus: int
    jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[_Union[_types_pb2.Node, _Mapping]] = ..., allocated_gpus: _Optional[int] = ..., jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("nodes", "agents", "leader_id", "leader_address", "total_gpus", "allocated_gpus", "jobs_by_state", "last_round", "answered_by", "warnings", "dashboard_url")
    class JobsByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_GPUS_FIELD_NUMBER: _ClassVar[int]
    JOBS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    DASHBOARD_URL_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    agents: _containers.RepeatedCompositeFieldContainer[_types_pb2.Member]
    leader_id: str
    leader_address: str
    total_gpus: int
    allocated_gpus: int
    jobs_by_state: _containers.ScalarMap[str, int]
    last_round: int
    answered_by: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    dashboard_url: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., agents: _Optional[_Iterable[_Union[_types_pb2.Member, _Mapping]]] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., total_gpus: _Optional[int] = ..., allocated_gpus: _Optional[int] = ..., jobs_by_state: _Optional[_Mapping[str, int]] = ..., last_round: _Optional[int] = ..., answered_by: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., dashboard_url: _Optional[str] = ...) -> None: ...
