import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from pollux.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StreamLogsRequest(_message.Message):
    __slots__ = ("job_id", "rank", "follow", "tail_lines", "min_generation", "since")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    MIN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    follow: bool
    tail_lines: int
    min_generation: int
    since: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., follow: _Optional[bool] = ..., tail_lines: _Optional[int] = ..., min_generation: _Optional[int] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StreamLogsResponse(_message.Message):
    __slots__ = ("lines", "generation")
    LINES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    def __init__(self, lines: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[_types_pb2.ReplicaStatus]
    def __init__(self, replicas: _Optional[_Iterable[_Union[_types_pb2.ReplicaStatus, _Mapping]]] = ...) -> None: ...
