from pollux.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportMetricsRequest(_message.Message):
    __slots__ = ("job_id", "generation", "rank", "seq", "observations", "gradient", "work", "user_metrics")
    class UserMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    USER_METRICS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generation: int
    rank: int
    seq: int
    observations: _containers.RepeatedCompositeFieldContainer[_types_pb2.StepObservation]
    gradient: _types_pb2.GradientStats
    work: _types_pb2.WorkStatus
    user_metrics: _containers.ScalarMap[str, float]
    def __init__(self, job_id: _Optional[str] = ..., generation: _Optional[int] = ..., rank: _Optional[int] = ..., seq: _Optional[int] = ..., observations: _Optional[_Iterable[_Union[_types_pb2.StepObservation, _Mapping]]] = ..., gradient: _Optional[_Union[_types_pb2.GradientStats, _Mapping]] = ..., work: _Optional[_Union[_types_pb2.WorkStatus, _Mapping]] = ..., user_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ReportMetricsResponse(_message.Message):
    __slots__ = ("applied", "observations", "agents")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    observations: int
    agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, applied: _Optional[bool] = ..., observations: _Optional[int] = ..., agents: _Optional[_Iterable[str]] = ...) -> None: ...

class GetBatchConfigRequest(_message.Message):
    __slots__ = ("job_id", "num_nodes", "num_replicas")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    num_nodes: int
    num_replicas: int
    def __init__(self, job_id: _Optional[str] = ..., num_nodes: _Optional[int] = ..., num_replicas: _Optional[int] = ...) -> None: ...

class GetBatchConfigResponse(_message.Message):
    __slots__ = ("config", "agents")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    config: _types_pb2.BatchConfig
    agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, config: _Optional[_Union[_types_pb2.BatchConfig, _Mapping]] = ..., agents: _Optional[_Iterable[str]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: _types_pb2.JobModel
    def __init__(self, model: _Optional[_Union[_types_pb2.JobModel, _Mapping]] = ...) -> None: ...
