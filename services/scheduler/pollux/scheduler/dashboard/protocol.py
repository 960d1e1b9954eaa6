"""The dashboard's HTTP/1.1, as little of it as a read-only page needs (stdlib only).

One request per connection (`Connection: close`, no keep-alive), GET and HEAD only, no request
bodies, and every part of a request bounded before it is read whole: the request line
(`MAX_REQUEST_LINE`), the header block (`MAX_HEADER_BYTES`, `MAX_HEADERS`) and the query
(`MAX_QUERY_FIELDS`). Parsing is pure (`parse_head`) so it is tested without sockets;
`read_request` only gathers the lines from an `asyncio.StreamReader`.
"""

from __future__ import annotations

import asyncio
import http
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_REQUEST_LINE = 8 * 1024
"""Longest request line (method, target, version): longer is 414 URI Too Long."""
MAX_HEADER_BYTES = 16 * 1024
"""Longest header block: longer is 431."""
MAX_HEADERS = 64
"""Most header fields: more is 431."""
MAX_QUERY_FIELDS = 16
"""Most query parameters."""
METHODS = ("GET", "HEAD")
"""What the dashboard answers; anything else is 405 with ``Allow: GET, HEAD``."""
_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


class HttpError(Exception):
    """A request the server refuses, with the status to answer and why."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed request head.

    Attributes:
        method: GET or HEAD (others are refused while parsing).
        target: The request target as sent (origin form: path and query).
        path: The percent-decoded path.
        query: The decoded query parameters (each at most once).
        version: "HTTP/1.1" or "HTTP/1.0".
        headers: Field values by lower-case name (repeated fields joined with ", ").
    """

    method: str
    target: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    version: str = "HTTP/1.1"
    headers: dict[str, str] = field(default_factory=dict)


def _is_token(text: str) -> bool:
    return bool(text) and all(c in _TOKEN_CHARS for c in text)


def _printable(text: str) -> bool:
    return all(" " <= c != "\x7f" for c in text)


def parse_target(target: str) -> tuple[str, dict[str, str]]:
    """The decoded path and query of an origin-form request target.

    Raises:
        HttpError: 400 for anything but ``/path[?query]`` (absolute form, ``*``, a fragment,
            a path that does not decode as UTF-8 or decodes to control characters, a repeated
            or undecodable query parameter, too many parameters).
    """
    if not target.startswith("/") or "#" in target:
        raise HttpError(400, "the request target must be a path (origin form)")
    raw_path, _, raw_query = target.partition("?")
    try:
        path = urllib.parse.unquote(raw_path, errors="strict")
    except UnicodeDecodeError as error:
        raise HttpError(400, "the path is not UTF-8") from error
    if not _printable(path) or "\\" in path:
        raise HttpError(400, "the path holds control characters or backslashes")
    query: dict[str, str] = {}
    if raw_query:
        try:
            pairs = urllib.parse.parse_qsl(
                raw_query,
                keep_blank_values=True,
                errors="strict",
                max_num_fields=MAX_QUERY_FIELDS,
            )
        except (ValueError, UnicodeDecodeError) as error:
            raise HttpError(400, f"bad query string: {error}") from error
        for name, value in pairs:
            if name in query:
                raise HttpError(400, f"query parameter {name[:32]!r} given twice")
            if not _printable(name) or not _printable(value):
                raise HttpError(400, "the query holds control characters")
            query[name] = value
    return path, query


def parse_head(request_line: bytes, header_lines: list[bytes]) -> Request:
    """Parse a request line and its header lines (each without its line ending).

    Raises:
        HttpError: 400 malformed, 405 a method other than GET/HEAD, 505 not HTTP/1.x.
    """
    try:
        line = request_line.decode("ascii")
    except UnicodeDecodeError as error:
        raise HttpError(400, "the request line is not ASCII") from error
    parts = line.split(" ")
    if len(parts) != 3 or not all(parts):
        raise HttpError(400, "the request line must be 'METHOD TARGET HTTP/1.1'")
    method, target, version = parts
    if not version.startswith("HTTP/"):
        raise HttpError(400, "not an HTTP request")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, f"{version[:16]} is not supported: use HTTP/1.1")
    if not _is_token(method):
        raise HttpError(400, "the method is not a token")
    if method not in METHODS:
        raise HttpError(405, f"{method[:16]} is not allowed: the dashboard is read-only")
    headers: dict[str, str] = {}
    for raw in header_lines:
        if raw[:1] in (b" ", b"\t"):
            raise HttpError(400, "folded header lines are not accepted")
        text = raw.decode("latin-1")
        name, colon, value = text.partition(":")
        if not colon or not _is_token(name):
            raise HttpError(400, "a header line is not 'Name: value'")
        value = value.strip(" \t")
        if any(c in value for c in "\r\n\x00"):
            raise HttpError(400, "a header value holds a line break or NUL")
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if version == "HTTP/1.1" and "host" not in headers:
        raise HttpError(400, "an HTTP/1.1 request needs a Host header")
    path, query = parse_target(target)
    return Request(method, target, path, query, version, headers)


def _strip_eol(line: bytes) -> bytes:
    return line[:-2] if line.endswith(b"\r\n") else line[:-1]


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """Read one request head; None when the peer closed before sending one.

    The reader's own limit (``asyncio.start_server(limit=...)``) must be at least
    `MAX_HEADER_BYTES`; lines are checked against the tighter bounds here.

    Raises:
        HttpError: 414 / 431 over a bound, else as `parse_head`.
    """
    request_line = b""
    for _ in range(2):  # RFC 9112 §2.2: ignore at least one empty line before the request
        try:
            request_line = _strip_eol(await reader.readuntil(b"\n"))
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError as error:
            raise HttpError(414, "the request line is too long") from error
        if request_line:
            break
    if not request_line:
        raise HttpError(400, "no request line")
    if len(request_line) > MAX_REQUEST_LINE:
        raise HttpError(414, "the request line is too long")
    lines: list[bytes] = []
    total = 0
    while True:
        try:
            raw = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as error:
            raise HttpError(400, "the connection closed inside the header block") from error
        except asyncio.LimitOverrunError as error:
            raise HttpError(431, "a header line is too long") from error
        total += len(raw)
        if total > MAX_HEADER_BYTES:
            raise HttpError(431, "the header block is too large")
        line = _strip_eol(raw)
        if not line:
            break
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise HttpError(431, f"more than {MAX_HEADERS} header fields")
    return parse_head(request_line, lines)


@dataclass(frozen=True, slots=True)
class Response:
    """What to send back.

    Attributes:
        status: The status code.
        body: The payload (left out of the bytes sent for HEAD, its length kept).
        content_type: Its media type.
        headers: Further header fields.
    """

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def reason(status: int) -> str:
    """The reason phrase of a status code."""
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def encode(response: Response, *, head: bool, extra: Mapping[str, str] | None = None) -> bytes:
    """The response's bytes: status line, headers (`extra` first), blank line, body."""
    fields = {
        **(extra or {}),
        "Content-Type": response.content_type,
        "Content-Length": str(len(response.body)),
        "Connection": "close",
        **response.headers,
    }
    lines = [f"HTTP/1.1 {response.status} {reason(response.status)}"]
    for name, value in fields.items():
        if any(c in value for c in "\r\n"):
            raise ValueError(f"header {name} holds a line break")
        lines.append(f"{name}: {value}")
    head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head_bytes if head else head_bytes + response.body
