"""The client against real gRPC servers: status codes become typed errors, failover works.

Each fake is a subclass of the generated servicer running on a real `grpc.aio` server on
127.0.0.1:0, in a background event loop (the client under test is synchronous), and fails the
way the real services do: through `pollux.service.errors.abort`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from pollux.client import cli, errors
from pollux.client._convert import cluster_to_proto, job_to_proto
from pollux.client.client import Client
from pollux.client.types import Allocation, ClusterStatus, Job, JobSpec
from pollux.service.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    abort,
)
from pollux.service.store import Conflict, FenceLost, StoreUnavailable
from pollux.v1 import launcher_service_pb2 as lpb
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import scheduler_service_pb2_grpc
from pollux.v1 import types_pb2 as pb

pytestmark = pytest.mark.timeout(30)

VIOLATIONS = [
    ("spec.name", "'Bad_Name' must be 1-63 characters of [a-z0-9-] starting with a letter"),
    ("spec.batch.initial_batch_size", "must be >= 1 (the batch your LR is tuned for)"),
]

# job_id -> the error GetJob fails with.
FAILURES: dict[str, Exception] = {
    "invalid": InvalidArgument(VIOLATIONS),
    "missing": NotFound("job missing not found"),
    "exists": AlreadyExists("request_id r1 was used for another spec"),
    "precondition": FailedPrecondition("job is RUNNING: cancel it first"),
    "unavailable": Unavailable("no leader"),
    "fence": FenceLost(),
    "etcd": StoreUnavailable("etcd unreachable"),
    "conflict": Conflict(b"/pollux/v1/jobs/j-1"),
    "boom": RuntimeError("bug"),
}


def a_job(job_id: str = "j-1", nodes: tuple[str, ...] = ()) -> Job:
    return Job(
        id=job_id,
        spec=JobSpec("train", ("python", "train.py"), 128),
        request_id="r1",
        state="RUNNING" if nodes else "PENDING",
        history=(),
        create_time=None,
        finish_time=None,
        cancel_requested=False,
        restarts=0,
        failures=0,
        allocation=Allocation(nodes, 1, None, 3) if nodes else None,
    )


class Scheduler(scheduler_service_pb2_grpc.SchedulerServiceServicer):
    """A scheduler that fails as `FAILURES` says, or always with `always` when set."""

    def __init__(self, name: str, always: Exception | None = None) -> None:
        self.name = name
        self.always = always
        self.calls: list[tuple[str, Any]] = []
        self.job = a_job()
        self.cluster = ClusterStatus((), (), "", "", 0, 0, {}, 0, name)
        self.log_requests: list[Any] = []

    async def StreamLogs(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Like a scheduler relaying a launcher that ran rank 1 of every job."""
        self.log_requests.append(request)
        if request.rank != 1:
            await abort(context, NotFound(f"no replica of rank {request.rank} of {request.job_id}"))
        yield lpb.StreamLogsResponse(lines=["epoch 1", "epoch 2"], generation=2)
        yield lpb.StreamLogsResponse(lines=["done"], generation=2)

    async def _fail(self, context: Any) -> None:
        if self.always is not None:
            await abort(context, self.always)

    async def GetJob(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("GetJob", request))
        await self._fail(context)
        if request.job_id == "slow":
            await asyncio.sleep(5)
        if request.job_id in FAILURES:
            await abort(context, FAILURES[request.job_id])
        return spb.GetJobResponse(job=job_to_proto(self.job))

    async def SubmitJob(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("SubmitJob", request))
        await self._fail(context)
        job = job_to_proto(self.job)
        job.spec.CopyFrom(request.spec)
        job.request_id = request.request_id
        return spb.SubmitJobResponse(job=job, created=True)

    async def ListJobs(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("ListJobs", request))
        await self._fail(context)
        page = int(request.page_token or "0")
        jobs = [job_to_proto(a_job(f"j-{page}-{i}")) for i in range(2)]
        token = str(page + 1) if page < 2 else ""
        return spb.ListJobsResponse(jobs=jobs, next_page_token=token)

    async def ClusterStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("ClusterStatus", request))
        await self._fail(context)
        return cluster_to_proto(self.cluster)

    async def WatchJobs(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("WatchJobs", request))
        await self._fail(context)
        for i in range(2):
            yield spb.WatchJobsResponse(job=job_to_proto(a_job(f"j-{i}")), deleted=i == 1)
        if request.job_id == "then-fail":
            await abort(context, Unavailable("lost leadership mid-stream"))


class Servers:
    """Real aio servers on 127.0.0.1:0 in one background event loop, stopped at teardown."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[grpc.aio.Server] = []

    def start(self, register: Callable[[grpc.aio.Server], None]) -> str:
        async def go() -> str:
            server = grpc.aio.server()
            register(server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            self.servers.append(server)
            return f"127.0.0.1:{port}"

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(10)

    def scheduler(self, servicer: Scheduler) -> str:
        return self.start(
            lambda s: scheduler_service_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, s)
        )

    def close(self) -> None:
        async def stop() -> None:
            await asyncio.gather(*(s.stop(None) for s in self.servers))

        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def scheduler(servers: Servers) -> tuple[Scheduler, str]:
    servicer = Scheduler("a")
    return servicer, servers.scheduler(servicer)


def free_port_address() -> str:
    """An address where nothing listens (a port bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


# ---- status code -> exception ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_id", "want_type", "want_code", "want_in_message"),
    [
        ("invalid", errors.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT, "spec.name"),
        ("missing", errors.NotFoundError, grpc.StatusCode.NOT_FOUND, "job missing not found"),
        ("exists", errors.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS, "another spec"),
        (
            "precondition",
            errors.FailedPreconditionError,
            grpc.StatusCode.FAILED_PRECONDITION,
            "cancel",
        ),
        ("conflict", errors.AbortedError, grpc.StatusCode.ABORTED, "jobs/j-1"),
        ("boom", errors.InternalError, grpc.StatusCode.INTERNAL, "RuntimeError: bug"),
    ],
    ids=[
        "a bad request is InvalidArgumentError",
        "a missing job is NotFoundError",
        "a reused request id is AlreadyExistsError",
        "a wrong state is FailedPreconditionError",
        "a lost write race is AbortedError",
        "a server bug is InternalError",
    ],
)
def test_status_code_maps_to_typed_error(scheduler, job_id, want_type, want_code, want_in_message):
    _, address = scheduler
    with Client(address, timeout_s=5) as client, pytest.raises(want_type) as caught:
        client.get_job(job_id)
    assert type(caught.value) is want_type
    assert caught.value.code == want_code
    assert want_in_message in caught.value.message
    assert isinstance(caught.value, errors.PolluxError)


def test_invalid_argument_carries_every_field_violation(scheduler):
    _, address = scheduler
    with Client(address) as client, pytest.raises(errors.InvalidArgumentError) as caught:
        client.get_job("invalid")
    assert [tuple(v) for v in caught.value.violations] == VIOLATIONS
    assert caught.value.violations[0].field == "spec.name"
    assert any(isinstance(d, error_details_pb2.BadRequest) for d in caught.value.details)


@pytest.mark.parametrize(
    ("job_id", "want_in_message"),
    [("unavailable", "no leader"), ("fence", "lost leadership"), ("etcd", "etcd unreachable")],
    ids=["no leader", "a deposed leader", "etcd unreachable"],
)
def test_unavailable_everywhere_is_unavailable_error(scheduler, job_id, want_in_message):
    servicer, address = scheduler
    with Client(address, timeout_s=5) as client, pytest.raises(errors.UnavailableError) as caught:
        client.get_job(job_id)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert want_in_message in caught.value.message
    assert caught.value.leader_address is None
    # The service config retried it (3 attempts) before the client gave up on the target.
    assert len(servicer.calls) == 3


def test_deadline_is_deadline_exceeded_error(scheduler):
    _, address = scheduler
    with Client(address, timeout_s=0.3) as client, pytest.raises(errors.DeadlineExceededError):
        client.get_job("slow")


def test_unreachable_server_is_unavailable_error_naming_it():
    address = free_port_address()
    with Client(address, timeout_s=2) as client, pytest.raises(errors.UnavailableError) as caught:
        client.cluster_status()
    assert address in caught.value.message


# ---- failover --------------------------------------------------------------------------------


def test_fails_over_to_the_second_target_and_stays_there(servers):
    down = Scheduler("down", always=FenceLost())
    up = Scheduler("up")
    targets = [servers.scheduler(down), servers.scheduler(up)]
    with Client(targets, timeout_s=5) as client:
        assert client.cluster_status().answered_by == "up"
        calls_to_down = len(down.calls)
        assert calls_to_down >= 1
        assert client.cluster_status().answered_by == "up"
    assert len(down.calls) == calls_to_down  # sticky: the second call went straight to "up"


def test_fails_over_past_an_unreachable_target(servers):
    up = Scheduler("up")
    with Client(f"{free_port_address()},{servers.scheduler(up)}", timeout_s=5) as client:
        assert client.cluster_status().answered_by == "up"


def test_does_not_fail_over_on_other_errors(servers):
    first, second = Scheduler("first"), Scheduler("second")
    targets = [servers.scheduler(first), servers.scheduler(second)]
    with Client(targets) as client, pytest.raises(errors.NotFoundError):
        client.get_job("missing")
    assert len(first.calls) == 1
    assert second.calls == []


def test_submit_retries_and_fails_over_with_one_request_id(servers):
    down = Scheduler("down", always=Unavailable("etcd unreachable"))
    up = Scheduler("up")
    spec = JobSpec("train", ("python", "train.py"), 64)
    with Client([servers.scheduler(down), servers.scheduler(up)]) as client:
        job = client.submit(spec)
    ids = {request.request_id for _, request in down.calls + up.calls}
    assert len(ids) == 1
    assert len(down.calls) == 3
    assert job.request_id == ids.pop()
    uuid.UUID(job.request_id)  # a fresh UUID when none is given
    assert job.spec == spec


def test_submit_keeps_a_given_request_id(scheduler):
    servicer, address = scheduler
    with Client(address) as client:
        client.submit(JobSpec("x", ("true",), 1), request_id="my-key")
    assert servicer.calls[0][1].request_id == "my-key"


def test_follows_the_leader_named_by_an_unavailable_error(servers):
    leader = Scheduler("leader")
    leader_address = servers.scheduler(leader)
    info = error_details_pb2.ErrorInfo(
        reason="NOT_LEADER", metadata={errors.LEADER_ADDRESS_KEY: leader_address}
    )
    packed = any_pb2.Any()
    packed.Pack(info)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message="not leader", details=[packed])

    class Follower(Scheduler):
        async def ClusterStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
            self.calls.append(("ClusterStatus", request))
            await context.abort_with_status(rpc_status.to_status(status))

    follower = Follower("follower")
    with Client(servers.scheduler(follower)) as client:
        assert client.cluster_status().answered_by == "leader"
    assert follower.calls


def test_unavailable_error_exposes_the_leader_hint(servers):
    nowhere = free_port_address()
    info = error_details_pb2.ErrorInfo(metadata={errors.LEADER_ADDRESS_KEY: nowhere})
    packed = any_pb2.Any()
    packed.Pack(info)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message="not leader", details=[packed])

    class Follower(Scheduler):
        async def GetJob(self, request: Any, context: Any) -> Any:  # noqa: N802
            await context.abort_with_status(rpc_status.to_status(status))

    # The hinted leader is unreachable too, so the error surfaces with the hint intact.
    with (
        Client(servers.scheduler(Follower("f")), timeout_s=2) as client,
        pytest.raises(errors.UnavailableError) as caught,
    ):
        client.get_job("j-1")
    assert caught.value.leader_address == nowhere
    assert nowhere in caught.value.message


# ---- paging and streams ----------------------------------------------------------------------


def test_list_jobs_walks_every_page(scheduler):
    servicer, address = scheduler
    with Client(address) as client:
        jobs = list(client.list_jobs(states=["running", "PENDING"], page_size=2))
    assert [j.id for j in jobs] == ["j-0-0", "j-0-1", "j-1-0", "j-1-1", "j-2-0", "j-2-1"]
    first = servicer.calls[0][1]
    assert list(first.states) == [pb.JOB_STATE_RUNNING, pb.JOB_STATE_PENDING]
    assert first.page_size == 2


def test_list_jobs_rejects_an_unknown_state_before_calling():
    with (
        Client(free_port_address()) as client,
        pytest.raises(errors.InvalidArgumentError) as caught,
    ):
        client.list_jobs(states=["sleeping"])
    assert caught.value.violations[0].field == "states"
    assert caught.value.code is None


def test_watch_fails_over_before_the_first_event(servers):
    down = Scheduler("down", always=Unavailable("no leader"))
    up = Scheduler("up")
    with Client([servers.scheduler(down), servers.scheduler(up)]) as client:
        events = list(client.watch())
    assert [(e.job.id, e.deleted) for e in events] == [("j-0", False), ("j-1", True)]
    assert down.calls


def test_watch_error_after_events_is_raised_not_replayed(servers):
    first, second = Scheduler("first"), Scheduler("second")
    with Client([servers.scheduler(first), servers.scheduler(second)]) as client:
        events = client.watch("then-fail")
        assert [next(events).job.id, next(events).job.id] == ["j-0", "j-1"]
        with pytest.raises(errors.UnavailableError, match="mid-stream"):
            next(events)
    assert second.calls == []


# ---- logs ------------------------------------------------------------------------------------


def test_logs_are_relayed_by_a_scheduler(scheduler):
    servicer, address = scheduler
    with Client(address) as client:
        lines = list(client.logs("j-1", rank=1, follow=True, tail_lines=5))
    assert lines == ["epoch 1", "epoch 2", "done"]
    request = servicer.log_requests[0]
    assert (request.job_id, request.rank, request.follow, request.tail_lines) == ("j-1", 1, True, 5)


def test_logs_errors_are_typed(scheduler):
    _, address = scheduler
    with Client(address) as client, pytest.raises(errors.NotFoundError, match="rank 0"):
        list(client.logs("j-1", rank=0))


# ---- the CLI over a real server --------------------------------------------------------------


def test_cli_prints_one_line_per_field_violation_and_exits_1(scheduler, capsys):
    _, address = scheduler
    assert cli.main(["--server", address, "describe", "invalid"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: invalid request",
        *(f"  {field}: {problem}" for field, problem in VIOLATIONS),
    ]


def test_cli_reports_an_unreachable_server_in_one_line(capsys):
    assert cli.main(["--server", free_port_address(), "--timeout", "2", "nodes"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no scheduler at 127.0.0.1:")
    assert err.count("\n") == 1


def test_cli_describe_shows_the_job(scheduler, capsys):
    _, address = scheduler
    assert cli.main(["--server", address, "-o", "json", "describe", "j-1"]) == 0
    assert '"id": "j-1"' in capsys.readouterr().out


# ---- the table and the knobs -----------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    """A failed call without a rich status, as a transport failure looks."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return ""

    def trailing_metadata(self) -> tuple[()]:
        return ()


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c != grpc.StatusCode.OK])
def test_every_status_code_maps_to_a_pollux_error(code):
    error = errors.from_rpc_error(FakeRpcError(code))
    assert isinstance(error, errors.PolluxError)
    assert type(error) is errors._BY_CODE.get(code, errors.PolluxError)
    assert error.code == code
    assert error.message == code.name.lower()  # never an empty message


def test_retry_attempts_one_means_no_grpc_retry(scheduler):
    servicer, address = scheduler
    with Client(address, retry_attempts=1) as client, pytest.raises(errors.UnavailableError):
        client.get_job("unavailable")
    assert len(servicer.calls) == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"targets": ""}, {"targets": []}, {"timeout_s": 0}, {"retry_attempts": 6}],
    ids=str,
)
def test_bad_client_settings_are_value_errors(kwargs):
    with pytest.raises(ValueError):  # noqa: PT011
        Client(**{"targets": "a:1", **kwargs})


def test_targets_are_split_and_deduplicated():
    with Client(" a:1, b:2,a:1 ,") as client:
        assert client.targets == ("a:1", "b:2")
