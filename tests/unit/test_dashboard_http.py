"""The dashboard's HTTP parsing, routing and JSON shaping, without sockets or etcd."""

from __future__ import annotations

import asyncio
from array import array
from typing import Any, cast

import pytest

from pollux.scheduler.config import SchedulerConfig
from pollux.scheduler.dashboard import protocol, routes, sampler, views
from pollux.scheduler.dashboard.protocol import HttpError, Response
from pollux.scheduler.dashboard.server import Dashboard, loopback_host
from pollux.scheduler.servicer import SchedulerServicer
from pollux.service.config import ConfigError
from pollux.service.errors import InvalidArgument
from pollux.v1 import scheduler_service_pb2 as spb
from pollux.v1 import types_pb2 as pb


def head(line: str, *headers: str) -> protocol.Request:
    return protocol.parse_head(line.encode(), [h.encode("latin-1") for h in headers])


def refused(line: str, *headers: str) -> HttpError:
    with pytest.raises(HttpError) as caught:
        head(line, *headers)
    return caught.value


async def read(data: bytes) -> protocol.Request | None:
    reader = asyncio.StreamReader(limit=protocol.MAX_HEADER_BYTES)
    reader.feed_data(data)
    reader.feed_eof()
    return await protocol.read_request(reader)


async def read_refused(data: bytes) -> HttpError:
    with pytest.raises(HttpError) as caught:
        await read(data)
    return caught.value


# -- request heads -----------------------------------------------------------------------------


def test_a_get_is_parsed_with_its_path_query_and_headers() -> None:
    request = head(
        "GET /api/v1/jobs?state=RUNNING&name_prefix=res%20net HTTP/1.1",
        "Host: 127.0.0.1:8080",
        "Authorization: Bearer pollux_abc",
        "X-Twice: a",
        "x-twice: b",
    )
    assert request.method == "GET"
    assert request.path == "/api/v1/jobs"
    assert request.query == {"state": "RUNNING", "name_prefix": "res net"}
    assert request.headers["authorization"] == "Bearer pollux_abc"
    assert request.headers["x-twice"] == "a, b"
    assert head("HEAD / HTTP/1.0").headers == {}, "HTTP/1.0 needs no Host"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get", "BREW"])
def test_only_get_and_head_are_answered(method: str) -> None:
    assert refused(f"{method} / HTTP/1.1", "Host: x").status == 405


@pytest.mark.parametrize(
    ("line", "status"),
    [
        ("GET / HTTP/2.0", 505),
        ("GET / HTTP/0.9", 505),
        ("GET / SPDY/3", 400),
        ("GET /", 400),
        ("GET  / HTTP/1.1", 400),
        ("GET / HTTP/1.1 extra", 400),
        ("G(T / HTTP/1.1", 400),
        ("GET http://evil.example/ HTTP/1.1", 400),
        ("GET * HTTP/1.1", 400),
        ("GET /a#frag HTTP/1.1", 400),
        ("GET /%ff HTTP/1.1", 400),
        ("GET /a%00b HTTP/1.1", 400),
        ("GET /a%0ab HTTP/1.1", 400),
        ("GET /a%5cb HTTP/1.1", 400),
        ("GET /?a=1&a=2 HTTP/1.1", 400),
        ("GET /?a=%ff HTTP/1.1", 400),
        ("GET /?a=%01 HTTP/1.1", 400),
        ("GET /?" + "&".join(f"k{i}=v" for i in range(40)) + " HTTP/1.1", 400),
    ],
)
def test_malformed_request_lines_are_refused(line: str, status: int) -> None:
    assert refused(line, "Host: x").status == status


def test_non_ascii_request_lines_are_refused() -> None:
    with pytest.raises(HttpError) as caught:
        protocol.parse_head("GET /é HTTP/1.1".encode(), [b"Host: x"])
    assert caught.value.status == 400


@pytest.mark.parametrize(
    "header", ["Host x", "Host : x", " folded", "\tfolded", ": empty", "Bad Name: v"]
)
def test_malformed_headers_are_refused(header: str) -> None:
    assert refused("GET / HTTP/1.1", "Host: x", header).status == 400


def test_an_http_1_1_request_without_host_is_refused() -> None:
    assert refused("GET / HTTP/1.1").status == 400


async def test_read_request_gathers_lines_and_skips_one_leading_blank_line() -> None:
    request = await read(b"\r\nGET /jobs?x=1 HTTP/1.1\r\nHost: a\nAccept: */*\r\n\r\nignored")
    assert request is not None
    assert (request.path, request.query, request.headers["accept"]) == ("/jobs", {"x": "1"}, "*/*")
    assert await read(b"") is None, "closed before a request"
    assert (await read_refused(b"\r\n\r\n\r\n")).status == 400
    assert (await read_refused(b"GET / HTTP/1.1\r\nHost: a\r\n")).status == 400, "cut short"


async def test_read_request_bounds_every_part() -> None:
    line = b"GET /" + b"a" * protocol.MAX_REQUEST_LINE + b" HTTP/1.1\r\n"
    assert (await read_refused(line + b"Host: a\r\n\r\n")).status == 414
    huge = b"GET /" + b"a" * (protocol.MAX_HEADER_BYTES + 10)
    assert (await read_refused(huge)).status == 414
    many = b"".join(b"X-%d: v\r\n" % i for i in range(protocol.MAX_HEADERS + 1))
    assert (await read_refused(b"GET / HTTP/1.1\r\nHost: a\r\n" + many + b"\r\n")).status == 431
    fat = b"X-Big: " + b"v" * 9000 + b"\r\n"
    assert (await read_refused(b"GET / HTTP/1.1\r\nHost: a\r\n" + fat * 2 + b"\r\n")).status == 431
    endless = b"X-Big: " + b"v" * (protocol.MAX_HEADER_BYTES + 10)
    assert (await read_refused(b"GET / HTTP/1.1\r\n" + endless)).status == 431


def test_responses_are_encoded_with_length_and_close() -> None:
    response = Response(200, b"{}", "application/json", {"Cache-Control": "no-store"})
    data = protocol.encode(response, head=False, extra={"X-Content-Type-Options": "nosniff"})
    head_part, _, body = data.partition(b"\r\n\r\n")
    lines = head_part.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK"
    assert "Content-Length: 2" in lines
    assert "Connection: close" in lines
    assert "X-Content-Type-Options: nosniff" in lines
    assert body == b"{}"
    assert protocol.encode(response, head=True).endswith(b"\r\n\r\n"), "HEAD: no body"
    assert b"Content-Length: 2" in protocol.encode(response, head=True)
    with pytest.raises(ValueError, match="line break"):
        protocol.encode(Response(200, headers={"X": "a\r\nSet-Cookie: b"}), head=False)
    assert protocol.reason(431) == "Request Header Fields Too Large"


# -- routes ------------------------------------------------------------------------------------


def test_static_files_are_exactly_the_page_and_the_vendored_chart_library() -> None:
    files = routes.static_files()
    assert files["/"] == files["/index.html"]
    for path in ("/app.js", "/style.css", "/vendor/uplot/uPlot.iife.min.js"):
        assert path in files
    assert "/vendor/uplot/uPlot.min.css" in files
    assert "/vendor/uplot/LICENSE" in files
    assert all(p.is_relative_to(routes.STATIC_ROOT) for p in files.values())
    assert routes.content_type("index.html").startswith("text/html")
    assert routes.content_type("app.js").startswith("text/javascript")
    assert routes.content_type("LICENSE").startswith("text/plain")


def test_the_vendored_uplot_is_recorded_with_its_version() -> None:
    vendor = routes.STATIC_ROOT / "vendor" / "uplot"
    version = (vendor / "uPlot.iife.min.js").read_text()[:80]
    readme = (vendor / "README.md").read_text()
    assert "(v1.6.32)" in version
    assert "1.6.32" in readme
    assert "MIT" in (vendor / "LICENSE").read_text()


def test_the_page_has_no_inline_script_or_style() -> None:
    html = (routes.STATIC_ROOT / "index.html").read_text()
    assert "<script>" not in html
    assert "style=" not in html
    assert "<style" not in html
    assert "http://" not in html
    assert "https://" not in html, "everything is served by the scheduler itself"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", routes.Route(static="/")),
        ("/app.js", routes.Route(static="/app.js")),
        ("/api/v1/cluster", routes.Route(endpoint=routes.Endpoint.CLUSTER)),
        ("/api/v1/utilisation", routes.Route(endpoint=routes.Endpoint.UTILISATION)),
        ("/api/v1/jobs", routes.Route(endpoint=routes.Endpoint.JOBS)),
        ("/api/v1/jobs/", routes.Route(endpoint=routes.Endpoint.JOBS)),
        ("/api/v1/jobs/j-1", routes.Route(endpoint=routes.Endpoint.JOB, job_id="j-1")),
        (
            "/api/v1/jobs/resnet/timeline",
            routes.Route(endpoint=routes.Endpoint.TIMELINE, job_id="resnet"),
        ),
        ("/api/v1/jobs/j-1/explain", routes.Route(endpoint=routes.Endpoint.EXPLAIN, job_id="j-1")),
        ("/api/v1/jobs/j-1/logs", routes.Route(endpoint=routes.Endpoint.LOGS, job_id="j-1")),
    ],
)
def test_routes(path: str, expected: routes.Route) -> None:
    assert routes.route(path, routes.static_files()) == expected


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/api/v1/", True),
        ("/api/v1", True),
        ("/api/v1/jobs/j-1/stdout", True),
        ("/api/v1/jobs/../cluster", True),
        ("/api/v1/jobs/" + "x" * 200, True),
        ("/api/v1/cluster/", True),
        ("/index.htm", False),
        ("/../services/scheduler/pyproject.toml", False),
        ("/vendor/uplot/", False),
        ("//etc/passwd", False),
    ],
)
def test_nothing_else_is_served(path: str, api: bool) -> None:
    with pytest.raises(routes.NoRoute) as caught:
        routes.route(path, routes.static_files())
    assert caught.value.api == api


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("localhost", True),
        ("localhost:8080", True),
        ("127.0.0.1:9", True),
        ("127.5.6.7", True),
        ("[::1]:8080", True),
        ("LOCALHOST", True),
        ("attacker.example", False),
        ("attacker.example:80", False),
        ("10.0.0.1:80", False),
        ("[::2]:1", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, ok: bool) -> None:
    assert loopback_host(host) == ok


def test_a_dashboard_without_tls_binds_loopback_unless_insecure() -> None:
    servicer = cast(SchedulerServicer, object())
    with pytest.raises(ConfigError, match="reachable from other machines"):
        Dashboard(servicer, "0.0.0.0:8080")
    assert Dashboard(servicer, "0.0.0.0:8080", insecure=True).url.startswith("http://")
    assert Dashboard(servicer, "127.0.0.1:0").url.startswith("http://127.0.0.1:")
    with pytest.raises(ValueError, match="authenticator"):
        Dashboard(servicer, "127.0.0.1:0", tls=cast(Any, object()))


def test_dashboard_settings_are_validated() -> None:
    assert SchedulerConfig().dashboard_listen == "", "off by default"
    bad = SchedulerConfig(dashboard_listen="nowhere", dashboard_sample_s=0, dashboard_samples=0)
    problems = " ".join(bad.problems())
    assert "dashboard_listen" in problems
    assert "dashboard_sample_s" in problems
    assert "dashboard_samples" in problems
    assert SchedulerConfig(dashboard_listen="127.0.0.1:0").problems() == []


# -- JSON views --------------------------------------------------------------------------------


def test_jobs_queries_become_newest_first_list_requests() -> None:
    request = views.jobs_request(
        {"state": "running,JOB_STATE_PENDING", "name_prefix": "res", "owner": "al", "limit": "7"}
    )
    assert request.newest_first
    assert list(request.states) == [pb.JOB_STATE_RUNNING, pb.JOB_STATE_PENDING]
    assert (request.name_prefix, request.owner, request.page_size) == ("res", "al", 7)
    assert views.jobs_request({}).page_size == views.DEFAULT_LIMIT
    with pytest.raises(InvalidArgument) as caught:
        views.jobs_request({"state": "unspecified,nap", "limit": "1001", "sort": "x"})
    fields = [field for field, _ in caught.value.violations]
    assert fields == ["sort", "state", "state", "limit"]


def point(
    at: float, gen: int, predicted: float, progress: float, gpus: int = 1
) -> pb.TimelinePoint:
    p = pb.TimelinePoint(
        generation=gen,
        gpus=gpus,
        batch_size=32 * gpus,
        predicted_goodput=predicted,
        progress=progress,
    )
    p.time.FromNanoseconds(int(at * 1e9))
    return p


def test_predicted_progress_integrates_from_each_generation_start() -> None:
    points = [
        point(0, 1, 0, 0),
        point(5, 1, 32, 1),  # the first prediction: starts at the actual progress
        point(15, 1, 64, 9),  # + 32/32 per s for 10 s
        point(20, 2, 128, 12, gpus=4),  # a new generation starts again from the actual
        point(30, 2, 128, 40, gpus=4),  # + 128/32 per s for 10 s
        point(32, 3, 0, 41),  # no model for it yet
    ]
    assert views.predicted_progress(points, 32) == [None, 1.0, 11.0, 12.0, 52.0, None]
    assert views.predicted_progress([], 32) == []
    assert views.predicted_progress(points[:3], 0) == [None, 1.0, 1.0], "no M0: no rate"
    [first, second] = views.restarts(points)
    assert (first["from_generation"], first["generation"], first["time_s"]) == (1, 2, 20.0)
    assert (first["gpus_before"], first["gpus_after"]) == (1, 4)
    assert (first["batch_before"], first["batch_after"]) == (32, 128)
    assert (second["from_generation"], second["generation"]) == (2, 3)


def test_the_timeline_view_carries_the_estimated_completion() -> None:
    job = pb.Job(id="j-1", spec=pb.JobSpec(batch=pb.BatchLimits(initial_batch_size=64)))
    job.state = pb.JOB_STATE_RUNNING
    timeline = pb.JobTimeline(job_id="j-1", points=[point(10, 1, 64, 5)])
    timeline.points[0].remaining = 95
    view = views.timeline_view(job, timeline)
    assert (view["state"], view["m0"], view["completion"]) == ("RUNNING", 64, None)
    assert view["timeline"]["points"][0]["generation"] == 1, "64-bit integers as numbers"
    job.estimated_completion.FromSeconds(100)
    view = views.timeline_view(job, timeline)
    assert view["completion"] == {
        "time": "1970-01-01T00:01:40Z",
        "time_s": 100.0,
        "progress": 100.0,
    }


def test_the_cluster_view_counts_gpus_per_job() -> None:
    status = spb.ClusterStatusResponse(
        nodes=[
            spb.NodeStatus(
                node=pb.Node(name="a", gpus=4), allocated_gpus=3, jobs=["j-2", "j-1", "j-2"]
            ),
            spb.NodeStatus(node=pb.Node(name="b", gpus=4), allocated_gpus=2, jobs=["j-2", "j-3"]),
        ]
    )
    view = views.cluster_view(status)
    assert list(view["job_gpus"].items()) == [("j-2", 3), ("j-1", 1), ("j-3", 1)]
    assert view["nodes"][0]["node"]["name"] == "a"


# -- utilisation ring --------------------------------------------------------------------------


def status_of(nodes: dict[str, tuple[int, int]], running: int = 0) -> spb.ClusterStatusResponse:
    out = spb.ClusterStatusResponse(jobs_by_state={"RUNNING": running, "PENDING": 1})
    for name, (gpus, used) in nodes.items():
        out.nodes.add(node=pb.Node(name=name, gpus=gpus), allocated_gpus=used)
        out.total_gpus += gpus
        out.allocated_gpus += used
    return out


def test_the_ring_is_bounded_and_shares_unchanged_node_lists() -> None:
    ring = sampler.UtilisationRing(3)
    for t in range(5):
        ring.add(status_of({"a": (2, t % 3), "b": (2, 1)}, running=t), float(t))
    assert [s.time_s for s in ring.samples] == [2.0, 3.0, 4.0]
    assert ring.samples[0].nodes is ring.samples[2].nodes
    assert ring.samples[0].node_allocated == array("l", [2, 1])
    view = ring.view()
    assert view["capacity"] == 3
    assert view["times"] == [2.0, 3.0, 4.0]
    assert view["allocated_gpus"] == [3, 1, 2]
    assert view["total_gpus"] == [4, 4, 4]
    assert view["running_jobs"] == [2, 3, 4]
    assert view["pending_jobs"] == [1, 1, 1]
    with pytest.raises(ValueError, match="capacity"):
        sampler.UtilisationRing(0)


def test_the_view_thins_evenly_keeps_the_newest_and_marks_absent_nodes() -> None:
    ring = sampler.UtilisationRing(100)
    for t in range(100):
        nodes = {"a": (1, 1)} if t < 50 else {"a": (1, 0), "b": (2, 2)}
        ring.add(status_of(nodes), float(t))
    view = ring.view(10)
    assert len(view["times"]) == 10
    assert view["times"][0] == 0.0
    assert view["times"][-1] == 99.0
    assert view["times"] == sorted(view["times"])
    b = next(n for n in view["nodes"] if n["name"] == "b")
    assert b["gpus"][0] is None
    assert b["gpus"][-1] == 2
    assert ring.view(1000)["times"] == [float(t) for t in range(100)]
    assert sampler.UtilisationRing(5).view()["times"] == []


def test_the_view_returns_at_most_max_node_series_nodes() -> None:
    ring = sampler.UtilisationRing(2)
    ring.add(status_of({f"n{i:03d}": (1, 0) for i in range(50)}), 1.0)
    view = ring.view()
    assert len(view["nodes"]) == sampler.MAX_NODE_SERIES
    assert view["nodes_truncated"]
    assert view["total_gpus"] == [50]


async def test_sampling_goes_on_after_a_failed_read() -> None:
    ring = sampler.UtilisationRing(10)
    calls = []

    async def status() -> spb.ClusterStatusResponse:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("etcd is away")
        if len(calls) == 4:
            task.cancel()
        return status_of({"a": (1, 1)})

    task = asyncio.create_task(sampler.sample_forever(ring, status, 0.0, clock=lambda: 7.0))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 4
    assert len(ring.samples) == 3, "the failed read added nothing, and sampling went on"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"tail": "0"}, "tail"),
        ({"tail": "1001"}, "tail"),
        ({"tail": "-1"}, "tail"),
        ({"rank": "x"}, "rank"),
        ({"follow": "1"}, "follow"),
    ],
)
def test_a_log_query_out_of_bounds_is_refused_naming_the_parameter(
    query: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        views.logs_request("j-1", query)
    assert [f for f, _ in refused.value.violations] == [field]


def test_a_log_query_is_a_bounded_unfollowed_tail() -> None:
    request = views.logs_request("j-1", {"rank": "2", "tail": "50"})
    assert (request.job_id, request.rank, request.tail_lines, request.follow) == (
        "j-1",
        2,
        50,
        False,
    )
    assert views.logs_request("j-1", {}).tail_lines == views.DEFAULT_LOG_LINES
