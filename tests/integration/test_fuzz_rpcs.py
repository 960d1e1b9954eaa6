"""Every RPC of every service, fuzzed: the servers answer, keep serving and store nothing bad.

Requests come from hypothesis strategies built from the request messages' descriptors (NUL,
unicode and megabytes of text; extreme integers; unknown enum values; repeated, map and nested
fields), from a valid request of each method with one field at any depth replaced (which gets
past the first checks to the store writes), from random bytes and from flipped encodings, all
sent as raw bytes, so decoding is fuzzed too. Properties: every call ends with OK or a
client-error code (never INTERNAL, UNKNOWN or a hang); the server's health check says SERVING
after every call; every stored job spec passes `validate_submit` and every token and tenant
record has a name its RPC would accept. The services run in-process on loopback against the
session's etcd, on a loop of their own in a thread (hypothesis drives synchronous tests);
plaintext servers treat every caller as the local admin, so every handler is reached, and the
TLS scheduler is fuzzed with an admin token and random authorization headers.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import pytest
from google.protobuf import descriptor as d
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.agent.config import AgentConfig
from pollux.agent.main import AgentApp
from pollux.launcher.config import LauncherConfig
from pollux.launcher.gpus import detect
from pollux.launcher.main import LauncherApp
from pollux.scheduler.admin import TENANT_NAME, USER_NAME
from pollux.scheduler.config import SchedulerConfig, SchedulingConfig
from pollux.scheduler.main import SchedulerApp
from pollux.scheduler.validation import normalised, validate_submit
from pollux.service import pki
from pollux.service.bootstrap import create_token
from pollux.service.config import EtcdConfig, ServerConfig
from pollux.service.keys import Kind
from pollux.service.store import Delete, Store, cancel_and_wait
from pollux.service.tls import TlsFiles
from pollux.v1 import admin_service_pb2 as apb
from pollux.v1 import agent_service_pb2 as agpb
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb
from tests.etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")

SCALE = float(os.environ.get("POLLUX_FUZZ_SCALE", "0") or 0)
"""POLLUX_FUZZ_SCALE=10 fuzzes ten times longer with fresh randomness; unset, CI's runs are
derandomized (the same examples every run) and short."""
CALL_DEADLINE_S = 10.0
"""Far above any honest answer on loopback: reaching it means the server hung."""
CLIENT_ERRORS = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
"""What a server may answer to anything a client sends."""
KNOWN = ("j-fuzz", "j-done", "fuzz", "admin", "alice", "vision", "n1", "s-1")
"""Ids that exist (or are plausible), so fuzzing reaches past the not-found checks."""
TRICKY = (
    "",
    "\x00",
    "j-fuzz\x00",
    "j-fuzz\n",
    "é",
    "🙂" * 20,
    "\u202ereversed",
    "../../etc/passwd",
    "a/b/../../c",
    "%s%n%x",
    "POLLUX_JOB_ID",
    " ",
    "\t\r\n",
    "pollux_0123456789ab_secret",
    "pjc.j-fuzz.00",
)
HUGE = (70_000, 1_200_000, 4_300_000)
"""Above the spec limit, above etcd's request limit, above gRPC's 4 MiB message limit."""

SERVICES = {
    "scheduler": spb.DESCRIPTOR.services_by_name["SchedulerService"],
    "admin": apb.DESCRIPTOR.services_by_name["AdminService"],
    "agent": agpb.DESCRIPTOR.services_by_name["AgentService"],
    "launcher": lpb.DESCRIPTOR.services_by_name["LauncherService"],
}

# -- strategies from descriptors ---------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=40)
STRINGS = st.one_of(
    st.sampled_from(KNOWN),
    st.sampled_from(TRICKY),
    _text,
    st.integers(0, 11).flatmap(
        lambda i: st.sampled_from(HUGE).map(lambda n: "x" * n) if i == 0 else _text
    ),
)


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({low, -1 if low < 0 else 0, 0, 1, 2, high - 1, high})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


I32, I64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)
U32, U64 = (0, 2**32 - 1), (0, 2**64 - 1)
FD = d.FieldDescriptor
SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FD.TYPE_STRING: STRINGS,
    FD.TYPE_BYTES: st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"\x00" * 33])),
    FD.TYPE_BOOL: st.booleans(),
    FD.TYPE_DOUBLE: st.floats(),
    FD.TYPE_FLOAT: st.floats(width=32),
    **{t: _ints(*I32) for t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32)},
    **{t: _ints(*I64) for t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64)},
    **{t: _ints(*U32) for t in (FD.TYPE_UINT32, FD.TYPE_FIXED32)},
    **{t: _ints(*U64) for t in (FD.TYPE_UINT64, FD.TYPE_FIXED64)},
}
MAX_DEPTH = 3


def _single(field: d.FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    """Values of one (non-repeated) field."""
    if field.type == FD.TYPE_MESSAGE:
        assert field.message_type is not None
        return messages(field.message_type, depth + 1)
    if field.type == FD.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), _ints(*I32))  # proto3 enums are open
    return SCALARS[field.type]


def _field(field: d.FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    """Values of a field: lists for repeated fields, dicts for maps."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return st.dictionaries(_single(key, depth), _single(value, depth), max_size=4)
    if field.is_repeated:
        return st.lists(_single(field, depth), max_size=4)
    return _single(field, depth)


def _set(message: Message, field: d.FieldDescriptor, value: Any) -> None:
    """Give a field of `message` a value `_field` made (replacing what it held)."""
    message.ClearField(field.name)
    target = getattr(message, field.name)
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        for k, v in value.items():
            if entry.fields_by_name["value"].type == FD.TYPE_MESSAGE:
                target[k].CopyFrom(v)
            else:
                target[k] = v
    elif field.is_repeated:
        if field.type == FD.TYPE_MESSAGE:
            for item in value:
                target.add().CopyFrom(item)
        else:
            target.extend(value)
    elif field.type == FD.TYPE_MESSAGE:
        target.CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _build(descriptor: d.Descriptor, values: dict[str, Any]) -> Message:
    message: Message = GetMessageClass(descriptor)()
    for name, value in values.items():
        _set(message, descriptor.fields_by_name[name], value)
    return message


_messages: dict[tuple[str, int], st.SearchStrategy[Message]] = {}


def messages(descriptor: d.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of a type with any subset of their fields set to fuzzed values."""
    key = (descriptor.full_name, depth)
    if key not in _messages:
        if depth >= MAX_DEPTH:
            _messages[key] = st.just(GetMessageClass(descriptor)())
        else:
            fields = {f.name: _field(f, depth) for f in descriptor.fields}
            _messages[key] = st.fixed_dictionaries({}, optional=fields).map(
                partial(_build, descriptor)
            )
    return _messages[key]


def _is_map(field: d.FieldDescriptor) -> bool:
    entry = field.message_type
    return entry is not None and bool(entry.GetOptions().map_entry)


def _with(seed: Message, field: d.FieldDescriptor, value: Any) -> Message:
    out = type(seed)()
    out.CopyFrom(seed)
    if field.type == FD.TYPE_MESSAGE and not field.is_repeated and not _is_map(field):
        getattr(out, field.name).CopyFrom(value)
    else:
        _set(out, field, value)
    return out


def mutated(seed: Message) -> st.SearchStrategy[Message]:
    """`seed` with one field, at any depth, replaced by a fuzzed value.

    A valid request changed in one place gets past the checks a wholly random one fails first,
    so the handlers' later steps (the store writes) are fuzzed too.
    """
    options: list[st.SearchStrategy[Message]] = [st.just(seed)]
    for field in cast(list[d.FieldDescriptor], list(seed.DESCRIPTOR.fields)):
        options.append(_field(field, 1).map(partial(_with, seed, field)))
        nested = field.type == FD.TYPE_MESSAGE and not field.is_repeated and not _is_map(field)
        if nested and seed.HasField(field.name):
            inner = mutated(getattr(seed, field.name))
            options.append(inner.map(partial(_with, seed, field)))
    return st.one_of(options)


def _seed_spec() -> pb.JobSpec:
    return pb.JobSpec(
        name="seed",
        command=["python", "-c", "print('hi')"],
        env={"A": "1"},
        secret_env={"TOKEN": "hunter2"},
        labels={"team": "fuzz"},
        working_dir="/tmp",
        batch=pb.BatchLimits(initial_batch_size=8, max_batch_size=64),
        max_replicas=4,
        stop_grace_s=5,
    )


_OBSERVATION = pb.StepObservation(
    num_nodes=1,
    num_replicas=1,
    local_batch_size=8,
    accum_steps=1,
    accum_step_time_s=0.1,
    optim_step_time_s=0.12,
    count=3,
)
SEEDS: dict[str, Message] = {
    "SubmitJob": spb.SubmitJobRequest(spec=_seed_spec(), request_id="r-seed"),
    "GetJob": spb.GetJobRequest(job_id="j-fuzz"),
    "ListJobs": spb.ListJobsRequest(
        states=[pb.JOB_STATE_PENDING], name_prefix="f", labels={"team": "fuzz"}, page_size=2
    ),
    "CancelJob": spb.CancelJobRequest(job_id="j-fuzz", reason="fuzz"),
    "DeleteJob": spb.DeleteJobRequest(job_id="j-done"),
    "WatchJobs": spb.WatchJobsRequest(job_id="j-fuzz"),
    "Explain": spb.ExplainRequest(job_id="j-fuzz"),
    "EstimateJob": spb.EstimateJobRequest(spec=_seed_spec()),
    "ClusterStatus": spb.ClusterStatusRequest(),
    "StreamLogs": lpb.StreamLogsRequest(
        job_id="j-fuzz", rank=0, follow=True, tail_lines=10, min_generation=1
    ),
    "GetJobTimeline": spb.GetJobTimelineRequest(job_id="j-fuzz"),
    "WhoAmI": apb.WhoAmIRequest(),
    "CreateToken": apb.CreateTokenRequest(user="alice", role="user", ttl_s=3600),
    "RevokeToken": apb.RevokeTokenRequest(token_id="0123456789ab"),
    "ListTokens": apb.ListTokensRequest(user="alice"),
    "PutTenant": apb.PutTenantRequest(
        tenant=pb.Tenant(name="vision", guarantee_gpus=2, weight=1.5, cap_gpus=8)
    ),
    "DeleteTenant": apb.DeleteTenantRequest(name="vision"),
    "ListTenants": apb.ListTenantsRequest(),
    "GetUsage": apb.GetUsageRequest(
        tenant="vision", user="alice", since=Timestamp(seconds=1_700_000_000)
    ),
    "ListAudit": apb.ListAuditRequest(limit=10),
    "ReportMetrics": agpb.ReportMetricsRequest(
        job_id="j-fuzz",
        generation=1,
        rank=0,
        seq=1,
        observations=[_OBSERVATION],
        gradient=pb.GradientStats(sqr=1.0, var=20.0),
    ),
    "GetBatchConfig": agpb.GetBatchConfigRequest(job_id="j-fuzz", num_nodes=1, num_replicas=2),
    "GetModel": agpb.GetModelRequest(job_id="j-fuzz"),
    "ListReplicas": lpb.ListReplicasRequest(job_id="j-fuzz"),
}
"""A valid request of every method (StreamLogs: of the scheduler's and the launcher's)."""


def _flipped(data: bytes, positions: list[int], values: list[int]) -> bytes:
    out = bytearray(data)
    for at, value in zip(positions, values, strict=False):
        if out:
            out[at % len(out)] = value
    return bytes(out)


@dataclass(frozen=True)
class Call:
    """One fuzzed request: the method, its bytes, and how they were made (for the report)."""

    service: str
    method: d.MethodDescriptor
    data: bytes
    how: str

    @property
    def path(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    def __repr__(self) -> str:
        shown = self.data[:120]
        return f"Call({self.path}, {self.how}, {len(self.data)} bytes: {shown!r})"


def _fresh_request(pair: tuple[Message, Any]) -> Message:
    request, fresh = pair
    if getattr(request, "request_id", None) == "r-seed":
        request.request_id = str(fresh)  # type: ignore[attr-defined]
    return request


def calls(service: str, name: str) -> st.SearchStrategy[Call]:
    """Requests to one method: fuzzed fields, a valid request mutated, random or flipped bytes."""
    method = SERVICES[service].methods_by_name[name]

    def call(how: str) -> Callable[[Message], Call]:
        return lambda m: Call(service, method, m.SerializeToString(), how)

    fields = messages(method.input_type)
    seeded = mutated(SEEDS[name])
    if name == "SubmitJob":  # a fresh request id, unless it is what changed
        seeded = st.tuples(seeded, st.uuids()).map(_fresh_request)
    flips = st.tuples(
        fields.map(lambda m: m.SerializeToString()),
        st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4),
        st.lists(st.integers(0, 255), min_size=1, max_size=4),
    )
    return st.one_of(
        fields.map(call("fields")),
        seeded.map(call("mutated")),
        seeded.map(call("mutated")),  # twice the weight: it reaches the handlers' depths
        st.binary(max_size=256).map(lambda b: Call(service, method, b, "random bytes")),
        flips.map(lambda t: Call(service, method, _flipped(*t), "flipped bytes")),
    )


# -- the servers -------------------------------------------------------------------------------


class Loop:
    """An event loop in a background thread, for in-process servers under a sync test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-servers")
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what is left on the loop (gRPC's own call tasks), stop it and its thread."""

        async def cancel_the_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:  # re-cancels where aetcd's wait_for swallowed a cancel
                await cancel_and_wait(task)

        self.run(cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@dataclass
class Served:
    """A running in-process service and what a client needs to reach it."""

    address: str
    store: Store
    loop: Loop
    credentials: grpc.ChannelCredentials | None = None
    admin_token: str | None = None


def spec(name: str = "fuzz") -> pb.JobSpec:
    return normalised(
        pb.JobSpec(
            name=name, command=["python", "-c", "pass"], batch=pb.BatchLimits(initial_batch_size=8)
        )
    )


async def _seed(store: Store) -> None:
    """A pending and a finished job, so fuzzed ids sometimes name real ones."""
    await store.create_job(pb.Job(id="j-fuzz", request_id="r-fuzz", spec=spec(), owner="alice"))
    done = pb.Job(id="j-done", request_id="r-done", spec=spec("done"), state=pb.JOB_STATE_SUCCEEDED)
    await store.create_job(done)


@pytest.fixture
def loop() -> Iterator[Loop]:
    background = Loop()
    try:
        yield background
    finally:
        background.close()


def _etcd_config(etcd: EtcdServer, root: str) -> EtcdConfig:
    return EtcdConfig(endpoint=etcd.endpoint, root=root)


def _scheduler_config(etcd: EtcdServer, root: str) -> SchedulerConfig:
    return SchedulerConfig(
        id="s-1",
        lease_ttl_s=2,
        etcd=_etcd_config(etcd, root),
        server=ServerConfig(grace_s=0),
        scheduling=SchedulingConfig(interval_s=0.5, debounce_s=0.05),
    )


async def _stop(app: Any, store: Store, root: str) -> None:
    try:
        await app.stop()
    finally:
        await store.txn([Delete(root.encode() + b"/", prefix=True)])
        await store.close()


@pytest.fixture
def scheduler(loop: Loop, etcd: EtcdServer, root: str) -> Iterator[Served]:
    """A plaintext scheduler replica (every caller is the local admin), with two jobs."""

    async def start() -> tuple[SchedulerApp, Store]:
        store = await Store.connect(etcd.endpoint, root)
        await _seed(store)
        app = SchedulerApp(store=store, config=_scheduler_config(etcd, root))
        await app.start()
        return app, store

    app, store = loop.run(start())
    try:
        yield Served(app.address, store, loop)
    finally:
        loop.run(_stop(app, store, root))


@pytest.fixture
def secure_scheduler(loop: Loop, etcd: EtcdServer, root: str, tmp_path: Path) -> Iterator[Served]:
    """A TLS scheduler replica, a CA its clients trust, and an admin token."""
    ca = pki.create_ca(tmp_path)
    identity = pki.issue(ca, tmp_path, "scheduler", "service", hosts=("127.0.0.1",))

    async def start() -> tuple[SchedulerApp, Store, str]:
        store = await Store.connect(etcd.endpoint, root)
        await _seed(store)
        store.tls = TlsFiles(ca.cert, identity.cert, identity.key)  # the replica's identity
        app = SchedulerApp(store=store, config=_scheduler_config(etcd, root))
        await app.start()
        return app, store, await create_token(store, "root")

    app, store, token = loop.run(start())
    try:
        credentials = grpc.ssl_channel_credentials(ca.cert.read_bytes())
        yield Served(app.address, store, loop, credentials, token)
    finally:
        loop.run(_stop(app, store, root))


@pytest.fixture
def agent(loop: Loop, etcd: EtcdServer, root: str) -> Iterator[Served]:
    """A plaintext agent, with a running job to report on."""

    async def start() -> tuple[AgentApp, Store]:
        store = await Store.connect(etcd.endpoint, root)
        job = pb.Job(id="j-fuzz", request_id="r-fuzz", spec=spec(), state=pb.JOB_STATE_RUNNING)
        await store.create_job(job)
        config = AgentConfig(
            etcd=_etcd_config(etcd, root), server=ServerConfig(grace_s=0), agent_id="a-1"
        )
        app = AgentApp(config, store)
        await app.start()
        return app, store

    app, store = loop.run(start())
    try:
        yield Served(app.address, store, loop)
    finally:
        loop.run(_stop(app, store, root))


@pytest.fixture
def launcher(loop: Loop, etcd: EtcdServer, root: str, tmp_path: Path) -> Iterator[Served]:
    """A plaintext launcher of node n1 (nothing allocated: no replica ever starts)."""

    async def start() -> tuple[LauncherApp, Store]:
        store = await Store.connect(etcd.endpoint, root)
        config = LauncherConfig(
            etcd=_etcd_config(etcd, root),
            server=ServerConfig(listen="127.0.0.1:0", grace_s=0),
            node_name="n1",
            gpus=2,
            checkpoint_root=tmp_path / "checkpoints",
            log_root=tmp_path / "logs",
            scratch_root=tmp_path / "scratch",
        )
        app = LauncherApp(config, detect(2), store)
        await app.start()
        return app, store

    app, store = loop.run(start())
    try:
        yield Served(app.address, store, loop)
    finally:
        loop.run(_stop(app, store, root))


# -- the properties ----------------------------------------------------------------------------


def _answer(
    channel: grpc.Channel, call: Call, metadata: tuple[tuple[str, str], ...]
) -> tuple[grpc.StatusCode, str]:
    """The status the server ends a call with (a stream: OK once its first message came)."""
    try:
        if call.method.server_streaming:
            stream = channel.unary_stream(call.path)(
                call.data, timeout=CALL_DEADLINE_S, metadata=metadata
            )
            for _ in stream:
                stream.cancel()  # WatchJobs and followed logs never end by themselves
                return grpc.StatusCode.OK, "streamed"
            return stream.code(), str(stream.details() or "")
        channel.unary_unary(call.path)(call.data, timeout=CALL_DEADLINE_S, metadata=metadata)
    except grpc.RpcError as error:
        return error.code(), str(error.details() or "")
    return grpc.StatusCode.OK, "answered"


def _serving(channel: grpc.Channel, service: str) -> bool:
    check = health_pb2_grpc.HealthStub(channel).Check
    reply = check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_DEADLINE_S)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


Metadata = tuple[tuple[str, str], ...]
Who = st.SearchStrategy[Metadata]
ANYONE: Who = st.just(())
"""No authorization header (plaintext servers take every caller as the local admin)."""


def fuzz(
    served: Served, services: tuple[str, ...], per_method: int, who: Who = ANYONE
) -> Counter[tuple[str, str]]:
    """Fuzz each method of `services` with `per_method` requests; the codes answered, by method.

    Each must get a client-level status and leave the server serving. Methods are fuzzed one at
    a time, so each gets its share whatever hypothesis would favour.
    """
    if served.credentials is None:
        channel = grpc.insecure_channel(served.address)
    else:
        channel = grpc.secure_channel(served.address, served.credentials)
    seen: Counter[tuple[str, str]] = Counter()

    def one(request: tuple[Call, Metadata]) -> None:
        call, metadata = request
        code, details = _answer(channel, call, metadata)
        seen[call.method.name, code.name] += 1
        assert code in CLIENT_ERRORS, f"{call!r} -> {code.name}: {details}"
        service = call.method.containing_service.full_name
        assert _serving(channel, service), f"{service} stopped serving after {call!r}"

    with channel:
        for service in services:
            for method in SERVICES[service].methods:
                run = settings(
                    max_examples=max(1, int(per_method * (SCALE or 1))),
                    deadline=None,
                    derandomize=not SCALE,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )(given(st.tuples(calls(service, method.name), who))(one))
                run()
    return seen


def _ok(seen: Counter[tuple[str, str]], method: str) -> int:
    return seen[method, "OK"]


async def stored_problems(store: Store) -> list[str]:
    """Every stored record that the RPC that writes it would have refused."""
    problems = []
    jobs, _ = await store.list_jobs()
    for entry in jobs:
        job = entry.value
        try:
            validate_submit(job.spec, job.request_id, True)
        except Exception as error:  # InvalidArgument: what a submit would have been told
            problems.append(f"job {job.id}: {error}")
    tokens, _ = await store.scan(store.keys.prefix(Kind.TOKENS), pb.ApiToken)
    for token in tokens:
        if USER_NAME.fullmatch(token.value.user) is None or token.value.role not in (
            "user",
            "admin",
        ):
            problems.append(f"token {token.value.id}: user {token.value.user!r}")
    tenants, _ = await store.scan(store.keys.prefix(Kind.TENANTS), pb.Tenant)
    for tenant in tenants:
        if TENANT_NAME.fullmatch(tenant.value.name) is None:
            problems.append(f"tenant {tenant.value.name!r}")
    return problems


def test_scheduler_and_admin_services_answer_every_fuzzed_request(scheduler: Served) -> None:
    seen = fuzz(scheduler, ("scheduler", "admin"), per_method=120)
    for method in ("SubmitJob", "CancelJob", "CreateToken", "PutTenant"):
        assert _ok(seen, method), f"no fuzzed {method} got through: {sorted(seen.items())}"
    assert scheduler.loop.run(stored_problems(scheduler.store)) == []


def test_tls_scheduler_answers_fuzzed_requests_of_an_admin_and_of_strangers(
    secure_scheduler: Served,
) -> None:
    admin: Metadata = (("authorization", f"Bearer {secure_scheduler.admin_token}"),)
    printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)
    who = st.one_of(
        st.just(admin),
        st.just(admin),
        st.just(()),
        printable.map(lambda text: (("authorization", text),)),
        printable.map(lambda text: (("authorization", f"Bearer {text}"),)),
        st.sampled_from(TRICKY[-2:]).map(lambda text: (("authorization", f"Bearer {text}"),)),
    )
    seen = fuzz(secure_scheduler, ("scheduler", "admin"), per_method=50, who=who)
    assert _ok(seen, "SubmitJob")
    assert _ok(seen, "PutTenant")
    assert sum(n for (_, code), n in seen.items() if code == "UNAUTHENTICATED") > 0
    assert secure_scheduler.loop.run(stored_problems(secure_scheduler.store)) == []


def test_agent_service_answers_every_fuzzed_request(agent: Served) -> None:
    seen = fuzz(agent, ("agent",), per_method=250)
    assert _ok(seen, "ReportMetrics")
    assert _ok(seen, "GetBatchConfig")
    assert agent.loop.run(stored_problems(agent.store)) == []


def test_launcher_service_answers_every_fuzzed_request(launcher: Served) -> None:
    seen = fuzz(launcher, ("launcher",), per_method=150)
    assert _ok(seen, "ListReplicas")


def test_get_usage_since_a_time_no_calendar_has_is_invalid_argument(scheduler: Served) -> None:
    """What fuzzing found first: a `since` outside years 1-9999 was an INTERNAL error."""
    method = SERVICES["admin"].methods_by_name["GetUsage"]
    with grpc.insecure_channel(scheduler.address) as channel:
        for seconds in (-(2**63), 2**63 - 1, 253_402_300_800):
            request = apb.GetUsageRequest(since=Timestamp(seconds=seconds))
            call = Call("admin", method, request.SerializeToString(), "regression")
            code, details = _answer(channel, call, ())
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert "since" in details
