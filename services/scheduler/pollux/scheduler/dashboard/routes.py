"""Which URL is what: the dashboard's static files and its JSON endpoints (pure).

The page is a small hash-routed single page (``#/`` cluster, ``#/jobs``, ``#/jobs/<id>``), so
the server knows only its files; every other path under ``/api/v1/`` is a JSON endpoint:

- ``/api/v1/cluster`` (ClusterStatus); ``/api/v1/utilisation``: allocated / total GPUs over
  time, per node (this replica's ring);
- ``/api/v1/jobs``: jobs newest first; query ``state``, ``name_prefix``, ``owner``, ``limit``,
  ``page_token`` (ListJobs);
- ``/api/v1/jobs/<id>``: one job, by id, unique prefix or name (GetJob);
- ``/api/v1/jobs/<id>/timeline``: its sampled life, restarts and predicted progress (GetJob,
  GetJobTimeline);
- ``/api/v1/jobs/<id>/explain`` (Explain); ``/api/v1/jobs/<id>/logs``: a replica's last lines,
  query ``rank`` and ``tail`` (StreamLogs, not followed: the page asks at every refresh).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

API_PREFIX = "/api/v1/"
STATIC_ROOT = Path(__file__).resolve().parent / "static"
"""The page's files: index.html, app.js, style.css and the vendored uPlot."""
MAX_JOB_REF = 128
"""Longest job reference taken from a path (the servicer's bound)."""

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
"""Media types of what is served; files of other types (README.md, LICENSE) are text."""


class Endpoint(StrEnum):
    """The JSON endpoints."""

    CLUSTER = "cluster"
    UTILISATION = "utilisation"
    JOBS = "jobs"
    JOB = "job"
    TIMELINE = "timeline"
    EXPLAIN = "explain"
    LOGS = "logs"


@dataclass(frozen=True, slots=True)
class Route:
    """What a path names.

    Attributes:
        static: The static file's path relative to `STATIC_ROOT` ("" for an endpoint).
        endpoint: The JSON endpoint (None for a static file).
        job_id: The job reference of a job endpoint (as decoded from the path).
    """

    static: str = ""
    endpoint: Endpoint | None = None
    job_id: str = ""


class NoRoute(LookupError):
    """Nothing is served at the path (404); `api` tells whether to answer in JSON."""

    def __init__(self, path: str, *, api: bool) -> None:
        super().__init__(f"nothing is served at {path[:200]}")
        self.api = api


def static_files(root: Path = STATIC_ROOT) -> dict[str, Path]:
    """Every file under `root` by its URL path ("/app.js"); "/" is index.html.

    The server serves exactly these (read at start): no path from a request is ever joined
    to a directory, so nothing outside them can be named.
    """
    files = {
        "/" + path.relative_to(root).as_posix(): path
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.name.startswith(".")
    }
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files


def content_type(path: str) -> str:
    """The media type a static file is served as."""
    return CONTENT_TYPES.get(Path(path).suffix, "text/plain; charset=utf-8")


def route(path: str, files: Container[str]) -> Route:
    """The route of a decoded request path.

    Args:
        path: The percent-decoded path.
        files: The static URL paths served (`static_files`' keys, or that mapping).

    Raises:
        NoRoute: Nothing is served there.
    """
    if path.startswith(API_PREFIX) or path == API_PREFIX.rstrip("/"):
        parts = path[len(API_PREFIX) :].split("/")
        match parts:
            case ["cluster"]:
                return Route(endpoint=Endpoint.CLUSTER)
            case ["utilisation" | "utilization"]:
                return Route(endpoint=Endpoint.UTILISATION)
            case ["jobs"] | ["jobs", ""]:
                return Route(endpoint=Endpoint.JOBS)
            case ["jobs", job_id] if _job_ref(job_id):
                return Route(endpoint=Endpoint.JOB, job_id=job_id)
            case ["jobs", job_id, "timeline"] if _job_ref(job_id):
                return Route(endpoint=Endpoint.TIMELINE, job_id=job_id)
            case ["jobs", job_id, "explain"] if _job_ref(job_id):
                return Route(endpoint=Endpoint.EXPLAIN, job_id=job_id)
            case ["jobs", job_id, "logs"] if _job_ref(job_id):
                return Route(endpoint=Endpoint.LOGS, job_id=job_id)
        raise NoRoute(path, api=True)
    if path in files:
        return Route(static=path)
    raise NoRoute(path, api=False)


def _job_ref(text: str) -> bool:
    return 0 < len(text) <= MAX_JOB_REF and text not in (".", "..")
