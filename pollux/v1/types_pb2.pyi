import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_ALLOCATED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_RESCALING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class ScalingRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCALING_RULE_UNSPECIFIED: _ClassVar[ScalingRule]
    SCALING_RULE_ADASCALE: _ClassVar[ScalingRule]
    SCALING_RULE_LINEAR: _ClassVar[ScalingRule]
    SCALING_RULE_SQRT: _ClassVar[ScalingRule]
    SCALING_RULE_NONE: _ClassVar[ScalingRule]

class SyncModel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SYNC_MODEL_UNSPECIFIED: _ClassVar[SyncModel]
    SYNC_MODEL_RING: _ClassVar[SyncModel]
    SYNC_MODEL_LINEAR: _ClassVar[SyncModel]

class ReplicaPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_PHASE_UNSPECIFIED: _ClassVar[ReplicaPhase]
    REPLICA_PHASE_RUNNING: _ClassVar[ReplicaPhase]
    REPLICA_PHASE_EXITED: _ClassVar[ReplicaPhase]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_ALLOCATED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_RESCALING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
SCALING_RULE_UNSPECIFIED: ScalingRule
SCALING_RULE_ADASCALE: ScalingRule
SCALING_RULE_LINEAR: ScalingRule
SCALING_RULE_SQRT: ScalingRule
SCALING_RULE_NONE: ScalingRule
SYNC_MODEL_UNSPECIFIED: SyncModel
SYNC_MODEL_RING: SyncModel
SYNC_MODEL_LINEAR: SyncModel
REPLICA_PHASE_UNSPECIFIED: ReplicaPhase
REPLICA_PHASE_RUNNING: ReplicaPhase
REPLICA_PHASE_EXITED: ReplicaPhase

class BatchLimits(_message.Message):
    __slots__ = ("initial_batch_size", "max_batch_size", "min_local_batch_size", "max_local_batch_size")
    INITIAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    initial_batch_size: int
    max_batch_size: int
    min_local_batch_size: int
    max_local_batch_size: int
    def __init__(self, initial_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., min_local_batch_size: _Optional[int] = ..., max_local_batch_size: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "command", "env", "working_dir", "batch", "scaling_rule", "max_replicas", "max_failures", "stop_grace_s", "labels", "secret_env", "image", "shm_size_mb", "mounts")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SecretEnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SCALING_RULE_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_FAILURES_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENV_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_MB_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    working_dir: str
    batch: BatchLimits
    scaling_rule: ScalingRule
    max_replicas: int
    max_failures: int
    stop_grace_s: int
    labels: _containers.ScalarMap[str, str]
    secret_env: _containers.ScalarMap[str, str]
    image: str
    shm_size_mb: int
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    def __init__(self, name: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., batch: _Optional[_Union[BatchLimits, _Mapping]] = ..., scaling_rule: _Optional[_Union[ScalingRule, str]] = ..., max_replicas: _Optional[int] = ..., max_failures: _Optional[int] = ..., stop_grace_s: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., secret_env: _Optional[_Mapping[str, str]] = ..., image: _Optional[str] = ..., shm_size_mb: _Optional[int] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("host_path", "container_path", "read_only")
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    host_path: str
    container_path: str
    read_only: bool
    def __init__(self, host_path: _Optional[str] = ..., container_path: _Optional[str] = ..., read_only: _Optional[bool] = ...) -> None: ...

class StateTransition(_message.Message):
    __slots__ = ("state", "time", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    time: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "request_id", "state", "history", "create_time", "cancel_requested", "restarts", "failures", "allocation", "finish_time", "attained_gpu_seconds", "owner", "tenant", "estimated_completion", "cancel_reason", "resizes", "reversals", "last_resize")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    ATTAINED_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_COMPLETION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REASON_FIELD_NUMBER: _ClassVar[int]
    RESIZES_FIELD_NUMBER: _ClassVar[int]
    REVERSALS_FIELD_NUMBER: _ClassVar[int]
    LAST_RESIZE_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: JobSpec
    request_id: str
    state: JobState
    history: _containers.RepeatedCompositeFieldContainer[StateTransition]
    create_time: _timestamp_pb2.Timestamp
    cancel_requested: bool
    restarts: int
    failures: int
    allocation: Allocation
    finish_time: _timestamp_pb2.Timestamp
    attained_gpu_seconds: float
    owner: str
    tenant: str
    estimated_completion: _timestamp_pb2.Timestamp
    cancel_reason: str
    resizes: int
    reversals: int
    last_resize: int
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., request_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., history: _Optional[_Iterable[_Union[StateTransition, _Mapping]]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_requested: _Optional[bool] = ..., restarts: _Optional[int] = ..., failures: _Optional[int] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attained_gpu_seconds: _Optional[float] = ..., owner: _Optional[str] = ..., tenant: _Optional[str] = ..., estimated_completion: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_reason: _Optional[str] = ..., resizes: _Optional[int] = ..., reversals: _Optional[int] = ..., last_resize: _Optional[int] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("nodes", "generation", "time", "round")
    NODES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    time: _timestamp_pb2.Timestamp
    round: int
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., round: _Optional[int] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "address", "gpus", "gpu_type", "labels", "register_time")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    gpus: int
    gpu_type: str
    labels: _containers.ScalarMap[str, str]
    register_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., gpus: _Optional[int] = ..., gpu_type: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., register_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "address")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ThroughputParams(_message.Message):
    __slots__ = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma", "sync_model")
    ALPHA_C_FIELD_NUMBER: _ClassVar[int]
    BETA_C_FIELD_NUMBER: _ClassVar[int]
    ALPHA_N_FIELD_NUMBER: _ClassVar[int]
    BETA_N_FIELD_NUMBER: _ClassVar[int]
    ALPHA_R_FIELD_NUMBER: _ClassVar[int]
    BETA_R_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    SYNC_MODEL_FIELD_NUMBER: _ClassVar[int]
    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float
    sync_model: SyncModel
    def __init__(self, alpha_c: _Optional[float] = ..., beta_c: _Optional[float] = ..., alpha_n: _Optional[float] = ..., beta_n: _Optional[float] = ..., alpha_r: _Optional[float] = ..., beta_r: _Optional[float] = ..., gamma: _Optional[float] = ..., sync_model: _Optional[_Union[SyncModel, str]] = ...) -> None: ...

class JobModel(_message.Message):
    __slots__ = ("job_id", "throughput", "grad_sqr", "grad_var", "batch", "max_profiled_replicas", "observations", "update_time", "agent_id", "work", "seeded_from")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    GRAD_SQR_FIELD_NUMBER: _ClassVar[int]
    GRAD_VAR_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_PROFILED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    SEEDED_FROM_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    throughput: ThroughputParams
    grad_sqr: float
    grad_var: float
    batch: BatchLimits
    max_profiled_replicas: int
    observations: int
    update_time: _timestamp_pb2.Timestamp
    agent_id: str
    work: WorkStatus
    seeded_from: str
    def __init__(self, job_id: _Optional[str] = ..., throughput: _Optional[_Union[ThroughputParams, _Mapping]] = ..., grad_sqr: _Optional[float] = ..., grad_var: _Optional[float] = ..., batch: _Optional[_Union[BatchLimits, _Mapping]] = ..., max_profiled_replicas: _Optional[int] = ..., observations: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., agent_id: _Optional[str] = ..., work: _Optional[_Union[WorkStatus, _Mapping]] = ..., seeded_from: _Optional[str] = ...) -> None: ...

class WorkStatus(_message.Message):
    __slots__ = ("progress", "remaining", "rescale_pause_s")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESCALE_PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    progress: float
    remaining: float
    rescale_pause_s: float
    def __init__(self, progress: _Optional[float] = ..., remaining: _Optional[float] = ..., rescale_pause_s: _Optional[float] = ...) -> None: ...

class StepObservation(_message.Message):
    __slots__ = ("num_nodes", "num_replicas", "local_batch_size", "accum_steps", "accum_step_time_s", "optim_step_time_s", "count")
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    OPTIM_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    num_nodes: int
    num_replicas: int
    local_batch_size: int
    accum_steps: int
    accum_step_time_s: float
    optim_step_time_s: float
    count: int
    def __init__(self, num_nodes: _Optional[int] = ..., num_replicas: _Optional[int] = ..., local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., accum_step_time_s: _Optional[float] = ..., optim_step_time_s: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class GradientStats(_message.Message):
    __slots__ = ("sqr", "var")
    SQR_FIELD_NUMBER: _ClassVar[int]
    VAR_FIELD_NUMBER: _ClassVar[int]
    sqr: float
    var: float
    def __init__(self, sqr: _Optional[float] = ..., var: _Optional[float] = ...) -> None: ...

class ObservationProfile(_message.Message):
    __slots__ = ("job_id", "observations", "gradient", "applied_seq", "last_configs", "work", "seed_observations", "seeded_from")
    class AppliedSeqEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class LastConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: BatchConfig
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[BatchConfig, _Mapping]] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    SEED_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    SEEDED_FROM_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    observations: _containers.RepeatedCompositeFieldContainer[StepObservation]
    gradient: GradientStats
    applied_seq: _containers.ScalarMap[str, int]
    last_configs: _containers.MessageMap[str, BatchConfig]
    work: WorkStatus
    seed_observations: _containers.RepeatedCompositeFieldContainer[StepObservation]
    seeded_from: str
    def __init__(self, job_id: _Optional[str] = ..., observations: _Optional[_Iterable[_Union[StepObservation, _Mapping]]] = ..., gradient: _Optional[_Union[GradientStats, _Mapping]] = ..., applied_seq: _Optional[_Mapping[str, int]] = ..., last_configs: _Optional[_Mapping[str, BatchConfig]] = ..., work: _Optional[_Union[WorkStatus, _Mapping]] = ..., seed_observations: _Optional[_Iterable[_Union[StepObservation, _Mapping]]] = ..., seeded_from: _Optional[str] = ...) -> None: ...

class BatchConfig(_message.Message):
    __slots__ = ("local_batch_size", "accum_steps", "total_batch_size", "predicted_speedup")
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    local_batch_size: int
    accum_steps: int
    total_batch_size: int
    predicted_speedup: float
    def __init__(self, local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., total_batch_size: _Optional[int] = ..., predicted_speedup: _Optional[float] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("job_id", "node", "rank", "generation", "phase", "exit_code", "time", "pid", "output_tail", "disk_full", "refused")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TAIL_FIELD_NUMBER: _ClassVar[int]
    DISK_FULL_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    node: str
    rank: int
    generation: int
    phase: ReplicaPhase
    exit_code: int
    time: _timestamp_pb2.Timestamp
    pid: int
    output_tail: str
    disk_full: bool
    refused: bool
    def __init__(self, job_id: _Optional[str] = ..., node: _Optional[str] = ..., rank: _Optional[int] = ..., generation: _Optional[int] = ..., phase: _Optional[_Union[ReplicaPhase, str]] = ..., exit_code: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pid: _Optional[int] = ..., output_tail: _Optional[str] = ..., disk_full: _Optional[bool] = ..., refused: _Optional[bool] = ...) -> None: ...

class JobDecision(_message.Message):
    __slots__ = ("job_id", "nodes", "speedup", "restart_penalty", "reason", "changed", "move_factor", "speedup_one_more", "gpu_limit", "reference_gpus", "reference_nodes", "model_time")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    RESTART_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    MOVE_FACTOR_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_ONE_MORE_FIELD_NUMBER: _ClassVar[int]
    GPU_LIMIT_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_GPUS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_NODES_FIELD_NUMBER: _ClassVar[int]
    MODEL_TIME_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    speedup: float
    restart_penalty: float
    reason: str
    changed: bool
    move_factor: float
    speedup_one_more: float
    gpu_limit: int
    reference_gpus: int
    reference_nodes: int
    model_time: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., speedup: _Optional[float] = ..., restart_penalty: _Optional[float] = ..., reason: _Optional[str] = ..., changed: _Optional[bool] = ..., move_factor: _Optional[float] = ..., speedup_one_more: _Optional[float] = ..., gpu_limit: _Optional[int] = ..., reference_gpus: _Optional[int] = ..., reference_nodes: _Optional[int] = ..., model_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("round", "time", "policy", "objective", "jobs", "snapshot_revision", "scheduler_id", "pending_not_recorded", "unchanged_not_recorded", "placement", "idle_gpus")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REVISION_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_NOT_RECORDED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_NOT_RECORDED_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    IDLE_GPUS_FIELD_NUMBER: _ClassVar[int]
    round: int
    time: _timestamp_pb2.Timestamp
    policy: str
    objective: float
    jobs: _containers.RepeatedCompositeFieldContainer[JobDecision]
    snapshot_revision: int
    scheduler_id: str
    pending_not_recorded: int
    unchanged_not_recorded: int
    placement: bool
    idle_gpus: int
    def __init__(self, round: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., policy: _Optional[str] = ..., objective: _Optional[float] = ..., jobs: _Optional[_Iterable[_Union[JobDecision, _Mapping]]] = ..., snapshot_revision: _Optional[int] = ..., scheduler_id: _Optional[str] = ..., pending_not_recorded: _Optional[int] = ..., unchanged_not_recorded: _Optional[int] = ..., placement: _Optional[bool] = ..., idle_gpus: _Optional[int] = ...) -> None: ...

class ApiToken(_message.Message):
    __slots__ = ("id", "user", "role", "tenant", "secret_sha256", "create_time", "expire_time", "description", "created_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SECRET_SHA256_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    user: str
    role: str
    tenant: str
    secret_sha256: bytes
    create_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    description: str
    created_by: str
    def __init__(self, id: _Optional[str] = ..., user: _Optional[str] = ..., role: _Optional[str] = ..., tenant: _Optional[str] = ..., secret_sha256: _Optional[bytes] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., description: _Optional[str] = ..., created_by: _Optional[str] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("name", "guarantee_gpus", "weight", "cap_gpus", "create_time")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_GPUS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CAP_GPUS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    guarantee_gpus: int
    weight: float
    cap_gpus: int
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., guarantee_gpus: _Optional[int] = ..., weight: _Optional[float] = ..., cap_gpus: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("time", "principal", "role", "action", "target", "peer", "outcome", "detail")
    TIME_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    principal: str
    role: str
    action: str
    target: str
    peer: str
    outcome: str
    detail: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., principal: _Optional[str] = ..., role: _Optional[str] = ..., action: _Optional[str] = ..., target: _Optional[str] = ..., peer: _Optional[str] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class UsageRecord(_message.Message):
    __slots__ = ("tenant", "user", "day", "gpu_seconds", "goodput_seconds")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    DAY_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user: str
    day: str
    gpu_seconds: float
    goodput_seconds: float
    def __init__(self, tenant: _Optional[str] = ..., user: _Optional[str] = ..., day: _Optional[str] = ..., gpu_seconds: _Optional[float] = ..., goodput_seconds: _Optional[float] = ...) -> None: ...

class TimelinePoint(_message.Message):
    __slots__ = ("time", "generation", "gpus", "nodes", "batch_size", "throughput", "efficiency", "goodput", "predicted_goodput", "progress", "remaining", "user_metrics")
    class UserMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TIME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_GOODPUT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    USER_METRICS_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    generation: int
    gpus: int
    nodes: int
    batch_size: int
    throughput: float
    efficiency: float
    goodput: float
    predicted_goodput: float
    progress: float
    remaining: float
    user_metrics: _containers.ScalarMap[str, float]
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., generation: _Optional[int] = ..., gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., batch_size: _Optional[int] = ..., throughput: _Optional[float] = ..., efficiency: _Optional[float] = ..., goodput: _Optional[float] = ..., predicted_goodput: _Optional[float] = ..., progress: _Optional[float] = ..., remaining: _Optional[float] = ..., user_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class JobTimeline(_message.Message):
    __slots__ = ("job_id", "points")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    points: _containers.RepeatedCompositeFieldContainer[TimelinePoint]
    def __init__(self, job_id: _Optional[str] = ..., points: _Optional[_Iterable[_Union[TimelinePoint, _Mapping]]] = ...) -> None: ...

class JobUser(_message.Message):
    __slots__ = ("job_id", "uid", "claim_time")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TIME_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    uid: int
    claim_time: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., uid: _Optional[int] = ..., claim_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
